"""Baseline searchers behind the same ask/tell API: Optuna's random, TPE and NSGA-II samplers.

* ``random``: ``optuna.samplers.RandomSampler``.
* ``tpe``: multivariate TPE (Bergstra et al. 2011, "Algorithms for Hyper-Parameter
  Optimization"; Optuna's multi-objective variant, Ozaki et al. 2020), ``n_startup_trials``
  random trials first (default 6, the model-based searchers' Sobol design size).
* ``nsga2``: NSGA-II (Deb et al. 2002) with Optuna's default crossover and mutation.

TPE and NSGA-II see the constraints through Optuna's ``constraints_func`` (``value - max`` and
``min - value``, feasible when <= 0). Known constraints (checked by the cost function before
training) are enforced by re-asking: an infeasible suggestion is told to Optuna as ``FAIL``
and another one is drawn (at most ``max_resample`` times). Trials below full fidelity (stopped
by ASHA) are told as ``PRUNED``: these samplers do not model fidelity.

This module wraps Optuna (a baseline, not the framework-free core): Optuna is imported lazily.
"""

from __future__ import annotations

import pickle
from typing import Any, Mapping

from archsearch.search.base import CostFn, Observation, Searcher

BASELINES = ("random", "tpe", "nsga2")


class OptunaSearcher(Searcher):
    """An Optuna sampler driven through ``study.ask`` / ``study.tell``.

    Args:
        kind: ``"random"``, ``"tpe"`` or ``"nsga2"``.
        space, seed, cost_fn: see :class:`~archsearch.search.base.Searcher`.
        n_startup_trials: TPE's random start; population_size: NSGA-II's (default:
            ``max(4, min(20, horizon // 3))``); horizon: expected trials (default: the space's
            budget); max_resample: re-asks for a known-infeasible suggestion.

    Raises:
        ValueError: unknown ``kind``.
    """

    def __init__(self, kind: str, space, *, seed: int = 0, cost_fn: CostFn | None = None,
                 n_startup_trials: int = 6, population_size: int | None = None,
                 horizon: int | None = None, max_resample: int = 100):
        if kind not in BASELINES:
            raise ValueError(f"unknown baseline {kind!r}; choose one of {', '.join(BASELINES)}")
        super().__init__(space, seed=seed, cost_fn=cost_fn)
        import optuna

        self.name = kind
        self.max_resample = int(max_resample)
        budget = getattr(space, "budget", None)
        horizon = int(horizon or (budget.trials if budget is not None else 40))
        cons = self._constraint_values if self.constraints else None
        if kind == "random":
            sampler = optuna.samplers.RandomSampler(seed=seed)
        elif kind == "tpe":
            sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials,
                                                 multivariate=True, constraints_func=cons)
        else:
            pop = population_size or max(4, min(20, horizon // 3))
            sampler = optuna.samplers.NSGAIISampler(seed=seed, population_size=pop,
                                                    constraints_func=cons)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(
            directions=["maximize" if s > 0 else "minimize" for s in self.signs], sampler=sampler)
        self.trials: dict[str, tuple[int, dict]] = {}  # trial id -> (optuna number, params)

    @staticmethod
    def _constraint_values(frozen) -> list[float]:
        return list(frozen.user_attrs.get("constraints", [0.0]))

    def _cvals(self, metrics: Mapping[str, float]) -> list[float]:
        out = []
        for k, (lo, hi) in self.constraints.items():
            v = metrics.get(k)
            if hi is not None:
                out.append(0.0 if v is None else float(v) - hi)
            if lo is not None:
                out.append(0.0 if v is None else lo - float(v))
        return out

    def _suggest(self, trial_id: str):
        import optuna

        for _ in range(self.max_resample):
            trial = self.study.ask()
            cfg = self.space.suggest(trial)
            if self.known_feasible(cfg):
                break
            trial.set_user_attr("constraints", self._cvals(self.cost_fn(cfg)))
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self.trials[trial_id] = (trial.number, dict(cfg))
        return cfg, {}

    def _observe(self, obs: Observation) -> None:
        import optuna

        number, asked = self.trials.pop(obs.trial_id, (None, None))
        trial = number
        TS = optuna.trial.TrialState
        if not obs.ok:
            if trial is not None:
                self.study.tell(trial, state=TS.FAIL)
            return
        values = [float(obs.metrics[k]) for k in self.metrics]
        cvals = self._cvals(obs.metrics)
        if trial is not None and asked == obs.config:
            self.study._storage.set_trial_user_attr(
                self.study._storage.get_trial_id_from_study_id_trial_number(
                    self.study._study_id, number), "constraints", cvals)
            if obs.fidelity < 1.0:
                self.study.tell(trial, state=TS.PRUNED)
            else:
                self.study.tell(trial, values)
            return
        # evaluated elsewhere / mapped to another config: record what was actually run
        if trial is not None:
            self.study.tell(trial, state=TS.FAIL)
        if obs.fidelity >= 1.0:
            dists = self.space.to_optuna()
            self.study.add_trial(optuna.trial.create_trial(
                params=obs.config, distributions={k: dists[k] for k in obs.config},
                values=values, user_attrs={"constraints": cvals}))

    def _state(self) -> Any:
        return pickle.dumps((self.study, self.trials))

    def _load_state(self, state: Any) -> None:
        self.study, self.trials = pickle.loads(state)
