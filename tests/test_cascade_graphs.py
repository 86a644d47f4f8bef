"""CUDA graphs of the cascade's segments (:mod:`archsearch.dynamic.cascade_graphs`): on a GPU every
per-sample gating gives the same logits, exits and FLOPs through graph replays as eagerly, the
graphs follow a change of the stop rule's constants, and a key that forgets one is caught. The
graph tests run with ``ARCHSEARCH_TEST_DEVICE=cuda`` (they skip on a CPU, where graphs are never
used, which the first tests check)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from archsearch.dynamic.cascade_graphs import SegmentGraphs, _rows_bucket
from archsearch.dynamic.depth_predictor import DepthPredictorGating
from archsearch.dynamic.dht import DHTGating
from archsearch.dynamic.exits import run_cascade
from test_confidence_exit import confident_gating
from test_depth_predictor import make_batch, make_model, one_thread, spread_depths  # noqa: F401 (autouse)
from test_dht import PAPER, train_steps


def needs_cuda(device):
    if device.type != "cuda":
        pytest.skip("CUDA graphs: run with ARCHSEARCH_TEST_DEVICE=cuda")


def batches(device, sizes=(1, 3, 17, 32)):
    """Batches of several row counts (each bucket of rows) and lengths."""
    out = []
    for i, B in enumerate(sizes):
        x, m = make_batch(B=B, T=12 - (i % 3), seed=40 + i, device=device)
        out.append((x, m))
    return out


def both_ways(g, xs, graphs: SegmentGraphs, repeat=3):
    """Each batch's ``predict`` through ``graphs`` (``repeat`` times: the shapes get captured and
    replayed) and eagerly: ``[(graph (logits, flops), eager (logits, flops)), ...]``."""
    g._segment_graphs = graphs
    out = []
    with torch.inference_mode():
        for x, m in xs:
            for _ in range(repeat):
                graphs.enabled = True
                got = g.predict(x, m)
            graphs.enabled = False
            out.append((got, g.predict(x, m)))
    graphs.enabled = True
    return out


def assert_same(pairs):
    for (lg, fl), (lg_e, fl_e) in pairs:
        torch.testing.assert_close(lg, lg_e, rtol=1e-5, atol=1e-5)
        assert torch.equal(fl.cpu(), fl_e.cpu())


def test_rows_are_bucketed_to_powers_of_two():
    assert [_rows_bucket(b) for b in (1, 2, 3, 4, 5, 17, 32, 33)] == [1, 2, 4, 4, 8, 32, 32, 64]


def test_graphs_need_a_key_and_stay_off_on_a_cpu():
    model = make_model().eval()
    x, m = make_batch(B=4)
    h, pad = model.embed(x), model.padding_mask(x, m)

    def never(k, h, pad, logits, state):
        return torch.zeros(len(h), dtype=torch.bool), None

    with pytest.raises(ValueError, match="key"):
        run_cascade(model, h, pad, [2, 4], 0, never, graphs=SegmentGraphs())
    graphs = SegmentGraphs()
    with torch.no_grad():
        out, idx = run_cascade(model, h, pad, [2, 4], 0, never, graphs=graphs, key=(("x",), None))
    assert not graphs.usable(model, h) and graphs.counts["replays"] == graphs.counts["eager_runs"] == 0
    torch.testing.assert_close(out, model(x, m), rtol=1e-5, atol=1e-6)


def test_confidence_exit_through_graphs_equals_eager(device):
    needs_cuda(device)
    g = confident_gating({"flops_budget": 0.5}, device=device)
    xs = batches(device)
    g.calibrate(xs)
    graphs = SegmentGraphs(measure=False)
    assert_same(both_ways(g, xs, graphs))
    assert graphs.counts["captured"] > 0 and graphs.counts["replays"] > 0 and graphs.counts["failed"] == 0
    measured = SegmentGraphs()  # the default: each shape keeps the faster of eager and graph
    assert_same(both_ways(g, xs, measured))


def test_a_new_threshold_is_followed_and_a_key_without_it_is_caught(device):
    """The graphs bake the threshold in: with it in the key's prefix a new threshold recaptures;
    a key that leaves it out (the broken variant) replays the old decisions."""
    needs_cuda(device)
    g = confident_gating({"flops_budget": 0.5}, device=device)
    m = g.model
    x, mask = make_batch(B=32, seed=7, device=device)
    h, pad = m.embed(x).detach(), m.padding_mask(x, mask)

    def exits(thr, graphs, key):
        with torch.no_grad():
            for _ in range(3):
                _, idx = run_cascade(m, h, pad, g.depths, 0, g.stop_rule(thr), graphs=graphs, key=key)
        return idx

    lo, hi = 0.55, 0.95
    eager_lo, eager_hi = (exits(t, None, None) for t in (lo, hi))
    assert not torch.equal(eager_lo, eager_hi)  # the two thresholds route differently
    right = SegmentGraphs(measure=False)
    assert torch.equal(exits(lo, right, (("ce", lo), None)), eager_lo)
    assert torch.equal(exits(hi, right, (("ce", hi), None)), eager_hi)
    broken = SegmentGraphs(measure=False)
    assert torch.equal(exits(lo, broken, (("ce",), None)), eager_lo)
    assert torch.equal(exits(hi, broken, (("ce",), None)), eager_lo)  # stale: caught


def test_dht_cascade_through_graphs_equals_eager(device):
    needs_cuda(device)
    torch.manual_seed(0)
    model = make_model(device=device)
    x, mask = make_batch(B=32, seed=3, device=device)
    dht = DHTGating(model, {**PAPER, "n_fixed": 1, "dht_warmup_steps": 0, "dht_warmup_max_steps": 2,
                            "flops_budget": 0.5, "dht_routing": "cascade", "min_heads": 4,
                            "dht_stop_context": "trajectory"}, {"seed": 0})
    model.train()
    train_steps(dht, model, x, mask, torch.randint(0, 2, (32,)).to(device), 4)
    model.eval()
    dht.eval_price = 0.3
    for seed in range(50):  # fitted models that send the rows to several exits
        dht.stopping.theta = 5.0 * np.random.default_rng(seed).normal(size=dht.stopping.theta.shape)
        dht.stopping.__dict__.pop("_theta_cache", None)
        dht._segment_graphs = SegmentGraphs()
        dht._segment_graphs.enabled = False
        if len(dht.plan(x, mask)) >= 2:
            break
    graphs = SegmentGraphs(measure=False)
    pairs = both_ways(dht, batches(device), graphs)
    assert_same(pairs)
    assert graphs.counts["replays"] > 0 and graphs.counts["failed"] == 0
    assert len(dht.plan(x, mask)) >= 2  # the rows really leave at different exits
    with torch.inference_mode():
        _, arms_g, _ = dht._run_cascade(*dht._trunk(x, mask, 0))
    dht._segment_graphs.enabled = False
    with torch.inference_mode():
        _, arms_e, _ = dht._run_cascade(*dht._trunk(x, mask, 0))
    assert torch.equal(arms_g, arms_e)


def test_depth_predictor_through_graphs_equals_eager(device):
    needs_cuda(device)
    model = make_model(device=device).eval()
    gating = DepthPredictorGating(model, {"gamma": 0.5}, {})
    spread_depths(gating)
    graphs = SegmentGraphs(measure=False)
    assert_same(both_ways(gating, batches(device), graphs))
    assert graphs.counts["replays"] > 0 and graphs.counts["failed"] == 0
