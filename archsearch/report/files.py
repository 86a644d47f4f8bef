"""The files of one run's report: ``pareto.json``, ``trials.csv``, ``pareto.png``,
``hypervolume.png``, ``index.html`` and ``plotly.min.js`` (the plotly.js bundle the page
loads; written once per directory), from a computed :class:`~archsearch.report.data.ReportData`.

Every file is written with :func:`archsearch.runs.atomic_write` (temp file, then
``os.replace``), so a reader never sees half a file.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from archsearch.report import figures, pngs, style
from archsearch.report.data import ReportData
from archsearch.report.html import render_html
from archsearch.report.page import write_plotly_js
from archsearch.report.values import jsonable
from archsearch.runs import atomic_write


def summary_of(data: ReportData) -> dict[str, Any]:
    """The ``pareto.json`` content of a report (its exact shape:
    :func:`archsearch.report.write_report`)."""
    return {
        "objectives": [{"metric": o.metric, "mode": o.mode} for o in data.objectives],
        "reference_point": [None if r is None else float(r) for r in data.reference_point],
        "hypervolume": float(data.hypervolume),
        "pareto": [
            {"trial_id": t.trial_id, "config": jsonable(t.config), "metrics": jsonable(t.metrics)}
            for t in data.pareto_trials()
        ],
        "n_trials": data.n_trials,
        "n_failed": data.n_failed,
    }


def write_report_data(data: ReportData, out_dir: Path | str) -> dict[str, Any]:
    """Write the report files of a computed ``ReportData`` into ``out_dir`` (created if
    missing; files replaced) and return the ``pareto.json`` content
    (see :func:`archsearch.report.write_report`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summary_of(data)
    atomic_write(out / "pareto.json", json.dumps(summary, indent=2, allow_nan=False) + "\n")
    atomic_write(out / "trials.csv", trials_csv(data))

    pareto_png = pngs.pareto_png(data)
    atomic_write(out / "pareto.png", pareto_png)
    hv_png = pngs.hypervolume_png([(str(data.run_info.get("name") or "run"), data.hv_history)],
                                  style.hypervolume_units(data),
                                  title=f"Hypervolume vs trial number "
                                        f"(final {data.hypervolume:.6g})")
    atomic_write(out / "hypervolume.png", hv_png)

    page = render_html(
        data, figures=figures.run_figures(data),
        pngs=[("pareto.png: trials and Pareto front", pareto_png),
              ("hypervolume.png: hypervolume after each trial", hv_png)])
    write_plotly_js(out)  # before the page that loads it
    atomic_write(out / "index.html", page)
    return summary


def _csv_value(value: Any) -> Any:
    """Scalars as-is (floats in full precision, NaN as ``nan``), containers as JSON."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(float(value)) if math.isfinite(value) else str(float(value))
    if isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(jsonable(value), sort_keys=True)
    converted = jsonable(value)  # numpy scalars
    return "nan" if converted is None else converted


def trials_csv(data: ReportData) -> str:
    """``trials.csv``: one row per trial and sub-trial,
    ``trial_id, status, config/<name>..., <metrics>..., feasible, pareto``."""
    config_names = data.config_names()
    metric_names = data.metric_names()
    header = (["trial_id", "status"] + [f"config/{k}" for k in config_names] + metric_names
              + ["feasible", "pareto"])
    buf = io.StringIO(newline="")
    writer = csv.writer(buf)
    writer.writerow(header)
    for t in data.rows:
        writer.writerow(
            [t.trial_id, t.status]
            + [_csv_value(t.config[k]) if k in t.config else "" for k in config_names]
            + [_csv_value(t.metrics[m]) if m in t.metrics else "" for m in metric_names]
            + [t.feasible, t.pareto]
        )
    return buf.getvalue()
