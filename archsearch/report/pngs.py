"""The static matplotlib PNGs of a report (``pareto.png``, ``hypervolume.png``,
``compare.png``), returned as PNG bytes for the caller to write and to embed in the page.

Same marker legend and colours as the interactive figures (:mod:`archsearch.report.style`).
matplotlib is imported inside the functions, on the Agg canvas (no pyplot, no global backend
state).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import numpy as np

from archsearch.report.data import ReportData
from archsearch.report.records import TrialRow
from archsearch.report.style import (
    ANYTIME,
    FRONT,
    GREY,
    INFEASIBLE,
    MAX_NAMED_CURVES,
    STATIC_FRONT,
    STATIC_FRONT_NAME,
    anytime_curves,
    front_step,
    hypervolume_units,
    pairs,
    panel_points,
    palette,
    static_front,
    use_log,
)
from archsearch.report.values import metric_label, mpl_text


def _trial_title(data: ReportData) -> str:
    name = data.run_info.get("name") or "archsearch run"
    return (f"{name}: {data.n_trials} trials, {data.n_failed} failed, "
            f"hypervolume {data.hypervolume:.6g}")


def new_figure(width: float, height: float):
    """A matplotlib Figure on the Agg canvas (no pyplot, no global backend state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig, dpi: int = 100) -> bytes:
    """The figure rendered as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png")
    return buf.getvalue()


def pareto_png(data: ReportData, *, dpi: int = 100) -> bytes:
    """The static Pareto plot (one panel per objective pair, anytime curves as lines) as PNG
    bytes. With no successful trial the image says so.

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
    return png_bytes(fig, dpi)


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
    static = static_front(data, y_obj, x_obj)
    if static is not None:  # beneath the points, as in the interactive scatter
        _, sx, sy, _ = static
        ax.step(sx, sy, where=front_step(ox.mode)[0], color=STATIC_FRONT, lw=1.5, ls="--",
                zorder=1.5, label=STATIC_FRONT_NAME)
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
    """One objective: value per trial number (an anytime curve's sub-trials at their trial's
    number, as in the interactive figure), best-so-far step line, best point highlighted."""
    obj = data.objectives[0]
    rows = data.rows
    _, n, y, _ = panel_points(data, rows, 0, None)
    feas = np.array([t.feasible for t in rows])
    infeas = np.array([not t.failed and not t.feasible for t in rows])
    best = np.array([t.pareto for t in rows])
    sel = feas & ~best
    _png_scatter(ax, n[sel], y[sel], [r for r, s in zip(rows, sel) if s], GREY, 22,
                 f"feasible ({int(sel.sum())})", alpha=0.7)
    if infeas.any():
        ax.scatter(n[infeas], y[infeas], marker="x", c=INFEASIBLE, s=26,
                   label=f"violates a constraint ({int(infeas.sum())})")
    sign = 1.0 if obj.mode == "max" else -1.0
    per_trial = np.full(data.n_trials, -np.inf)  # the best feasible value of each trial's points
    np.fmax.at(per_trial, n[feas].astype(int) - 1, sign * y[feas])
    running = sign * np.fmax.accumulate(per_trial)
    running[~np.isfinite(running)] = np.nan
    ax.step(np.arange(1, data.n_trials + 1), running, where="post", color=FRONT, lw=1.5,
            label="best trial so far")
    _png_scatter(ax, n[best], y[best], [r for r, b in zip(rows, best) if b], FRONT, 60,
                 "best trial", zorder=4)
    if data.reference_point[0] is not None:
        ax.axhline(data.reference_point[0], color="black", lw=0.8, ls=":", label="reference")
    if use_log(obj.metric, y):
        ax.set_yscale("log")
    ax.set_xlabel("trial number")
    ax.set_ylabel(mpl_text(f"{metric_label(obj.metric)} ({obj.mode})"))
    ax.grid(True, alpha=0.3)


def draw_hypervolume(ax, curves: Sequence[tuple[str, Sequence[float]]], units: str,
                     title: str) -> None:
    """Hypervolume-vs-trials step curves on ``ax``, one per ``(label, history)`` (history:
    one value per trial, in ``units``); a legend when there are several."""
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


def hypervolume_png(curves: Sequence[tuple[str, Sequence[float]]], units: str, *, title: str,
                    dpi: int = 100) -> bytes:
    """``hypervolume.png``: :func:`draw_hypervolume` alone, as PNG bytes."""
    fig = new_figure(7.5, 4.2)
    ax = fig.subplots()
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.13, top=0.9)
    draw_hypervolume(ax, curves, units, title)
    return png_bytes(fig, dpi)


def compare_png(labels: Sequence[str], datas: Sequence[ReportData], *, dpi: int = 100) -> bytes:
    """``compare.png`` of several runs (``labels[k]`` names ``datas[k]``), as PNG bytes.
    Left: hypervolume curves (shared reference point); right: :func:`draw_runs_scatter`."""
    fig = new_figure(13.0, 4.8)
    ax_hv, ax_sc = fig.subplots(1, 2)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.13, top=0.9, wspace=0.25)
    draw_hypervolume(ax_hv, [(label, d.hv_history) for label, d in zip(labels, datas)],
                     hypervolume_units(datas[0]), "Hypervolume vs trials (shared reference point)")
    draw_runs_scatter(ax_sc, datas)
    return png_bytes(fig, dpi)


def draw_runs_scatter(ax, datas: Sequence[ReportData]) -> None:
    """The first objective pair of several runs, coloured by run, each run's front large; with
    exactly two objectives each front joined by its attainment line (with more, the projection
    of a front zigzags through points dominated in this plane, so no line: as ``pareto.png``
    and the page). Nothing with one objective (the axes are hidden)."""
    objs = datas[0].objectives
    if len(objs) >= 2:
        i, j = 0, 1
        for k, d in enumerate(datas):
            ok = [r.index for r in d.rows if r.feasible]
            front = sorted((r.index for r in d.rows if r.pareto), key=lambda q: d.Y[q, j])
            ax.scatter(d.Y[ok, j], d.Y[ok, i], s=14, color=palette(k), alpha=0.45)
            if front and len(objs) == 2:
                ax.step(d.Y[front, j], d.Y[front, i], where=front_step(objs[j].mode)[0],
                        color=palette(k), lw=1.5)
            if front:
                ax.scatter(d.Y[front, j], d.Y[front, i], s=40, color=palette(k),
                           edgecolors="black", linewidths=0.6, zorder=3)
        allx = np.concatenate([d.Y[:, j] for d in datas])
        if use_log(objs[j].metric, allx):
            ax.set_xscale("log")
        ax.set_xlabel(mpl_text(f"{metric_label(objs[j].metric)} ({objs[j].mode})"))
        ax.set_ylabel(mpl_text(f"{metric_label(objs[i].metric)} ({objs[i].mode})"))
        ax.set_title("Feasible points by run (large = that run's front)", fontsize=10)
        ax.grid(True, alpha=0.3)
    else:
        ax.set_axis_off()
