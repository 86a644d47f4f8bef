"""The metrics: one row per metric name, and every table about metrics derived from it.

A trial reports these names (docs/design.md: use exactly these everywhere: reports, storage,
CLI, benchmarks); a search space's objectives and constraints name them. Each row says which
direction is better, the unit, whether plots use a log axis, whether the metric is a *known
cost* (computable from the architecture alone, before training:
:func:`archsearch.dynamic.known_costs.known_costs_fn`), whether it belongs to the trained model
itself (the same at every operating point of one model), and what it means.

Adding a metric is adding one row to :data:`METRICS`. The other tables are live views of it
(``archsearch.space.METRICS`` is :data:`DIRECTIONS`, ``report.values.METRIC_UNITS`` is
:data:`UNITS`, ``search.base.KNOWN_COST_METRICS`` is :data:`KNOWN_COSTS`, ...), and the metric
tables of README.md and docs/design.md are :func:`markdown_table` (``python -m
archsearch.metrics`` prints it; ``tests/test_metrics.py`` checks both).

Plain Python: no import of torch, numpy or the rest of archsearch.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator, Mapping, Set
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Metric:
    """One metric.

    Attributes:
        name: as trials report it (``flops_per_sample``).
        mode: the better direction, ``"max"`` or ``"min"``.
        unit: shown in axis labels and tables (``"FLOPs"``; ``"-"`` for none).
        meaning: one line for the docs.
        log_scale: plot on a log axis (when every value is > 0): it spans orders of magnitude
            across architectures.
        known_cost: computable from the architecture alone, before training (a searcher's cost
            function gives it; a ``max`` constraint on it is checked before launch).
        per_model: a property of the trained weights, the same at every operating point of one
            model (a sub-trial of an anytime curve inherits it from its trial).
        low, high: the values the metric can take at all (``None``: unbounded); a constraint
            outside them is refused when the space loads.
        task: the one task whose trials report it (``None``: every task); a space of another
            task that names it is refused when it loads.
    """

    name: str
    mode: Literal["max", "min"]
    unit: str
    meaning: str
    log_scale: bool = False
    known_cost: bool = False
    per_model: bool = False
    low: float | None = 0.0
    high: float | None = None
    task: Literal["classification", "lm"] | None = None


#: Every metric, by name (in the order the docs list them).
METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("accuracy", "max", "fraction 0..1", "validation accuracy (classification)", high=1.0,
           task="classification"),
    Metric("val_loss", "min", "nats/token",
           "validation cross-entropy (per token for language modelling, per sample for "
           "classification)"),
    Metric("perplexity", "min", "-", "exp(val_loss) (language modelling)", low=1.0,
           task="lm"),
    Metric("flops_per_sample", "min", "FLOPs",
           "forward-pass FLOPs per sample actually executed, averaged over the validation set, "
           "after gating (a multiply-add = 2 FLOPs)", log_scale=True, known_cost=True),
    Metric("params_total", "min", "count", "parameters stored",
           log_scale=True, known_cost=True, per_model=True),
    Metric("params_trainable", "min", "count", "distinct trainable parameters after tying",
           log_scale=True, known_cost=True, per_model=True),
    Metric("latency_ms", "min", "ms",
           "median forward time per sample on the trial's device (batch size stated in the report; "
           "synchronised on CUDA; each trial records its `device` and `precision`)"),
    Metric("train_seconds", "min", "s", "wall time of the trial's training"),
)}


class Column(Mapping[str, Any]):
    """Read-only live view of :data:`METRICS`: metric name -> one attribute of its row, for the
    rows ``keep`` accepts (all by default). A row added to :data:`METRICS` shows up at once."""

    def __init__(self, attr: str, keep: Callable[[Metric], bool] | None = None):
        self._attr, self._keep = attr, keep or (lambda m: True)

    def __getitem__(self, name: str) -> Any:
        m = METRICS.get(name)
        if m is None or not self._keep(m):
            raise KeyError(name)
        return getattr(m, self._attr)

    def __iter__(self) -> Iterator[str]:
        return iter([n for n, m in METRICS.items() if self._keep(m)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"Column({self._attr!r}, {dict(self)!r})"


class Names(Set[str]):
    """Read-only live view of :data:`METRICS`: the names of the rows ``keep`` accepts."""

    def __init__(self, keep: Callable[[Metric], bool]):
        self._keep = keep

    def __contains__(self, name: object) -> bool:
        m = METRICS.get(name) if isinstance(name, str) else None
        return m is not None and self._keep(m)

    def __iter__(self) -> Iterator[str]:
        return iter([n for n, m in METRICS.items() if self._keep(m)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @classmethod
    def _from_iterable(cls, names):  # what ``&``, ``|``, ``-`` return: a plain frozenset
        return frozenset(names)

    def __repr__(self) -> str:
        return f"Names({list(self)!r})"


#: name -> ``"max"`` / ``"min"`` (``archsearch.space.METRICS``: the names a space may use).
DIRECTIONS: Mapping[str, str] = Column("mode")
#: name -> unit (``archsearch.report.values.METRIC_UNITS``).
UNITS: Mapping[str, str] = Column("unit")
#: Plotted on a log axis (``archsearch.report.values.LOG_SCALE_METRICS``).
LOG_SCALE: Set[str] = Names(lambda m: m.log_scale)
#: Known before training (``archsearch.search.base.KNOWN_COST_METRICS``; the pre-launch
#: constraint check, :func:`archsearch.tune.preflight.check_constraints`).
KNOWN_COSTS: Set[str] = Names(lambda m: m.known_cost)
#: Properties of the trained weights (``archsearch.report.records.MODEL_METRICS``).
PER_MODEL: Set[str] = Names(lambda m: m.per_model)


def markdown_table() -> str:
    """The metric table of README.md and docs/design.md (name, unit, better, meaning)."""
    lines = ["| name | unit | better | meaning |", "|---|---|---|---|"]
    lines += [f"| `{m.name}` | {m.unit} | {m.mode} | {m.meaning} |" for m in METRICS.values()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())


def is_number(value: Any) -> bool:
    """Whether ``value`` is a real number a metric or a numeric setting can hold: a Python
    ``int``/``float`` or any :class:`numbers.Real` (NumPy's ``float32``, ``int64``...; a trainable
    that reports ``np.float32(0.8)`` reports a number), never a ``bool`` (``True`` is not 1 here).
    NaN and infinities are numbers: callers that need finite values check that themselves."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
