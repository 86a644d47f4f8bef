"""Outer-loop searchers (docs/design.md "AHTO outer loop"): a framework-free ask/tell core.

:func:`make` builds any searcher by name: ``ahto`` and ``qnehvi`` (BoTorch, model-based; see
:mod:`archsearch.search.ahto`) and the Optuna baselines ``random``, ``tpe``, ``nsga2``, ``gp`` (Optuna's ``GPSampler``)
(:mod:`archsearch.search.baselines`). The CLI wraps a core in the Tune adapter of
:mod:`archsearch.search.adapters.ray`; plain Optuna and Ray users drop in
:class:`~archsearch.search.samplers.AHTOSampler` and :class:`~archsearch.search.raysearch.AHTOSearch`
(both also importable from here). AHTO's learned scheduler is
:class:`~archsearch.search.pruner.AHTOPruner` for Optuna (``archsearch.search.AHTOPruner``) and
:class:`archsearch.tune.scheduler.AHTOScheduler` for Ray Tune (``budget.scheduler: ahto``).
Heavy libraries are imported lazily.
"""

from __future__ import annotations

SEARCHERS = ("ahto", "qnehvi", "random", "tpe", "nsga2", "gp")


def make(name: str, space, *, seed: int = 0, cost_fn=None, **kwargs):
    """A searcher by name (see :data:`SEARCHERS`); ``kwargs`` go to its constructor.

    This is the one construction path: ``archsearch search --searcher NAME`` (through
    :func:`archsearch.tune.searchers.tune_searcher`, which wraps the result in the Ray adapter),
    the Optuna adapter and ``benchmarks/searchers/searchers.py`` all call it, so the searcher a benchmark
    compares is the one a user runs. The space's constraints reach every searcher: the Optuna
    baselines through ``Trial.set_constraint``, the model-based ones through their
    feasibility model; ``cost_fn`` (:func:`archsearch.dynamic.known_costs.known_costs_fn`) lets
    all of them refuse known-infeasible configs before training.

    Raises:
        ValueError: unknown name.
    """
    if name in ("ahto", "qnehvi"):
        from archsearch.search.ahto import make_model_based

        return make_model_based(name, space, seed=seed, cost_fn=cost_fn, **kwargs)
    if name in ("random", "tpe", "nsga2", "gp"):
        from archsearch.search.baselines import OptunaSearcher

        return OptunaSearcher(name, space, seed=seed, cost_fn=cost_fn, **kwargs)
    raise ValueError(f"unknown searcher {name!r}; choose one of {', '.join(SEARCHERS)}")


_LAZY = {"AHTOSampler": "samplers", "QNEHVISampler": "samplers", "AHTOSearch": "raysearch",
         "QNEHVISearch": "raysearch", "AHTOPruner": "pruner"}


def __getattr__(name: str):
    """``archsearch.search.AHTOSampler``, ``AHTOPruner`` (Optuna) and ``AHTOSearch`` (Ray Tune), imported on
    first use so that importing this package stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"archsearch.search.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
