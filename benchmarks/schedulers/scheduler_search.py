"""A real search with ``scheduler: ahto`` beside the same search with ``scheduler: asha`` (issue 38).

Protocol: ``search_spaces/default.yaml`` (from-scratch encoders on Rotten Tomatoes sentences,
12 trials, 2 at a time, 4 epochs: rungs at 1 and 3) with only ``budget.scheduler`` changed, run
through the CLI as a user would::

    python -m archsearch.cli search WORK/default_SCHED.yaml --searcher random --name default_SCHED
        --storage WORK/runs --reports WORK/reports --no-progress

``--searcher random`` with the space's seed gives both runs the same 12 configurations (a
model-based searcher's would depend on what the scheduler let it see). One run after the other,
nothing else on the machine. Read from each finished run with the project's readers:
wall clock of the CLI, the summed ``train_seconds`` of the trials (the training the scheduler
spent), trials stopped early, and the hypervolume of (accuracy max, flops_per_sample min) of
each run's finished trials against one reference point for both (accuracy 0.5, the space's
``ref``; FLOPs: 1.1 x the largest of either run). Writes
``benchmarks/schedulers/results/scheduler_search.json`` (``run`` only: two real searches, minutes
of training; nothing to re-analyse offline)::

    python -m benchmarks.schedulers.scheduler_search run [--work DIR]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.evidence.cli import Command
from benchmarks.evidence.frontier import hv2_min
from benchmarks.evidence.provenance import ROOT, provenance
from benchmarks.evidence.results import write_result

SPACE = ROOT / "search_spaces" / "default.yaml"
OUT = Path(__file__).resolve().parent / "results" / "scheduler_search.json"
SCHEDULERS = ("asha", "ahto")


def run(work: Path, sched: str) -> dict:
    spec = yaml.safe_load(SPACE.read_text())
    spec["budget"]["scheduler"] = sched
    space = work / f"default_{sched}.yaml"
    space.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    log = work / f"search_{sched}.log"
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "archsearch.cli", "search", str(space), "--searcher", "random",
                             "--name", f"default_{sched}", "--storage", str(work / "runs"), "--reports",
                             str(work / "reports"), "--no-progress"], cwd=ROOT, env=env, stdout=f,
                            stderr=subprocess.STDOUT).returncode
    wall = time.time() - t0
    from archsearch.runs import FINISHED, STOPPED, RunDir

    recs = RunDir(work / "runs" / f"default_{sched}").read_trials()
    fin = [r for r in recs if r["status"] in FINISHED and r["metrics"].get("accuracy") is not None]
    return {"exit_code": rc, "wall_s": round(wall, 1), "trials": len(recs), "finished": len(fin),
            "stopped_early": sum(r["status"] == STOPPED for r in recs),
            "epochs_trained": sum(len(r["history"]) for r in recs),
            "train_seconds": round(sum(float(r["metrics"].get("train_seconds") or 0.0) for r in fin), 1),
            "points": [[float(r["metrics"]["accuracy"]), float(r["metrics"]["flops_per_sample"])] for r in fin],
            "configs": sorted(str(sorted(r["config"].items())) for r in recs), "log": str(log)}


def measure(args) -> int:
    """Both searches, then the result."""
    work = args.work or Path(tempfile.mkdtemp(prefix="scheduler_search_"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    runs = {s: run(work, s) for s in SCHEDULERS}
    ref_acc = float(yaml.safe_load(SPACE.read_text())["objectives"][0]["ref"])
    ref_flops = 1.1 * max(p[1] for r in runs.values() for p in r["points"])
    s = {"same_configs": runs["asha"]["configs"] == runs["ahto"]["configs"],
         "reference_point": [ref_acc, ref_flops]}
    for name, r in runs.items():
        hv = hv2_min([[-a, f] for a, f in r["points"]], [-ref_acc, ref_flops]) if r["points"] else 0.0
        r["hypervolume"] = hv
        for k in ("wall_s", "train_seconds", "stopped_early", "epochs_trained", "finished", "exit_code"):
            s[f"{name}_{k}"] = r[k]
        s[f"{name}_hypervolume"] = round(hv, 1)
        s[f"{name}_best_accuracy"] = round(max((p[0] for p in r["points"]), default=float("nan")), 4)
    s["ahto_train_seconds_ratio_vs_asha"] = round(runs["ahto"]["train_seconds"] / runs["asha"]["train_seconds"], 4)
    s["ahto_hv_ratio_vs_asha"] = round(runs["ahto"]["hypervolume"] / runs["asha"]["hypervolume"], 4)
    for r in runs.values():
        r.pop("configs")
    write_result(OUT, s, provenance(seeds=[0], wall_s=time.time() - t0, work=str(work), space=str(SPACE.relative_to(ROOT))),
                 runs=runs)
    print(s)
    return 0 if all(r["exit_code"] == 0 for r in runs.values()) else 1


COMMAND = Command(__doc__.split("\n")[0], run=measure,
                  add_arguments=lambda p: p.add_argument("--work", type=Path, default=None,
                                                         help="working folder (default: a new temporary one)"))


def main(argv=None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
