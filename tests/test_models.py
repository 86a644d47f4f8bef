"""Tests for archsearch.models: the transformer and its cost model."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from archsearch.models.costs import (
    count_flops_torch,
    flops_per_sample,
    latency_ms,
    params_total,
    params_trainable,
)
from archsearch.models.transformer import MultiHeadAttention, Transformer, TransformerConfig

VOCAB = 50


def make_config(**overrides) -> TransformerConfig:
    base = dict(vocab_size=VOCAB, max_len=24, n_layers=3, d_model=32, n_heads=4, d_ffn=64, dropout=0.0)
    base.update(overrides)
    return TransformerConfig(**base)


def make_model(**overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(make_config(**overrides)).eval()


def random_ids(B: int = 4, T: int = 12, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (B, T), generator=g)  # no pad id (0) inside


# -- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        dict(d_model=30, n_heads=4),
        dict(n_layers=0),
        dict(dropout=1.0),
        dict(task="seq2seq"),
        dict(task="classification", n_classes=1),
        dict(pad_id=VOCAB),
        dict(pooling="cls"),
        dict(attention_impl="flash"),
        dict(d_ffn=2.5),
        dict(layer_norm_eps=0.0),
    ],
)
def test_config_rejects_invalid_values(overrides):
    with pytest.raises(ValueError):
        make_config(**overrides)


# -- shapes ----------------------------------------------------------------------------------------


def test_classification_shapes():
    model = make_model(task="classification", n_classes=3)
    ids = random_ids(B=5, T=10)
    assert model(ids).shape == (5, 3)
    assert model(ids, n_layers=1).shape == (5, 3)
    assert model(ids, n_layers=0).shape == (5, 3)
    assert model(ids, n_layers=2, heads_per_layer=[[0], [1, 3]]).shape == (5, 3)


def test_lm_shapes_and_weight_tying():
    model = make_model(task="lm")
    ids = random_ids(B=2, T=7)
    assert model(ids).shape == (2, 7, VOCAB)
    assert model(ids, n_layers=1, heads_per_layer=[[2]]).shape == (2, 7, VOCAB)
    assert model.head.weight is model.tok_emb.weight


def test_forward_rejects_bad_arguments():
    model = make_model()
    ids = random_ids(T=8)
    with pytest.raises(ValueError):
        model(random_ids(T=25))  # longer than max_len
    with pytest.raises(ValueError):
        model(ids, n_layers=4)
    with pytest.raises(ValueError):
        model(ids, n_layers=2, heads_per_layer=[None])  # one entry per executed layer
    with pytest.raises(ValueError):
        model(ids, heads_per_layer=[[0, 0], None, None])  # repeated head
    with pytest.raises(ValueError):
        model(ids, heads_per_layer=[[4], None, None])  # out of range
    with pytest.raises(ValueError):
        model(ids, attention_mask=torch.ones(4, 9))


def test_early_exit_reads_hidden_state_after_that_layer():
    model = make_model()
    ids = random_ids()
    pad = model.padding_mask(ids)
    x = model.embed(ids)
    x = model.run_layers(x, pad, 0, 1)
    x = model.run_layers(x, pad, 1, 2)
    expected = model.head_logits(x, pad)
    torch.testing.assert_close(model(ids, n_layers=2), expected, rtol=0, atol=0)
    assert not torch.allclose(model(ids, n_layers=2), model(ids))


# -- FLOPs: analytic vs FlopCounterMode ------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, T, n_layers, heads",
    [
        (dict(task="classification"), 12, None, None),
        (dict(task="classification", n_classes=5, d_ffn=96), 24, 1, None),
        (dict(task="classification"), 16, 2, [[0, 2], [3]]),
        (dict(task="classification"), 16, 3, [[], [1, 2, 3], None]),
        (dict(task="lm"), 12, None, None),
        (dict(task="lm"), 20, 2, [[1], [0, 1, 2, 3]]),
        (dict(task="lm", d_model=48, n_heads=6, n_layers=2), 9, 0, None),
    ],
)
def test_flops_per_sample_matches_flop_counter(overrides, T, n_layers, heads):
    model = make_model(attention_impl="math", **overrides)
    ids = random_ids(B=3, T=T)
    measured = count_flops_torch(model, ids, n_layers=n_layers, heads_per_layer=heads)
    counts = None if heads is None else [model.config.n_heads if h is None else len(h) for h in heads]
    analytic = flops_per_sample(model.config, T, n_layers=n_layers, heads_per_layer=counts)
    assert measured > 0
    assert abs(analytic - measured) / measured < 0.02


def test_count_flops_torch_switches_sdpa_to_math_and_restores():
    model = make_model(attention_impl="sdpa").train()
    ids = random_ids()
    assert count_flops_torch(model, ids) == flops_per_sample(model.config, ids.shape[1])
    assert all(b.attn.attention_impl == "sdpa" for b in model.blocks)
    assert model.training


def test_flops_per_sample_fewer_heads_and_layers_cost_less():
    cfg = make_config()
    full = flops_per_sample(cfg, 16)
    assert flops_per_sample(cfg, 16, n_layers=2) < full
    assert flops_per_sample(cfg, 16, heads_per_layer=[4, 2, 4]) < full
    with pytest.raises(ValueError):
        flops_per_sample(cfg, 16, heads_per_layer=[4, 4])
    with pytest.raises(ValueError):
        flops_per_sample(cfg, 16, heads_per_layer=[5, 4, 4])
    with pytest.raises(ValueError):
        flops_per_sample(cfg, 25)


# -- attention implementations and head slicing ----------------------------------------------------


@pytest.mark.parametrize("task", ["classification", "lm"])
@pytest.mark.parametrize("padded", [False, True])
def test_sdpa_and_math_agree(task, padded):
    sdpa = make_model(task=task, attention_impl="sdpa")
    math_model = make_model(task=task, attention_impl="math")
    math_model.load_state_dict(sdpa.state_dict())
    ids = random_ids(B=3, T=10)
    mask = None
    if padded:
        mask = torch.ones_like(ids)
        mask[0, 6:] = 0
        mask[2, 3:] = 0
    for kwargs in ({}, dict(n_layers=2, heads_per_layer=[[0, 3], [2]])):
        torch.testing.assert_close(sdpa(ids, mask, **kwargs), math_model(ids, mask, **kwargs), rtol=0, atol=1e-5)


def reference_attention_by_masking(attn: MultiHeadAttention, x, attn_mask, heads, causal):
    """Full multi-head attention, then zero the unselected heads' outputs before O (slow path)."""
    B, T, d = x.shape
    H, dh = attn.n_heads, attn.d_head

    def split(t):
        return t.view(B, T, H, dh).transpose(1, 2)  # (B, H, T, dh)

    q, k, v = split(attn.q(x)), split(attn.k(x)), split(attn.v(x))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal and attn_mask is None)
    keep = torch.zeros(H)
    keep[list(heads)] = 1.0
    y = y * keep.view(1, H, 1, 1)  # zero mask: the thing the real code must NOT do
    return attn.o(y.transpose(1, 2).reshape(B, T, d))


@pytest.mark.parametrize("impl", ["sdpa", "math"])
@pytest.mark.parametrize("task", ["classification", "lm"])
def test_head_slicing_matches_masking_reference(impl, task):
    model = make_model(task=task, attention_impl=impl)
    attn = model.blocks[0].attn
    x = torch.randn(3, 9, 32, generator=torch.Generator().manual_seed(2))
    pad = torch.ones(3, 9, dtype=torch.bool)
    pad[1, 5:] = False
    for mask in (None, model._attn_mask(pad, 9)):
        full = attn(x, mask)
        all_heads = attn(x, mask, heads=[0, 1, 2, 3])
        assert torch.equal(full, all_heads)  # same weights, same kernels: bit-identical
        for heads in ([0, 1, 2, 3], [1, 2], [3, 0], [2], []):
            got = attn(x, mask, heads=heads)
            ref = reference_attention_by_masking(attn, x, mask, heads, causal=task == "lm")
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


def test_head_slicing_only_updates_selected_heads():
    model = make_model()
    attn = model.blocks[0].attn
    x = torch.randn(2, 6, 32)
    attn(x, None, heads=[1, 3]).sum().backward()
    dh = attn.d_head
    grad_rows = attn.q.weight.grad.view(4, dh, 32).abs().sum(dim=(1, 2))  # (n_heads,)
    grad_cols = attn.o.weight.grad.view(32, 4, dh).abs().sum(dim=(0, 2))  # (n_heads,)
    for grads in (grad_rows, grad_cols):
        assert grads[0] == 0 and grads[2] == 0
        assert grads[1] > 0 and grads[3] > 0


# -- masking semantics -----------------------------------------------------------------------------


def test_classification_ignores_appended_padding():
    model = make_model(task="classification")
    ids = random_ids(B=3, T=8)
    padded = torch.cat([ids, torch.zeros(3, 5, dtype=torch.long)], dim=1)  # pad_id = 0
    expected = model(ids)
    torch.testing.assert_close(model(padded), expected, rtol=0, atol=1e-5)  # mask from pad_id
    explicit = (padded != 0).long()
    torch.testing.assert_close(model(padded, explicit), expected, rtol=0, atol=1e-5)


def test_classification_all_padding_row_is_finite():
    model = make_model(task="classification")
    ids = random_ids(B=2, T=6)
    ids[1] = 0
    assert torch.isfinite(model(ids)).all()


@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_causal_lm_does_not_see_the_future(impl):
    model = make_model(task="lm", attention_impl=impl)
    ids = random_ids(B=2, T=10)
    changed = ids.clone()
    changed[:, 6] = (changed[:, 6] % (VOCAB - 1)) + 1  # a different non-pad token
    a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 6:], b[:, 6:])
    # with a (left-)padding mask the same holds, and no row is NaN
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    a, b = model(ids, mask), model(changed, mask)
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a[:, :6], b[:, :6], rtol=0, atol=1e-6)


# -- params ----------------------------------------------------------------------------------------


def test_params_counts_match_manual_formula():
    cfg = make_config(task="classification", n_classes=2)
    model = make_model(task="classification", n_classes=2)
    d, f = cfg.d_model, cfg.d_ffn
    per_block = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d
    expected = VOCAB * d + cfg.max_len * d + cfg.n_layers * per_block + 2 * d + (d * 2 + 2)
    assert params_total(model) == expected
    assert params_trainable(model) == expected
    lm = make_model(task="lm")
    # the tied LM head adds no parameters
    assert params_trainable(lm) == params_total(lm) == expected - (d * 2 + 2)


def test_params_trainable_counts_shared_parameter_once():
    model = make_model()
    before_trainable, before_total = params_trainable(model), params_total(model)
    block0, block1 = model.blocks[0], model.blocks[1]
    block_params = sum(p.numel() for p in block1.parameters())
    for module0, module1 in zip(block0.modules(), block1.modules()):
        for name, p in list(module1.named_parameters(recurse=False)):
            setattr(module1, name, getattr(module0, name))  # real sharing: same Parameter
    assert params_trainable(model) == before_trainable - block_params
    assert params_total(model) == before_total - block_params


def test_params_frozen_count_in_total_only():
    model = make_model()
    model.tok_emb.weight.requires_grad_(False)
    assert params_total(model) - params_trainable(model) == model.tok_emb.weight.numel()


# -- latency ---------------------------------------------------------------------------------------


def test_latency_ms_is_positive_per_sample_and_restores_mode():
    model = make_model().train()
    ids = random_ids(B=3, T=8)
    ms = latency_ms(model, ids, batch_size=8, repeats=3, warmup=1)
    assert isinstance(ms, float) and 0 < ms < 1000
    assert model.training
    gated = latency_ms(model, ids, batch_size=2, repeats=2, warmup=0, forward_kwargs={"n_layers": 1})
    assert gated > 0
    with pytest.raises(ValueError):
        latency_ms(model, ids, batch_size=0)


# -- training --------------------------------------------------------------------------------------


def test_tiny_classifier_overfits_random_labels():
    torch.manual_seed(0)
    model = Transformer(make_config(n_layers=2, n_heads=2, dropout=0.0, max_len=12)).train()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (32, 12), generator=g)
    labels = torch.randint(0, 2, (32,), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(100):
        loss = F.cross_entropy(model(ids), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 0.5 * math.log(2)
    assert losses[-1] < 0.1 * losses[0]


# -- trial config -> model config, known costs -----------------------------------------------------


def test_trial_config_merges_defaults_fixed_and_searched_values():
    from archsearch.models.config import DEFAULTS, trial_config

    cfg = trial_config({"n_layers": 3, "lr": None, "gamma": 0.5}, {"n_layers": 1, "lr": 5e-4})
    assert cfg["n_layers"] == 3  # searched beats fixed
    assert cfg["lr"] == 5e-4  # an inactive (None) searched value leaves the fixed one
    assert cfg["gamma"] == 0.5 and cfg["d_model"] == DEFAULTS["d_model"]
    assert trial_config({}) == DEFAULTS and trial_config({}) is not DEFAULTS


def test_model_config_reads_data_and_ffn_width():
    from types import SimpleNamespace

    from archsearch.models.config import model_config, trial_config

    data = SimpleNamespace(vocab_size=300, max_len=20, pad_id=1, task="classification", n_classes=3)
    mcfg = model_config(trial_config({"d_model": 48, "n_heads": 4, "d_ffn_mult": 2.5}), data)
    assert (mcfg.vocab_size, mcfg.max_len, mcfg.pad_id, mcfg.n_classes) == (300, 20, 1, 3)
    assert (mcfg.d_model, mcfg.d_ffn, mcfg.n_heads) == (48, 120, 4)
    assert model_config(trial_config({"d_ffn": 70}), data).d_ffn == 70  # an explicit width wins
    lm = SimpleNamespace(vocab_size=65, max_len=16, pad_id=0, task="lm", n_classes=None)
    assert model_config(trial_config({}), lm).task == "lm"
    with pytest.raises(ValueError):
        model_config(trial_config({"d_model": 30, "n_heads": 4}), data)


def test_trim_padding_cuts_to_the_last_real_column():
    from archsearch.models.config import trim_padding

    ids = torch.arange(12).view(2, 6)
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0]], dtype=torch.bool)  # (2, 6)
    t_ids, t_mask = trim_padding(ids, mask)
    assert torch.equal(t_ids, ids[:, :4]) and torch.equal(t_mask, mask[:, :4])
    none = torch.zeros(3, 5, dtype=torch.bool)
    assert trim_padding(torch.zeros(3, 5), none)[1].shape == (3, 1)  # at least one column
    full = torch.ones(2, 5, dtype=torch.bool)
    assert trim_padding(ids[:, :5], full)[0].shape == (2, 5)


@pytest.fixture(scope="module")
def mixed_length_data(cache_dir):
    """Real Rotten Tomatoes data whose validation split is its 256 shortest sentences, then 100
    sentences of ``max_len`` tokens: the first evaluation batch runs trimmed, the second at full
    length."""
    import dataclasses

    from archsearch.data import prepare

    data = prepare("rotten_tomatoes_sentences", vocab_size=1000, max_len=32)
    v = data.validation
    lengths = v.attention_mask.sum(1)  # (N,)
    short = lengths.argsort(stable=True)[:256].sort().values
    long = (lengths == 32).nonzero().flatten()[:100]
    assert int(lengths[short].max()) < 32 and len(long) == 100
    idx = torch.cat([short, long])
    val = dataclasses.replace(v, input_ids=v.input_ids[idx], attention_mask=v.attention_mask[idx],
                              labels=v.labels[idx])
    return dataclasses.replace(data, data={**data.data, "validation": val})


def test_eval_lengths_are_the_trainables_validation_batches(mixed_length_data, device):
    from archsearch.models.config import eval_lengths
    from archsearch.tune.trainable import TrialLoop

    lengths = eval_lengths(mixed_length_data)
    assert lengths[1] == (32, 100) and lengths[0] == (int(mixed_length_data.validation.lengths[:256].max()), 256)
    assert lengths[0][0] < 32
    loop = TrialLoop({"n_layers": 1, "d_model": 16, "n_heads": 2}, mixed_length_data,
                     {"epochs": 1, "device": str(device)})
    assert [(x.shape[1], x.shape[0]) for x, _, _ in loop.eval_batches()] == lengths
    assert [(T, n) for T, n in eval_lengths(mixed_length_data, 100)] == \
        [(x.shape[1], x.shape[0]) for x, _, _ in loop.eval_batches(batch_size=100)]
    lm = type("LM", (), {"task": "lm", "max_len": 24})()
    assert eval_lengths(lm) == [(24, 1)]


def test_known_costs_equal_what_a_static_trial_reports(mixed_length_data, device):
    import pickle

    cloudpickle = pytest.importorskip("cloudpickle")
    from archsearch.dynamic.base import TrialContext
    from archsearch.models.config import model_config, trial_config
    from archsearch.dynamic.known_costs import known_costs_fn
    from archsearch.tune.trainable import TrialLoop

    settings = {"epochs": 1, "batch_size": 64, "seed": 0, "latency_batch_size": 4,
                "fixed": {"d_ffn_mult": 2}, "device": str(device)}
    cost_fn = known_costs_fn(mixed_length_data, settings["fixed"])
    for cfg in ({"n_layers": 2, "d_model": 32, "n_heads": 2},
                {"n_layers": 1, "d_model": 48, "n_heads": 4, "d_ffn": 80}):
        loop = TrialLoop(cfg, mixed_length_data, settings)
        assert isinstance(loop, TrialContext)
        reported = loop.evaluate()
        known = cost_fn(cfg)
        assert known["flops_per_sample"] == pytest.approx(reported["flops_per_sample"], rel=1e-6)
        assert known["params_total"] == reported["params_total"]
        assert known["params_trainable"] == reported["params_trainable"]
        # trimmed batches: cheaper than the same model at full max_len
        mcfg = model_config(trial_config(cfg, settings["fixed"]), mixed_length_data)
        assert known["flops_per_sample"] < flops_per_sample(mcfg, 32)
    assert cost_fn(cfg) == known and cost_fn(cfg) is not cost_fn(cfg)  # cached, returned as copies
    blob = cloudpickle.dumps(cost_fn)  # how Ray ships it: the dataset must not travel along
    assert len(blob) < 20_000, len(blob)
    assert pickle.loads(blob)(cfg) == known
