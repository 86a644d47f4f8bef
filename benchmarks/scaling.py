"""Scaling and fault tolerance on real Ray: 1 node vs 2 nodes, Tune's overhead, faults replayed.

Measures, on this machine (several Ray nodes of 1 CPU each on one host):
  * trials per hour of the same search (random searcher, same seed, so the same configs) on a
    cluster of 1 worker node and of 2 worker nodes -> ``two_node_speedup``;
  * Tune's overhead per trial on the 1-node run: ``100 * (wall - sum of trial run time) /
    sum of trial run time``, where a trial's run time is Tune's ``time_total_s`` (its own
    training + evaluation, as recorded per trial), so the rest is Ray start-up, scheduling,
    actor set-up, checkpoints and reporting;
  * two fault scenarios replayed: the driver SIGKILLed mid-search then ``archsearch resume``;
    a worker node removed mid-trial. ``lost_trials`` (trials asked for minus trials completed)
    and ``duplicated_trials`` (Optuna trials beyond the number of Tune trials, plus repeated
    epochs in a trial's history) are summed over both.

    python benchmarks/scaling.py [--trials 6] [--epochs 2] [--train-samples 2000]

Writes benchmarks/results/scaling.json. Other processes on the machine distort the timings;
the script prints the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "scaling.json"


def space_spec(trials: int, epochs: int, train_samples: int, concurrent: int) -> dict:
    spec = yaml.safe_load((ROOT / "search_spaces" / "default.yaml").read_text())
    spec["name"] = "scaling"
    spec["dataset"]["max_train_samples"] = train_samples
    spec["budget"].update({"trials": trials, "epochs": epochs, "scheduler": "none",
                           "max_concurrent": concurrent, "cpus_per_trial": 1, "max_failures": 2})
    spec.pop("constraints", None)
    return spec


def records(run_dir: Path) -> list[dict]:
    from archsearch.runs import RunDir

    return RunDir(run_dir).read_trials()


def count_faults(run_dir: Path, study_name: str, asked: int) -> tuple[int, int]:
    import optuna

    recs = records(run_dir)
    done = [r for r in recs if r["status"] in ("TERMINATED", "STOPPED")]
    lost = asked - len(done)
    from archsearch.runs import RunDir

    storage = optuna.storages.RDBStorage(RunDir(run_dir).optuna_url)
    n_optuna = len(optuna.load_study(study_name=study_name, storage=storage).trials)
    dup = max(0, n_optuna - len(recs))
    for r in recs:
        epochs = [h["epoch"] for h in r["history"]]
        dup += len(epochs) - len(set(epochs))
    return lost, dup


def run_on_cluster(tmp: Path, n_nodes: int, spec: dict, name: str, kill_node: bool = False) -> dict:
    """A search on a fresh Ray cluster of ``n_nodes`` worker nodes with 1 CPU each."""
    import ray
    from ray.cluster_utils import Cluster

    from archsearch.space import load_space
    from archsearch.runs import read_trials
    from archsearch.tune.ray_session import init_ray
    from archsearch.tune.runner import run_search

    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    space = load_space(path)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(n_nodes)]
    cluster.wait_for_nodes()
    init_ray(cluster.address)
    out: dict = {}

    def go():
        out["res"] = run_search(space, searcher="random", name=name, storage=tmp / "runs",
                                reports=tmp / "reports", progress=False, address=cluster.address)

    t0 = time.time()
    th = threading.Thread(target=go, daemon=True)
    th.start()
    if kill_node:
        run_dir = tmp / "runs" / name
        while th.is_alive():
            recs = read_trials(run_dir)
            running = [r for r in recs if r["status"] == "RUNNING"]
            if len(running) >= 2 and all(r["history"] for r in running):
                cluster.remove_node(nodes[0], allow_graceful=False)
                cluster.add_node(num_cpus=1)
                break
            time.sleep(0.2)
    th.join()
    wall = time.time() - t0
    ray.shutdown()
    cluster.shutdown()
    run_dir = tmp / "runs" / name
    trial_times = [r["metrics"]["time_total_s"] for r in records(run_dir)
                   if r["metrics"].get("time_total_s") is not None]
    return {"wall_s": wall, "run_dir": run_dir, "trial_seconds": trial_times,
            "n_done": sum(r["status"] == "TERMINATED" for r in records(run_dir))}


def driver_kill_scenario(tmp: Path, spec: dict) -> tuple[int, int]:
    """SIGKILL the driver after one trial finished and another has a checkpoint; resume."""
    path = tmp / "kill.yaml"
    path.write_text(yaml.safe_dump(spec))
    run_dir = tmp / "runs" / "kill"
    cli = [sys.executable, "-m", "archsearch.cli"]
    flags = ["--reports", str(tmp / "reports"), "--no-progress", "--no-ray-dashboard"]
    proc = subprocess.Popen(cli + ["search", str(path), "--searcher", "tpe", "--name", "kill",
                                   "--storage", str(tmp / "runs")] + flags,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        recs = records(run_dir) if run_dir.exists() else []
        if any(r["status"] == "TERMINATED" for r in recs) and any(
                r["status"] == "RUNNING" and r["history"] for r in recs):
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    subprocess.run(cli + ["resume", str(run_dir)] + flags, check=True, timeout=1800,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return count_faults(run_dir, "kill", spec["budget"]["trials"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train-samples", type=int, default=2000)
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    load_before = os.getloadavg()
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        one = run_on_cluster(tmp, 1, space_spec(args.trials, args.epochs, args.train_samples, 1), "one")
        two = run_on_cluster(tmp, 2, space_spec(args.trials, args.epochs, args.train_samples, 2), "two")
        for name, r in (("1 node", one), ("2 nodes", two)):
            rows[name] = {"wall_s": r["wall_s"], "trials_done": r["n_done"],
                          "trials_per_hour": 3600 * r["n_done"] / r["wall_s"],
                          "sum_trial_s": sum(r["trial_seconds"])}
        busy = sum(one["trial_seconds"])
        overhead_pct = 100 * (one["wall_s"] - busy) / busy
        speedup = rows["2 nodes"]["trials_per_hour"] / rows["1 node"]["trials_per_hour"]
        lost1, dup1 = count_faults(one["run_dir"], "one", args.trials)
        lost2, dup2 = count_faults(two["run_dir"], "two", args.trials)
        spec_kill = space_spec(args.trials, args.epochs, args.train_samples, 2)
        node = run_on_cluster(tmp, 2, spec_kill, "nodekill", kill_node=True)
        lost3, dup3 = count_faults(node["run_dir"], "nodekill", args.trials)
        lost4, dup4 = driver_kill_scenario(tmp, space_spec(args.trials, args.epochs,
                                                           args.train_samples, 1))
    faults = {"node_killed": {"lost": lost3, "duplicated": dup3},
              "driver_killed_resumed": {"lost": lost4, "duplicated": dup4},
              "clean_runs": {"lost": lost1 + lost2, "duplicated": dup1 + dup2}}
    summary = {"two_node_speedup": round(speedup, 3), "tune_overhead_pct": round(overhead_pct, 2),
               "lost_trials": lost3 + lost4, "duplicated_trials": dup3 + dup4}
    print(f"{'cluster':10s} {'wall s':>8s} {'trials':>7s} {'trials/h':>9s} {'sum trial s':>12s}")
    for k, r in rows.items():
        print(f"{k:10s} {r['wall_s']:8.1f} {r['trials_done']:7d} {r['trials_per_hour']:9.1f} "
              f"{r['sum_trial_s']:12.1f}")
    print(f"faults: {json.dumps(faults)}")
    print(f"summary: {json.dumps(summary)}")
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (2 cores)")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"summary": summary, "runs": rows, "faults": faults,
                               "settings": vars(args),
                               "load_average": {"before": load_before, "after": load_after}},
                              indent=1))


if __name__ == "__main__":
    main()
