"""DHT gating: forced gates equal the static model, forced depth runs exactly k blocks, sliced
heads equal masked heads, grouped inference equals per-sample runs and executes only the
counted FLOPs, real training on real data, determinism, checkpoint state, and a tiny DHT search
through the CLI."""

import copy
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from archsearch.dynamic import gating_class
from archsearch.dynamic.depth.dht import DHTGating
from archsearch.dynamic.depth.stop_bandit import BanditStopping
from archsearch.dynamic.depth.stopping import TRAJECTORY_DIM
from archsearch.models import costs
from archsearch.models.transformer import MultiHeadAttention, Transformer, TransformerConfig

ROOT = Path(__file__).resolve().parents[1]

#: The paper's route-once DHT (arXiv 2312.03038, §3), with every head gateable: the defaults
#: before the measured ones (DHTSettings), reachable by name. The tests of route-once
#: mechanics start from it; the cascade tests override the routing keys.
PAPER = dict(min_heads=1, dht_warmup_steps=100, exit_heads=False, exit_loss="mean",
             dht_reward="ce", dht_exit_context=False, dht_routing="once", dht_stop_fit="train",
             dht_stop_rule="regression", dht_stop_quality="prob", dht_stop_context="exit")


@pytest.fixture()
def tiny(device):
    """A tiny eval-mode classifier and a padded batch, drawn on the CPU from seed 0 (the same
    numbers on every device), on the test device."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=60, max_len=16, n_layers=4, d_model=32, n_heads=4, d_ffn=64,
                            dropout=0.0)
    model = Transformer(cfg).eval()
    x = torch.randint(1, 60, (8, 12))
    mask = torch.ones(8, 12, dtype=torch.bool)
    mask[2, 7:] = False
    mask[5, 4:] = False
    x[~mask] = 0
    return model.to(device), x.to(device), mask.to(device)


def flops_counted(fn, model):
    """FlopCounterMode FLOPs of ``fn()`` with explicit-matmul attention (SDPA counts 0 on CPU)."""
    from torch.utils.flop_counter import FlopCounterMode

    mods = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    for m in mods:
        m.attention_impl = "math"
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as c:
            fn()
    finally:
        for m in mods:
            m.attention_impl = "sdpa"
    return c.get_total_flops()


def test_defaults_are_the_measured_recipe_and_the_old_values_stay_reachable():
    from archsearch.dynamic.depth.settings import DHTSettings

    s = DHTSettings()
    assert (s.exit_heads, s.exit_loss, s.dht_exit_context, s.dht_reward, s.min_heads) == (True, "sum", True, "prob", None)
    assert (s.dht_routing, s.dht_stop_fit, s.dht_stop_rule, s.dht_stop_quality, s.dht_stop_context) == \
        (None, "validation", "tuned", "match", "trajectory")
    assert DHTSettings.from_config(PAPER).dht_routing == "once"
    with pytest.raises(ValueError, match="dht_routing"):
        DHTSettings.from_config({"dht_routing": "twice"})
    with pytest.raises(ValueError, match="dht_routing: cascade is for classification"):
        DHTSettings.from_config({"dht_routing": "cascade"}, task="lm")


def test_default_dht_routes_by_cascade_with_all_heads(tiny):
    model = tiny[0]
    dht = DHTGating(model, {}, {"seed": 0})
    assert dht.routing == "cascade" and dht.stopping is not None and dht.min_heads == model.config.n_heads
    assert dht.flops_budget == 0.5 and dht.warmup == 100  # no trial loop: 100 steps


def test_registered_as_gating_dht():
    assert gating_class("dht") is DHTGating


def test_gates_forced_open_equal_the_static_model(tiny):
    model, x, mask = tiny
    dht = DHTGating(model, {**PAPER, "dht_lambda": 0.5}, {"seed": 0})
    dht.force_depth = 4
    logits, flops = dht.predict(x, mask)
    torch.testing.assert_close(logits, model(x, mask), rtol=0, atol=1e-6)
    assert flops.tolist() == [float(costs.flops_per_sample(model.config, 12))] * 8
    # an untrained DHT (no bandit update yet) also runs the full model
    dht.force_depth = None
    torch.testing.assert_close(dht.predict(x, mask)[0], model(x, mask), rtol=0, atol=1e-6)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_forcing_depth_k_executes_exactly_k_layers(tiny, k):
    model, x, mask = tiny
    calls = [0] * 4
    hooks = [b.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
             for i, b in enumerate(model.blocks)]
    dht = DHTGating(model, dict(PAPER), {"seed": 0})
    dht.force_depth = k
    try:
        logits, flops = dht.predict(x, mask)
    finally:
        for h in hooks:
            h.remove()
    assert calls == [1] * k + [0] * (4 - k)
    torch.testing.assert_close(logits, model(x, mask, n_layers=k), rtol=0, atol=1e-6)
    expected = costs.flops_per_sample(model.config, 12, n_layers=k)
    assert flops.tolist() == [float(expected)] * 8
    measured = flops_counted(lambda: dht.predict(x, mask), model) / 8
    assert abs(measured - expected) / expected < 0.02


def test_sliced_heads_equal_masked_heads(tiny):
    model, x, mask = tiny
    heads = [[0, 2], [1, 3, 0], [3], None]
    pad = model.padding_mask(x, mask)
    h = model.embed(x)
    sliced = model.run_layers(h, pad, heads_per_layer=heads)
    masked_model = copy.deepcopy(model)  # zero the O-projection columns of unselected heads
    with torch.no_grad():
        for blk, hs in zip(masked_model.blocks, heads):
            if hs is None:
                continue
            w = blk.attn.o.weight.view(32, 4, 8)  # (d, H, dh)
            for j in range(4):
                if j not in hs:
                    w[:, j] = 0.0
    masked = masked_model.run_layers(h, pad)
    torch.testing.assert_close(sliced, masked, rtol=1e-5, atol=1e-5)
    # and DHT's forced head choice runs exactly that path (n_fixed = 1: block 0 keeps all heads)
    dht = DHTGating(model, {**PAPER, "n_fixed": 1}, {"seed": 0})
    dht.force_depth, dht.force_heads = 4, heads[1:]
    torch.testing.assert_close(dht.predict(x, mask)[0],
                               model(x, mask, heads_per_layer=[None, *heads[1:]]), rtol=0, atol=1e-6)


def make_mixed(model, seed=0):
    """A DHT whose greedy bandits send different samples to different depths and drop heads."""
    dht = DHTGating(model, {**PAPER, "n_fixed": 1, "min_heads": 1}, {"seed": seed})
    rng = np.random.default_rng(seed)
    dht.lin.b = 50.0 * rng.normal(size=dht.lin.b.shape)  # arm preferences differ by context
    dht.lin._refresh()
    rows = np.arange(dht.n_gated)
    dht.ucb.update(rows, np.array([1, 0, 2]), 1.0)  # greedy head counts 2, 1, 3
    dht.updates = 1
    return dht


def test_grouped_inference_equals_per_sample_runs_and_counts_only_executed_flops(tiny):
    model, x, mask = tiny
    dht = make_mixed(model)
    groups = dht.plan(x, mask)
    assert len(groups) >= 2, groups  # the batch really is split by depth
    logits, flops = dht.predict(x, mask)
    for depth, idx, heads in groups:
        assert len(heads) == depth - 1
        for i in idx:
            ref = model(x[i:i + 1], mask[i:i + 1], n_layers=depth, heads_per_layer=[None, *heads])
            torch.testing.assert_close(logits[i:i + 1], ref, rtol=1e-5, atol=1e-5)
            counts = [4] + [4 if hs is None else len(hs) for hs in heads]
            assert flops[i] == costs.flops_per_sample(model.config, 12, n_layers=depth, heads_per_layer=counts)
    assert any(hs is not None and len(hs) < 4 for _, _, heads in groups for hs in heads)
    # nothing beyond the counted FLOPs is computed: no zero masks, no skipped-but-run layers
    measured = flops_counted(lambda: dht.predict(x, mask), model) / 8
    assert abs(measured - float(flops.mean())) / float(flops.mean()) < 0.02
    assert float(flops.mean()) < costs.flops_per_sample(model.config, 12)
    m = dht.metrics()
    assert abs(sum(m["dht_depth_hist"].values()) - 1) < 1e-9 and 1 <= m["dht_mean_depth"] <= 4
    assert 1 <= m["dht_mean_heads"] <= 3


def test_bad_config_raises(tiny):
    model = tiny[0]
    with pytest.raises(ValueError, match="min_heads"):
        DHTGating(model, {**PAPER, "min_heads": 5}, {})
    with pytest.raises(ValueError, match="n_fixed"):
        DHTGating(model, {**PAPER, "n_fixed": 5}, {})
    with pytest.raises(ValueError, match="dht_lambda"):
        DHTGating(model, {**PAPER, "dht_lambda": -1}, {})
    # depth limits are clamped into [n_fixed, n_layers]
    assert DHTGating(model, {**PAPER, "n_fixed": 2, "min_layers": 1, "max_layers": 9}, {}).depths == [2, 3, 4]


@pytest.fixture(scope="module")
def small_data(cache_dir):
    import dataclasses

    from archsearch.data import prepare

    data = prepare("rotten_tomatoes_sentences", vocab_size=1000, max_len=32)
    tr, va = data.train, data["validation"]
    tr = dataclasses.replace(tr, input_ids=tr.input_ids[:640], attention_mask=tr.attention_mask[:640],
                             labels=tr.labels[:640])
    va = dataclasses.replace(va, input_ids=va.input_ids[:256], attention_mask=va.attention_mask[:256],
                             labels=va.labels[:256])
    return dataclasses.replace(data, data={**data.data, "train": tr, "validation": va})


def train_dht(data, lam, device, seed=0, **extra):
    from archsearch.tune.trainable import TrialLoop

    torch.set_num_threads(1)
    cfg = {**PAPER, "gating": "dht", "n_layers": 3, "d_model": 32, "n_heads": 4, "dht_lambda": lam,
           "dht_warmup_steps": 3, "dht_warmup_max_steps": 8, "warmup_steps": 5, **extra}
    loop = TrialLoop(cfg, data, {"epochs": 1, "batch_size": 32, "seed": seed, "device": str(device)})
    loop.train_epoch()
    return loop, loop.evaluate()


def test_real_training_with_a_large_lambda_learns_cheaper_paths_deterministically(small_data, device):
    loop, m = train_dht(small_data, lam=5.0, device=device)
    static_flops = costs.static_costs_fn(small_data)(loop.cfg).costs["flops_per_sample"]  # same batches
    assert m["flops_per_sample"] < 0.8 * static_flops
    assert m["dht_mean_depth"] < 3
    assert m["dht_mean_depth"] == pytest.approx(sum(int(d) * f for d, f in m["dht_depth_hist"].items()))
    assert sum(m["dht_train_depth_hist"].values()) == pytest.approx(1.0)
    assert 0 < m["dht_bandit_overhead_pct"] < 100
    # the same seed gives the same bandit state and the same choices
    loop2, m2 = train_dht(small_data, lam=5.0, device=device)
    assert m2["flops_per_sample"] == m["flops_per_sample"] and m2["dht_depth_hist"] == m["dht_depth_hist"]
    s1, s2 = loop.gating.state_dict(), loop2.gating.state_dict()
    assert torch.equal(s1["lin"]["A"], s2["lin"]["A"]) and torch.equal(s1["ts"]["alpha"], s2["ts"]["alpha"])
    # checkpoint state: weights_only loadable, restores the same greedy choices
    buf = io.BytesIO()
    torch.save(s1, buf)
    buf.seek(0)
    fresh = DHTGating(loop.model, loop.cfg, {"seed": 99})
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    va = small_data["validation"]
    x, mask = va.input_ids[:64].to(device), va.attention_mask[:64].to(device)
    assert fresh.plan(x, mask) == loop.gating.plan(x, mask)
    torch.testing.assert_close(fresh.predict(x, mask)[1], loop.gating.predict(x, mask)[1])


def test_shipped_dht_space_validates():
    from archsearch.space import load_space

    space = load_space(ROOT / "search_spaces" / "dht.yaml")
    assert space.params["gating"].choices == ["static", "dht"]
    # issue 14: the outer loop searches a FLOPs budget; dht_lambda is only the initial price
    assert space.params["flops_budget"].when == {"gating": "dht"}
    assert "dht_lambda" not in space.params


@pytest.mark.ray
@pytest.mark.slow
def test_tiny_dht_search_through_the_cli(tmp_path, cache_dir):
    import yaml

    spec = {
        "name": "tiny-dht",
        "task": "classification",
        "dataset": {"name": "rotten_tomatoes_sentences", "vocab_size": 1000, "max_len": 32,
                    "max_train_samples": 256},
        "objectives": [{"metric": "accuracy", "mode": "max"}, {"metric": "flops_per_sample", "mode": "min"}],
        "budget": {"trials": 2, "max_concurrent": 2, "epochs": 1, "batch_size": 32,
                   "scheduler": "none", "cpus_per_trial": 1},
        "params": {
            "gating": {"type": "categorical", "choices": ["dht"]},
            "dht_lambda": {"type": "float", "low": 0.1, "high": 2.0, "log": True, "when": {"gating": "dht"}},
            "min_layers": {"type": "int", "low": 1, "high": 2, "when": {"gating": "dht"}},
            "min_heads": {"type": "int", "low": 1, "high": 2, "when": {"gating": "dht"}},
        },
        "fixed": {"n_layers": 2, "d_model": 16, "n_heads": 2, "dht_warmup_steps": 2, "n_fixed": 1},
    }
    space = tmp_path / "tiny.yaml"
    space.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "ARCHSEARCH_CACHE": str(cache_dir)}
    exe = Path(sys.executable).parent / "archsearch"  # the installed console script
    cmd = [str(exe) if exe.exists() else "archsearch", "search", str(space), "--trials", "2",
           "--searcher", "random", "--name", "tiny-dht", "--storage", str(tmp_path / "runs"),
           "--reports", str(tmp_path / "reports"), "--no-progress", "--no-ray-dashboard"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from archsearch.runs import read_trials

    trials = read_trials(tmp_path / "runs" / "tiny-dht")
    assert len(trials) == 2
    for t in trials:
        assert t["status"] == "TERMINATED", t
        assert t["config"]["gating"] == "dht"
        m = t["metrics"]
        assert 0 <= m["accuracy"] <= 1 and m["flops_per_sample"] > 0 and m["latency_ms"] > 0
        assert "dht_mean_depth" in json.dumps(m)


# ---------------------------------------------------------------- issue 14: budget, exits, rewards
def synthetic_task(seed=0, B=64, T=12, device="cpu"):
    """Labels decided by whether token 7 occurs: learnable from one block (drawn on the CPU,
    on ``device``)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, 60, (B, T), generator=g)
    y = (x == 7).any(dim=1).long() | (x[:, 0] > 30).long()
    return x.to(device), torch.ones(B, T, dtype=torch.bool, device=device), y.to(device)


def exit_ce(model, x, mask, y, depth):
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x, mask, n_layers=depth), y))


def test_all_exits_training_makes_the_exit_1_loss_fall(device):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=60, max_len=16, n_layers=4, d_model=32, n_heads=4, d_ffn=64,
                            dropout=0.0, n_classes=2)
    model = Transformer(cfg).to(device).train()
    dht = DHTGating(model, {**PAPER, "n_fixed": 1, "dht_warmup_steps": 1000}, {"seed": 0})
    x, mask, y = synthetic_task(device=device)
    before = [exit_ce(model, x, mask, y, d) for d in (1, 2, 3, 4)]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(40):
        xb, mb, yb = synthetic_task(seed=step + 1, device=device)
        loss = dht.training_loss(xb, mb, yb, torch.nn.functional.cross_entropy)
        opt.zero_grad()
        loss.backward()
        opt.step()
        dht.after_step(loss.item())
    after = [exit_ce(model, x, mask, y, d) for d in (1, 2, 3, 4)]
    assert after[0] < 0.8 * before[0], (before, after)  # the shallowest exit is trained too
    assert all(a < b for a, b in zip(after, before)), (before, after)
    # during the warm-up the depth bandit learnt from every exit of every sample
    assert dht.updates == 40 and (np.diagonal(dht.lin.A, axis1=1, axis2=2).sum(1) > 17 + 40).all()


def test_alternating_schedule_trains_the_deepest_exit_alone_on_odd_steps(device):
    """``dht_exit_schedule: alternating`` (BERxiT, Xin et al. 2021 sec. 3.1): even steps train
    every exit, odd steps the deepest exit's loss alone (the exit heads get no gradient), also
    after the take-over (no routed term)."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=60, max_len=16, n_layers=4, d_model=32, n_heads=4, d_ffn=64,
                            dropout=0.0, n_classes=2)
    model = Transformer(cfg).to(device).train()
    dht = DHTGating(model, {**PAPER, "n_fixed": 1, "dht_warmup_steps": 1, "dht_warmup_max_steps": 2,
                            "exit_heads": True, "dht_exit_schedule": "alternating"}, {"seed": 0})
    grads = []
    for step in range(6):
        xb, mb, yb = synthetic_task(seed=step + 1, device=device)
        model.zero_grad()
        loss = dht.training_loss(xb, mb, yb, torch.nn.functional.cross_entropy)
        loss.backward()
        head = model.exit_heads["1"].weight.grad
        grads.append(0.0 if head is None else float(head.abs().sum()))
        if step % 2:
            deepest = torch.nn.functional.cross_entropy(model(xb, mb), yb)
            assert float(loss) == pytest.approx(float(deepest), rel=1e-5)
        dht.after_step(loss.item())
    assert not dht.warming_up  # steps 3 and 5 ran after the take-over
    assert [g > 0 for g in grads] == [True, False] * 3


def test_exits_from_step_trains_only_the_deepest_exit_before_that_step(device):
    """``dht_exits_from_step`` (DeeBERT's two stages): before the step, the loss is the deepest
    exit's alone (the exit heads get no gradient) and the warm-up does not end; from it on,
    every exit trains."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=60, max_len=16, n_layers=4, d_model=32, n_heads=4, d_ffn=64,
                            dropout=0.0, n_classes=2)
    model = Transformer(cfg).to(device).train()
    dht = DHTGating(model, {**PAPER, "n_fixed": 1, "dht_warmup_steps": 1, "exit_heads": True,
                            "dht_exits_from_step": 3}, {"seed": 0})
    grads = []
    for step in range(5):
        xb, mb, yb = synthetic_task(seed=step + 1, device=device)
        model.zero_grad()
        loss = dht.training_loss(xb, mb, yb, torch.nn.functional.cross_entropy)
        loss.backward()
        head = model.exit_heads["1"].weight.grad
        grads.append(0.0 if head is None else float(head.abs().sum()))
        dht.after_step(loss.item())
        if step < 3:
            assert dht.warming_up
            deepest = torch.nn.functional.cross_entropy(model(xb, mb), yb)
            assert float(loss) == pytest.approx(float(deepest), rel=1e-5)
    assert grads[:3] == [0.0, 0.0, 0.0] and grads[3] > 0 and grads[4] > 0
    with pytest.raises(ValueError, match="dht_exits_from_step"):
        DHTGating(Transformer(cfg), {**PAPER, "dht_exits_from_step": -1}, {"seed": 0})


def test_per_sample_rewards_update_exactly_the_depth_arms_each_sample_reached(tiny, device):
    model, x, mask = tiny
    dht = DHTGating(model, {**PAPER, "n_fixed": 1, "dht_epsilon": 0.0, "dht_decay": 1.0}, {"seed": 0})
    dht.takeover_step = 0  # the bandit routes from the first step
    rng = np.random.default_rng(0)
    dht.lin.b = 50.0 * rng.normal(size=dht.lin.b.shape)  # contexts prefer different depths
    dht.lin._refresh()
    y = torch.randint(0, 2, (8,)).to(device)
    loss = dht.training_loss(x, mask, y, torch.nn.functional.cross_entropy)
    loss.backward()
    p = dht._pending
    X, arms, ce = p["X"], p["arms"], p["ce"]  # (B, 17), (B,) depth-arm index, (B, K) CE per exit
    assert len(set(arms.tolist())) >= 2, arms
    # CE recorded for exactly the exits <= each sample's routed depth
    assert (~np.isnan(ce) == (np.arange(4)[None, :] <= arms[:, None])).all()
    norm = float(p["full_ce"][:, -1].mean())  # first step: the deepest exit's batch mean CE
    A0, b0 = dht.lin.A.copy(), dht.lin.b.copy()
    dht.after_step(loss.item())
    for a in range(4):
        reached = arms >= a  # samples whose routed path ran through exit a
        np.testing.assert_allclose(dht.lin.A[a], A0[a] + X[reached].T @ X[reached], atol=1e-9)
        # each sample's own reward: -(its CE at that exit) / norm (the price is charged at
        # selection, so it is not stored in the bandit)
        np.testing.assert_allclose(dht.lin.b[a], b0[a] + X[reached].T @ (-ce[reached, a] / norm), atol=1e-9)
    # samples never reached the deeper exits: those arms got nothing from them
    assert not np.allclose(dht.lin.A[0], dht.lin.A[3]) or (arms == 3).all()


def train_steps(dht, model, x, mask, y, n):
    """``n`` AdamW steps (lr 1e-3) of ``dht``'s training loss on one batch."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(n):
        loss = dht.training_loss(x, mask, y, torch.nn.functional.cross_entropy)
        opt.zero_grad()
        loss.backward()
        opt.step()
        dht.after_step(loss.item())


def test_static_depth_forced_run_equals_the_static_model_after_training(tiny, device):
    model, x, mask = tiny
    model.train()
    dht = DHTGating(model, {**PAPER, "n_fixed": 1, "dht_warmup_steps": 0, "flops_budget": 0.5,
                            "dht_warmup_max_steps": 2}, {"seed": 0})
    train_steps(dht, model, x, mask, torch.randint(0, 2, (8,)).to(device), 6)
    assert dht.takeover_step is not None and dht.updates == 6
    model.eval()
    for k in (1, 2, 3, 4):
        dht.force_depth = k
        logits, flops = dht.predict(x, mask)
        torch.testing.assert_close(logits, model(x, mask, n_layers=k), rtol=0, atol=1e-6)
        assert flops.tolist() == [float(costs.flops_per_sample(model.config, 12, n_layers=k))] * 8


def test_budget_calibration_on_validation_lands_within_005(small_data, device):
    static = costs.static_costs_fn(small_data)({"n_layers": 3, "d_model": 32,
                                                "n_heads": 4}).costs["flops_per_sample"]
    for budget in (0.5, 0.75):
        loop, m = train_dht(small_data, lam=0.5, device=device, flops_budget=budget)
        assert loop.gating.takeover_step is not None
        frac = m["flops_per_sample"] / static  # the evaluation ran at the calibrated price
        assert abs(frac - budget) <= 0.05, (budget, frac, m["dht_depth_hist"])
        assert m["dht_calibrated_flops_fraction"] == pytest.approx(frac, abs=1e-9)
        assert m["dht_eval_price"] >= 0 and m["dht_price"] >= 0
    # the calibration does not depend on the loop: the same call on the same rows
    va = small_data["validation"]
    price, got = loop.gating.calibrate([(va.input_ids[:128].to(device), va.attention_mask[:128].to(device))],
                                       budget=0.6)
    assert abs(got - 0.6) <= 0.05 and loop.gating.eval_price == price


def test_a_zero_warmup_max_is_zero_not_unset(tiny):
    """``dht_warmup_max_steps: 0`` (allowed: >= 0) takes over at the end of the warm-up; only
    None means 10 x the warm-up (before: 0 was read as unset)."""
    assert DHTGating(tiny[0], {**PAPER, "dht_warmup_steps": 5, "dht_warmup_max_steps": 0}, {}).warmup_max == 0
    assert DHTGating(tiny[0], {**PAPER, "dht_warmup_steps": 5}, {}).warmup_max == 50


def test_bad_flops_budget_raises(tiny):
    with pytest.raises(ValueError, match="flops_budget"):
        DHTGating(tiny[0], {**PAPER, "flops_budget": 0.0}, {})
    with pytest.raises(ValueError, match="flops_budget"):
        DHTGating(tiny[0], {**PAPER, "flops_budget": 1.5}, {})
    no_budget = DHTGating(tiny[0], dict(PAPER), {})
    no_budget.flops_budget = None  # programmatic only: a trial always has a budget (default 0.5)
    with pytest.raises(ValueError, match="budget"):
        no_budget.calibrate([])


def test_dht_reward_prob_is_the_true_class_probability_and_bad_values_raise():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=50, max_len=8, n_layers=3, d_model=16, n_heads=2,
                                          d_ffn=32, dropout=0.0, task="classification"))
    ce = np.array([0.1, 0.7, 2.5])
    prob = DHTGating(model, {**PAPER, "dht_reward": "prob"}, {"seed": 0})
    np.testing.assert_allclose(prob._quality(ce, 0.5), np.exp(-ce))
    np.testing.assert_allclose(DHTGating(model, dict(PAPER), {"seed": 0})._quality(ce, 0.5), -ce / 0.5)
    with pytest.raises(ValueError, match="dht_reward"):
        DHTGating(model, {**PAPER, "dht_reward": "acc"}, {"seed": 0})


def test_trajectory_stop_context_reads_confidence_and_agreement_with_the_last_exits():
    """``dht_stop_context: trajectory``: per exit, max probability, normalised entropy, class ==
    previous exit's, class == the previous two exits', previous max probability, 1."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=50, max_len=8, n_layers=3, d_model=16, n_heads=2,
                                          d_ffn=32, dropout=0.0, task="classification"))
    g = DHTGating(model, {**PAPER, "dht_routing": "cascade", "dht_stop_context": "trajectory", "min_layers": 1}, {"seed": 0})
    assert g.stopping.dim == TRAJECTORY_DIM and g.stopping.score_col == 0
    # 3 samples, classes over exits 1..3: (0, 0, 0), (0, 1, 1), (1, 0, 0)
    logits = {1: torch.tensor([[2.0, 0.0], [1.0, 0.0], [0.0, 3.0]]),
              2: torch.tensor([[3.0, 0.0], [0.0, 1.0], [1.0, 0.0]]),
              3: torch.tensor([[4.0, 0.0], [0.0, 2.0], [0.0, 0.0 - 2.0]])}
    hid = {d: torch.zeros(3, 4, 16) for d in logits}
    X = g._exit_contexts(logits, hid, None)  # (B, K, 6)
    assert X.shape == (3, 3, TRAJECTORY_DIM)
    p = {d: lg.softmax(-1) for d, lg in logits.items()}
    np.testing.assert_allclose(X[:, :, 0], torch.stack([p[d].max(-1).values for d in (1, 2, 3)], 1).double())
    ent = torch.stack([-(p[d] * p[d].log()).sum(-1) / math.log(2) for d in (1, 2, 3)], 1).double()
    np.testing.assert_allclose(X[:, :, 1], ent, rtol=1e-5)
    np.testing.assert_array_equal(X[:, :, 2], [[0, 1, 1], [0, 0, 1], [0, 0, 1]])  # == previous exit
    np.testing.assert_array_equal(X[:, :, 3], [[0, 0, 1], [0, 0, 0], [0, 0, 0]])  # == previous two
    np.testing.assert_allclose(X[:, 1:, 4], X[:, :-1, 0])  # previous max probability
    assert (X[:, 0, 4] == 0).all() and (X[:, :, 5] == 1).all()


def test_cascade_routing_stops_per_sample_and_equals_static_runs_of_each_group(tiny, device):
    """``dht_routing: cascade``: the exit-by-exit inference gives each sample the logits of the
    static model at its exit, counts that depth's FLOPs, agrees with plan() and with the
    batched route() on the same contexts, and survives a weights_only checkpoint."""
    model, x, mask = tiny
    model.train()
    dht = DHTGating(model, {**PAPER, "n_fixed": 1, "dht_warmup_steps": 0, "dht_warmup_max_steps": 2,
                            "flops_budget": 0.5, "dht_routing": "cascade", "min_heads": 4}, {"seed": 0})
    assert dht.context_dim == 19 and dht.stopping is not None
    train_steps(dht, model, x, mask, torch.randint(0, 2, (8,)).to(device), 4)
    assert dht.stopping.updates == 4
    rng = np.random.default_rng(1)
    dht.stopping.theta = 5.0 * rng.normal(size=dht.stopping.theta.shape)  # splits the batch across exits
    model.eval()
    dht.eval_price = 0.3
    logits, flops = dht.predict(x, mask)
    groups = dht.plan(x, mask)
    assert len(groups) >= 2 and sorted(i for _, idx, _ in groups for i in idx) == list(range(8))
    for d, idx, heads in groups:
        assert heads == [None] * (d - 1)  # min_heads = n_heads: no head gating
        torch.testing.assert_close(logits[idx], model(x[idx], mask[idx], n_layers=d), rtol=0, atol=1e-5)
        assert flops[idx].tolist() == [float(costs.flops_per_sample(model.config, 12, n_layers=d))] * len(idx)
    # the calibration's batched route on all-heads contexts = the exit-by-exit run
    with torch.no_grad():
        h, pad = dht._trunk(x, mask)
        exits, hid = dht._run_exits(h, pad, 4, [None] * 3, hidden=True)
        arms = dht._select_depths(dht._exit_contexts(exits, hid, pad), 12, True, 0.3)
    assert {i: dht.depths[a] for i, a in enumerate(arms)} == {i: d for d, idx, _ in groups for i in idx}
    buf = io.BytesIO()
    torch.save(dht.state_dict(), buf)
    buf.seek(0)
    fresh = DHTGating(model, dht.cfg, {"seed": 5})
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    fresh.eval_price = 0.3
    assert fresh.plan(x, mask) == groups
    with pytest.raises(ValueError, match="dht_routing"):
        DHTGating(model, {**PAPER, "dht_routing": "twice"}, {})


@pytest.mark.parametrize("stop_fit,stop_rule,stop_quality,stop_context", [
    ("train", "regression", "prob", "exit"), ("validation", "regression", "prob", "exit"),
    ("train", "tuned", "prob", "exit"),
    ("validation", "confidence", "prob", "exit"), ("validation", "confidence", "match", "exit"),
    ("validation", "confidence", "match", "trajectory"),
    ("train", "bandit", "prob", "exit"), ("validation", "bandit", "match", "trajectory")])
def test_cascade_budget_calibration_on_validation_lands_within_005(small_data, stop_fit, stop_rule, stop_quality,
                                                                    stop_context, device):
    static = costs.static_costs_fn(small_data)({"n_layers": 3, "d_model": 32,
                                                "n_heads": 4}).costs["flops_per_sample"]
    loop, m = train_dht(small_data, lam=0.5, device=device, flops_budget=0.6, dht_routing="cascade",
                        dht_reward="prob", dht_stop_fit=stop_fit, dht_stop_rule=stop_rule,
                        dht_stop_quality=stop_quality, dht_stop_context=stop_context)
    g = loop.gating
    assert g.stop_quality == stop_quality
    assert isinstance(g.stopping, BanditStopping) if stop_rule == "bandit" else g.stopping.rule == stop_rule
    assert g.stopping.dim == (TRAJECTORY_DIM if stop_context == "trajectory" else g.context_dim)
    assert g.takeover_step is not None and g.stopping.updates > 0
    frac = m["flops_per_sample"] / static
    assert abs(frac - 0.6) <= 0.05, (frac, m["dht_depth_hist"])
    assert m["dht_calibrated_flops_fraction"] == pytest.approx(frac, abs=0.02)
    # the policy left in place is the fit at the calibrated price, on the training window or on
    # the calibration rows (no labels: agreement with the deepest exit)
    theta = g.stopping.theta.copy()
    g.stopping.fit(g.eval_price)
    assert np.allclose(theta, g.stopping.theta) == (stop_fit == "train")
    with pytest.raises(ValueError, match="dht_stop_fit"):
        DHTGating(loop.model, {**PAPER, "dht_stop_fit": "test"}, {})
    with pytest.raises(ValueError, match="dht_stop_rule"):
        DHTGating(loop.model, {**PAPER, "dht_stop_rule": "oracle"}, {})
    with pytest.raises(ValueError, match="dht_stop_quality"):
        DHTGating(loop.model, {**PAPER, "dht_stop_quality": "labels"}, {})
    with pytest.raises(ValueError, match="dht_stop_context"):
        DHTGating(loop.model, {**PAPER, "dht_stop_context": "hidden"}, {})
    if stop_fit == "validation":  # the calibration rows' qualities: the deepest exit scores 1
        x, mask = g.calibration_batches(64)[0]  # CPU batches, as the loop's eval_batches gives them
        x, mask = x.to(device), mask.to(device)
        h, pad = g._trunk(x, mask)
        with torch.no_grad():
            q = g._agreement(g._run_exits(h, pad, g.depths[-1], [None] * (g.depths[-1] - g.n_fixed)))
        assert q.shape == (len(x), len(g.depths)) and np.all((q >= 0) & (q <= 1))
        assert np.isin(q, (0.0, 1.0)).all() == (stop_quality == "match")
        assert (q[:, -1] == 1).all() == (stop_quality == "match")


def test_shared_routed_forward_gives_the_separate_forward_s_loss_without_dropout(tiny, device):
    """``dht_routed_forward: shared`` reads each routed sample's exit from the deepest path's own
    forward: with dropout 0 and every head computed that is the same function as the second
    forward of ``separate``, so the training losses and per-sample exit CEs agree."""
    model, x, mask = tiny
    model.train()
    y = torch.randint(0, 2, (8,)).to(device)
    dht = DHTGating(model, {**PAPER, "n_fixed": 1, "dht_warmup_steps": 0, "dht_warmup_max_steps": 2,
                            "flops_budget": 0.5, "dht_routing": "cascade", "min_heads": 4,
                            "dht_epsilon": 0.6, "dht_routed_forward": "separate"}, {"seed": 0})  # spread rows
    train_steps(dht, model, x, mask, y, 4)
    assert dht.takeover_step is not None and dht.routed_forward == "separate"
    twin = copy.deepcopy(dht)  # the same bandits, random streams and (copied) weights
    twin.routed_forward = "shared"
    ce = torch.nn.functional.cross_entropy
    separate = dht.training_loss(x, mask, y, ce)
    shared = twin.training_loss(x, mask, y, ce)
    torch.testing.assert_close(shared, separate, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(twin._pending["ce"], dht._pending["ce"], rtol=1e-5, atol=1e-6)
    assert len({g["depth"] for g in dht._pending["groups"]}) >= 2  # rows routed to several exits


def test_a_language_model_counts_the_context_head_it_runs_before_routing():
    """Routed once with ``dht_exit_context`` (an LM's default), DHT runs the vocabulary head at
    block ``n_fixed`` for every sample before it routes (2 T d V FLOPs: more than a block here):
    the reported FLOPs are the executed ones (before: 1.76x more executed than reported, more
    than the full model, with every sample at depth 1)."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=1000, max_len=32, n_layers=3, d_model=32, n_heads=2,
                                          d_ffn=64, dropout=0.0, task="lm")).eval()
    x = torch.randint(1, 1000, (8, 32))
    mask = torch.ones(8, 32, dtype=torch.bool)
    for routed in (False, True):  # untrained: the full path, no context; then routed
        dht = DHTGating(model, {}, {"seed": 0})
        assert dht.routing == "once" and dht.exit_context
        if routed:
            dht.lin.b = 50.0 * np.random.default_rng(0).normal(size=dht.lin.b.shape)  # contexts differ
            dht.lin._refresh()
            dht.updates = 1
            assert len({g["depth"] for g in dht._plan(*dht._trunk(x, mask, None), greedy=True)}) >= 2
        _, flops = dht.predict(x, mask)
        measured = flops_counted(lambda: dht.predict(x, mask), model) / 8
        assert abs(measured - float(flops.mean())) / measured < 0.02, (routed, measured, float(flops.mean()))
    head = costs.flops_per_sample(model.config, 32, n_layers=0)
    assert head > costs.flops_per_sample(model.config, 32, n_layers=1) - head  # more than a block
