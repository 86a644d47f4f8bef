"""Tests for archsearch.dynamic.length.drop: LengthDrop sampling, token dropping that really
shortens the computation, drop-and-restore, FLOPs, and the gating strategy on real data."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from archsearch.dynamic import gating_class
from archsearch.dynamic.length.config import (
    check_length_config,
    constant_ratio_config,
    sample_length_config,
    scale_counts,
    smallest_length_config,
)
from archsearch.dynamic.length.drop import LengthDropGating
from archsearch.dynamic.length.forward import length_config_flops, length_drop_forward, significance
from archsearch.models.costs import count_flops_torch, flops_per_sample
from archsearch.models.transformer import Transformer, TransformerConfig

VOCAB = 60
N = 16  # max_len


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: on a shared 2-core machine two threads contend and run ~10x slower."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def make_model(task: str = "classification", n_layers: int = 3, device="cpu", **kw) -> Transformer:
    """A tiny eval-mode model initialised on the CPU from seed 0, on ``device``."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=VOCAB, max_len=N, n_layers=n_layers, d_model=32, n_heads=4,
                            d_ffn=64, dropout=0.0, task=task, **kw)
    return Transformer(cfg).to(device).eval()


def ids(B: int = 3, T: int = N, seed: int = 1, device="cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (B, T), generator=g).to(device)  # (B, T), no pad id inside


def record_lengths(model: Transformer, module: str = "ffn"):
    """Forward hooks that record the token count entering each block's FFN (or block)."""
    seen: list[int] = []
    hooks = [getattr(b, module).register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
             if module else b.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
             for b in model.blocks]
    return seen, hooks


def padded_case(norm_position: str = "pre", device="cpu"):
    """A 2-block classifier (pre- or post-LN blocks) and 3 samples of ``N`` tokens, the second
    with 10 real ones, on ``device``."""
    model = make_model("classification", n_layers=2, device=device, norm_position=norm_position)
    with torch.no_grad():  # peaked attention: no near-ties in the significance scores
        for blk in model.blocks:
            blk.attn.q.weight.mul_(4.0)
            blk.attn.k.weight.mul_(4.0)
    x = ids(B=3, device=device)
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, 10:] = False  # 10 real tokens
    return model, x.masked_fill(~mask, 0), mask


# -- LengthDrop sampling ---------------------------------------------------------------------


@pytest.mark.parametrize("n_layers,n,p", [(4, 48, 0.2), (6, 16, 0.5), (12, 5, 0.9), (3, 2, 0.2)])
def test_sampled_lengths_are_non_increasing_at_least_two_and_within_the_drop_bound(n_layers, n, p):
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(300):
        cfg = sample_length_config(n_layers, n, p, generator=g)
        assert len(cfg) == n_layers
        prev = n
        for v in cfg:
            assert min(2, n) <= v <= prev
            assert v >= min(prev, max(2, math.ceil(round((1 - p) * prev, 9))))
            prev = v
        seen.add(cfg)
    assert len(seen) > 1 or n == 2  # it is random


def test_smallest_config_is_the_lower_bound_and_constant_ratio_spans():
    assert smallest_length_config(4, 40, 0.2) == (32, 26, 21, 17)
    assert smallest_length_config(5, 4, 0.5) == (2, 2, 2, 2, 2)
    assert constant_ratio_config(3, 48, 1.0) == (48, 48, 48)
    assert constant_ratio_config(3, 48, 0.0) == (2, 2, 2)
    with pytest.raises(ValueError):
        check_length_config((10, 12, 4), 3, 16)  # increasing
    with pytest.raises(ValueError):
        check_length_config((10, 1, 1), 3, 16)  # below 2
    with pytest.raises(ValueError):
        check_length_config((10, 8), 3, 16)  # wrong count


def test_scale_counts_is_proportional_and_keeps_at_least_two_real_tokens():
    real = torch.tensor([16, 8, 3, 1, 0])
    assert scale_counts(8, real, 16).tolist() == [8, 4, 2, 1, 0]
    assert scale_counts(2, real, 16).tolist() == [2, 2, 2, 1, 0]
    assert scale_counts(16, real, 16).tolist() == real.tolist()


# -- forward ------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["classification", "lm"])
def test_full_length_equals_the_model_forward(task, device):
    model = make_model(task, device=device)
    x = ids(device=device)
    mask = None
    if task == "classification":
        mask = torch.ones_like(x, dtype=torch.bool)
        mask[1, 9:] = False
        x = x.masked_fill(~mask, 0)
    logits, lengths = length_drop_forward(model, x, mask, None)
    assert torch.allclose(logits, model(x, mask), atol=1e-5)
    assert lengths == [N] * 4


@pytest.mark.parametrize("task,module", [("classification", "ffn"), ("lm", None)])
def test_a_sampled_configuration_executes_exactly_those_lengths(task, module, device):
    model = make_model(task, n_layers=4, device=device)
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        cfg = sample_length_config(4, N, 0.4, generator=g)
        seen, hooks = record_lengths(model, module)
        try:
            _, lengths = length_drop_forward(model, ids(device=device), None, cfg)
        finally:
            for h in hooks:
                h.remove()
        # the FFN of encoder block i (the whole block i for the LM) runs on exactly l_i tokens
        assert seen == list(cfg), (seen, cfg)
        assert lengths == [N, *cfg]


def test_padded_batch_keeps_per_sample_counts_of_real_tokens_and_never_padding(device):
    model = make_model("classification", device=device)
    x = ids(B=3, device=device)
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, 8:] = False  # 8 real tokens
    mask[2, 2:] = False  # 2 real tokens
    x = x.masked_fill(~mask, 0)
    cfg = (12, 8, 4)
    seen, hooks = record_lengths(model)
    try:
        logits, lengths = length_drop_forward(model, x, mask, cfg)
    finally:
        for h in hooks:
            h.remove()
    # slots = the longest sample's kept count; sample 1 keeps ceil(l * 8 / 16), sample 2 keeps 2
    assert lengths == [N, 12, 8, 4] and seen == [12, 8, 4]
    assert torch.isfinite(logits).all()
    # padding never changes the result: sample 1 alone (unpadded, 8 tokens) gives the same logits
    alone, alone_lengths = length_drop_forward(model, x[1:2, :8], None, cfg)
    assert alone_lengths == [8, 6, 4, 2]
    assert torch.allclose(alone, logits[1:2], atol=1e-5)


def test_significance_is_attention_received_and_kept_tokens_are_the_most_attended(device):
    model = make_model("classification", n_layers=1, device=device)
    x = ids(B=2, device=device)
    h = model.embed(x)
    full = torch.ones(2, N, dtype=torch.bool, device=device)
    blk = model.blocks[0]
    y, score = significance(blk, h, full, full)
    # reference: explicit probabilities from the block's own q/k weights
    xn = blk.ln1(h)
    q = blk.attn.q(xn).view(2, N, 4, 8).transpose(1, 2)  # (B, H, T, dh)
    k = blk.attn.k(xn).view(2, N, 4, 8).transpose(1, 2)
    probs = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)  # (B, H, T, T)
    assert torch.allclose(score, probs.sum(dim=(1, 2)), atol=1e-5)
    assert torch.allclose(score.sum(1), torch.full((2,), 4.0 * N, device=device), atol=1e-3)
    assert torch.allclose(blk.attn.o(y), blk.attn(xn), atol=1e-5)  # same attention as the block
    y2, score2 = significance(blk, h, None, None)
    assert torch.allclose(score2, score) and torch.allclose(y2, y)
    keep = score.topk(5, dim=1).indices  # (2, 5)
    seen = []
    hook = model.blocks[0].ffn.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    try:
        logits, _ = length_drop_forward(model, x, None, (5,), restore=True)
    finally:
        hook.remove()
    assert seen[0].shape == (2, 5, 32)
    out = model.blocks[0](h)  # full-length block: kept tokens' attention over all 16 keys is equal
    restored = h.clone()
    for b in range(2):
        restored[b, keep[b]] = out[b, keep[b]]
    assert torch.allclose(logits, model.head_logits(restored, full), atol=1e-5)
    # default (classification): mean pooling over the kept tokens only
    pooled, _ = length_drop_forward(model, x, None, (5,))
    kept_out = torch.stack([out[b, keep[b]] for b in range(2)])  # (2, 5, d)
    assert torch.allclose(pooled, model.head_logits(kept_out, None), atol=1e-5)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_classifier_pools_only_the_tokens_kept_after_the_last_block(norm_position, device):
    """Dropped tokens never enter the pooled vector: changing the embedding-level state of a
    token dropped in block 1 changes the logits only through the attention it got as a key
    in block 1, which the reference below reproduces by gathering kept tokens by hand. Post-LN
    blocks (BERT, MiniLM) run post-LN when they drop tokens too."""
    model, x, mask = padded_case(norm_position, device)
    cfg = (8, 4)
    logits, lengths = length_drop_forward(model, x, mask, cfg)
    assert lengths == [N, 8, 4]
    # reference, sample by sample without padding: gather kept tokens, run, pool their mean
    for b, m in ((0, N), (1, 10), (2, N)):
        h = model.embed(x[b:b + 1, :m])  # (1, m, d)
        for blk, l in zip(model.blocks, cfg):
            k = int(scale_counts(l, torch.tensor([m]), N)[0])
            _, score = significance(blk, h, None, None)
            top = score.topk(k, dim=1).indices[0]  # (k,)
            full_out = blk(h)  # kept queries attend over all current keys, as in the drop block
            h = full_out[:, top]  # (1, k, d): gathered, the rest is gone
        ref = model.head(model.ln_f(h).mean(dim=1))  # (1, C)
        assert torch.allclose(logits[b:b + 1], ref, atol=1e-5), b
    # with restore=True the dropped tokens' states are pooled too: a different vector
    restored, _ = length_drop_forward(model, x, mask, cfg, restore=True)
    assert not torch.allclose(restored, logits, atol=1e-4)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_prefix_rule_keeps_the_first_tokens_after_they_read_every_token(norm_position, device):
    """``length_drop_rule: prefix``: block i runs attention over its current tokens, then keeps
    the first k_i of each sample (padding never): truncation inside the network. Reference:
    sample by sample, full-length block, then the first k rows; a bad rule is refused."""
    model, x, mask = padded_case(norm_position, device)
    cfg = (8, 4)
    logits, lengths = length_drop_forward(model, x, mask, cfg, rule="prefix")
    assert lengths == [N, 8, 4]
    for b, m in ((0, N), (1, 10), (2, N)):
        h = model.embed(x[b:b + 1, :m])  # (1, m, d)
        for blk, l in zip(model.blocks, cfg):
            k = int(scale_counts(l, torch.tensor([m]), N)[0])
            h = blk(h)[:, :k]  # (1, k, d): the first k, having attended over all m
        ref = model.head(model.ln_f(h).mean(dim=1))  # (1, C)
        assert torch.allclose(logits[b:b + 1], ref, atol=1e-5), b
    sig, _ = length_drop_forward(model, x, mask, cfg)
    assert not torch.allclose(sig, logits, atol=1e-4)  # the rule changes which tokens stay
    with pytest.raises(ValueError, match="length_drop_rule"):
        length_drop_forward(model, x, mask, cfg, rule="random")
    with pytest.raises(ValueError, match="length_drop_rule"):
        LengthDropGating(model, {"length_drop_rule": "random"}, {"seed": 0})


def test_settings_are_typed_documented_and_refuse_bad_keys():
    """``LengthDropGating.Settings``: every knob the gating reads is a documented field; an
    unknown key, a rule outside the Literal, ``prefix`` for the LM and out-of-range values are
    refused with the key in the message; lists (YAML) become tuples; ``None`` keeps defaults."""
    from archsearch.dynamic.length.forward import DROP_RULES

    S = LengthDropGating.Settings
    assert set(S.model_fields) == {
        "length_drop_p", "layer_drop_p", "length_drop_rule", "evolution_iterations",
        "evolution_mutations", "evolution_crossovers", "evolution_val_samples", "length_budgets"}
    assert all(f.description for f in S.model_fields.values())
    assert DROP_RULES == ("significance", "prefix")
    with pytest.raises(ValueError, match="length_drop_colour"):
        S.model_validate({"length_drop_colour": 1})  # extra="forbid"
    with pytest.raises(ValueError, match="^length_drop_rule: "):
        S.from_config({"length_drop_rule": "middle"})
    with pytest.raises(ValueError, match="^length_drop_rule: 'prefix' is for classification"):
        S.from_config({"length_drop_rule": "prefix"}, task="lm")
    assert S.from_config({"length_drop_rule": "prefix"}, task="classification").length_drop_rule == "prefix"
    for key, bad in (("length_drop_p", 1.0), ("layer_drop_p", -0.1), ("evolution_iterations", -1),
                     ("evolution_val_samples", 0), ("length_budgets", [0.5, 1.5]), ("length_budgets", [])):
        with pytest.raises(ValueError, match=f"^{key}"):
            S.from_config({key: bad})
    s = S.from_config({"length_budgets": [0.5, 0.35], "layer_drop_p": None, "lr": 1e-3})
    assert s.length_budgets == (0.5, 0.35) and s.layer_drop_p == 0.2 and s.length_drop_p == 0.36
    model = make_model("classification", n_layers=2)
    with pytest.raises(ValueError, match="length_drop_rule"):
        LengthDropGating(model, {"length_drop_rule": "middle"}, {"seed": 0})
    assert LengthDropGating(model, {"length_drop_p": 0.5}, {"seed": 0}).s.length_drop_p == 0.5


def test_dropping_gathers_kept_tokens_into_shorter_tensors(device):
    """Real compute: every op after the drop (O projection, residual, FFN, final LN and pooling)
    sees a tensor of K_i rows, not a masked full-length one."""
    model = make_model("classification", n_layers=3, device=device)
    shapes = {}

    def rec(key):
        def hook(m, inp, out):
            shapes.setdefault(key, tuple(inp[0].shape))  # returns None: output unchanged
        return hook

    hooks = [model.blocks[i].attn.o.register_forward_hook(rec(("o", i))) for i in range(3)]
    hooks += [model.blocks[i].ffn.register_forward_hook(rec(("ffn", i))) for i in range(3)]
    hooks.append(model.ln_f.register_forward_hook(rec("ln_f")))
    try:
        length_drop_forward(model, ids(B=2, device=device), None, (12, 6, 3))
    finally:
        for h in hooks:
            h.remove()
    assert [shapes[("ffn", i)][1] for i in range(3)] == [12, 6, 3]
    assert [shapes[("o", i)][0] for i in range(3)] == [2 * 12, 2 * 6, 2 * 3]  # flattened rows
    assert shapes["ln_f"] == (2, 3, 32)  # pooling reads the 3 kept tokens only


def test_drop_and_restore_lm_returns_every_position_and_stays_causal(device):
    model = make_model("lm", n_layers=3, device=device)
    x = ids(B=2, device=device)
    cfg = (8, 4, 2)
    logits, lengths = length_drop_forward(model, x, None, cfg)
    assert logits.shape == (2, N, VOCAB) and lengths == [N, 8, 4, 2]
    assert torch.isfinite(logits).all()
    # positions dropped before block 1 skip every block: their logits come from the embedding
    kept1 = (torch.arange(1, 9) * N) // 8 - 1
    dropped = sorted(set(range(N)) - set(kept1.tolist()))
    from_emb = model.head_logits(model.embed(x), None)
    assert torch.allclose(logits[:, dropped], from_emb[:, dropped], atol=1e-5)
    assert not torch.allclose(logits[:, kept1.to(device)], from_emb[:, kept1.to(device)], atol=1e-3)
    assert N - 1 in kept1.tolist()  # the last position is always kept
    # changing the last token changes no earlier prediction (selection depends on positions only)
    y = x.clone()
    y[:, -1] = (y[:, -1] % (VOCAB - 1)) + 1
    logits_y, _ = length_drop_forward(model, y, None, cfg)
    assert torch.allclose(logits[:, :-1], logits_y[:, :-1], atol=1e-5)


# -- FLOPs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["classification", "lm"])
def test_flops_match_flop_counter_on_the_reduced_computation(task, device):
    model = make_model(task, n_layers=4, device=device)
    cfg = (13, 9, 9, 3)
    x = ids(B=2, device=device)
    for b in model.blocks:
        b.attn.attention_impl = "math"  # FlopCounterMode counts 0 for SDPA on CPU (and the device's kernels vary)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        _, lengths = length_drop_forward(model, x, None, cfg)
    assert counter.get_total_flops() // 2 == length_config_flops(model.config, lengths)
    full = length_config_flops(model.config, [N] * 5)
    assert full == flops_per_sample(model.config, N) == count_flops_torch(model, x)
    assert length_config_flops(model.config, lengths) < 0.7 * full


# -- the gating strategy on real data -----------------------------------------------------------


@pytest.fixture(scope="module")
def rt_data(cache_dir):
    import dataclasses

    from archsearch.data import prepare

    data = prepare("rotten_tomatoes_sentences", vocab_size=600, max_len=32, task="classification")
    tr = data.train
    small = dataclasses.replace(tr, input_ids=tr.input_ids[:768], attention_mask=tr.attention_mask[:768],
                                labels=tr.labels[:768])
    return dataclasses.replace(data, data={**data.data, "train": small})


def test_gating_is_registered_and_trains_with_the_sandwich_then_searches(rt_data, tmp_path, device):
    from archsearch.tune.trainable import TrialLoop

    assert gating_class("length_drop") is LengthDropGating
    cfg = {"n_layers": 2, "d_model": 32, "n_heads": 2, "gating": "length_drop", "length_drop_p": 0.4,
           "evolution_iterations": 2, "evolution_mutations": 4, "evolution_crossovers": 4,
           "evolution_val_samples": 256, "length_budgets": [0.8, 0.6]}
    store = tmp_path / "search.json"
    loop = TrialLoop(cfg, rt_data, {"epochs": 2, "batch_size": 64, "seed": 0, "latency_batch_size": 16,
                                    "evolution_store": str(store), "device": str(device)})
    gating = loop.gating
    x, mask, y = (t.to(loop.device) for t in next(loop.train_batches()))  # CPU batches, as the loop moves them
    loop.model.train()
    loss = gating.training_loss(x, mask, y, loop.task_loss)
    assert loss.ndim == 0 and torch.isfinite(loss)
    # the sandwich: (CE(full) + 3 KL terms) / 4 >= CE(full) / 4, and every sub-model gets gradient
    loss.backward()
    assert all(p.grad is not None for p in loop.model.blocks[1].ffn.parameters())
    loop.opt.zero_grad(set_to_none=True)
    losses = [loop.train_epoch() for _ in range(2)]
    assert losses[1] < losses[0]
    full = loop.evaluate()
    assert 0.0 <= full["accuracy"] <= 1.0
    # a selected configuration runs in predict() with fewer FLOPs
    gating.set_length_config((12, 6))
    small = loop.evaluate()
    assert small["flops_per_sample"] < 0.6 * full["flops_per_sample"]
    assert small["length_config"] == [12, 6]
    gating.set_length_config(None)
    state = gating.state_dict()
    gating.set_length_config((8, 4))
    gating.load_state_dict(state)
    assert gating.length_config is None
    # finalize: the evolutionary search's Pareto set (on its validation subset), measured on
    # the whole validation split as evaluate() measures a trial, sorted by FLOPs, accuracy
    # increasing
    out = gating.finalize()
    assert gating.length_config is None  # finalize does not change the selection
    curve = out["anytime_curve"]
    assert curve and store.is_file()
    import json

    evaluated = json.loads(store.read_text())["evaluated"]
    assert len(evaluated) > 10
    front = gating.search.front()  # every evaluated configuration is weakly dominated by the front
    for e in evaluated:
        assert any(c["flops_per_sample"] <= e["flops_per_sample"] and c["metric"] >= e["metric"] for c in front)
    on_subset = {tuple(c["length_config"]) for c in front}
    assert {tuple(c["length_config"]) for c in curve} <= on_subset
    f = [c["flops_per_sample"] for c in curve]
    a = [c["accuracy"] for c in curve]
    assert f == sorted(f) and all(a2 > a1 for a1, a2 in zip(a, a[1:]))
    for c in curve:
        assert set(c) == {"flops_per_sample", "accuracy", "latency_ms", "length_config"}
        check_length_config(c["length_config"], 2, 32)
        assert c["latency_ms"] > 0
        gating.set_length_config(c["length_config"])  # the trial's own evaluation gives the same
        m = loop.evaluate()
        assert (c["accuracy"], c["flops_per_sample"]) == pytest.approx((m["accuracy"], m["flops_per_sample"]))
    gating.set_length_config(None)
    # never below the smallest trained sub-model (p = 0.4 over 2 layers of 32: (20, 12))
    floor = smallest_length_config(2, 32, 0.4)
    assert all(all(v >= f for v, f in zip(e["length_config"], floor)) for e in evaluated)
    # the best configuration within each budget, relative to the full length on the same subset
    # (chosen on the subset, measured on the whole split)
    full_flops = next(e["flops_per_sample"] for e in evaluated if e["length_config"] == [32, 32])
    for q, best in out["budget_configs"].items():
        ok = [e for e in evaluated if e["flops_per_sample"] <= float(q) * full_flops]
        if best is None:
            assert not ok
            continue
        assert best["search_flops_per_sample"] <= float(q) * full_flops
        assert best["search_metric"] == max(e["metric"] for e in ok)
        gating.set_length_config(best["length_config"])
        assert best["metric"] == pytest.approx(loop.evaluate()["accuracy"])
    gating.set_length_config(None)


def test_language_model_trains_and_evaluates_with_drop_and_restore(cache_dir, device):
    from archsearch.data import prepare
    from archsearch.tune.trainable import TrialLoop

    data = prepare("shakespeare", max_len=32, task="lm")
    cfg = {"n_layers": 2, "d_model": 32, "n_heads": 2, "gating": "length_drop", "lr": 3e-3,
           "evolution_iterations": 1, "evolution_mutations": 3, "evolution_crossovers": 3,
           "evolution_val_samples": 16}
    loop = TrialLoop(cfg, data, {"epochs": 1, "batch_size": 16, "steps_per_epoch": 30, "seed": 0,
                                 "eval_blocks": 32, "latency_batch_size": 8, "device": str(device)})
    before = loop.evaluate()["perplexity"]
    loop.train_epoch()
    full = loop.evaluate()
    assert full["perplexity"] < before
    loop.gating.set_length_config((16, 8))
    half = loop.evaluate()
    assert math.isfinite(half["perplexity"]) and half["flops_per_sample"] < full["flops_per_sample"]
    # evaluate_config reads batches on the model's device (as validation_subset builds them), at
    # the precision evaluate() runs (its autocast)
    batches = [(x.to(loop.device), None if m is None else m.to(loop.device), y.to(loop.device))
               for x, m, y in loop.eval_batches()]
    with loop.autocast():
        ppl, flops = loop.gating.evaluate_config(batches, (16, 8))
    # a summed vs a mean cross-entropy: on CUDA the float32 reductions differ by ~1e-6
    assert ppl == pytest.approx(half["perplexity"], rel=1e-5) and flops == pytest.approx(half["flops_per_sample"])
    loop.gating.set_length_config(None)
    curve = loop.gating.finalize()["anytime_curve"]
    f = [c["flops_per_sample"] for c in curve]
    p = [c["perplexity"] for c in curve]
    assert curve and f == sorted(f) and all(b < a for a, b in zip(p, p[1:]))  # cheaper = worse
