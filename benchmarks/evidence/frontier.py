"""Two-objective frontiers and hypervolume for the benchmarks, on :mod:`archsearch.pareto` (the
product's own exact hypervolume; no second implementation here)."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def hv2(Y, ref: Sequence[float], modes: Sequence[str] = ("max", "max")) -> float:
    """Hypervolume of the ``(n, 2)`` points ``Y`` bounded by ``ref`` (:func:`archsearch.pareto.hypervolume`);
    only points strictly better than ``ref`` in both objectives count; no points -> 0.0."""
    from archsearch.pareto import hypervolume

    Y = np.asarray(Y, dtype=np.float64).reshape(-1, 2)
    return hypervolume(Y, list(modes), list(ref)) if len(Y) else 0.0


def hv2_min(Y, ref: Sequence[float]) -> float:
    """:func:`hv2` with both objectives minimised."""
    return hv2(Y, ref, ("min", "min"))


def hv_history(Y, ref: Sequence[float], modes: Sequence[str] = ("max", "max")) -> list[float]:
    """Hypervolume after each of the ``(n, 2)`` points in order (``n`` values)."""
    Y = np.asarray(Y, dtype=np.float64).reshape(-1, 2)
    return [hv2(Y[: i + 1], ref, modes) for i in range(len(Y))]
