"""Figures of a run: a static matplotlib PNG and interactive plotly figures.

All figures read one :class:`~archsearch.report.records.ReportData`. Axes are in the metrics'
own units (labels say which); FLOPs and parameter counts use a log axis when every plotted
value is positive. With more than two objectives the scatter shows every pair of objectives
(2-D projections); the highlighted points are the Pareto trials of the full m-D problem, so
some of them look dominated in a projection, and no front line is drawn.

Marker legend shared by the PNG and the plotly figures:

* grey: feasible trial, not on the front;
* blue, larger: Pareto trial (joined by a step line for two objectives);
* red cross: successful but violates a constraint (infeasible);
* hollow marker: early-stopped by ASHA (``STOPPED``; fewer epochs);
* black plus: the reference point of the hypervolume.

Failed trials have no metrics and are not drawn (the legend states how many there are).

Every string that goes into a plotly figure (hover text, trace names, titles) is
``html.escape``-d: plotly renders hover text as HTML and the HTML page inlines the figure JSON.
matplotlib, torch and plotly are imported inside the functions.
"""

from __future__ import annotations

import html
import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from archsearch.report.records import (
    LOG_SCALE_METRICS,
    ReportData,
    TrialRow,
    metric_label,
    to_float,
)

if TYPE_CHECKING:  # pragma: no cover
    import plotly.graph_objects as go

GREY = "#9e9e9e"
FRONT = "#1f5fbf"
INFEASIBLE = "#d62728"
MAX_HOVER_VALUE_CHARS = 200


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


def _pairs(m: int) -> list[tuple[int, int]]:
    """(y objective, x objective) pairs: (0, 1) for two objectives; all pairs for more."""
    return list(itertools.combinations(range(m), 2))


def _use_log(metric: str, values: np.ndarray) -> bool:
    values = values[np.isfinite(values)]
    return metric in LOG_SCALE_METRICS and values.size > 0 and bool(np.all(values > 0))


def _front_step(x_mode: str) -> tuple[str, str]:
    """(matplotlib ``where``, plotly ``line_shape``) of the attainment line, with points
    sorted by increasing x: horizontal-then-vertical when x is minimised, else the reverse."""
    return ("post", "hv") if x_mode == "min" else ("pre", "vh")


def _trial_title(data: ReportData) -> str:
    name = data.run_info.get("name") or "archsearch run"
    return (
        f"{name}: {data.n_trials} trials, {data.n_failed} failed, "
        f"hypervolume {data.hypervolume:.6g}"
    )


# --------------------------------------------------------------------------------------------
# matplotlib PNG
# --------------------------------------------------------------------------------------------


def write_pareto_png(data: ReportData, path: Path, *, dpi: int = 110) -> Path:
    """Write the static Pareto plot to ``path`` (PNG) and return ``path``.

    Uses matplotlib's Agg canvas directly (no pyplot, no global backend state). With no
    successful trial the image says so instead of plotting.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    m = len(data.objectives)
    pairs = _pairs(m) if m >= 2 else [(0, 0)]
    fig = Figure(figsize=(6.4 * len(pairs) if len(pairs) > 1 else 7.5, 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(mpl_text(_trial_title(data)), fontsize=11)
    axes = fig.subplots(1, len(pairs), squeeze=False)[0]

    if data.n_successful == 0:
        ax = axes[0]
        ax.text(0.5, 0.5, f"No successful trials\n({data.n_failed} failed): nothing to plot",
                ha="center", va="center", fontsize=14, transform=ax.transAxes)
        ax.set_axis_off()
    elif m == 1:
        _png_single_objective(axes[0], data)
    else:
        for ax, (i, j) in zip(axes, pairs):
            _png_pair(ax, data, y_obj=i, x_obj=j, draw_front_line=(m == 2))
    fig.savefig(path, dpi=dpi, format="png")
    return Path(path)


def _png_scatter(ax, x, y, rows: list[TrialRow], color, size, label, marker="o", **kw):
    """Scatter with filled markers for finished trials and hollow ones for STOPPED."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    stopped = np.array([r.stopped for r in rows], dtype=bool)
    if marker == "x":
        ax.scatter(x, y, s=size, c=color, marker="x", label=label, **kw)
        return
    if (~stopped).any():
        ax.scatter(x[~stopped], y[~stopped], s=size, c=color, marker=marker, label=label, **kw)
    if stopped.any():
        kw = {**kw, "edgecolors": color}  # hollow markers: the edge carries the colour
        ax.scatter(x[stopped], y[stopped], s=size, facecolors="none",
                   marker=marker, label=f"{label} (early-stopped)", **kw)


def _png_pair(ax, data: ReportData, *, y_obj: int, x_obj: int, draw_front_line: bool) -> None:
    ox, oy = data.objectives[x_obj], data.objectives[y_obj]
    X, Yv = data.Y[:, x_obj], data.Y[:, y_obj]
    groups = {
        "feasible": [t for t in data.trials if t.feasible and not t.pareto],
        "infeasible": [t for t in data.trials if not t.failed and not t.feasible],
        "pareto": [t for t in data.trials if t.pareto],
    }

    def xy(rows):
        idx = [r.index for r in rows]
        return X[idx], Yv[idx]

    _png_scatter(ax, *xy(groups["feasible"]), groups["feasible"], GREY, 22,
                 f"feasible ({len(groups['feasible'])})", alpha=0.7, zorder=2)
    if groups["infeasible"]:
        _png_scatter(ax, *xy(groups["infeasible"]), groups["infeasible"], INFEASIBLE, 26,
                     f"violates a constraint ({len(groups['infeasible'])})", marker="x",
                     alpha=0.7, zorder=2)
    px, py = xy(groups["pareto"])
    if draw_front_line and len(px):
        order = np.argsort(px, kind="stable")
        where, _ = _front_step(ox.mode)
        ax.step(px[order], py[order], where=where, color=FRONT, lw=1.5, zorder=3)
    _png_scatter(ax, px, py, groups["pareto"], FRONT, 55, f"Pareto front ({len(px)})",
                 edgecolors=FRONT, linewidths=1.2, zorder=4)

    ref = data.reference_point
    log_x = _use_log(ox.metric, np.append(X, ref[x_obj] if ref[x_obj] is not None else np.nan))
    log_y = _use_log(oy.metric, np.append(Yv, ref[y_obj] if ref[y_obj] is not None else np.nan))
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
    ax.legend(fontsize=8, loc="best")


def _png_single_objective(ax, data: ReportData) -> None:
    """One objective: value per trial number, best-so-far step line, best trial highlighted."""
    obj = data.objectives[0]
    n = np.arange(1, data.n_trials + 1)
    y = data.Y[:, 0]
    feas = np.array([t.feasible for t in data.trials])
    infeas = np.array([not t.failed and not t.feasible for t in data.trials])
    best = np.array([t.pareto for t in data.trials])
    rows = data.trials
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
    ax.step(n, running, where="post", color=FRONT, lw=1.5, label="best so far")
    _png_scatter(ax, n[best], y[best], [r for r, b in zip(rows, best) if b], FRONT, 60,
                 "best trial", zorder=4)
    if data.reference_point[0] is not None:
        ax.axhline(data.reference_point[0], color="black", lw=0.8, ls=":", label="reference")
    if _use_log(obj.metric, y):
        ax.set_yscale("log")
    ax.set_xlabel("trial number")
    ax.set_ylabel(mpl_text(f"{metric_label(obj.metric)} ({obj.mode})"))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")


# --------------------------------------------------------------------------------------------
# plotly
# --------------------------------------------------------------------------------------------


def hover_text(data: ReportData, row: TrialRow) -> str:
    """Escaped plotly hover text of one trial: id, status, objectives, other metrics, config.

    Long values are cut to ``MAX_HOVER_VALUE_CHARS`` characters *before* escaping, so an
    entity is never cut in half.
    """

    def cut(value: Any) -> str:
        s = fmt(value)
        return s if len(s) <= MAX_HOVER_VALUE_CHARS else s[:MAX_HOVER_VALUE_CHARS] + "..."

    status = row.status
    if row.stopped:
        status += f", early-stopped after {len(row.history)} epochs"
    if row.violations:
        status += "; violates " + "; ".join(row.violations)
    lines = [f"<b>{esc(cut(row.trial_id))}</b> ({esc(status)})"]
    objective_names = [o.metric for o in data.objectives]
    for name in objective_names:
        lines.append(f"<b>{esc(name)}</b> = {esc(cut(row.metrics.get(name)))}")
    for name in sorted(set(row.metrics) - set(objective_names)):
        lines.append(f"{esc(name)} = {esc(cut(row.metrics[name]))}")
    lines.append("<i>config</i>")
    for key in sorted(row.config):
        lines.append(f"&nbsp;&nbsp;{esc(key)} = {esc(cut(row.config[key]))}")
    return "<br>".join(lines)


def _scatter_traces(data, rows, x, y, hovers, *, name, color, size, symbol="circle",
                    mode="markers", line_shape=None, showlegend=True, legendgroup=None):
    import plotly.graph_objects as go

    symbols = [
        ("x-thin-open" if symbol == "x" else f"{symbol}-open") if r.stopped
        else ("x-thin" if symbol == "x" else symbol)
        for r in rows
    ]
    marker = dict(color=color, size=size, symbol=symbols)
    if symbol == "x":
        marker["line"] = dict(width=2, color=color)
    return go.Scatter(
        x=x, y=y, mode=mode, name=esc(name), marker=marker,
        line=dict(color=color, shape=line_shape or "linear"),
        hovertext=hovers, hovertemplate="%{hovertext}<extra></extra>",
        showlegend=showlegend, legendgroup=legendgroup or name,
    )


def scatter_figure(data: ReportData) -> "go.Figure":
    """Interactive Pareto scatter (one panel per objective pair; trial number vs objective for
    a single objective). Hover shows the trial's id, status, metrics and config."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    m = len(data.objectives)
    hovers = [hover_text(data, t) for t in data.trials]
    groups = [
        ("feasible", [t for t in data.trials if t.feasible and not t.pareto], GREY, 7, "circle"),
        ("violates a constraint", [t for t in data.trials if not t.failed and not t.feasible],
         INFEASIBLE, 7, "x"),
        ("Pareto front" if m > 1 else "best trial", [t for t in data.trials if t.pareto],
         FRONT, 11, "circle"),
    ]
    pairs = _pairs(m) if m >= 2 else [(0, None)]
    fig = make_subplots(rows=1, cols=len(pairs), horizontal_spacing=0.08)
    for col, (i, j) in enumerate(pairs, start=1):
        for name, rows, color, size, symbol in groups:
            if not rows:
                continue
            if j is None:
                xs = np.array([r.index + 1 for r in rows], dtype=float)
            else:
                xs = data.Y[[r.index for r in rows], j]
            ys = data.Y[[r.index for r in rows], i]
            mode, shape = "markers", None
            if name == "Pareto front" and m == 2:
                order = np.argsort(xs, kind="stable")
                rows = [rows[k] for k in order]
                xs, ys = xs[order], ys[order]
                mode, shape = "markers+lines", _front_step(data.objectives[j].mode)[1]
            fig.add_trace(
                _scatter_traces(data, rows, xs, ys, [hovers[r.index] for r in rows],
                                name=f"{name} ({len(rows)})", color=color, size=size,
                                symbol=symbol, mode=mode, line_shape=shape,
                                showlegend=(col == 1), legendgroup=name),
                row=1, col=col,
            )
        ref = data.reference_point
        rx = None if j is None else ref[j]
        if j is not None and rx is not None and ref[i] is not None:
            fig.add_trace(go.Scatter(x=[rx], y=[ref[i]], mode="markers", name="reference point",
                                     marker=dict(symbol="cross-thin", size=12,
                                                 line=dict(width=2, color="black")),
                                     hovertemplate="reference point<extra></extra>",
                                     showlegend=(col == 1), legendgroup="ref"),
                          row=1, col=col)
        oy = data.objectives[i]
        fig.update_yaxes(title_text=esc(f"{metric_label(oy.metric)} ({oy.mode})"),
                         type="log" if _use_log(oy.metric, data.Y[:, i]) else "linear",
                         row=1, col=col)
        if j is None:
            fig.update_xaxes(title_text="trial number", row=1, col=col)
        else:
            ox = data.objectives[j]
            fig.update_xaxes(title_text=esc(f"{metric_label(ox.metric)} ({ox.mode})"),
                             type="log" if _use_log(ox.metric, data.Y[:, j]) else "linear",
                             row=1, col=col)
    note = "hollow = early-stopped (ASHA)"
    if data.n_failed:
        note += f"; {data.n_failed} failed trials not drawn"
    if m > 2:
        note += "; Pareto = non-dominated in all objectives (2-D projections)"
    fig.update_layout(title=esc(f"Trials and Pareto front ({note})"), height=520,
                      template="plotly_white", hovermode="closest",
                      legend=dict(orientation="h", y=-0.18))
    return fig


def hypervolume_figure(data: ReportData) -> "go.Figure":
    """Hypervolume after each trial (trial order), with the run's final reference point."""
    import plotly.graph_objects as go

    n = list(range(1, data.n_trials + 1))
    units = " x ".join(metric_label(o.metric) for o in data.objectives)
    ref = ", ".join("n/a" if r is None else f"{r:.6g}" for r in data.reference_point)
    fig = go.Figure(go.Scatter(
        x=n, y=data.hv_history, mode="lines", line=dict(shape="hv", color=FRONT),
        name="hypervolume",
        hovertemplate="after trial %{x}: %{y:.6g}<extra></extra>",
    ))
    fig.update_layout(
        title=esc(f"Hypervolume vs trial number (reference point [{ref}])"),
        xaxis_title="trial number (order the runner recorded)",
        yaxis_title=esc(f"hypervolume [{units}]"),
        height=380, template="plotly_white",
    )
    return fig


def _history_x(history: list[dict]) -> list[float]:
    return [to_float(h.get("epoch", k + 1)) for k, h in enumerate(history)]


def learning_curves_figure(data: ReportData) -> "go.Figure | None":
    """Per-trial learning curves (metric vs epoch) for each objective metric and ``val_loss``
    found in the histories; ``None`` when no trial has a history with those metrics.

    Non-Pareto trials share one grey trace (gaps between trials) so 1,000 trials stay light;
    each Pareto trial gets its own coloured, named trace.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    candidates = [o.metric for o in data.objectives]
    if "val_loss" not in candidates:
        candidates.append("val_loss")
    present = [m for m in candidates
               if any(m in h for t in data.trials for h in t.history)]
    if not present:
        return None
    fig = make_subplots(rows=len(present), cols=1, shared_xaxes=True, vertical_spacing=0.06)
    for row_no, metric in enumerate(present, start=1):
        xs: list[float | None] = []
        ys: list[float | None] = []
        texts: list[str | None] = []
        for t in data.trials:
            if t.pareto or not t.history:
                continue
            for x, h in zip(_history_x(t.history), t.history):
                xs.append(x)
                ys.append(to_float(h.get(metric)))
                texts.append(f"{esc(t.trial_id)} ({esc(t.status)})")
            xs.append(None)
            ys.append(None)
            texts.append(None)
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines", line=dict(color=GREY, width=1), opacity=0.45,
            name="other trials", legendgroup="other", showlegend=(row_no == 1),
            hovertext=texts, hovertemplate="%{hovertext}<br>epoch %{x}: %{y:.6g}<extra></extra>",
            connectgaps=False,
        ), row=row_no, col=1)
        for k, t in enumerate(data.pareto_trials()):
            if not t.history:
                continue
            fig.add_trace(go.Scatter(
                x=_history_x(t.history), y=[to_float(h.get(metric)) for h in t.history],
                mode="lines+markers", name=esc(f"Pareto: {t.trial_id}"),
                line=dict(width=2, dash="dot" if t.stopped else "solid", color=_palette(k)),
                marker=dict(color=_palette(k)), legendgroup=esc(t.trial_id),
                showlegend=(row_no == 1),
                hovertemplate=esc(t.trial_id) + "<br>epoch %{x}: %{y:.6g}<extra></extra>",
            ), row=row_no, col=1)
        fig.update_yaxes(title_text=esc(metric_label(metric)), row=row_no, col=1)
    fig.update_xaxes(title_text="epoch", row=len(present), col=1)
    fig.update_layout(title="Learning curves (Pareto trials coloured; dotted = early-stopped)",
                      height=300 * len(present) + 120, template="plotly_white")
    return fig


def _palette(k: int) -> str:
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
              "#bcbd22", "#7f7f7f", "#d62728"]
    return colors[k % len(colors)]
