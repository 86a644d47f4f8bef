"""Pareto-front report of a run: ``index.html``, ``pareto.png``, ``hypervolume.png``,
``trials.csv``, ``pareto.json``; and a comparison of several runs.

Entry points: :func:`write_report` (one run) and :func:`write_comparison` (several runs on
the same objectives; ``archsearch compare``). Submodules:

* :mod:`archsearch.report.pareto`: non-dominated mask, reference point, hypervolume;
* :mod:`archsearch.report.records`: validation of the runner's records, failed/feasible/Pareto,
  anytime-curve sub-trials;
* :mod:`archsearch.report.plots`: matplotlib PNGs and plotly figure specs;
* :mod:`archsearch.report.html`: the self-contained page;
* :mod:`archsearch.report.compare`: loading run directories, the comparison report;
* :mod:`archsearch.report.synthetic`: synthetic records shaped like the runner's (benchmark).

Importing this package is cheap: numpy, plotly and matplotlib are imported when a report is
written; torch and BoTorch only for hypervolumes of three or more objectives.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["write_report", "write_comparison"]


def write_comparison(runs, out_dir, **kwargs):
    """See :func:`archsearch.report.compare.write_comparison`."""
    from archsearch.report.compare import write_comparison as _write

    return _write(runs, out_dir, **kwargs)


def write_report(
    trials: Sequence[Mapping[str, Any]],
    objectives: Sequence[Mapping[str, Any]],
    out_dir: Path | str,
    *,
    constraints: Mapping[str, Mapping[str, float]] | None = None,
    run_info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the report of one run into ``out_dir`` and return the ``pareto.json`` content.

    Args:
        trials: the runner's records, in the order the trials ran, each
            ``{"trial_id": str, "status": "TERMINATED" | "ERROR" | "STOPPED",
            "config": {name: value}, "metrics": {metric: float} (last reported),
            "history": [{metric: float, "epoch": int, ...}, ...], "error": str | None}``.
            ``STOPPED`` = early-stopped by ASHA: a valid point with fewer epochs; ``RUNNING``
            = unfinished, counted as failed. ``metrics`` may hold ``anytime_curve`` (a
            dynamic trial's operating points, which become sub-trials ``ID#k`` that can be
            on the front: :mod:`archsearch.report.records`) and ``tying_map`` (shown with
            the config).
        objectives: ``[{"metric": "accuracy", "mode": "max"},
            {"metric": "flops_per_sample", "mode": "min", "ref": 2e9}, ...]``; ``ref`` is an
            optional reference value in the metric's unit (DESIGN.md metric table).
        out_dir: directory to write into (created if missing; files are replaced).
        constraints: ``{metric: {"max": v}}`` / ``{"min": v}`` (both allowed), inclusive.
            Trials outside them are infeasible: drawn, but not on the front.
        run_info: shown in the page header. Known keys: ``name``, ``searcher``,
            ``space_file`` (used in the repro command), ``scheduler``, ``wall_time_s``
            (seconds; ``wall_time`` accepted), ``latency_batch_size``, ``started``,
            ``finished``, and ``repro_command`` (template with ``{config_json}`` and
            ``{space}``, which are substituted shell-quoted). Other keys are listed as-is.

    Returns:
        Exactly ``{"objectives": [{"metric", "mode"}, ...], "reference_point": [float, ...],
        "hypervolume": float, "pareto": [{"trial_id", "config", "metrics"}, ...],
        "n_trials": int, "n_failed": int}``. ``pareto`` may list sub-trials ``"ID#k"``
        (config = the trial's config plus the point's settings). ``reference_point`` entries
        are ``None`` only
        when no feasible trial exists and no user ``ref`` was given; then ``hypervolume`` is
        ``0.0``. Non-finite metric values appear as ``null``. ``n_trials`` counts every
        record; ``n_failed`` counts ERROR trials and trials whose objective/constraint
        metrics are missing or NaN/inf.

    Files written in ``out_dir``: ``index.html`` (self-contained, offline: plotly.js inlined),
    ``pareto.png`` and ``hypervolume.png`` (matplotlib), ``trials.csv`` (one row per trial
    and sub-trial: ``trial_id, status, config/<name>..., <metrics>..., feasible, pareto``),
    ``pareto.json``.

    Raises:
        ValueError: input that breaks the contract above (unknown status, bad mode,
            duplicate trial_id, malformed constraint, ...), naming the offending item.
    """
    from archsearch.report.records import build_report_data

    data = build_report_data(trials, objectives, constraints, run_info)
    return write_report_data(data, out_dir)


def summary_of(data) -> dict[str, Any]:
    """The ``pareto.json`` content of a :class:`~archsearch.report.records.ReportData`."""
    from archsearch.report.records import jsonable

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


def write_report_data(data, out_dir: Path | str) -> dict[str, Any]:
    """Write the report files of a computed ``ReportData`` (see :func:`write_report`)."""
    from archsearch.report import html as report_html
    from archsearch.report import plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summary_of(data)
    _write_atomic(out / "pareto.json",
                  json.dumps(summary, indent=2, allow_nan=False).encode("utf-8") + b"\n")
    _write_trials_csv(data, out / "trials.csv")

    png_path = out / "pareto.png"
    tmp_png = png_path.with_name(png_path.name + ".tmp")
    plots.write_pareto_png(data, tmp_png)
    os.replace(tmp_png, png_path)
    hv_path = out / "hypervolume.png"
    tmp_png = hv_path.with_name(hv_path.name + ".tmp")
    plots.write_hypervolume_png([(str(data.run_info.get("name") or "run"), data.hv_history)],
                                plots.hypervolume_units(data), tmp_png,
                                title=f"Hypervolume vs trial number "
                                      f"(final {data.hypervolume:.6g})")
    os.replace(tmp_png, hv_path)

    figures = []
    if data.n_successful:
        figures.append(("Pareto front", "fig-pareto", plots.scatter_figure(data),
                        plots.scatter_note(data)))
        three_d = plots.scatter3d_figure(data)
        if three_d is not None:
            figures.append(("Three objectives (3-D)", "fig-3d", three_d,
                            "Same points and colours as above; drag to rotate, scroll to zoom."))
        figures.append(("Hypervolume vs trials", "fig-hypervolume", plots.hypervolume_figure(data),
                        "Hypervolume of the feasible points after each trial (with its anytime-"
                        "curve points), with the final reference point: it never decreases; "
                        "flat stretches are trials that did not improve the front."))
        curves = plots.learning_curves_figure(data)
        if curves is not None:
            figures.append(("Learning curves", "fig-curves", curves,
                            "Validation metrics per epoch of every trial; trials on the front "
                            "are coloured and named, the others grey."))
    page = report_html.render_html(
        data, figures=figures,
        pngs=[("pareto.png: trials and Pareto front", png_path.read_bytes()),
              ("hypervolume.png: hypervolume after each trial", hv_path.read_bytes())])
    _write_atomic(out / "index.html", page.encode("utf-8"))
    return summary


def _write_atomic(path: Path, payload: bytes) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(payload)
    os.replace(tmp, path)


def _csv_value(value: Any) -> Any:
    """Scalars as-is (floats in full precision, NaN as ``nan``), containers as JSON."""
    from archsearch.report.records import jsonable

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


def _write_trials_csv(data, path: Path) -> None:
    config_names = data.config_names()
    metric_names = data.metric_names()
    header = (["trial_id", "status"] + [f"config/{k}" for k in config_names] + metric_names
              + ["feasible", "pareto"])
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for t in data.rows:
            writer.writerow(
                [t.trial_id, t.status]
                + [_csv_value(t.config[k]) if k in t.config else "" for k in config_names]
                + [_csv_value(t.metrics[m]) if m in t.metrics else "" for m in metric_names]
                + [t.feasible, t.pareto]
            )
    os.replace(tmp, path)
