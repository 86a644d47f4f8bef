"""The interactive (plotly.js) figures of one run's page: Pareto scatter, 3-D view,
hypervolume history, learning curves. Plain spec dicts (:data:`~archsearch.report.style.Figure`);
the look, the marker legend and the escaping rule are :mod:`archsearch.report.style`'s.
:mod:`archsearch.report.page` serialises them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from archsearch.report.data import ReportData
from archsearch.report.records import TrialRow
from archsearch.report.style import (
    ANYTIME,
    FRONT,
    GREY,
    MAX_NAMED_CURVES,
    MAX_NAMED_LEARNING_CURVES,
    STATIC_FRONT,
    STATIC_FRONT_NAME,
    Figure,
    anytime_curves,
    axis_key,
    base_layout,
    esc,
    hover_text,
    hypervolume_axes,
    hypervolume_units,
    nums,
    pair_axes,
    pairs,
    palette,
    panel_grid,
    panel_points,
    point_groups,
    scene_axes,
    static_front,
    symbol_of,
)
from archsearch.report.values import metric_label, to_float


def run_figures(data: ReportData) -> list[tuple[str, str, Figure, str]]:
    """The figures of one run's page, in page order, as
    :func:`archsearch.report.html.render_html` takes them: ``(section title, div id, spec,
    note)``. None when no trial succeeded."""
    figures = []
    if data.n_successful:
        figures.append(("Pareto front", "fig-pareto", scatter_figure(data), scatter_note(data)))
        three_d = scatter3d_figure(data)
        if three_d is not None:
            figures.append(("Three objectives (3-D)", "fig-3d", three_d,
                            "Same points and colours as above; drag to rotate, scroll to zoom."))
        figures.append(("Hypervolume vs trials", "fig-hypervolume", hypervolume_figure(data),
                        "Hypervolume of the feasible points after each trial (with its anytime-"
                        "curve points), with the final reference point: it never decreases; "
                        "flat stretches are trials that did not improve the front."))
        curves = learning_curves_figure(data)
        if curves is not None:
            figures.append(("Learning curves", "fig-curves", curves,
                            "Validation metrics per epoch of every trial; trials on the front "
                            "are coloured and named, the others grey."))
    return figures


def _points_trace(rows: list[TrialRow], x: list, y: list, hovers: list[str], *, name: str,
                  color: str, size: int, symbol: str, panel: dict, showlegend: bool,
                  group: str, mode: str = "markers", line_shape: str | None = None
                  ) -> dict[str, Any]:
    marker: dict[str, Any] = {"color": color, "size": size,
                              "symbol": [symbol_of(r, symbol) for r in rows]}
    if symbol == "x":
        marker["line"] = {"width": 2, "color": color}
    trace = {"type": "scatter", "x": x, "y": y, "mode": mode, "name": esc(name),
             "marker": marker, "hovertext": hovers, "hovertemplate": "%{hovertext}<extra></extra>",
             "xaxis": panel["xref"], "yaxis": panel["yref"], "showlegend": showlegend,
             "legendgroup": group}
    if line_shape:
        trace["line"] = {"color": color, "shape": line_shape, "width": 1.5}
    return trace


def _anytime_traces(data: ReportData, xcol: int | None, ycol: int, panel: dict,
                    showlegend: bool) -> list[dict[str, Any]]:
    """The anytime curves as lines (markers come from the point groups)."""
    curves = anytime_curves(data)
    if not curves:
        return []

    def xy(t: TrialRow, subs: list[TrialRow]) -> tuple[list, list]:
        idx = [s.index for s in subs]
        ys = nums(data.Y[idx, ycol])
        xs = nums(data.Y[idx, xcol]) if xcol is not None else [t.index + 1] * len(idx)
        return xs, ys

    common = {"type": "scatter", "mode": "lines", "hoverinfo": "skip",
              "xaxis": panel["xref"], "yaxis": panel["yref"]}
    if len(curves) <= MAX_NAMED_CURVES:
        out = []
        for k, (t, subs) in enumerate(curves):
            xs, ys = xy(t, subs)
            out.append({**common, "x": xs, "y": ys, "name": esc(f"anytime curve: {t.trial_id}"),
                        "line": {"color": palette(k), "width": 1.5},
                        "legendgroup": esc(f"anytime-{t.trial_id}"), "showlegend": showlegend})
        return out
    xs_all: list = []
    ys_all: list = []
    for t, subs in curves:
        xs, ys = xy(t, subs)
        xs_all += xs + [None]
        ys_all += ys + [None]
    return [{**common, "x": xs_all, "y": ys_all, "connectgaps": False,
             "name": esc(f"anytime curves ({len(curves)} dynamic trials)"),
             "line": {"color": ANYTIME, "width": 1}, "opacity": 0.6,
             "legendgroup": "anytime", "showlegend": showlegend}]


def _static_front_trace(data: ReportData, i: int, j: int | None, panel: dict,
                        showlegend: bool) -> dict[str, Any] | None:
    """The static trials' own front (:func:`~archsearch.report.style.static_front`) as a
    dashed step line named :data:`~archsearch.report.style.STATIC_FRONT_NAME`, without hover
    (its points carry theirs); ``None`` when there is none to draw."""
    front = static_front(data, i, j)
    if front is None:
        return None
    _, xs, ys, shape = front
    return {"type": "scatter", "x": nums(xs), "y": nums(ys), "mode": "lines",
            "name": esc(STATIC_FRONT_NAME), "hoverinfo": "skip",
            "line": {"color": STATIC_FRONT, "shape": shape, "width": 2, "dash": "dash"},
            "xaxis": panel["xref"], "yaxis": panel["yref"], "showlegend": showlegend,
            "legendgroup": "static-front"}


def scatter_note(data: ReportData) -> str:
    """How to read the scatter (raw text, for the page; not escaped)."""
    m = len(data.objectives)
    note = ["Grey = feasible trial, blue = on the Pareto front"
            + (" (joined by the attainment line)" if m == 2 else "")]
    if data.n_stopped:
        note.append("hollow = stopped early (the ASHA or AHTO scheduler, or the time budget)")
    if data.constraints:
        if all(r.feasible for r in data.rows if not r.failed):
            note.append("every drawn point meets the constraints")
        else:
            note.append("red cross = violates a constraint")
    if m >= 2 and static_front(data, 0, 1) is not None:
        note.append("dashed orange line = the front of the static trials alone (gating: "
                    "static, e.g. static layer cuts): the baseline the other gatings' points "
                    "are read against; hover a point for its gating")
    if data.subtrials:
        note.append("diamonds on lines = anytime-curve points of dynamic trials (sub-trials "
                    "ID#k, eligible for the front)")
    if data.n_failed:
        note.append(f"{data.n_failed} failed trials are not drawn")
    if m > 2:
        note.append("Pareto = non-dominated in all objectives, so some blue points look "
                    "dominated in a projection")
    note.append("hover a point for its metrics and config; drag to zoom, double-click to reset")
    return "; ".join(note) + "."


def scatter_figure(data: ReportData) -> Figure:
    """Interactive Pareto scatter: one panel per objective pair (trial number vs objective
    for a single objective), anytime curves as lines and, in a run mixing static and other
    gatings, the static trials' own front as a dashed line beneath the points
    (:func:`~archsearch.report.style.static_front`). Hover shows id, status (and gating, in
    such a run), metrics and config."""
    m = len(data.objectives)
    hovers = [hover_text(data, r) for r in data.rows]
    groups = point_groups(data)
    pair_list = pairs(m) if m >= 2 else [(0, None)]
    grid = panel_grid(len(pair_list))
    n_rows = math.ceil(len(pair_list) / 3)
    title = "Trials and Pareto front" + (" (2-D projections)" if m > 2 else "")
    layout = base_layout(esc(title), 430 * n_rows + 140)
    traces: list[dict[str, Any]] = []
    ref = data.reference_point
    for k, ((i, j), panel) in enumerate(zip(pair_list, grid)):
        first = k == 0
        static = _static_front_trace(data, i, j, panel, first)
        if static is not None:  # first: drawn beneath the curves and points
            traces.append(static)
        traces += _anytime_traces(data, j, i, panel, first)
        for name, rows, color, size, symbol in groups:
            if not rows:
                continue
            rows, xs, ys, shape = panel_points(data, rows, i, j,
                                               front_line=name == "Pareto front" and m == 2)
            mode = "markers+lines" if shape else "markers"
            traces.append(_points_trace(
                rows, nums(xs), nums(ys), [hovers[r.index] for r in rows],
                name=f"{name} ({len(rows)})", color=color, size=size, symbol=symbol,
                panel=panel, showlegend=first, group=name, mode=mode, line_shape=shape))
        if j is not None and ref[j] is not None and ref[i] is not None:
            traces.append({"type": "scatter", "x": [ref[j]], "y": [ref[i]], "mode": "markers",
                           "name": "reference point", "xaxis": panel["xref"],
                           "yaxis": panel["yref"], "showlegend": first, "legendgroup": "ref",
                           "marker": {"symbol": "cross-thin", "size": 12,
                                      "line": {"width": 2, "color": "black"}},
                           "hovertemplate": "reference point<extra></extra>"})
        pair_axes(layout, panel, data.objectives, i, j, lambda c: np.append(
            data.Y[:, c], ref[c] if ref[c] is not None else np.nan))
    layout["legend"]["y"] = -0.5 / n_rows if n_rows > 1 else -0.18
    return {"data": traces, "layout": layout}


def scatter3d_figure(data: ReportData) -> Figure | None:
    """3-D view of the first three objectives (``None`` with fewer than three): x = 2nd,
    y = 3rd, z = 1st objective; same point groups and anytime curves as the 2-D scatter."""
    if len(data.objectives) < 3:
        return None
    cols = (1, 2, 0)
    traces: list[dict[str, Any]] = []
    curves = anytime_curves(data)
    many = len(curves) > MAX_NAMED_CURVES
    gathered: dict[str, list] = {"x": [], "y": [], "z": []}
    for k, (t, subs) in enumerate(curves):
        idx = [s.index for s in subs]
        xyz = {a: nums(data.Y[idx, c]) for a, c in zip("xyz", cols)}
        if many:
            for a in "xyz":
                gathered[a] += xyz[a] + [None]
            continue
        traces.append({"type": "scatter3d", "mode": "lines", "hoverinfo": "skip", **xyz,
                       "name": esc(f"anytime curve: {t.trial_id}"),
                       "line": {"color": palette(k), "width": 3}})
    if many:
        traces.append({"type": "scatter3d", "mode": "lines", "hoverinfo": "skip", **gathered,
                       "connectgaps": False, "opacity": 0.6,
                       "name": esc(f"anytime curves ({len(curves)} dynamic trials)"),
                       "line": {"color": ANYTIME, "width": 2}})
    for name, rows, color, size, symbol in point_groups(data):
        if not rows:
            continue
        idx = [r.index for r in rows]
        traces.append({
            "type": "scatter3d", "mode": "markers", "name": esc(f"{name} ({len(rows)})"),
            "x": nums(data.Y[idx, cols[0]]), "y": nums(data.Y[idx, cols[1]]),
            "z": nums(data.Y[idx, cols[2]]),
            "marker": {"color": color, "size": max(3, size - 4), "opacity": 0.9,
                       "symbol": [symbol_of(r, symbol, three_d=True) for r in rows]},
            "hovertext": [hover_text(data, r) for r in rows],
            "hovertemplate": "%{hovertext}<extra></extra>",
        })
    scene = scene_axes(data.objectives, cols, lambda c: data.Y[:, c])
    extra = "" if len(data.objectives) == 3 else " (first three objectives)"
    layout = base_layout(esc(f"Three objectives in 3-D{extra}: drag to rotate"), 620)
    layout["scene"] = scene
    layout["legend"] = {"orientation": "v", "x": 1.0, "y": 0.9}
    return {"data": traces, "layout": layout}



def hypervolume_figure(data: ReportData) -> Figure:
    """Hypervolume after each trial (trial order), with the run's final reference point."""
    ref = ", ".join("n/a" if r is None else f"{r:.6g}" for r in data.reference_point)
    layout = base_layout(esc(f"Hypervolume after each trial, in {hypervolume_units(data)} "
                             f"(reference point [{ref}])"), 380)
    hypervolume_axes(layout, "trial number (order the runner recorded)")
    layout["showlegend"] = False
    trace = {"type": "scatter", "x": list(range(1, data.n_trials + 1)),
             "y": nums(data.hv_history), "mode": "lines",
             "line": {"shape": "hv", "color": FRONT, "width": 2}, "name": "hypervolume",
             "hovertemplate": "after trial %{x}: %{y:.6g}<extra></extra>"}
    return {"data": [trace], "layout": layout}


def _history_x(history: list[dict]) -> list[float]:
    return [to_float(h.get("epoch", k + 1)) for k, h in enumerate(history)]


def _varies(data: ReportData, metric: str) -> bool:
    """Does ``metric`` change from epoch to epoch in some trial's history? (FLOPs and
    parameter counts of a static model do not: no point drawing them against epochs.)"""
    for t in data.trials:
        vals = [to_float(h.get(metric)) for h in t.history]
        vals = [v for v in vals if math.isfinite(v)]
        if len(vals) >= 2 and max(vals) - min(vals) > 1e-9 * max(1.0, abs(max(vals))):
            return True
    return False


def learning_curves_figure(data: ReportData) -> Figure | None:
    """Per-trial learning curves (metric vs epoch) for each objective metric, ``val_loss``
    and ``train_loss`` that changes between epochs in some trial's history; ``None`` when
    there is none (e.g. one-epoch trials).

    Trials not on the front share one grey trace (gaps between trials) so 1,000 trials stay
    light; each trial on the front (itself or through a sub-trial) gets its own coloured,
    named trace, up to ``MAX_NAMED_LEARNING_CURVES``.
    """
    candidates = [o.metric for o in data.objectives]
    candidates += [m for m in ("val_loss", "train_loss") if m not in candidates]
    present = [m for m in candidates if _varies(data, m)]
    if not present:
        return None
    highlighted: list[TrialRow] = []
    by_id = {t.trial_id: t for t in data.trials}
    for r in data.pareto_trials():
        t = by_id[r.parent or r.trial_id]
        if t.history and all(t is not h for h in highlighted):
            highlighted.append(t)
    highlighted = highlighted[:MAX_NAMED_LEARNING_CURVES]
    named = {t.trial_id for t in highlighted}
    max_epoch = max((x for t in data.trials for x in _history_x(t.history) if math.isfinite(x)),
                    default=1)
    n = len(present)
    gap = 0.06
    h = (1.0 - gap * (n - 1)) / n
    layout = base_layout("Learning curves per trial (trials on the front coloured; "
                         "dotted = early-stopped)", 260 * n + 150)
    traces: list[dict[str, Any]] = []
    for k, metric in enumerate(present):
        xref, xkey = axis_key(k, "x")
        yref, ykey = axis_key(k, "y")
        y1 = 1.0 - k * (h + gap)
        layout[ykey] = {"title": {"text": esc(metric_label(metric))}, "domain": [y1 - h, y1],
                        "anchor": xref, "gridcolor": "#e8e8e8", "automargin": True}
        layout[xkey] = {"anchor": yref, "gridcolor": "#e8e8e8", "domain": [0, 1],
                        "title": {"text": "epoch" if k == n - 1 else ""}}
        if max_epoch <= 30:
            layout[xkey]["dtick"] = 1
        if k > 0:
            layout[xkey]["matches"] = "x"
        xs: list = []
        ys: list = []
        texts: list = []
        for t in data.trials:
            if t.trial_id in named or not t.history:
                continue
            label = esc(f"{t.trial_id} ({t.status})")
            xs += _history_x(t.history) + [None]
            ys += nums([to_float(hh.get(metric)) for hh in t.history]) + [None]
            texts += [label] * len(t.history) + [None]
        crowd = len(data.trials) > 100
        traces.append({"type": "scatter", "x": xs, "y": ys, "mode": "lines",
                       "line": {"color": GREY, "width": 0.7 if crowd else 1},
                       "opacity": 0.25 if crowd else 0.45,
                       "name": "other trials", "legendgroup": "other", "showlegend": k == 0,
                       "hovertext": texts, "connectgaps": False, "xaxis": xref, "yaxis": yref,
                       "hovertemplate": "%{hovertext}<br>epoch %{x}: %{y:.6g}<extra></extra>"})
        for c, t in enumerate(highlighted):
            traces.append({
                "type": "scatter", "x": _history_x(t.history),
                "y": nums([to_float(hh.get(metric)) for hh in t.history]),
                "mode": "lines+markers", "name": esc(f"front: {t.trial_id}"),
                "line": {"width": 2, "dash": "dot" if t.stopped else "solid", "color": palette(c)},
                "marker": {"color": palette(c), "size": 6}, "legendgroup": esc(t.trial_id),
                "showlegend": k == 0, "xaxis": xref, "yaxis": yref,
                "hovertemplate": esc(t.trial_id) + "<br>epoch %{x}: %{y:.6g}<extra></extra>"})
    layout["legend"] = {"orientation": "v", "x": 1.01, "y": 1.0}
    layout["margin"]["r"] = 160
    return {"data": traces, "layout": layout}

