"""Validate the runner's trial records and compute everything a report shows.

The input contract (written by ``archsearch.tune``) is documented in
:func:`archsearch.report.write_report`. This module turns it into one :class:`ReportData`
that the CSV/JSON writers, the plots and the HTML page all read, so they agree on which
trials failed, which are feasible and which are on the front.

Definitions used everywhere in the report:

* **failed**: ``status == "ERROR"``, or an objective or constraint metric is missing from
  ``metrics`` or is not a finite number (NaN/inf). Failed trials are counted in ``n_failed``
  and listed with their error; they have no point on the plots.
* **feasible**: not failed and every constraint holds. Bounds are inclusive:
  ``{"max": v}`` means ``value <= v``, ``{"min": v}`` means ``value >= v``.
* **pareto**: feasible and not dominated by another feasible trial (in all objectives at once).
* ``"STOPPED"`` trials (early-stopped by ASHA) are valid points trained for fewer epochs; they
  can be on the front and are marked as such in plots and tables.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

STATUSES = ("TERMINATED", "ERROR", "STOPPED")

#: Units of the metric names fixed in DESIGN.md. Other metric names are allowed and shown
#: without a unit.
METRIC_UNITS: dict[str, str] = {
    "accuracy": "fraction 0..1",
    "val_loss": "nats/token",
    "perplexity": "-",
    "flops_per_sample": "FLOPs",
    "params_total": "count",
    "params_trainable": "count",
    "latency_ms": "ms",
    "train_seconds": "s",
}

#: Metrics plotted on a log axis (when every plotted value is > 0): they span orders of
#: magnitude across architectures.
LOG_SCALE_METRICS = frozenset({"flops_per_sample", "params_total", "params_trainable"})


def metric_label(name: str) -> str:
    """Axis label with unit, e.g. ``"flops_per_sample [FLOPs]"``; plain name if unit unknown."""
    unit = METRIC_UNITS.get(name)
    return f"{name} [{unit}]" if unit else name


def to_float(value: Any) -> float:
    """``value`` as a float; NaN for None, booleans and anything non-numeric."""
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
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


@dataclass(frozen=True)
class Objective:
    """One objective: a metric name, ``"max"`` or ``"min"``, and an optional user reference
    value in the metric's unit."""

    metric: str
    mode: str
    ref: float | None = None


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

    @property
    def stopped(self) -> bool:
        """Early-stopped by the scheduler (ASHA): fewer epochs than the budget."""
        return self.status == "STOPPED"


@dataclass
class ReportData:
    """Everything the report shows, computed once.

    ``Y`` is ``(n_trials, n_objectives)`` in the objectives' units with NaN rows for failed
    trials; ``reference_point`` and ``hypervolume`` use feasible trials only;
    ``hv_history[i]`` is the hypervolume after trial ``i`` (trial order).
    """

    objectives: list[Objective]
    constraints: dict[str, dict[str, float]]
    run_info: dict[str, Any]
    trials: list[TrialRow]
    Y: np.ndarray
    reference_point: list[float | None]
    hypervolume: float
    hv_history: list[float]

    @property
    def modes(self) -> list[str]:
        return [o.mode for o in self.objectives]

    @property
    def n_trials(self) -> int:
        return len(self.trials)

    @property
    def n_failed(self) -> int:
        return sum(t.failed for t in self.trials)

    @property
    def n_successful(self) -> int:
        return self.n_trials - self.n_failed

    @property
    def n_feasible(self) -> int:
        return sum(t.feasible for t in self.trials)

    @property
    def n_stopped(self) -> int:
        return sum(t.stopped and not t.failed for t in self.trials)

    def pareto_trials(self) -> list[TrialRow]:
        """Pareto trials sorted best-first on the first objective (ties: trial_id)."""
        rows = [t for t in self.trials if t.pareto]
        sign = -1.0 if self.objectives[0].mode == "max" else 1.0
        return sorted(rows, key=lambda t: (sign * float(self.Y[t.index, 0]), t.trial_id))

    def failed_trials(self) -> list[TrialRow]:
        return [t for t in self.trials if t.failed]

    def metric_names(self) -> list[str]:
        """Objective metrics first, then every other reported metric name, sorted."""
        first = [o.metric for o in self.objectives]
        rest = sorted({k for t in self.trials for k in t.metrics} - set(first))
        return first + rest

    def config_names(self) -> list[str]:
        """Union of config keys over all trials, sorted."""
        return sorted({k for t in self.trials for k in t.config})


def parse_objectives(objectives: Sequence[Mapping[str, Any]]) -> list[Objective]:
    """Validate ``[{"metric": str, "mode": "max"|"min", "ref": float (optional)}, ...]``.

    Raises:
        ValueError: empty list, missing keys, unknown mode, duplicate metric, non-finite ref.
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
        parsed.append(Objective(metric, mode, ref))
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


def _classify(row: TrialRow, objectives: list[Objective], constraints: dict) -> None:
    """Set ``failed``, ``failure_reason``, ``violations`` and ``feasible`` of one trial."""
    if row.status == "ERROR":
        row.failed = True
        row.failure_reason = row.error or "trial ended with status ERROR (no error message)"
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


def build_report_data(
    trials: Sequence[Mapping[str, Any]],
    objectives: Sequence[Mapping[str, Any]],
    constraints: Mapping[str, Any] | None = None,
    run_info: Mapping[str, Any] | None = None,
) -> ReportData:
    """Validate the inputs and compute failures, feasibility, the front and the hypervolume.

    Raises:
        ValueError: any contract violation (see the ``parse_*`` functions) or duplicate
            ``trial_id``.
    """
    from archsearch.report import pareto

    objs = parse_objectives(objectives)
    cons = parse_constraints(constraints)
    rows = [parse_trial(i, rec) for i, rec in enumerate(trials)]
    ids = [r.trial_id for r in rows]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise ValueError(f"duplicate trial_id in trials: {dupes}")
    for row in rows:
        _classify(row, objs, cons)

    modes = [o.mode for o in objs]
    Y = np.full((len(rows), len(objs)), np.nan)
    for row in rows:
        if not row.failed:
            Y[row.index] = [to_float(row.metrics[o.metric]) for o in objs]
    feasible = np.array([r.feasible for r in rows], dtype=bool)
    Y_feasible = np.where(feasible[:, None], Y, np.nan)

    mask = pareto.non_dominated_mask(Y_feasible, modes)
    for row in rows:
        row.pareto = bool(mask[row.index])

    ref = pareto.reference_point(Y_feasible, modes, [o.ref for o in objs])
    if feasible.any() and all(r is not None for r in ref):
        hv = pareto.hypervolume(Y_feasible, modes, ref)
        history = pareto.hypervolume_history(Y_feasible, modes, ref)
    else:
        hv, history = 0.0, [0.0] * len(rows)
    return ReportData(
        objectives=objs,
        constraints=cons,
        run_info=dict(run_info or {}),
        trials=rows,
        Y=Y,
        reference_point=ref,
        hypervolume=hv,
        hv_history=history,
    )
