"""Benchmark: how long ``write_report`` takes on 1,000 trials, and how big the page is.

Claim checked: a 1,000-trial report is written in under 10 s on this machine.

Records come from :func:`archsearch.report.synthetic.synthetic_trials` (deterministic, shaped
like the runner's: 5-epoch histories, ~25% ASHA-stopped, ~4% ERROR, ~2% NaN). The first call
runs in a fresh interpreter, so it includes importing numpy/plotly/matplotlib (and torch/
BoTorch where used): that is what a user waits for after a search. Warm calls repeat it in
the same process.

    python benchmarks/report.py [--trials 1000] [--repeats 3] [--out DIR]

Prints a table and writes ``benchmarks/results/report.json``:
``{"summary": {"seconds_1000_trials": cold seconds, "html_bytes_1000_trials": int}, ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "report.json"
OBJECTIVES = [{"metric": "accuracy", "mode": "max"}, {"metric": "flops_per_sample", "mode": "min"}]
CONSTRAINTS = {"latency_ms": {"max": 0.5}}
TARGET_SECONDS = 10.0


def run_once(n_trials: int, out_dir: Path, repeats: int) -> dict:
    """In *this* process: generate records, time ``write_report`` ``1 + repeats`` times."""
    t0 = time.perf_counter()
    from archsearch.report import write_report
    from archsearch.report.synthetic import synthetic_trials

    trials = synthetic_trials(n_trials, seed=0, epochs=5)
    t_gen = time.perf_counter() - t0
    run_info = {"name": f"benchmark-{n_trials}", "searcher": "synthetic",
                "space_file": "search_spaces/default.yaml", "wall_time_s": 3600.0,
                "latency_batch_size": 32}
    times = []
    summary = None
    for _ in range(1 + repeats):
        t = time.perf_counter()
        summary = write_report(trials, OBJECTIVES, out_dir, constraints=CONSTRAINTS,
                               run_info=run_info)
        times.append(time.perf_counter() - t)
    files = {p.name: p.stat().st_size for p in sorted(out_dir.iterdir()) if p.is_file()}
    return {
        "generate_seconds": t_gen,
        "cold_seconds": times[0],
        "warm_seconds": times[1:],
        "n_trials": summary["n_trials"],
        "n_failed": summary["n_failed"],
        "n_pareto": len(summary["pareto"]),
        "hypervolume": summary["hypervolume"],
        "files_bytes": files,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3, help="warm repetitions after the cold call")
    ap.add_argument("--out", type=Path, default=None,
                    help="report directory (default: a temporary one, deleted afterwards)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:  # fresh interpreter: print one JSON line for the parent
        print(json.dumps(run_once(args.trials, args.out, args.repeats)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp) / "report"
        out.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, "--child", "--trials", str(args.trials),
             "--repeats", str(args.repeats), "--out", str(out)],
            cwd=ROOT, capture_output=True, text=True, env={**os.environ, "MPLBACKEND": "Agg"},
        )
        process_seconds = time.perf_counter() - t
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            raise SystemExit(f"benchmark child failed with exit code {proc.returncode}")
        res = json.loads(proc.stdout.strip().splitlines()[-1])

    html_bytes = res["files_bytes"]["index.html"]
    warm = res["warm_seconds"]
    rows = [
        ("trials (failed / on front)", f"{res['n_trials']} ({res['n_failed']} / {res['n_pareto']})"),
        ("write_report, cold (fresh process, incl. imports)", f"{res['cold_seconds']:.2f} s"),
        ("write_report, warm (median of %d)" % len(warm),
         f"{statistics.median(warm):.2f} s" if warm else "-"),
        ("whole child process (interpreter start .. exit)", f"{process_seconds:.2f} s"),
        ("index.html", f"{html_bytes / 1e6:.2f} MB"),
        *[(name, f"{size / 1e3:.1f} kB") for name, size in res["files_bytes"].items()
          if name != "index.html"],
        ("target", f"< {TARGET_SECONDS:.0f} s cold: "
                   f"{'met' if res['cold_seconds'] < TARGET_SECONDS else 'MISSED'}"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"report benchmark: {args.trials} synthetic trials, 2 objectives, 1 constraint")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")

    payload = {
        "summary": {
            "seconds_1000_trials": round(res["cold_seconds"], 3),
            "html_bytes_1000_trials": int(html_bytes),
        },
        "definition": "seconds_1000_trials = first write_report call in a fresh Python process "
                      "(includes importing the plotting/numeric libraries); records generated "
                      "beforehand and not timed",
        "n_trials_requested": args.trials,
        "warm_seconds": [round(s, 3) for s in warm],
        "process_seconds": round(process_seconds, 3),
        "target_seconds": TARGET_SECONDS,
        **{k: res[k] for k in ("n_trials", "n_failed", "n_pareto", "hypervolume", "files_bytes",
                               "generate_seconds")},
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpu_count": os.cpu_count()},
    }
    if args.trials != 1000:
        payload["summary"] = {f"seconds_{args.trials}_trials": payload["summary"]["seconds_1000_trials"],
                              f"html_bytes_{args.trials}_trials": int(html_bytes)}
        target = RESULTS.with_name(f"report_{args.trials}.json")
    else:
        target = RESULTS
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_file = target.with_name(target.name + ".tmp")
    tmp_file.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp_file, target)
    print(f"wrote {target.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
