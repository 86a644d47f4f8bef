"""The page of one run: ONE self-contained ``index.html`` (built with
:class:`archsearch.report.page.Page`): title, headline numbers, the figures, the Pareto
table with a repro command per row, the failed trials, the run's header table and the PNGs.

Escaping: every string that comes from a run (run name, searcher, file names, trial ids,
config keys and values, metric names, error text, the repro command) goes through
``html.escape`` before it reaches the page; figures are escaped where they are built and
serialised safely by :func:`archsearch.report.page.script_json`.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from archsearch.report.data import ReportData
from archsearch.report.page import Page, png_html
from archsearch.report.records import TrialRow
from archsearch.report.style import Figure
from archsearch.report.values import (
    METRIC_UNITS,
    config_json,
    constraints_text,
    esc,
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



def _run_info_rows(data: ReportData) -> list[tuple[str, str]]:
    """(label, already-escaped HTML) rows of the header table."""
    info = data.run_info
    rows: list[tuple[str, str]] = []
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
        rows.append((label, esc(text)))
    stopped = f", {data.n_stopped} early-stopped by ASHA" if data.n_stopped else ""
    infeasible = data.n_successful - data.n_feasible
    subs = ""
    if data.subtrials:
        subs = (f"; {len(data.subtrials)} anytime-curve points of "
                f"{len(data.dynamic_trials())} dynamic trials (sub-trials ID#k)")
        if data.n_dropped_points:
            subs += (f", {data.n_dropped_points} point(s) without objective or constraint "
                     "values left out")
    rows.insert(min(2, len(rows)), (
        "Trials",
        esc(f"{data.n_trials} recorded: {data.n_successful} successful{stopped}, "
            f"{data.n_failed} failed, {infeasible} violate a constraint, "
            f"{data.n_pareto} on the Pareto front{subs}"),
    ))
    objectives = "<br>".join(
        esc(f"{o.metric} ({o.mode})" + (f" [{METRIC_UNITS[o.metric]}]" if o.metric in METRIC_UNITS
                                         else "") + (f", user reference {o.ref:.6g}"
                                                     if o.ref is not None else ""))
        for o in data.objectives
    )
    rows.append(("Objectives", objectives))
    if data.constraints:
        rows.append(("Constraints", esc(constraints_text(data.constraints))))
    ref = ", ".join("n/a" if r is None else f"{o.metric} = {r:.6g}"
                    for o, r in zip(data.objectives, data.reference_point))
    rows.append(("Reference point", esc(ref) + _ref_rule_note(data)))
    units = " x ".join(f"[{METRIC_UNITS.get(o.metric, o.metric)}]" for o in data.objectives)
    rows.append(("Hypervolume", f"<b>{esc(f'{data.hypervolume:.6g}')}</b> "
                 f"<span class=\"note\">{esc(units)}, feasible points only, raw units "
                 f"(not normalised)</span>"))
    for key in sorted(set(info) - set(KNOWN_RUN_INFO) - {"repro_command"}):
        value = info[key]
        text = value if isinstance(value, str) else json.dumps(jsonable(value), sort_keys=True)
        rows.append((esc(key), esc(text)))
    return rows



def _ref_rule_note(data: ReportData) -> str:
    auto = [o.metric for o in data.objectives if o.ref is None]
    if not auto:
        return " <span class=\"note\">(user-given)</span>"
    return (" <span class=\"note\">(" + esc(", ".join(auto)) + ": worst feasible value moved "
            "outward by 10% of the observed range)</span>")


def _kpis(data: ReportData) -> str:
    """A strip of headline numbers: trials, failed, front size, hypervolume, best values."""
    items = [(str(data.n_trials), "trials"), (str(data.n_failed), "failed"),
             (str(data.n_pareto), "on the Pareto front"),
             (f"{data.hypervolume:.4g}", "hypervolume")]
    for k, o in enumerate(data.objectives):
        vals = [data.Y[r.index, k] for r in data.rows if r.feasible]
        if vals:
            best = max(vals) if o.mode == "max" else min(vals)
            items.append((f"{best:.4g}", f"best feasible {o.metric}"))
    return "<div class=\"kpis\">" + "".join(
        f"<div class=\"kpi\"><b>{esc(v)}</b><span>{esc(label)}</span></div>" for v, label in items
    ) + "</div>"


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
    return f"<p class=\"note\">{esc(' | '.join(bits))}</p>"


def metric_cell(value: Any) -> str:
    f = to_float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"<td class=\"num\">{esc(fmt(value) if math.isfinite(f) else str(value))}</td>"
    return f"<td>{esc(fmt(value))}</td>"


def _config_cell(t: TrialRow) -> str:
    """Config as ``key = value`` lines (6 significant digits; the command has the exact
    values), a sub-trial's point settings and the final tying map (escaped)."""
    lines = "\n".join(f"{k} = {fmt(v)}" for k, v in sorted(t.repro_config.items()))
    parts = [f"<pre>{esc(lines)}</pre>"]
    if t.settings:
        parts.append("<b>point settings</b> (inference-time, same trained model):"
                     f"<pre>{esc(json.dumps(jsonable(t.settings), sort_keys=True))}</pre>")
    tying = t.tying_map()
    if tying is not None:
        parts.append(f"<b>tying_map</b> (final, learned):<pre>{esc(json.dumps(jsonable(tying)))}</pre>")
    return "<td>" + "".join(parts) + "</td>"


def _pareto_table(data: ReportData) -> str:
    rows = data.pareto_trials()
    if not rows:
        return "<p>No feasible trial, so there is no Pareto front.</p>"
    metrics = [m for m in data.metric_names(scalar_only=True) if m != "epoch"]
    by_id = {t.trial_id: t for t in data.trials}
    head = ["#", "trial_id", "status", "epochs"] + metrics
    out = ["<table class=\"pareto\"><thead><tr>"]
    out += [f"<th>{esc(h)}</th>" for h in head]
    out += ["<th class=\"cfg\">config</th></tr></thead><tbody>"]
    for k, t in enumerate(rows, start=1):
        trial = by_id[t.parent] if t.is_subtrial else t
        status = esc(t.status)
        if t.stopped:
            status = f"<span class=\"stopped\" title=\"early-stopped by ASHA\">{status}</span>"
        ident = f"<code>{esc(t.trial_id)}</code>"
        if t.is_subtrial:
            ident += (f"<br><span class=\"sub\">anytime point {t.point} of "
                      f"{esc(t.parent)}</span>")
        cells = [f"<td class=\"num\">{k}</td>", f"<td>{ident}</td>",
                 f"<td>{status}</td>", f"<td class=\"num\">{len(trial.history)}</td>"]
        cells += [metric_cell(t.metrics[m]) if m in t.metrics else "<td></td>" for m in metrics]
        cells.append(_config_cell(t))
        cmd = f"<code class=\"cmd\">{esc(repro_command(t.repro_config, data.run_info))}</code>"
        if t.is_subtrial:
            cmd += ("<span class=\"note\">re-trains trial " + esc(t.parent) + "; this point is "
                    "its anytime-curve setting " + esc(json.dumps(jsonable(t.settings),
                                                                  sort_keys=True)) + "</span>")
        out.append("<tr>" + "".join(cells) + "</tr>")
        # the command on its own full-width row: copyable without scrolling sideways
        out.append(f"<tr class=\"cmdrow\"><td></td><td colspan=\"{len(head)}\">"
                   f"<span class=\"note\">reproduce:</span> {cmd}</td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _failed_table(data: ReportData) -> str:
    rows = data.failed_trials()
    if not rows:
        return "<p>No failed trials.</p>"
    out = ["<table class=\"failed\"><thead><tr><th>trial_id</th><th>status</th>"
           "<th>epochs</th><th>error</th><th>config</th></tr></thead><tbody>"]
    for t in rows:
        reason = t.failure_reason or ""
        first, _, rest = reason.partition("\n")
        body = (f"<details><summary>{esc(first)}</summary><pre>{esc(reason)}</pre></details>"
                if rest.strip() else f"<pre>{esc(reason)}</pre>")
        out.append(f"<tr><td><code>{esc(t.trial_id)}</code></td><td>{esc(t.status)}</td>"
                   f"<td class=\"num\">{len(t.history)}</td><td>{body}</td>"
                   f"<td><pre>{esc(config_json(t.config))}</pre></td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


def render_html(
    data: ReportData,
    *,
    figures: Sequence[tuple[str, str, Figure, str]],
    pngs: Sequence[tuple[str, bytes]] = (),
) -> str:
    """The complete page of one run as a string.

    Args:
        data: the computed report.
        figures: ``(section title, div id, plotly spec, note)``, in page order; the title and
            the note (how to read the figure; may be empty) are raw text, escaped here.
        pngs: ``(caption, PNG bytes)`` embedded at the end as ``data:`` images.
    """
    name = data.run_info.get("name") or "archsearch run"
    page = Page()
    nav = [f"<a href=\"#{esc(div_id)}-h\">{esc(title)}</a>" for title, div_id, _, _ in figures]
    nav += ["<a href=\"#pareto-table\">Pareto trials</a>", "<a href=\"#failed\">Failed trials</a>"]
    parts = [f"<h1>archsearch report: {esc(name)}</h1>", _subtitle(data), _kpis(data),
             "<nav>" + "".join(nav) + "</nav>"]
    if data.n_successful == 0:
        parts.append(f"<p class=\"warn\"><b>No successful trials</b> out of {data.n_trials}: "
                     "there is no Pareto front and the hypervolume is 0.0. "
                     "See the failed trials below.</p>")
    elif not any(r.feasible for r in data.rows):
        parts.append("<p class=\"warn\"><b>No trial satisfies the constraints</b>: there is no "
                     "Pareto front and the hypervolume is 0.0.</p>")
    for title, div_id, fig, note in figures:
        parts.append(f"<h2 id=\"{esc(div_id)}-h\">{esc(title)}</h2>")
        if note:
            parts.append(f"<p class=\"note\">{esc(note)}</p>")
        parts.append(page.figure(fig, div_id))
    parts += [f"<h2 id=\"pareto-table\">Pareto trials ({data.n_pareto})</h2>",
              "<p class=\"note\">Best first on the first objective. The command re-runs the "
              "architecture with <code>--fixed</code> (one trial).</p>",
              f"<div class=\"scroll\">{_pareto_table(data)}</div>",
              f"<h2 id=\"failed\">Failed trials ({data.n_failed})</h2>",
              f"<div class=\"scroll\">{_failed_table(data)}</div>",
              "<h2>Run</h2>", "<table class=\"info\">",
              *[f"<tr><th>{label}</th><td>{value}</td></tr>" for label, value in _run_info_rows(data)],
              "</table>",
              "<p class=\"note\">Failed = status ERROR (or RUNNING: unfinished), or an "
              "objective/constraint metric missing or not finite. Feasible = not failed and "
              "within every constraint (bounds inclusive). The Pareto front and hypervolume use "
              "feasible points only, including the anytime-curve points of dynamic trials "
              "(sub-trials ID#k). STOPPED trials were early-stopped by ASHA and report their "
              "last (shorter) epoch. Files next to this page: <code>trials.csv</code>, "
              "<code>pareto.json</code>, <code>pareto.png</code>, "
              "<code>hypervolume.png</code>.</p>"]
    if pngs:
        parts.append("<h2>Static images (matplotlib)</h2>")
        parts += [f"<p class=\"note\">{esc(caption)}</p>{png_html(png, caption)}"
                  for caption, png in pngs]
    return page.render(f"archsearch report: {name}", parts)
