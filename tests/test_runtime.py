"""The runtime of an exported model (:mod:`archsearch.runtime`): the regime rule never picks a
candidate measured slower than the full model (timings injected), each regime runs what it says
and reports the FLOPs it executed and each row's exit depth."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from archsearch.models import costs
from archsearch.runtime import REGIMES, Runtime, bucket, choose_regime
from test_confidence_exit import confident_gating
from test_depth_predictor import make_batch, one_thread  # noqa: F401 (one_thread: autouse fixture)

seconds = st.floats(min_value=1e-6, max_value=10.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(cascade=seconds, static=st.one_of(st.none(), seconds), full=seconds)
def test_the_rule_never_picks_a_candidate_slower_than_the_full_model(cascade, static, full):
    times = {"cascade": cascade, "full": full, **({} if static is None else {"static": static})}
    choice = choose_regime(times)
    assert times[choice] <= full
    assert (choice == "cascade") == (cascade <= full)  # the trial's own predictions whenever they cost no time
    if choice == "full":
        assert cascade > full and (static is None or static > full)


def test_the_rule_needs_the_cascade_and_the_full_model():
    with pytest.raises(ValueError, match="cascade"):
        choose_regime({"static": 1.0, "full": 2.0})


def test_buckets_are_powers_of_two():
    assert [bucket(n) for n in (0, 1, 2, 3, 5, 32, 33, 100)] == [1, 1, 2, 4, 8, 32, 64, 128]


class InjectedRuntime(Runtime):
    """A runtime whose timings are given, not measured: each run of regime ``r`` takes
    ``times[r]`` seconds (the regime still runs, so the outputs are real)."""

    def __init__(self, *args, times, **kwargs):
        super().__init__(*args, **kwargs)
        self.times, self.timed = times, []

    def time_regime(self, regime, x, mask):
        self.timed.append(regime)
        return self.times[regime], self.run_regime(regime, x, mask)


def gating(budget=0.5, device="cpu"):
    g = confident_gating({"flops_budget": budget}, n_layers=4, device=device)
    g.threshold = 0.7  # some rows stop early, some run on
    return g


@pytest.mark.parametrize("times, want", [
    ({"cascade": 1.0, "static": 0.5, "full": 2.0}, "cascade"),  # the cascade whenever it saves time
    ({"cascade": 3.0, "static": 1.0, "full": 2.0}, "static"),   # slower cascade: the cut, if faster than full
    ({"cascade": 3.0, "static": 2.5, "full": 2.0}, "full"),     # both slower: the full model
])
def test_auto_times_each_candidate_on_the_first_batches_then_runs_the_choice(times, want):
    g = gating()
    rt = InjectedRuntime(g.model, g, flops_budget=0.5, repeats=2, trial_batches=3, times=times)
    batches = [make_batch(B=16 - i, seed=3 + i) for i in range(5)]  # one regime: 16 rows (13..16)
    key = rt.regime_of(16, batches[0][0].shape[1])
    for i, (x, m) in enumerate(batches[:3]):  # measured: every candidate, the cascade's outputs
        out = rt.run(x, m)
        assert out.regime == "cascade" and len(rt.timed) == 2 * len(times) * (i + 1)
        torch.testing.assert_close(out.logits, g.predict(x, m)[0], rtol=0, atol=0)
        assert (key in rt.chosen) == (i == 2)
    assert sorted(set(rt.timed)) == sorted(times) and rt.chosen == {key: want}
    for x, m in batches[3:]:  # chosen: no more timing
        assert rt.run(x, m).regime == want
    assert len(rt.timed) == 2 * len(times) * 3
    (row,) = rt.report()
    assert row["regime"] == want and row["ratio_vs_full"] == pytest.approx(times[want] / times["full"])
    assert row["ratio_vs_full"] <= 1.0


def test_each_regime_runs_what_it_says_and_reports_executed_flops_and_depths(device):
    """On CUDA the static and full regimes replay CUDA graphs from the third run of a shape:
    four runs each, every one the eager model's logits."""
    g = gating(budget=0.5, device=device)
    model, L = g.model, g.model.config.n_layers
    rt = Runtime(model, g, flops_budget=0.5)
    x, m = make_batch(B=12, seed=7, device=device)
    T = x.shape[1]
    tol = 0 if device.type == "cpu" else 1e-5
    with torch.no_grad():
        for _ in range(4):
            full = rt.run(x, m, regime="full")
            torch.testing.assert_close(full.logits, model(x, m, n_layers=L), rtol=0, atol=tol)
    assert full.depth.tolist() == [L] * 12
    assert full.flops.tolist() == [float(costs.flops_per_sample(model.config, T))] * 12
    d = rt.static_depth(T)
    assert d is not None and d < L
    assert costs.flops_per_sample(model.config, T, n_layers=d) <= 0.5 * costs.flops_per_sample(model.config, T)
    assert costs.flops_per_sample(model.config, T, n_layers=d + 1) > 0.5 * costs.flops_per_sample(model.config, T)
    with torch.no_grad():
        for _ in range(4):
            cut = rt.run(x, m, regime="static")
            torch.testing.assert_close(cut.logits, model(x, m, n_layers=d), rtol=0, atol=tol)
    assert cut.depth.tolist() == [d] * 12
    with torch.no_grad():
        cascade = rt.run(x, m, regime="cascade")
        logits, flops = g.predict(x, m)
    torch.testing.assert_close(cascade.logits, logits, rtol=0, atol=tol)
    assert torch.equal(cascade.flops.cpu(), flops.to(torch.float64).cpu())
    depths = cascade.depth.tolist()
    assert set(depths) <= set(g.exit_depths()) and len(set(depths)) > 1  # rows leave at their own exits
    per_depth = {dd: float(costs.flops_per_sample(model.config, T, n_layers=dd)) for dd in g.exit_depths()}
    assert cascade.flops.tolist() == [per_depth[dd] for dd in depths]
    assert set(REGIMES) == {"cascade", "static", "full"}


def test_no_static_cut_below_the_cheapest_exit_and_none_without_a_budget():
    g = gating(budget=0.1)
    rt = Runtime(g.model, g, flops_budget=0.1)
    x, m = make_batch(B=4, seed=1)
    assert rt.static_depth(x.shape[1]) is None and rt.candidates(x.shape[1]) == ["cascade", "full"]
    with pytest.raises(ValueError, match="static cut"):
        rt.run(x, m, regime="static")
    assert Runtime(g.model, g, flops_budget=None).candidates(x.shape[1]) == ["cascade", "full"]


def test_a_gating_without_exits_has_one_regime_and_refuses_the_others():
    from archsearch.dynamic.base import StaticGating
    from test_depth_predictor import make_model

    model = make_model(n_layers=2).eval()
    g = StaticGating(model, {}, {})
    rt = Runtime(model, g, flops_budget=None)
    x, m = make_batch(B=5, seed=2)
    out = rt.run(x, m)
    assert not rt.dynamic and out.regime == "cascade" and rt.chosen == {}
    assert out.depth.tolist() == [2] * 5
    with pytest.raises(ValueError, match="no early exits"):
        rt.run(x, m, regime="full")
    with pytest.raises(ValueError, match="regime"):
        rt.run(x, m, regime="fastest")
