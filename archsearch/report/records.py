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
  point) from the trial when the point does not carry them. Sub-trials are classified like trials and can be on the front and add hypervolume
  (in the hypervolume history they arrive with their trial); they are not counted in
  ``n_trials`` / ``n_failed``. Points without a finite value for every objective and
  constraint metric are dropped (counted in ``ReportData.n_dropped_points``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

STATUSES = ("TERMINATED", "ERROR", "STOPPED", "RUNNING")

#: Metrics of the trained model itself, the same at every operating point of its anytime
#: curve: a sub-trial takes them from its trial when the point does not carry them.
MODEL_METRICS = ("params_total", "params_trainable")

#: Final-metrics key of a dynamic trial's operating points (see the module docstring).
ANYTIME_KEY = "anytime_curve"

#: Final-metrics key of the layer-tying map learned by a tying controller (``s[i] = j``:
#: layer ``i`` uses layer ``j``'s weights; Hay & Wolf 2024). Shown with the config.
TYING_KEY = "tying_map"

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
    parent: str | None = None
    point: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    inherited: list[str] = field(default_factory=list)

    @property
    def stopped(self) -> bool:
        """Early-stopped by the scheduler (ASHA): fewer epochs than the budget."""
        return self.status == "STOPPED"

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
        return {k: v for k, v in self.config.items() if k not in self.settings}

    def tying_map(self) -> Any:
        """The final tying map (``metrics["tying_map"]``), or ``None``."""
        return self.metrics.get(TYING_KEY)


@dataclass
class ReportData:
    """Everything the report shows, computed once.

    ``trials`` are the runner's records (trial order); ``subtrials`` the anytime-curve points
    of dynamic trials; ``rows`` is both, and ``row.index`` is the row's position in it and in
    ``Y``. ``Y`` is ``(n_rows, n_objectives)`` in the objectives' units with NaN rows for
    failed rows; ``reference_point`` and ``hypervolume`` use feasible rows only;
    ``hv_history[i]`` is the hypervolume after trial ``i`` (trial order, with its sub-trials).
    """

    objectives: list[Objective]
    constraints: dict[str, dict[str, float]]
    run_info: dict[str, Any]
    trials: list[TrialRow]
    Y: np.ndarray
    reference_point: list[float | None]
    hypervolume: float
    hv_history: list[float]
    subtrials: list[TrialRow] = field(default_factory=list)
    n_dropped_points: int = 0

    @property
    def rows(self) -> list[TrialRow]:
        return self.trials + self.subtrials

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

    @property
    def n_pareto(self) -> int:
        return sum(r.pareto for r in self.rows)

    def pareto_trials(self) -> list[TrialRow]:
        """Pareto rows (trials and sub-trials) sorted best-first on the first objective
        (ties: trial_id)."""
        rows = [t for t in self.rows if t.pareto]
        sign = -1.0 if self.objectives[0].mode == "max" else 1.0
        return sorted(rows, key=lambda t: (sign * float(self.Y[t.index, 0]), t.trial_id))

    def failed_trials(self) -> list[TrialRow]:
        return [t for t in self.trials if t.failed]

    def subtrials_of(self, trial_id: str) -> list[TrialRow]:
        """The sub-trials of one trial, in curve order."""
        by_parent: dict[str, list[TrialRow]] = {}
        for s in self.subtrials:
            by_parent.setdefault(s.parent, []).append(s)
        return by_parent.get(trial_id, [])

    def dynamic_trials(self) -> list[TrialRow]:
        """Trials that have sub-trials (an anytime curve with at least one usable point)."""
        parents = {s.parent for s in self.subtrials}
        return [t for t in self.trials if t.trial_id in parents]

    def metric_names(self, *, scalar_only: bool = False) -> list[str]:
        """Objective metrics first, then every other reported metric name, sorted.

        ``scalar_only``: leave out metrics whose values are lists or dicts (``anytime_curve``,
        ``tying_map``, histograms), for table columns.
        """
        first = [o.metric for o in self.objectives]
        names = {k for t in self.rows for k in t.metrics} - set(first)
        if scalar_only:
            names = {k for k in names
                     if not any(isinstance(t.metrics.get(k), (Mapping, list, tuple))
                                for t in self.rows)}
        return first + sorted(names)

    def config_names(self) -> list[str]:
        """Union of config keys over all rows, sorted."""
        return sorted({k for t in self.rows for k in t.config})

    def rescore(self, ref: Sequence[float | None]) -> None:
        """Recompute ``hypervolume`` and ``hv_history`` with the reference point ``ref``
        (objectives' units), e.g. one shared by several runs (:mod:`archsearch.report.compare`).

        Raises:
            ValueError: ``ref`` of the wrong length or with non-finite values.
        """
        from archsearch.report import pareto

        ref = [None if r is None else float(r) for r in ref]
        if len(ref) != len(self.objectives):
            raise ValueError(f"reference point has {len(ref)} values for "
                             f"{len(self.objectives)} objectives")
        self.reference_point = ref
        feasible = np.array([r.feasible for r in self.rows], dtype=bool)
        if not feasible.any() or any(r is None for r in ref):
            self.hypervolume, self.hv_history = 0.0, [0.0] * self.n_trials
            return
        Y_feasible = np.where(feasible[:, None], self.Y, np.nan)
        # trial order, each trial followed by its sub-trials
        order: list[int] = []
        last_of_trial: list[int] = []
        subs: dict[str, list[int]] = {}
        for s in self.subtrials:
            subs.setdefault(s.parent, []).append(s.index)
        for t in self.trials:
            order.append(t.index)
            order.extend(subs.get(t.trial_id, []))
            last_of_trial.append(len(order) - 1)
        history = pareto.hypervolume_history(Y_feasible[order], self.modes, ref)
        self.hv_history = [history[i] for i in last_of_trial]
        self.hypervolume = self.hv_history[-1] if self.hv_history else 0.0


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
    if row.status == "RUNNING":
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
        settings = {str(key): v for key, v in point.items()
                    if key not in metrics and key != "config"}
        if isinstance(point.get("config"), Mapping):
            settings.update({str(key): v for key, v in point["config"].items()})
        inherited = [m for m in MODEL_METRICS if m not in metrics and m in parent.metrics]
        for m in inherited:
            metrics[m] = parent.metrics[m]
        row = TrialRow(
            index=first_index + len(rows), trial_id=f"{parent.trial_id}#{k}",
            status=parent.status, config={**parent.config, **settings}, metrics=metrics,
            history=[], error=None, parent=parent.trial_id, point=k, settings=settings,
            inherited=inherited,
        )
        _classify(row, objectives, constraints)
        if row.failed:  # a point without its objective values: nothing to draw
            dropped += 1
            continue
        rows.append(row)
    return rows, dropped


def build_report_data(
    trials: Sequence[Mapping[str, Any]],
    objectives: Sequence[Mapping[str, Any]],
    constraints: Mapping[str, Any] | None = None,
    run_info: Mapping[str, Any] | None = None,
    *,
    reference: Sequence[float | None] | None = None,
) -> ReportData:
    """Validate the inputs; compute failures, feasibility, sub-trials, the front and the
    hypervolume.

    Args:
        trials, objectives, constraints, run_info: as :func:`archsearch.report.write_report`.
        reference: a reference point to use instead of the automatic one (objectives' units;
            e.g. shared by several runs). ``None`` entries fall back to the automatic rule.

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
        seen: set[str] = set()
        dupes = sorted({i for i in ids if i in seen or seen.add(i)})[:5]
        raise ValueError(f"duplicate trial_id in trials: {dupes}")
    for row in rows:
        _classify(row, objs, cons)
    subtrials: list[TrialRow] = []
    dropped = 0
    for row in rows:
        subs, n_drop = make_subtrials(row, len(rows) + len(subtrials), objs, cons)
        subtrials += subs
        dropped += n_drop

    every = rows + subtrials
    modes = [o.mode for o in objs]
    Y = np.full((len(every), len(objs)), np.nan)
    for row in every:
        if not row.failed:
            Y[row.index] = [to_float(row.metrics[o.metric]) for o in objs]
    feasible = np.array([r.feasible for r in every], dtype=bool)
    Y_feasible = np.where(feasible[:, None], Y, np.nan)

    mask = pareto.non_dominated_mask(Y_feasible, modes)
    for row in every:
        row.pareto = bool(mask[row.index])

    user_refs = [o.ref for o in objs]
    if reference is not None:
        if len(reference) != len(objs):
            raise ValueError(f"reference point has {len(reference)} values for {len(objs)} objectives")
        user_refs = [r if r is not None else u for r, u in zip(reference, user_refs)]
    ref = pareto.reference_point(Y_feasible, modes, user_refs)
    data = ReportData(
        objectives=objs,
        constraints=cons,
        run_info=dict(run_info or {}),
        trials=rows,
        Y=Y,
        reference_point=ref,
        hypervolume=0.0,
        hv_history=[0.0] * len(rows),
        subtrials=subtrials,
        n_dropped_points=dropped,
    )
    data.rescore(ref)
    return data
