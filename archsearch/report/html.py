"""The report page: ONE self-contained ``index.html`` that opens offline.

plotly.js is inlined once (in ``<head>``), with one table of hover texts shared by all
figures (:class:`Page`); each figure is a ``<div>`` plus a small ``Plotly.newPlot`` script
with the figure's JSON; PNGs are embedded as ``data:`` URIs.
Nothing is fetched from the network.

Escaping: every string that comes from a run (run name, searcher, file names, trial ids,
config keys and values, metric names, error text, the repro command) goes through
``html.escape`` before it reaches the page. Figure strings are escaped by
:mod:`archsearch.report.plots` (so they hold no ``<`` of their own), and the figure JSON is
written by :func:`script_json`, which also neutralises ``</`` and ``<!--``: a value such as
``</script><script>alert(1)</script>`` can neither end the ``<script>`` element nor open an
HTML comment (checked in ``tests/test_report.py`` by counting script elements, and in a real
browser by ``tests/test_report_browser.py``, hover labels included).
"""

from __future__ import annotations

import base64
import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from archsearch.report.plots import Figure, esc, fmt
from archsearch.report.records import (
    METRIC_UNITS,
    ReportData,
    TrialRow,
    config_json,
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

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1rem auto;
max-width:1400px;padding:0 1rem;color:#222;background:#fff}
h1{font-size:1.45rem;margin:.2rem 0 .4rem} h2{font-size:1.15rem;margin-top:1.6rem;
border-bottom:1px solid #ddd;padding-bottom:.2rem}
table{border-collapse:collapse;font-size:.82rem;margin:.5rem 0}
th,td{border:1px solid #ddd;padding:.22rem .45rem;vertical-align:top;text-align:left}
th{background:#f4f6f8} table.info th{width:14rem}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
pre,code{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.78rem}
pre{margin:0;white-space:pre-wrap;word-break:break-word;max-width:40rem}
code.cmd{white-space:pre-wrap;word-break:break-all;background:#f6f8fa;padding:.15rem .3rem}
tr.cmdrow td{border-top:none;padding-bottom:.5rem}
.warn{background:#fff4e5;border:1px solid #f0b35a;padding:.6rem 1rem}
.note{color:#555;font-size:.82rem} .stopped{color:#a15c00;font-weight:600}
.sub{color:#0e7c66;font-weight:600}
.kpis{display:flex;flex-wrap:wrap;gap:.6rem;margin:.4rem 0 .8rem}
.kpi{border:1px solid #dde3ea;border-radius:6px;padding:.35rem .8rem;background:#f8fafc}
.kpi b{display:block;font-size:1.15rem} .kpi span{color:#555;font-size:.78rem}
nav a{margin-right:.9rem;font-size:.85rem}
img.png{max-width:100%;border:1px solid #eee}
.plot{width:100%}
.scroll{overflow-x:auto;max-width:100%} th.cfg{min-width:11rem}
table.pareto th{position:sticky;top:0}
details summary{cursor:pointer}
"""


def script_json(obj: Any) -> str:
    """JSON for inside a ``<script>`` element: NaN/inf -> ``null``, non-ASCII as ``\\u``
    escapes, and the only sequences that could end the element or change how it is parsed
    (HTML spec, "restrictions for contents of script elements") neutralised: ``</`` becomes
    ``<\\/`` and ``<!--`` becomes ``\\u003c!--`` (both still valid JSON and JS). Text in
    figures is ``html.escape``-d before this, so user strings carry no ``<`` at all.

    Raises:
        TypeError: an object ``json`` cannot serialise (figures hold plain data only).
    """
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=True, allow_nan=True)
    if "NaN" in text or "Infinity" in text:  # only outside strings if produced by json.dumps
        text = json.dumps(jsonable(obj), separators=(",", ":"), ensure_ascii=True,
                          allow_nan=False)
    text = text.replace("</", "<\\/").replace("<!--", "\\u003c!--")
    return _SCRIPT_OPEN.sub("\\\\u003c\\1", text)


_SCRIPT_OPEN = re.compile(r"<(script)", re.IGNORECASE)


def plotly_js() -> str:
    """The plotly.js bundle shipped with the ``plotly`` package (read once, ~4.8 MB)."""
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    return js.replace("</script", "<\\/script")  # never seen in the bundle; cheap insurance


class Page:
    """Builds one page: figures share one table of hover texts.

    Hover texts are most of a big report's bytes and recur (every 2-D projection and the
    3-D view show the same trials; learning curves repeat a trial's label per epoch), so
    each distinct string is stored once in ``window.ASH_HOVER`` and traces carry indices
    (``"_h"``) that a few lines of JS expand before ``Plotly.newPlot``.
    """

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self.hover: list[str] = []
        self.n_figures = 0

    def _index(self, text: Any) -> int | None:
        if text is None:
            return None
        text = str(text)
        k = self._ids.get(text)
        if k is None:
            k = self._ids[text] = len(self.hover)
            self.hover.append(text)
        return k

    def figure(self, fig: Figure, div_id: str) -> str:
        """A figure as ``<div>`` + ``Plotly.newPlot`` script."""
        self.n_figures += 1
        data = []
        for trace in fig["data"]:
            texts = trace.get("hovertext")
            if isinstance(texts, list):
                trace = {k: v for k, v in trace.items() if k != "hovertext"}
                trace["_h"] = [self._index(t) for t in texts]
            data.append(trace)
        div = esc(div_id)
        config = {"displaylogo": False, "responsive": True}
        return (f"<div id=\"{div}\" class=\"plot\"></div>\n<script>(function(){{"
                f"var d={script_json(data)},H=window.ASH_HOVER;"
                "d.forEach(function(t){if(t._h){t.hovertext=t._h.map(function(k){"
                "return k===null?null:H[k]});delete t._h}});"
                f"Plotly.newPlot({script_json(div_id)},d,{script_json(fig['layout'])},"
                f"{script_json(config)})}})();</script>")

    def render(self, title: str, body: Sequence[str]) -> str:
        """The whole page. ``title`` is raw text (escaped here); ``body`` parts are HTML
        (figures from :meth:`figure`). plotly.js and the hover table are inlined in
        ``<head>`` only when the page has figures."""
        head = ["<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
                "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">",
                f"<title>{esc(title)}</title><style>{CSS}</style>"]
        if self.n_figures:
            head.append(f"<script>{plotly_js()}</script>")
            head.append(f"<script>window.ASH_HOVER={script_json(self.hover)};</script>")
        return "\n".join(head + ["</head><body>", *body, "</body></html>\n"])


def png_html(png: bytes, alt: str) -> str:
    b64 = base64.b64encode(png).decode("ascii")
    return f"<img class=\"png\" alt=\"{esc(alt)}\" src=\"data:image/png;base64,{b64}\">"


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


def constraints_text(constraints: Mapping[str, Mapping[str, float]]) -> str:
    """``params_trainable <= 2e+06; latency_ms >= ...`` (raw text, not escaped)."""
    return "; ".join(
        " and ".join(f"{metric} {'<=' if k == 'max' else '>='} {v:.6g}" for k, v in bounds.items())
        for metric, bounds in constraints.items())


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
