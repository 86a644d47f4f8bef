"""AHTO and qLogNEHVI as Optuna samplers a plain Optuna user can drop in.

    import optuna
    from archsearch.search.samplers import AHTOSampler

    def objective(trial):
        x = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        n = trial.suggest_int("layers", 1, 6)
        trial.set_constraint("params.max", params(n) - 2e6)   # optional (<= 0 is feasible)
        return accuracy(x, n), flops(n)

    study = optuna.create_study(directions=["maximize", "minimize"], sampler=AHTOSampler(seed=0))
    study.optimize(objective, n_trials=40)

No archsearch search space is needed: like Optuna's own ``GPSampler``, the sampler takes the
space from the study. On every trial it

1. infers the relative search space: with ``model_branches=True`` (default) the *union* of the
   finished trials' distributions (a param that only some trials have, e.g. in a branch of a
   define-by-run objective, is modelled too, so one GP sees every branch; a name whose
   distribution differs between trials is left to ``independent_sampler``). A branch param
   becomes a *condition* of the space where the trials explain it
   (:func:`infer_conditions`: active when a categorical takes the values it was seen with),
   so every candidate the acquisition scores is a configuration the objective can produce;
   where no categorical explains it (a branch on a float), an "active" indicator column is
   added instead (``model_branches="indicators"`` does that for every branch param: the
   behaviour before conditions, an ablation). With ``model_branches=False`` the distributions
   every finished trial shares (``IntersectionSearchSpace``; branch params sampled
   independently, random by default);
2. builds an :class:`archsearch.space.ParamSpace` from those distributions (float/int bounds,
   ``log`` and ``step`` kept; categorical choices one-hot; choices that are not numbers,
   strings or booleans, e.g. ``None``, by their index: :func:`code_choices`), the study's directions and metric
   names (``study.set_metric_names``, else ``objective_0``, ...) and the constraint keys found
   on the trials (``Trial.set_constraint`` or the older ``constraints_func``; each becomes a
   learned constraint ``value <= 0``);
3. rebuilds the searcher core from ``study.get_trials()``: COMPLETE trials are observations,
   RUNNING/WAITING ones are pending points (so several workers on one storage do not propose
   the same point), FAIL ones are failures; trials added with ``study.add_trial``, a resumed
   study and other workers all inform it, because nothing is kept between calls;
4. asks the core (a scrambled Sobol design for the first ``n_startup_trials``, then the GP and
   qLogNEHVI, or qLogNEI for one objective; AHTO adds its meta-trained candidate policy:
   :mod:`archsearch.search.ahto`).

Pruned trials are ignored (their values are not the objective's). Sources: Optuna's sampler
API (``optuna.samplers.BaseSampler``: relative vs independent sampling); qLogNEHVI/qLogNEI:
Ament et al. 2023; AHTO: docs/design.md "AHTO outer loop".
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import optuna
from optuna.distributions import (BaseDistribution, CategoricalDistribution, FloatDistribution,
                                  IntDistribution)
from optuna.samplers import BaseSampler, RandomSampler
from optuna.search_space import IntersectionSearchSpace
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

CONSTRAINT_PREFIX = "constraint:"
EXTRA_ATTR = "archsearch:ask"  #: trial system attribute: what the core decided at ask time
ACTIVE_SUFFIX = "?active"  #: the indicator param of a branch param (model_branches)


def _jsonable(v: Any) -> Any:
    """``v`` with tensors/numpy values as lists and numbers (for Optuna's JSON storage)."""
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "tolist"):
        return v.tolist()
    return v


def code_choices(dists: dict[str, BaseDistribution]) -> tuple[dict[str, BaseDistribution], dict[str, list]]:
    """``dists`` with every categorical whose choices are not all numbers, strings or booleans
    (``None``, lists such as layer sizes, dicts) replaced by a categorical of their indices,
    and ``{name: its choices}`` for those: the searcher cores search the index (an unordered
    categorical either way; one-hot encoded) and the drop-ins map it back."""
    coded = {k: list(d.choices) for k, d in dists.items() if isinstance(d, CategoricalDistribution)
             and not all(isinstance(c, (bool, int, float, str)) for c in d.choices)}
    return ({k: CategoricalDistribution(list(range(len(coded[k])))) if k in coded else d
             for k, d in dists.items()}, coded)


def choice_index(choices: list, value: Any) -> int:
    """The index of ``value`` among ``choices`` (equal and of the same type: ``0`` is not
    ``False``).

    Raises:
        ValueError: ``value`` is not one of ``choices``."""
    for i, c in enumerate(choices):
        if type(c) is type(value) and c == value:
            return i
    raise ValueError(f"{value!r} is not one of {choices}")


def infer_conditions(trials: Sequence[dict[str, Any]], branch: Sequence[str],
                     categoricals: Sequence[str]) -> dict[str, dict[str, list]]:
    """The conditions that explain when each ``branch`` param appears in ``trials``.

    A categorical ``c`` explains param ``k`` when ``c`` is present in every trial that has
    ``k``, some trial has ``c`` without ``k``, and no value of ``c`` is seen both with and
    without ``k``: then ``k`` is active when ``c`` takes one of the values it was seen with
    (``{k: {c: [values]}}``). Among several, the one present in the most trials (then by
    name). A param no categorical explains (a branch on a float) is left out. Chains resolve
    through the space: a param whose explaining categorical is itself conditional is active
    only when that one is. No cycle can form (``c`` is present in strictly more trials than
    ``k``). The data can be fooled by a coincidence (a shared categorical whose values happen
    to split like the branch); the next trial that contradicts it removes the condition.
    Same idea as SMAC's and Hyperopt's conditional spaces, read off define-by-run trials.

    Args:
        trials: each finished trial's params (``{name: value}``; values hashable).
        branch: the params some trials lack.
        categoricals: the categorical params that may explain them.
    """
    out: dict[str, dict[str, list]] = {}
    for k in branch:
        found = []
        for c in categoricals:
            if c == k or not all(c in t for t in trials if k in t):
                continue
            with_k = {t[c] for t in trials if k in t}
            without = {t[c] for t in trials if c in t and k not in t}
            if without and not with_k & without:
                found.append((-sum(c in t for t in trials), c, sorted(with_k, key=repr)))
        if found:
            _, c, values = min(found, key=lambda f: f[:2])
            out[k] = {c: values}
    return out


def param_space_from_distributions(search_space: dict[str, BaseDistribution],
                                   directions: Sequence[StudyDirection],
                                   metric_names: Sequence[str] | None = None,
                                   constraint_keys: Sequence[str] = (),
                                   conditions: dict[str, dict[str, list]] | None = None):
    """An :class:`archsearch.space.ParamSpace` for Optuna distributions.

    Args:
        search_space: param name -> ``FloatDistribution``/``IntDistribution``/
            ``CategoricalDistribution`` (categorical choices must be numbers, strings or
            booleans).
        directions: one per objective.
        metric_names: the objectives' names (default, or when a name repeats: ``objective_0``,
            ...).
        constraint_keys: Optuna constraint keys; each is a metric ``constraint:KEY`` with
            ``max: 0``.
        conditions: ``{param: {categorical: [values]}}`` (:func:`infer_conditions`): the
            param's ``when``; the params are ordered so that each comes after what it depends on.

    Raises:
        ValueError: an unsupported distribution or choice (e.g. ``None``).
    """
    from archsearch.space import ParamSpace

    conditions = conditions or {}
    params: dict[str, Any] = {}
    for name, dist in _dependency_order(search_space, conditions):
        if isinstance(dist, IntDistribution):
            params[name] = {"type": "int", "low": dist.low, "high": dist.high, "step": dist.step,
                            "log": dist.log}
        elif isinstance(dist, FloatDistribution):
            params[name] = {"type": "float", "low": dist.low, "high": dist.high, "log": dist.log,
                            "step": dist.step}
        elif isinstance(dist, CategoricalDistribution):
            if not all(isinstance(c, (bool, int, float, str)) for c in dist.choices):
                raise ValueError(f"{name}: choices must be numbers, strings or booleans")
            params[name] = {"type": "categorical", "choices": list(dist.choices)}
        else:
            raise ValueError(f"{name}: unsupported distribution {type(dist).__name__}")
        if name in conditions:
            params[name]["when"] = conditions[name]
    names = list(metric_names or [])
    if len(set(names)) != len(directions):  # none, or a name twice (Optuna allows it): by position
        names = [f"objective_{i}" for i in range(len(directions))]
    objectives = [{"metric": n, "mode": "max" if d == StudyDirection.MAXIMIZE else "min"}
                  for n, d in zip(names, directions)]
    constraints = {f"{CONSTRAINT_PREFIX}{k}": {"max": 0.0} for k in constraint_keys}
    return ParamSpace(objectives=objectives, constraints=constraints, params=params)


def _dependency_order(search_space: dict[str, BaseDistribution],
                      conditions: dict[str, dict[str, list]]) -> list[tuple[str, BaseDistribution]]:
    """``search_space``'s items with every param after the params its condition names
    (decoding reads conditions in order); otherwise in the given order."""
    out, placed, left = [], set(), list(search_space)
    while left:
        ready = [k for k in left if all(d in placed or d not in search_space for d in conditions.get(k, {}))]
        if not ready:
            raise ValueError(f"conditions form a cycle among {left}")
        for k in ready:
            out.append((k, search_space[k]))
            placed.add(k)
        left = [k for k in left if k not in placed]
    return out


class CoreSearcherSampler(BaseSampler):
    """An Optuna sampler around an archsearch model-based searcher core (see module docstring).

    Args:
        searcher: ``"ahto"`` or ``"qnehvi"`` (:func:`archsearch.search.make`).
        seed: seeds the Sobol design, the acquisition's quasi-MC samples and the
            independent sampler (``None``: a random seed).
        n_startup_trials: Sobol-design trials before the GP is used (default 10, as Optuna's
            ``GPSampler``).
        independent_sampler: samples params outside the relative search space (default
            ``RandomSampler(seed)``).
        constraints_func: the older Optuna constraint API (``FrozenTrial -> sequence of
            floats``, feasible when all <= 0); prefer ``Trial.set_constraint`` in the objective.
        model_branches: model the params of every branch of a define-by-run objective (the
            union of the trials' params; ``True``: as conditions where a categorical explains
            them, else with "active" indicator columns; ``"indicators"``: indicator columns
            for every branch param); False: only the params every trial shares.
        searcher_kwargs: passed to the searcher's constructor (e.g. ``num_restarts``);
            ``history=[study, ...]``: earlier Optuna studies (any storage) whose complete trials
            warm-start the search (:mod:`archsearch.search.transfer`; params matched by name
            and range, objectives by ``metric_names`` or order).

    Raises:
        ValueError: ``model_branches`` is not True, False or ``"indicators"``.
    """

    def __init__(self, searcher: str = "ahto", *, seed: int | None = None,
                 n_startup_trials: int = 10, independent_sampler: BaseSampler | None = None,
                 constraints_func: Callable[[FrozenTrial], Sequence[float]] | None = None,
                 model_branches: bool | str = True, **searcher_kwargs: Any):
        import numpy as np

        if model_branches not in (True, False, "indicators"):
            raise ValueError(f"model_branches must be True, False or 'indicators', not {model_branches!r}")
        self.searcher = searcher
        self._seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy % 2**31)
        self.n_startup_trials = int(n_startup_trials)
        self._independent = independent_sampler or RandomSampler(seed=seed)
        self._constraints_func = constraints_func
        self._kwargs = searcher_kwargs
        self._priors: dict = {}  #: transfer priors fitted from ``history``, per modelled space
        self._intersection = IntersectionSearchSpace()
        self.model_branches = model_branches
        self.last_source: str | None = None  #: what proposed the last relative sample

    def reseed_rng(self) -> None:
        import numpy as np

        self._seed = int(np.random.SeedSequence().entropy % 2**31)
        self._independent.reseed_rng()

    # ------------------------------------------------------------------ relative sampling
    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        space = self._union(study) if self.model_branches else self._intersection.calculate(study)
        return {name: dist for name, dist in space.items() if not dist.single()}

    @staticmethod
    def _union(study: Study) -> dict[str, BaseDistribution]:
        """Every param of the finished trials whose distribution is the same wherever it appears."""
        out: dict[str, BaseDistribution] = {}
        clash: set[str] = set()
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            for name, dist in t.distributions.items():
                if name in out and out[name] != dist:
                    clash.add(name)
                out.setdefault(name, dist)
        return {k: v for k, v in sorted(out.items()) if k not in clash}

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:  # no finished trial yet (or none shares a param): independent
            study._storage.set_trial_system_attr(trial._trial_id, EXTRA_ATTR, {"source": "independent"})
            return {}
        core = self.build_core(study, search_space, exclude=trial.number)
        _, config = core.ask(f"optuna-{trial.number}")
        _, coded = code_choices(search_space)
        config = {k: coded[k][v] if k in coded else v for k, v in config.items()}
        extra = _jsonable(core.pending[f"optuna-{trial.number}"]["extra"])
        self.last_source = extra.get("source")
        # what the core decided at ask time (its source: sobol, optimizer, ...), kept
        # with the trial in the storage
        study._storage.set_trial_system_attr(trial._trial_id, EXTRA_ATTR, extra)
        return {k: config[k] for k in search_space if k in config}

    def build_core(self, study: Study, search_space: dict[str, BaseDistribution], *,
                   exclude: int | None = None):
        """The searcher core with every trial of ``study`` told (trial ``exclude`` left out)."""
        from archsearch.search import make

        trials = [t for t in study.get_trials(deepcopy=False) if t.number != exclude]
        keys = sorted({k for t in trials if t.state == TrialState.COMPLETE for k in t.constraints})
        try:
            names = study.metric_names
        except AttributeError:  # Optuna < 3.2
            names = None
        # params some trials lack (branches): a condition each where a categorical explains
        # it, else an "active" indicator column
        complete = [t.params for t in trials if t.state == TrialState.COMPLETE]
        branch = [k for k in search_space if self.model_branches and not all(k in p for p in complete)]
        dists, coded = code_choices(search_space)
        conditions: dict[str, dict[str, list]] = {}
        if self.model_branches is True and branch:
            coded_trials = [{k: choice_index(coded[k], v) if k in coded else v for k, v in p.items()
                             if k in search_space} for p in complete]
            conditions = infer_conditions(coded_trials, branch, [k for k, d in dists.items()
                                                                 if isinstance(d, CategoricalDistribution)])
        branch = [k for k in branch if k not in conditions]
        dists.update({f"{k}{ACTIVE_SUFFIX}": IntDistribution(0, 1) for k in branch})
        space = param_space_from_distributions(dists, study.directions, names, keys, conditions)
        metrics = [o.metric for o in space.objectives]
        kwargs = dict(self._kwargs)
        key = (tuple(space.dims()), tuple(metrics))
        if kwargs.get("history") and key in self._priors:  # fitted once per space, not per ask
            kwargs["history"] = self._priors[key]
        core = make(self.searcher, space, seed=self._seed, n_init=self.n_startup_trials, **kwargs)
        if getattr(core, "prior", None) is not None:
            self._priors[key] = core.prior
        low = space.decode([0.0] * len(space.dims()))
        for t in trials:
            if not self.model_branches and not all(k in t.params for k in search_space):
                continue  # from another branch of a define-by-run objective
            if t.state in (TrialState.RUNNING, TrialState.WAITING) and \
                    not any(k in t.params for k in search_space):
                continue  # not sampled yet (another worker's fresh trial): no point to hold
            config = {k: choice_index(coded[k], t.params[k]) if k in coded else t.params[k]
                      for k in search_space if k in t.params}
            for k in branch:  # an inactive param: fixed at its low end, indicator 0
                config[f"{k}{ACTIVE_SUFFIX}"] = int(k in config)
                if k not in config:
                    config[k] = low[k]
            tid = f"optuna-{t.number}"
            if t.state not in (TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING):
                continue
            extra = dict(t.system_attrs.get(EXTRA_ATTR) or {})
            core.pending[tid] = {"config": config, "x": list(space.encode(config)), "extra": extra}
            if t.state == TrialState.COMPLETE and t.values is not None:
                m = dict(zip(metrics, t.values))
                m.update({f"{CONSTRAINT_PREFIX}{k}": v for k, v in t.constraints.items()})
                core.tell(tid, m)
            elif t.state in (TrialState.COMPLETE, TrialState.FAIL):
                core.tell(tid, None, error=True)
        # the Sobol design continues where the study is (trial k gets Sobol point k)
        core.n_asked = len(trials)
        if hasattr(core, "sobol_pos"):
            core.sobol_pos = len(trials)
        if hasattr(core, "initial_used"):  # the warm start's configs too (one per earlier trial)
            core.initial_used = min(len(trials), len(core.initial_configs))
        return core

    # ------------------------------------------------------------------ independent sampling
    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._independent.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._independent.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        if self._constraints_func is not None:
            from optuna.samplers._base import _process_constraints_after_trial

            _process_constraints_after_trial(self._constraints_func, study, trial, state)
        self._independent.after_trial(study, trial, state, values)


class AHTOSampler(CoreSearcherSampler):
    """AHTO (GP + qLogNEHVI/qLogNEI + the meta-trained acquisition policy of
    :mod:`archsearch.search.policy`) as an Optuna sampler.

    Args:
        seed, n_startup_trials, independent_sampler, constraints_func, model_branches: as
            :class:`CoreSearcherSampler`.
        policy: a policy weights file; ``None`` the shipped one; ``"none"``: no policy (plain
            qLogNEHVI).
        n_sobol, n_perturb, perturb_scale: the policy's candidate pool (Sobol points;
            perturbations of the front and of the restarts; their standard deviation, unit cube).
        num_restarts, raw_samples, maxiter: ``optimize_acqf`` effort per ask (restarts, raw
            Sobol samples for their starts, L-BFGS-B iterations).
        mc_samples: quasi-MC samples of the acquisition.
        gp_maxiter: L-BFGS-B iterations of each GP's marginal-likelihood fit.
        max_gp_points: observations the GP is fitted on at most (beyond: the best
            non-dominated layers and the most recent trials).
        history: earlier Optuna studies (any storage) or lists of ``{"config", "metrics"}``
            rows: a warm start (:mod:`archsearch.search.transfer`: a Gaussian-copula prior as
            the GP's mean and the initial design); params matched by name and range (the rest
            ignored, with one warning naming them), objectives by ``metric_names`` or order.
    """

    def __init__(self, *, seed: int | None = None, n_startup_trials: int = 10,
                 independent_sampler: BaseSampler | None = None,
                 constraints_func: Callable[[FrozenTrial], Sequence[float]] | None = None,
                 model_branches: bool | str = True, policy: str | None = None, n_sobol: int = 64, n_perturb: int = 16,
                 perturb_scale: float = 0.1, num_restarts: int = 2, raw_samples: int = 32,
                 maxiter: int = 15, mc_samples: int = 32, gp_maxiter: int = 60, max_gp_points: int = 200,
                 history: Sequence[Any] | None = None):
        super().__init__("ahto", seed=seed, n_startup_trials=n_startup_trials,
                         independent_sampler=independent_sampler, constraints_func=constraints_func,
                         model_branches=model_branches, policy=policy, n_sobol=n_sobol, n_perturb=n_perturb, perturb_scale=perturb_scale,
                         num_restarts=num_restarts, raw_samples=raw_samples, maxiter=maxiter,
                         mc_samples=mc_samples, gp_maxiter=gp_maxiter, max_gp_points=max_gp_points,
                         history=history)


class QNEHVISampler(CoreSearcherSampler):
    """Plain BoTorch qLogNEHVI (qLogNEI for one objective) as an Optuna sampler.

    Args:
        seed, n_startup_trials, independent_sampler, constraints_func, model_branches: as
            :class:`CoreSearcherSampler`.
        num_restarts, raw_samples, maxiter: ``optimize_acqf`` effort per ask (restarts, raw
            Sobol samples for their starts, L-BFGS-B iterations).
        mc_samples: quasi-MC samples of the acquisition.
        gp_maxiter: L-BFGS-B iterations of each GP's marginal-likelihood fit.
        max_gp_points: observations the GP is fitted on at most (beyond: the best
            non-dominated layers and the most recent trials).
    """

    def __init__(self, *, seed: int | None = None, n_startup_trials: int = 10,
                 independent_sampler: BaseSampler | None = None,
                 constraints_func: Callable[[FrozenTrial], Sequence[float]] | None = None,
                 model_branches: bool | str = True, num_restarts: int = 2, raw_samples: int = 32, maxiter: int = 15,
                 mc_samples: int = 32, gp_maxiter: int = 60, max_gp_points: int = 200):
        super().__init__("qnehvi", seed=seed, n_startup_trials=n_startup_trials,
                         independent_sampler=independent_sampler, constraints_func=constraints_func,
                         model_branches=model_branches,
                         num_restarts=num_restarts, raw_samples=raw_samples, maxiter=maxiter,
                         mc_samples=mc_samples, gp_maxiter=gp_maxiter, max_gp_points=max_gp_points)


__all__ = ["AHTOSampler", "QNEHVISampler", "CoreSearcherSampler", "param_space_from_distributions", "infer_conditions",
           "optuna"]
