"""Tune overhead and multi-node scaling on real trial lengths, and a 500-trial load test.

Claims: Ray Tune costs under 5% of a search's wall time; a second node nearly doubles the
trials per hour; a 500-trial search runs through the CLI with bounded driver memory and still
gets its report.

* ``nodes 1`` / ``nodes 2``: a real Ray cluster on this host (``cluster/local_cluster.sh``:
  a head with 0 CPUs for trials plus N worker nodes of 1 CPU each, separate raylets), and the
  same 16-trial search (random searcher, seed 0: the same configs) submitted with
  ``archsearch search --address``; trials of >= 60 s (2-layer d=64 encoders, full Rotten
  Tomatoes training split). ``wall`` is the CLI process from start to exit (connect, data,
  checks, Tune, report). Overhead = (wall - ideal makespan) / wall, where the ideal makespan
  schedules the measured trial times (Tune's ``time_total_s``) on the N slots longest-first
  with no gap (a lower bound of any schedule). ``two_node_speedup`` = wall(1) / wall(2).
* ``ceiling``: what two trials can gain on this host with no Ray at all: one trial of the same
  config run as a plain process alone, then two at once (one torch thread each), three rounds.
  ``host_two_process_speedup`` = 2 x median(alone s) / median(together s) is the most any
  two-node run on this machine can reach (both "nodes" share its two cores, and Ray's
  processes and the driver must run on them too).
* ``load``: 500 trials of ~1 s (1-layer d=16 model, 64 training sentences, 1 epoch), 8 at a
  time, local Ray through the CLI (``tpe``): the driver's peak RSS (VmHWM of the CLI process),
  the searcher state Tune saved (bytes), the report's size, and wall time.

    python -m benchmarks.product.scaling run [--only nodes1,nodes2,ceiling,load]   # resumable
    python -m benchmarks.product.scaling analyze|check                    # table + results/scaling.json

Run alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from typing import Any

import yaml

from benchmarks.evidence.cli import Command
from benchmarks.evidence.provenance import ROOT, git_commit, provenance
from benchmarks.evidence.results import build_result, write_json
from benchmarks.evidence.runlog import RunLog, read_jsonl

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs" / "scaling_runs.jsonl"
OUT = HERE / "results" / "scaling.json"
WORK = Path(os.environ.get("SCALING_WORK", "/tmp/archsearch-scaling"))
PORT = 6391
TRIALS, SEED = 16, 0


#: Issue 18's targets (benchmarks/summarize.py stated them for this result before it carried them).
TARGETS = {"tune_overhead_pct": "< 5", "two_node_speedup": ">= 1.8"}


def nodes_spec(epochs: int) -> dict:
    spec = yaml.safe_load((ROOT / "search_spaces" / "default.yaml").read_text())
    spec.update(name="scaling", fixed={"weight_decay": 0.01})
    spec.pop("constraints", None)
    spec["budget"] = {"trials": TRIALS, "max_concurrent": 2, "epochs": epochs, "batch_size": 32,
                      "scheduler": "none", "cpus_per_trial": 1, "max_failures": 1}
    spec["params"] = {"n_layers": {"type": "int", "low": 2, "high": 2},
                      "d_model": {"type": "categorical", "choices": [64]},
                      "n_heads": {"type": "categorical", "choices": [4]},
                      "lr": {"type": "float", "low": 5.0e-4, "high": 3.0e-3, "log": True}}
    return spec


def load_spec() -> dict:
    spec = nodes_spec(1)
    spec["name"] = "load"
    spec["dataset"] = {**spec["dataset"], "max_train_samples": 64}
    spec["budget"] = {"trials": 500, "max_concurrent": 8, "epochs": 1, "batch_size": 32,
                      "scheduler": "none", "cpus_per_trial": 0.25, "max_failures": 0,
                      "latency_batch_size": 8}
    spec["params"] = {"n_layers": {"type": "int", "low": 1, "high": 1},
                      "d_model": {"type": "categorical", "choices": [16]},
                      "n_heads": {"type": "categorical", "choices": [2]},
                      "lr": {"type": "float", "low": 5.0e-4, "high": 3.0e-3, "log": True}}
    return spec


def ideal_makespan(times: list[float], slots: int) -> float:
    """Longest-first list scheduling of ``times`` on ``slots`` machines, no gaps."""
    loads = [0.0] * slots
    for t in sorted(times, reverse=True):
        i = loads.index(min(loads))
        loads[i] += t
    return max(loads)


def _cli_run(args: list, work: Path, env: dict) -> tuple[int, float, int]:
    """Run the CLI; returns (exit code, wall s, peak RSS of the CLI process in kB)."""
    t0 = time.time()
    with open(work / "driver.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "archsearch.cli", *map(str, args)], cwd=work,
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        peak = 0
        while proc.poll() is None:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
                peak = max(peak, int(status.split("VmHWM:")[1].split()[0]))
            except (OSError, IndexError, ValueError):
                pass
            time.sleep(0.5)
    return proc.returncode, time.time() - t0, peak


def run_nodes(n: int, epochs: int) -> dict:
    from archsearch.runs import RunDir

    work = WORK / f"nodes{n}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "space.yaml").write_text(yaml.safe_dump(nodes_spec(epochs)))
    env = {**os.environ, "RAY_PORT": str(PORT),  # `ray` of this interpreter's environment first
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    cluster = ["bash", str(ROOT / "cluster" / "local_cluster.sh")]
    subprocess.run(cluster + ["stop"], env=env, capture_output=True)
    subprocess.run(cluster + ["start", str(n)], env=env, check=True, capture_output=True)
    try:
        rc, wall, peak = _cli_run(["search", work / "space.yaml", "--searcher", "random", "--name", "run",
                                   "--storage", work / "runs", "--reports", work / "reports",
                                   "--address", f"127.0.0.1:{PORT}", "--no-progress"], work, env)
    finally:
        subprocess.run(cluster + ["stop"], env=env, capture_output=True)
    recs = [r for r in RunDir(work / "runs" / "run").read_trials() if r["status"] == "TERMINATED"]
    times = [r["metrics"]["time_total_s"] for r in recs]
    # inside a trial, besides training: evaluation, latency timing, checkpoint, report
    in_trial = [r["metrics"]["time_total_s"] - r["metrics"]["train_seconds"] for r in recs]
    ideal = ideal_makespan(times, n)
    return {"case": f"nodes{n}", "nodes": n, "exit_code": rc, "wall_s": round(wall, 1),
            "trials_done": len(times), "trial_seconds": [round(t, 1) for t in times],
            "ideal_makespan_s": round(ideal, 1), "overhead_pct": round(100 * (wall - ideal) / wall, 2),
            "trials_per_hour": round(3600 * len(times) / wall, 1), "driver_peak_rss_mb": round(peak / 1024, 1),
            "in_trial_not_training_s": round(sum(in_trial) / max(len(in_trial), 1), 2),
            "outside_trials_s": round(wall - ideal, 1)}


def run_load() -> dict:
    from archsearch.runs import RunDir

    work = WORK / "load"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "space.yaml").write_text(yaml.safe_dump(load_spec()))
    env = dict(os.environ)
    rc, wall, peak = _cli_run(["search", work / "space.yaml", "--searcher", "tpe", "--name", "load",
                               "--storage", work / "runs", "--reports", work / "reports",
                               "--no-progress", "--no-ray-dashboard"], work, env)
    run = RunDir(work / "runs" / "load")
    recs = run.read_trials()
    state = [p for p in run.tune_dir.glob("searcher-state-*.pkl")]
    report = work / "reports" / "load" / "index.html"
    times = [r["metrics"].get("time_total_s") or 0 for r in recs if r["status"] == "TERMINATED"]
    return {"case": "load", "exit_code": rc, "wall_s": round(wall, 1), "trials_done": len(times),
            "trials_recorded": len(recs), "mean_trial_s": round(sum(times) / max(len(times), 1), 2),
            "driver_peak_rss_mb": round(peak / 1024, 1),
            "searcher_state_bytes": sum(p.stat().st_size for p in state),
            "optuna_db_bytes": run.optuna_db.stat().st_size if run.optuna_db.exists() else 0,
            "report_built": report.is_file(), "report_bytes": report.stat().st_size if report.is_file() else 0}


CEILING_CONFIG = {"n_layers": 2, "d_model": 64, "n_heads": 4, "lr": 1.0e-3}


def _plain_trial(epochs: int, out: Path) -> None:
    """One trial of ``nodes_spec(epochs)`` in this process, no Ray; writes its seconds to ``out``."""
    import torch

    from archsearch.data.prepare import prepare_for_space
    from archsearch.models.config import trial_config
    from archsearch.space import load_space
    from archsearch.tune.runner import trial_settings
    from archsearch.tune.trainable import run_trial

    torch.set_num_threads(1)
    space_file = out.with_suffix(".yaml")
    space_file.write_text(yaml.safe_dump(nodes_spec(epochs)))
    space = load_space(space_file)
    data = prepare_for_space(space)
    t0 = time.perf_counter()
    run_trial(trial_config(CEILING_CONFIG, space.fixed), data, trial_settings(space, 1))
    out.write_text(json.dumps({"seconds": time.perf_counter() - t0}))


def run_ceiling(epochs: int, rounds: int = 3) -> dict:
    import statistics

    work = WORK / "ceiling"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def trials(n: int, tag: str) -> list[float]:
        outs = [work / f"{tag}-{i}.json" for i in range(n)]
        procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.product.scaling", "_trial", str(epochs),
                                   str(o)], env=env, cwd=ROOT) for o in outs]
        if any(p.wait() != 0 for p in procs):
            raise RuntimeError(f"ceiling: a plain trial failed ({tag})")
        return [json.loads(o.read_text())["seconds"] for o in outs]

    alone, together = [], []
    for r in range(rounds):
        alone += trials(1, f"alone{r}")
        together += trials(2, f"together{r}")
    ratio = 2 * statistics.median(alone) / statistics.median(together)
    return {"case": "ceiling", "alone_s": [round(t, 1) for t in alone],
            "together_s": [round(t, 1) for t in together], "host_two_process_speedup": round(ratio, 3)}


def cmd_run(args) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    done = {r["case"] for r in read_jsonl(RUNS)}
    for case in args.only.split(","):
        if case in done:
            print(f"{case}: already measured (delete its line in {RUNS.name} to redo)")
            continue
        load_before = os.getloadavg()[0]
        if case.startswith("nodes"):
            row = run_nodes(int(case[-1]), args.epochs)
        elif case == "ceiling":
            row = run_ceiling(args.epochs)
        else:
            row = run_load()
        row.update(commit=git_commit(), epochs=1 if case == "load" else args.epochs,
                   load_before=round(load_before, 2), load_after=round(os.getloadavg()[0], 2))
        RunLog(RUNS).append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "trial_seconds"}))
    write_json(OUT, build(args, record_reads=True))
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


def build(args: argparse.Namespace | None = None, *, record_reads: bool = True) -> dict[str, Any]:
    """The result from the run log (prints the table): the one builder of ``run`` and
    ``analyze``. Reads no test split."""
    import statistics

    rows = {r["case"]: r for r in read_jsonl(RUNS)}
    if not rows:
        raise ValueError(f"{RUNS.relative_to(ROOT)}: no scaling runs yet (run first)")
    one, two, load = rows.get("nodes1"), rows.get("nodes2"), rows.get("load")
    ceiling = rows.get("ceiling")
    print(f"{'case':8s} {'wall s':>8s} {'trials':>6s} {'mean trial s':>12s} {'ideal s':>8s} {'overhead %':>10s} {'trials/h':>9s}")
    for r in (one, two):
        if r:
            print(f"{r['case']:8s} {r['wall_s']:8.1f} {r['trials_done']:6d} {statistics.mean(r['trial_seconds']):12.1f} "
                  f"{r['ideal_makespan_s']:8.1f} {r['overhead_pct']:10.2f} {r['trials_per_hour']:9.1f}")
    secs = [s for r in (one, two) if r for s in r["trial_seconds"]]
    summary = {
        "tune_overhead_pct": max(r["overhead_pct"] for r in (one, two) if r) if (one or two) else None,
        "two_node_speedup": round(one["wall_s"] / two["wall_s"], 3) if one and two else None,
        "host_two_process_speedup": ceiling and ceiling["host_two_process_speedup"],
        "trials": min(r["trials_done"] for r in (one, two) if r) if (one or two) else None,
        "mean_trial_s": round(statistics.mean(secs), 1) if secs else None,
        "load_500_driver_rss_mb": load and load["driver_peak_rss_mb"],
        "load_500_wall_s": load and load["wall_s"],
        "load_500_trials_done": load and load["trials_done"],
        "load_500_report_built": load and load["report_built"],
        "load_500_searcher_state_bytes": load and load["searcher_state_bytes"],
    }
    print(json.dumps(summary))
    wall = sum(r.get("wall_s") or sum(r.get("alone_s", [])) + sum(r.get("together_s", [])) / 2
               for r in rows.values())
    return build_result(summary, provenance(
        commits=[r["commit"] for r in rows.values()],
        command="python -m benchmarks.product.scaling run; python -m benchmarks.product.scaling analyze",
        seeds={"searcher": SEED}, wall_s=wall), name="scaling.json", targets=TARGETS,
        record_reads=record_reads, runs=list(rows.values()), method=__doc__)


def results(args: argparse.Namespace) -> dict[Path, dict[str, Any]]:
    """``{results/scaling.json: the result}`` from the committed run log."""
    return {OUT: build(args, record_reads=not args.check)}


def _run_arguments(p: argparse.ArgumentParser) -> None:
    if p.prog.split()[-1] == "run":
        p.add_argument("--only", default="nodes1,nodes2,ceiling,load")
        p.add_argument("--epochs", type=int, default=6)


COMMAND = Command(__doc__.splitlines()[0], run=cmd_run, results=results, add_arguments=_run_arguments)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) == 3 and argv[0] == "_trial":  # a child of run_ceiling
        _plain_trial(int(argv[1]), Path(argv[2]))
        return 0
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
