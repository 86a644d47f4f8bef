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

The study these samplers learn from is private to the searcher (in memory). Its state is plain
data, never a pickled sampler (Optuna 5.1's NSGA-II holds a ``threading.Lock``; a sampler's
private attributes change between releases): the study's trials (params, distributions as
Optuna's JSON, values, states, attributes), the study's attributes, the sampler's constructor
arguments, the states of the NumPy generators it holds and, for ``GPSampler``, the kernel
parameters its next fit starts from. A restore builds a new sampler from the arguments and
puts the rest back, so the next suggestion is the one the saved searcher would have made. The
same state is what ``pickle`` takes of the searcher (Ray Tune pickles its searcher into
``tuner.pkl``). A run's Optuna storage holds one study, the record the Ray adapter writes
(:mod:`archsearch.search.adapters.ray`), which is what ``archsearch dashboard`` opens.

This module wraps Optuna (a baseline, not the framework-free core): Optuna is imported lazily.
"""

from __future__ import annotations

import pickle
from typing import Any

from archsearch.search.base import CostFn, Observation, Searcher

BASELINES = ("random", "tpe", "nsga2", "gp")
#: the samplers a ``history`` warm-starts (those with a random start to replace)
HISTORY_KINDS = ("gp", "tpe")

#: GPSampler's warm starts: the kernel parameters of its last fit, per objective and per
#: constraint (the attributes ``optuna._gp.gp.fit_kernel_params`` reads of its ``gpr_cache``).
_GP_CACHES = ("_gprs_cache_list", "_constraints_gprs_cache_list")
_KERNEL_FIELDS = ("inverse_squared_lengthscales", "kernel_scale", "noise_var")


class OptunaSearcher(Searcher):
    """An Optuna sampler driven through ``study.ask`` / ``study.tell``.

    Args:
        kind: ``"random"``, ``"tpe"``, ``"nsga2"`` or ``"gp"`` (Optuna's ``GPSampler``: a GP with
            log EI / log EHVI, Optuna's own model-based baseline).
        space, seed, cost_fn: see :class:`~archsearch.search.base.Searcher`.
        n_startup_trials: TPE's and GPSampler's random start (default: ``min(6, budget.trials)``);
            population_size: NSGA-II's (default: ``max(4, min(20, budget.trials // 3))``);
            max_resample: re-asks for a known-infeasible suggestion.
        initial_configs: configs proposed first, in order, through ``study.enqueue_trial`` (a
            warm start: e.g. configs that did well on related tasks); they count towards
            ``n_startup_trials``.
        history: earlier searches (``"gp"`` and ``"tpe"`` only; any form
            :func:`archsearch.search.transfer.history_tasks` reads): a warm start of
            ``n_startup_trials`` configs enqueued after ``initial_configs``, chosen by the
            Gaussian-copula prior fitted on them (:class:`~archsearch.search.transfer.CopulaPrior`,
            ``design(method=history_design)``: by default a greedy set cover of the past tasks'
            predicted fronts, Wistuba et al. 2015), as many as ``initial_configs`` leaves of
            the random start; the sampler itself is unchanged. The prior is fitted at
            construction (also before a restore: the design is not part of the saved state).
        history_design: ``"setcover"`` or ``"mean"`` (see ``CopulaPrior.design``).

    Raises:
        ValueError: unknown ``kind``; ``history`` for ``random`` or ``nsga2``; a history the
            prior cannot use (no shared parameter, no objective, too few trials).
    """

    def __init__(self, kind: str, space, *, seed: int = 0, cost_fn: CostFn | None = None,
                 n_startup_trials: int | None = None, population_size: int | None = None,
                 max_resample: int = 100, initial_configs: list[dict] | None = None,
                 history=None, history_design: str = "setcover"):
        if kind not in BASELINES:
            raise ValueError(f"unknown baseline {kind!r}; choose one of {', '.join(BASELINES)}")
        if history and kind not in HISTORY_KINDS:
            raise ValueError(f"history: {kind!r} takes none (only {', '.join(HISTORY_KINDS)})")
        super().__init__(space, seed=seed, cost_fn=cost_fn)
        import optuna

        self.name = kind
        self.max_resample = int(max_resample)
        self.initial_configs = [dict(c) for c in initial_configs or []]
        self.initial_used = 0
        horizon = int(space.budget.trials)
        startup = n_startup_trials if n_startup_trials is not None else min(6, horizon)
        #: the sampler's class in ``optuna.samplers`` and its constructor arguments
        self.sampler_args: tuple[str, dict[str, Any]] = {
            "random": ("RandomSampler", {"seed": seed}),
            "tpe": ("TPESampler", {"seed": seed, "n_startup_trials": startup, "multivariate": True}),
            "gp": ("GPSampler", {"seed": seed, "n_startup_trials": startup,
                                 "warn_independent_sampling": False}),
            "nsga2": ("NSGAIISampler", {"seed": seed, "population_size":
                                        population_size or max(4, min(20, horizon // 3))}),
        }[kind]
        if history:  # the warm start: the prior's design, enqueued like initial_configs
            from archsearch.search import transfer

            prior = transfer.CopulaPrior(space, history, self.metrics, self.signs, seed=seed)
            transfer.warn_ignored(prior)
            self.initial_configs += prior.design(space, max(0, startup - len(self.initial_configs)), seed=seed,
                                                 feasible=self.known_feasible, method=history_design)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = self._new_study()
        self.trials: dict[str, tuple[int, dict]] = {}  # trial id -> (optuna number, params)

    def _new_study(self):
        """An empty in-memory study with a new sampler built from :attr:`sampler_args`."""
        import optuna

        cls, kwargs = self.sampler_args
        return optuna.create_study(
            directions=["maximize" if s > 0 else "minimize" for s in self.signs],
            sampler=getattr(optuna.samplers, cls)(**kwargs))

    def _trial(self, number: int):
        """The live ``optuna.Trial`` of trial ``number`` (to set constraints before its tell)."""
        import optuna

        storage = self.study._storage
        tid = storage.get_trial_id_from_study_id_trial_number(self.study._study_id, number)
        return optuna.trial.Trial(self.study, tid)

    def _suggest(self, trial_id: str):
        import optuna

        for attempt in range(self.max_resample):
            if self.initial_used < len(self.initial_configs):  # the warm start, as given
                self.study.enqueue_trial(self.initial_configs[self.initial_used])
                self.initial_used += 1
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

    # ------------------------------------------------------------------ state (plain data)
    def _state(self) -> Any:
        return {"study": study_state(self.study), "sampler_args": self.sampler_args,
                "trials": {k: (n, dict(p)) for k, (n, p) in self.trials.items()},
                "initial_used": self.initial_used}

    def _load_state(self, state: Any) -> None:
        if isinstance(state, bytes):  # written before the plain-data state: a pickled study
            self.study, self.trials = pickle.loads(state)
            return
        if state["sampler_args"][0] != self.sampler_args[0]:
            raise ValueError(f"state of a {state['sampler_args'][0]}, not a {self.sampler_args[0]}")
        self.sampler_args = (state["sampler_args"][0], dict(state["sampler_args"][1]))
        self.study = self._new_study()
        load_study_state(self.study, state["study"])
        self.trials = {k: (int(n), dict(p)) for k, (n, p) in state["trials"].items()}
        self.initial_used = int(state.get("initial_used", 0))

    def __getstate__(self):  # pickle (Ray Tune's tuner.pkl): the plain-data state, no sampler
        out = self.__dict__.copy()
        out["study"] = study_state(self.study)
        return out

    def __setstate__(self, state):
        self.__dict__.update(state)
        study = state["study"]
        self.study = self._new_study()
        load_study_state(self.study, study)


def _rng_states(obj, path: str = "", seen: set | None = None, depth: int = 0) -> dict[str, Any]:
    """``{attribute path: state}`` of the NumPy generators a sampler holds (its ``_rng``, its
    fallback sampler's, ...), each reached once (NSGA-II's strategies share the sampler's). A
    generator not drawn from yet is left out: a new sampler with the same seed has the same."""
    import numpy as np
    from optuna.samplers import BaseSampler

    seen = set() if seen is None else seen
    out: dict[str, Any] = {}
    for name, value in sorted(vars(obj).items()):
        key = f"{path}.{name}" if path else name
        if id(value) in seen:
            continue
        rng = getattr(value, "_rng", None) if type(value).__name__ == "LazyRandomState" else value
        if isinstance(rng, np.random.RandomState):
            seen.add(id(value))
            out[key] = rng.get_state()
        elif isinstance(value, BaseSampler) and depth < 3:
            seen.add(id(value))
            out.update(_rng_states(value, key, seen, depth + 1))
    return out


def _set_rng_states(sampler, states: dict[str, Any]) -> None:
    """Put :func:`_rng_states` back into a new sampler of the same class (in place, so that
    objects sharing a generator keep sharing it). A path this Optuna release does not have is
    skipped: the generator keeps its seeded start."""
    import numpy as np

    for key, state in states.items():
        obj = sampler
        for name in key.split("."):
            obj = getattr(obj, name, None)
        if type(obj).__name__ == "LazyRandomState":
            obj = obj.rng
        if isinstance(obj, np.random.RandomState):
            obj.set_state(state)


def study_state(study) -> dict[str, Any]:
    """An in-memory Optuna study as plain data: every trial (number order), the study's
    attributes, the sampler's generator states and GPSampler's kernel warm starts."""
    from optuna.distributions import distribution_to_json

    storage, sid = study._storage, study._study_id
    trials = [{"state": t.state.name, "values": None if t.values is None else list(t.values),
               "params": dict(t.params),
               "distributions": {k: distribution_to_json(d) for k, d in t.distributions.items()},
               "user_attrs": dict(t.user_attrs), "system_attrs": dict(t.system_attrs),
               "intermediate_values": dict(t.intermediate_values)}
              for t in study.get_trials(deepcopy=False)]
    caches = {}
    for name in _GP_CACHES:
        gprs = getattr(study.sampler, name, None)
        if gprs is not None:
            caches[name] = [{f: getattr(g, f).detach().cpu().numpy().copy() for f in _KERNEL_FIELDS}
                            for g in gprs]
    return {"trials": trials, "system_attrs": dict(storage.get_study_system_attrs(sid)),
            "user_attrs": dict(storage.get_study_user_attrs(sid)),
            "rng": _rng_states(study.sampler), "gp_caches": caches}


def load_study_state(study, state: dict[str, Any]) -> None:
    """Put :func:`study_state` into a new, empty study whose sampler was built with the same
    arguments: trials keep their numbers (an in-memory study numbers them in order)."""
    from types import SimpleNamespace

    import optuna
    import torch
    from optuna.distributions import json_to_distribution

    storage, sid = study._storage, study._study_id
    for k, v in state["system_attrs"].items():
        storage.set_study_system_attr(sid, k, v)
    for k, v in state["user_attrs"].items():
        storage.set_study_user_attr(sid, k, v)
    for t in state["trials"]:
        frozen = optuna.trial.create_trial(
            state=optuna.trial.TrialState[t["state"]], values=t["values"], params=t["params"],
            distributions={k: json_to_distribution(d) for k, d in t["distributions"].items()},
            user_attrs=t["user_attrs"], system_attrs=t["system_attrs"],
            intermediate_values={int(k): v for k, v in t["intermediate_values"].items()})
        storage.create_new_trial(sid, template_trial=frozen)
    _set_rng_states(study.sampler, state["rng"])
    for name, gprs in state["gp_caches"].items():
        if hasattr(study.sampler, name):
            setattr(study.sampler, name, [SimpleNamespace(**{f: torch.from_numpy(v.copy()) for f, v in g.items()})
                                          for g in gprs])
