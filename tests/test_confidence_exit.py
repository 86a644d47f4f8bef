"""``gating: confidence_exit`` (DeeBERT's confidence-threshold early exit), the one cascade
(:func:`archsearch.dynamic.depth.exits.run_cascade`) and its offline twin
(:func:`archsearch.dynamic.depth.exits.first_stop`): tiny models, plus one real trial loop."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from archsearch.dynamic import gating_class
from archsearch.dynamic.depth.confidence_exit import NEVER, ConfidenceExitGating
from archsearch.dynamic.depth.exits import all_exit_loss, first_stop, run_cascade
from archsearch.models import costs
from test_depth_predictor import make_batch, make_model, one_thread  # noqa: F401 (one_thread: autouse fixture)


class FakeLoop:
    """The part of a :class:`~archsearch.dynamic.base.TrialContext` a calibration reads: the
    validation batches ``(x, mask, y)``."""

    def __init__(self, batches):
        self.batches = batches

    def eval_batches(self, split_name="validation", batch_size=256):
        return iter(self.batches)


def confident_gating(cfg=None, n_layers=4, seed=0, device="cpu"):
    """A gating on a tiny eval-mode model on ``device`` whose exits disagree in confidence across
    rows (random exit heads of a useful scale instead of the 0.02-std initialisation; drawn on
    the CPU, so every device gets the same weights)."""
    model = make_model(n_layers=n_layers, seed=seed, device=device).eval()
    g = ConfidenceExitGating(model, dict(cfg or {}), {})
    gen = torch.Generator().manual_seed(seed + 5)
    with torch.no_grad():
        for head in [*model.exit_heads.values(), model.head]:
            head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 0.5)
    return g


def val_batches(n=4, B=64, labels=None, device="cpu"):
    """``n`` validation batches ``(x, mask, y)`` on ``device`` (drawn on the CPU)."""
    out = []
    for s in range(n):
        x, m = make_batch(B=B, seed=10 + s, device=device)
        y = torch.randint(0, 2, (B,), generator=torch.Generator().manual_seed(s)) if labels is None else labels(B, s)
        out.append((x, m, y.to(device)))
    return out


def executed_fraction(g, batches):
    used = full = 0.0
    for x, m, *_ in batches:
        used += float(g.predict(x, m)[1].sum())
        full += len(x) * costs.flops_per_sample(g.model.config, x.shape[1])
    return used / full


def test_registered_settings_and_errors():
    assert gating_class("confidence_exit") is ConfidenceExitGating
    g = ConfidenceExitGating(make_model(), {}, {})
    assert (g.s.flops_budget, g.s.min_layers, g.s.exit_heads, g.s.exit_loss) == (None, 1, True, "sum")
    assert g.depths == [1, 2, 3, 4] and sorted(g.model.exit_heads) == ["1", "2", "3"]
    assert g.threshold == g.s.exit_threshold
    for key, value in (("flops_budget", 1.2), ("flops_budget", 0.0), ("exit_loss", "max"),
                       ("min_layers", 0), ("exit_threshold", 1.5)):
        with pytest.raises(ValueError, match=key):
            ConfidenceExitGating(make_model(), {key: value}, {})
    with pytest.raises(ValueError, match="min_layers"):
        ConfidenceExitGating(make_model(n_layers=2), {"min_layers": 3}, {})
    lm = make_model()
    lm.config = dataclasses.replace(lm.config, task="lm")
    with pytest.raises(ValueError, match="classification"):
        ConfidenceExitGating(lm, {}, {})
    shallow = ConfidenceExitGating(make_model(), {"min_layers": 3, "exit_heads": False}, {})
    assert shallow.depths == [3, 4] and shallow.model.exit_heads is None


def test_trained_exit_heads_are_kept():
    """A model that already has its exit heads (e.g. a trained multi-exit model the benchmark
    reads) keeps them; ``exit_heads: false`` adds none."""
    g = confident_gating()
    heads = dict(g.model.exit_heads.items())
    again = ConfidenceExitGating(g.model, {}, {})
    assert dict(again.model.exit_heads.items()) == heads  # the same modules, not fresh ones
    assert make_model().exit_heads is None
    assert ConfidenceExitGating(make_model(), {"exit_heads": False}, {}).model.exit_heads is None


def test_training_loss_is_the_all_exit_loss_of_every_exit(device):
    g = confident_gating({"exit_loss": "equal"}, device=device)
    x, m = make_batch(B=16, seed=3, device=device)
    y = torch.randint(0, 2, (16,), generator=torch.Generator().manual_seed(0)).to(device)
    loss = g.training_loss(x, m, y, F.cross_entropy)
    exits = [g.model(x, m, n_layers=d) for d in g.depths]
    deep, shallow = all_exit_loss(exits, y, F.cross_entropy, "equal")
    torch.testing.assert_close(loss, deep + shallow)
    loss.backward()
    assert all(h.weight.grad is not None and h.weight.grad.abs().sum() > 0 for h in g.model.exit_heads.values())


@pytest.mark.parametrize("budget", [0.4, 0.5, 0.75])
def test_calibrated_flops_fraction_lands_on_the_budget(budget, device):
    g = confident_gating({"flops_budget": budget}, device=device)
    g.loop = FakeLoop(val_batches(device=device))
    g.before_evaluate("validation")
    assert abs(g.calibrated_fraction - budget) <= 0.05, (budget, g.threshold, g.calibrated_fraction)
    # the cascade executes exactly the calibrated fraction on the same rows (the threshold sits
    # mid-step: the cascade's smaller batches flip no row)
    assert executed_fraction(g, g.loop.batches) == pytest.approx(g.calibrated_fraction, rel=1e-12)
    m = g.metrics()
    assert m["exit_eval_samples"] == 256 and m["exit_calibrated_flops_fraction"] == g.calibrated_fraction
    assert sum(m["exit_depth_hist"].values()) == pytest.approx(1.0)
    assert g.metrics()["exit_eval_samples"] == 0  # the counts reset
    with pytest.raises(ValueError, match="budget"):
        confident_gating().calibrate(val_batches())


def test_a_higher_threshold_never_lowers_the_mean_depth(device):
    g = confident_gating(device=device)
    batches = val_batches(device=device)
    means = []
    for thr in (0.0, 0.5, 0.55, 0.6, 0.7, 0.8, 0.9, 0.99, 1.0, NEVER):
        g.threshold = thr
        for x, m, _ in batches:
            g.predict(x, m)
        means.append(g.metrics()["exit_mean_depth"])
    assert means == sorted(means), means
    assert means[0] == 1 and means[-1] == 4  # everyone at the first exit / no early exit
    assert len(set(means)) > 4  # the thresholds in between really spread the rows


def test_the_cascade_equals_each_row_run_alone_to_its_exit(device):
    """``predict`` (one cascade, rows leaving the batch) gives each row the logits and FLOPs of
    a plain forward of that row alone to its exit depth, and that exit is the first whose
    plain-forward max probability passes the threshold."""
    g = confident_gating({"flops_budget": 0.5}, device=device)
    x, m = make_batch(B=48, seed=21, device=device)
    g.calibrate([(x, m)])  # a threshold between the rows' confidences
    logits, flops = g.predict(x, m)
    _, idx = run_cascade(g.model, g.model.embed(x), g.model.padding_mask(x, m), g.depths, 0, g.stop_rule())
    depths = [g.depths[int(k)] for k in idx]
    assert len(set(depths)) >= 3
    for i, d in enumerate(depths):
        xi, mi = x[i:i + 1], m[i:i + 1]
        torch.testing.assert_close(logits[i:i + 1], g.model(xi, mi, n_layers=d), rtol=1e-5, atol=1e-5)
        assert flops[i] == costs.flops_per_sample(g.model.config, x.shape[1], n_layers=d)
        with torch.no_grad():
            conf = [float(g.model(xi, mi, n_layers=e).softmax(-1).max()) for e in g.depths]
        first = next((e for e, p in zip(g.depths, conf) if p >= g.threshold), g.depths[-1])
        assert d == first, (i, conf, g.threshold)
    assert flops.dtype == torch.float64 and flops.device == x.device


def test_the_threshold_is_label_free(device):
    """Poisoned validation labels (flipped, or not even class ids) calibrate the same threshold."""
    runs = []
    for labels in (None, lambda B, s: 1 - val_batches()[s][2], lambda B, s: torch.full((B,), 10 ** 6)):
        g = confident_gating({"flops_budget": 0.5}, device=device)
        g.loop = FakeLoop(val_batches(labels=labels, device=device))
        g.before_evaluate()
        runs.append((g.threshold, g.calibrated_fraction))
    assert runs[0] == runs[1] == runs[2]


def test_state_round_trip(tmp_path, device):
    g = confident_gating({"flops_budget": 0.5}, device=device)
    batches = val_batches(device=device)
    g.calibrate(batches)
    for x, m, _ in batches[:2]:
        g.predict(x, m)
    torch.save(g.state_dict(), tmp_path / "g.pt")
    again = confident_gating({"flops_budget": 0.5}, device=device)
    again.load_state_dict(torch.load(tmp_path / "g.pt", weights_only=True))
    assert (again.threshold, again.calibrated_fraction) == (g.threshold, g.calibrated_fraction)
    assert again.metrics() == g.metrics()
    fresh = confident_gating()
    fresh.load_state_dict(fresh.state_dict())  # no calibration: -1 round-trips to None
    assert fresh.calibrated_fraction is None and fresh.threshold == fresh.s.exit_threshold


def test_run_cascade_raises_on_bad_depths(device):
    model = make_model(device=device).eval()
    x, m = make_batch(B=4, device=device)
    h, pad = model.embed(x), model.padding_mask(x, m)

    def never(k, h, pad, logits, state):
        return torch.zeros(len(h), dtype=torch.bool), None  # on the CPU: run_cascade moves it

    for depths, start in (([], 0), ([2, 1], 0), ([1, 1, 2], 0), ([1, 2], 2)):
        with pytest.raises(ValueError, match="ascending"):
            run_cascade(model, h, pad, depths, start, never)
    with pytest.raises(ValueError, match="n_layers"):  # past the model's last block
        run_cascade(model, h, pad, [1, 5], 0, never)
    out, idx = run_cascade(model, h, pad, [4], 0, never)  # one exit: everyone stops there
    torch.testing.assert_close(out, model(x, m), rtol=1e-5, atol=1e-6)
    assert idx.tolist() == [0] * 4


def test_first_stop_is_the_first_exit_that_says_stop(device):
    stop = np.array([[0, 1, 1], [0, 0, 0], [1, 0, 1], [0, 0, 1]], dtype=bool)
    before = stop.copy()
    got = first_stop(stop)
    assert isinstance(got, np.ndarray) and got.dtype == np.int64 and got.tolist() == [1, 2, 0, 2]
    assert np.array_equal(stop, before)  # not modified
    t = torch.from_numpy(stop)
    assert first_stop(t).tolist() == [1, 2, 0, 2] and first_stop(t).dtype == torch.long
    on_device = first_stop(t.to(device))  # a tensor on the stop table's device
    assert on_device.device == t.to(device).device and on_device.tolist() == [1, 2, 0, 2]
    assert first_stop(np.zeros((0, 3), dtype=bool)).shape == (0,)
    for bad in (np.zeros(3, dtype=bool), np.zeros((2, 0), dtype=bool)):
        with pytest.raises(ValueError, match="N x K"):
            first_stop(bad)
    # the exit-by-exit loop it replaces (LinearStopping.route before issue 34)
    rng = np.random.default_rng(0)
    table = rng.random((200, 6)) < 0.2
    out, open_ = np.full(200, 5), np.ones(200, dtype=bool)
    for k in range(5):
        s = open_ & table[:, k]
        out[s] = k
        open_ &= ~s
    assert np.array_equal(first_stop(table), out)


def test_a_real_trial_loop_meets_the_budget_and_counts_the_evaluated_split(cache_dir, tmp_path, device):
    from archsearch.data import prepare
    from archsearch.tune.trainable import TrialLoop

    data = prepare("rotten_tomatoes_sentences", vocab_size=1000, max_len=32)

    def head(split, n):
        s = data[split]
        return dataclasses.replace(s, input_ids=s.input_ids[:n], attention_mask=s.attention_mask[:n],
                                   labels=s.labels[:n])

    data = dataclasses.replace(data, data={**data.data, "train": head("train", 640),
                                           "validation": head("validation", 256), "test": head("test", 300)})
    settings = {"epochs": 1, "batch_size": 32, "seed": 0, "latency_batch_size": 32, "device": str(device),
                "fixed": {"n_layers": 3, "d_model": 32, "n_heads": 4, "warmup_steps": 5,
                          "gating": "confidence_exit", "flops_budget": 0.5}}
    loop = TrialLoop({}, data, settings)
    assert isinstance(loop.gating, ConfidenceExitGating)
    opt = {id(p) for grp in loop.opt.param_groups for p in grp["params"]}
    assert all(id(p) in opt for p in loop.model.exit_heads.parameters())  # the exits train
    loop.train_epoch()
    for split, n in (("validation", 256), ("test", 300)):
        m = loop.evaluate(split)
        assert m["exit_eval_samples"] == n  # not the latency timing's batches
        full = sum(costs.flops_per_sample(loop.model.config, x.shape[1]) * len(x)
                   for x, _, _ in loop.eval_batches(split)) / n
        if split == "validation":  # calibrated on these very rows
            assert m["flops_per_sample"] / full == pytest.approx(m["exit_calibrated_flops_fraction"], abs=1e-9)
            assert abs(m["flops_per_sample"] / full - 0.5) <= 0.05
    loop.save(str(tmp_path))
    again = TrialLoop({}, data, settings)
    again.load(str(tmp_path))
    assert again.gating.threshold == loop.gating.threshold
    assert again.evaluate("test")["accuracy"] == m["accuracy"]
