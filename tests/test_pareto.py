"""Tests of archsearch.pareto: the one Pareto mask, reference point and hypervolume.

Independent references: a brute-force O(n^2) dominance check, an exact count of unit cells on
an integer grid, inclusion-exclusion over boxes (both written in the objectives' own signs,
not through the module's max-convention), and BoTorch's ``is_non_dominated`` / ``Hypervolume``.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest

from archsearch.pareto import hypervolume, hypervolume_history, non_dominated_mask, reference_point

MODES = {2: ["max", "min"], 3: ["min", "max", "min"], 4: ["max", "min", "min", "max"]}


# ------------------------------------------------------------------------------------------
# brute-force references (original units, no sign trick)
# ------------------------------------------------------------------------------------------


def better_eq(a: float, b: float, mode: str) -> bool:
    return a >= b if mode == "max" else a <= b


def dominates(a, b, modes) -> bool:
    """a is at least as good as b everywhere and strictly better somewhere."""
    return (all(better_eq(x, y, m) for x, y, m in zip(a, b, modes))
            and any(x != y for x, y in zip(a, b)))


def brute_mask(Y: np.ndarray, modes) -> list[bool]:
    finite = [bool(np.all(np.isfinite(y))) for y in Y]
    return [finite[i] and not any(finite[j] and dominates(Y[j], Y[i], modes)
                                  for j in range(len(Y)) if j != i)
            for i in range(len(Y))]


def box_side(values, r: float, mode: str) -> float:
    """Side of the intersection of the boxes between points ``values`` and the reference."""
    return max(0.0, min(values) - r) if mode == "max" else max(0.0, r - max(values))


def inclusion_exclusion_hv(Y: np.ndarray, modes, ref) -> float:
    """Exact volume of the union of the boxes [point, ref]: sum over non-empty subsets."""
    pts = [y for y in Y if np.all(np.isfinite(y))]
    total = 0.0
    for k in range(1, len(pts) + 1):
        for subset in itertools.combinations(pts, k):
            vol = 1.0
            for j, mode in enumerate(modes):
                vol *= box_side([p[j] for p in subset], ref[j], mode)
            total += (-1) ** (k + 1) * vol
    return total


def grid_count_hv(Y: np.ndarray, modes, ref) -> int:
    """Exact hypervolume of integer points and an integer reference: the number of unit cells
    between the reference and the points that some point dominates. A cell is named by its
    corner nearest the reference; it is covered when a point is at least one unit better
    than that corner in every objective."""
    pts = [y for y in Y if np.all(np.isfinite(y))]
    ranges = []
    for j, mode in enumerate(modes):
        vals = [int(p[j]) for p in pts]
        r = int(ref[j])
        ranges.append(range(r, max(vals + [r])) if mode == "max" else range(min(vals + [r]), r))
    count = 0
    for cell in itertools.product(*ranges):
        for p in pts:
            if all((p[j] >= c + 1) if mode == "max" else (p[j] <= c) for j, (c, mode) in
                   enumerate(zip(cell, modes))):
                count += 1
                break
    return count


def random_front(rng: np.random.Generator, n: int, m: int, *, integers: bool) -> np.ndarray:
    """Random points with duplicates, points dominated by others and a NaN row."""
    Y = (rng.integers(0, 6, size=(n, m)).astype(float) if integers
         else rng.uniform(0.0, 1.0, size=(n, m)))
    dup = Y[rng.integers(0, n, size=2)]                        # exact duplicates
    worse = Y[rng.integers(0, n, size=2)].copy()               # dominated copies
    signs = np.array([1.0 if mode == "max" else -1.0 for mode in MODES[m]])
    worse -= signs * (1.0 if integers else 0.05)
    nan = np.full((1, m), np.nan)
    nan[0, 0] = 100.0                                          # partly finite: still ignored
    out = np.vstack([Y, dup, worse, nan])
    return out[rng.permutation(len(out))]


# ------------------------------------------------------------------------------------------
# mask
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [2, 3, 4])
@pytest.mark.parametrize("integers", [True, False])
def test_mask_equals_brute_force(m, integers):
    rng = np.random.default_rng(100 * m + integers)
    for n in (1, 2, 5, 12, 40):
        Y = random_front(rng, n, m, integers=integers)
        assert non_dominated_mask(Y, MODES[m]).tolist() == brute_mask(Y, MODES[m]), (n, Y)


@pytest.mark.parametrize("m", [2, 3])
def test_mask_matches_botorch(m):
    """Same answer as BoTorch's is_non_dominated(deduplicate=False), ties and duplicates
    included (values on a coarse integer grid make many of them)."""
    import torch
    from botorch.utils.multi_objective.pareto import is_non_dominated

    rng = np.random.default_rng(10 + m)
    modes = ["max", "min", "max"][:m]
    signs = np.array([1.0 if mode == "max" else -1.0 for mode in modes])
    for n in (1, 7, 300):
        Y = rng.integers(0, 6, size=(n, m)).astype(float)
        expected = is_non_dominated(torch.tensor(Y * signs), deduplicate=False).numpy()
        assert non_dominated_mask(Y, modes).tolist() == expected.tolist()


def test_mask_known_set_max_max():
    Y = np.array([[1.0, 5.0], [2.0, 4.0], [3.0, 1.0], [1.5, 3.0], [0.5, 0.5], [3.0, 0.5]])
    # (1.5, 3) is dominated by (2, 4); (0.5, 0.5) by everything; (3, 0.5) by (3, 1).
    assert non_dominated_mask(Y, ["max", "max"]).tolist() == [True, True, True, False, False, False]


def test_min_max_flipping():
    acc = np.array([0.70, 0.75, 0.80, 0.72, 0.80])
    flops = np.array([1e6, 2e6, 4e6, 3e6, 5e6])
    Y = np.column_stack([acc, flops])
    mask = non_dominated_mask(Y, ["max", "min"])
    # (0.72, 3e6) is beaten by (0.75, 2e6); (0.80, 5e6) by (0.80, 4e6).
    assert mask.tolist() == [True, True, True, False, False]
    # Negating the min column and maximising both must give the same front ...
    assert non_dominated_mask(np.column_stack([acc, -flops]), ["max", "max"]).tolist() == mask.tolist()
    # ... and so must negating the max column and minimising both.
    assert non_dominated_mask(np.column_stack([-acc, flops]), ["min", "min"]).tolist() == mask.tolist()
    # Flipping a mode changes the answer: minimising accuracy favours the 0.70 trial only.
    assert non_dominated_mask(Y, ["min", "min"]).tolist() == [True, False, False, False, False]


def test_mask_ignores_nan_rows_and_handles_empty():
    Y = np.array([[0.9, 1e6], [np.nan, 1.0], [0.8, np.nan], [0.7, 2e6]])
    assert non_dominated_mask(Y, ["max", "min"]).tolist() == [True, False, False, False]
    assert non_dominated_mask(np.empty((0, 2)), ["max", "min"]).tolist() == []
    assert non_dominated_mask([], ["max", "min"]).tolist() == []


@pytest.mark.parametrize("bad_modes", [["max"], ["max", "minimize"]])
def test_bad_modes_raise(bad_modes):
    with pytest.raises(ValueError):
        non_dominated_mask(np.ones((3, 2)), bad_modes)


def test_bad_shapes_and_refs_raise():
    with pytest.raises(ValueError):
        non_dominated_mask(np.ones(3), ["max"])
    with pytest.raises(ValueError):
        hypervolume(np.ones((2, 2)), ["max", "max"], [0.0])
    with pytest.raises(ValueError):
        hypervolume(np.ones((2, 2)), ["max", "max"], [0.0, np.nan])


# ------------------------------------------------------------------------------------------
# hypervolume
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [2, 3, 4])
def test_hypervolume_equals_grid_count(m):
    """Integer points and reference: the hypervolume is a whole number of unit cells, so a
    missing or extra box (an off-by-one in a sweep or slice) shows as an error >= 1."""
    rng = np.random.default_rng(7 + m)
    modes = MODES[m]
    ref = [-1 if mode == "max" else 6 for mode in modes]
    for n in (1, 3, 6, 10):
        Y = random_front(rng, n, m, integers=True)
        expected = grid_count_hv(Y, modes, ref)
        assert hypervolume(Y, modes, ref) == pytest.approx(expected, abs=1e-6), (n, Y)
        # a reference inside the cloud: points not strictly better than it do not count
        inner = [1 if mode == "max" else 4 for mode in modes]
        assert hypervolume(Y, modes, inner) == pytest.approx(
            grid_count_hv(Y, modes, inner), abs=1e-6), (n, Y)


@pytest.mark.parametrize("m", [2, 3, 4])
def test_hypervolume_equals_inclusion_exclusion(m):
    rng = np.random.default_rng(30 + m)
    modes = MODES[m]
    ref = [-0.1 if mode == "max" else 1.1 for mode in modes]
    for n in (1, 4, 7):
        Y = random_front(rng, n, m, integers=False)  # up to n + 5 rows: 2^12 subsets at most
        expected = inclusion_exclusion_hv(Y, modes, ref)
        assert hypervolume(Y, modes, ref) == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("m", [2, 3, 4])
def test_hypervolume_matches_botorch(m):
    import torch
    from botorch.utils.multi_objective.hypervolume import Hypervolume
    from botorch.utils.multi_objective.pareto import is_non_dominated

    rng = np.random.default_rng(m)
    Y = rng.uniform(0, 1, size=(60, m))
    modes = MODES[m]
    ref = [-0.1 if mode == "max" else 1.1 for mode in modes]
    signs = np.array([1.0 if mode == "max" else -1.0 for mode in modes])
    pts = torch.tensor(Y * signs, dtype=torch.double)
    expected = float(Hypervolume(torch.tensor(np.array(ref) * signs)).compute(
        pts[is_non_dominated(pts)]))
    assert hypervolume(Y, modes, ref) == pytest.approx(expected, rel=1e-9)


def test_hypervolume_equals_hand_computed_area():
    # Max/max staircase over ref (0, 0): 1*3 + (2-1)*2 + (3-2)*1 = 6.
    Y = np.array([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0], [1.0, 1.0]])
    assert hypervolume(Y, ["max", "max"], [0.0, 0.0]) == pytest.approx(6.0)
    # Accuracy (max) vs FLOPs (min), ref (0.5, 4e6 FLOPs); sorted by FLOPs the front is
    # (0.5e6, 0.7), (1e6, 0.8), (2e6, 0.9): area = 3.5e6*0.2 + 3e6*0.1 + 2e6*0.1 = 1.2e6.
    Y = np.array([[0.8, 1e6], [0.9, 2e6], [0.85, 3e6], [0.7, 0.5e6]])
    assert hypervolume(Y, ["max", "min"], [0.5, 4e6]) == pytest.approx(1.2e6)
    # Points not strictly better than the reference contribute nothing.
    assert hypervolume(Y, ["max", "min"], [0.95, 4e6]) == 0.0
    assert hypervolume(np.empty((0, 2)), ["max", "min"], [0.5, 4e6]) == 0.0


def test_one_objective_hypervolume_is_improvement_over_ref():
    Y = np.array([[0.7], [0.82], [np.nan], [0.75]])
    assert hypervolume(Y, ["max"], [0.6]) == pytest.approx(0.22)
    assert hypervolume(np.array([[3.0], [2.5]]), ["min"], [4.0]) == pytest.approx(1.5)


def test_maximisation_form_as_the_searchers_call_it():
    """Searchers keep ``sign * value`` rows as plain lists (possibly none yet) and call the
    modes version with all ``"max"``."""
    assert hypervolume([], ["max", "max"], [0.0, -5.0]) == 0.0
    ys = [[0.8, -1.0], [0.9, -2.0], [0.85, -3.0]]
    assert hypervolume(ys, ["max", "max"], [0.5, -4.0]) == pytest.approx(
        hypervolume(np.array([[0.8, 1.0], [0.9, 2.0], [0.85, 3.0]]), ["max", "min"], [0.5, 4.0]))


def test_reference_point_rule():
    Y = np.array([[0.70, 1e6], [0.85, 5e6], [0.80, 2e6]])
    ref = reference_point(Y, ["max", "min"], [None, None])
    # worst value moved outward by 10% of the observed range
    assert ref == pytest.approx([0.70 - 0.015, 5e6 + 0.4e6])
    assert reference_point(Y, ["max", "min"], [0.5, None])[0] == 0.5
    # all values equal: 10% of |value|, or 0.1 at zero
    assert reference_point(np.array([[2.0, 0.0]]), ["max", "min"]) == pytest.approx([1.8, 0.1])
    # no data and no user value: undeterminable
    assert reference_point(np.empty((0, 2)), ["max", "min"], [None, 3e6]) == [None, 3e6]


@pytest.mark.parametrize("m", [2, 3, 4])
def test_hypervolume_history_is_the_hypervolume_of_each_prefix(m):
    rng = np.random.default_rng(50 + m)
    modes = MODES[m]
    Y = random_front(rng, 25, m, integers=False)
    Y[[4, 17]] = np.nan  # failed trials keep the previous value
    ref = [-0.1 if mode == "max" else 1.1 for mode in modes]
    hist = hypervolume_history(Y, modes, ref)
    assert len(hist) == len(Y)
    assert all(b >= a for a, b in zip(hist, hist[1:]))
    assert hist[4] == hist[3] and hist[17] == hist[16]
    for i in range(len(Y)):
        assert hist[i] == pytest.approx(hypervolume(Y[: i + 1], modes, ref), rel=1e-12, abs=1e-15)


def test_hypervolume_history_monotone_and_final_value():
    rng = np.random.default_rng(1)
    Y = np.column_stack([rng.uniform(0.6, 0.8, 50), rng.uniform(1e6, 1e7, 50)])
    Y[[4, 17]] = np.nan  # failed trials keep the previous value
    ref = [0.55, 1.2e7]
    hist = hypervolume_history(Y, ["max", "min"], ref)
    assert len(hist) == 50
    assert all(b >= a for a, b in zip(hist, hist[1:]))
    assert hist[4] == hist[3] and hist[17] == hist[16]
    assert hist[-1] == pytest.approx(hypervolume(Y, ["max", "min"], ref))
    for i in (0, 9, 30):
        assert hist[i] == pytest.approx(hypervolume(Y[: i + 1], ["max", "min"], ref))


def test_import_does_not_import_torch():
    code = ("import sys, archsearch.pareto as p; "
            "p.hypervolume([[1, 2, 3]], ['max'] * 3, [0, 0, 0]); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
