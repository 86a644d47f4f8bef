"""benchmarks/schedulers/no_hindsight.py (issue 66, protocol v4): the simulator hides what a real
search would not know, and its bookkeeping is sound (fast: a few simulated searches)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def N():
    return load_benchmark("schedulers.no_hindsight")


def test_folds_partition_the_34_tasks(N):
    fs = N.folds()
    assert [len(f) for f in fs] == [12, 11, 11]
    assert sorted(t for f in fs for t in f) == sorted(N.all_tasks()) and len(set(N.all_tasks())) == 34


def test_every_scheduler_sees_the_same_noise_at_the_epochs_it_reads(N):
    task = N.all_tasks()[3]
    some, every = N.NoisyCurves(task, 2, n=20, epochs=(1, 3, 9, 27, 52)), N.NoisyCurves(task, 2, n=20)
    for i in (0, 7, 19):
        np.testing.assert_array_equal(some.observed(i), every.observed(i)[[0, 2, 8, 26, 51]])
        assert not np.allclose(every.observed(i), every.row(i)[0])  # noisy
    assert np.std([some.offset]) > 0.5


def test_the_policy_at_asha_weights_is_ashas_rule_and_learns_costs_only_after_epoch_1(N, monkeypatch):
    """StopPolicy at ASHA's weights decides as Ray's ASHAScheduler on the same noisy reports (the
    same trials, stops and front), and a trial's cost reaches it only once its first epoch ran."""
    from archsearch.search import scheduler as sch

    task = N.all_tasks()[5]
    asha = N.simulate(task, 1, "asha")
    seen = []
    orig = sch.StopPolicy.features

    def spy(self, trial, rung, v, budget_used=0.0):
        seen.append(self.cost.get(trial))
        return orig(self, trial, rung, v, budget_used)

    monkeypatch.setattr(sch.StopPolicy, "features", spy)
    ahto = N.simulate(task, 1, "ahto", list(sch.ASHA_WEIGHTS))
    assert (ahto["trials"], ahto["stopped"], ahto["hv"]) == (asha["trials"], asha["stopped"], asha["hv"])
    assert seen and all(c is not None and c > 0 for c in seen)
    start, on_result = N._decider("ahto", list(sch.ASHA_WEIGHTS))[:2]
    start(0)
    assert on_result.__self__.cost[0] is None  # registered without a cost


def test_the_scored_front_keeps_members_by_their_reports_and_scores_their_true_values(N):
    f = N.ScoredFront([0.0, -100.0])
    assert f.add(50.0, 40.0, 10.0)
    assert not f.add(49.0, 60.0, 20.0)  # dominated by its report: not a member, whatever it is worth
    assert f.add(55.0, 45.0, 10.0)  # replaces the first
    assert f.hv == pytest.approx(45.0 * 90.0)


def test_the_one_epoch_rule_trains_only_the_top_share_past_epoch_1(N):
    r = N.simulate(N.all_tasks()[0], 0, "one_epoch")
    assert r["stopped"] / r["trials"] > 0.85 and r["trials"] - r["stopped"] >= 1


def test_the_stored_v4_result_regenerates_from_its_runs(N):
    assert N.main(["check"]) == 0
