"""The run's Optuna study is the live record of a search, whatever the searcher.

Real tiny searches (Ray Tune, real Rotten Tomatoes sentences, real training) through
:func:`archsearch.tune.runner.run_search`, the call ``archsearch search`` makes, for ``tpe``,
``ahto`` and ``random``; then ``runs/NAME/optuna.db`` is opened with Optuna and held against
the run's trial records (``trials/ID.json``, what Ray Tune told the run's callbacks):

* ``study.metric_names`` are the space's objective metrics, in order;
* every trial is in the study (user attribute ``trial_id``), with the record's params, and
  finished as its Tune trial ended: ``TERMINATED`` -> ``COMPLETE`` (values = the last epoch's
  objectives), ``STOPPED`` by ASHA -> ``PRUNED`` (no values, fidelity < 1), ``ERROR`` ->
  ``FAIL`` with the error line as user attribute ``error``;
* each epoch's objectives: user attribute ``history`` for every study, and Optuna
  intermediate values (``trial.report``) for the single-objective study (``random``);
* the space's constraints through ``Trial.set_constraint`` (``FrozenTrial.constraints``,
  system attributes ``constraints:KEY``) for COMPLETE and PRUNED trials, ``METRIC.max =
  value - max`` and ``METRIC.min = min - value`` (feasible when <= 0), and as the list
  ``constraints`` optuna-dashboard reads;
* the same user attribute keys, state by state, for every searcher;
* live: a thread reads the study while the search runs and sees trials ``RUNNING`` while
  their Ray trial is running (record ``RUNNING``), with the epochs reported so far, and
  every study trial was created (``datetime_start``) before its Ray trial started.

How the states are made to happen:

* **FAIL**: ``lr`` is a categorical of ``1e-3``, ``2e-3``, ``3e-3`` and ``1e6``; a trial
  with ``lr = 1e6`` blows its loss up to NaN/inf in its first epoch and raises
  ``FloatingPointError`` (the trainable's own check; ``max_failures: 0``, so no retry).
* **PRUNED**: ASHA prunes on the first objective; for the two-objective runs it is
  ``flops_per_sample`` (min), a function of the architecture alone, so whether a trial is
  stopped does not depend on training noise. With one trial at a time and
  ``reduction_factor: 64`` (one rung, at epoch 1, cutoff the 98.4th percentile of the trials
  recorded there) every trial costlier than the cheapest one recorded before it is stopped
  after its first epoch. The searchers are seeded, so each run is the same every time; the
  test still requires only that the three runs together hold at least one trial of each
  state, and checks each trial's state against its own record.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from conftest import TINY_SPACE, tiny_space

pytestmark = [pytest.mark.ray, pytest.mark.slow]

#: The user attributes :class:`archsearch.search.adapters.ray.StudyRecord` sets on every trial.
USER_ATTRS = {"trial_id", "searcher", "proposed_by", "epoch", "fidelity", "history", "error",
              "resumed", "replaces"}
EPOCHS = 2
BUDGET = {**TINY_SPACE["budget"], "trials": 5, "max_concurrent": 1, "epochs": EPOCHS,
          "scheduler": "asha", "grace_period": 1, "reduction_factor": 64, "max_failures": 0}
#: Nine architectures of distinct FLOPs; one lr in four crashes the trial.
CRASH_LR = 1.0e6
PARAMS = {**TINY_SPACE["params"], "n_layers": {"type": "int", "low": 1, "high": 3},
          "d_model": {"type": "categorical", "choices": [16, 32, 48]},
          "lr": {"type": "categorical", "choices": [1.0e-3, 2.0e-3, 3.0e-3, CRASH_LR]}}
#: A known constraint (params_trainable, never violated here: its value is negative) and a
#: learned one (accuracy.min, positive for a trial below 0.5).
CONSTRAINTS = {"params_trainable": {"max": 400000}, "accuracy": {"min": 0.5}}
TWO = [{"metric": "flops_per_sample", "mode": "min"}, {"metric": "accuracy", "mode": "max"}]
ONE = [{"metric": "accuracy", "mode": "max"}]
#: searcher -> objectives of its run (random: one objective, so Optuna intermediate values)
RUNS = {"tpe": TWO, "ahto": TWO, "random": ONE}


class StudyWatcher(threading.Thread):
    """Reads the run's study and trial records every ``every`` seconds while a search runs.

    ``seen`` is a list of snapshots ``(study, records)``: ``study`` maps each study trial's
    ``trial_id`` to ``(state name, epoch user attribute, len(history))``, ``records`` each
    trial record's id to its status. The storage is opened only once the study exists.
    """

    def __init__(self, run_dir: Path, name: str, every: float = 0.1):
        super().__init__(daemon=True)
        self.run_dir, self.name, self.every = run_dir, name, every
        self.seen: list[tuple[dict, dict]] = []
        self.errors: list[str] = []
        self.halt = threading.Event()
        self._storage = self._study_id = None

    def run(self):
        while not self.halt.is_set():
            try:
                self._snapshot()
            except Exception as e:  # a locked or half-created db: try again
                self.errors.append(repr(e))
            self.halt.wait(self.every)

    def _snapshot(self):
        import optuna

        from archsearch.runs import RunDir

        run = RunDir(self.run_dir)
        if self._storage is None:
            # Opening an RDBStorage writes the schema's version rows if missing: wait (reading
            # SQLite read-only) until the search's own storage made the study, i.e. after it
            # wrote them, lest the two race.
            if not run.optuna_db.is_file():
                return
            con = sqlite3.connect(f"file:{run.optuna_db}?mode=ro", uri=True, timeout=30)
            try:
                found = con.execute("SELECT 1 FROM studies WHERE study_name = ?",
                                    (self.name,)).fetchone()
            except sqlite3.OperationalError:  # no table yet
                found = None
            finally:
                con.close()
            if not found:
                return
            self._storage = optuna.storages.RDBStorage(
                run.optuna_url, engine_kwargs={"connect_args": {"timeout": 30}},
                skip_compatibility_check=True, skip_table_creation=True)
        if self._study_id is None:
            try:
                self._study_id = self._storage.get_study_id_from_name(self.name)
            except KeyError:
                return
        trials = self._storage.get_all_trials(self._study_id, deepcopy=False)
        study = {t.user_attrs.get("trial_id"): (t.state.name, t.user_attrs.get("epoch"),
                                                len(t.user_attrs.get("history") or []))
                 for t in trials}
        records = {r["trial_id"]: r["status"] for r in run.read_trials()} if run.trials_dir.is_dir() else {}
        self.seen.append((study, records))

    def stop(self):
        self.halt.set()
        self.join(timeout=30)
        if self._storage is not None:
            self._storage.engine.dispose()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ray_session, cache_dir):
    """One real search per searcher (:data:`RUNS`), each watched by a :class:`StudyWatcher`:
    searcher -> ``{"result", "space", "study", "records", "seen", "seconds"}``."""
    import optuna

    from archsearch.runs import RunDir, read_trials
    from archsearch.tune.runner import run_search

    tmp = tmp_path_factory.mktemp("optuna-record")
    out = {}
    for searcher, objectives in RUNS.items():
        space = tiny_space(tmp, name=f"rec-{searcher}.yaml", objectives=objectives,
                           constraints=CONSTRAINTS, params=PARAMS, budget=BUDGET)
        name = f"rec-{searcher}"
        watcher = StudyWatcher(tmp / "runs" / name, name)
        watcher.start()
        t0 = time.time()
        try:
            res = run_search(space, searcher=searcher, name=name, storage=tmp / "runs",
                             reports=tmp / "reports", progress=False)
        finally:
            watcher.stop()
        run = RunDir(res.run_dir)
        storage = optuna.storages.RDBStorage(run.optuna_url)
        study = optuna.load_study(study_name=name, storage=storage)
        out[searcher] = {"result": res, "space": space, "study": study,
                         "trials": study.get_trials(deepcopy=False),
                         "records": {r["trial_id"]: r for r in read_trials(res.run_dir)},
                         "seen": watcher.seen, "watch_errors": watcher.errors,
                         "seconds": time.time() - t0}
    for searcher, r in out.items():
        states = [t.state.name for t in r["trials"]]
        print(f"\n{searcher}: {r['seconds']:.1f} s, study trials {states}")
    return out


def _by_id(run) -> dict:
    return {t.user_attrs["trial_id"]: t for t in run["trials"]}


@pytest.mark.parametrize("searcher", list(RUNS))
def test_metric_names_and_directions_are_the_spaces(runs, searcher):
    import optuna

    run = runs[searcher]
    objectives = run["space"].objectives
    assert run["study"].metric_names == [o.metric for o in objectives]
    assert [d.name for d in run["study"].directions] == \
        ["MAXIMIZE" if o.mode == "max" else "MINIMIZE" for o in objectives]
    assert optuna.get_all_study_names(run["study"]._storage) == [f"rec-{searcher}"]


@pytest.mark.parametrize("searcher", list(RUNS))
def test_every_trial_finished_as_its_ray_trial_ended(runs, searcher):
    """One study trial per Tune trial, none left RUNNING, each in the state its record says,
    with the record's params."""
    run = runs[searcher]
    records, trials = run["records"], _by_id(run)
    assert len(run["trials"]) == len(trials) == len(records) == BUDGET["trials"]
    assert set(trials) == set(records)
    assert [t.number for t in run["trials"]] == list(range(len(run["trials"])))
    metrics = [o.metric for o in run["space"].objectives]
    expected = {"TERMINATED": "COMPLETE", "STOPPED": "PRUNED", "ERROR": "FAIL"}
    for tid, rec in records.items():
        t = trials[tid]
        assert t.state.name == expected[rec["status"]], (tid, rec["status"], t.state.name)
        assert t.params == rec["config"], (t.params, rec["config"])
        assert t.user_attrs["searcher"] == searcher
        assert t.datetime_complete is not None
        if t.state.name == "COMPLETE":
            assert t.values == [rec["metrics"][m] for m in metrics]
            assert t.user_attrs["epoch"] == EPOCHS and t.user_attrs["fidelity"] == 1.0
            assert t.user_attrs["error"] is None
        elif t.state.name == "PRUNED":  # stopped by ASHA at its first (and only) rung
            # no objective values; Optuna itself gives a single-objective PRUNED trial its
            # last intermediate value
            assert t.values == (None if len(metrics) > 1 else [rec["metrics"][metrics[0]]])
            assert t.user_attrs["epoch"] == 1 and t.user_attrs["fidelity"] == 1 / EPOCHS
            assert t.user_attrs["error"] is None
            assert [h["epoch"] for h in rec["history"]] == [1]
        else:  # lr = 1e6: NaN/inf loss in the first epoch, FloatingPointError
            assert t.values is None
            assert t.params["lr"] == CRASH_LR
            assert t.user_attrs["error"] == rec["error"]
            assert t.user_attrs["error"].startswith("FloatingPointError"), t.user_attrs["error"]
            assert t.user_attrs["epoch"] == 0 and t.user_attrs["history"] == []
        if t.params["lr"] != CRASH_LR:
            assert t.state.name in ("COMPLETE", "PRUNED"), (tid, t.state.name, rec.get("error"))


def test_each_final_state_happened(runs):
    """The searches together hold COMPLETE, PRUNED and FAIL trials (see the module
    docstring), so the state checks above are not vacuous."""
    states = {t.state.name for r in runs.values() for t in r["trials"]}
    assert states == {"COMPLETE", "PRUNED", "FAIL"}, states


@pytest.mark.parametrize("searcher", list(RUNS))
def test_each_epochs_objectives_are_recorded(runs, searcher):
    """``history`` holds each reported epoch's objectives (the record's); the
    single-objective study also has them as Optuna intermediate values, step = epoch."""
    run = runs[searcher]
    metrics = [o.metric for o in run["space"].objectives]
    for tid, t in _by_id(run).items():
        rec = run["records"][tid]
        want = [{"epoch": h["epoch"], **{m: h[m] for m in metrics}} for h in rec["history"]]
        assert t.user_attrs["history"] == want, (t.user_attrs["history"], want)
        assert len(want) == {"COMPLETE": EPOCHS, "PRUNED": 1, "FAIL": 0}[t.state.name]
        if len(metrics) == 1:
            assert t.intermediate_values == {h["epoch"]: h[metrics[0]] for h in rec["history"]}
        else:  # Trial.report is single-objective only in Optuna
            assert t.intermediate_values == {}


@pytest.mark.parametrize("searcher", list(RUNS))
def test_constraints_through_set_constraint(runs, searcher):
    """COMPLETE and PRUNED trials carry ``params_trainable.max`` (value - max, negative here)
    and ``accuracy.min`` (min - value) as ``constraints:KEY`` system attributes
    (``Trial.set_constraint``), and the same values sorted by key as the list
    ``constraints``, which is what optuna-dashboard reads; FAIL trials have none."""
    run = runs[searcher]
    bound_p = CONSTRAINTS["params_trainable"]["max"]
    bound_a = CONSTRAINTS["accuracy"]["min"]
    for tid, t in _by_id(run).items():
        if t.state.name == "FAIL":
            assert t.constraints == {}
            assert not any(k.startswith("constraints") for k in t.system_attrs)
            continue
        m = run["records"][tid]["metrics"]
        want = {"params_trainable.max": m["params_trainable"] - bound_p,
                "accuracy.min": bound_a - m["accuracy"]}
        assert {k: t.system_attrs[f"constraints:{k}"] for k in want} == want
        assert t.system_attrs["constraints"] == [want[k] for k in sorted(want)]
        assert {k for k in t.system_attrs if k.startswith("constraints")} == \
            {"constraints", "constraints:params_trainable.max", "constraints:accuracy.min"}
        # Optuna reads both forms: each value by name and by position
        assert t.constraints == {**want, "0": want["accuracy.min"],
                                 "1": want["params_trainable.max"]}, t.constraints
        assert want["params_trainable.max"] < 0  # feasible: 10^4 parameters, not 4e5
        assert (want["accuracy.min"] <= 0) == (m["accuracy"] >= bound_a)


def test_same_user_attributes_for_every_searcher(runs):
    """State by state, every trial of every searcher has the same user attribute keys: the
    record's own (:data:`USER_ATTRS`), plus, once it reported, each number it reported
    (not Tune's bookkeeping such as ``time_total_s``, nor the config Tune echoes in each
    result as ``config/PARAM``)."""
    from archsearch.search.adapters.ray import TUNE_KEYS

    keys: dict[str, set[frozenset]] = {}
    for searcher, run in runs.items():
        for tid, t in _by_id(run).items():
            keys.setdefault(t.state.name, set()).add(frozenset(t.user_attrs))
            metrics = run["records"][tid]["metrics"]
            numbers = {k for k, v in metrics.items() if k not in TUNE_KEYS
                       and isinstance(v, (int, float)) and not isinstance(v, bool)
                       and math.isfinite(v)}
            assert set(t.user_attrs) == USER_ATTRS | numbers, (searcher, t.state.name,
                                                               set(t.user_attrs) ^ (USER_ATTRS | numbers))
            for k in numbers:
                assert t.user_attrs[k] == metrics[k]
            assert t.user_attrs["resumed"] == 0 and t.user_attrs["replaces"] == []
            if searcher == "ahto":  # what proposed it: the core's source (sobol, optimizer, ...)
                assert isinstance(t.user_attrs["proposed_by"], str) and t.user_attrs["proposed_by"]
                assert t.user_attrs["proposed_by"] != searcher
                if t.number == 0:
                    assert t.user_attrs["proposed_by"] == "sobol"  # the initial design
            else:
                assert t.user_attrs["proposed_by"] == searcher
    for state, sets in keys.items():
        assert len(sets) == 1, (state, [sorted(s) for s in sets])
    # the objectives of a reported epoch are among the numbers, for every state but FAIL
    assert {"accuracy", "flops_per_sample", "val_loss", "params_trainable",
            "latency_ms"} <= next(iter(keys["COMPLETE"]))


@pytest.mark.parametrize("searcher", list(RUNS))
def test_trials_are_live_while_their_ray_trial_runs(runs, searcher):
    """While the search ran, study trials were RUNNING at the same time as their Ray trial
    (record RUNNING), and every study trial was created before its Ray trial started: the
    study is written as the search goes, not at its end."""
    run = runs[searcher]
    seen = run["seen"]
    assert seen, ("the watcher never read the study", run["watch_errors"][-3:])
    live = {tid for study, records in seen for tid, (state, _, _) in study.items()
            if state == "RUNNING" and records.get(tid) == "RUNNING"}
    assert live, f"no study trial seen RUNNING during its Ray trial ({len(seen)} snapshots)"
    # whatever was seen live finished later in the state its record says
    final = _by_id(run)
    assert all(final[tid].state.name != "RUNNING" for tid in live)
    # created when suggested: before Tune started the trial (record "started", Unix time)
    for tid, t in final.items():
        assert t.datetime_start.timestamp() <= run["records"][tid]["started"] + 1e-3, \
            (tid, t.datetime_start, run["records"][tid]["started"])
    # the study never held a finished trial that later changed (finished trials are final)
    last: dict[str, str] = {}
    for study, _ in seen:
        for tid, (state, _, _) in study.items():
            if last.get(tid) in ("COMPLETE", "PRUNED", "FAIL"):
                assert state == last[tid], (tid, last[tid], state)
            last[tid] = state


def test_epochs_are_recorded_live(runs):
    """At least one trial (over the three searches) was seen RUNNING with an epoch reported
    and its history holding that epoch: the per-epoch record is written during the trial."""
    hits = [(s, tid, epoch) for s, run in runs.items() for study, records in run["seen"]
            for tid, (state, epoch, n) in study.items()
            if state == "RUNNING" and epoch and epoch >= 1 and n == epoch
            and records.get(tid) == "RUNNING"]
    assert hits, "no running trial was seen with its first epoch recorded"
