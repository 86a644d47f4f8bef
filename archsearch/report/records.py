"""Validate and classify the runner's trial records.

The input contract (written by ``archsearch.tune`` through :class:`archsearch.runs.RunDir`)
is documented in :func:`archsearch.report.write_report`. The records become one
:class:`~archsearch.report.data.ReportData` that the CSV/JSON writers, the figures and the
HTML page all read, so they agree on which trials failed, which are feasible and which are on
the front. This module holds the per-record part: parsing, classification and anytime-curve
sub-trials.

Definitions used everywhere in the report:

* **failed**: ``status == "ERROR"``, or an objective or constraint metric is missing from
  ``metrics`` or is not a finite number (NaN/inf). Failed trials are counted in ``n_failed``
  and listed with their error; they have no point on the plots.
* **feasible**: not failed and every constraint holds. Bounds are inclusive:
  ``{"max": v}`` means ``value <= v``, ``{"min": v}`` means ``value >= v``.
* **pareto**: feasible and not dominated by another feasible trial (in all objectives at once).
* ``"STOPPED"`` trials (stopped early by ASHA or by the time budget) are valid points trained
  for fewer epochs; they can be on the front and are marked as such in plots and tables.
* ``"RUNNING"`` trials (the run stopped, or is still going, before they finished) count as
  failed ("unfinished"): their last metrics are not a result.
* **sub-trials** (``"ID#k"``): a dynamic trial's final metrics may hold
  ``anytime_curve: [{"flops_per_sample": f, "accuracy": a (or "perplexity": p),
  "latency_ms": t, <settings>...}, ...]``, the operating points of one trained model
  (length configurations of the Length-Adaptive Transformer, Kim & Cho 2021 Sec. 4; a
  depth-predictor gamma sweep; DHT lambda values). Point ``k`` becomes sub-trial ``ID#k``:
  config = the trial's config plus the point's own settings (its non-metric keys, and the
  entries of a ``"config"`` dict), metrics = the point's metrics plus the trained model's
  parameter counts (``params_total``, ``params_trainable``: the same at every operating
  point) from the trial when the point does not carry them. Sub-trials are classified like
  trials and can be on the front and add hypervolume (in the hypervolume history they arrive
  with their trial); they are not counted in
  ``n_trials`` / ``n_failed``. Points without a finite value for every objective and
  constraint metric are dropped (counted in ``ReportData.n_dropped_points``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from archsearch.metrics import PER_MODEL
from archsearch.report.values import METRIC_UNITS, to_float
from archsearch.runs import ERROR, RUNNING, STATUSES, STOPPED
from archsearch.space import Objective

#: Metrics of the trained model itself, the same at every operating point of its anytime
#: curve: a sub-trial takes them from its trial when the point does not carry them (a view of
#: :data:`archsearch.metrics.METRICS`).
MODEL_METRICS: Set[str] = PER_MODEL

#: Final-metrics key of a dynamic trial's operating points (see the module docstring).
ANYTIME_KEY = "anytime_curve"

#: Config key of a trial's inner-loop gating, and its value (and default) for a model that
#: runs every layer and head (``archsearch.models.config.DEFAULTS``; the report does not import
#: the models package).
GATING_KEY = "gating"
STATIC_GATING = "static"

#: Final-metrics key of the layer-tying map learned by a tying controller (``s[i] = j``:
#: layer ``i`` uses layer ``j``'s weights; Hay & Wolf 2024). Shown with the config.
TYING_KEY = "tying_map"


@dataclass
class TrialRow:
    """One trial after validation; ``index`` is its 0-based position in trial order."""

    index: int
    trial_id: str
    status: str
    config: dict[str, Any]
    metrics: dict[str, Any]
    history: list[dict[str, Any]]
    error: str | None
    failed: bool = False
    failure_reason: str | None = None
    violations: list[str] = field(default_factory=list)
    feasible: bool = False
    pareto: bool = False
    parent: str | None = None
    point: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    inherited: list[str] = field(default_factory=list)
    parent_config: dict[str, Any] | None = None  #: a sub-trial's: its trial's own config

    @property
    def stopped(self) -> bool:
        """Stopped early (by ASHA, or by the search's time budget): fewer epochs than the budget."""
        return self.status == STOPPED

    @property
    def is_subtrial(self) -> bool:
        """An operating point ``ID#k`` of a dynamic trial's anytime curve."""
        return self.parent is not None

    @property
    def repro_config(self) -> dict[str, Any]:
        """The config that re-trains this row's model: the trial's own config (a sub-trial's
        point settings are inference-time choices of that same trained model)."""
        if not self.is_subtrial:
            return self.config
        return dict(self.parent_config or {})

    def tying_map(self) -> Any:
        """The final tying map (``metrics["tying_map"]``), or ``None``."""
        return self.metrics.get(TYING_KEY)

    @property
    def gating(self) -> str:
        """The config's ``gating`` (a sub-trial's is its trial's), :data:`STATIC_GATING` when
        the config has none (the trainable's default)."""
        g = self.config.get(GATING_KEY)
        return STATIC_GATING if g is None else str(g)


def parse_objectives(objectives: Sequence[Mapping[str, Any]]) -> list[Objective]:
    """Validate ``[{"metric": str, "mode": "max"|"min", "ref": float (optional)}, ...]``
    into the search space's own :class:`archsearch.space.Objective` (``ref`` in the metric's
    unit), so a report and the space that produced its run speak of the same objects.

    Raises:
        ValueError: empty list, missing or unknown keys, unknown mode, a metric name that is
            not one of docs/design.md's (``archsearch.space.METRICS``), duplicate metric,
            non-finite ref.
    """
    if not objectives:
        raise ValueError("need at least one objective")
    parsed: list[Objective] = []
    for i, obj in enumerate(objectives):
        if not isinstance(obj, Mapping) or "metric" not in obj or "mode" not in obj:
            raise ValueError(f"objectives[{i}] must be a dict with 'metric' and 'mode', got {obj!r}")
        metric, mode = str(obj["metric"]), str(obj["mode"])
        if mode not in ("max", "min"):
            raise ValueError(f"objectives[{i}].mode must be 'max' or 'min', got {mode!r}")
        unknown = set(obj) - {"metric", "mode", "ref"}
        if unknown:
            raise ValueError(f"objectives[{i}] has unknown keys {sorted(unknown)}")
        ref = obj.get("ref")
        if ref is not None:
            ref = to_float(ref)
            if not math.isfinite(ref):
                raise ValueError(f"objectives[{i}].ref must be a finite number, got {obj['ref']!r}")
        try:
            parsed.append(Objective(metric=metric, mode=mode, ref=ref))
        except ValidationError as e:  # a metric name docs/design.md does not define
            raise ValueError(f"objectives[{i}].metric: {e.errors()[0]['msg']}") from None
    names = [o.metric for o in parsed]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate objective metric in {names}")
    return parsed


def parse_constraints(constraints: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
    """Validate ``{metric: {"max": v} | {"min": v} | {"min": a, "max": b}}``.

    Raises:
        ValueError: a bound that is not ``min``/``max``, not a finite number, or min > max.
    """
    parsed: dict[str, dict[str, float]] = {}
    for metric, bounds in (constraints or {}).items():
        if not isinstance(bounds, Mapping) or not bounds or set(bounds) - {"min", "max"}:
            raise ValueError(
                f"constraint on {metric!r} must be {{'max': v}} and/or {{'min': v}}, got {bounds!r}"
            )
        clean = {}
        for key, v in bounds.items():
            f = to_float(v)
            if not math.isfinite(f):
                raise ValueError(f"constraint {metric}.{key} must be a finite number, got {v!r}")
            clean[key] = f
        if "min" in clean and "max" in clean and clean["min"] > clean["max"]:
            raise ValueError(f"constraint on {metric!r} has min > max: {bounds!r}")
        parsed[str(metric)] = clean
    return parsed


def parse_trial(index: int, record: Mapping[str, Any]) -> TrialRow:
    """Validate one trial record of the runner's contract.

    Raises:
        ValueError: not a dict, no ``trial_id``, unknown ``status``, ``config``/``metrics`` not
            dicts, ``history`` not a list of dicts.
    """
    if not isinstance(record, Mapping):
        raise ValueError(f"trials[{index}] must be a dict, got {type(record).__name__}")
    if record.get("trial_id") in (None, ""):
        raise ValueError(f"trials[{index}] has no trial_id")
    trial_id = str(record["trial_id"])
    status = record.get("status")
    if status not in STATUSES:
        raise ValueError(f"trial {trial_id!r}: status must be one of {STATUSES}, got {status!r}")
    config = record.get("config") or {}
    metrics = record.get("metrics") or {}
    history = record.get("history") or []
    for name, value, kind in (("config", config, Mapping), ("metrics", metrics, Mapping)):
        if not isinstance(value, kind):
            raise ValueError(f"trial {trial_id!r}: {name} must be a dict, got {type(value).__name__}")
    if not isinstance(history, Sequence) or not all(isinstance(h, Mapping) for h in history):
        raise ValueError(f"trial {trial_id!r}: history must be a list of dicts")
    error = record.get("error")
    return TrialRow(
        index=index,
        trial_id=trial_id,
        status=status,
        config=dict(config),
        metrics=dict(metrics),
        history=[dict(h) for h in history],
        error=None if error is None else str(error),
    )


def classify(row: TrialRow, objectives: list[Objective], constraints: dict) -> None:
    """Set ``failed``, ``failure_reason``, ``violations`` and ``feasible`` of one trial."""
    if row.status == ERROR:
        row.failed = True
        row.failure_reason = row.error or "trial ended with status ERROR (no error message)"
        return
    if row.status == RUNNING:
        row.failed = True
        row.failure_reason = ("unfinished: status RUNNING (the run stopped, or is still going, "
                              f"before this trial completed; {len(row.history)} epochs recorded)")
        if row.error:
            row.failure_reason += f"; error: {row.error}"
        return
    needed = [o.metric for o in objectives] + [m for m in constraints if m not in
                                                 {o.metric for o in objectives}]
    for metric in needed:
        if metric not in row.metrics:
            row.failed = True
            row.failure_reason = f"metric {metric!r} was not reported"
            break
        if not math.isfinite(to_float(row.metrics[metric])):
            row.failed = True
            row.failure_reason = f"metric {metric!r} is {row.metrics[metric]!r} (not a finite number)"
            break
    if row.failed:
        if row.error:
            row.failure_reason = f"{row.failure_reason}; error: {row.error}"
        return
    for metric, bounds in constraints.items():
        value = to_float(row.metrics[metric])
        if "max" in bounds and value > bounds["max"]:
            row.violations.append(f"{metric} = {value:.6g} > max {bounds['max']:.6g}")
        if "min" in bounds and value < bounds["min"]:
            row.violations.append(f"{metric} = {value:.6g} < min {bounds['min']:.6g}")
    row.feasible = not row.violations


def _metric_like(key: str, value: Any, known: set[str]) -> bool:
    """A point's key is a metric when it names a known metric and holds a number."""
    return (key in known and not isinstance(value, (bool, Mapping, list, tuple))
            and math.isfinite(to_float(value)))


def make_subtrials(parent: TrialRow, first_index: int, objectives: list[Objective],
                   constraints: dict[str, dict[str, float]]) -> tuple[list[TrialRow], int]:
    """Sub-trials ``ID#k`` of one trial's ``metrics["anytime_curve"]`` (module docstring).

    Returns:
        (sub-trial rows with indices from ``first_index``, number of points dropped because
        they are not dicts or lack a finite value for an objective or constraint metric).
    """
    curve = parent.metrics.get(ANYTIME_KEY)
    if parent.failed or not isinstance(curve, (list, tuple)) or not curve:
        return [], 0
    needed = [o.metric for o in objectives] + [m for m in constraints
                                               if m not in {o.metric for o in objectives}]
    known = set(METRIC_UNITS) | set(needed)
    rows: list[TrialRow] = []
    dropped = 0
    for k, point in enumerate(curve):
        if not isinstance(point, Mapping):
            dropped += 1
            continue
        metrics = {key: v for key, v in point.items() if _metric_like(key, v, known)}
        # a known metric without a finite number is neither a metric nor a setting: left out
        settings = {str(key): v for key, v in point.items() if key not in known and key != "config"}
        if isinstance(point.get("config"), Mapping):
            settings.update({str(key): v for key, v in point["config"].items()})
        inherited = [m for m in MODEL_METRICS if m not in metrics and m in parent.metrics]
        for m in inherited:
            metrics[m] = parent.metrics[m]
        row = TrialRow(
            index=first_index + len(rows), trial_id=f"{parent.trial_id}#{k}",
            status=parent.status, config={**parent.config, **settings}, metrics=metrics,
            history=[], error=None, parent=parent.trial_id, point=k, settings=settings,
            inherited=inherited, parent_config=dict(parent.config),
        )
        classify(row, objectives, constraints)
        if row.failed:  # a point without its objective values: nothing to draw
            dropped += 1
            continue
        rows.append(row)
    return rows, dropped


