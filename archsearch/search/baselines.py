"""Baseline searchers behind the same ask/tell API: Optuna's random, TPE and NSGA-II samplers.

* ``random``: ``optuna.samplers.RandomSampler``.
* ``tpe``: multivariate TPE (Bergstra et al. 2011, "Algorithms for Hyper-Parameter
  Optimization"; Optuna's multi-objective variant, Ozaki et al. 2020), ``n_startup_trials``
  random trials first (default 6, the model-based searchers' Sobol design size).
* ``nsga2``: NSGA-II (Deb et al. 2002) with Optuna's default crossover and mutation.

TPE and NSGA-II see the constraints through Optuna 5's ``Trial.set_constraint`` (one key per
bound, ``"METRIC.max": value - max`` and ``"METRIC.min": min - value``, feasible when <= 0; the
samplers read ``FrozenTrial.constraints``). Known constraints (checked by the cost function before
training) are enforced by re-asking: an infeasible suggestion is told to Optuna as ``FAIL``
and another one is drawn (at most ``max_resample`` times). Trials below full fidelity (stopped
by ASHA) are told as ``PRUNED``, never as ``COMPLETE`` with partial-budget values (these
samplers do not model fidelity); a pruned trial keeps its constraints, and with one objective
its partial value is its intermediate value (``trial.report`` at step ``round(100 *
fidelity)``, the percent of the budget), which is how TPE ranks pruned trials.

A trial told with another config than the one asked (``tell(..., config=row)``: replay on a
recorded table maps a suggestion to its nearest row) is recorded as what ran: the asked trial
is closed as ``FAIL`` and a ``COMPLETE`` trial with the evaluated params, values and
constraints is added, carrying the asked trial's system attributes, so NSGA-II counts it in
its generation (after ``population_size`` of them the next generation is bred from them).

The study these samplers learn from is private to the searcher (in memory, saved with its
state). A run's Optuna storage holds one study, the record the Ray adapter writes
(:mod:`archsearch.search.adapters.ray`), which is what ``archsearch dashboard`` opens.

This module wraps Optuna (a baseline, not the framework-free core): Optuna is imported lazily.
"""

from __future__ import annotations

import pickle
from typing import Any

from archsearch.search.base import CostFn, Observation, Searcher

BASELINES = ("random", "tpe", "nsga2", "gp")


class OptunaSearcher(Searcher):
    """An Optuna sampler driven through ``study.ask`` / ``study.tell``.

    Args:
        kind: ``"random"``, ``"tpe"``, ``"nsga2"`` or ``"gp"`` (Optuna's ``GPSampler``: a GP with
            log EI / log EHVI, Optuna's own model-based baseline).
        space, seed, cost_fn: see :class:`~archsearch.search.base.Searcher`.
        n_startup_trials: TPE's and GPSampler's random start (default: ``min(6, budget.trials)``);
            population_size: NSGA-II's (default: ``max(4, min(20, budget.trials // 3))``);
            max_resample: re-asks for a known-infeasible suggestion.

    Raises:
        ValueError: unknown ``kind``.
    """

    def __init__(self, kind: str, space, *, seed: int = 0, cost_fn: CostFn | None = None,
                 n_startup_trials: int | None = None, population_size: int | None = None,
                 max_resample: int = 100):
        if kind not in BASELINES:
            raise ValueError(f"unknown baseline {kind!r}; choose one of {', '.join(BASELINES)}")
        super().__init__(space, seed=seed, cost_fn=cost_fn)
        import optuna

        self.name = kind
        self.max_resample = int(max_resample)
        horizon = int(space.budget.trials)
        if kind == "random":
            sampler = optuna.samplers.RandomSampler(seed=seed)
        elif kind == "tpe":
            startup = n_startup_trials if n_startup_trials is not None else min(6, horizon)
            sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True)
        elif kind == "gp":
            startup = n_startup_trials if n_startup_trials is not None else min(6, horizon)
            sampler = optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup,
                                                warn_independent_sampling=False)
        else:
            pop = population_size or max(4, min(20, horizon // 3))
            sampler = optuna.samplers.NSGAIISampler(seed=seed, population_size=pop)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(
            directions=["maximize" if s > 0 else "minimize" for s in self.signs], sampler=sampler)
        self.trials: dict[str, tuple[int, dict]] = {}  # trial id -> (optuna number, params)

    def _trial(self, number: int):
        """The live ``optuna.Trial`` of trial ``number`` (to set constraints before its tell)."""
        import optuna

        storage = self.study._storage
        tid = storage.get_trial_id_from_study_id_trial_number(self.study._study_id, number)
        return optuna.trial.Trial(self.study, tid)

    def _suggest(self, trial_id: str):
        import optuna

        for attempt in range(self.max_resample):
            trial = self.study.ask()
            cfg = self.space.suggest(trial)
            if self.known_feasible(cfg) or attempt == self.max_resample - 1:
                break  # the last draw is proposed even if infeasible: its trial stays open
            for key, value in self.constraint_values(self.cost_fn(cfg)).items():
                trial.set_constraint(key, value)
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
        cvals = self.constraint_values(obs.metrics)
        # the core clipped the suggestion (base.Searcher._clip): compare like with like
        if trial is not None and self._clip(asked) == obs.config:
            live = self._trial(number)
            for key, value in cvals.items():
                live.set_constraint(key, value)
            if obs.fidelity < 1.0:
                if len(values) == 1:
                    live.report(values[0], step=round(100 * obs.fidelity))
                self.study.tell(trial, state=TS.PRUNED)
            else:
                self.study.tell(trial, values)
            return
        # evaluated elsewhere / mapped to another config: record what was actually run. The
        # added trial inherits the asked trial's system attributes (NSGA-II's generation,
        # "NSGAIISampler:generation", set when it was asked): without it NSGA-II counts no
        # trial in any generation and draws its first generation at random forever.
        inherited = {}
        if trial is not None:
            storage = self.study._storage
            asked_trial = storage.get_trial(
                storage.get_trial_id_from_study_id_trial_number(self.study._study_id, number))
            inherited = {k: v for k, v in asked_trial.system_attrs.items()
                         if not k.startswith("constraints")}
            self.study.tell(trial, state=TS.FAIL)
        if obs.fidelity >= 1.0:
            dists = self.space.to_optuna()
            self.study.add_trial(optuna.trial.create_trial(
                params=obs.config, distributions={k: dists[k] for k in obs.config},
                values=values, constraints=cvals, system_attrs=inherited))

    def _state(self) -> Any:
        return pickle.dumps((self.study, self.trials))

    def _load_state(self, state: Any) -> None:
        self.study, self.trials = pickle.loads(state)
