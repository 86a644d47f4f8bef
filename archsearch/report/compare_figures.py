"""The interactive (plotly.js) figures of the comparison page: every run's hypervolume
history, and the trials of all runs coloured by run (objective pairs, 3-D view). Same look
as a single run's figures (:mod:`archsearch.report.style`); each run's points keep their own
front and feasibility.

Every function takes ``labels`` (one unique name per run) and ``datas`` (one
:class:`~archsearch.report.data.ReportData` per run, rescored with the shared reference point)
and returns a :data:`~archsearch.report.style.Figure`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from markupsafe import Markup

from archsearch.report import style
from archsearch.report.data import ReportData
from archsearch.report.records import TrialRow
from archsearch.report.style import Figure
from archsearch.report.values import esc


def hypervolume_figure(labels: Sequence[str], datas: Sequence[ReportData]) -> Figure:
    """Every run's hypervolume after each trial, one line per run (shared reference point)."""
    traces = [{"type": "scatter", "x": list(range(1, d.n_trials + 1)),
               "y": style.nums(d.hv_history), "mode": "lines", "name": esc(label),
               "line": {"shape": "hv", "color": style.palette(k), "width": 2},
               "hovertemplate": esc(label) + ": after trial %{x}: %{y:.6g}<extra></extra>"}
              for k, (label, d) in enumerate(zip(labels, datas))]
    units = style.hypervolume_units(datas[0])
    layout = style.base_layout(
        esc(f"Hypervolume after each trial, in {units}, one reference point for all runs"), 420)
    style.hypervolume_axes(layout, "trial number")
    layout["legend"] = {"orientation": "v", "x": 1.01, "y": 1.0}
    layout["margin"]["r"] = 180
    return {"data": traces, "layout": layout}


def _run_hovers(label: str, data: ReportData, rows: list[TrialRow]) -> list[str]:
    head = Markup("<b>{}</b><br>").format(label)  # the label escaped (markupsafe)
    return [str(head + Markup(style.hover_text(data, r))) for r in rows]


def scatter_figure(labels: Sequence[str], datas: Sequence[ReportData]) -> Figure:
    """Objective pairs; one colour per run; each run's front larger and joined (2 objectives);
    infeasible points as crosses."""
    objs = datas[0].objectives
    m = len(objs)
    pair_list = style.pairs(m) if m >= 2 else [(0, None)]
    grid = style.panel_grid(len(pair_list))
    n_rows = math.ceil(len(pair_list) / 3)
    layout = style.base_layout("Trials of every run (large = on that run's front; cross = "
                               "violates a constraint; diamond = anytime-curve point)",
                               430 * n_rows + 140)
    traces = []
    for p, ((i, j), panel) in enumerate(zip(pair_list, grid)):
        for k, (label, d) in enumerate(zip(labels, datas)):
            color = style.palette(k)
            for part, rows, size, base in (
                ("trials", [r for r in d.rows if not r.failed and not r.pareto and r.feasible], 6,
                 "circle"),
                ("infeasible", [r for r in d.rows if not r.failed and not r.feasible], 6, "x"),
                ("front", [r for r in d.rows if r.pareto], 10, "circle"),
            ):
                if not rows:
                    continue
                rows, xs, ys, shape = style.panel_points(d, rows, i, j,
                                                         front_line=part == "front" and m == 2)
                mode = "markers+lines" if shape else "markers"
                line = {"color": color, "shape": shape, "width": 1.5} if shape else None
                marker = {"color": color, "size": size,
                          "symbol": [style.symbol_of(r, base) for r in rows],
                          "opacity": 1.0 if part == "front" else 0.55}
                if part == "front":
                    marker["line"] = {"color": "black", "width": 0.8}
                trace = {"type": "scatter", "x": style.nums(xs), "y": style.nums(ys),
                         "mode": mode, "name": esc(f"{label}: {part} ({len(rows)})"),
                         "marker": marker,
                         "hovertext": _run_hovers(label, d, rows),
                         "hovertemplate": "%{hovertext}<extra></extra>",
                         "xaxis": panel["xref"], "yaxis": panel["yref"],
                         "legendgroup": esc(f"{label}-{part}"), "showlegend": p == 0}
                if line:
                    trace["line"] = line
                traces.append(trace)
        style.pair_axes(layout, panel, objs, i, j,
                        lambda c: np.concatenate([d.Y[:, c] for d in datas]))
    layout["legend"] = {"orientation": "v", "x": 1.01, "y": 1.0}
    layout["margin"]["r"] = 220
    return {"data": traces, "layout": layout}


def scatter3d_figure(labels: Sequence[str], datas: Sequence[ReportData]) -> Figure:
    """The first three objectives in 3-D, one colour per run (large = on that run's front)."""
    cols = (1, 2, 0)
    traces = []
    for k, (label, d) in enumerate(zip(labels, datas)):
        rows = [r for r in d.rows if not r.failed]
        idx = [r.index for r in rows]
        traces.append({
            "type": "scatter3d", "mode": "markers", "name": esc(label),
            **{a: style.nums(d.Y[idx, c]) for a, c in zip("xyz", cols)},
            "marker": {"color": style.palette(k), "size": [7 if r.pareto else 3 for r in rows],
                       "opacity": 0.85},
            "hovertext": _run_hovers(label, d, rows),
            "hovertemplate": "%{hovertext}<extra></extra>"})
    scene = style.scene_axes(datas[0].objectives, cols,
                             lambda c: np.concatenate([d.Y[:, c] for d in datas]))
    layout = style.base_layout("First three objectives, coloured by run (large = on that run's "
                               "front)", 620)
    layout["scene"] = scene
    layout["legend"] = {"orientation": "v", "x": 1.0, "y": 0.9}
    return {"data": traces, "layout": layout}
