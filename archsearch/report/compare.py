"""One report comparing several runs on the same objectives (``archsearch compare``).

Typical use: searchers (random vs TPE vs AHTO) or gating strategies on one search space. The
page shows every run's hypervolume against trials on one plot, a combined scatter coloured by
run, and a summary table (trials, failed, final hypervolume, best feasible value per
objective, wall time, points each run puts on the combined front).

Fairness rules:

* one reference point for all runs, computed with the usual rule
  (:func:`archsearch.pareto.reference_point`) over the **union** of the runs' feasible
  points (including anytime-curve sub-trials); a user ``ref`` is kept when every run gives
  the same one, otherwise that objective falls back to the automatic rule;
* each run's trials are classified with its own constraints (a difference is shown);
* runs must have the same objectives (metric and mode; order may differ): otherwise
  :class:`~archsearch.errors.UserError` naming the run directory.

Files written (atomically, :func:`archsearch.runs.atomic_write`): ``index.html`` (template
``templates/compare.html.j2``; opens offline), ``plotly.min.js`` (the plotly.js bundle the page
loads, written only if absent or different: :func:`archsearch.report.page.write_plotly_js`),
``compare.png`` (matplotlib: hypervolume curves and the first
objective pair), ``compare.json`` (the summary returned by :func:`write_comparison`). The
comparison's figures are :mod:`archsearch.report.compare_figures`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from archsearch import pareto
from archsearch.errors import UserError
from archsearch.report import compare_figures, pngs
from archsearch.report.data import ReportData, build_report_data
from archsearch.report.inputs import RunInput, load_run
from archsearch.report.page import Page, png_data, render, write_plotly_js
from archsearch.report.style import palette
from archsearch.report.values import constraints_text, format_seconds, jsonable, to_float
from archsearch.runs import atomic_write

def _shared_objectives(runs: Sequence[RunInput]) -> tuple[list[dict[str, Any]], list[str]]:
    """The first run's objectives (metric, mode) with refs every run agrees on; notes.

    Raises:
        UserError: a run whose objectives differ from the first run's, naming its directory.
    """
    first = [(str(o["metric"]), str(o["mode"])) for o in runs[0].objectives]
    refs: dict[str, set] = {m: set() for m, _ in first}
    for run in runs:
        objs = [(str(o["metric"]), str(o["mode"])) for o in run.objectives]
        if sorted(objs) != sorted(first):
            raise UserError(
                "objectives " + ", ".join(f"{m} ({d})" for m, d in objs) + " differ from "
                + ", ".join(f"{m} ({d})" for m, d in first) + f" of {runs[0].run_dir}: "
                "only runs on the same objectives can be compared", file=run.run_dir)
        for o in run.objectives:
            refs[str(o["metric"])].add(None if o.get("ref") is None else float(o["ref"]))
    shared, notes = [], []
    for metric, mode in first:
        entry: dict[str, Any] = {"metric": metric, "mode": mode}
        if len(refs[metric]) == 1 and None not in refs[metric]:
            entry["ref"] = next(iter(refs[metric]))
        elif len(refs[metric]) > 1:
            notes.append(f"the runs give different reference values for {metric}; the "
                         "automatic rule over all runs is used instead")
        shared.append(entry)
    return shared, notes


def _labels(runs: Sequence[RunInput]) -> list[str]:
    """Run names (``run_info["name"]`` or the directory name), made unique."""
    labels: list[str] = []
    for run in runs:
        base = str(run.run_info.get("name") or Path(run.run_dir).name)
        label, k = base, 2
        while label in labels:
            label, k = f"{base} ({k})", k + 1
        labels.append(label)
    return labels


def _best(data: ReportData, k: int) -> float | None:
    vals = [float(data.Y[r.index, k]) for r in data.rows if r.feasible]
    if not vals:
        return None
    return max(vals) if data.objectives[k].mode == "max" else min(vals)


def write_comparison(runs: Sequence[RunInput], out_dir: str | Path, *,
                     title: str | None = None) -> dict[str, Any]:
    """Write the comparison report of ``runs`` into ``out_dir``; return its summary.

    Args:
        runs: two or more runs (e.g. from :func:`load_run`).
        out_dir: directory to write into (created; files replaced).
        title: page title (default ``"A vs B vs ..."``).

    Returns:
        ``{"objectives": [{"metric", "mode"}], "reference_point": [float | None],
        "runs": [{"name", "run_dir", "n_trials", "n_failed", "n_pareto", "hypervolume",
        "best": {metric: float | None}, "on_combined_front": int, "wall_time_s"}]}``
        (also written as ``compare.json``). Hypervolumes use the shared reference point.

    Raises:
        UserError: fewer than two runs, or objectives that differ (naming the run directory).
        ValueError: a run's records break the report contract.
    """
    if len(runs) < 2:
        raise UserError(f"compare needs at least two runs, got {len(runs)}", field="RUN_DIRS")
    objectives, notes = _shared_objectives(runs)
    labels = _labels(runs)
    datas = []
    for run in runs:
        try:
            datas.append(build_report_data(run.trials, objectives, run.constraints, run.run_info))
        except ValueError as e:
            raise UserError(f"bad trial records: {e}", file=run.run_dir) from None
    modes = [o["mode"] for o in objectives]
    union = np.vstack([d.Y[[r.index for r in d.rows if r.feasible]] for d in datas])
    ref = pareto.reference_point(union, modes, [o.get("ref") for o in objectives])
    for d in datas:
        d.rescore(ref)
    on_front = pareto.non_dominated_mask(union, modes) if union.shape[0] else np.zeros(0, bool)
    counts, start = [], 0
    for d in datas:
        n = sum(r.feasible for r in d.rows)
        counts.append(int(on_front[start:start + n].sum()))
        start += n

    summary = {
        "objectives": [{"metric": o["metric"], "mode": o["mode"]} for o in objectives],
        "reference_point": [None if r is None else float(r) for r in ref],
        "runs": [{
            "name": label, "run_dir": run.run_dir, "n_trials": d.n_trials,
            "n_failed": d.n_failed, "n_pareto": d.n_pareto, "hypervolume": float(d.hypervolume),
            "best": {o.metric: _best(d, k) for k, o in enumerate(d.objectives)},
            "on_combined_front": count,
            "wall_time_s": jsonable(run.run_info.get("wall_time_s")),
        } for label, run, d, count in zip(labels, runs, datas, counts)],
    }
    if len({json.dumps(r.constraints, sort_keys=True) for r in runs}) > 1:
        notes.append("the runs have different constraints; each run's trials are classified "
                     "with its own")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png = pngs.compare_png(labels, datas)
    atomic_write(out / "compare.png", png)
    title = title or " vs ".join(labels)
    page = Page()
    page.figure(compare_figures.hypervolume_figure(labels, datas), "fig-hypervolume",
                "Hypervolume vs trials (shared reference point)")
    page.figure(compare_figures.scatter_figure(labels, datas), "fig-scatter",
                "All runs' trials, coloured by run")
    if len(objectives) >= 3:
        page.figure(compare_figures.scatter3d_figure(labels, datas), "fig-3d",
                    "Three objectives (3-D)")
    subtitle = ("objectives " + ", ".join(f"{o['metric']} ({o['mode']})" for o in objectives)
                + " | shared reference point " + ", ".join(
                    "n/a" if r is None else f"{o['metric']} = {r:.6g}"
                    for o, r in zip(objectives, ref)))
    head, rows = _summary_rows(labels, runs, datas, counts)
    html = render("compare.html.j2", **page.context(), title=f"archsearch comparison: {title}",
                  heading=title, subtitle=subtitle, summary_head=head, summary_rows=rows,
                  notes=notes, png=png_data(png, "hypervolume curves and trials by run"))
    write_plotly_js(out)  # before the page that loads it
    atomic_write(out / "index.html", html)
    atomic_write(out / "compare.json", json.dumps(summary, indent=2, allow_nan=False) + "\n")
    return summary


def compare_runs(run_dirs: Sequence[str | Path], *, out: str | Path | None = None,
                 reports: str | Path = "reports") -> tuple[Path, dict[str, Any]]:
    """Load run directories and write their comparison (``archsearch compare``).

    ``out`` defaults to ``reports/compare-NAME1-vs-NAME2...``.

    Returns:
        (report directory, summary of :func:`write_comparison`).

    Raises:
        UserError: fewer than two runs, a directory that is not a run, differing objectives,
            or the comparison cannot be written to ``out``.
    """
    if len(run_dirs) < 2:
        raise UserError(f"compare needs at least two run directories, got {len(run_dirs)}",
                        field="RUN_DIRS")
    runs = [load_run(d) for d in run_dirs]
    given = out is not None
    if out is None:
        names = "-vs-".join(Path(r.run_dir).name for r in runs)
        out = Path(reports) / f"compare-{names}"[:120]
    try:
        summary = write_comparison(runs, out)
    except OSError as e:
        raise UserError(f"cannot write the comparison ({e.strerror or e.__class__.__name__})",
                        file=str(out), field="--out" if given else "--reports") from None
    return Path(out), summary


# --------------------------------------------------------------------------------------------
# page pieces
# --------------------------------------------------------------------------------------------


def _summary_rows(labels, runs, datas, counts) -> tuple[list[str], list[dict[str, Any]]]:
    """Header and rows of the summary table: ``{"label", "colour", "searcher", "cells"
    ([{"text", "bold"}] right-aligned numbers), "wall", "constraints", "run_dir"}``; raw
    text (the template escapes)."""
    objs = datas[0].objectives
    head = (["run", "searcher", "trials", "failed", "Pareto points", "on the combined front",
             "final hypervolume"] + [f"best {o.metric} ({o.mode})" for o in objs]
            + ["wall time", "constraints", "run directory"])
    best_hv = max(d.hypervolume for d in datas)
    rows = []
    for k, (label, run, d, count) in enumerate(zip(labels, runs, datas, counts)):
        wall = to_float(run.run_info.get("wall_time_s"))
        cells = [{"text": str(v), "bold": False} for v in (d.n_trials, d.n_failed, d.n_pareto, count)]
        cells.append({"text": f"{d.hypervolume:.6g}",
                      "bold": d.hypervolume == best_hv and best_hv > 0})
        for j in range(len(objs)):
            b = _best(d, j)
            cells.append({"text": "n/a" if b is None else f"{b:.6g}", "bold": False})
        cells.append({"text": format_seconds(wall) if math.isfinite(wall) else "", "bold": False})
        rows.append({"label": label, "colour": palette(k),
                     "searcher": str(run.run_info.get("searcher") or ""), "cells": cells,
                     "constraints": constraints_text(d.constraints) or "none",
                     "run_dir": str(run.run_dir)})
    return head, rows
