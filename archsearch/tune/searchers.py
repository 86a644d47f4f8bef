"""The Ray Tune searcher of a run: the one searcher factory, wrapped for Tune.

``--searcher NAME`` builds the core with :func:`archsearch.search.make` (the same call
``benchmarks/searchers/searchers.py`` makes), gives it the run's known-cost function, wraps it in the
Ray adapter (which records every trial in the run's Optuna study from the moment it is
suggested: :mod:`archsearch.search.adapters.ray`) and limits concurrency to
``budget.max_concurrent``.
"""

from __future__ import annotations

from archsearch.errors import UserError
from archsearch.runs import RunDir
from archsearch.search import SEARCHERS


def check_searcher(name: str) -> None:
    """Raises: UserError: ``name`` is not one of :data:`archsearch.search.SEARCHERS`."""
    if name not in SEARCHERS:
        raise UserError(f"unknown searcher {name!r}; choose one of {', '.join(SEARCHERS)}",
                        field="--searcher")


def build_core(name: str, space, data, *, seed: int):
    """The searcher core for ``--searcher name``: ``make(name, space, seed=seed,
    cost_fn=known_costs_fn(data, space.fixed))``.

    Raises:
        UserError: unknown searcher name.
    """
    from archsearch.dynamic.known_costs import known_costs_fn
    from archsearch.search import make

    check_searcher(name)
    return make(name, space, seed=seed, cost_fn=known_costs_fn(data, space.fixed))


def tune_searcher(name: str, space, data, run: RunDir, *, seed: int):
    """A Ray Tune search algorithm for the run: :func:`build_core` in the Ray adapter,
    recording into ``run``'s Optuna study, at most ``budget.max_concurrent`` trials at once.

    The adapter leaves the ``FAIL`` of an errored trial to the run's
    :class:`~archsearch.tune.callbacks.TrialRecorder`, which has the error line
    (``fail_errors=False``); use it with that callback.
    """
    from ray.tune.search import ConcurrencyLimiter

    from archsearch.search.adapters.ray import RaySearcher

    core = build_core(name, space, data, seed=seed)
    alg = RaySearcher(core, epochs=space.budget.epochs, storage=run.optuna_url, study_name=run.name,
                      fail_errors=False)
    return ConcurrencyLimiter(alg, max_concurrent=space.budget.max_concurrent)
