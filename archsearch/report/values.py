"""Units, labels and the text form of values: shared by every report writer (CSV, JSON, the
figures, the HTML page, the comparison).

Nothing here computes a result; these helpers only say how a metric is named, in which unit,
and how a value is written. Every function is pure and raises nothing for odd input (a value
it cannot convert becomes NaN, ``None`` or its ``str``), unless its docstring says otherwise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Set
from typing import Any

import numpy as np
from markupsafe import escape

from archsearch import metrics

#: Units of the metric names fixed in docs/design.md (a view of
#: :data:`archsearch.metrics.METRICS`). Other reported metric names are allowed and shown
#: without a unit.
METRIC_UNITS: Mapping[str, str] = metrics.UNITS

#: Metrics plotted on a log axis (when every plotted value is > 0): they span orders of
#: magnitude across architectures (a view of :data:`archsearch.metrics.METRICS`).
LOG_SCALE_METRICS: Set[str] = metrics.LOG_SCALE


def metric_label(name: str) -> str:
    """Axis label with unit, e.g. ``"flops_per_sample [FLOPs]"``; plain name if unit unknown."""
    unit = METRIC_UNITS.get(name)
    return f"{name} [{unit}]" if unit else name


def to_float(value: Any) -> float:
    """``value`` as a float (numeric strings too: YAML reads ``1e6`` as one); NaN for None,
    booleans, integers too large for a float and anything non-numeric."""
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def jsonable(value: Any) -> Any:
    """Plain-JSON copy of ``value``: non-finite floats -> None, numpy scalars -> Python,
    tuples -> lists, unknown objects -> ``str``. The result passes ``json.dumps(allow_nan=False)``.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value.tolist()]
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return str(value)


def config_json(config: Mapping[str, Any]) -> str:
    """Compact, key-sorted JSON of a trial config (what the repro command passes)."""
    return json.dumps(jsonable(config), sort_keys=True, separators=(",", ":"))


def esc(value: Any) -> str:
    """``str(value)`` escaped for HTML text and attributes and for plotly text (hover, legend,
    titles), by ``markupsafe.escape``, the escape of the page templates' autoescape (jinja2):
    ``& < > " '`` become ``&amp; &lt; &gt; &#34; &#39;``. Numeric entities for quotes matter:
    plotly.js decodes only numeric entities and a few named ones (``&amp; &lt; &gt;
    &nbsp;``; not ``&quot;``), so ``&quot;`` showed literally in hover labels and legends.
    ``value`` is always converted with ``str`` first, so an object that claims to be markup
    (``__html__``) is escaped too."""
    return str(escape(str(value)))


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


def constraints_text(constraints: Mapping[str, Mapping[str, float]]) -> str:
    """``params_trainable <= 2e+06; latency_ms >= ...`` (raw text, not escaped)."""
    return "; ".join(
        " and ".join(f"{metric} {'<=' if k == 'max' else '>='} {v:.6g}" for k, v in bounds.items())
        for metric, bounds in constraints.items())
