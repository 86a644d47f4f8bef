"""Benchmark: how long ``write_report`` takes on 1,000 trials, and how big the page is.

Claim checked: a 1,000-trial report is written in under 10 s on this machine.

Records come from :func:`archsearch.report.synthetic.synthetic_trials` (deterministic, shaped
like the runner's: 5-epoch histories, ~25% ASHA-stopped, ~4% ERROR, ~2% NaN). Scenarios:

* ``plain``: 2 objectives (accuracy max, FLOPs min), 1 constraint: the default space's shape.
  This is the headline (``summary``).
* ``dynamic``: the same plus anytime curves (8 points) on the ~25% length-drop trials and
  tying maps: ~2,000 extra sub-trials, every one eligible for the front and drawn.
* ``dynamic-3obj``: ``dynamic`` with latency_ms as a third objective (three 2-D projections,
  a 3-D view, a 3-D hypervolume history).

Each measurement is the first ``write_report`` call in a fresh Python process, so it
includes importing numpy/plotly/matplotlib: what a user waits for after a search. Records are
generated before the clock starts. Fresh processes of the scenarios are interleaved
(``--repeats`` rounds) and the median is reported, because this machine is shared; the load
average is recorded next to the numbers. Warm calls (same process, second call) are shown too.

    python benchmarks/report.py [--trials 1000] [--repeats 3]

Prints a table and writes ``benchmarks/results/report.json``:
``{"summary": {"seconds_1000_trials": median cold seconds (plain),
"html_bytes_1000_trials": int}, ...}``.
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
SCENARIOS = {
    "plain": {"dynamic": False, "objectives": OBJECTIVES},
    "dynamic": {"dynamic": True, "objectives": OBJECTIVES},
    "dynamic-3obj": {"dynamic": True,
                     "objectives": OBJECTIVES + [{"metric": "latency_ms", "mode": "min"}]},
}
TARGET_SECONDS = 10.0


def run_once(scenario: str, n_trials: int, out_dir: Path) -> dict:
    """In *this* (fresh) process: generate records, time ``write_report`` twice (cold, warm)."""
    from archsearch.report import write_report
    from archsearch.report.synthetic import synthetic_trials

    spec = SCENARIOS[scenario]
    trials = synthetic_trials(n_trials, seed=0, epochs=5, dynamic=spec["dynamic"])
    run_info = {"name": f"benchmark-{scenario}-{n_trials}", "searcher": "synthetic",
                "space_file": "search_spaces/default.yaml", "wall_time_s": 3600.0,
                "latency_batch_size": 32}
    times = []
    summary = None
    for _ in range(2):
        t = time.perf_counter()
        summary = write_report(trials, spec["objectives"], out_dir, constraints=CONSTRAINTS,
                               run_info=run_info)
        times.append(time.perf_counter() - t)
    n_points = sum(len(t["metrics"].get("anytime_curve") or []) for t in trials)
    return {
        "cold_seconds": times[0], "warm_seconds": times[1],
        "n_trials": summary["n_trials"], "n_failed": summary["n_failed"],
        "n_anytime_points": n_points, "n_pareto": len(summary["pareto"]),
        "hypervolume": summary["hypervolume"],
        "files_bytes": {p.name: p.stat().st_size for p in sorted(out_dir.iterdir()) if p.is_file()},
    }


def child(scenario: str, n_trials: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, "--child", scenario, "--trials", str(n_trials),
             "--out", str(Path(tmp) / "report")],
            cwd=ROOT, capture_output=True, text=True, env={**os.environ, "MPLBACKEND": "Agg"})
        wall = time.perf_counter() - t
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"benchmark child failed with exit code {proc.returncode}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_seconds"] = wall
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per scenario")
    ap.add_argument("--child", choices=sorted(SCENARIOS), help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:  # fresh interpreter: print one JSON line for the parent
        args.out.mkdir(parents=True, exist_ok=True)
        print(json.dumps(run_once(args.child, args.trials, args.out)))
        return

    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {s: [] for s in SCENARIOS}
    for _ in range(args.repeats):  # interleaved: each round runs every scenario once
        for scenario in SCENARIOS:
            runs[scenario].append(child(scenario, args.trials))
    load_after = os.getloadavg()

    table = {}
    for scenario, results in runs.items():
        cold = [r["cold_seconds"] for r in results]
        first = results[0]
        table[scenario] = {
            "cold_seconds_median": statistics.median(cold),
            "cold_seconds": [round(c, 3) for c in cold],
            "warm_seconds_median": statistics.median(r["warm_seconds"] for r in results),
            "process_seconds_median": statistics.median(r["process_seconds"] for r in results),
            "html_bytes": first["files_bytes"]["index.html"],
            **{k: first[k] for k in ("n_trials", "n_failed", "n_anytime_points", "n_pareto",
                                     "hypervolume", "files_bytes")},
        }
    header = ("scenario", "trials (+points)", "cold s (median)", "cold s (all)", "warm s",
              "process s", "index.html MB", "target < 10 s")
    rows = [(s, f"{t['n_trials']} (+{t['n_anytime_points']})", f"{t['cold_seconds_median']:.2f}",
             " ".join(f"{c:.1f}" for c in t["cold_seconds"]), f"{t['warm_seconds_median']:.2f}",
             f"{t['process_seconds_median']:.1f}", f"{t['html_bytes'] / 1e6:.2f}",
             "met" if t["cold_seconds_median"] < TARGET_SECONDS else "MISSED")
            for s, t in table.items()]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    print(f"report benchmark: {args.trials} synthetic trials, {args.repeats} fresh processes per "
          f"scenario (interleaved), load average {load_before[0]:.1f} -> {load_after[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    for r in [header] + rows:
        print("  " + "  ".join(str(v).ljust(w) for v, w in zip(r, widths)))

    plain = table["plain"]
    payload = {
        "summary": {
            "seconds_1000_trials": round(plain["cold_seconds_median"], 3),
            "html_bytes_1000_trials": int(plain["html_bytes"]),
        },
        "definition": "seconds_1000_trials = median over fresh Python processes of the first "
                      "write_report call (includes importing the plotting/numeric libraries) "
                      "on 1,000 synthetic trials, 2 objectives, 1 constraint ('plain'); records "
                      "generated beforehand and not timed",
        "n_trials_requested": args.trials,
        "repeats": args.repeats,
        "target_seconds": TARGET_SECONDS,
        "scenarios": table,
        "load_average_1min": {"before": round(load_before[0], 2), "after": round(load_after[0], 2)},
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpu_count": os.cpu_count()},
    }
    if args.trials != 1000:
        payload["summary"] = {f"seconds_{args.trials}_trials": payload["summary"]["seconds_1000_trials"],
                              f"html_bytes_{args.trials}_trials": int(plain["html_bytes"])}
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
