"""Figures of a run: static matplotlib PNGs and interactive plotly figures.

All figures read one :class:`~archsearch.report.records.ReportData`. Axes are in the metrics'
own units (labels say which); FLOPs and parameter counts use a log axis when every plotted
value is positive. With more than two objectives the scatter shows every pair of objectives
(2-D projections) and a 3-D view of the first three; the highlighted points are the Pareto
rows of the full m-D problem, so some of them look dominated in a projection, and no front
line is drawn.

Marker legend shared by the PNGs and the plotly figures:

* grey: feasible, not on the front;
* blue, larger: on the Pareto front (joined by a step line for two objectives);
* red cross: successful but violates a constraint (infeasible);
* hollow marker: early-stopped by ASHA (``STOPPED``; fewer epochs);
* diamond: a sub-trial ``ID#k``, one operating point of a dynamic trial's anytime curve;
  the points of one trial are joined by a line (its anytime curve);
* black plus: the reference point of the hypervolume.

Failed trials have no metrics and are not drawn (the legend states how many there are).

Interactive figures are plain plotly.js specs (``{"data": [...], "layout": {...}}`` dicts),
not ``plotly.graph_objects``: building 1,000 trials' figures through plotly's validators
took seconds (see ``benchmarks/report.py``). :mod:`archsearch.report.html` serialises them.
Every string that goes into a figure (hover text, trace names, titles, axis titles) is
``html.escape``-d here: plotly.js renders these strings as (a subset of) HTML.
matplotlib is imported inside the PNG functions.
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from archsearch.report.records import (
    LOG_SCALE_METRICS,
    ReportData,
    TrialRow,
    metric_label,
    to_float,
)

GREY = "#9e9e9e"
FRONT = "#1f5fbf"
INFEASIBLE = "#d62728"
ANYTIME = "#17a589"
MAX_HOVER_VALUE_CHARS = 200
#: At most this many dynamic trials get their own coloured anytime-curve trace; beyond it
#: all curves share one trace (keeps 1,000-trial pages light).
MAX_NAMED_CURVES = 12
#: At most this many Pareto trials get their own learning-curve trace.
MAX_NAMED_LEARNING_CURVES = 20

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22", "#7f7f7f", "#d62728"]

Figure = dict  # a plotly.js spec: {"data": [trace dicts], "layout": {...}}


def esc(value: Any) -> str:
    """``html.escape`` of ``str(value)`` (quotes too)."""
    return html.escape(str(value), quote=True)


def fmt(value: Any) -> str:
    """Short human form of a metric or config value (floats to 6 significant digits)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.6g}"
    return str(value)


def mpl_text(value: Any) -> str:
    """A user string made safe for matplotlib text: ``$`` would start mathtext."""
    return str(value).replace("$", r"\$")


def palette(k: int) -> str:
    return PALETTE[k % len(PALETTE)]


def pairs(m: int) -> list[tuple[int, int]]:
    """(y objective, x objective) pairs: (0, 1) for two objectives; all pairs for more."""
    return list(itertools.combinations(range(m), 2))


def use_log(metric: str, values: Any) -> bool:
    """Log axis for FLOPs / parameter counts when every finite value is > 0."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return metric in LOG_SCALE_METRICS and values.size > 0 and bool(np.all(values > 0))


def front_step(x_mode: str) -> tuple[str, str]:
    """(matplotlib ``where``, plotly ``line.shape``) of the attainment line, with points
    sorted by increasing x: horizontal-then-vertical when x is minimised, else the reverse."""
    return ("post", "hv") if x_mode == "min" else ("pre", "vh")


def nums(values: Any) -> list[float | None]:
    """A float sequence as a JSON-ready list (NaN/inf -> ``None``, which plotly leaves out)."""
    return [v if math.isfinite(v) else None for v in np.asarray(values, dtype=float).tolist()]


def axis_title(obj) -> str:
    return esc(f"{metric_label(obj.metric)} ({obj.mode})")


def _trial_title(data: ReportData) -> str:
    name = data.run_info.get("name") or "archsearch run"
    return (f"{name}: {data.n_trials} trials, {data.n_failed} failed, "
            f"hypervolume {data.hypervolume:.6g}")


def point_groups(data: ReportData) -> list[tuple[str, list[TrialRow], str, int, str]]:
    """(legend name, rows, colour, marker size, base symbol) of the drawn point groups."""
    rows = data.rows
    m = len(data.objectives)
    return [
        ("feasible", [t for t in rows if t.feasible and not t.pareto], GREY, 7, "circle"),
        ("violates a constraint", [t for t in rows if not t.failed and not t.feasible],
         INFEASIBLE, 7, "x"),
        ("Pareto front" if m > 1 else "best", [t for t in rows if t.pareto], FRONT, 11, "circle"),
    ]


def symbol_of(row: TrialRow, base: str, *, three_d: bool = False) -> str:
    """plotly marker symbol: diamond for sub-trials, hollow for early-stopped trials."""
    if base == "x":
        return "x" if three_d else ("x-thin-open" if row.stopped else "x-thin")
    shape = "diamond" if row.is_subtrial else base
    return f"{shape}-open" if row.stopped else shape


def anytime_curves(data: ReportData) -> list[tuple[TrialRow, list[TrialRow]]]:
    """(trial, its sub-trials ordered along the curve) for every dynamic trial; ordered by
    ``flops_per_sample`` when the points carry it, else as the strategy listed them."""
    out = []
    by_parent: dict[str, list[TrialRow]] = {}
    for s in data.subtrials:
        by_parent.setdefault(s.parent, []).append(s)
    for t in data.dynamic_trials():
        subs = by_parent[t.trial_id]
        if all("flops_per_sample" in s.metrics for s in subs):
            subs = sorted(subs, key=lambda s: to_float(s.metrics["flops_per_sample"]))
        out.append((t, subs))
    return out


# --------------------------------------------------------------------------------------------
# hover text
# --------------------------------------------------------------------------------------------


def _cut(value: Any) -> str:
    s = fmt(value)
    return s if len(s) <= MAX_HOVER_VALUE_CHARS else s[:MAX_HOVER_VALUE_CHARS] + "..."


def hover_text(data: ReportData, row: TrialRow) -> str:
    """Escaped plotly hover text of one row: id, status, objectives, other scalar metrics,
    config, a sub-trial's point settings and the final tying map. A sub-trial off the front
    refers to its trial's config instead of repeating it.

    Long values are cut to ``MAX_HOVER_VALUE_CHARS`` characters *before* escaping, so an
    entity is never cut in half.
    """
    status = row.status
    if row.stopped:
        status += ", early-stopped" + ("" if row.is_subtrial else f" after {len(row.history)} epochs")
    if row.violations:
        status += "; violates " + "; ".join(row.violations)
    lines = [f"<b>{esc(_cut(row.trial_id))}</b> ({esc(status)})"]
    if row.is_subtrial:
        lines.append(esc(f"anytime-curve point {row.point} of trial {_cut(row.parent)}"))
    objective_names = [o.metric for o in data.objectives]
    for name in objective_names:
        lines.append(f"<b>{esc(name)}</b> = {esc(_cut(row.metrics.get(name)))}")
    for name in sorted(set(row.metrics) - set(objective_names)):
        value = row.metrics[name]
        if isinstance(value, (Mapping, list, tuple)) and name != "tying_map":
            continue
        lines.append(f"{esc(name)} = {esc(_cut(value))}"
                     + (" (of the trial)" if name in row.inherited else ""))
    if row.settings:
        lines.append("<i>point settings</i>")
        for key in sorted(row.settings):
            lines.append(f"&nbsp;&nbsp;{esc(key)} = {esc(_cut(row.settings[key]))}")
    if row.is_subtrial and not row.pareto:  # 1,000s of points: keep the page light
        lines.append(f"<i>config</i>: as trial {esc(_cut(row.parent))}")
        return "<br>".join(lines)
    lines.append("<i>config</i>")
    for key in sorted(row.repro_config):
        lines.append(f"&nbsp;&nbsp;{esc(key)} = {esc(_cut(row.repro_config[key]))}")
    return "<br>".join(lines)


# --------------------------------------------------------------------------------------------
# plotly specs
# --------------------------------------------------------------------------------------------


def _axis_key(k: int, letter: str) -> tuple[str, str]:
    """(trace reference, layout key) of the k-th (0-based) axis: ("x", "xaxis"), ("x2", ...)."""
    ref = letter if k == 0 else f"{letter}{k + 1}"
    return ref, f"{letter}axis" if k == 0 else f"{letter}axis{k + 1}"


def panel_grid(n: int, *, cols: int = 3, hgap: float = 0.07, vgap: float = 0.14
               ) -> list[dict[str, Any]]:
    """Axis references and domains of ``n`` panels in a grid (at most ``cols`` per row)."""
    cols = max(1, min(cols, n))
    rows = math.ceil(n / cols)
    w = (1.0 - hgap * (cols - 1)) / cols
    h = (1.0 - vgap * (rows - 1)) / rows
    out = []
    for k in range(n):
        r, c = divmod(k, cols)
        xref, xkey = _axis_key(k, "x")
        yref, ykey = _axis_key(k, "y")
        x0 = c * (w + hgap)
        y1 = 1.0 - r * (h + vgap)
        out.append({"xref": xref, "yref": yref, "xkey": xkey, "ykey": ykey,
                    "xdomain": [x0, min(1.0, x0 + w)], "ydomain": [max(0.0, y1 - h), y1]})
    return out


def base_layout(title: str, height: int) -> dict[str, Any]:
    """Shared look (white, light grid); ``title`` must already be escaped."""
    return {
        "title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 15}},
        "height": height, "hovermode": "closest", "paper_bgcolor": "white",
        "plot_bgcolor": "white", "font": {"family": "system-ui, sans-serif", "size": 12},
        "margin": {"l": 70, "r": 20, "t": 60, "b": 60},
        "legend": {"orientation": "h", "y": -0.16},
        "hoverlabel": {"align": "left"},
    }


def axis_layout(title: str, log: bool, domain: list[float], anchor: str) -> dict[str, Any]:
    return {"title": {"text": title}, "type": "log" if log else "linear", "domain": domain,
            "anchor": anchor, "gridcolor": "#e8e8e8", "zeroline": False, "automargin": True}


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


def scatter_note(data: ReportData) -> str:
    """How to read the scatter (raw text, for the page; not escaped)."""
    m = len(data.objectives)
    note = ["Grey = feasible trial, blue = on the Pareto front"
            + (" (joined by the attainment line)" if m == 2 else "")]
    if data.n_stopped:
        note.append("hollow = early-stopped by ASHA")
    if data.constraints:
        if all(r.feasible for r in data.rows if not r.failed):
            note.append("every drawn point meets the constraints")
        else:
            note.append("red cross = violates a constraint")
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
    for a single objective), anytime curves as lines. Hover shows id, status, metrics and
    config."""
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
    trial_number = {t.trial_id: t.index + 1 for t in data.trials}
    for k, ((i, j), panel) in enumerate(zip(pair_list, grid)):
        first = k == 0
        traces += _anytime_traces(data, j, i, panel, first)
        for name, rows, color, size, symbol in groups:
            if not rows:
                continue
            idx = [r.index for r in rows]
            xs = (data.Y[idx, j] if j is not None
                  else np.array([trial_number[r.parent or r.trial_id] for r in rows], float))
            ys = data.Y[idx, i]
            mode, shape = "markers", None
            if name == "Pareto front" and m == 2:
                order = np.argsort(xs, kind="stable")
                rows = [rows[o] for o in order]
                xs, ys = xs[order], ys[order]
                mode, shape = "markers+lines", front_step(data.objectives[j].mode)[1]
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
        oy = data.objectives[i]
        yvals = np.append(data.Y[:, i], ref[i] if ref[i] is not None else np.nan)
        layout[panel["ykey"]] = axis_layout(axis_title(oy), use_log(oy.metric, yvals),
                                      panel["ydomain"], panel["xref"])
        if j is None:
            layout[panel["xkey"]] = axis_layout("trial number", False, panel["xdomain"], panel["yref"])
        else:
            ox = data.objectives[j]
            xvals = np.append(data.Y[:, j], ref[j] if ref[j] is not None else np.nan)
            layout[panel["xkey"]] = axis_layout(axis_title(ox), use_log(ox.metric, xvals),
                                          panel["xdomain"], panel["yref"])
    layout["legend"]["y"] = -0.5 / n_rows if n_rows > 1 else -0.18
    return {"data": traces, "layout": layout}


def scatter3d_figure(data: ReportData) -> Figure | None:
    """3-D view of the first three objectives (``None`` with fewer than three): x = 2nd,
    y = 3rd, z = 1st objective; same point groups and anytime curves as the 2-D scatter."""
    if len(data.objectives) < 3:
        return None
    cols = (1, 2, 0)
    objs = [data.objectives[c] for c in cols]
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
    scene = {}
    for axis, obj, c in zip(("xaxis", "yaxis", "zaxis"), objs, cols):
        scene[axis] = {"title": {"text": axis_title(obj)},
                       "type": "log" if use_log(obj.metric, data.Y[:, c]) else "linear"}
    extra = "" if len(data.objectives) == 3 else " (first three objectives)"
    layout = base_layout(esc(f"Three objectives in 3-D{extra}: drag to rotate"), 620)
    layout["scene"] = scene
    layout["legend"] = {"orientation": "v", "x": 1.0, "y": 0.9}
    return {"data": traces, "layout": layout}


def hypervolume_units(data: ReportData) -> str:
    return " x ".join(metric_label(o.metric) for o in data.objectives)


def hypervolume_figure(data: ReportData) -> Figure:
    """Hypervolume after each trial (trial order), with the run's final reference point."""
    ref = ", ".join("n/a" if r is None else f"{r:.6g}" for r in data.reference_point)
    layout = base_layout(esc(f"Hypervolume after each trial, in {hypervolume_units(data)} "
                             f"(reference point [{ref}])"), 380)
    layout["xaxis"] = {"title": {"text": "trial number (order the runner recorded)"},
                       "gridcolor": "#e8e8e8", "zeroline": False}
    layout["yaxis"] = {"title": {"text": "hypervolume"}, "gridcolor": "#e8e8e8",
                       "zeroline": False, "automargin": True}
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
        xref, xkey = _axis_key(k, "x")
        yref, ykey = _axis_key(k, "y")
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
            label = f"{esc(t.trial_id)} ({esc(t.status)})"
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


# --------------------------------------------------------------------------------------------
# matplotlib PNGs
# --------------------------------------------------------------------------------------------


def new_figure(width: float, height: float):
    """A matplotlib Figure on the Agg canvas (no pyplot, no global backend state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def write_pareto_png(data: ReportData, path: Path, *, dpi: int = 100) -> Path:
    """Write the static Pareto plot (one panel per objective pair, anytime curves as lines)
    to ``path`` (PNG) and return ``path``. With no successful trial the image says so.

    Fixed margins and one figure legend on the right (no ``tight_layout``, no
    ``loc="best"``): both would cost an extra full draw with 1,000 points.
    """
    m = len(data.objectives)
    pair_list = pairs(m) if m >= 2 else [(0, 0)]
    cols = min(3, len(pair_list))
    n_rows = math.ceil(len(pair_list) / cols)
    width = 5.2 * cols + 2.6
    height = 4.2 * n_rows + 0.8
    fig = new_figure(width, height)
    fig.suptitle(mpl_text(_trial_title(data)), fontsize=11)
    axes = fig.subplots(n_rows, cols, squeeze=False).ravel()
    fig.subplots_adjust(left=0.9 / width, right=1.0 - 2.75 / width, bottom=0.65 / height,
                        top=1.0 - 0.55 / height, wspace=0.28, hspace=0.32)
    for ax in axes[len(pair_list):]:
        ax.set_axis_off()
    if data.n_successful == 0:
        ax = axes[0]
        ax.text(0.5, 0.5, f"No successful trials\n({data.n_failed} failed): nothing to plot",
                ha="center", va="center", fontsize=14, transform=ax.transAxes)
        ax.set_axis_off()
    elif m == 1:
        _png_single_objective(axes[0], data)
    else:
        for ax, (i, j) in zip(axes, pair_list):
            _png_pair(ax, data, y_obj=i, x_obj=j, draw_front_line=(m == 2))
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper left", fontsize=7.5, frameon=False,
                   bbox_to_anchor=(1.0 - 2.6 / width, 1.0 - 0.55 / height))
    fig.savefig(path, dpi=dpi, format="png")
    return Path(path)


def _png_scatter(ax, x, y, rows: list[TrialRow], color, size, label, marker="o", **kw):
    """Scatter: filled markers for finished trials, hollow for STOPPED, diamonds for
    sub-trials (hollow if their trial was stopped)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if marker == "x":
        ax.scatter(x, y, s=size, c=color, marker="x", label=label, **kw)
        return
    stopped = np.array([r.stopped for r in rows], dtype=bool)
    sub = np.array([r.is_subtrial for r in rows], dtype=bool)
    labelled = False
    for sel, mk, hollow in ((~stopped & ~sub, marker, False), (stopped & ~sub, marker, True),
                            (~stopped & sub, "D", False), (stopped & sub, "D", True)):
        if not sel.any():
            continue
        lab = label if not labelled else None
        labelled = True
        s = size * (0.7 if mk == "D" else 1.0)
        if hollow:
            ax.scatter(x[sel], y[sel], s=s, facecolors="none", edgecolors=color, marker=mk,
                       label=lab, **{k: v for k, v in kw.items() if k != "edgecolors"})
        else:
            ax.scatter(x[sel], y[sel], s=s, c=color, marker=mk, label=lab, **kw)


def _png_pair(ax, data: ReportData, *, y_obj: int, x_obj: int, draw_front_line: bool) -> None:
    ox, oy = data.objectives[x_obj], data.objectives[y_obj]
    X, Yv = data.Y[:, x_obj], data.Y[:, y_obj]
    rows = data.rows
    groups = {
        "feasible": [t for t in rows if t.feasible and not t.pareto],
        "infeasible": [t for t in rows if not t.failed and not t.feasible],
        "pareto": [t for t in rows if t.pareto],
    }

    def xy(rs):
        idx = [r.index for r in rs]
        return X[idx], Yv[idx]

    curves = anytime_curves(data)
    if len(curves) <= MAX_NAMED_CURVES:
        for k, (t, subs) in enumerate(curves):
            ax.plot(*xy(subs), color=palette(k), lw=1.2, alpha=0.9, zorder=1,
                    label=mpl_text(f"anytime curve {t.trial_id}"))
    else:  # one artist for all curves: hundreds of Line2D objects draw slowly
        from matplotlib.collections import LineCollection

        segs = [np.column_stack(xy(subs)) for _, subs in curves]
        ax.add_collection(LineCollection(segs, colors=ANYTIME, linewidths=0.8, alpha=0.5,
                                         zorder=1, label=f"anytime curves ({len(curves)})"))
    _png_scatter(ax, *xy(groups["feasible"]), groups["feasible"], GREY, 22,
                 f"feasible ({len(groups['feasible'])})", alpha=0.7, zorder=2)
    if groups["infeasible"]:
        _png_scatter(ax, *xy(groups["infeasible"]), groups["infeasible"], INFEASIBLE, 26,
                     f"violates a constraint ({len(groups['infeasible'])})", marker="x",
                     alpha=0.7, zorder=2)
    px, py = xy(groups["pareto"])
    if draw_front_line and len(px):
        order = np.argsort(px, kind="stable")
        where, _ = front_step(ox.mode)
        ax.step(px[order], py[order], where=where, color=FRONT, lw=1.5, zorder=3)
    _png_scatter(ax, px, py, groups["pareto"], FRONT, 55, f"Pareto front ({len(px)})",
                 edgecolors=FRONT, linewidths=1.2, zorder=4)

    ref = data.reference_point
    log_x = use_log(ox.metric, np.append(X, ref[x_obj] if ref[x_obj] is not None else np.nan))
    log_y = use_log(oy.metric, np.append(Yv, ref[y_obj] if ref[y_obj] is not None else np.nan))
    if ref[x_obj] is not None and ref[y_obj] is not None:
        ax.scatter([ref[x_obj]], [ref[y_obj]], marker="+", s=80, c="black",
                   label="reference point", zorder=5)
    if log_x:
        ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel(mpl_text(f"{metric_label(ox.metric)} ({ox.mode})"))
    ax.set_ylabel(mpl_text(f"{metric_label(oy.metric)} ({oy.mode})"))
    if data.n_failed:
        ax.plot([], [], " ", label=f"failed, not drawn ({data.n_failed})")
    ax.grid(True, which="major", alpha=0.3)


def _png_single_objective(ax, data: ReportData) -> None:
    """One objective: value per trial number, best-so-far step line, best trial highlighted."""
    obj = data.objectives[0]
    rows = data.trials
    n = np.arange(1, data.n_trials + 1)
    y = data.Y[: data.n_trials, 0]
    feas = np.array([t.feasible for t in rows])
    infeas = np.array([not t.failed and not t.feasible for t in rows])
    best = np.array([t.pareto for t in rows])
    sel = feas & ~best
    _png_scatter(ax, n[sel], y[sel], [r for r, s in zip(rows, sel) if s], GREY, 22,
                 f"feasible ({int(sel.sum())})", alpha=0.7)
    if infeas.any():
        ax.scatter(n[infeas], y[infeas], marker="x", c=INFEASIBLE, s=26,
                   label=f"violates a constraint ({int(infeas.sum())})")
    yf = np.where(feas, y, np.nan)
    sign = 1.0 if obj.mode == "max" else -1.0
    running = sign * np.fmax.accumulate(np.where(np.isnan(yf), -np.inf, sign * yf))
    running[~np.isfinite(running)] = np.nan
    ax.step(n, running, where="post", color=FRONT, lw=1.5, label="best trial so far")
    _png_scatter(ax, n[best], y[best], [r for r, b in zip(rows, best) if b], FRONT, 60,
                 "best trial", zorder=4)
    if data.reference_point[0] is not None:
        ax.axhline(data.reference_point[0], color="black", lw=0.8, ls=":", label="reference")
    if use_log(obj.metric, y):
        ax.set_yscale("log")
    ax.set_xlabel("trial number")
    ax.set_ylabel(mpl_text(f"{metric_label(obj.metric)} ({obj.mode})"))
    ax.grid(True, alpha=0.3)


def write_hypervolume_png(curves: Sequence[tuple[str, Sequence[float]]], units: str,
                          path: Path, *, title: str, dpi: int = 100) -> Path:
    """Hypervolume-vs-trials step curves (one per ``(label, history)``) as a PNG."""
    fig = new_figure(7.5, 4.2)
    ax = fig.subplots()
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.13, top=0.9)
    for k, (label, hist) in enumerate(curves):
        n = np.arange(1, len(hist) + 1)
        ax.step(n, np.asarray(hist, dtype=float), where="post", lw=1.8,
                color=FRONT if len(curves) == 1 else palette(k), label=mpl_text(label))
    ax.set_xlabel("trial number")
    ax.set_ylabel("hypervolume")
    ax.set_title(mpl_text(f"{title}\n[{units}]"), fontsize=9)
    ax.grid(True, alpha=0.3)
    if len(curves) > 1:
        ax.legend(fontsize=8, loc="lower right")
    fig.savefig(path, dpi=dpi, format="png")
    return Path(path)
