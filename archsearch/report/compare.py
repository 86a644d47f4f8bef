"""One report comparing several runs on the same objectives (``archsearch compare``).

Typical use: searchers (random vs TPE vs AHTO) or gating strategies on one search space. The
page shows every run's hypervolume against trials on one plot, a combined scatter coloured by
run, and a summary table (trials, failed, final hypervolume, best feasible value per
objective, wall time, points each run puts on the combined front).

Fairness rules:

* one reference point for all runs, computed with the usual rule
  (:func:`archsearch.report.pareto.reference_point`) over the **union** of the runs' feasible
  points (including anytime-curve sub-trials); a user ``ref`` is kept when every run gives
  the same one, otherwise that objective falls back to the automatic rule;
* each run's trials are classified with its own constraints (a difference is shown);
* runs must have the same objectives (metric and mode; order may differ): otherwise
  :class:`~archsearch.errors.UserError` naming the run directory.

Files written: ``index.html`` (self-contained, offline), ``compare.png`` (matplotlib:
hypervolume curves and the first objective pair), ``compare.json`` (the summary returned by
:func:`write_comparison`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from archsearch.errors import UserError


@dataclass
class RunInput:
    """One run to compare: what :func:`archsearch.report.write_report` takes, plus the
    directory it came from (named in errors)."""

    run_dir: str
    trials: list[dict[str, Any]]
    objectives: list[dict[str, Any]]
    constraints: dict[str, dict[str, float]] = field(default_factory=dict)
    run_info: dict[str, Any] = field(default_factory=dict)


def load_run(run_dir: str | Path) -> RunInput:
    """Read a run directory (``run.json``, ``space.yaml``, ``trials/*.json``).

    Raises:
        UserError: not a run directory, or its space file is invalid.
    """
    from archsearch.space import load_space
    from archsearch.tune.runner import read_trials

    path = Path(run_dir)
    if not (path / "run.json").is_file() or not (path / "space.yaml").is_file():
        raise UserError("not a run directory (no run.json / space.yaml)", file=str(run_dir))
    try:
        info = json.loads((path / "run.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"unreadable run.json ({e})", file=str(run_dir)) from None
    space = load_space(path / "space.yaml")
    run_info = {"name": info.get("name") or path.name, "searcher": info.get("searcher"),
                "space_file": info.get("space_file") or str(path / "space.yaml"),
                "run_dir": str(run_dir), "wall_time_s": info.get("wall_seconds"),
                "scheduler": space.budget.scheduler}
    if info.get("started"):
        run_info["started"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"]))
    return RunInput(
        run_dir=str(run_dir),
        trials=read_trials(path),
        objectives=[o.model_dump(exclude_none=True) for o in space.objectives],
        constraints={k: v.model_dump(exclude_none=True) for k, v in space.constraints.items()},
        run_info=run_info,
    )


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


def _best(data, k: int) -> float | None:
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
    from archsearch.report import html as report_html
    from archsearch.report import pareto, plots
    from archsearch.report.records import build_report_data, jsonable

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
    png_path = out / "compare.png"
    tmp = png_path.with_name(png_path.name + ".tmp")
    _write_compare_png(labels, datas, tmp)
    os.replace(tmp, png_path)
    title = title or " vs ".join(labels)
    figures = [("Hypervolume vs trials (shared reference point)", "fig-hypervolume",
                _hypervolume_figure(labels, datas)),
               ("All runs' trials, coloured by run", "fig-scatter", _scatter_figure(labels, datas))]
    if len(objectives) >= 3:
        figures.append(("Three objectives (3-D)", "fig-3d", _scatter3d_figure(labels, datas)))
    body = [f"<h1>archsearch comparison: {plots.esc(title)}</h1>",
            "<p class=\"note\">" + plots.esc(
                "objectives " + ", ".join(f"{o['metric']} ({o['mode']})" for o in objectives)
                + " | shared reference point " + ", ".join(
                    "n/a" if r is None else f"{o['metric']} = {r:.6g}"
                    for o, r in zip(objectives, ref))) + "</p>",
            _summary_table(labels, runs, datas, counts)]
    body += [f"<p class=\"warn\">{plots.esc(n)}</p>" for n in notes]
    page = report_html.Page()
    for fig_title, div_id, fig in figures:
        body += [f"<h2>{plots.esc(fig_title)}</h2>", page.figure(fig, div_id)]
    body += ["<h2>Static image (matplotlib)</h2>",
             report_html.png_html(png_path.read_bytes(), "hypervolume curves and trials by run"),
             "<p class=\"note\">Hypervolumes are in raw objective units with the one reference "
             "point above, so they compare across the runs on this page (not with other pages). "
             "Feasible points only, including anytime-curve points of dynamic trials. "
             "\"On the combined front\": points of the run that no point of any run dominates."
             "</p>"]
    _atomic(out / "index.html", page.render(f"archsearch comparison: {title}", body).encode("utf-8"))
    _atomic(out / "compare.json",
            json.dumps(summary, indent=2, allow_nan=False).encode("utf-8") + b"\n")
    return summary


def compare_runs(run_dirs: Sequence[str | Path], *, out: str | Path | None = None,
                 reports: str | Path = "reports") -> tuple[Path, dict[str, Any]]:
    """Load run directories and write their comparison (``archsearch compare``).

    ``out`` defaults to ``reports/compare-NAME1-vs-NAME2...``.

    Returns:
        (report directory, summary of :func:`write_comparison`).

    Raises:
        UserError: fewer than two runs, a directory that is not a run, differing objectives.
    """
    if len(run_dirs) < 2:
        raise UserError(f"compare needs at least two run directories, got {len(run_dirs)}",
                        field="RUN_DIRS")
    runs = [load_run(d) for d in run_dirs]
    if out is None:
        names = "-vs-".join(Path(r.run_dir).name for r in runs)
        out = Path(reports) / f"compare-{names}"[:120]
    summary = write_comparison(runs, out)
    return Path(out), summary


def _atomic(path: Path, payload: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(payload)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# page pieces
# --------------------------------------------------------------------------------------------


def _summary_table(labels, runs, datas, counts) -> str:
    from archsearch.report.html import constraints_text, format_seconds
    from archsearch.report.plots import esc, palette
    from archsearch.report.records import to_float

    objs = datas[0].objectives
    head = (["run", "searcher", "trials", "failed", "Pareto points", "on the combined front",
             "final hypervolume"] + [f"best {o.metric} ({o.mode})" for o in objs]
            + ["wall time", "constraints", "run directory"])
    out = ["<table class=\"compare\"><thead><tr>"] + [f"<th>{esc(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    best_hv = max(d.hypervolume for d in datas)
    for k, (label, run, d, count) in enumerate(zip(labels, runs, datas, counts)):
        wall = to_float(run.run_info.get("wall_time_s"))
        hv = f"{d.hypervolume:.6g}"
        hv_cell = f"<b>{esc(hv)}</b>" if d.hypervolume == best_hv and best_hv > 0 else esc(hv)
        cells = [f"<td><span style=\"color:{palette(k)}\">&#9632;</span> {esc(label)}</td>",
                 f"<td>{esc(run.run_info.get('searcher') or '')}</td>",
                 f"<td class=\"num\">{d.n_trials}</td>", f"<td class=\"num\">{d.n_failed}</td>",
                 f"<td class=\"num\">{d.n_pareto}</td>", f"<td class=\"num\">{count}</td>",
                 f"<td class=\"num\">{hv_cell}</td>"]
        for j in range(len(objs)):
            b = _best(d, j)
            cells.append(f"<td class=\"num\">{esc('n/a' if b is None else f'{b:.6g}')}</td>")
        cells += [f"<td class=\"num\">{esc(format_seconds(wall)) if math.isfinite(wall) else ''}</td>",
                  f"<td>{esc(constraints_text(d.constraints)) or 'none'}</td>",
                  f"<td><code>{esc(run.run_dir)}</code></td>"]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _hypervolume_figure(labels, datas) -> dict:
    from archsearch.report.plots import base_layout, esc, hypervolume_units, nums, palette

    traces = [{"type": "scatter", "x": list(range(1, d.n_trials + 1)), "y": nums(d.hv_history),
               "mode": "lines", "name": esc(label),
               "line": {"shape": "hv", "color": palette(k), "width": 2},
               "hovertemplate": esc(label) + ": after trial %{x}: %{y:.6g}<extra></extra>"}
              for k, (label, d) in enumerate(zip(labels, datas))]
    layout = base_layout(esc("Hypervolume after each trial, in "
                             f"{hypervolume_units(datas[0])}, one reference point for all runs"),
                         420)
    layout["xaxis"] = {"title": {"text": "trial number"}, "gridcolor": "#e8e8e8", "zeroline": False}
    layout["yaxis"] = {"title": {"text": "hypervolume"}, "gridcolor": "#e8e8e8",
                       "zeroline": False, "automargin": True}
    layout["legend"] = {"orientation": "v", "x": 1.01, "y": 1.0}
    layout["margin"]["r"] = 180
    return {"data": traces, "layout": layout}


def _run_hovers(label: str, data, rows) -> list[str]:
    from archsearch.report.plots import esc, hover_text

    return [f"<b>{esc(label)}</b><br>" + hover_text(data, r) for r in rows]


def _scatter_figure(labels, datas) -> dict:
    """Objective pairs; one colour per run; each run's front larger and joined (2 objectives);
    infeasible points as crosses."""
    from archsearch.report.plots import (
        axis_layout,
        axis_title,
        base_layout,
        esc,
        front_step,
        nums,
        pairs,
        palette,
        panel_grid,
        symbol_of,
        use_log,
    )

    objs = datas[0].objectives
    m = len(objs)
    pair_list = pairs(m) if m >= 2 else [(0, None)]
    grid = panel_grid(len(pair_list))
    n_rows = math.ceil(len(pair_list) / 3)
    layout = base_layout("Trials of every run (large = on that run's front; cross = violates a "
                         "constraint; diamond = anytime-curve point)", 430 * n_rows + 140)
    traces = []
    for p, ((i, j), panel) in enumerate(zip(pair_list, grid)):
        for k, (label, d) in enumerate(zip(labels, datas)):
            color = palette(k)
            trial_no = {t.trial_id: t.index + 1 for t in d.trials}
            for part, rows, size, base in (
                ("trials", [r for r in d.rows if not r.failed and not r.pareto and r.feasible], 6,
                 "circle"),
                ("infeasible", [r for r in d.rows if not r.failed and not r.feasible], 6, "x"),
                ("front", [r for r in d.rows if r.pareto], 10, "circle"),
            ):
                if not rows:
                    continue
                idx = [r.index for r in rows]
                xs = (d.Y[idx, j] if j is not None
                      else np.array([trial_no[r.parent or r.trial_id] for r in rows], float))
                ys = d.Y[idx, i]
                mode, line = "markers", None
                if part == "front" and m == 2:
                    order = np.argsort(xs, kind="stable")
                    rows = [rows[o] for o in order]
                    xs, ys = xs[order], ys[order]
                    mode = "markers+lines"
                    line = {"color": color, "shape": front_step(objs[j].mode)[1], "width": 1.5}
                marker = {"color": color, "size": size,
                          "symbol": [symbol_of(r, base) for r in rows],
                          "opacity": 1.0 if part == "front" else 0.55}
                if part == "front":
                    marker["line"] = {"color": "black", "width": 0.8}
                trace = {"type": "scatter", "x": nums(xs), "y": nums(ys), "mode": mode,
                         "name": esc(f"{label}: {part} ({len(rows)})"), "marker": marker,
                         "hovertext": _run_hovers(label, d, rows),
                         "hovertemplate": "%{hovertext}<extra></extra>",
                         "xaxis": panel["xref"], "yaxis": panel["yref"],
                         "legendgroup": esc(f"{label}-{part}"), "showlegend": p == 0}
                if line:
                    trace["line"] = line
                traces.append(trace)
        oy = objs[i]
        layout[panel["ykey"]] = axis_layout(axis_title(oy), use_log(oy.metric, np.concatenate(
            [d.Y[:, i] for d in datas])), panel["ydomain"], panel["xref"])
        if j is None:
            layout[panel["xkey"]] = axis_layout("trial number", False, panel["xdomain"], panel["yref"])
        else:
            ox = objs[j]
            layout[panel["xkey"]] = axis_layout(axis_title(ox), use_log(ox.metric, np.concatenate(
                [d.Y[:, j] for d in datas])), panel["xdomain"], panel["yref"])
    layout["legend"] = {"orientation": "v", "x": 1.01, "y": 1.0}
    layout["margin"]["r"] = 220
    return {"data": traces, "layout": layout}


def _scatter3d_figure(labels, datas) -> dict:
    from archsearch.report.plots import axis_title, base_layout, esc, nums, palette, use_log

    cols = (1, 2, 0)
    objs = datas[0].objectives
    traces = []
    for k, (label, d) in enumerate(zip(labels, datas)):
        rows = [r for r in d.rows if not r.failed]
        idx = [r.index for r in rows]
        traces.append({
            "type": "scatter3d", "mode": "markers", "name": esc(label),
            "x": nums(d.Y[idx, cols[0]]), "y": nums(d.Y[idx, cols[1]]), "z": nums(d.Y[idx, cols[2]]),
            "marker": {"color": palette(k), "size": [7 if r.pareto else 3 for r in rows],
                       "opacity": 0.85},
            "hovertext": _run_hovers(label, d, rows), "hovertemplate": "%{hovertext}<extra></extra>"})
    scene = {}
    for axis, c in zip(("xaxis", "yaxis", "zaxis"), cols):
        vals = np.concatenate([d.Y[:, c] for d in datas])
        scene[axis] = {"title": {"text": axis_title(objs[c])},
                       "type": "log" if use_log(objs[c].metric, vals) else "linear"}
    layout = base_layout("First three objectives, coloured by run (large = on that run's front)",
                         620)
    layout["scene"] = scene
    layout["legend"] = {"orientation": "v", "x": 1.0, "y": 0.9}
    return {"data": traces, "layout": layout}


def _write_compare_png(labels, datas, path: Path) -> None:
    """Left: hypervolume curves; right: the first objective pair, coloured by run."""
    from archsearch.report.plots import (
        front_step,
        hypervolume_units,
        mpl_text,
        new_figure,
        palette,
        use_log,
    )
    from archsearch.report.records import metric_label

    fig = new_figure(13.0, 4.8)
    ax_hv, ax_sc = fig.subplots(1, 2)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.13, top=0.9, wspace=0.25)
    for k, (label, d) in enumerate(zip(labels, datas)):
        ax_hv.step(np.arange(1, d.n_trials + 1), np.asarray(d.hv_history, float), where="post",
                   lw=1.8, color=palette(k), label=mpl_text(label))
    ax_hv.set_xlabel("trial number")
    ax_hv.set_ylabel("hypervolume")
    ax_hv.set_title(mpl_text("Hypervolume vs trials (shared reference point)\n"
                             f"[{hypervolume_units(datas[0])}]"), fontsize=9)
    ax_hv.grid(True, alpha=0.3)
    ax_hv.legend(fontsize=8, loc="lower right")
    objs = datas[0].objectives
    if len(objs) >= 2:
        i, j = 0, 1
        for k, d in enumerate(datas):
            ok = [r.index for r in d.rows if r.feasible]
            front = sorted((r.index for r in d.rows if r.pareto), key=lambda q: d.Y[q, j])
            ax_sc.scatter(d.Y[ok, j], d.Y[ok, i], s=14, color=palette(k), alpha=0.45)
            if front:
                ax_sc.step(d.Y[front, j], d.Y[front, i], where=front_step(objs[j].mode)[0],
                           color=palette(k), lw=1.5)
                ax_sc.scatter(d.Y[front, j], d.Y[front, i], s=40, color=palette(k),
                              edgecolors="black", linewidths=0.6, zorder=3)
        allx = np.concatenate([d.Y[:, j] for d in datas])
        if use_log(objs[j].metric, allx):
            ax_sc.set_xscale("log")
        ax_sc.set_xlabel(mpl_text(f"{metric_label(objs[j].metric)} ({objs[j].mode})"))
        ax_sc.set_ylabel(mpl_text(f"{metric_label(objs[i].metric)} ({objs[i].mode})"))
        ax_sc.set_title("Feasible points by run (large = that run's front)", fontsize=10)
        ax_sc.grid(True, alpha=0.3)
    else:
        ax_sc.set_axis_off()
    fig.savefig(path, dpi=100, format="png")
