"""Non-dominated sorting, reference point and hypervolume: THE Pareto arithmetic of archsearch.

The report (:mod:`archsearch.report`), the searchers (:mod:`archsearch.search`), the
evolutionary length search (:mod:`archsearch.dynamic.length.evolution`) and the benchmarks all use
these functions; there is no other Pareto mask or hypervolume in the package.

Conventions used by every function here:

* ``Y`` is an ``n x m`` float array (or a list of ``n`` rows of ``m`` numbers; an empty
  sequence means ``n = 0``): one row per trial, one column per objective, each column in that
  metric's own unit (``accuracy`` as a fraction 0..1, ``flops_per_sample`` in FLOPs,
  ``latency_ms`` in ms, ...; see docs/design.md). Nothing is normalised or log-transformed, so a
  hypervolume is in the product of the objectives' units (e.g. "accuracy x FLOPs").
* ``modes`` gives one ``"max"`` or ``"min"`` per column. Internally min columns are negated so
  that BoTorch's maximisation convention applies; results are returned in the original signs.
  A caller that already works in maximisation form (the searchers: ``sign * value``) passes
  ``["max"] * m``.
* A row with any non-finite value (NaN, +-inf) is a trial that does not count (failed or
  infeasible: the caller sets such rows to NaN). It is never on the front and never adds
  hypervolume.

Errors: :class:`ValueError` for a malformed ``Y`` / ``modes`` / ``ref`` (wrong shape, unknown
mode, non-finite reference value).

Only numpy is imported at module level. BoTorch (``Hypervolume``, the exact dimension-sweep
algorithm) and torch are imported inside :func:`hypervolume`, and only for four or more
objectives: one to three objectives are exact numpy sweeps, so a 2- or 3-objective report or
searcher never imports torch for its hypervolume.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: ``Y`` as the functions here take it: an ``n x m`` array or ``n`` rows of ``m`` numbers.
ArrayLike = np.ndarray | Sequence[Sequence[float]]

MODES = ("max", "min")

#: Fraction of the observed range by which the automatic reference point is moved past the
#: worst observed value.
REF_OFFSET_FRACTION = 0.1


def _check(Y: ArrayLike, modes: Sequence[str]) -> np.ndarray:
    """Return ``Y`` as a float64 ``(n, m)`` array after checking it against ``modes``."""
    Y = np.asarray(Y, dtype=np.float64)
    if Y.ndim == 1 and Y.size == 0:
        Y = Y.reshape(0, len(modes))  # ``[]``: no rows yet
    if Y.ndim != 2:
        raise ValueError(f"Y must be a 2-D (n_trials, n_objectives) array, got shape {Y.shape}")
    if len(modes) != Y.shape[1]:
        raise ValueError(f"got {len(modes)} modes for {Y.shape[1]} objective columns")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"mode must be 'max' or 'min', got {bad}")
    if Y.shape[1] == 0:
        raise ValueError("need at least one objective")
    return Y


def _signs(modes: Sequence[str]) -> np.ndarray:
    """+1 for max objectives, -1 for min objectives: ``Y * signs`` is in max-convention."""
    return np.array([1.0 if m == "max" else -1.0 for m in modes])


def _check_ref(ref: Sequence[float], m: int) -> np.ndarray:
    ref_arr = np.asarray(ref, dtype=np.float64).reshape(-1)
    if ref_arr.shape[0] != m:
        raise ValueError(f"reference point has {ref_arr.shape[0]} values for {m} objectives")
    if not np.all(np.isfinite(ref_arr)):
        raise ValueError(f"reference point must be finite, got {list(ref_arr)}")
    return ref_arr


def _non_dominated_max(Z: np.ndarray) -> np.ndarray:
    """Non-dominated mask of finite ``(k, m)`` points in max-convention, numpy only.

    One pass in lexicographically descending order: a point can only be dominated by a point
    before it, and if it is dominated at all, some point of the current front dominates it,
    so each point is compared with the current front only: O(k log k + k f m) for a front of
    f points. Equal rows do not dominate each other (all copies are kept), matching
    BoTorch's ``is_non_dominated(deduplicate=False)``.
    """
    k, m = Z.shape
    order = np.lexsort(tuple(-Z[:, j] for j in reversed(range(m))))  # first column primary
    mask = np.zeros(k, dtype=bool)
    front = np.empty((0, m))
    for i in order:
        z = Z[i]
        if front.shape[0]:
            ge = np.all(front >= z, axis=1)
            if np.any(ge & np.any(front > z, axis=1)):
                continue
        mask[i] = True
        front = np.vstack([front, z])
    return mask


def non_dominated_mask(Y: ArrayLike, modes: Sequence[str]) -> np.ndarray:
    """Which rows of ``Y`` are Pareto-optimal (not dominated by any other row).

    A row dominates another when it is at least as good in every objective and strictly better
    in one (better = larger for ``"max"``, smaller for ``"min"``). Rows with identical objective
    values do not dominate each other, so all copies of a non-dominated point are marked
    (as BoTorch's ``is_non_dominated(deduplicate=False)``; ``tests/test_pareto.py`` checks
    both against a brute-force O(n^2) dominance check). Rows containing NaN/inf are never
    marked. Pure numpy, so a report or searcher need not import torch for it: one sorted
    pass, O(n log n + n f m) for a front of f points.

    Args:
        Y: ``n x m`` objective values in their own units (array or ``n`` rows).
        modes: ``m`` strings, ``"max"`` or ``"min"``.

    Returns:
        ``(n,)`` boolean array.

    Raises:
        ValueError: malformed ``Y`` or ``modes``.
    """
    Y = _check(Y, modes)
    mask = np.zeros(Y.shape[0], dtype=bool)
    finite = np.all(np.isfinite(Y), axis=1)
    if not finite.any():
        return mask
    mask[finite] = _non_dominated_max(Y[finite] * _signs(modes))
    return mask


def reference_point(
    Y: ArrayLike,
    modes: Sequence[str],
    user_refs: Sequence[float | None] | None = None,
) -> list[float | None]:
    """Reference point for the hypervolume, in the objectives' own units.

    Rule, per objective ``j``:

    * if ``user_refs[j]`` is given (not None), use it unchanged;
    * otherwise take the worst finite observed value ``w`` (the minimum for ``"max"``, the
      maximum for ``"min"``) and move it *outward* (away from the good direction) by
      ``0.1 * (max - min)`` of the observed finite values. If all observed values are equal the
      shift is ``0.1 * |w|``, or ``0.1`` (in the metric's unit) when ``w == 0``. The offset
      makes the worst points still contribute a sliver of hypervolume.
    * if there is no finite observed value and no user value, the entry is ``None`` (the
      hypervolume is then 0 by definition; see :func:`hypervolume`).

    Example: accuracy (max) observed in [0.70, 0.85] -> ref 0.685; flops_per_sample (min)
    observed in [1e6, 5e6] FLOPs -> ref 5.4e6 FLOPs.

    Args:
        Y: ``(n, m)`` objective values of the points that define the front (the caller passes
            feasible, successful trials; non-finite rows are ignored).
        modes: ``m`` strings, ``"max"`` or ``"min"``.
        user_refs: optional ``m`` values (``None`` entries mean "automatic").

    Returns:
        ``m`` floats (or ``None`` where undeterminable).

    Raises:
        ValueError: malformed inputs or a non-finite user value.
    """
    Y = _check(Y, modes)
    m = Y.shape[1]
    if user_refs is None:
        user_refs = [None] * m
    if len(user_refs) != m:
        raise ValueError(f"got {len(user_refs)} user reference values for {m} objectives")
    rows = Y[np.all(np.isfinite(Y), axis=1)]
    ref: list[float | None] = []
    for j, mode in enumerate(modes):
        given = user_refs[j]
        if given is not None:
            given = float(given)
            if not np.isfinite(given):
                raise ValueError(f"user reference value for objective {j} must be finite, got {given}")
            ref.append(given)
            continue
        if rows.shape[0] == 0:
            ref.append(None)
            continue
        lo, hi = float(rows[:, j].min()), float(rows[:, j].max())
        worst = lo if mode == "max" else hi
        shift = REF_OFFSET_FRACTION * (hi - lo)
        if shift == 0.0:
            shift = REF_OFFSET_FRACTION * abs(worst) if worst != 0.0 else REF_OFFSET_FRACTION
        ref.append(worst - shift if mode == "max" else worst + shift)
    return ref


def hypervolume(Y: ArrayLike, modes: Sequence[str], ref: Sequence[float]) -> float:
    """Hypervolume dominated by the rows of ``Y`` and bounded by ``ref``.

    Computed on ``Y * sign`` and ``ref * sign`` (sign = +1 for max, -1 for min), so the value
    is the same as the textbook definition in the original units, e.g. "accuracy x FLOPs" for
    the default objectives. Exact in every case: a numpy sweep for two objectives, numpy
    slicing into 2-D sweeps for three (no torch import), BoTorch's ``Hypervolume`` (Fonseca,
    Paquete, Lopez-Ibanez 2006, "An improved dimension-sweep algorithm for the hypervolume
    indicator", IEEE CEC) for four or more.
    Only points strictly better than ``ref`` in every objective contribute. With one objective
    this is ``max(0, best - ref)`` for max (``max(0, ref - best)`` for min): the improvement of
    the best trial over the reference. No finite rows -> ``0.0``.

    Args:
        Y: ``(n, m)`` objective values; non-finite rows are ignored.
        modes: ``m`` strings, ``"max"`` or ``"min"``.
        ref: ``m`` finite reference values in the objectives' units.

    Returns:
        The hypervolume as a Python float (>= 0).

    Raises:
        ValueError: malformed inputs or non-finite ``ref``.
    """
    Y = _check(Y, modes)
    ref_arr = _check_ref(ref, Y.shape[1])
    return _hypervolume_max(Y * _signs(modes), ref_arr * _signs(modes))


def _hypervolume_2d_max(pts: np.ndarray, ref_max: np.ndarray) -> float:
    """Exact 2-D hypervolume (max-convention) of points all strictly better than ``ref_max``.

    Sweep: sort by the first objective, descending; each point adds the strip between the best
    second-objective value seen so far and its own, of width ``x - ref_x``. O(k log k).
    """
    order = np.argsort(-pts[:, 0], kind="stable")
    xs, ys = pts[order, 0], pts[order, 1]
    best_y = np.maximum.accumulate(ys)  # best y among points with larger-or-equal x
    prev = np.concatenate([[ref_max[1]], best_y[:-1]])
    gain = np.maximum(ys - prev, 0.0)  # new height this point adds
    return float(np.sum((xs - ref_max[0]) * gain))


def _hypervolume_3d_max(pts: np.ndarray, ref_max: np.ndarray) -> float:
    """Exact 3-D hypervolume (max-convention) of points all strictly better than ``ref_max``,
    by slicing along the third objective (the HSO idea, While et al. 2006, "A faster
    algorithm for calculating hypervolume", IEEE TEC 10(1)): between consecutive third-
    objective values the dominated region is the 2-D hypervolume of the points above the
    slab. O(k^2 log k) for k points, so callers pass non-dominated points.
    """
    order = np.argsort(-pts[:, 2], kind="stable")
    z = pts[order, 2]
    total = 0.0
    for k in range(len(order)):
        z_next = z[k + 1] if k + 1 < len(order) else ref_max[2]
        depth = z[k] - z_next
        if depth > 0:
            total += depth * _hypervolume_2d_max(pts[order[: k + 1], :2], ref_max[:2])
    return float(total)


def _hypervolume_max(Y_max: np.ndarray, ref_max: np.ndarray) -> float:
    """Hypervolume in max-convention; non-finite rows and rows not better than ref dropped.

    One objective: ``best - ref``. Two: exact sweep; three: exact slicing (both numpy, no
    torch import). Four or more: BoTorch's exact ``Hypervolume`` (Fonseca et al. 2006
    dimension sweep). Dominated points are removed first.
    """
    rows = Y_max[np.all(np.isfinite(Y_max), axis=1)]
    rows = rows[np.all(rows > ref_max, axis=1)]
    if rows.shape[0] == 0:
        return 0.0
    if rows.shape[1] == 1:
        return float(rows[:, 0].max() - ref_max[0])
    if rows.shape[1] == 2:
        return _hypervolume_2d_max(rows, ref_max)
    rows = np.unique(rows[_non_dominated_max(rows)], axis=0)
    if rows.shape[1] == 3:
        return _hypervolume_3d_max(rows, ref_max)
    import torch
    from botorch.utils.multi_objective.hypervolume import Hypervolume

    pts = torch.from_numpy(np.ascontiguousarray(rows))
    return float(Hypervolume(torch.from_numpy(ref_max.copy())).compute(pts))


def hypervolume_history(
    Y_in_trial_order: ArrayLike, modes: Sequence[str], ref: Sequence[float]
) -> list[float]:
    """Hypervolume after each trial, in trial order, with one fixed reference point.

    Entry ``i`` is the hypervolume of rows ``0..i`` (see :func:`hypervolume`), so the list has
    one value per row and never decreases. Rows that are NaN (failed or infeasible trials)
    keep the previous value. The hypervolume is only recomputed when a row enters the current
    front, so 1,000 trials cost a few dozen BoTorch calls.

    Args:
        Y_in_trial_order: ``(n, m)`` objective values, one row per trial in the order the
            trials were run.
        modes: ``m`` strings, ``"max"`` or ``"min"``.
        ref: ``m`` finite reference values; use the run's final reference point so that the
            curve is comparable across trials.

    Returns:
        ``n`` floats.

    Raises:
        ValueError: malformed inputs or non-finite ``ref``.
    """
    Y = _check(Y_in_trial_order, modes)
    ref_max = _check_ref(ref, Y.shape[1]) * _signs(modes)
    Y_max = Y * _signs(modes)
    history: list[float] = []
    front = np.empty((0, Y.shape[1]))
    current = 0.0
    for row in Y_max:
        if np.all(np.isfinite(row)) and np.all(row > ref_max):
            # Does any point of the current front weakly dominate the new row?
            dominated = bool(np.any(np.all(front >= row, axis=1))) if front.shape[0] else False
            if not dominated:
                keep = ~np.all(row >= front, axis=1) if front.shape[0] else np.zeros(0, bool)
                front = np.vstack([front[keep], row])
                current = _hypervolume_max(front, ref_max)
        history.append(current)
    return history
