"""A self-contained HTML page that opens offline: plotly.js inlined once (in ``<head>``),
one table of hover texts shared by all figures (:class:`Page`), each figure a ``<div>`` plus a
small ``Plotly.newPlot`` script with the figure's JSON, PNGs embedded as ``data:`` URIs.
Nothing is fetched from the network. Used by the single-run page
(:mod:`archsearch.report.html`) and the comparison (:mod:`archsearch.report.compare`).

Escaping: figure strings are escaped where the figure is built (so they hold no ``<`` of
their own), and the figure JSON is written by :func:`script_json`, which also neutralises
``</`` and ``<!--``: a value such as ``</script><script>alert(1)</script>`` can neither end
the ``<script>`` element nor open an HTML comment (checked in ``tests/test_report.py`` by
counting script elements, and in a real browser by ``tests/test_report_browser.py``, hover
labels included).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from typing import Any

from archsearch.report.style import Figure
from archsearch.report.values import esc, jsonable

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

