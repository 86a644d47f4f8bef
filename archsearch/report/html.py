"""The page of one run: ``index.html`` (template ``templates/run.html.j2`` on the shell of
:mod:`archsearch.report.page`): title, headline numbers, the figures, the Pareto table with a
repro command per row, the failed trials, the run's header table and the PNGs. The page loads
plotly.js from ``plotly.min.js`` beside it and opens offline.

This module only computes what the page shows, as raw values (text, numbers, lists); the
template writes the HTML. Escaping: every string that comes from a run (run name, searcher,
file names, trial ids, config keys and values, metric names, error text, the repro command)
is escaped by jinja2's autoescape; figures are escaped where they are built and serialised
safely by :func:`archsearch.report.page.script_json`.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from archsearch.metrics import is_number
from archsearch.report.data import ReportData
from archsearch.report.page import Page, png_data, render
from archsearch.report.style import Figure
from archsearch.report.values import (
    METRIC_UNITS,
    config_json,
    constraints_text,
    fmt,
    format_seconds,
    jsonable,
    to_float,
)

#: Default command that re-runs one trial with a fixed config. ``{space}`` and
#: ``{config_json}`` are replaced by shell-quoted values.
DEFAULT_REPRO_TEMPLATE = "archsearch search {space} --trials 1 --fixed {config_json}"

#: run_info keys shown first in the header, with their labels (other keys follow, sorted).
KNOWN_RUN_INFO = {
    "name": "Run",
    "searcher": "Searcher",
    "space_file": "Search space",
    "run_dir": "Run directory",
    "scheduler": "Scheduler",
    "wall_time_s": "Wall time",
    "wall_time": "Wall time",
    "latency_batch_size": "Latency measured at batch size",
    "started": "Started",
    "finished": "Finished",
}


# --------------------------------------------------------------------------------------------
# pieces of the single-run page
# --------------------------------------------------------------------------------------------


def repro_command(config: Mapping[str, Any], run_info: Mapping[str, Any]) -> str:
    """Shell command that re-runs one trial with exactly ``config`` (not HTML-escaped).

    ``run_info["repro_command"]`` may give a template; otherwise
    :data:`DEFAULT_REPRO_TEMPLATE` is used. ``{config_json}`` becomes the key-sorted JSON
    config and ``{space}`` becomes ``run_info["space_file"]`` (``SPACE.yaml`` if unknown),
    both already shell-quoted with :func:`shlex.quote` (do not quote them in the template).
    """
    template = str(run_info.get("repro_command") or DEFAULT_REPRO_TEMPLATE)
    space = str(run_info.get("space_file") or "SPACE.yaml")
    # str.replace, not str.format: JSON and user templates contain braces.
    return (template.replace("{space}", shlex.quote(space))
            .replace("{config_json}", shlex.quote(config_json(config))))



def export_command(trial_id: str, run_info: Mapping[str, Any]) -> str:
    """Shell command that exports trial ``trial_id`` as a model directory (``archsearch export``;
    not HTML-escaped): the run is ``run_info["run_dir"]`` (``runs/NAME`` if unknown); a
    sub-trial ``ID#k`` exports at its own operating point, to ``models/ID-k``."""
    from archsearch.runs import export_dirname

    run = str(run_info.get("run_dir") or "runs/NAME")
    return (f"archsearch export {shlex.quote(run)} --trial {shlex.quote(trial_id)} "
            f"--out {shlex.quote('models/' + export_dirname(trial_id))}")


def _run_info_rows(data: ReportData) -> list[dict[str, Any]]:
    """Rows of the header table: ``{"label", "lines" (text, one per line), "bold" (show the
    value in bold), "note" (grey text after it, may be empty)}``; raw text (escaped by the
    template)."""
    info = data.run_info
    rows: list[dict[str, Any]] = []

    def row(label: str, *lines: str, bold: bool = False, note: str = "") -> dict[str, Any]:
        return {"label": label, "lines": list(lines), "bold": bold, "note": note}

    for key, label in KNOWN_RUN_INFO.items():
        if key not in info or info[key] is None:
            continue
        if key == "wall_time" and "wall_time_s" in info:
            continue
        value = info[key]
        if key.startswith("wall_time"):
            seconds = to_float(value)
            text = format_seconds(seconds) if math.isfinite(seconds) else str(value)
        else:
            text = str(value)
        rows.append(row(label, text))
    stopped = f", {data.n_stopped} stopped early (the ASHA or AHTO scheduler, or the time budget)" if data.n_stopped else ""
    infeasible = data.n_successful - data.n_feasible
    subs = ""
    if data.subtrials:
        subs = (f"; {len(data.subtrials)} anytime-curve points of "
                f"{len(data.dynamic_trials())} dynamic trials (sub-trials ID#k)")
        if data.n_dropped_points:
            subs += (f", {data.n_dropped_points} point(s) without objective or constraint "
                     "values left out")
    rows.insert(min(2, len(rows)), row(
        "Trials",
        f"{data.n_trials} recorded: {data.n_successful} successful{stopped}, "
        f"{data.n_failed} failed, {infeasible} violate a constraint, "
        f"{data.n_pareto} on the Pareto front{subs}"))
    rows.append(row("Objectives", *(
        f"{o.metric} ({o.mode})"
        + (f" [{METRIC_UNITS[o.metric]}]" if o.metric in METRIC_UNITS else "")
        + (f", user reference {o.ref:.6g}" if o.ref is not None else "")
        for o in data.objectives)))
    if data.constraints:
        rows.append(row("Constraints", constraints_text(data.constraints)))
    ref = ", ".join("n/a" if r is None else f"{o.metric} = {r:.6g}"
                    for o, r in zip(data.objectives, data.reference_point))
    rows.append(row("Reference point", ref, note=_ref_rule_note(data)))
    units = " x ".join(f"[{METRIC_UNITS.get(o.metric, o.metric)}]" for o in data.objectives)
    rows.append(row("Hypervolume", f"{data.hypervolume:.6g}", bold=True,
                    note=f"{units}, feasible points only, raw units (not normalised)"))
    for key in sorted(set(info) - set(KNOWN_RUN_INFO) - {"repro_command"}):
        value = info[key]
        text = value if isinstance(value, str) else json.dumps(jsonable(value), sort_keys=True)
        rows.append(row(key, text))
    return rows


def _ref_rule_note(data: ReportData) -> str:
    auto = [o.metric for o in data.objectives if o.ref is None]
    if not auto:
        return "(user-given)"
    return f"({', '.join(auto)}: worst feasible value moved outward by 10% of the observed range)"


def _kpis(data: ReportData) -> list[tuple[str, str]]:
    """Headline numbers ``(value, label)``: trials, failed, front size, hypervolume, best
    values."""
    items = [(str(data.n_trials), "trials"), (str(data.n_failed), "failed"),
             (str(data.n_pareto), "on the Pareto front"),
             (f"{data.hypervolume:.4g}", "hypervolume")]
    for k, o in enumerate(data.objectives):
        vals = [data.Y[r.index, k] for r in data.rows if r.feasible]
        if vals:
            best = max(vals) if o.mode == "max" else min(vals)
            items.append((f"{best:.4g}", f"best feasible {o.metric}"))
    return items


def _subtitle(data: ReportData) -> str:
    """One line under the title: searcher, space, scheduler, wall time, objectives."""
    info = data.run_info
    bits = []
    for key, label in (("searcher", "searcher"), ("space_file", "space"),
                       ("scheduler", "scheduler")):
        if info.get(key) is not None:
            bits.append(f"{label} {info[key]}")
    wall = to_float(info.get("wall_time_s", info.get("wall_time")))
    if math.isfinite(wall):
        bits.append(f"wall time {format_seconds(wall)}")
    bits.append("objectives " + ", ".join(f"{o.metric} ({o.mode})" for o in data.objectives))
    if data.constraints:
        bits.append("constraints " + constraints_text(data.constraints))
    return " | ".join(bits)


def metric_cell(value: Any) -> dict[str, Any] | None:
    """A metric value as a table cell ``{"text", "num" (right-aligned number)}``."""
    f = to_float(value)
    if is_number(value):
        return {"text": fmt(value) if math.isfinite(f) else str(value), "num": True}
    return {"text": fmt(value), "num": False}


def _pareto_rows(data: ReportData) -> tuple[list[str], list[dict[str, Any]]]:
    """Header and rows of the Pareto table (raw values; the template escapes)."""
    rows = data.pareto_trials()
    metrics = [m for m in data.metric_names(scalar_only=True) if m != "epoch"]
    by_id = {t.trial_id: t for t in data.trials}
    head = ["#", "trial_id", "status", "epochs"] + metrics
    out = []
    for k, t in enumerate(rows, start=1):
        trial = by_id[t.parent] if t.is_subtrial else t
        tying = t.tying_map()
        settings = (json.dumps(jsonable(t.settings), sort_keys=True) if t.settings else None)
        out.append({
            "k": k, "trial_id": t.trial_id, "status": t.status, "stopped": t.stopped,
            "subtrial": t.is_subtrial, "point": t.point, "parent": t.parent,
            "epochs": len(trial.history),
            "cells": [metric_cell(t.metrics[m]) if m in t.metrics else None for m in metrics],
            "config": "\n".join(f"{key} = {fmt(v)}" for key, v in sorted(t.repro_config.items())),
            "settings": settings,
            "tying": None if tying is None else json.dumps(jsonable(tying)),
            "command": repro_command(t.repro_config, data.run_info),
            "export": export_command(t.trial_id, data.run_info),
        })
    return head, out


def _failed_rows(data: ReportData) -> list[dict[str, Any]]:
    """Rows of the failed-trials table: ``{"trial_id", "status", "epochs", "reason",
    "first" (the reason's first line when it has more, else ``None``), "config"}``."""
    out = []
    for t in data.failed_trials():
        reason = t.failure_reason or ""
        first, _, rest = reason.partition("\n")
        out.append({"trial_id": t.trial_id, "status": t.status, "epochs": len(t.history),
                    "reason": reason, "first": first if rest.strip() else None,
                    "config": config_json(t.config)})
    return out


def render_html(
    data: ReportData,
    *,
    figures: Sequence[tuple[str, str, Figure, str]],
    pngs: Sequence[tuple[str, bytes]] = (),
) -> str:
    """The complete page of one run as a string (template ``run.html.j2``); it loads
    plotly.js from ``plotly.min.js`` beside it (:func:`archsearch.report.page.write_plotly_js`).

    Args:
        data: the computed report.
        figures: ``(section title, div id, plotly spec, note)``, in page order; the title and
            the note (how to read the figure; may be empty) are raw text, escaped by the
            template.
        pngs: ``(caption, PNG bytes)`` embedded at the end as ``data:`` images.
    """
    name = data.run_info.get("name") or "archsearch run"
    page = Page()
    for title, div_id, fig, note in figures:
        page.figure(fig, div_id, title, note)
    head, pareto_rows = _pareto_rows(data)
    return render(
        "run.html.j2", **page.context(), title=f"archsearch report: {name}", name=name,
        subtitle=_subtitle(data), kpis=_kpis(data), n_trials=data.n_trials,
        no_success=data.n_successful == 0,
        no_feasible=not any(r.feasible for r in data.rows),
        n_pareto=data.n_pareto, pareto_head=head, pareto_rows=pareto_rows,
        n_failed=data.n_failed, failed_rows=_failed_rows(data),
        run_info_rows=_run_info_rows(data),
        pngs=[png_data(png, caption) for caption, png in pngs])
