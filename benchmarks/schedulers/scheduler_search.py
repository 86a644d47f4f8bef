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

Issue 66's protocol (``protocols/scheduler_search_v2.json``, written before its runs): searches
as users run them, ended by ``budget.time_budget_s`` (``--time-budget 300``, ``budget.trials``
200), the CLI's default searcher, ``--repeats 3`` (repeat ``r``: the space's seed ``r``, the
same for both schedulers), one at a time, asha then ahto; scored by the hypervolume each reached
in the same wall time, over its finished and early-stopped trials, against one reference point
for all six; writes ``results/scheduler_search_v2.json``::

    python -m benchmarks.schedulers.scheduler_search run --time-budget 300 --repeats 3
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
HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "scheduler_search.json"
OUT_V2 = HERE / "results" / "scheduler_search_v2.json"
PROTOCOL_V2 = HERE / "protocols" / "scheduler_search_v2.json"
SCHEDULERS = ("asha", "ahto")


def run(work: Path, sched: str, time_budget: float | None = None, seed: int | None = None) -> dict:
    """One search through the CLI: the 12-trial random-searcher comparison, or with
    ``time_budget`` issue 66's (the default searcher, ``budget.trials`` 200, the space's seed
    ``seed``)."""
    spec = yaml.safe_load(SPACE.read_text())
    spec["budget"]["scheduler"] = sched
    name = f"default_{sched}"
    args = ["--searcher", "random"]
    if time_budget is not None:
        spec["budget"].update(time_budget_s=float(time_budget), trials=200)
        spec["seed"] = int(seed or 0)
        name, args = f"default_{sched}_r{int(seed or 0)}", []
    space = work / f"{name}.yaml"
    space.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    log = work / f"search_{name}.log"
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "archsearch.cli", "search", str(space), *args,
                             "--name", name, "--storage", str(work / "runs"), "--reports",
                             str(work / "reports"), "--no-progress"], cwd=ROOT, env=env, stdout=f,
                            stderr=subprocess.STDOUT).returncode
    wall = time.time() - t0
    from archsearch.runs import FINISHED, STOPPED, RunDir

    recs = RunDir(work / "runs" / name).read_trials()
    fin = [r for r in recs if r["status"] in FINISHED and r["metrics"].get("accuracy") is not None]
    return {"exit_code": rc, "wall_s": round(wall, 1), "trials": len(recs), "finished": len(fin),
            "stopped_early": sum(r["status"] == STOPPED for r in recs),
            "epochs_trained": sum(len(r["history"]) for r in recs),
            "train_seconds": round(sum(float(r["metrics"].get("train_seconds") or 0.0) for r in fin), 1),
            "points": [[float(r["metrics"]["accuracy"]), float(r["metrics"]["flops_per_sample"])] for r in fin],
            "configs": sorted(str(sorted(r["config"].items())) for r in recs), "log": str(log)}


def measure_time_budget(args, work: Path) -> int:
    """Issue 66's protocol: ``args.repeats`` x (asha, ahto) time-budgeted searches, then
    ``results/scheduler_search_v2.json``."""
    t0 = time.time()
    runs = {}
    for r in range(args.repeats):
        for sch in SCHEDULERS:
            runs[f"{sch}_r{r}"] = run(work, sch, args.time_budget, r)
            print(sch, r, {k: v for k, v in runs[f"{sch}_r{r}"].items() if k not in ("points", "configs")}, flush=True)
    ref_acc = float(yaml.safe_load(SPACE.read_text())["objectives"][0]["ref"])
    ref_flops = 1.1 * max(p[1] for r in runs.values() for p in r["points"])
    s: dict = {"reference_point": [ref_acc, ref_flops], "time_budget_s": args.time_budget}
    ratios = []
    for r in range(args.repeats):
        hv = {}
        for sch in SCHEDULERS:
            x = runs[f"{sch}_r{r}"]
            x["hypervolume"] = hv[sch] = (hv2_min([[-a, f] for a, f in x["points"]], [-ref_acc, ref_flops])
                                          if x["points"] else 0.0)
            x["front"] = sorted(p for p in x["points"]  # (accuracy, FLOPs) points no other point dominates
                                if not any(q[0] >= p[0] and q[1] <= p[1] and q != p for q in x["points"]))
            x.pop("configs")
            for k in ("trials", "finished", "stopped_early", "epochs_trained", "train_seconds", "wall_s", "exit_code"):
                s[f"{sch}_{k}_r{r}"] = x[k]
            s[f"{sch}_hypervolume_r{r}"] = round(hv[sch], 1)
        ratios.append(hv["ahto"] / hv["asha"] if hv["asha"] else float("nan"))  # nan: asha reached no point
        s[f"ahto_real_hv_ratio_vs_asha_r{r}"] = round(ratios[-1], 4)
    nan = any(r != r for r in ratios)  # a repeat without a ratio leaves both keys undefined
    s["ahto_real_hv_ratio_vs_asha_at_equal_time"] = float("nan") if nan else round(sum(ratios) / len(ratios), 4)
    s["ahto_real_hv_ratio_vs_asha_at_equal_time_min"] = float("nan") if nan else round(min(ratios), 4)
    write_result(OUT_V2, s, provenance(seeds=list(range(args.repeats)), wall_s=time.time() - t0, work=str(work),
                                       space=str(SPACE.relative_to(ROOT)),
                                       protocol=str(PROTOCOL_V2.relative_to(ROOT))),
                 targets={"ahto_real_hv_ratio_vs_asha_at_equal_time": ">= 1.0"}, runs=runs)
    print(s)
    return 0 if all(x["exit_code"] == 0 for x in runs.values()) else 1


def measure(args) -> int:
    """Both searches, then the result (with ``--time-budget``: :func:`measure_time_budget`)."""
    work = args.work or Path(tempfile.mkdtemp(prefix="scheduler_search_"))
    if args.time_budget is not None:
        work.mkdir(parents=True, exist_ok=True)
        return measure_time_budget(args, work)
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


def _add_arguments(p) -> None:
    p.add_argument("--work", type=Path, default=None, help="working folder (default: a new temporary one)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="issue 66's protocol: searches ended by budget.time_budget_s = this many seconds")
    p.add_argument("--repeats", type=int, default=3, help="with --time-budget: repeats (seeds 0..n-1)")


COMMAND = Command(__doc__.split("\n")[0], run=measure, add_arguments=_add_arguments)


def main(argv=None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
