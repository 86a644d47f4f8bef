"""``gating: cascade`` (CascadeBERT's cascade of complete truncated models): the cuts start as
copies of the model and train apart from it, the cascade runs what it says at the threshold's
extremes and in between, calibration lands on the budget and is what predict then executes,
state and runtime; tiny models, plus one real trial loop."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from archsearch.dynamic import gating_class
from archsearch.dynamic.depth.cascade import CascadeGating, cut_params
from archsearch.dynamic.depth.confidence_exit import NEVER
from archsearch.models import costs
from test_confidence_exit import FakeLoop, executed_fraction, val_batches
from test_depth_predictor import make_batch, make_model, one_thread  # noqa: F401 (one_thread: autouse fixture)


def cascade(cfg=None, n_layers=4, seed=0, device="cpu"):
    """A cascade (cuts ``[1, 2]`` unless ``cfg`` says otherwise) on a tiny eval-mode model on
    ``device`` whose stages disagree in confidence across rows (random heads of a useful scale
    instead of the 0.02-std initialisation; drawn on the CPU, so every device gets the same
    weights)."""
    model = make_model(n_layers=n_layers, seed=seed, device=device).eval()
    g = CascadeGating(model, {"cascade_depths": [1, 2], **(cfg or {})}, {})
    gen = torch.Generator().manual_seed(seed + 5)
    with torch.no_grad():
        for net in g.stages():
            net.head.weight.copy_(torch.randn(net.head.weight.shape, generator=gen) * 0.5)
    return g


def stage_costs(g, T):
    """FLOPs per sample of each stage alone at length ``T`` (cuts, then the full model)."""
    return [float(costs.flops_per_sample(g.model.config, T, n_layers=d)) for d in g.depths]


def test_registered_settings_and_errors():
    assert gating_class("cascade") is CascadeGating
    g = CascadeGating(make_model(), {}, {})
    s = g.s
    assert (s.flops_budget, s.exit_threshold, s.cascade_depths, s.cascade_calibration_rows) == (None, 0.9, None, 2048)
    # the default cuts: a third and half of the depth (dht.json's chosen 2->3->6 on 6 blocks)
    assert g.depths == [1, 2, 4] and list(g.model.cascade_cuts) == ["1", "2"] and g.exit_depths() == [1, 2, 4]
    assert CascadeGating(make_model(n_layers=6), {}, {}).depths == [2, 3, 6]
    assert CascadeGating(make_model(n_layers=2), {}, {}).depths == [1, 2]
    with pytest.raises(ValueError, match="cascade_depths"):
        CascadeGating(make_model(n_layers=1), {}, {})
    assert CascadeGating(make_model(), {"cascade_depths": 3}, {}).depths == [3, 4]  # an int: one cut
    for key, value in (("cascade_depths", [2, 1]), ("cascade_depths", [1, 1]), ("cascade_depths", [0, 2]),
                       ("cascade_depths", []), ("cascade_depths", "two"), ("cascade_depths", [4]),
                       ("cascade_depths", [1, 5]), ("flops_budget", 0.0), ("exit_threshold", 1.5),
                       ("cascade_calibration_rows", 0)):
        with pytest.raises(ValueError, match=key) as e:
            CascadeGating(make_model(), {key: value}, {})
        assert "\n" not in str(e.value)
        with pytest.raises(ValueError, match=key):  # the known costs refuse it as the trial would
            CascadeGating.known_cost({key: value}, make_model().config)
    lm = make_model()
    lm.config = dataclasses.replace(lm.config, task="lm")
    with pytest.raises(ValueError, match="classification"):
        CascadeGating(lm, {}, {})


def test_the_cuts_start_as_copies_of_the_model_and_are_counted():
    model = make_model(n_layers=4, norm_position="post")  # post-LN: no final LayerNorm to copy
    with torch.no_grad():
        for p in model.parameters():  # not the initialisation: the copy must come from the model
            p.add_(torch.randn_like(p))
    plain = costs.params_total(model)
    g = CascadeGating(model, {"cascade_depths": [1, 3]}, {})
    src = model.state_dict()
    for k in (1, 3):
        cut = model.cascade_cuts[str(k)]
        assert cut.config == dataclasses.replace(model.config, n_layers=k) and len(cut.blocks) == k
        for name, t in cut.state_dict().items():
            assert torch.equal(t, src[name]), (k, name)
            assert t.data_ptr() != src[name].data_ptr()  # its own parameters
    extra = costs.params_total(model) - plain
    assert extra == sum(cut_params(model.config, k) for k in (1, 3)) == CascadeGating.known_cost(
        {"cascade_depths": [1, 3]}, model.config)[1]
    assert costs.params_trainable(model) == plain + extra
    assert len(model.blocks) == 4  # the model's own blocks are untouched
    cuts = dict(model.cascade_cuts.items())
    again = CascadeGating(model, {"cascade_depths": [1, 3]}, {})  # cuts of the same depths are kept
    assert all(again.model.cascade_cuts[k] is cuts[k] for k in cuts)


def test_each_model_gets_the_gradient_of_its_own_loss_only(device):
    g = cascade(device=device)
    g.model.train()
    x, m = make_batch(B=16, seed=3, device=device)
    y = torch.randint(0, 2, (16,), generator=torch.Generator().manual_seed(0)).to(device)
    full = [p for n, p in g.model.named_parameters() if not n.startswith("cascade_cuts.")]
    cut1 = list(g.model.cascade_cuts["1"].parameters())
    cut2 = list(g.model.cascade_cuts["2"].parameters())
    F.cross_entropy(g.model.cascade_cuts["1"](x, m), y).backward()
    assert all(p.grad is None for p in full + cut2) and all(p.grad is not None for p in cut1)
    g.model.zero_grad(set_to_none=True)
    F.cross_entropy(g.model(x, m), y).backward()
    assert all(p.grad is None for p in cut1 + cut2) and all(p.grad is not None for p in full)
    own = [p.grad.clone() for p in full]
    g.model.zero_grad(set_to_none=True)
    loss = g.training_loss(x, m, y, F.cross_entropy)
    want = sum(F.cross_entropy(net(x, m), y) for net in g.stages())
    torch.testing.assert_close(loss, want)
    loss.backward()  # the sum: the full model's gradient is that of its own loss, exactly
    for p, gr in zip(full, own):
        torch.testing.assert_close(p.grad, gr, rtol=0, atol=0)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in cut1 + cut2)


def test_threshold_zero_answers_every_row_with_the_first_cut(device):
    g = cascade(device=device)
    g.threshold = 0.0
    x, m = make_batch(B=24, seed=4, device=device)
    logits, flops, depth = g.predict_exits(x, m)
    first = g.model.cascade_cuts["1"]
    with torch.no_grad():
        torch.testing.assert_close(logits, first(x, m), rtol=0, atol=0)
    assert flops.tolist() == [stage_costs(g, x.shape[1])[0]] * 24 == \
        [float(costs.flops_per_sample(first.config, x.shape[1]))] * 24
    assert depth.tolist() == [1] * 24
    assert flops.dtype == torch.float64 and flops.device == x.device and depth.dtype == torch.long
    met = g.metrics()
    assert met["exit_depth_hist"] == {"1": 1.0, "2": 0.0, "4": 0.0} and met["cascade_escalated_share"] == 0.0


def test_threshold_never_escalates_every_row_through_every_stage(device):
    g = cascade(device=device)
    g.threshold = NEVER
    x, m = make_batch(B=24, seed=5, device=device)
    logits, flops, depth = g.predict_exits(x, m)
    with torch.no_grad():
        torch.testing.assert_close(logits, g.model(x, m), rtol=1e-5, atol=1e-6)
    every = stage_costs(g, x.shape[1])
    assert flops.tolist() == [sum(every)] * 24 and sum(every) > every[-1]  # more than the full model alone
    assert depth.tolist() == [4] * 24
    met = g.metrics()
    assert met["cascade_escalated_share"] == 1.0 and met["exit_mean_depth"] == 4 and met["exit_eval_samples"] == 24


def test_the_cascade_gives_each_row_its_first_confident_stage(device):
    """In between: each row gets the logits of a plain forward of the stage that answered it,
    that stage is the first whose max probability passes the threshold, and its FLOPs are the
    sum of the stages it ran."""
    g = cascade({"flops_budget": 0.8}, device=device)
    x, m = make_batch(B=48, seed=21, device=device)
    g.calibrate([(x, m)])
    logits, flops, depth = g.predict_exits(x, m)
    assert len(set(depth.tolist())) == 3  # every stage answers some rows
    own = stage_costs(g, x.shape[1])
    with torch.no_grad():
        outs = [net(x, m) for net in g.stages()]
    for i, d in enumerate(depth.tolist()):
        s = g.depths.index(d)
        torch.testing.assert_close(logits[i], outs[s][i], rtol=1e-5, atol=1e-5)
        conf = [float(o[i].softmax(-1).max()) for o in outs[:-1]]
        first = next((j for j, p in enumerate(conf) if p >= g.threshold), len(g.depths) - 1)
        assert s == first, (i, conf, g.threshold)
        assert float(flops[i]) == pytest.approx(sum(own[:s + 1]), rel=1e-12)


@pytest.mark.parametrize("budget", [0.5, 0.8, 1.0])
def test_calibration_lands_on_the_budget_and_is_what_predict_executes(budget, device):
    g = cascade({"flops_budget": budget}, device=device)
    g.loop = FakeLoop(val_batches(device=device))
    g.before_evaluate("validation")
    assert abs(g.calibrated_fraction - budget) <= 0.02, (budget, g.threshold, g.calibrated_fraction)
    assert executed_fraction(g, g.loop.batches) == pytest.approx(g.calibrated_fraction, rel=1e-12)
    met = g.metrics()
    assert met["exit_eval_samples"] == 256 and met["exit_calibrated_flops_fraction"] == g.calibrated_fraction
    assert sum(met["exit_depth_hist"].values()) == pytest.approx(1.0)
    assert 0.0 < met["cascade_escalated_share"] < 1.0
    with pytest.raises(ValueError, match="budget"):
        cascade().calibrate(val_batches())


def test_a_budget_below_the_first_cut_lands_on_the_first_cut(device):
    g = cascade({"flops_budget": 0.05}, device=device)
    batches = val_batches(device=device)
    thr, frac = g.calibrate(batches)
    cheapest = sum(len(x) * stage_costs(g, x.shape[1])[0] for x, _, _ in batches) / sum(
        len(x) * costs.flops_per_sample(g.model.config, x.shape[1]) for x, _, _ in batches)
    assert frac == pytest.approx(cheapest, rel=1e-12) and frac > 0.05
    assert executed_fraction(g, batches) == pytest.approx(frac, rel=1e-12)
    assert g.metrics()["exit_depth_hist"]["1"] == 1.0  # every row answered by the first cut


def test_the_threshold_is_label_free(device):
    runs = []
    for labels in (None, lambda B, s: 1 - val_batches()[s][2], lambda B, s: torch.full((B,), 10 ** 6)):
        g = cascade({"flops_budget": 0.7}, device=device)
        g.loop = FakeLoop(val_batches(labels=labels, device=device))
        g.before_evaluate()
        runs.append((g.threshold, g.calibrated_fraction))
    assert runs[0] == runs[1] == runs[2]


def test_state_round_trip(tmp_path, device):
    g = cascade({"flops_budget": 0.7}, device=device)
    batches = val_batches(device=device)
    g.calibrate(batches)
    for x, m, _ in batches[:2]:
        g.predict(x, m)
    torch.save(g.state_dict(), tmp_path / "g.pt")
    again = cascade({"flops_budget": 0.7}, device=device)
    again.load_state_dict(torch.load(tmp_path / "g.pt", weights_only=True))
    assert (again.threshold, again.calibrated_fraction) == (g.threshold, g.calibrated_fraction)
    assert again.metrics() == g.metrics()
    fresh = cascade()
    fresh.load_state_dict(fresh.state_dict())  # no calibration: -1 round-trips to None
    assert fresh.calibrated_fraction is None and fresh.threshold == fresh.s.exit_threshold
    # the cuts' weights travel with the model's state dict (checkpoints, exports)
    trained = cascade(seed=1, device=device)
    other = cascade(seed=2, device=device)
    other.model.load_state_dict(trained.model.state_dict())
    x, m = make_batch(B=8, seed=9, device=device)
    with torch.no_grad():
        torch.testing.assert_close(other.model.cascade_cuts["2"](x, m), trained.model.cascade_cuts["2"](x, m))


def test_the_runtime_static_regime_runs_the_cut_and_full_runs_the_full_model(device):
    from archsearch.runtime import Runtime

    g = cascade(device=device)
    g.threshold = 0.7
    rt = Runtime(g.model, g, flops_budget=0.6)
    x, m = make_batch(B=12, seed=7, device=device)
    d = rt.static_depth(x.shape[1])
    assert d == 2 and g.exit_model(2) is g.model.cascade_cuts["2"] and g.exit_model(4) is g.model
    tol = 0 if device.type == "cpu" else 1e-5
    with torch.no_grad():
        cut = rt.run(x, m, regime="static")
        torch.testing.assert_close(cut.logits, g.model.cascade_cuts["2"](x, m), rtol=0, atol=tol)
        full = rt.run(x, m, regime="full")
        torch.testing.assert_close(full.logits, g.model(x, m), rtol=0, atol=tol)
        own = rt.run(x, m, regime="cascade")
        torch.testing.assert_close(own.logits, g.predict(x, m)[0], rtol=0, atol=tol)
    assert cut.flops.tolist() == [stage_costs(g, x.shape[1])[1]] * 12 and cut.depth.tolist() == [2] * 12
    assert full.flops.tolist() == [stage_costs(g, x.shape[1])[-1]] * 12


def test_a_real_trial_loop_trains_every_model_and_meets_the_budget(cache_dir, tmp_path, device):
    from archsearch.data import prepare
    from archsearch.dynamic.known_costs import known_costs_fn
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
                          "gating": "cascade", "flops_budget": 0.5}}
    loop = TrialLoop({}, data, settings)
    assert isinstance(loop.gating, CascadeGating) and loop.gating.depths == [1, 3]
    cut = loop.model.cascade_cuts["1"]
    opt = {id(p) for grp in loop.opt.param_groups for p in grp["params"]}
    assert all(id(p) in opt for p in cut.parameters())  # the cut trains
    before = [p.detach().clone() for p in cut.parameters()]
    loop.train_epoch()
    assert all(not torch.equal(a, p) for a, p in zip(before, cut.parameters()))
    m = loop.evaluate("validation")
    full = sum(costs.flops_per_sample(loop.model.config, x.shape[1]) * len(x)
               for x, _, _ in loop.eval_batches("validation")) / 256
    assert m["exit_eval_samples"] == 256
    assert m["flops_per_sample"] / full == pytest.approx(m["exit_calibrated_flops_fraction"], abs=1e-9)
    assert abs(m["flops_per_sample"] / full - 0.5) <= 0.05
    known = known_costs_fn(data, settings["fixed"])({})
    assert (known["params_total"], known["params_trainable"]) == (m["params_total"], m["params_trainable"])
    test = loop.evaluate("test")
    loop.save(str(tmp_path))
    again = TrialLoop({}, data, settings)
    again.load(str(tmp_path))
    assert again.gating.threshold == loop.gating.threshold
    assert again.evaluate("test")["accuracy"] == test["accuracy"]


def test_a_search_space_sets_the_cuts_and_the_budget_of_the_cascade(tmp_path):
    from archsearch.errors import UserError
    from archsearch.space import load_space

    def space(extra):
        p = tmp_path / "s.yaml"
        p.write_text("name: t\nobjectives: [{metric: accuracy, mode: max}]\n"
                     "params:\n  gating: {type: categorical, choices: [static, cascade]}\n"
                     "  flops_budget: {type: float, low: 0.3, high: 0.9, when: {gating: cascade}}\n" + extra)
        return load_space(p)

    ok = space("  cascade_depths: {type: categorical, choices: [1, 2], when: {gating: cascade}}\n")
    assert ok.params["cascade_depths"].choices == [1, 2]
    assert space("fixed: {cascade_depths: 2}\n").fixed["cascade_depths"] == 2
    with pytest.raises(UserError, match="cascade_depths"):
        space("fixed: {cascade_depths: 0}\n")
