"""The report page: ONE self-contained ``index.html`` that opens offline.

plotly.js is inlined once (with the first plotly figure); the PNG is embedded as a ``data:``
URI. Nothing is fetched from the network.

Escaping: every string that comes from the run (run name, searcher, file names, trial ids,
config keys and values, metric names, error text, the repro command) goes through
``html.escape`` before it reaches the page. Plotly figures carry only pre-escaped strings, and
plotly's ``to_html`` additionally writes its JSON with ``<``, ``>`` and ``/`` as ``\\u003c``,
``\\u003e``, ``\\u002f`` (checked in ``tests/test_report.py``), so a value such as
``</script><script>alert(1)</script>`` cannot end the ``<script>`` element.
"""

from __future__ import annotations

import base64
import json
import math
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from archsearch.report.plots import esc, fmt
from archsearch.report.records import METRIC_UNITS, ReportData, config_json, jsonable, to_float

if TYPE_CHECKING:  # pragma: no cover
    import plotly.graph_objects as go

#: Default command that re-runs one trial with a fixed config. ``{space}`` and
#: ``{config_json}`` are replaced by shell-quoted values.
DEFAULT_REPRO_TEMPLATE = "archsearch search {space} --trials 1 --fixed {config_json}"

#: run_info keys shown first in the header, with their labels (other keys follow, sorted).
KNOWN_RUN_INFO = {
    "name": "Run",
    "searcher": "Searcher",
    "space_file": "Search space",
    "scheduler": "Scheduler",
    "wall_time_s": "Wall time",
    "wall_time": "Wall time",
    "latency_batch_size": "Latency measured at batch size",
    "started": "Started",
    "finished": "Finished",
}

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5rem auto;
max-width:1280px;padding:0 1rem;color:#222}
h1{font-size:1.5rem;margin-bottom:.3rem} h2{font-size:1.2rem;margin-top:2rem;
border-bottom:1px solid #ddd;padding-bottom:.2rem}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0}
th,td{border:1px solid #ddd;padding:.25rem .5rem;vertical-align:top;text-align:left}
th{background:#f4f6f8} table.info th{width:16rem}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
pre,code{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.8rem}
pre{margin:0;white-space:pre-wrap;word-break:break-word;max-width:60rem}
code.cmd{display:block;white-space:pre-wrap;word-break:break-all;background:#f6f8fa;
padding:.3rem;max-width:34rem}
.warn{background:#fff4e5;border:1px solid #f0b35a;padding:.6rem 1rem}
.note{color:#555;font-size:.85rem} .stopped{color:#a15c00;font-weight:600}
img.pareto{max-width:100%;border:1px solid #eee}
"""


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


def format_seconds(seconds: float) -> str:
    """``3723.4`` -> ``"1 h 02 min 03 s (3723.4 s)"``."""
    if not math.isfinite(seconds):
        return str(seconds)
    whole = int(round(seconds))
    h, rest = divmod(whole, 3600)
    mnt, s = divmod(rest, 60)
    if h:
        short = f"{h} h {mnt:02d} min {s:02d} s"
    elif mnt:
        short = f"{mnt} min {s:02d} s"
    else:
        return f"{seconds:.1f} s"
    return f"{short} ({seconds:.1f} s)"


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
    rows.insert(min(2, len(rows)), (
        "Trials",
        esc(f"{data.n_trials} recorded: {data.n_successful} successful{stopped}, "
            f"{data.n_failed} failed, {infeasible} violate a constraint, "
            f"{sum(t.pareto for t in data.trials)} on the Pareto front"),
    ))
    objectives = "<br>".join(
        esc(f"{o.metric} ({o.mode})" + (f" [{METRIC_UNITS[o.metric]}]" if o.metric in METRIC_UNITS
                                         else "") + (f", user reference {o.ref:.6g}"
                                                     if o.ref is not None else ""))
        for o in data.objectives
    )
    rows.append(("Objectives", objectives))
    if data.constraints:
        cons = "<br>".join(
            esc(" and ".join(f"{metric} {'<=' if k == 'max' else '>='} {v:.6g}"
                             for k, v in bounds.items()))
            for metric, bounds in data.constraints.items()
        )
        rows.append(("Constraints", cons))
    ref = ", ".join("n/a" if r is None else f"{o.metric} = {r:.6g}"
                    for o, r in zip(data.objectives, data.reference_point))
    rows.append(("Reference point", esc(ref) + _ref_rule_note(data)))
    units = " x ".join(f"[{METRIC_UNITS.get(o.metric, o.metric)}]" for o in data.objectives)
    rows.append(("Hypervolume", f"<b>{esc(f'{data.hypervolume:.6g}')}</b> "
                 f"<span class='note'>{esc(units)}, feasible trials only, raw units "
                 f"(not normalised)</span>"))
    for key in sorted(set(info) - set(KNOWN_RUN_INFO) - {"repro_command"}):
        value = info[key]
        text = value if isinstance(value, str) else json.dumps(jsonable(value), sort_keys=True)
        rows.append((esc(key), esc(text)))
    return rows


def _ref_rule_note(data: ReportData) -> str:
    auto = [o.metric for o in data.objectives if o.ref is None]
    if not auto:
        return " <span class='note'>(user-given)</span>"
    return (" <span class='note'>(" + esc(", ".join(auto)) + ": worst feasible value moved "
            "outward by 10% of the observed range)</span>")


def _metric_cell(value: Any) -> str:
    f = to_float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"<td class='num'>{esc(fmt(value) if math.isfinite(f) else str(value))}</td>"
    return f"<td>{esc(fmt(value))}</td>"


def _pareto_table(data: ReportData) -> str:
    rows = data.pareto_trials()
    if not rows:
        return "<p>No feasible trial, so there is no Pareto front.</p>"
    metrics = data.metric_names()
    head = ["#", "trial_id", "status", "epochs"] + metrics + ["config", "command to reproduce"]
    out = ["<table class='pareto'><thead><tr>"]
    out += [f"<th>{esc(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for k, t in enumerate(rows, start=1):
        status = esc(t.status)
        if t.stopped:
            status = f"<span class='stopped' title='early-stopped by ASHA'>{status}</span>"
        cells = [f"<td class='num'>{k}</td>", f"<td><code>{esc(t.trial_id)}</code></td>",
                 f"<td>{status}</td>", f"<td class='num'>{len(t.history)}</td>"]
        cells += [_metric_cell(t.metrics[m]) if m in t.metrics else "<td></td>" for m in metrics]
        cfg = json.dumps(jsonable(t.config), indent=1, sort_keys=True)
        cells.append(f"<td><pre>{esc(cfg)}</pre></td>")
        cells.append(f"<td><code class='cmd'>{esc(repro_command(t.config, data.run_info))}</code></td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _failed_table(data: ReportData) -> str:
    rows = data.failed_trials()
    if not rows:
        return "<p>No failed trials.</p>"
    out = ["<table class='failed'><thead><tr><th>trial_id</th><th>status</th>"
           "<th>epochs</th><th>error</th><th>config</th></tr></thead><tbody>"]
    for t in rows:
        reason = t.failure_reason or ""
        first, _, rest = reason.partition("\n")
        body = (f"<details><summary>{esc(first)}</summary><pre>{esc(reason)}</pre></details>"
                if rest.strip() else f"<pre>{esc(reason)}</pre>")
        cfg = config_json(t.config)
        out.append(f"<tr><td><code>{esc(t.trial_id)}</code></td><td>{esc(t.status)}</td>"
                   f"<td class='num'>{len(t.history)}</td><td>{body}</td>"
                   f"<td><pre>{esc(cfg)}</pre></td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _figure_html(fig: "go.Figure", div_id: str, first: bool) -> str:
    """Figure as a <div>; plotly.js inlined only for the first one (offline, no CDN)."""
    return fig.to_html(
        full_html=False,
        include_plotlyjs=True if first else False,
        include_mathjax=False,
        div_id=div_id,
        config={"displaylogo": False, "responsive": True},
    )


def render_html(
    data: ReportData,
    *,
    png_bytes: bytes | None,
    figures: list[tuple[str, str, "go.Figure"]],
) -> str:
    """The complete page as a string.

    Args:
        data: the computed report.
        png_bytes: the static Pareto PNG to embed (``None``: no image section).
        figures: ``(section title, div id, plotly figure)``, in page order; titles and ids
            are ours (escaped anyway).
    """
    name = data.run_info.get("name") or "archsearch run"
    parts = [
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>{esc(f'archsearch report: {name}')}</title><style>{CSS}</style></head><body>",
        f"<h1>archsearch report: {esc(name)}</h1>",
        "<table class='info'>",
        *[f"<tr><th>{label}</th><td>{value}</td></tr>" for label, value in _run_info_rows(data)],
        "</table>",
        "<p class='note'>Failed = status ERROR or an objective/constraint metric missing or "
        "not finite. Feasible = not failed and within every constraint (bounds inclusive). "
        "The Pareto front and hypervolume use feasible trials only. STOPPED trials were "
        "early-stopped by ASHA and report their last (shorter) epoch. Files next to this page: "
        "<code>trials.csv</code>, <code>pareto.json</code>, <code>pareto.png</code>.</p>",
    ]
    if data.n_successful == 0:
        parts.append(f"<p class='warn'><b>No successful trials</b> out of {data.n_trials}: "
                     "there is no Pareto front and the hypervolume is 0.0. "
                     "See the failed trials below.</p>")
    elif data.n_feasible == 0:
        parts.append("<p class='warn'><b>No trial satisfies the constraints</b>: there is no "
                     "Pareto front and the hypervolume is 0.0.</p>")
    if png_bytes is not None:
        b64 = base64.b64encode(png_bytes).decode("ascii")
        parts += ["<h2>Pareto front (static)</h2>",
                  f"<img class='pareto' alt='Pareto front' src='data:image/png;base64,{b64}'>"]
    for k, (title, div_id, fig) in enumerate(figures):
        parts += [f"<h2>{esc(title)}</h2>", _figure_html(fig, esc(div_id), first=(k == 0))]
    parts += [f"<h2>Pareto trials ({sum(t.pareto for t in data.trials)})</h2>",
              _pareto_table(data),
              f"<h2>Failed trials ({data.n_failed})</h2>", _failed_table(data),
              "</body></html>\n"]
    return "\n".join(parts)
