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


#: the searchers that take ``--history`` (a transfer prior: :mod:`archsearch.search.transfer`; for
#: ``gp``, the default, the prior chooses GPSampler's start configs: benchmarks/searchers/gp_history.py)
HISTORY_SEARCHERS = ("gp", "ahto", "qnehvi")


def history_rows(run_dirs, *, field: str = "--history") -> list[list[dict]]:
    """The finished trials of earlier runs as transfer history: one list of ``{"config",
    "metrics"}`` rows per run directory.

    Raises:
        UserError: not a run directory, or one with no finished trial (names it).
    """
    from archsearch.runs import TERMINATED

    out = []
    for d in run_dirs:
        rows = [{"config": r["config"], "metrics": r["metrics"]} for r in RunDir.open(d).read_trials()
                if r["status"] == TERMINATED and r.get("config") and r.get("metrics")]
        if not rows:
            raise UserError("no finished trial to learn from", file=str(d), field=field)
        out.append(rows)
    return out


def check_history(name: str, run_dirs, space=None) -> list[list[dict]]:
    """:func:`history_rows` of ``run_dirs`` for searcher ``name``; with ``space``, also that a
    transfer prior can be built from them (a shared parameter, an objective, enough trials).

    Raises:
        UserError: ``name`` takes no history, or a run directory is unusable.
    """
    if run_dirs and name not in HISTORY_SEARCHERS:
        raise UserError(f"--history needs a searcher that learns across searches "
                        f"({', '.join(HISTORY_SEARCHERS[:-1])} or {HISTORY_SEARCHERS[-1]}), not {name!r}", field="--history")
    rows = history_rows(run_dirs)
    if rows and space is not None:
        from archsearch.search.transfer import CopulaPrior

        metrics = [o.metric for o in space.objectives]
        try:
            CopulaPrior(space, rows, metrics, [1.0] * len(metrics), steps=0)
        except ValueError as e:
            raise UserError(f"cannot warm-start from {', '.join(map(str, run_dirs))}: {e}",
                            field="--history") from None
    return rows


def build_core(name: str, space, data, *, seed: int, history=()):
    """The searcher core for ``--searcher name``: ``make(name, space, seed=seed,
    cost_fn=known_costs_fn(data, space.fixed))``, with ``history=`` the finished trials of the
    run directories ``history`` (``--history``).

    Raises:
        UserError: unknown searcher name; ``history`` with a searcher that takes none, or an
            unusable run directory.
    """
    from archsearch.dynamic.known_costs import known_costs_fn
    from archsearch.search import make

    check_searcher(name)
    rows = check_history(name, history)
    kwargs = {"history": rows} if rows else {}
    return make(name, space, seed=seed, cost_fn=known_costs_fn(data, space.fixed), **kwargs)


def tune_searcher(name: str, space, data, run: RunDir, *, seed: int, history=()):
    """A Ray Tune search algorithm for the run: :func:`build_core` in the Ray adapter,
    recording into ``run``'s Optuna study, at most ``budget.max_concurrent`` trials at once.

    The adapter leaves the ``FAIL`` of an errored trial to the run's
    :class:`~archsearch.tune.callbacks.TrialRecorder`, which has the error line
    (``fail_errors=False``); use it with that callback.
    """
    from ray.tune.search import ConcurrencyLimiter

    from archsearch.search.adapters.ray import RaySearcher

    core = build_core(name, space, data, seed=seed, history=history)
    alg = RaySearcher(core, epochs=space.budget.epochs, storage=run.optuna_url, study_name=run.name,
                      fail_errors=False)
    return ConcurrencyLimiter(alg, max_concurrent=space.budget.max_concurrent)
