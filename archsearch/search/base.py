"""The framework-free searcher API: ask/tell on plain data (no Ray or Optuna import).

A :class:`Searcher` proposes configs of a :class:`~archsearch.space.SearchSpace` and learns
from their metrics::

    s = make("ahto", space, seed=0, cost_fn=costs)
    tid, config = s.ask()                 # or s.ask("ray-trial-id")
    s.tell(tid, {"accuracy": 0.71, "flops_per_sample": 3e6}, fidelity=1.0)
    s.tell(other_tid, None, error=True)   # a failed trial: forgotten, never crashes the search
    state = s.state_dict(); s2 = make(...); s2.load_state_dict(state)   # same next suggestion

Conventions shared by every searcher (the shared test suite checks them):

* Objectives are ``space.objectives`` (metric + ``min``/``max``); internally every objective is
  *maximised* (``sign * value``). Hypervolume uses the objective's ``ref`` when given, else a
  reference point derived from the data (the worst value seen minus 10% of the range).
* ``cost_fn(config) -> {metric: value}`` gives *known costs* (``flops_per_sample``,
  ``params_*``) without training. Known constraints (a constraint on a metric the cost function
  returns) are enforced before a config is proposed; the other constraints are learned from
  the observed metrics (feasibility).
* ``fidelity`` in ``(0, 1]`` is the fraction of the training budget a trial got (ASHA may stop
  it early); model-based searchers use it as an input, the others ignore non-final trials.
* Same ``seed`` and the same tells give the same suggestions; ``state_dict`` holds everything
  (observations, pending trials, model weights, RNG state) as plain Python / numpy / torch data.
"""

from __future__ import annotations

import math
import pickle
from abc import ABC, abstractmethod
from collections.abc import Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from archsearch.metrics import KNOWN_COSTS, is_number

CostFn = Callable[[Mapping[str, Any]], Mapping[str, float]]

#: Metrics a cost function can give without training (a view of
#: :data:`archsearch.metrics.METRICS`).
KNOWN_COST_METRICS: Set[str] = KNOWN_COSTS


def state_error(name: str, error: BaseException):
    """The :class:`~archsearch.errors.SearchStopped` of a searcher whose state could not be
    saved (field ``--searcher``)."""
    from archsearch.errors import SearchStopped

    why = " ".join(f"{type(error).__name__}: {error}".split())
    return SearchStopped(f"searcher {name} could not save its state ({why}); the search was stopped",
                         field="--searcher")


@dataclass
class Observation:
    """One finished (or failed) trial. ``x`` is the unit-cube encoding (``space.encode``)."""

    trial_id: str
    config: dict[str, Any]
    x: list[float]
    metrics: dict[str, float] | None  #: None for a failed trial
    fidelity: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.metrics is not None


class Searcher(ABC):
    """Base class: pending/observed bookkeeping, objective signs, constraints, save/restore.

    Args:
        space: the search space (``params``, ``objectives``, ``constraints``; ``encode``/``decode``).
        seed: RNG seed; same seed and tells give the same suggestions.
        cost_fn: known costs of a config without training (see module docstring) or ``None``.

    Subclasses implement :meth:`_suggest` (return a config) and may override :meth:`_observe`,
    :meth:`_state` and :meth:`_load_state`.
    """

    name = "base"
    #: whether :meth:`restrict_configurations` is honoured (model-based searchers score the
    #: unvisited configurations; the Optuna baselines cannot be restricted)
    supports_restriction = False

    def __init__(self, space, *, seed: int = 0, cost_fn: CostFn | None = None):
        self.space = space
        self.seed = int(seed)
        self.cost_fn = cost_fn
        self.metrics = [o.metric for o in space.objectives]
        self.signs = [1.0 if o.mode == "max" else -1.0 for o in space.objectives]
        self.refs = [o.ref for o in space.objectives]
        self.constraints = {k: (b.min, b.max) for k, b in (space.constraints or {}).items()}
        self.observations: list[Observation] = []
        self.pending: dict[str, dict[str, Any]] = {}  # trial id -> {"config", "x", "extra"}
        self.n_asked = 0

    # ------------------------------------------------------------------ public API
    def ask(self, trial_id: str | None = None) -> tuple[str, dict[str, Any]]:
        """Propose the next config. Returns ``(trial_id, config)`` (config: active params only).

        Raises:
            ValueError: ``trial_id`` is already pending or observed.
        """
        tid = str(trial_id if trial_id is not None else f"t{self.n_asked}")
        return tid, self.ask_completing(tid, {})

    def ask_completing(self, trial_id: str, given: Mapping[str, Any],
                       extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Propose a config with the ``given`` values fixed: this searcher's own proposal with
        them laid over it (a partial Ray ``points_to_evaluate`` entry, as Optuna's
        ``enqueue_trial`` takes some params and samples the rest). It counts as asked.

        Raises:
            ValueError: ``trial_id`` is already pending or observed.
        """
        tid = self._new_id(trial_id)
        config, drawn = self._suggest(tid)
        config = self._clip({**config, **given})
        self._add_pending(tid, config, {**(drawn or {}), **(extra or {})})
        return dict(config)

    def _new_id(self, trial_id) -> str:
        """``trial_id`` as a string. Raises: ValueError: it is already pending or observed."""
        tid = str(trial_id)
        if tid in self.pending or any(o.trial_id == tid for o in self.observations):
            raise ValueError(f"trial id {tid!r} was already asked")
        return tid

    def _add_pending(self, tid: str, config: Mapping[str, Any], extra) -> None:
        """Record ``config`` as asked and pending under ``tid``."""
        self.n_asked += 1
        self.pending[tid] = {"config": dict(config), "x": list(self.space.encode(config)),
                             "extra": extra}

    def adopt(self, trial_id: str, config: Mapping[str, Any], extra: Mapping[str, Any] | None = None,
              *, draw: bool = False) -> None:
        """Register ``config`` as pending under ``trial_id``: a config proposed elsewhere (Ray
        Tune's ``points_to_evaluate``), or one this searcher proposed before its state was
        saved (a trial a resumed search runs again because the driver stopped before Ray Tune
        saved it). It counts as asked.

        Args:
            draw: first draw, and discard, the proposal :meth:`ask` would make now, so that
                the searcher's state (random generator, Sobol index) moves on as it did when
                it proposed ``config`` (without it, the next ask would propose it again).

        Raises:
            ValueError: ``trial_id`` is already pending or observed.
        """
        tid = self._new_id(trial_id)
        drawn_extra = self._suggest(tid)[1] if draw else {}
        self._add_pending(tid, config, {**(drawn_extra or {}), **(extra or {})})

    def tell(self, trial_id: str, metrics: Mapping[str, float] | None, *, fidelity: float = 1.0,
             error: bool = False, config: Mapping[str, Any] | None = None) -> None:
        """Report a trial's result.

        Args:
            trial_id: as returned by :meth:`ask` (an unknown id is accepted when ``config`` is
                given: a trial evaluated outside this searcher).
            metrics: metric name -> value (must hold every objective metric unless ``error``);
                a NaN objective counts as an error; an infinite one is kept (a trainable's
                "infinitely bad" result, from the Optuna sampler or the Ray searchers: AHTO's
                model clips it to the worst value observed, as Optuna's ``GPSampler`` does;
                the CLI's own trials report none, a diverged trial fails).
            fidelity: fraction of the training budget the trial got, in ``(0, 1]``.
            error: the trial failed; it is dropped from the pending set and never modelled.
            config: the config actually evaluated, when it differs from the suggestion (replay
                on a table maps a suggestion to the nearest recorded config).

        Raises:
            KeyError: unknown ``trial_id`` and no ``config``.
            ValueError: ``fidelity`` outside ``(0, 1]``.
        """
        if not 0.0 < float(fidelity) <= 1.0:
            raise ValueError(f"fidelity must be in (0, 1], got {fidelity}")
        p = self.pending.pop(str(trial_id), None)
        if p is None and config is None:
            raise KeyError(f"unknown trial id {trial_id!r}")
        p = p or {"config": dict(config), "x": None, "extra": {}}
        if config is not None:
            p = {**p, "config": dict(config), "x": list(self.space.encode(config))}
        m = None
        if not error and metrics is not None:
            m = {k: float(v) for k, v in metrics.items() if is_number(v)}
            if self.cost_fn is not None:  # known costs are exact: fill in what is missing
                for k, v in self.cost_fn(p["config"]).items():
                    m.setdefault(k, float(v))
            if not all(k in m and not math.isnan(m[k]) for k in self.metrics):
                m = None
        obs = Observation(str(trial_id), p["config"], p["x"], m, float(fidelity), p["extra"])
        self.observations.append(obs)
        self._observe(obs)

    def restrict_configurations(self, configs: list[Mapping[str, Any]]) -> None:
        """Propose only configs from ``configs`` and never one already asked (Syne Tune's
        ``restrict_configurations``: a replay benchmark on a recorded table).

        Raises:
            NotImplementedError: the searcher cannot be restricted (:attr:`supports_restriction`).
        """
        raise NotImplementedError(f"searcher {self.name!r} cannot be restricted to a table")

    # ------------------------------------------------------------------ helpers
    def _clip(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Clip numeric values into their bounds (log-scale decoding can overshoot by an ulp)
        and onto a float param's ``step`` grid."""
        out = dict(config)
        for k, v in out.items():
            p = self.space.params[k]
            if p.type == "float" and getattr(p, "step", None):
                n = math.floor((p.high - p.low) / p.step + 1e-9)
                v = p.low + min(max(round((v - p.low) / p.step), 0), n) * p.step
            if p.type in ("int", "float"):
                out[k] = type(v)(min(max(v, p.low), p.high))
        return out

    def objective_values(self, metrics: Mapping[str, float]) -> list[float]:
        """Objectives in maximisation form (``sign * value``)."""
        return [s * float(metrics[k]) for k, s in zip(self.metrics, self.signs)]

    def feasible(self, metrics: Mapping[str, float]) -> bool:
        """Whether every constraint whose metric is in ``metrics`` holds (a NaN or infinite
        constraint metric is infeasible): all of :meth:`constraint_values` are <= 0."""
        return all(v <= 0 for v in self.constraint_values(metrics).values())

    def constraint_values(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Optuna-style constraint values (feasible when <= 0): the space's
        ``constraint_values``."""
        return self.space.constraint_values(metrics)

    def known_feasible(self, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` satisfies the constraints the cost function can check (True if
        there is no cost function)."""
        if self.cost_fn is None or not self.constraints:
            return True
        return self.feasible(self.cost_fn(config))

    def finished(self, full_only: bool = False) -> list[Observation]:
        """Successful observations (at full fidelity only if ``full_only``)."""
        return [o for o in self.observations if o.ok and (o.fidelity >= 1.0 or not full_only)]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically (picklable)."""
        return {"name": self.name, "seed": self.seed, "n_asked": self.n_asked,
                "observations": [o.__dict__.copy() for o in self.observations],
                "pending": {k: dict(v) for k, v in self.pending.items()},
                "impl": self._state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` into a searcher built with the same space and seed.

        Raises:
            ValueError: the state belongs to another kind of searcher.
        """
        if state.get("name") != self.name:
            raise ValueError(f"state of searcher {state.get('name')!r}, not {self.name!r}")
        self.n_asked = int(state["n_asked"])
        self.observations = [Observation(**o) for o in state["observations"]]
        self.pending = {k: dict(v) for k, v in state["pending"].items()}
        self._load_state(state["impl"])

    def save(self, path: str | Path) -> None:
        """Write :meth:`state_dict` to ``path`` atomically (:func:`archsearch.runs.atomic_write`).

        Raises:
            SearchStopped: the state could not be taken or pickled (one line naming the
                searcher; the file is left as it was).
        """
        from archsearch.runs import atomic_write

        try:
            blob = pickle.dumps(self.state_dict())
        except Exception as e:
            raise state_error(self.name, e) from e
        atomic_write(path, blob)

    def restore(self, path: str | Path) -> None:
        """Load what :meth:`save` wrote (a file this program wrote itself: pickle)."""
        with open(path, "rb") as f:
            self.load_state_dict(pickle.load(f))

    # ------------------------------------------------------------------ subclass hooks
    @abstractmethod
    def _suggest(self, trial_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """Return ``(config, extra)``; ``extra`` is kept with the trial until its tell."""

    def _observe(self, obs: Observation) -> None:
        """Called after each tell."""

    def _state(self) -> Any:
        return None

    def _load_state(self, state: Any) -> None:
        pass
