"""Outer-loop searchers (DESIGN.md "AHTO outer loop"): a framework-free ask/tell core.

:func:`make` builds any searcher by name: ``ahto`` and ``qnehvi`` (BoTorch, model-based; see
:mod:`archsearch.search.ahto`) and the Optuna baselines ``random``, ``tpe``, ``nsga2``
(:mod:`archsearch.search.baselines`). Adapters for Ray Tune and Optuna live in
:mod:`archsearch.search.adapters`. Heavy libraries are imported lazily.
"""

from __future__ import annotations

SEARCHERS = ("ahto", "qnehvi", "random", "tpe", "nsga2")


def make(name: str, space, *, seed: int = 0, cost_fn=None, **kwargs):
    """A searcher by name (see :data:`SEARCHERS`); ``kwargs`` go to its constructor.

    Raises:
        ValueError: unknown name.
    """
    if name in ("ahto", "qnehvi"):
        from archsearch.search.ahto import make_model_based

        return make_model_based(name, space, seed=seed, cost_fn=cost_fn, **kwargs)
    if name in ("random", "tpe", "nsga2"):
        from archsearch.search.baselines import OptunaSearcher

        return OptunaSearcher(name, space, seed=seed, cost_fn=cost_fn, **kwargs)
    raise ValueError(f"unknown searcher {name!r}; choose one of {', '.join(SEARCHERS)}")
