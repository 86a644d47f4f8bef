"""The look shared by every figure of a report (plotly and matplotlib, one run or a
comparison): colours, marker legend, which points form which group, axes, hover text.

All figures read :class:`~archsearch.report.data.ReportData`. Axes are in the metrics' own
units (labels say which); FLOPs and parameter counts use a log axis when every plotted value
is positive. With more than two objectives a scatter shows every pair of objectives (2-D
projections) and a 3-D view of the first three; the highlighted points are the Pareto rows of
the full m-D problem, so some of them look dominated in a projection, and no front line is
drawn.

Marker legend shared by the PNGs and the plotly figures:

* grey: feasible, not on the front;
* blue, larger: on the Pareto front (joined by a step line for two objectives);
* red cross: successful but violates a constraint (infeasible);
* hollow marker: stopped early by the ASHA or AHTO scheduler or the time budget (``STOPPED``; fewer epochs);
* diamond: a sub-trial ``ID#k``, one operating point of a dynamic trial's anytime curve;
  the points of one trial are joined by a line (its anytime curve);
* dashed orange step line, beneath the points: the static trials' own Pareto front
  (``static front (gating: static)``), drawn only when a run mixes static trials with trials
  of another gating (:attr:`ReportData.mixes_gating`): the static-cut curve the dynamic
  gatings are read against; the hover text then names every point's gating;
* black plus: the reference point of the hypervolume.

Failed trials have no metrics and are not drawn (the legend states how many there are).

Interactive figures are plain plotly.js specs (``{"data": [...], "layout": {...}}`` dicts,
:data:`Figure`), not ``plotly.graph_objects``: building 1,000 trials' figures through
plotly's validators took seconds (see ``benchmarks/product/report.py``). Every string that goes into
a figure (hover text, trace names, titles, axis titles) is escaped where the figure is built
(:func:`~archsearch.report.values.esc`, or ``markupsafe.Markup.format`` for hover texts: the
escape of the page templates' autoescape): plotly.js renders these strings as (a subset of)
HTML.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from markupsafe import Markup

from archsearch import pareto
from archsearch.report.data import ReportData
from archsearch.report.records import STATIC_GATING, TrialRow
from archsearch.report.values import LOG_SCALE_METRICS, esc, fmt, metric_label, to_float

GREY = "#9e9e9e"
FRONT = "#1f5fbf"
INFEASIBLE = "#d62728"
ANYTIME = "#17a589"
STATIC_FRONT = "#e67e22"
#: Legend name of the static trials' own front (:func:`static_front`).
STATIC_FRONT_NAME = "static front (gating: static)"
MAX_HOVER_VALUE_CHARS = 200
#: At most this many dynamic trials get their own coloured anytime-curve trace; beyond it
#: all curves share one trace (keeps 1,000-trial pages light).
MAX_NAMED_CURVES = 12
#: At most this many Pareto trials get their own learning-curve trace.
MAX_NAMED_LEARNING_CURVES = 20

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22", "#7f7f7f", "#d62728"]

Figure = dict  # a plotly.js spec: {"data": [trace dicts], "layout": {...}}


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
    refers to its trial's config instead of repeating it. In a run that mixes static and
    dynamic gatings (:attr:`ReportData.mixes_gating`) the second line names the row's gating
    (``static`` also when the config has none).

    Long values are cut to ``MAX_HOVER_VALUE_CHARS`` characters *before* escaping, so an
    entity is never cut in half.
    """
    status = row.status
    if row.stopped:
        status += ", early-stopped" + ("" if row.is_subtrial else f" after {len(row.history)} epochs")
    if row.violations:
        status += "; violates " + "; ".join(row.violations)
    # Markup.format escapes every argument (markupsafe, as the page templates' autoescape)
    lines = [_BOLD_STATUS.format(_cut(row.trial_id), status)]
    if row.is_subtrial:
        lines.append(_POINT_OF.format(row.point, _cut(row.parent)))
    if data.mixes_gating:
        lines.append(_BOLD_VALUE.format("gating", _cut(row.gating)))
    objective_names = [o.metric for o in data.objectives]
    for name in objective_names:
        lines.append(_BOLD_VALUE.format(name, _cut(row.metrics.get(name))))
    for name in sorted(set(row.metrics) - set(objective_names)):
        value = row.metrics[name]
        if isinstance(value, (Mapping, list, tuple)) and name != "tying_map":
            continue
        lines.append((_VALUE_OF_TRIAL if name in row.inherited else _VALUE).format(name, _cut(value)))
    if row.settings:
        lines.append(Markup("<i>point settings</i>"))
        for key in sorted(row.settings):
            lines.append(_INDENTED_VALUE.format(key, _cut(row.settings[key])))
    if row.is_subtrial and not row.pareto:  # 1,000s of points: keep the page light
        lines.append(_CONFIG_AS.format(_cut(row.parent)))
        return str(_BR.join(lines))
    lines.append(Markup("<i>config</i>"))
    for key in sorted(row.repro_config):
        lines.append(_INDENTED_VALUE.format(key, _cut(row.repro_config[key])))
    return str(_BR.join(lines))


# The markup of hover texts (plotly's subset of HTML); arguments are escaped by Markup.format.
_BR = Markup("<br>")
_BOLD_STATUS = Markup("<b>{}</b> ({})")
_POINT_OF = Markup("anytime-curve point {} of trial {}")
_BOLD_VALUE = Markup("<b>{}</b> = {}")
_VALUE = Markup("{} = {}")
_VALUE_OF_TRIAL = Markup("{} = {} (of the trial)")
_INDENTED_VALUE = Markup("&nbsp;&nbsp;{} = {}")
_CONFIG_AS = Markup("<i>config</i>: as trial {}")


# --------------------------------------------------------------------------------------------
# plotly specs
# --------------------------------------------------------------------------------------------


def axis_key(k: int, letter: str) -> tuple[str, str]:
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
        xref, xkey = axis_key(k, "x")
        yref, ykey = axis_key(k, "y")
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


def hypervolume_units(data: ReportData) -> str:
    """Unit of a hypervolume: the product of the objectives' units."""
    return " x ".join(metric_label(o.metric) for o in data.objectives)




# --------------------------------------------------------------------------------------------
# panels of an objective-pair scatter (one run or several)
# --------------------------------------------------------------------------------------------


def panel_points(data: ReportData, rows: list[TrialRow], i: int, j: int | None, *,
                 front_line: bool = False) -> tuple[list[TrialRow], np.ndarray, np.ndarray,
                                                     str | None]:
    """Where ``rows`` go in the panel of objective ``i`` (y) against objective ``j`` (x;
    ``None``: the trial number, a sub-trial at its trial's number).

    Returns:
        ``(rows, x, y, line_shape)``: ``x``, ``y`` are ``len(rows)`` arrays in the
        objectives' units (NaN where missing). With ``front_line`` (two objectives, the front)
        the rows are sorted by increasing x and ``line_shape`` is the plotly shape of the
        attainment line; otherwise the rows keep their order and ``line_shape`` is ``None``.
    """
    idx = [r.index for r in rows]
    if j is None:
        number = {t.trial_id: t.index + 1 for t in data.trials}
        xs = np.array([number[r.parent or r.trial_id] for r in rows], float)
    else:
        xs = data.Y[idx, j]
    ys = data.Y[idx, i]
    if not front_line:
        return rows, xs, ys, None
    order = np.argsort(xs, kind="stable")
    return [rows[o] for o in order], xs[order], ys[order], front_step(data.objectives[j].mode)[1]


def static_front(data: ReportData, i: int, j: int | None
                 ) -> tuple[list[TrialRow], np.ndarray, np.ndarray, str] | None:
    """The static trials' own Pareto front in the panel of objective ``i`` (y) against
    objective ``j`` (x), or ``None`` when the run does not mix gatings
    (:attr:`ReportData.mixes_gating`), ``j`` is ``None`` (one objective) or no static row is
    feasible.

    The rows are the feasible rows (trials and sub-trials, as the run's own front) whose
    gating is static; the front is non-dominated in objectives ``i`` and ``j`` only
    (:func:`archsearch.pareto.non_dominated_mask`): with two objectives the static trials'
    front, with more its 2-D projection (a curve in that panel).

    Returns:
        ``(rows, x, y, line_shape)`` as :func:`panel_points` with ``front_line``: the front's
        rows by increasing x, ``x`` / ``y`` ``len(rows)`` arrays in the objectives' units, the
        plotly shape of its attainment line.
    """
    if j is None or not data.mixes_gating:
        return None
    rows = [r for r in data.rows if r.feasible and r.gating == STATIC_GATING]
    if not rows:
        return None
    idx = [r.index for r in rows]
    modes = data.modes
    mask = pareto.non_dominated_mask(data.Y[np.ix_(idx, [i, j])], [modes[i], modes[j]])
    front = [r for r, keep in zip(rows, mask) if keep]
    return panel_points(data, front, i, j, front_line=True)


def pair_axes(layout: dict[str, Any], panel: dict[str, Any], objectives, i: int, j: int | None,
              values: Callable[[int], Any]) -> None:
    """Set the y axis (objective ``i``) and the x axis (objective ``j``; ``None``: trial
    number) of one :func:`panel_grid` panel in ``layout``. ``values(c)`` gives every value
    drawn on objective column ``c`` (decides the log axis, :func:`use_log`)."""
    oy = objectives[i]
    layout[panel["ykey"]] = axis_layout(axis_title(oy), use_log(oy.metric, values(i)),
                                        panel["ydomain"], panel["xref"])
    if j is None:
        layout[panel["xkey"]] = axis_layout("trial number", False, panel["xdomain"], panel["yref"])
    else:
        ox = objectives[j]
        layout[panel["xkey"]] = axis_layout(axis_title(ox), use_log(ox.metric, values(j)),
                                            panel["xdomain"], panel["yref"])


def scene_axes(objectives, cols: tuple[int, int, int],
               values: Callable[[int], Any]) -> dict[str, Any]:
    """The ``scene`` axes of a 3-D scatter: x, y, z show objective columns ``cols``;
    ``values(c)`` as in :func:`pair_axes`."""
    scene = {}
    for axis, c in zip(("xaxis", "yaxis", "zaxis"), cols):
        obj = objectives[c]
        scene[axis] = {"title": {"text": axis_title(obj)},
                       "type": "log" if use_log(obj.metric, values(c)) else "linear"}
    return scene


def hypervolume_axes(layout: dict[str, Any], x_title: str) -> None:
    """Axes of a hypervolume-vs-trials figure (``x_title`` raw text, no user strings)."""
    layout["xaxis"] = {"title": {"text": x_title}, "gridcolor": "#e8e8e8", "zeroline": False}
    layout["yaxis"] = {"title": {"text": "hypervolume"}, "gridcolor": "#e8e8e8",
                       "zeroline": False, "automargin": True}
