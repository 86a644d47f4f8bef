"""benchmarks/schedulers.py's simulated searches on LCBench (issue 38): the horizon check of
protocol v2 reads a long search's prefix as the shorter search, which holds for schedulers whose
decisions do not read the budget, and not for one that does."""

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
TASK = "34539"  # a training task


@pytest.fixture(scope="module")
def S():
    pytest.importorskip("onnxruntime")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import schedulers

    return schedulers


def test_curves_do_not_depend_on_the_chunk(S):
    a, b = S.Curves(TASK, 3, n=40, epochs=S.REPORTS, chunk=7), S.Curves(TASK, 3, n=40, epochs=S.REPORTS)
    for i in (0, 6, 7, 39):
        np.testing.assert_allclose(a.row(i)[0], b.row(i)[0], rtol=1e-6)
        np.testing.assert_allclose(a.row(i)[1], b.row(i)[1], rtol=1e-6)


@pytest.mark.parametrize("scheduler", ["asha", "hyperband"])
def test_a_shorter_horizon_is_the_long_searchs_prefix(S, scheduler):
    long = S.simulate(TASK, 1, scheduler, full_trials=6, marks=(2, 4))
    for h in (2, 4):
        short = S.simulate(TASK, 1, scheduler, full_trials=h)
        assert long["hv_at_marks"][str(float(h))] == short["hv"][-1]
    assert long["hv"][-1] >= long["hv_at_marks"]["4.0"] >= long["hv_at_marks"]["2.0"] > 0


def test_a_policy_that_reads_the_budget_is_not_a_prefix(S):
    """Continue iff 5 budget_used - 1 >= 0: it stops every trial at its first rung early in a
    search, so the same epoch's decision differs with the horizon (why the horizon check runs
    only the library schedulers)."""
    w = [0, 0, 0, 0, 5.0, 0, -1.0]
    long = S.simulate(TASK, 1, "policy", w, full_trials=6, marks=(2,))
    short = S.simulate(TASK, 1, "policy", w, full_trials=2)
    assert long["hv_at_marks"]["2.0"] != short["hv"][-1]
