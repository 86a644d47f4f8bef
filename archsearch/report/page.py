"""The page shell shared by the single-run page (:mod:`archsearch.report.html`) and the
comparison (:mod:`archsearch.report.compare`): jinja2 templates with autoescape on
(``archsearch/report/templates/*.html.j2``, package data), plotly.js written once per report
directory as ``plotly.min.js`` and loaded with a relative ``<script src>``, one table of hover
texts shared by all figures (:class:`Page`), each figure a ``<div>`` plus a small
``Plotly.newPlot`` script with the figure's JSON, PNGs embedded as ``data:`` URIs. Nothing is
fetched from the network: the page opens offline from its directory.

Escaping:

* page text and attributes: every value a template prints is escaped by jinja2's autoescape
  (``markupsafe``: ``& < > " '`` become ``&amp; &lt; &gt; &#34; &#39;``); the templates are
  the only place HTML is written, and no value is marked safe except the two below;
* ``<script>`` elements: values go in only as JSON through the ``script_json`` filter
  (:func:`script_json`), which neutralises ``</``, ``<!--`` and ``<script``, so a value such
  as ``</script><script>alert(1)</script>`` can neither end the element nor open an HTML
  comment;
* figure strings (hover texts, trace names, titles) are escaped where the figure is built
  (:func:`archsearch.report.values.esc`, the same escape), because plotly.js renders them as a
  subset of HTML.

Checked in ``tests/test_report.py`` (script elements counted, template output escaped) and in
a real browser by ``tests/test_report_browser.py`` (hover labels included).
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from archsearch.report.style import Figure
from archsearch.report.values import jsonable

#: File name of the plotly.js bundle beside each page (written by :func:`write_plotly_js`).
PLOTLY_JS_NAME = "plotly.min.js"

def script_json(obj: Any) -> str:
    """JSON for inside a ``<script>`` element: NaN/inf -> ``null``, non-ASCII as ``\\u``
    escapes, and the only sequences that could end the element or change how it is parsed
    (HTML spec, "restrictions for contents of script elements") neutralised: ``</`` becomes
    ``<\\/``, ``<!--`` becomes ``\\u003c!--`` and ``<script`` becomes ``\\u003cscript`` (all
    still valid JSON and JS). Text in figures is escaped before this, so user strings carry no
    ``<`` at all.

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


@functools.lru_cache(maxsize=1)
def plotly_js() -> str:
    """The plotly.js bundle shipped with the installed ``plotly`` package
    (``plotly.offline.get_plotlyjs()``, ~4.8 MB; read once per process)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def write_plotly_js(out_dir: str | Path) -> Path:
    """Put the plotly.js bundle (:func:`plotly_js`) in ``out_dir`` as ``plotly.min.js``, the
    file every page of that directory loads with ``<script src="plotly.min.js">``.

    Written (atomically, :func:`archsearch.runs.atomic_write`) only when the file is absent
    or its bytes differ (another plotly version); otherwise left untouched, so rewriting a
    report does not rewrite 4.8 MB. Returns the file's path.

    Raises:
        OSError: ``out_dir`` cannot be read or written.
    """
    from archsearch.runs import atomic_write

    path = Path(out_dir) / PLOTLY_JS_NAME
    bundle = plotly_js().encode("utf-8")
    try:
        same = path.stat().st_size == len(bundle) and path.read_bytes() == bundle
    except FileNotFoundError:
        same = False
    if not same:
        atomic_write(path, bundle)
    return path


@functools.lru_cache(maxsize=1)
def environment():
    """The jinja2 environment of the report templates: package loader
    (``archsearch.report/templates``), autoescape on for every template, undefined names are
    errors, and the ``script_json`` filter (:func:`script_json`, marked safe: it is JSON made
    safe for a ``<script>`` element, never HTML)."""
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("archsearch.report", "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["script_json"] = lambda obj: Markup(script_json(obj))
    env.globals["plotly_js_name"] = PLOTLY_JS_NAME
    return env


def render(template: str, **context: Any) -> str:
    """Render ``templates/<template>`` with ``context`` (raw values: the template escapes).

    Raises:
        jinja2.TemplateNotFound / jinja2.UndefinedError: a bug in the caller or template.
    """
    return environment().get_template(template).render(**context)


class Page:
    """The figures of one page; they share one table of hover texts.

    Hover texts are most of a big report's bytes and recur (every 2-D projection and the
    3-D view show the same trials; learning curves repeat a trial's label per epoch), so
    each distinct string is stored once in ``window.ASH_HOVER`` and traces carry indices
    (``"_h"``) that a few lines of JS expand before ``Plotly.newPlot``
    (``templates/base.html.j2``, macro ``figure``).
    """

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self.hover: list[str] = []
        self.figures: list[dict[str, Any]] = []

    def _index(self, text: Any) -> int | None:
        if text is None:
            return None
        text = str(text)
        k = self._ids.get(text)
        if k is None:
            k = self._ids[text] = len(self.hover)
            self.hover.append(text)
        return k

    def figure(self, fig: Figure, div_id: str, title: str = "", note: str = "") -> dict[str, Any]:
        """Add a figure; return what the templates' ``figure`` macro draws:
        ``{"id", "title", "note", "data" (traces, hover texts as indices), "layout",
        "config"}``. ``title`` and ``note`` are raw text (the template escapes them)."""
        data = []
        for trace in fig["data"]:
            texts = trace.get("hovertext")
            if isinstance(texts, list):
                trace = {k: v for k, v in trace.items() if k != "hovertext"}
                trace["_h"] = [self._index(t) for t in texts]
            data.append(trace)
        item = {"id": div_id, "title": title, "note": note, "data": data,
                "layout": fig["layout"], "config": {"displaylogo": False, "responsive": True}}
        self.figures.append(item)
        return item

    def context(self) -> dict[str, Any]:
        """The template variables of the page shell: ``figures`` and ``hover``."""
        return {"figures": self.figures, "hover": self.hover}


def png_data(png: bytes, caption: str) -> Mapping[str, str]:
    """A PNG for the templates' ``png`` macro: ``{"caption", "b64"}`` (shown as a ``data:``
    image, so the page needs no file beside it for it)."""
    return {"caption": caption, "b64": base64.b64encode(png).decode("ascii")}
