"""Benchmark: how big a run's report page is, and how long a 10,000-trial report takes.

Claims checked (targets of issue 18):

* ``html_bytes_1000_trials``: ``index.html`` of a 1,000-trial run is at most 1,500,000 bytes.
  plotly.js (~4.8 MB) is not in it: it is ``plotly.min.js``, written once per report directory
  beside the page (``archsearch.report.page.write_plotly_js``) and counted separately.
* ``seconds_10000_trials``: a 10,000-trial report is written in at most 15 s on this machine.

Records come from :func:`archsearch.report.synthetic.synthetic_trials` (deterministic, seed 0,
shaped like the runner's: 5-epoch histories, ~25% ASHA-stopped, ~4% ERROR, ~2% NaN). Scenarios:

* ``plain``: 2 objectives (accuracy max, FLOPs min), 1 constraint (latency_ms <= 0.5): the
  default space's shape. The headline numbers are this scenario's.
* ``dynamic``: the same plus anytime curves (8 points) on the ~25% length-drop trials and
  tying maps: ~2 extra sub-trials per trial, every one eligible for the front and drawn.
* ``dynamic-3obj``: ``dynamic`` with latency_ms as a third objective (three 2-D projections,
  a 3-D view, a 3-D hypervolume history).

What is timed: the first :func:`archsearch.report.write_report` call in a fresh Python
process, into an empty directory, so it includes importing numpy/plotly/matplotlib/jinja2,
computing the front and hypervolume history, building the figures, rendering both PNGs,
rendering the page and writing every file (``plotly.min.js`` included): what a user waits for
after a search. Generating the records happens before the clock starts and is not timed; the
interpreter start-up is not timed either (``process_seconds`` shows it). Each measurement is
repeated in ``--repeats`` fresh processes (interleaved) and the median is reported, because
this machine is shared; the load average is recorded next to the numbers.

    python -m benchmarks.product.report run [--repeats 3] [--scenarios-10000 plain]
    python -m benchmarks.product.report analyze|check   # restate the stored result (no measuring)

Prints a table and writes ``benchmarks/product/results/report.json`` (``summary``, ``targets``,
``provenance``: :mod:`benchmarks.evidence`). The timings are this machine's: ``analyze`` and
``check`` pass the stored numbers through the same builder (:func:`build`) as ``run``
(:mod:`benchmarks.product.stored`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.evidence.cli import Command
from benchmarks.evidence.provenance import ROOT, provenance
from benchmarks.evidence.results import build_result, write_json
from benchmarks.product.stored import restate

RESULTS = Path(__file__).resolve().parent / "results" / "report.json"
OBJECTIVES = [{"metric": "accuracy", "mode": "max"}, {"metric": "flops_per_sample", "mode": "min"}]
CONSTRAINTS = {"latency_ms": {"max": 0.5}}
SCENARIOS = {
    "plain": {"dynamic": False, "objectives": OBJECTIVES},
    "dynamic": {"dynamic": True, "objectives": OBJECTIVES},
    "dynamic-3obj": {"dynamic": True,
                     "objectives": OBJECTIVES + [{"metric": "latency_ms", "mode": "min"}]},
}
TARGET_HTML_BYTES_1000 = 1_500_000
TARGET_SECONDS_10000 = 15.0
#: Issue 18's targets.
TARGETS = {"html_bytes_1000_trials": f"<= {TARGET_HTML_BYTES_1000}",
           "seconds_10000_trials": f"<= {TARGET_SECONDS_10000:g}"}
SEED = 0
#: What ``summary``'s keys mean (stored beside it).
DEFINITION = {
    "html_bytes_1000_trials": "size in bytes of index.html written by write_report for "
                              "1,000 synthetic trials (seed 0), scenario 'plain' (2 "
                              "objectives, 1 constraint); plotly.js is the separate file "
                              "plotly.min.js beside it (files_bytes) and not counted",
    "seconds_10000_trials": "median over fresh Python processes of the wall time of the "
                            "first write_report call on 10,000 synthetic trials (seed 0), "
                            "scenario 'plain', into an empty directory: imports of "
                            "numpy/plotly/matplotlib/jinja2, front and hypervolume history, "
                            "figures, both PNGs, the page and writing every file "
                            "(plotly.min.js included); generating the records and the "
                            "interpreter start-up are not timed",
}


def run_once(scenario: str, n_trials: int, out_dir: Path) -> dict:
    """In *this* (fresh) process: generate the records, then time one ``write_report``."""
    from archsearch.report import write_report
    from archsearch.report.synthetic import synthetic_trials

    spec = SCENARIOS[scenario]
    trials = synthetic_trials(n_trials, seed=SEED, epochs=5, dynamic=spec["dynamic"])
    run_info = {"name": f"benchmark-{scenario}-{n_trials}", "searcher": "synthetic",
                "space_file": "search_spaces/default.yaml", "wall_time_s": 3600.0,
                "latency_batch_size": 32}
    t = time.perf_counter()
    summary = write_report(trials, spec["objectives"], out_dir, constraints=CONSTRAINTS,
                           run_info=run_info)
    seconds = time.perf_counter() - t
    n_points = sum(len(t["metrics"].get("anytime_curve") or []) for t in trials)
    return {
        "seconds": seconds, "n_trials": summary["n_trials"], "n_failed": summary["n_failed"],
        "n_anytime_points": n_points, "n_pareto": len(summary["pareto"]),
        "hypervolume": summary["hypervolume"],
        "files_bytes": {p.name: p.stat().st_size for p in sorted(out_dir.iterdir()) if p.is_file()},
    }


def child(scenario: str, n_trials: int) -> dict:
    """One measurement in a fresh interpreter, into an empty temporary directory."""
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.product.report", "_child", scenario, str(n_trials),
             str(Path(tmp) / "report")],
            cwd=ROOT, capture_output=True, text=True, env={**os.environ, "MPLBACKEND": "Agg"})
        wall = time.perf_counter() - t
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"benchmark child failed with exit code {proc.returncode}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_seconds"] = wall
    return res


def build(summary: dict[str, Any], prov: dict[str, Any], *, record_reads: bool = True,
          **rest: Any) -> dict[str, Any]:
    """The result in the one schema: the targets evaluated on ``summary``; ``rest``: the
    definitions, the cases, the load average. Reads no test split (synthetic records)."""
    return build_result(summary, prov, name="report.json", targets=TARGETS, record_reads=record_reads, **rest)


def run(args: argparse.Namespace) -> int:
    """Measure every case in fresh processes, print the table, write the result."""
    if "plain" not in args.scenarios_10000:
        raise ValueError("--scenarios-10000 must include 'plain' (the headline)")

    started = time.perf_counter()
    load_before = os.getloadavg()
    plan = [(s, 1000) for s in SCENARIOS] + [(s, 10000) for s in args.scenarios_10000]
    runs: dict[tuple[str, int], list[dict]] = {p: [] for p in plan}
    for _ in range(args.repeats):  # interleaved: each round measures every case once
        for scenario, n in plan:
            runs[(scenario, n)].append(child(scenario, n))
    load_after = os.getloadavg()

    table = {}
    for (scenario, n), results in runs.items():
        first = results[0]
        table[f"{scenario}/{n}"] = {
            "scenario": scenario,
            "seconds_median": round(statistics.median(r["seconds"] for r in results), 3),
            "seconds": [round(r["seconds"], 3) for r in results],
            "process_seconds_median": round(statistics.median(r["process_seconds"] for r in results), 3),
            "html_bytes": first["files_bytes"]["index.html"],
            **{k: first[k] for k in ("n_trials", "n_failed", "n_anytime_points", "n_pareto",
                                     "hypervolume", "files_bytes")},
        }
    html_1000 = table["plain/1000"]["html_bytes"]
    seconds_10000 = table["plain/10000"]["seconds_median"]

    header = ("case", "trials (+points)", "s (median)", "s (all)", "process s", "index.html MB",
              "plotly.min.js MB")
    rows = [(case, f"{t['n_trials']} (+{t['n_anytime_points']})", f"{t['seconds_median']:.2f}",
             " ".join(f"{c:.1f}" for c in t["seconds"]), f"{t['process_seconds_median']:.1f}",
             f"{t['html_bytes'] / 1e6:.2f}", f"{t['files_bytes']['plotly.min.js'] / 1e6:.2f}")
            for case, t in table.items()]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    print(f"report benchmark: {args.repeats} fresh processes per case (interleaved), load "
          f"average {load_before[0]:.1f} -> {load_after[0]:.1f} on {os.cpu_count()} CPUs")
    for r in [header] + rows:
        print("  " + "  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    met_bytes = html_1000 <= TARGET_HTML_BYTES_1000
    met_seconds = seconds_10000 <= TARGET_SECONDS_10000
    print(f"html_bytes_1000_trials = {html_1000:,} (target <= {TARGET_HTML_BYTES_1000:,}: "
          f"{'met' if met_bytes else 'MISSED'}); seconds_10000_trials = {seconds_10000:.2f} "
          f"(target <= {TARGET_SECONDS_10000:g}: {'met' if met_seconds else 'MISSED'})")

    summary = {"html_bytes_1000_trials": int(html_1000),
               "seconds_10000_trials": seconds_10000}
    result = build(summary, provenance(seeds=SEED, wall_s=time.perf_counter() - started,
                                       protocol=f"{args.repeats} fresh processes per case, interleaved; median"),
                   definition=DEFINITION, cases=table,
                   load_average_1min={"before": round(load_before[0], 2), "after": round(load_after[0], 2)})
    write_json(RESULTS, result)
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


def _stored_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """An older summary without its ``targets_met`` flag (the evaluated targets replace it)."""
    return {k: v for k, v in summary.items() if k != "targets_met"}


def results(args: argparse.Namespace) -> dict[Path, dict[str, Any]]:
    """The stored result restated through :func:`build` (nothing measured)."""
    return {RESULTS: restate(RESULTS, build, record_reads=not args.check, summary=_stored_summary)}


def _arguments(p: argparse.ArgumentParser) -> None:
    if p.prog.split()[-1] == "run":
        p.add_argument("--repeats", type=int, default=3, help="fresh processes per measurement")
        p.add_argument("--scenarios-10000", nargs="+", default=["plain"], choices=sorted(SCENARIOS),
                       help="scenarios also measured at 10,000 trials (the headline is 'plain')")


COMMAND = Command(__doc__.splitlines()[0], run=run, results=results, add_arguments=_arguments)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) == 4 and argv[0] == "_child":  # fresh interpreter: one JSON line for the parent
        out = Path(argv[3])
        out.mkdir(parents=True, exist_ok=True)
        print(json.dumps(run_once(argv[1], int(argv[2]), out)))
        return 0
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
