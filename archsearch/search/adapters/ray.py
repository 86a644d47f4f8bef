"""Ray Tune adapter: any ask/tell :class:`~archsearch.search.base.Searcher` as a Tune ``Searcher``,
and the run's Optuna study as the live record of the search.

``suggest`` asks the core (inactive conditional params are ``None``, as in
:meth:`SearchSpace.to_ray`); ``on_trial_complete`` tells it the trial's last result with its
fidelity (``epoch / epochs``: ASHA-stopped trials count at their fraction of the budget) or
``error=True`` for a failed trial; ``save``/``restore`` write the core's full state (atomic).

When an Optuna ``storage`` is given, :class:`StudyRecord` keeps the study ``study_name`` in step
with Tune, whatever the searcher (``random``, ``tpe``, ``nsga2``, ``qnehvi``, ``ahto``):

* **suggested**: the trial is created at once, state ``RUNNING``, with the suggested params and
  their Optuna distributions (``study.enqueue_trial(params)`` then
  ``study.ask(fixed_distributions)``: Optuna's own way to create a trial with given params),
  so ``archsearch dashboard`` shows a running search live;
* **each epoch** (``on_trial_result``): user attributes ``epoch``, ``fidelity`` and ``history``
  are updated. ``history`` holds the per-epoch objective values; it is the record of
  intermediate values for every study, because Optuna's ``Trial.report`` only works for
  single-objective studies (it raises ``NotImplementedError`` for several objectives). A
  single-objective study also gets them as Optuna intermediate values (``trial.report(value,
  step=epoch)``), which the dashboard plots;
* **finished**: ``COMPLETE`` with the objective values (the last epoch's) for a trial that
  trained its full budget; ``PRUNED`` for one the scheduler (ASHA) stopped early (fidelity < 1:
  its last values are kept in ``history`` and as metric user attributes, not as objective
  values, so no sampler takes a partial-budget result for a final one; Optuna itself gives a
  single-objective PRUNED trial its last intermediate value); ``FAIL`` for an error or
  a non-finite objective, with the one-line reason as user attribute ``error``.
  ``COMPLETE`` and ``PRUNED`` trials get the space's constraints through Optuna's constraint API
  (``Trial.set_constraint(key, value)``, keys ``METRIC.max`` / ``METRIC.min``, feasible when
  <= 0: :meth:`Searcher.constraint_values`; TPE and NSGA-II read them as
  ``FrozenTrial.constraints``). The same values, sorted by key, also go to the system attribute
  ``constraints`` as a list, the form Optuna's own samplers write for a
  ``constraints_func`` and the only one optuna-dashboard reads (0.21 ignores
  ``constraints:KEY``): without it the dashboard draws infeasible trials on the Pareto front.
  (``FrozenTrial.constraints`` therefore lists each value twice, by name and by position
  ``"0"``, ``"1"``, ...; feasibility is the same.) The objectives' metric names are set once with
  ``study.set_metric_names`` (so the dashboard says ``accuracy``, not ``Objective 0``).

User attributes, the same for every searcher (set when the trial is suggested, then updated):

====================  ======================================================================
``trial_id``          the Ray Tune trial id (the key that makes recording idempotent)
``searcher``          the searcher's name (``--searcher``)
``proposed_by``       what proposed the config: the model-based searchers' ``source``
                      (``sobol``, ``gp``, ``policy``, ...), else the searcher's name
``epoch``             epochs reported so far (0 until the first)
``fidelity``          ``epoch / budget.epochs``, in [0, 1] (0 when the budget is unknown)
``history``           one dict per reported epoch: ``epoch`` and each objective's value
``error``             ``None``, or the one-line reason of a ``FAIL``
``resumed``           how many times a resumed driver re-attached the trial (0 normally)
``replaces``          Tune trial ids this trial had before a resumed search ran it again
                      (``[]`` normally; see below)
``METRIC``            once finished: each finite number the trial reported in its last epoch,
                      under its metric name (docs/design.md: ``accuracy``, ``val_loss``,
                      ``flops_per_sample``, ``params_trainable``, ``latency_ms``, ...)
====================  ======================================================================

Idempotent and resumable: a trial is found by its ``trial_id`` attribute, so a trial Tune
reports again after a resume (it finished after the last experiment save) is neither
duplicated nor changed, and a finished trial is never rewritten. On ``restore`` (a resumed
driver), every study trial still ``RUNNING`` is either re-attached (its Tune trial is pending in
the restored searcher state, so Tune continues it and later results land on the same study
trial; ``resumed`` is incremented) or **run again**: it was suggested after Tune's last
experiment save (Tune saves every >= 10 s and after trial checkpoints, and copies the save to
storage in the background), so the restored Tune does not know it and asks for a new trial in
its place. So is a study trial still ``WAITING`` (the driver stopped between the enqueue and
the ask of ``open``). The adapter answers those asks with the lost configs first, in trial order: the
core adopts the config under the new Tune trial id (:meth:`Searcher.adopt`, drawing and
discarding a proposal so that its state moves on as when it first proposed the trial), and the same
study trial takes the new id (the old one is appended to ``replaces``, ``resumed`` + 1). The
trial starts again from scratch (Tune holds no checkpoint of it), counts once toward the
search's trials, and the run's trial recorder drops the old id's record when the new trial
starts. A lost trial the resumed search never reaches (it stopped first) stays ``RUNNING``
for the next resume, or is failed by ``archsearch.tune.runner.reconcile`` at the end.

Tune tells a searcher about an errored trial without the error, and before its callbacks (see
``TuneController._process_trial_failure``); with ``fail_errors=False`` the adapter leaves the
``FAIL`` to a callback that has the error line (:class:`archsearch.tune.callbacks.TrialRecorder`
calls :meth:`StudyRecord.fail`, which is what ``archsearch search`` does), otherwise it marks
the trial ``FAIL`` itself with :data:`NO_MESSAGE`.

Sources: Optuna's ask-and-tell interface, ``Study.enqueue_trial``, ``Trial.set_constraint``,
``Study.set_metric_names`` (Optuna 5 documentation); Ray Tune's ``Searcher`` API.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable, Mapping

from ray.tune.search import Searcher as _TuneSearcher

from archsearch.search.base import Searcher

#: Optuna's system attribute of a trial's constraint values (``optuna.study.
#: _constrained_optimization._CONSTRAINTS_KEY``; named ones are ``constraints:KEY``).
_CONSTRAINTS_KEY = "constraints"

#: ``error`` of a WAITING study trial that :meth:`StudyRecord.open` finds before its own (one
#: that a resumed search did not take over: not enqueued by archsearch, or a new search that
#: did not resume the one that enqueued it).
NOT_RESUMED = ("lost: enqueued but never asked for (a driver stopped in between and the search "
               "was not resumed); the searcher proposes a new trial instead")
#: ``error`` of a failed trial when no error line reached the record.
NO_MESSAGE = "failed (Ray Tune gave no error message)"

#: Keys of a Tune result that are bookkeeping, not metrics (never recorded as user attributes).
TUNE_KEYS = frozenset({
    "time_this_iter_s", "time_total_s", "training_iteration", "timestamp", "date", "done",
    "trial_id", "experiment_id", "pid", "hostname", "node_ip", "config", "time_since_restore",
    "iterations_since_restore", "checkpoint_dir_name", "should_checkpoint", "experiment_tag",
    "timesteps_total", "episodes_total", "timesteps_since_restore", "epoch", "restored_from_epoch",
})
#: User attribute names this module writes (besides the metrics).
USER_ATTRS = ("trial_id", "searcher", "proposed_by", "epoch", "fidelity", "history", "error",
              "resumed", "replaces")


def _number(v: Any) -> float | None:
    """``v`` as a finite float, or ``None`` (bools, strings, NaN and inf are not numbers)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "item"):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _is_metric(key: str) -> bool:
    """Whether result key ``key`` is a metric the trial reported: not Tune's bookkeeping
    (:data:`TUNE_KEYS`), not one of :data:`USER_ATTRS`, and not the config Tune echoes in
    every result (a searcher gets results flattened: ``config/lr``, ...)."""
    return key not in TUNE_KEYS and key not in USER_ATTRS and not key.startswith("config/")


def _plain(v: Any) -> Any:
    """Numpy scalars as Python scalars (Optuna stores params and attributes as JSON)."""
    return v.item() if hasattr(v, "item") and not isinstance(v, (str, bytes)) else v


class StudyRecord:
    """The run's Optuna study, written as the search goes (see the module docstring).

    Args:
        storage: an Optuna storage object or URL (``RunDir.optuna_url``: SQLite).
        study_name: the study (the run's name).
        space: the search space: objective directions and metric names, param distributions.
            ``None`` to only update an existing study (a callback failing trials).
        searcher: the searcher's name (user attribute ``searcher``).

    Nothing is opened until first used; a pickled record (Tune saves the searcher and its
    callbacks) reopens the storage when used again.
    """

    def __init__(self, storage, study_name: str, *, space=None, searcher: str = ""):
        self.storage, self.study_name = storage, study_name
        self.space, self.searcher = space, searcher
        self._study = self._backend = None
        self._ids: dict[str, tuple[int, int]] | None = None  # tune id -> (number, storage id)
        self._live: dict[str, Any] = {}  # tune id -> optuna.Trial (this session)

    def __getstate__(self):
        return {**self.__dict__, "_study": None, "_backend": None, "_ids": None, "_live": {}}

    # ------------------------------------------------------------------ opening
    @property
    def study(self):
        """The study (created with the space's directions and metric names if missing), or
        ``None`` when it does not exist and there is no space to create it from."""
        if self._study is None:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            storage = self.storage
            if isinstance(storage, str) and storage.startswith("sqlite"):
                # wait for a dashboard's read rather than fail the search on "database is locked"
                storage = optuna.storages.RDBStorage(
                    storage, engine_kwargs={"connect_args": {"timeout": 60}})
            elif isinstance(storage, str):
                storage = optuna.storages.RDBStorage(storage)
            self._backend = storage
            if self.space is None:
                try:
                    self._study = optuna.load_study(study_name=self.study_name, storage=storage)
                except KeyError:
                    return None
            else:
                objectives = self.space.objectives
                self._study = optuna.create_study(
                    storage=storage, study_name=self.study_name, load_if_exists=True,
                    sampler=optuna.samplers.RandomSampler(seed=0),  # never samples: params are given
                    directions=["maximize" if o.mode == "max" else "minimize" for o in objectives])
                names = [o.metric for o in objectives]
                if self._study.metric_names != names:
                    with warnings.catch_warnings():  # experimental since Optuna 3.2
                        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                        self._study.set_metric_names(names)
        return self._study

    @property
    def metrics(self) -> list[str]:
        """The objective metric names (from the space, else from the study)."""
        if self.space is not None:
            return [o.metric for o in self.space.objectives]
        return list(self.study.metric_names or [])

    def _find(self, trial_id: str):
        """``(number, storage trial id)`` of the study trial of Tune trial ``trial_id``, or
        ``None`` (the index is reread once when the id is unknown: another record may have
        created it)."""
        for attempt in range(2):
            if self._ids is None or attempt:
                self._ids = {t.user_attrs["trial_id"]: (t.number, t._trial_id)
                             for t in self.study.get_trials(deepcopy=False)
                             if "trial_id" in t.user_attrs}
            if trial_id in self._ids:
                return self._ids[trial_id]
        return None

    def _trial(self, trial_id: str):
        """The live ``optuna.Trial`` of ``trial_id`` if it is still RUNNING, else ``None``."""
        import optuna

        found = self._find(trial_id) if self.study is not None else None
        if found is None:
            return None
        frozen = self._backend.get_trial(found[1])
        if frozen.state != optuna.trial.TrialState.RUNNING:
            self._live.pop(trial_id, None)
            return None
        if trial_id not in self._live:
            self._live[trial_id] = optuna.trial.Trial(self.study, found[1])
        return self._live[trial_id]

    # ------------------------------------------------------------------ events
    def open(self, trial_id: str, config: Mapping[str, Any], *, proposed_by: str | None = None) -> None:
        """Create the RUNNING study trial of a suggested config (active params only); nothing
        if ``trial_id`` is already in the study."""
        import optuna

        if self._find(trial_id) is not None:
            return
        dists = self.space.to_optuna()
        params = {k: _plain(v) for k, v in config.items() if v is not None}
        attrs = {"trial_id": trial_id, "searcher": self.searcher,
                 "proposed_by": str(proposed_by or self.searcher), "epoch": 0, "fidelity": 0.0,
                 "history": [], "error": None, "resumed": 0, "replaces": []}
        self.study.enqueue_trial(params, user_attrs=attrs)
        while True:
            trial = self.study.ask({k: dists[k] for k in params})
            if trial.user_attrs.get("trial_id") == trial_id:
                break
            # an older WAITING trial, enqueued by a driver that died before it asked for it
            trial.set_user_attr("error", NOT_RESUMED)
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self._ids[trial_id] = (trial.number, trial._trial_id)
        self._live[trial_id] = trial

    def result(self, trial_id: str, result: Mapping[str, Any], *, fidelity: float | None = None) -> None:
        """One epoch's result: ``epoch``, ``fidelity``, ``history`` (and, for one objective,
        ``trial.report(value, step=epoch)``). Ignored for a trial that is not RUNNING."""
        trial = self._trial(trial_id)
        if trial is not None:
            self._result(trial, result, fidelity)

    def _result(self, trial, result: Mapping[str, Any], fidelity: float | None) -> None:
        epoch = _number(result.get("epoch"))
        if epoch is None:
            return
        epoch = int(epoch)
        entry = {"epoch": epoch, **{k: _number(result.get(k)) for k in self.metrics}}
        before = trial.user_attrs.get("history", [])
        history = [h for h in before if h.get("epoch") != epoch]
        history = sorted(history + [entry], key=lambda h: h["epoch"])
        trial.set_user_attr("history", history)
        trial.set_user_attr("epoch", epoch)
        if fidelity is not None:
            trial.set_user_attr("fidelity", float(fidelity))
        reported = any(h.get("epoch") == epoch for h in before)  # a retried trial's epoch
        if len(self.metrics) == 1 and entry[self.metrics[0]] is not None and not reported:
            trial.report(entry[self.metrics[0]], step=epoch)

    def finish(self, trial_id: str, result: Mapping[str, Any] | None, *, state: str,
               fidelity: float | None = None, constraints: Mapping[str, float] | None = None,
               error: str | None = None) -> None:
        """Finish the study trial of ``trial_id``: ``state`` is ``"COMPLETE"`` (objective
        values from ``result``), ``"PRUNED"`` or ``"FAIL"`` (``error``: the reason). ``result``
        (the last epoch's, if any) is recorded as for :meth:`result` and its numbers as
        metric user attributes; ``constraints`` through ``Trial.set_constraint``. Nothing if
        the trial is not RUNNING (finished already: idempotent) or unknown.

        Raises:
            ValueError: unknown ``state``.
        """
        import optuna

        TS = optuna.trial.TrialState
        if state not in ("COMPLETE", "PRUNED", "FAIL"):
            raise ValueError(f"unknown final state {state!r}")
        trial = self._trial(trial_id)
        if trial is None:
            return
        if result:
            self._result(trial, result, fidelity)
            for k, v in result.items():
                if _is_metric(k) and _number(v) is not None:
                    trial.set_user_attr(k, _number(v))
        elif fidelity is not None:
            trial.set_user_attr("fidelity", float(fidelity))
        if state != "FAIL" and constraints:
            known = trial.constraints
            for key, value in constraints.items():
                if key not in known:
                    trial.set_constraint(key, value)
            # the list form too: what optuna-dashboard reads (see the module docstring)
            trial.storage.set_trial_system_attr(trial._trial_id, _CONSTRAINTS_KEY,
                                                [float(constraints[k]) for k in sorted(constraints)])
        self._live.pop(trial_id, None)
        if state == "FAIL":
            trial.set_user_attr("error", str(error or NO_MESSAGE))
            self.study.tell(trial, state=TS.FAIL)
        elif state == "PRUNED":
            self.study.tell(trial, state=TS.PRUNED)
        else:
            self.study.tell(trial, [float(result[k]) for k in self.metrics])

    def fail(self, trial_id: str, error: str, result: Mapping[str, Any] | None = None) -> None:
        """:meth:`finish` as ``FAIL`` with ``error``; a trial the study does not hold (it was
        never suggested through a record) is added as ``FAIL`` with its ``trial_id`` and
        ``error``, so that no failed trial is missing from the study."""
        import optuna

        if self.study is None:
            return
        if self._find(trial_id) is None:
            self.study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.FAIL,
                user_attrs={"trial_id": trial_id, "searcher": self.searcher, "error": str(error)}))
            self._ids = None
            return
        self.finish(trial_id, result, state="FAIL", error=error)

    def reattach(self, pending: Iterable[str]) -> tuple[list[str], list[tuple[str, dict, str]]]:
        """After a resume: each RUNNING study trial whose Tune trial is in ``pending`` (the
        restored searcher's pending trials, which Tune continues) is re-attached (``resumed``
        + 1). The other RUNNING ones were lost by the restored Tune and stay RUNNING, to be
        run again (:meth:`rekey`), as are the WAITING ones that :meth:`open` enqueued before
        the driver stopped (they become RUNNING here). Returns ``(reattached, lost)``: Tune trial ids, and for
        each lost trial, in trial order, ``(trial_id, params, proposed_by)``."""
        import optuna

        if self.study is None:
            return [], []
        pending = set(pending)
        reattached, lost = [], []
        self._ids, self._live = None, {}
        # ``open`` enqueues then asks: a driver that died in between left its trial WAITING.
        # Ask for it now (``ask`` takes the oldest WAITING trial) to run it again too.
        dists = self.space.to_optuna()
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            if t.user_attrs.get("trial_id") is None:  # not ours: ``open`` fails it
                break
            self.study.ask({k: dists[k] for k in t.system_attrs.get("fixed_params", {})})
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            tid = t.user_attrs.get("trial_id")
            if tid in pending:
                self._backend.set_trial_user_attr(t._trial_id, "resumed",
                                                  int(t.user_attrs.get("resumed", 0)) + 1)
                reattached.append(tid)
            elif tid is not None:
                lost.append((tid, dict(t.params), str(t.user_attrs.get("proposed_by") or self.searcher)))
        return reattached, lost

    def rekey(self, old_id: str, new_id: str) -> bool:
        """The study trial of Tune trial ``old_id`` (lost by a resumed Tune) becomes Tune trial
        ``new_id``'s: ``trial_id`` = ``new_id``, ``old_id`` appended to ``replaces``, ``resumed``
        + 1, and its epochs cleared (the trial runs again from scratch). Returns ``False``, and
        changes nothing, when no RUNNING study trial has ``trial_id`` ``old_id``."""
        trial = self._trial(old_id)
        if trial is None:
            return False
        attrs = trial.user_attrs
        for key, value in (("trial_id", new_id), ("replaces", [*attrs.get("replaces", []), old_id]),
                           ("resumed", int(attrs.get("resumed", 0)) + 1), ("epoch", 0),
                           ("fidelity", 0.0), ("history", [])):
            trial.set_user_attr(key, value)
        number, storage_id = self._ids.pop(old_id)
        self._ids[new_id] = (number, storage_id)
        self._live[new_id] = self._live.pop(old_id)
        return True

    def replaces(self, trial_id: str) -> list[str]:
        """The Tune trial ids the study trial of ``trial_id`` had before (:meth:`rekey`);
        ``[]`` for an unknown trial."""
        found = self._find(trial_id) if self.study is not None else None
        if found is None:
            return []
        return list(self._backend.get_trial(found[1]).user_attrs.get("replaces") or [])


class RaySearcher(_TuneSearcher):
    """Tune ``Searcher`` around an ask/tell core.

    Args:
        core: the searcher core.
        epochs: the trials' full epoch budget (for the fidelity of early-stopped trials).
        storage: optional Optuna storage (object or URL) to record trials in; study_name: its study.
        fail_errors: mark the study trial of an errored Tune trial ``FAIL`` here (with
            :data:`NO_MESSAGE`); ``False`` leaves it to a callback that has the error line
            and calls ``self.record.fail`` (see the module docstring).
    """

    def __init__(self, core: Searcher, *, epochs: int | None = None, storage=None,
                 study_name: str | None = None, fail_errors: bool = True):
        space = core.space
        super().__init__(metric=space.objectives[0].metric, mode=space.objectives[0].mode)
        self.core, self.epochs, self.fail_errors = core, epochs, bool(fail_errors)
        self.record = (StudyRecord(storage, study_name, space=space, searcher=core.name)
                       if storage is not None else None)
        self.lost: list[tuple[str, dict, str]] = []  # trials to run again (see restore)

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("lost", [])
        if "record" not in state:  # pickled (tuner.pkl) by a version that recorded at the end only
            storage = state.get("storage")
            self.record = (StudyRecord(storage, state.get("study_name"), space=self.core.space,
                                       searcher=self.core.name) if storage is not None else None)
            self.fail_errors = True

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # the objectives come from the search space

    def _fidelity(self, result: Mapping[str, Any] | None) -> float:
        if result and self.epochs and _number(result.get("epoch")):
            return min(1.0, max(float(result["epoch"]) / self.epochs, 1e-6))
        return 1.0

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        while self.lost:  # a trial the restored Tune lost: run it again under this id
            old_id, config, source = self.lost.pop(0)
            if self.record.rekey(old_id, trial_id):  # else it was finished meanwhile
                self.core.adopt(trial_id, config, {"source": source, "run_again_from": old_id},
                                draw=True)
                return {k: config.get(k) for k in self.core.space.params}
        _, config = self.core.ask(trial_id)
        if self.record is not None:
            extra = self.core.pending[trial_id].get("extra") or {}
            self.record.open(trial_id, config, proposed_by=extra.get("source"))
        return {k: config.get(k) for k in self.core.space.params}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if self.record is not None and trial_id in self.core.pending:
            self.record.result(trial_id, result, fidelity=self._fidelity(result))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        p = self.core.pending.get(trial_id)
        if p is None:
            return
        fidelity = self._fidelity(result)
        missing = [] if error or not result else [
            k for k in self.core.metrics if _number(result.get(k)) is None]
        bad = error or not result or bool(missing)
        self.core.tell(trial_id, None if bad else result, error=bad, fidelity=fidelity)
        if self.record is None:
            return
        if error:
            if self.fail_errors:
                self.record.finish(trial_id, result, state="FAIL", error=NO_MESSAGE)
            elif result:
                self.record.result(trial_id, result, fidelity=fidelity)
            return
        if bad:
            why = (f"no finite value for objective(s) {', '.join(missing)}" if result
                   else "stopped before it reported any result")
            self.record.finish(trial_id, result, state="FAIL", fidelity=fidelity, error=why)
            return
        obs = self.core.observations[-1]  # metrics with the known costs filled in
        self.record.finish(trial_id, result, state="COMPLETE" if fidelity >= 1.0 else "PRUNED",
                           fidelity=fidelity, constraints=self.core.constraint_values(obs.metrics))

    def save(self, checkpoint_path: str) -> None:
        self.core.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        """Restore the core; with a study, re-attach its RUNNING trials that the restored core
        has pending and queue the others to run again (:meth:`StudyRecord.reattach`; the next
        :meth:`suggest` calls answer with them, see the module docstring)."""
        self.core.restore(checkpoint_path)
        if self.record is not None:
            _, self.lost = self.record.reattach(self.core.pending)
