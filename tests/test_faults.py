"""Faults with real Ray in subprocesses: a driver killed with SIGKILL and resumed."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

TINY = {
    "name": "faults",
    "task": "classification",
    "dataset": {"name": "rotten_tomatoes_sentences", "vocab_size": 1000, "max_len": 32,
                "max_train_samples": 1024},
    "objectives": [{"metric": "accuracy", "mode": "max"}, {"metric": "flops_per_sample", "mode": "min"}],
    "budget": {"trials": 4, "max_concurrent": 1, "epochs": 3, "batch_size": 64,
               "scheduler": "none", "cpus_per_trial": 1},
    "params": {
        "n_layers": {"type": "int", "low": 1, "high": 2},
        "d_model": {"type": "categorical", "choices": [16, 32]},
        "n_heads": {"type": "categorical", "choices": [2]},
        "lr": {"type": "float", "low": 1e-3, "high": 3e-3, "log": True},
    },
}


def _cli(*args, **kw):
    return [sys.executable, "-m", "archsearch.cli", *args]


def _records(run_dir: Path) -> list[dict]:
    out = []
    for p in (run_dir / "trials").glob("*.json"):
        try:
            out.append(json.loads(p.read_text()))
        except (json.JSONDecodeError, OSError):
            pass
    return out


@pytest.mark.ray
@pytest.mark.slow
def test_driver_killed_then_resumed_loses_and_duplicates_nothing(tmp_path, cache_dir):
    import optuna

    space = tmp_path / "faults.yaml"
    space.write_text(yaml.safe_dump(TINY))
    env = {**os.environ, "ARCHSEARCH_CACHE": str(cache_dir)}
    run_dir = tmp_path / "runs" / "r"
    proc = subprocess.Popen(_cli("search", str(space), "--searcher", "tpe", "--name", "r",
                                 "--storage", str(tmp_path / "runs"), "--reports",
                                 str(tmp_path / "reports"), "--no-progress", "--no-ray-dashboard"),
                            cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        # kill the driver once one trial finished and another is part-way (has a checkpoint)
        while time.time() < deadline:
            recs = _records(run_dir) if run_dir.exists() else []
            done = [r for r in recs if r["status"] == "TERMINATED"]
            running = [r for r in recs if r["status"] == "RUNNING" and r["history"]]
            if done and running:
                break
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        else:
            pytest.fail("the search made no progress")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = {r["trial_id"]: r["status"] for r in _records(run_dir)}
    assert "RUNNING" in before.values()

    res = subprocess.run(_cli("resume", str(run_dir), "--reports", str(tmp_path / "reports"),
                              "--no-progress", "--no-ray-dashboard"),
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]

    recs = _records(run_dir)
    assert len(recs) == 4, [(r["trial_id"], r["status"]) for r in recs]
    assert all(r["status"] == "TERMINATED" for r in recs)
    for r in recs:  # the interrupted trial continued: one history entry per epoch, no repeats
        assert [h["epoch"] for h in r["history"]] == [1, 2, 3]
    storage = optuna.storages.RDBStorage(f"sqlite:///{run_dir / 'optuna.db'}")
    study = optuna.load_study(study_name="r", storage=storage)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 4, states
    assert len(study.trials) == 4, states
    pj = json.loads((tmp_path / "reports" / "r" / "pareto.json").read_text())
    assert pj["n_trials"] == 4 and pj["n_failed"] == 0
