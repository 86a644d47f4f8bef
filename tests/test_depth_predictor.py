"""Adaptive depth (``gating: depth_predictor``): its settings (defaults = the reported recipe), RevPC,
residual scaling, early exit at the predicted depth, and a real training run through the trainable.

Tests of a behaviour that an older default shows set that value by name (``exit_heads: False``,
``depth_warmup_steps: 0``...): the defaults changed (issue 34), the ablations stay reachable."""

import dataclasses
import math

import pytest
import torch

from archsearch.dynamic import gating_class
from archsearch.dynamic.depth.cascade_graphs import SegmentGraphs
from archsearch.dynamic.depth.predictor import DepthPredictorGating
from archsearch.dynamic.depth.predictor_model import revpc
from archsearch.dynamic.depth.settings import DepthPredictorSettings
from archsearch.models import costs
from archsearch.models.transformer import Transformer, TransformerConfig


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a shared 2-core machine: one thread avoids oversubscription stalls."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def make_model(n_layers=4, dropout=0.0, seed=0, norm_position="pre", device="cpu"):
    """A tiny classifier, initialised on the CPU from ``seed`` (the same weights on every device),
    then moved to ``device`` (the ``device`` fixture in the tests that run it)."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=50, max_len=12, n_layers=n_layers, d_model=32, n_heads=4,
                            d_ffn=64, dropout=dropout, norm_position=norm_position)
    return Transformer(cfg).to(device)


def make_batch(B=16, T=12, seed=1, device="cpu"):
    """``B x T`` ids and bool mask, drawn on the CPU from ``seed``, then moved to ``device``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(4, 50, (B, T), generator=g)  # (B, T)
    x[:, 0] = 2  # <cls> first, as the trained tokenizers do
    lengths = torch.randint(3, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    x[~mask] = 0
    return x.to(device), mask.to(device)


def spread_depths(gating, seed=0):
    """Random, large predictor output weights and a first block whose <cls> output depends
    strongly on the other tokens: predictions then differ across samples."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        attn = gating.model.blocks[0].attn
        for lin in (attn.q, attn.k, attn.v, attn.o):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 0.5)
        w = gating.predictor.fc2.weight
        w.copy_(torch.randn(w.shape, generator=g) * 20.0)


def force_depth(gating, depth):
    """Make the predictor put (numerically) all its mass on ``depth``."""
    with torch.no_grad():
        gating.predictor.fc2.weight.zero_()
        gating.predictor.fc2.bias.fill_(-1e4)
        gating.predictor.fc2.bias[depth - gating.n_fixed] = 1e4


def test_registered_under_gating_name():
    assert gating_class("depth_predictor") is DepthPredictorGating


def test_settings_defaults_are_the_reported_recipe():
    import json
    from pathlib import Path

    from archsearch.dynamic.depth.exits import EXIT_LOSSES

    assert DepthPredictorGating.Settings is DepthPredictorSettings
    s = DepthPredictorGating.Settings()
    assert (s.exit_heads, s.exit_loss, s.depth_supervision, s.predictor_lr) == (True, "sum", 1.0, 1e-3)
    assert s.depth_all_exits and s.min_layers == 1 and s.gamma == 0.5 and s.depth_warmup_steps is None
    # the flags of the reported run (benchmarks/depth/dynamic_depth.py maps them onto these keys)
    root = Path(__file__).resolve().parents[1]
    cmd = json.loads((root / "benchmarks/depth/runs/dynamic_depth_legacy/depth_predictor.json").read_text())["provenance"]["command"]
    for flag in ("--exit-heads", "--exit-loss sum", "--dp-supervision 1.0", "--dp-predictor-lr 1e-3"):
        assert flag in cmd, flag
    assert set(DepthPredictorSettings.model_fields["exit_loss"].annotation.__args__) == set(EXIT_LOSSES)
    for key, info in DepthPredictorSettings.model_fields.items():
        assert info.description and len(info.description) > 40, key  # unit, meaning, why
    # the default warm-up: 10% of the trial's optimizer steps when known, else 50 steps
    assert s.warmup_steps(None) == 50 and s.warmup_steps(534) == 53 and s.warmup_steps(9) == 0
    assert s.replace(depth_warmup_steps=0).warmup_steps(534) == 0


@pytest.mark.parametrize("cfg,key", [
    ({"exit_loss": "max"}, "exit_loss"), ({"predictor_lr": 0.0}, "predictor_lr"),
    ({"exit_threshold": 1.5}, "exit_threshold"), ({"depth_warmup_steps": -1}, "depth_warmup_steps"),
    ({"min_layers": 0}, "min_layers"), ({"gamma": -1.0}, "gamma"), ({"flops_budget": 1.2}, "flops_budget"),
    ({"flops_budget": 0.0}, "flops_budget"), ({"depth_supervision": -0.5}, "depth_supervision"),
    ({"predictor_hidden": 0}, "predictor_hidden"), ({"depth_calibration_rows": 0}, "depth_calibration_rows"),
    ({"depth_price_lr": 0.0}, "depth_price_lr"), ({"depth_all_exits": "maybe"}, "depth_all_exits"),
    ({"exit_heads": "yes please"}, "exit_heads"), ({"distill_teacher": 3}, "distill_teacher"),
    ({"depth_supervision": 1.0, "depth_all_exits": False}, "depth_supervision"),
    ({"distill_teacher": "t.pt", "depth_all_exits": False}, "distill_teacher"),
])
def test_a_bad_value_raises_naming_its_key(cfg, key):
    with pytest.raises(ValueError, match=f"^{key}: "):
        DepthPredictorSettings.from_config(cfg)
    with pytest.raises(ValueError, match=f"^{key}: "):
        DepthPredictorGating(make_model(), cfg, {})


def test_an_unknown_key_raises_naming_it_and_the_strategy_reads_no_hidden_key():
    import re
    from pathlib import Path

    with pytest.raises(ValueError, match=r"depth_warmup_step\b"):
        DepthPredictorGating.Settings(depth_warmup_step=5)  # extra="forbid"
    with pytest.raises(ValueError, match="exit_loss"):
        DepthPredictorGating.Settings().replace(exit_loss="max")
    # every trial-config key the strategy reads is a field, but for the model keys it needs
    depth = Path(__file__).resolve().parents[1] / "archsearch/dynamic/depth"
    src = "".join((depth / f"{m}.py").read_text() for m in ("predictor", "predictor_eval"))
    read = set(re.findall(r"cfg(?:\.get\(|\[)\s*[\"']([\w]+)", src))
    assert read <= {"init_from", "batch_size"}, read - {"init_from", "batch_size"}


def test_the_old_defaults_stay_reachable_by_name():
    old = {"exit_heads": False, "exit_loss": "mean", "depth_supervision": 0.0, "depth_warmup_steps": 0,
           "predictor_lr": 5e-5}
    model = make_model()
    g = DepthPredictorGating(model, old, {})
    assert model.exit_heads is None and g.exit_loss == "mean" and g.supervision == 0.0
    assert g.warmup_steps == 0 and g.extra_lr == 5e-5
    new = DepthPredictorGating(make_model(), {}, {})
    assert new.model.exit_heads is not None and new.warmup_steps == 50  # no loop: 50 steps
    # without trained exits the default label is off (set explicitly, it raises: see above)
    assert DepthPredictorGating(make_model(), {"depth_all_exits": False}, {}).supervision == 0.0
    # in a trial loop: 10% of its optimizer steps (2 epochs x ceil(640 / 32) = 40 -> 4)
    from types import SimpleNamespace

    loop = SimpleNamespace(data=SimpleNamespace(task="classification", train=range(640)),
                           device=torch.device("cpu"), settings={"epochs": 2, "batch_size": 32},
                           steps_per_epoch=lambda: 20)  # TrialLoop: ceil(640 / 32)
    g = DepthPredictorGating(make_model(), {}, loop.settings, loop=loop)
    assert g.warmup_steps == 4


def test_revpc_exact_values_and_non_increasing():
    # dyadic probabilities: every partial sum is exact in binary floating point
    probs = torch.tensor([[0.125, 0.25, 0.125, 0.5], [0.5, 0.0, 0.25, 0.25]])
    expected = torch.tensor([[1.0, 0.875, 0.625, 0.5], [1.0, 0.5, 0.5, 0.25]])
    assert torch.equal(revpc(probs), expected)
    probs = torch.randn(64, 7, generator=torch.Generator().manual_seed(0)).softmax(-1)
    p = revpc(probs)
    assert torch.allclose(p[:, 0], torch.ones(64))
    assert bool((p[:, 1:] <= p[:, :-1] + 1e-7).all())  # non-increasing along the depth axis
    # differences give the distribution back: p[k] - p[k+1] = probs[k], p[-1] = probs[-1]
    torch.testing.assert_close(p[:, :-1] - p[:, 1:], probs[:, :-1], rtol=0, atol=1e-6)
    torch.testing.assert_close(p[:, -1], probs[:, -1])


@pytest.mark.parametrize("norm_position", ["pre", "post"])  # post: BERT / MiniLM blocks
def test_all_p_one_scaled_forward_equals_model_forward(norm_position, device):
    for training in (False, True):  # dropout 0, so train mode must match too
        model = make_model(norm_position=norm_position, device=device)
        model.train(training)
        gating = DepthPredictorGating(model, {"gamma": 0.5}, {})
        spread_depths(gating)
        x, mask = make_batch(device=device)
        logits, probs = gating.scaled_forward(x, mask, full=True)
        assert probs.shape == (16, 4)
        torch.testing.assert_close(logits, model(x, mask), rtol=0, atol=0)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_one_hot_depth_scaled_forward_equals_early_exit(norm_position, device):
    model = make_model(norm_position=norm_position, device=device).eval()
    # the scaled forward reads the model's head; early exit reads it too only without exit heads
    gating = DepthPredictorGating(model, {"gamma": 0.5, "exit_heads": False}, {})
    x, mask = make_batch(device=device)
    for depth in (1, 2, 3, 4):
        force_depth(gating, depth)
        logits, _ = gating.scaled_forward(x, mask)  # p = 1 up to depth, 0 after
        torch.testing.assert_close(logits, model(x, mask, n_layers=depth), rtol=1e-5, atol=1e-6)


def test_training_loss_adds_gamma_times_normalised_expected_depth(device):
    model = make_model(device=device).eval()
    gating = DepthPredictorGating(model, {"gamma": 0.7, "depth_all_exits": False, "depth_warmup_steps": 0}, {})
    spread_depths(gating)
    x, mask = make_batch(device=device)
    y = torch.randint(0, 2, (16,)).to(device)
    ce = torch.nn.functional.cross_entropy
    loss = gating.training_loss(x, mask, y, ce)
    logits, probs = gating.scaled_forward(x, mask)
    exp_depth = (probs * torch.tensor([1.0, 2.0, 3.0, 4.0], device=device)).sum(-1).mean()
    torch.testing.assert_close(loss, ce(logits, y) + 0.7 * exp_depth / 4)
    loss.backward()
    assert gating.predictor.fc2.weight.grad is not None and gating.predictor.fc2.weight.grad.abs().sum() > 0


def test_warmup_uses_full_depth_without_penalty(device):
    model = make_model(device=device).eval()
    gating = DepthPredictorGating(model, {"gamma": 0.9, "depth_warmup_steps": 1, "depth_all_exits": False}, {})
    force_depth(gating, 1)
    x, mask = make_batch(device=device)
    y = torch.randint(0, 2, (16,)).to(device)
    ce = torch.nn.functional.cross_entropy
    torch.testing.assert_close(gating.training_loss(x, mask, y, ce), ce(model(x, mask), y))
    gating.after_step(0.0)
    torch.testing.assert_close(gating.training_loss(x, mask, y, ce),
                               ce(model(x, mask, n_layers=1), y) + 0.9 * 1 / 4, rtol=1e-5, atol=1e-5)


def test_early_exit_runs_exactly_the_predicted_blocks(device):
    model = make_model(device=device).eval()
    gating = DepthPredictorGating(model, {"gamma": 0.5}, {})
    spread_depths(gating)
    x, mask = make_batch(B=32, device=device)
    depths = gating.predict_depths(x, mask)  # (B,)
    assert len(set(depths.tolist())) >= 3, depths  # the test needs several groups
    gating._segment_graphs = SegmentGraphs()
    gating._segment_graphs.enabled = False  # forward hooks do not run on CUDA graph replays
    rows_seen = [0] * 4
    hooks = [blk.register_forward_hook(lambda m, a, out, i=i: rows_seen.__setitem__(i, rows_seen[i] + out.shape[0]))
             for i, blk in enumerate(model.blocks)]
    try:
        _, flops = gating.predict(x, mask)
        for i in range(4):  # block i (0-based) runs for exactly the samples with depth > i
            assert rows_seen[i] == int((depths > i).sum()), (i, rows_seen, depths)
        # one sample at a time: exactly `depth` block calls each
        for b in range(8):
            rows_seen[:] = [0] * 4
            gating.predict(x[b:b + 1], mask[b:b + 1])
            assert sum(rows_seen) == int(depths[b])
            assert rows_seen[:int(depths[b])] == [1] * int(depths[b])
    finally:
        for h in hooks:
            h.remove()
    extra = gating.predictor.flops_per_sample()
    for b in range(32):
        assert flops[b] == costs.flops_per_sample(model.config, 12, n_layers=int(depths[b])) + extra


def test_grouped_inference_equals_per_sample_inference(device):
    model = make_model(device=device).eval()
    gating = DepthPredictorGating(model, {"gamma": 0.5}, {})
    spread_depths(gating, seed=3)
    x, mask = make_batch(B=24, seed=5, device=device)
    assert len(set(gating.predict_depths(x, mask).tolist())) >= 3
    logits, flops = gating.predict(x, mask)
    for b in range(24):
        lb, fb = gating.predict(x[b:b + 1], mask[b:b + 1])
        torch.testing.assert_close(logits[b:b + 1], lb, rtol=1e-5, atol=1e-6)
        assert flops[b] == fb[0]
        depth = int(gating.predict_depths(x[b:b + 1], mask[b:b + 1]))
        torch.testing.assert_close(lb, model(x[b:b + 1], mask[b:b + 1], n_layers=depth), rtol=1e-5, atol=1e-6)


def test_stats_histogram_counts_predictions_and_state_round_trip(tmp_path, device):
    model = make_model(device=device).eval()
    gating = DepthPredictorGating(model, {"gamma": 0.5}, {})
    spread_depths(gating)
    x, mask = make_batch(B=32, device=device)
    depths = gating.predict_depths(x, mask)
    gating.reset_stats()
    gating.predict(x, mask)
    st = gating.depth_stats()
    assert st["depth_histogram"] == {str(d): int((depths == d).sum()) for d in (1, 2, 3, 4)}
    assert st["mean_exit_depth"] == pytest.approx(depths.double().mean().item())
    with torch.no_grad():
        _, probs = gating.scaled_forward(x, mask)  # (B, D) over depths 1..4
    assert st["expected_depth"] == pytest.approx(float((probs @ torch.arange(1.0, 5.0, device=device)).mean()),
                                                 rel=1e-5)
    # checkpoint: plain tensors and numbers, readable with weights_only=True
    gating.after_step(1.0)
    torch.save(gating.state_dict(), tmp_path / "g.pt")
    other_model = make_model(seed=1, device=device).eval()
    other = DepthPredictorGating(other_model, {"gamma": 0.5}, {})  # adds the exit heads first
    other_model.load_state_dict(model.state_dict())
    other.load_state_dict(torch.load(tmp_path / "g.pt", weights_only=True))
    assert other.steps == 1
    assert torch.equal(other.predict_depths(x, mask), depths)


def test_invalid_settings_raise():
    with pytest.raises(ValueError, match="classification"):
        torch.manual_seed(0)
        lm = Transformer(TransformerConfig(vocab_size=50, max_len=12, n_layers=2, d_model=32, n_heads=4,
                                           d_ffn=64, task="lm"))
        DepthPredictorGating(lm, {}, {})
    with pytest.raises(ValueError, match="gamma"):
        DepthPredictorGating(make_model(), {"gamma": -0.1}, {})
    with pytest.raises(ValueError, match="min_layers"):
        DepthPredictorGating(make_model(), {"min_layers": 5}, {})


def test_search_space_file_is_valid():
    from pathlib import Path

    from archsearch.space import load_space

    space = load_space(Path(__file__).resolve().parents[1] / "search_spaces" / "depth_predictor.yaml")
    assert space.fixed["gating"] == "depth_predictor"
    # issue 14: the outer loop searches the FLOPs budget; gamma is the price that follows it
    assert "flops_budget" in space.params and space.params["flops_budget"].type == "float"
    assert "gamma" not in space.params
    assert space.metric_names == ["accuracy", "flops_per_sample"]


def test_real_training_through_trial_loop_reports_histogram(cache_dir, tmp_path, device):
    from archsearch.data import prepare
    from archsearch.tune.trainable import TrialLoop

    data = prepare("rotten_tomatoes_sentences", vocab_size=1000, max_len=32)
    tr = data.train
    n = 768
    data = dataclasses.replace(data, data={**data.data, "train": dataclasses.replace(
        tr, input_ids=tr.input_ids[:n], attention_mask=tr.attention_mask[:n], labels=tr.labels[:n])})
    settings = {"epochs": 2, "batch_size": 64, "seed": 0, "device": str(device),
                "fixed": {"n_layers": 3, "d_model": 32, "n_heads": 2, "gating": "depth_predictor",
                          "gamma": 0.9, "warmup_steps": 5}}
    loop = TrialLoop({}, data, settings)
    assert isinstance(loop.gating, DepthPredictorGating)
    # the optimizer trains the predictor too
    opt_params = {id(p) for g in loop.opt.param_groups for p in g["params"]}
    assert all(id(p) in opt_params for p in loop.gating.predictor.parameters())
    before = loop.gating.predictor.fc2.weight.detach().clone()
    loop.train_epoch()
    metrics = loop.evaluate()
    assert not loop.model.training  # evaluation (and its latency timing) leaves eval mode
    assert not torch.equal(before, loop.gating.predictor.fc2.weight)
    hist = metrics["depth_histogram"]
    assert math.isfinite(metrics["val_loss"])
    # recompute every reported number from the predicted exit depths of the evaluation batches
    # (on the loop's device, at its precision: evaluate() runs under loop.autocast())
    gating, extra = loop.gating, loop.gating.predictor.flops_per_sample()
    depths, flops, correct, exp_depth = [], 0.0, 0, 0.0
    with torch.no_grad(), loop.autocast():
        for x, m, y in loop.eval_batches():  # (B, T') trimmed validation batches
            x, m, y = x.to(loop.device), m.to(loop.device), y.to(loop.device)
            d = gating.predict_depths(x, m)  # (B,)
            depths += d.tolist()
            flops += sum(costs.flops_per_sample(loop.mcfg, x.shape[1], n_layers=int(k)) + extra for k in d)
            correct += int((gating.predict(x, m)[0].argmax(-1) == y).sum())
            exp_depth += float(gating.expected_depth(gating.scaled_forward(x, m)[1]).sum())
    n = len(data.validation)
    assert len(depths) == n
    assert hist == {str(k): depths.count(k) for k in (1, 2, 3)}
    assert metrics["mean_exit_depth"] == pytest.approx(sum(depths) / n)
    assert metrics["expected_depth"] == pytest.approx(exp_depth / n, rel=1e-5)
    assert metrics["flops_per_sample"] == pytest.approx(flops / n, rel=1e-9)
    assert metrics["accuracy"] == pytest.approx(correct / n)
    # checkpoint round trip through the trainable (weights_only=True)
    loop.save(str(tmp_path))
    again = TrialLoop({}, data, settings)
    again.load(str(tmp_path))
    assert torch.equal(again.gating.predictor.fc2.weight, loop.gating.predictor.fc2.weight)
    assert again.gating.steps == loop.gating.steps == loop.step
    assert again.evaluate()["depth_histogram"] == hist
    # predictor_lr: the predictor gets a param group of its own at that lr, the model keeps lr
    fast = TrialLoop({"predictor_lr": 3e-3, "lr": 1e-4}, data, settings)
    groups = fast.opt.param_groups
    assert [g["initial_lr"] for g in groups] == [1e-4, 3e-3]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in fast.gating.predictor.parameters()}
    assert len(groups[0]["params"]) == len(list(fast.model.parameters()))


# ---------------------------------------------------------------- issue 14
def set_probs(gating, probs):
    """The same predicted depth distribution for every sample."""
    with torch.no_grad():
        gating.predictor.fc2.weight.zero_()
        gating.predictor.fc2.bias.copy_(torch.tensor(probs).log())


def test_exit_at_the_median_not_the_argmax(device):
    model = make_model(device=device).eval()
    gating = DepthPredictorGating(model, {}, {})
    x, mask = make_batch(device=device)
    # arg-max depth 1; P(depth >= 2, 3, 4) = .65, .55, .3: no sum on a threshold, where float
    # noise (which differs between devices) would decide
    set_probs(gating, [0.35, 0.1, 0.25, 0.3])
    assert gating.predict_depths(x, mask).tolist() == [3] * 16  # the median (threshold 0.5)
    logits, flops = gating.predict(x, mask)
    torch.testing.assert_close(logits, model(x, mask, n_layers=3), rtol=1e-5, atol=1e-6)
    gating.threshold = 0.6
    assert gating.predict_depths(x, mask).tolist() == [2] * 16
    for depth in (1, 2, 3, 4):  # a forced static depth equals the static model cut there
        force_depth(gating, depth)
        torch.testing.assert_close(gating.predict(x, mask)[0], model(x, mask, n_layers=depth), rtol=1e-5, atol=1e-6)


def test_predictor_reads_the_mean_over_real_tokens_as_the_classifier_pools(device):
    model = make_model(device=device).eval()
    gating = DepthPredictorGating(model, {}, {})
    x, mask = make_batch(device=device)
    seen = []
    hook = gating.predictor.register_forward_hook(lambda m, a, out: seen.append(a[0]))
    try:
        gating.predict_depths(x, mask)
    finally:
        hook.remove()
    pad = model.padding_mask(x, mask)
    h = model.run_layers(model.embed(x), pad, 0, 1)
    torch.testing.assert_close(seen[0], model.pool(h, pad))


def test_budget_calibration_on_validation_lands_within_005(device):
    model = make_model(device=device).eval()
    gating = DepthPredictorGating(model, {"flops_budget": 0.5}, {})
    spread_depths(gating)
    with torch.no_grad():  # milder logits: many distinct per-sample distributions
        gating.predictor.fc2.weight.mul_(0.1)
    batches = [make_batch(B=64, seed=s, device=device) for s in range(4)]
    for budget in (0.4, 0.5, 0.75):
        thr, frac = gating.calibrate(batches, budget=budget)
        assert abs(frac - budget) <= 0.05, (budget, thr, frac)
        used = full = 0.0
        for x, m in batches:  # the executed FLOPs at the calibrated threshold
            used += float(gating.predict(x, m)[1].sum())
            full += len(x) * costs.flops_per_sample(model.config, x.shape[1])
        assert used / full == pytest.approx(frac, rel=1e-9)
    assert gating.calibrate(batches)[0] == gating.threshold  # default: flops_budget
    with pytest.raises(ValueError, match="budget"):
        DepthPredictorGating(make_model(), {}, {}).calibrate(batches)
    with pytest.raises(ValueError, match="flops_budget"):
        DepthPredictorGating(make_model(), {"flops_budget": 1.2}, {})


def test_gamma_follows_the_budget_by_dual_ascent(device):
    model = make_model(device=device).train()
    gating = DepthPredictorGating(model, {"flops_budget": 0.3, "gamma": 0.1, "depth_all_exits": False,
                                          "depth_warmup_steps": 0}, {})
    x, mask = make_batch(device=device)
    y = torch.randint(0, 2, (16,)).to(device)
    ce = torch.nn.functional.cross_entropy
    gating.training_loss(x, mask, y, ce)
    frac = gating._last_train["flops_fraction"]  # uniform predictor: about the mean depth's FLOPs
    assert 0.4 < frac < 0.8
    gating.after_step(0.0)
    assert gating.gamma == pytest.approx(0.1 + 0.05 * (frac - 0.3))  # over budget: the price rises
    free = DepthPredictorGating(model, {"gamma": 0.1, "depth_warmup_steps": 0}, {})
    free.training_loss(x, mask, y, ce)
    free.after_step(0.0)
    assert free.gamma == 0.1  # no budget: gamma is the fixed, configured weight


def test_all_exits_training_makes_the_exit_1_loss_fall(device):
    model = make_model(dropout=0.0, device=device).train()
    gating = DepthPredictorGating(model, {"gamma": 0.0}, {})
    opt = torch.optim.AdamW([*model.parameters(), *gating.predictor.parameters()], lr=3e-3)
    x, mask = make_batch(B=64, seed=100, device=device)
    y = (x == 7).any(1).long()

    def exit1():
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(model(x, mask, n_layers=1), y))

    before = exit1()
    for step in range(40):
        xb, mb = make_batch(B=32, seed=step, device=device)
        loss = gating.training_loss(xb, mb, (xb == 7).any(1).long(), torch.nn.functional.cross_entropy)
        opt.zero_grad()
        loss.backward()
        opt.step()
        gating.after_step(loss.item())
    assert exit1() < 0.8 * before, (before, exit1())
