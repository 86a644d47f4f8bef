"""AHTO and qLogNEHVI as Ray Tune searchers a plain Ray user can drop in.

    from ray import tune
    from archsearch.search.raysearch import AHTOSearch

    tuner = tune.Tuner(
        train_fn,                                           # reports {"acc": ..., "flops": ...}
        param_space={"lr": tune.loguniform(1e-4, 1e-1), "model": {"layers": tune.randint(1, 7)},
                     "act": tune.choice(["gelu", "relu"]), "epochs": 3},
        tune_config=tune.TuneConfig(num_samples=40, search_alg=tune.search.ConcurrencyLimiter(
            AHTOSearch(metric=["acc", "flops"], mode=["max", "min"], seed=0), max_concurrent=2)))

No archsearch search space is needed: like Ray's ``OptunaSearch``, the searcher converts the
``param_space`` Tune hands to :meth:`set_search_properties` (or one given to the constructor):
``tune.uniform``/``quniform``/``loguniform``/``randint``/``qrandint``/``lograndint``/``choice``
(of any values: ``None``, lists such as layer sizes ``[[64, 64], [128]]`` and dicts are searched
by their index among the choices, as ``OptunaSearch`` takes them),
nested dicts flattened to ``a/b`` keys, constants left to Tune; grid search and other
samplers (``tune.randn``, ``sample_from``) are refused with a ``ValueError``. The domains become
Optuna distributions (the same conversion rules as ``OptunaSearch.convert_search_space``:
``randint`` upper bound exclusive, ``qrandint`` inclusive) and then the same
:class:`~archsearch.space.ParamSpace` the Optuna sampler builds
(:func:`archsearch.search.samplers.param_space_from_distributions`).

``metric``/``mode`` may be one name (single objective: qLogNEI) or lists (several objectives:
qLogNEHVI; give them to the searcher, as with ``OptunaSearch``, since ``TuneConfig`` takes one
metric). ``save``/``restore`` write the space and the core's state, so a restored searcher
continues with the same next suggestion. Trials are tracked by Tune trial id, so
``ConcurrencyLimiter`` and Tune's resume work as for any searcher.

Archsearch's own CLI uses :class:`archsearch.search.adapters.ray.RaySearcher` instead (its space
comes from the YAML file and it records the Optuna study).
"""

from __future__ import annotations

import pickle
import warnings
from typing import Any, Sequence

from ray.tune.search import Searcher
from ray.tune.search.sample import (Categorical, Float, Integer, LogUniform, Quantized,
                                    Uniform)
from ray.tune.search.variant_generator import parse_spec_vars
from ray.tune.utils.util import flatten_dict, unflatten_dict

from archsearch.metrics import is_number


def distributions_from_ray(param_space: dict) -> dict:
    """Optuna distributions for the sampled domains of a Ray Tune ``param_space``.

    Args:
        param_space: Tune's ``param_space`` (nested dicts allowed; constants ignored).

    Returns:
        ``{"a/b": optuna distribution}`` for every domain.

    Raises:
        ValueError: grid search, or a domain/sampler with no distribution (e.g. ``tune.randn``,
            ``sample_from``, quantised ``loguniform`` floats).
    """
    import optuna.distributions as od

    _, _, grid = parse_spec_vars(param_space)
    if grid:
        raise ValueError("grid search parameters cannot be searched by a model; use "
                         "tune.choice or tune's BasicVariantGenerator")
    _, domains, _ = parse_spec_vars(flatten_dict(param_space, prevent_delimiter=True))
    out = {}
    for path, domain in domains:
        name = "/".join(path)
        sampler, q = domain.get_sampler(), None
        if isinstance(sampler, Quantized):
            sampler, q = sampler.sampler, sampler.q
        if isinstance(domain, Float) and isinstance(sampler, LogUniform) and q is None:
            out[name] = od.FloatDistribution(domain.lower, domain.upper, log=True)
        elif isinstance(domain, Float) and isinstance(sampler, Uniform):
            out[name] = od.FloatDistribution(domain.lower, domain.upper, step=q)
        elif isinstance(domain, Integer) and isinstance(sampler, (Uniform, LogUniform)):
            log = isinstance(sampler, LogUniform)
            if log and q not in (None, 1):
                raise ValueError(f"{name}: quantised lograndint is not supported")
            out[name] = od.IntDistribution(domain.lower, domain.upper - int(not q), step=q or 1, log=log)
        elif isinstance(domain, Categorical) and isinstance(sampler, Uniform):
            with warnings.catch_warnings():  # lists or dicts as choices: CoreSearch codes them
                warnings.filterwarnings("ignore", "Choices for a categorical distribution", UserWarning)
                out[name] = od.CategoricalDistribution(domain.categories)
        else:
            raise ValueError(f"{name}: {type(domain).__name__} with sampler "
                             f"{type(sampler).__name__} cannot be searched (use uniform, "
                             "loguniform, quniform, randint, qrandint, lograndint or choice)")
    return out


def _at(nested: dict, key: str) -> list:
    """``[value]`` at the flat ``a/b`` ``key`` of a nested or flat dict, ``[]`` if absent."""
    if key in nested:
        return [nested[key]]
    node = nested
    for part in key.split("/"):
        if not isinstance(node, dict) or part not in node:
            return []
        node = node[part]
    return [node]


def _as_list(v) -> list | None:
    return None if v is None else list(v) if isinstance(v, (list, tuple)) else [v]


class CoreSearch(Searcher):
    """A Tune ``Searcher`` around an archsearch model-based core, for any ``param_space``.

    Args:
        searcher: ``"ahto"`` or ``"qnehvi"`` (:func:`archsearch.search.make`).
        param_space: optional; else taken from the Tuner's ``param_space``.
        metric, mode: one objective (strings) or several (lists of equal length); may also come
            from ``TuneConfig`` (one objective only).
        seed: seeds the Sobol design and the acquisition.
        points_to_evaluate: configs (flat ``a/b`` keys or nested) tried first, in order.
        n_init: Sobol-design trials before the GP is used (default 10).
        searcher_kwargs: passed to the core's constructor (e.g. ``num_restarts``).

    Raises:
        ValueError: ``metric`` and ``mode`` of different lengths, a metric twice, a mode other than
            ``min``/``max``, or a param space that cannot be converted
            (:func:`distributions_from_ray`).
    """

    def __init__(self, searcher: str = "ahto", *, param_space: dict | None = None,
                 metric: str | Sequence[str] | None = None, mode: str | Sequence[str] | None = None,
                 seed: int = 0, points_to_evaluate: list[dict] | None = None, n_init: int = 10,
                 **searcher_kwargs: Any):
        metrics, modes = _as_list(metric), _as_list(mode)
        if metrics is not None and modes is not None and len(metrics) != len(modes):
            raise ValueError(f"{len(metrics)} metrics but {len(modes)} modes")
        if any(m not in ("min", "max") for m in modes or []):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if metrics is not None and len(set(metrics)) != len(metrics):
            raise ValueError(f"a metric is listed twice: {metrics}")
        super().__init__(metric=metrics[0] if metrics else None, mode=modes[0] if modes else None)
        # not ``self.searcher``: Tune walks ``.searcher`` attributes to unwrap ConcurrencyLimiter
        self.core_name, self.seed, self.n_init = searcher, int(seed), int(n_init)
        self._kwargs = searcher_kwargs
        self._metrics, self._modes = metrics, modes
        self._points = list(points_to_evaluate or [])
        self._dists: dict | None = None
        self._coded: dict[str, list] = {}  #: param -> its choices, where the core sees their index
        self.core = None
        if param_space is not None:
            self._setup(param_space)

    # ------------------------------------------------------------------ space
    def _setup(self, param_space: dict) -> None:
        self._dists = distributions_from_ray(param_space)
        if not self._dists:
            raise ValueError("the param space has no tune.* domain to search")
        if self._metrics is not None and self._modes is not None:
            self._build()

    def _build(self) -> None:
        from optuna.study import StudyDirection

        from archsearch.search import make
        from archsearch.search.samplers import code_choices, param_space_from_distributions

        dirs = [StudyDirection.MAXIMIZE if m == "max" else StudyDirection.MINIMIZE for m in self._modes]
        dists, self._coded = code_choices(self._dists)  # None, lists...: searched by index
        space = param_space_from_distributions(dists, dirs, self._metrics)
        self.core = make(self.core_name, space, seed=self.seed, n_init=self.n_init, **self._kwargs)

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict,
                              **spec) -> bool:
        """Called by Tune with ``TuneConfig``'s metric/mode and the Tuner's ``param_space``.
        Returns False when the searcher already has a space (Tune then reports the clash)."""
        if self.core is not None:
            return False
        if self._metrics is None and metric:
            self._metrics = [metric]
        if self._modes is None and mode:
            self._modes = [mode]
        if self._metrics is None or self._modes is None:
            return False
        self._metric, self._mode = self._metrics[0], self._modes[0]
        if self._dists is None:
            self._setup(config)
        else:
            self._build()
        return True

    # ------------------------------------------------------------------ ask / tell
    def suggest(self, trial_id: str) -> dict | None:
        if self.core is None:
            raise RuntimeError(f"{type(self).__name__} has no search space and metric/mode: "
                               "give param_space/metric/mode to it or to the Tuner")
        if self._points:
            raw = self._points.pop(0)
            point = flatten_dict(raw, prevent_delimiter=True)
            point.update({k: v for k in self._coded for v in _at(raw, k)})  # a dict choice whole
            config = {k: self._index(k, point[k]) if k in self._coded else point[k]
                      for k in self._dists if k in point}
            if len(config) == len(self._dists):
                self.core.adopt(trial_id, config, {"source": "points_to_evaluate"})
            else:  # a partial point (as Ray's OptunaSearch takes): the searcher proposes the rest
                config = self.core.ask_completing(trial_id, config, {"source": "points_to_evaluate"})
        else:
            _, config = self.core.ask(trial_id)
        return unflatten_dict({k: self._coded[k][config[k]] if k in self._coded else config[k]
                               for k in self._dists})

    def _index(self, key: str, value) -> int:
        """The index of ``value`` among ``key``'s coded choices.

        Raises:
            ValueError: a ``points_to_evaluate`` value that is not one of the choices."""
        from archsearch.search.samplers import choice_index

        try:
            return choice_index(self._coded[key], value)
        except ValueError as e:
            raise ValueError(f"points_to_evaluate: {key}={e}") from None

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if self.core is None or trial_id not in self.core.pending:
            return
        flat = flatten_dict(result or {}, prevent_delimiter=False) if result else {}
        metrics = {m: flat.get(m) for m in self._metrics}
        ok = not error and all(is_number(v) for v in metrics.values())
        self.core.tell(trial_id, metrics if ok else None, error=not ok)

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict:
        return {"dists": self._dists, "metrics": self._metrics, "modes": self._modes,
                "points": self._points, "core": self.core.state_dict() if self.core else None}

    def set_state(self, state: dict) -> None:
        self._dists, self._metrics, self._modes = state["dists"], state["metrics"], state["modes"]
        self._points = list(state["points"])
        self.core = None
        if self._dists is not None and self._metrics is not None:
            self._metric, self._mode = self._metrics[0], self._modes[0]
            self._build()
            if state["core"] is not None:
                self.core.load_state_dict(state["core"])

    def save(self, checkpoint_path: str) -> None:
        from archsearch.runs import atomic_write

        atomic_write(checkpoint_path, pickle.dumps(self.get_state()))

    def restore(self, checkpoint_path: str) -> None:
        """Load what :meth:`save` wrote (a file this program wrote itself: pickle)."""
        with open(checkpoint_path, "rb") as f:
            self.set_state(pickle.load(f))


class AHTOSearch(CoreSearch):
    """AHTO (GP + qLogNEHVI/qLogNEI + the meta-trained acquisition policy of
    :mod:`archsearch.search.policy`) as a Ray Tune searcher.

    Args:
        param_space, metric, mode, seed, points_to_evaluate, n_init: as :class:`CoreSearch`.
        policy: a policy weights file; ``None`` the shipped one; ``"none"``: no policy.
        n_sobol, n_perturb, perturb_scale: the policy's candidate pool.
        num_restarts, raw_samples, maxiter: ``optimize_acqf`` effort per ask (restarts, raw
            Sobol samples for their starts, L-BFGS-B iterations).
        mc_samples: quasi-MC samples of the acquisition.
        gp_maxiter: L-BFGS-B iterations of each GP's marginal-likelihood fit.
        max_gp_points: observations the GP is fitted on at most.
        history: earlier searches (Optuna studies or lists of ``{"config", "metrics"}`` rows): a
            warm start, as :class:`~archsearch.search.samplers.AHTOSampler`'s.

    Raises:
        ValueError: as :class:`CoreSearch`.
    """

    def __init__(self, *, param_space: dict | None = None, metric: str | Sequence[str] | None = None,
                 mode: str | Sequence[str] | None = None, seed: int = 0,
                 points_to_evaluate: list[dict] | None = None, n_init: int = 10, policy: str | None = None,
                 n_sobol: int = 64, n_perturb: int = 16, perturb_scale: float = 0.1, num_restarts: int = 2,
                 raw_samples: int = 32, maxiter: int = 15, mc_samples: int = 32, gp_maxiter: int = 60,
                 max_gp_points: int = 200, history: Sequence[Any] | None = None):
        super().__init__("ahto", param_space=param_space, metric=metric, mode=mode, seed=seed,
                         points_to_evaluate=points_to_evaluate, n_init=n_init, policy=policy, n_sobol=n_sobol,
                         n_perturb=n_perturb, perturb_scale=perturb_scale, num_restarts=num_restarts,
                         raw_samples=raw_samples, maxiter=maxiter, mc_samples=mc_samples,
                         gp_maxiter=gp_maxiter, max_gp_points=max_gp_points, history=history)


class QNEHVISearch(CoreSearch):
    """Plain BoTorch qLogNEHVI (qLogNEI for one objective) as a Ray Tune searcher.

    Args:
        param_space, metric, mode, seed, points_to_evaluate, n_init: as :class:`CoreSearch`.
        num_restarts, raw_samples, maxiter: ``optimize_acqf`` effort per ask (restarts, raw
            Sobol samples for their starts, L-BFGS-B iterations).
        mc_samples: quasi-MC samples of the acquisition.
        gp_maxiter: L-BFGS-B iterations of each GP's marginal-likelihood fit.
        max_gp_points: observations the GP is fitted on at most.

    Raises:
        ValueError: as :class:`CoreSearch`.
    """

    def __init__(self, *, param_space: dict | None = None, metric: str | Sequence[str] | None = None,
                 mode: str | Sequence[str] | None = None, seed: int = 0,
                 points_to_evaluate: list[dict] | None = None, n_init: int = 10, num_restarts: int = 2,
                 raw_samples: int = 32, maxiter: int = 15, mc_samples: int = 32, gp_maxiter: int = 60,
                 max_gp_points: int = 200):
        super().__init__("qnehvi", param_space=param_space, metric=metric, mode=mode, seed=seed,
                         points_to_evaluate=points_to_evaluate, n_init=n_init, num_restarts=num_restarts,
                         raw_samples=raw_samples, maxiter=maxiter, mc_samples=mc_samples,
                         gp_maxiter=gp_maxiter, max_gp_points=max_gp_points)


__all__ = ["AHTOSearch", "QNEHVISearch", "CoreSearch", "distributions_from_ray"]
