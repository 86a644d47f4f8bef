"""A real, tiny Ray Tune search end to end: real data, real training, Optuna storage, report."""

import json
import math

import pytest

from conftest import TINY_SPACE, cli_command, free_port, run_cli, tiny_space


@pytest.mark.ray
def test_tiny_search_end_to_end(tiny_run):
    import optuna

    from archsearch.runs import read_trials

    res = tiny_run
    trials = read_trials(res.run_dir)
    assert len(trials) == 3
    for t in trials:
        assert t["status"] == "TERMINATED", t
        assert [h["epoch"] for h in t["history"]] == [1, 2]
        m = t["metrics"]
        assert 0.0 <= m["accuracy"] <= 1.0
        assert m["flops_per_sample"] > 0 and m["params_trainable"] > 0 and m["latency_ms"] > 0
        assert math.isfinite(m["val_loss"]) and m["train_seconds"] > 0
    # Optuna storage holds one study with every trial and both objective values
    from archsearch.runs import RunDir

    storage = optuna.storages.RDBStorage(RunDir(res.run_dir).optuna_url)
    study = optuna.load_study(study_name="tiny-run", storage=storage)
    assert len(study.trials) == 3
    assert all(t.state == optuna.trial.TrialState.COMPLETE and len(t.values) == 2 for t in study.trials)
    # report files, and pareto.json in the documented shape
    for f in ("index.html", "pareto.png", "trials.csv", "pareto.json"):
        assert (res.report_dir / f).is_file(), f
    pj = json.loads((res.report_dir / "pareto.json").read_text())
    assert set(pj) == {"objectives", "reference_point", "hypervolume", "pareto", "n_trials", "n_failed"}
    assert pj["n_trials"] == 3 and pj["n_failed"] == 0
    # the reported hypervolume is the one of the recorded trials (recomputed independently)
    from archsearch.pareto import hypervolume

    objs = pj["objectives"]
    Y = [[t["metrics"][o["metric"]] for o in objs] for t in trials]
    expect = hypervolume(Y, [o["mode"] for o in objs], pj["reference_point"])
    assert expect > 0 and math.isclose(pj["hypervolume"], expect, rel_tol=1e-9)
    assert pj["pareto"] and set(pj["pareto"][0]) == {"trial_id", "config", "metrics"}


@pytest.mark.ray
def test_nan_trial_is_recorded_as_failed_and_search_goes_on(tmp_path, ray_session, cache_dir):
    from archsearch.runs import read_trials
    from archsearch.tune.runner import run_search

    # lr 1e6 blows the loss up to NaN/inf within a few steps; the other trials are fine
    space = tiny_space(tmp_path, params={
        "n_layers": {"type": "int", "low": 1, "high": 1},
        "d_model": {"type": "categorical", "choices": [16]},
        "n_heads": {"type": "categorical", "choices": [2]},
        "lr": {"type": "categorical", "choices": [1.0e6, 1.0e-3]},
    }, budget={**TINY_SPACE["budget"], "trials": 4, "epochs": 1})
    res = run_search(space, searcher="random", name="nan-run", storage=tmp_path / "runs",
                     reports=tmp_path / "reports", progress=False)
    trials = read_trials(res.run_dir)
    failed = [t for t in trials if t["status"] == "ERROR"]
    ok = [t for t in trials if t["status"] == "TERMINATED"]
    assert len(trials) == 4 and failed and ok
    assert all("NaN" in t["error"] or "nan" in t["error"] or "inf" in t["error"] for t in failed)
    # budget.max_failures (1) retried it; the retry failed at once instead of training to the
    # same NaN again
    assert all("not trained again" in t["error"] for t in failed), [t["error"] for t in failed]
    assert res.summary["n_failed"] == len(failed)


@pytest.mark.ray
@pytest.mark.parametrize("when", ["at_start", "after_a_trial"])
def test_a_searcher_state_that_cannot_be_saved_stops_the_search_in_one_line(
        tmp_path, ray_session, cache_dir, monkeypatch, when):
    """NSGA-II's state fails to save (as pickling Optuna 5.1's sampler did: a lock) before the
    first trial (Tune's tuner.pkl) or after one (Tune's experiment checkpoint): the search stops
    with one SearchStopped line naming the searcher (exit code 1), its run and report written."""
    import optuna

    from archsearch.errors import SearchStopped
    from archsearch.runs import read_trials
    from archsearch.search import baselines
    from archsearch.tune.runner import run_search

    real = baselines.study_state

    def failing(study):
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if when == "at_start" or done:
            raise TypeError("cannot pickle '_thread.lock' object")
        return real(study)

    monkeypatch.setattr(baselines, "study_state", failing)
    space = tiny_space(tmp_path, budget={**TINY_SPACE["budget"], "trials": 3, "max_concurrent": 1,
                                         "epochs": 1})
    with pytest.raises(SearchStopped) as info:
        run_search(space, searcher="nsga2", name="unsaved", storage=tmp_path / "runs",
                   reports=tmp_path / "reports", progress=False)
    line = info.value.one_line()
    assert info.value.exit_code == 1 and "\n" not in line
    assert line.startswith("--searcher: searcher nsga2 could not save its state (TypeError: cannot pickle")
    assert line.endswith(f"report: {tmp_path / 'reports' / 'unsaved' / 'index.html'}")
    assert (tmp_path / "reports" / "unsaved" / "index.html").is_file()
    finished = [t for t in read_trials(tmp_path / "runs" / "unsaved") if t["status"] == "TERMINATED"]
    assert len(finished) == 0 if when == "at_start" else len(finished) >= 1, finished


@pytest.mark.ray
def test_trials_cut_by_the_time_budget_are_stopped_not_failed(tmp_path, ray_session, cache_dir):
    """``budget.time_budget_s`` ends the search with trials part-way: Ray Tune stops them
    without telling the callbacks or the searcher. They end STOPPED (valid points with fewer
    epochs) in the records and PRUNED in the Optuna study, not RUNNING and counted failed; one
    cut before its first epoch ends ERROR / FAIL, saying the budget cut it."""
    import optuna

    from archsearch.runs import RunDir, read_trials
    from archsearch.tune.runner import run_search

    from archsearch.data import prepare_for_space

    # 40 s of training only (the data prepared and cached first, as earlier tests of a session
    # leave it): every trial reaches its first epoch even on a loaded machine, far from 500
    # epochs. (At 20 s, with three times the usual load, one trial had none: ERROR, by design.)
    space = tiny_space(tmp_path, budget={**TINY_SPACE["budget"], "trials": 2, "epochs": 500,
                                         "time_budget_s": 40})
    prepare_for_space(space)
    res = run_search(space, searcher="random", name="budget-run", storage=tmp_path / "runs",
                     reports=tmp_path / "reports", progress=False)
    trials = read_trials(res.run_dir)
    stopped = [t for t in trials if t["status"] == "STOPPED"]
    # a trial the budget cut before its first epoch (the second one to start, on a loaded
    # machine) is an ERROR that says so: by design, and checked here rather than left to chance
    cut = [t for t in trials if t["status"] == "ERROR"]
    assert len(trials) == 2 and stopped and len(stopped) + len(cut) == 2, trials
    assert all(1 <= len(t["history"]) < 500 and t["error"] is None for t in stopped)
    assert all(not t["history"] and "time budget" in t["error"] for t in cut)
    study = optuna.load_study(study_name="budget-run", storage=RunDir(res.run_dir).optuna_url)
    states = {t.user_attrs["trial_id"]: t.state.name for t in study.trials}
    assert states == {t["trial_id"]: "PRUNED" if t in stopped else "FAIL" for t in trials}
    # with their constraint values, as an ASHA-stopped trial has them (TINY_SPACE's bound)
    slack = {r["trial_id"]: r["metrics"]["params_trainable"] - 400000 for r in stopped}
    assert {t.user_attrs["trial_id"]: t.system_attrs["constraints"] for t in study.trials
            if t.state.name == "PRUNED"} == {tid: [value] for tid, value in slack.items()}
    assert res.summary["n_failed"] == len(cut) and res.summary["n_trials"] == 2


@pytest.mark.ray
def test_a_resumed_search_gets_only_what_its_time_budget_left(tmp_path, ray_session, cache_dir):
    """``budget.time_budget_s`` spans the sessions of a run. A search stopped with Ctrl-C (a
    SIGINT: Tune saves its state and returns) after its first trial's first epoch, whose
    recorded wall time then says the budget is spent (as if that session had run as long),
    trains nothing more when resumed. Ray's own ``TimeoutStopper``
    (``TuneConfig.time_budget_s``) restarts on restore: it gave the resumed session the whole
    budget again."""
    import os
    import signal
    import threading
    import time

    from archsearch.data import prepare_for_space
    from archsearch.runs import RunDir, read_trials
    from archsearch.tune.runner import resume_search, run_search

    budget = 120
    space = tiny_space(tmp_path, budget={**TINY_SPACE["budget"], "trials": 3, "max_concurrent": 1,
                                         "epochs": 500, "time_budget_s": budget})
    prepare_for_space(space)
    run_dir = tmp_path / "runs" / "spent-run"

    def interrupt_after_an_epoch():
        deadline = time.time() + 300
        while time.time() < deadline:
            if run_dir.is_dir() and any(t["history"] for t in read_trials(run_dir)):
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.1)

    threading.Thread(target=interrupt_after_an_epoch, daemon=True).start()
    run_search(space, searcher="random", name="spent-run", storage=tmp_path / "runs",
               reports=tmp_path / "reports", progress=False)
    epochs = {t["trial_id"]: len(t["history"]) for t in read_trials(run_dir)}
    assert any(epochs.values()), epochs
    run = RunDir(run_dir)
    spec = run.read_spec()
    assert spec.wall_seconds < budget  # interrupted, not stopped by the budget
    spec.wall_seconds = float(budget)  # as if the session had lasted the whole budget
    run.write_spec(spec)
    resume_search(run_dir, reports=tmp_path / "reports", progress=False)
    after = {t["trial_id"]: len(t["history"]) for t in read_trials(run_dir)}
    assert {tid: n for tid, n in after.items() if tid in epochs} == epochs, (epochs, after)
    assert all(n == 0 for tid, n in after.items() if tid not in epochs), after


@pytest.mark.ray
def test_optuna_dashboard_serves_the_run(tiny_run):
    """`archsearch dashboard RUN_DIR` on 127.0.0.1: /api/studies lists the study and its trials."""
    import subprocess
    import time
    import urllib.request

    port = free_port()
    proc = subprocess.Popen(cli_command("dashboard", tiny_run.run_dir, "--port", port),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        body, deadline = None, time.time() + 60
        while time.time() < deadline and body is None:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2).read()
            except OSError:
                time.sleep(0.5)
        assert body is not None, "optuna-dashboard did not answer"
        studies = json.loads(body)["study_summaries"]
        assert [s["study_name"] for s in studies] == ["tiny-run"]
        sid = studies[0]["study_id"]
        detail = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/studies/{sid}?after=0", timeout=5).read())
        assert len(detail["trials"]) == 3
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.ray
def test_report_command_rewrites_the_report(tiny_run, tmp_path):
    out = tmp_path / "again"
    proc = run_cli("report", tiny_run.run_dir, "--out", out, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "pareto.json").read_text())["n_trials"] == 3
    assert "hypervolume" in proc.stdout


def test_the_diverged_marker_is_written_whole_and_never_raises(tmp_path):
    """Written through a temporary file and a rename, read back; on a storage without rename
    (pyarrow raises NotImplementedError) written directly, no temporary file left; on a storage
    that refuses writes, a warning (the trial's own error must stay the one raised); a torn
    file reads as no marker (the trial trains, as without one)."""
    import pyarrow.fs

    from archsearch.tune.trainable import _DivergedMarker

    local = pyarrow.fs.LocalFileSystem()

    class NoRename:  # the local file system, without move (as some pyarrow file systems)
        def __getattr__(self, name):
            return getattr(local, name)

        def move(self, src, dst):
            raise NotImplementedError("move")

    class ReadOnly(NoRename):
        def open_output_stream(self, path):
            raise PermissionError(13, "read-only storage")

    def marker(fs, name):
        m = object.__new__(_DivergedMarker)
        m.fs, m.path = fs, str(tmp_path / name / "diverged.json")
        return m

    for fs, name in ((local, "a"), (NoRename(), "b")):
        m = marker(fs, name)
        assert m.read() is None
        m.write("training loss is nan at epoch 1, step 2", 1)
        assert m.read() == {"error": "training loss is nan at epoch 1, step 2", "epoch": 1}
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == ["diverged.json"]
    with pytest.warns(UserWarning, match="could not write"):
        marker(ReadOnly(), "c").write("nan", 0)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "diverged.json").write_text('{"err')
    assert marker(local, "d").read() is None
