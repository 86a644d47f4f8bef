"""benchmarks/schedulers/schedulers.py's simulated searches on LCBench (issue 38): the horizon check of
protocol v2 reads a long search's prefix as the shorter search, which holds for schedulers whose
decisions do not read the budget, and not for one that does."""

import numpy as np
import pytest
from conftest import load_benchmark

TASK = "34539"  # a training task


@pytest.fixture(scope="module")
def S():
    pytest.importorskip("onnxruntime")
    return load_benchmark("schedulers.schedulers")


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


def _row(label, seed, final):
    return {"split": "test", "task": TASK, "label": label, "seed": seed, "t": [1.0], "hv": [final], "budget": 2.0, "trials": 3}


def test_best_known_is_per_seed_in_v3_and_per_task_before(S):
    rows = [_row("asha", 0, 5.0), _row("ahto", 0, 7.0), _row("asha", 1, 9.0), _row("ahto", 1, 8.0)]
    assert S.best_known(rows, TASK, ["asha", "ahto"], [0, 1], per_seed_best=True) == {0: 7.0, 1: 9.0}
    assert S.best_known(rows, TASK, ["asha", "ahto"], [0, 1]) == {0: 9.0, 1: 9.0}
    # v1's rule: seed 0's searches (7.0 at best) never reach 95% of 9.0: both censored, ratio 1;
    # per seed, asha (5.0 < 0.95 x 7.0) is censored and ahto is not
    t = S.per_task(rows, ["asha", "ahto"], [TASK], [0], per_seed_best=True)[TASK]
    assert t["ahto"]["reached"] == 1 and t["asha"]["reached"] == 0
    t = S.per_task(rows, ["asha", "ahto"], [TASK], [0, 1])[TASK]
    assert t["ahto"]["reached"] == 0 and t["asha"]["reached"] == 1


def test_v3_scores_its_own_ahto_and_v1s_other_schedulers(S):
    st = S.Setup("v3")
    rows = S.read_rows(st, "test")
    own = {(r["task"], r["seed"]) for r in S.read_jsonl(st.runs) if r["split"] == "test"}
    ahto = [r for r in rows if r["label"] == "ahto"]
    assert len(ahto) == len(own) == 200 and {(r["task"], r["seed"]) for r in ahto} == own
    assert {r["label"] for r in rows} == set(S.SCHEDULERS) and len(rows) == 1000


@pytest.mark.slow
def test_stored_results_regenerate(S):
    """schedulers_v1.json, schedulers_v2.json and schedulers_v3.json regenerate from the committed
    runs (``check``: provenance aside; the ledger left as it is)."""
    assert S.main(["check"]) == 0
