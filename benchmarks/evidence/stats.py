"""Statistics every claim uses: bootstrap intervals, the Wilcoxon signed-rank test, and reading
an accuracy-vs-FLOPs curve at a FLOPs fraction. The only module of ``benchmarks/`` that takes
percentiles.

Bootstrap (Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, ch. 13 and 16):
percentile intervals from resampled indices. Paired: one draw of the test rows applied to every
compared model and every seed (the seeds share one test set: drawing rows per seed would treat
their test sets as independent and narrow the interval). Grouped: rows (e.g. seeds) resampled
within each group (e.g. task), every group in every draw.

Draw order (pinned by ``tests/test_evidence.py``): :func:`bootstrap_indices` draws all
``(draws, n)`` indices at once from ``numpy.random.default_rng(seed)``; :func:`grouped_bootstrap`
draws, per draw, each group's ``size`` indices in group order.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

#: Default number of bootstrap draws.
DRAWS = 2000


def _percentile(values: Any, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


def quantile(values: Any, q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``: NumPy's linear percentile ``100 q`` (e.g. a p99
    latency is ``quantile(ms, 0.99)``)."""
    return _percentile(values, 100 * q)


def bootstrap_ci(samples: Any, level: float = 0.95) -> list[float]:
    """The percentile interval ``[low, high]`` holding ``level`` of ``samples`` (a 1-D array of
    bootstrap statistics); default the 2.5th and 97.5th percentiles."""
    tail = (100 - 100 * level) / 2  # 2.5 exactly for 0.95 (100 * (1 - 0.95) / 2 is not)
    # one call per bound: numpy's percentile of a list of q can differ from the scalar calls in
    # the last bit, and the results this library replaced took them one at a time
    return [_percentile(samples, tail), _percentile(samples, 100 - tail)]


def bootstrap_indices(n: int, draws: int = DRAWS, seed: int = 0) -> np.ndarray:
    """``(draws, n)`` row indices drawn with replacement from ``default_rng(seed)``.

    Raises:
        ValueError: ``n < 1``.
    """
    if n < 1:
        raise ValueError("bootstrap needs at least one row")
    return np.random.default_rng(seed).integers(0, n, (draws, n))


def paired_bootstrap(pairs: list[tuple[str, str]], n: int = DRAWS, seed: int = 0) -> dict[str, Any]:
    """Mean gain of ``a`` over ``b`` in accuracy points, averaged over seeds, and its 95% paired
    bootstrap interval over test rows.

    Args:
        pairs: one ``(a, b)`` per seed: '0'/'1' strings (1 = correct), one character per test
            row, every string over the same rows in the same order.
        n: draws; ``seed``: the generator's seed.

    Returns:
        ``{"mean": points, "ci95": [low, high]}`` rounded to 3 decimals.

    Raises:
        ValueError: no pairs, or strings of different lengths.
    """
    if not pairs or len({len(x) for p in pairs for x in p}) != 1:
        raise ValueError("paired_bootstrap needs (a, b) strings of one length, at least one pair")
    d = np.stack([(np.frombuffer(a.encode(), dtype=np.uint8).astype(float)
                   - np.frombuffer(b.encode(), dtype=np.uint8)) * 100 for a, b in pairs]).mean(0)  # (rows,)
    boots = d[bootstrap_indices(len(d), n, seed)].mean(1)
    lo, hi = bootstrap_ci(boots)
    return {"mean": round(float(d.mean()), 3), "ci95": [round(lo, 3), round(hi, 3)]}


def paired_bootstrap_stat(stat: Callable[[np.ndarray], Any], n: int, draws: int = DRAWS,
                          seed: int = 0) -> tuple[Any, np.ndarray]:
    """A statistic of the test rows at the observed rows and over paired bootstrap draws.

    Args:
        stat: ``idx`` ``(k, n)`` row indices -> ``(k,)`` values (or a dict of them), one per row
            of ``idx``; it applies the same rows to every model and seed it compares.
        n: test rows; ``draws``, ``seed``: as :func:`bootstrap_indices`.

    Returns:
        ``(point, boot)``: ``stat`` at ``arange(n)[None]`` (its first element) and at the draws.
    """
    point = stat(np.arange(n)[None])
    boot = stat(bootstrap_indices(n, draws, seed))
    return point, boot


def grouped_bootstrap(sizes: Sequence[int], stat: Callable[[list[np.ndarray]], float],
                      draws: int = DRAWS, seed: int = 0) -> list[float]:
    """Bootstrap interval of a statistic of grouped rows, rows resampled within each group.

    Args:
        sizes: rows per group (e.g. seeds per task).
        stat: one index array per group (``(size,)``) -> the statistic (e.g. the median over
            tasks of per-task median ratios).
        draws, seed: draws from ``default_rng(seed)``, each drawing every group in order.

    Returns:
        The 95% percentile interval ``[low, high]``.
    """
    rng = np.random.default_rng(seed)
    stats = [stat([rng.integers(0, s, s) for s in sizes]) for _ in range(draws)]
    return bootstrap_ci(stats)


def wilcoxon(x: Sequence[float], y: Sequence[float] | None = None, *, min_pairs: int = 5) -> float | None:
    """Two-sided Wilcoxon signed-rank p-value of the paired differences ``x - y`` (or of ``x``).

    One rule for every benchmark (Wilcoxon 1945; SciPy's ``zero_method="wilcox"``): zero
    differences are dropped; with fewer than ``min_pairs`` non-zero differences the test has no
    power to speak of (at n = 4 the smallest two-sided p is 0.125) and the result is ``None``
    ("not tested"), never 1.0. Otherwise SciPy's default method (exact for small n without
    ties, else the normal approximation).
    """
    from scipy.stats import wilcoxon as _wilcoxon

    d = np.asarray(x, dtype=float) - (0.0 if y is None else np.asarray(y, dtype=float))
    d = d[d != 0]
    return None if len(d) < min_pairs else float(_wilcoxon(d).pvalue)


def interp_at(x: float, fractions: Sequence[float], values: Sequence[float]) -> float:
    """A curve's value at FLOPs fraction ``x``: linear interpolation between its points sorted
    by fraction (stable), constant beyond the ends (``numpy.interp``)."""
    f = np.asarray(fractions, dtype=float)
    v = np.asarray(values, dtype=float)
    order = np.argsort(f, kind="stable")
    return float(np.interp(x, f[order], v[order]))
