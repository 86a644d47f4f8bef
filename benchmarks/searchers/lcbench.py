"""Searchers on LCBench (issue 37): searches on the YAHPO LCBench surrogate's tasks, and the check
of the surrogate reader against yahpo-gym itself.

The test bed (surrogate, task split, scoring frame, searcher construction) is
:mod:`benchmarks.testbeds.lcbench`. ``run`` appends one JSON line per (problem, searcher label,
seed) to ``benchmarks/searchers/runs/lcbench_runs.jsonl`` (resumable; ``--workers`` processes):
the test tasks' rows are what ``python -m benchmarks.searchers.searchers analyze`` scores for
issue 37's keys of ``searchers.json``; validation rows (``--tasks validation --label VARIANT
--kwargs '{"policy": FILE}'``) are what ``python -m benchmarks.ahto_policy.ahto_policy run
--stage ship`` selects on. ``run --check-yahpo PYTHON`` instead compares the reader with
yahpo-gym (``PYTHON``: a throwaway environment with ``yahpo-gym==1.0.2``) on 300 rows and writes
``benchmarks/searchers/results/lcbench_check.json``; ``run --list-tasks`` prints the committed
split with each task's reference point.

Usage::

    python -m benchmarks.searchers.lcbench run --tasks test --seeds 0-4
    python -m benchmarks.searchers.lcbench run --check-yahpo /tmp/yahpo_venv/bin/python
    python -m benchmarks.searchers.lcbench run --list-tasks
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.evidence.cli import Command
from benchmarks.evidence.provenance import git_commit, provenance
from benchmarks.evidence.results import build_result, write_json
from benchmarks.evidence.runlog import RunLog
from benchmarks.testbeds import lcbench as L

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs" / "lcbench_runs.jsonl"
CHECK_OUT = HERE / "results" / "lcbench_check.json"


def _run_job(job: tuple) -> dict:
    import torch

    torch.set_num_threads(1)
    from benchmarks.searchers.searchers import run_one

    task, n_obj, name, seed, budget, label, kwargs = job
    problem = L.LCBenchProblem(task, n_obj, budget)
    t0 = time.time()
    r = run_one(problem, label, seed, budget=budget, core=L.build_searcher(name, problem, seed, **kwargs))
    r.update(task=task, objectives=n_obj, seconds=time.time() - t0, kwargs=kwargs)
    return r


def cmd_searches(args) -> None:
    """Resumable: one JSON line per (problem, searcher label, seed); ``--workers`` processes."""
    from multiprocessing import get_context

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["problem"], r["searcher"], r["seed"]) for r in L.read_runs(out) if len(r["curve"]) >= args.budget}
    kwargs = json.loads(args.kwargs) if args.kwargs else {}
    jobs = []
    for seed in args.seeds:
        for task in L.tasks_of(args.tasks):
            for name in args.searchers:
                label = args.label or name
                pname = f"lcbench{'' if args.objectives == 2 else '1'}_{task}"
                if (pname, label, seed) not in done:
                    jobs.append((task, args.objectives, name, seed, args.budget, label, kwargs))
    commit = git_commit()
    print(f"{len(jobs)} runs to do ({len(done)} done) -> {out}", flush=True)
    start = time.time()
    ctx = get_context("spawn")
    with ctx.Pool(args.workers) as pool:
        for k, r in enumerate(pool.imap_unordered(_run_job, jobs), 1):
            r["commit"] = commit
            RunLog(out).append(r)
            at = "/".join(f"{r['curve'][b - 1]:.3f}" for b in L.LC_BUDGETS if b <= len(r["curve"]))
            print(f"[{k}/{len(jobs)}] {r['problem']} {r['searcher']} seed={r['seed']} hv={at} "
                  f"{r['seconds']:.1f}s (elapsed {time.time() - start:.0f}s)", flush=True)


def cmd_check_yahpo(args) -> None:
    """Compare the reader with yahpo-gym; write :data:`CHECK_OUT`."""
    import onnxruntime

    t0 = time.time()
    seed = args.seeds[0]
    diffs = L.check_yahpo(args.check_yahpo, args.n, seed)
    ver = subprocess.run([args.check_yahpo, "-c", "import yahpo_gym, onnxruntime; print(yahpo_gym.__version__ if hasattr(yahpo_gym, '__version__') else '1.0.2', onnxruntime.__version__)"],
                         capture_output=True, text=True).stdout.split()
    # float32 network, batches of different sizes: agreement = within float32 rounding of the
    # target's scale (1e-5 of its largest magnitude), for every target
    worst = max(d["max_abs_diff"] / max(abs(d["range"][0]), abs(d["range"][1])) for d in diffs.values())
    summary = {"rows": args.n, "max_abs_diff_over_scale": worst, "agrees": worst < 1e-5, "per_target": diffs}
    prov = provenance(seeds=[seed], wall_s=time.time() - t0, onnxruntime=onnxruntime.__version__, yahpo_side=ver)
    write_json(CHECK_OUT, build_result(summary, prov, name=CHECK_OUT.name))
    print(json.dumps(summary, indent=2))


def cmd_tasks(args) -> None:
    for part, tasks in L.load_split().items():
        for t in tasks:
            ref = L.task_reference(t)
            print(f"{part:10s} {t:>7s}  ref acc {ref['ref'][0]:6.2f}  ref time {-ref['ref'][1]:9.1f}  HV {ref['best']:.1f}")


def _run(args) -> int:
    if args.check_yahpo:
        cmd_check_yahpo(args)
    elif args.list_tasks:
        cmd_tasks(args)
    else:
        cmd_searches(args)
    return 0


def _add_arguments(p) -> None:
    p.add_argument("--tasks", default="test", help="train|validation|test|TASK_ID, comma-separated")
    p.add_argument("--searchers", nargs="+", default=list(L.LC_SEARCHERS[:-1]))
    p.add_argument("--budget", type=int, default=40)
    p.add_argument("--objectives", type=int, default=2, choices=(1, 2))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--label", default=None, help="record the runs under this searcher name (a variant)")
    p.add_argument("--kwargs", default=None, help="JSON keyword arguments for the searcher")
    p.add_argument("--out", default=str(RUNS), help="the run log")
    p.add_argument("--check-yahpo", default=None, metavar="PYTHON",
                   help="compare with yahpo-gym run by PYTHON (a throwaway environment); writes lcbench_check.json")
    p.add_argument("--n", type=int, default=300, help="--check-yahpo: rows compared")
    p.add_argument("--list-tasks", action="store_true", help="print the committed split")


COMMAND = Command(__doc__.split("\n")[0], run=_run, add_arguments=_add_arguments, seeds="0-4")


def main(argv=None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
