"""The depth histograms a trial reports describe exactly the split just evaluated (issue 14):
DHT's ``dht_depth_hist`` no longer counts the latency-timing batches, and the depth predictor's
``depth_histogram`` of a test evaluation is the test split's, not the validation split's.
Real training on real data (tiny models, a few seconds each)."""

from __future__ import annotations

from collections import Counter

import pytest

from conftest import sentence_subsets
import torch

N_TRAIN, N_VAL, N_TEST = 640, 256, 300  # the test split is not a multiple of any batch size


@pytest.fixture(scope="module")
def small_data(cache_dir):
    return sentence_subsets(train=N_TRAIN, validation=N_VAL, test=N_TEST)


def trained_loop(data, device, **cfg):
    from archsearch.tune.trainable import TrialLoop

    torch.set_num_threads(1)
    base = {"n_layers": 3, "d_model": 32, "n_heads": 4, "warmup_steps": 5, "flops_budget": 0.5}
    loop = TrialLoop({**base, **cfg}, data, {"epochs": 1, "batch_size": 32, "seed": 0,
                                             "latency_batch_size": 32, "device": str(device)})
    loop.train_epoch()
    return loop


def on_device(loop, split):
    """The evaluation batches of ``split`` on the loop's device, as evaluation runs them."""
    for x, mask, y in loop.eval_batches(split):
        yield x.to(loop.device), None if mask is None else mask.to(loop.device), y


def test_dht_histogram_counts_exactly_the_evaluated_samples(small_data, device):
    from archsearch.dynamic.known_costs import known_costs_fn

    loop = trained_loop(small_data, device, gating="dht", dht_lambda=0.5, dht_warmup_steps=3,
                        dht_warmup_max_steps=8)
    g = loop.gating
    assert g.takeover_step is not None and g.updates > 0  # the bandit routes the evaluation
    for split, n in (("test", N_TEST), ("validation", N_VAL), ("test", N_TEST)):
        m = loop.evaluate(split)  # also times latency on 6 validation batches of 32 afterwards
        assert m["dht_eval_samples"] == n, (split, m["dht_eval_samples"])
        counts = Counter()  # the greedy choices evaluation made, recomputed per split
        for x, mask, _ in on_device(loop, split):
            with loop.autocast():
                plan = g.plan(x, mask)
            for depth, idx, _ in plan:
                counts[depth] += len(idx)
        assert sum(counts.values()) == n
        assert m["dht_depth_hist"] == pytest.approx({str(d): counts[d] / n for d in g.depths}, abs=1e-12)
        assert m["dht_mean_depth"] == pytest.approx(sum(d * c for d, c in counts.items()) / n, abs=1e-12)
        if split == "validation":
            # the known cost a searcher used for this config is what the trial reports, within
            # the +-0.05 of the budget calibration (validation here fits in the calibration rows)
            known = known_costs_fn(small_data)(loop.cfg)["flops_per_sample"]
            static = known_costs_fn(small_data)({**loop.cfg, "gating": "static"})["flops_per_sample"]
            assert known == pytest.approx(0.5 * static)
            assert abs(m["flops_per_sample"] - known) <= 0.05 * static
            assert m["flops_per_sample"] / static == pytest.approx(m["dht_calibrated_flops_fraction"], abs=1e-9)


def test_depth_predictor_histogram_of_a_test_evaluation_is_the_test_splits(small_data, device):
    loop = trained_loop(small_data, device, gating="depth_predictor", gamma=0.5, min_layers=1)
    g = loop.gating
    for split, n in (("validation", N_VAL), ("test", N_TEST), ("validation", N_VAL)):
        m = loop.evaluate(split)
        depths, expected = [], 0.0  # the exits evaluation took on this split, recomputed
        with torch.no_grad(), loop.autocast():
            for x, mask, _ in on_device(loop, split):
                depths += g.predict_depths(x, mask).tolist()
                expected += float(g.expected_depth(g._front(x, mask)[2].softmax(-1)).sum())
        assert len(depths) == n
        assert m["depth_histogram"] == {str(d): depths.count(d) for d in (1, 2, 3)}, split
        assert m["mean_exit_depth"] == pytest.approx(sum(depths) / n)
        assert m["expected_depth"] == pytest.approx(expected / n, rel=1e-5)
