"""Per-exit classifiers (``exit_heads: true``; PABEE / DeeBERT internal classifiers): each exit
below the last reads its own head, the deepest keeps the model's head, and the strategies that
train every exit (DHT, the depth predictor) create them so that the optimizer trains them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from archsearch.dynamic.depth.dht import DHTGating
from archsearch.dynamic.depth.predictor import DepthPredictorGating
from archsearch.models.transformer import Transformer, TransformerConfig


def _model(task="classification", device="cpu"):
    """A tiny eval-mode model and a batch, drawn on the CPU from seed 0, moved to ``device``."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=60, max_len=16, n_layers=4, d_model=32, n_heads=4, d_ffn=64,
                            dropout=0.0, task=task)
    x = torch.randint(1, 60, (6, 10))
    return Transformer(cfg).to(device).eval(), x.to(device), torch.ones(6, 10, dtype=torch.bool, device=device)


def test_each_exit_reads_its_own_head_and_the_deepest_keeps_the_model_head(device):
    model, x, mask = _model(device=device)
    full = model(x, mask)
    shared = [model(x, mask, n_layers=k) for k in (1, 2, 3)]
    model.add_exit_heads([1, 2, 3, 4])
    assert sorted(model.exit_heads.keys()) == ["1", "2", "3"]
    assert all(p.device == x.device for p in model.exit_heads.parameters())  # made where the model is
    torch.testing.assert_close(model(x, mask), full)  # depth 4 = the model's own head
    with torch.no_grad():
        for k in ("1", "2", "3"):
            model.exit_heads[k].weight.zero_()
            model.exit_heads[k].bias.copy_(torch.tensor([1.0, -1.0]))
    for k, before in zip((1, 2, 3), shared):
        out = model(x, mask, n_layers=k)  # forward(n_layers=k) is head_logits(depth=k)
        assert not torch.allclose(out, before)
        torch.testing.assert_close(out, torch.tensor([[1.0, -1.0]], device=device).expand(6, 2))
    pad = model.padding_mask(x, mask)
    h = model.run_layers(model.embed(x), pad, 0, 2)
    torch.testing.assert_close(model.head_logits(h, pad, depth=2), model(x, mask, n_layers=2))
    torch.testing.assert_close(model.head_logits(h, pad), shared[1])  # no depth: the model head


@pytest.mark.parametrize("own_heads", [True, False])
def test_every_exit_read_at_once_gives_each_exits_head_logits(device, own_heads):
    """``exits_logits`` (one stacked LayerNorm, pooling and batched product; training's path)
    equals ``head_logits`` exit by exit, with padding, each exit's own head or the shared one,
    and its gradients reach each head (a broken variant that gives every exit the deepest head
    fails with own heads)."""
    from archsearch.dynamic.depth.exits import read_exits

    model, x, mask = _model(device=device)
    mask[:3, 6:] = False  # padded rows: the pooling must skip their pads
    if own_heads:
        model.add_exit_heads([1, 2, 3, 4])
    pad = model.padding_mask(x, mask)
    hs, h = [], model.embed(x)
    for k in range(4):
        h = model.run_layers(h, pad, k, k + 1)
        hs.append(h)
    depths = [1, 2, 3, 4]
    got = model.exits_logits(hs, pad, depths)  # (K, B, C)
    assert got.shape == (4, 6, 2) and got.dtype == torch.float32
    for k, d in enumerate(depths):
        torch.testing.assert_close(got[k], model.head_logits(hs[k], pad, depth=d), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.stack(read_exits(model, hs, None, depths)),
                               torch.stack([model.head_logits(hk, None, depth=d) for hk, d in zip(hs, depths)]),
                               rtol=1e-5, atol=1e-6)
    got.sum().backward()
    heads = [model.exit_heads[str(d)] for d in (1, 2, 3)] if own_heads else [model.head]
    assert all(hd.weight.grad is not None and hd.weight.grad.abs().sum() > 0 for hd in heads)
    lm, _, _ = _model(task="lm")
    with pytest.raises(ValueError, match="classification"):
        lm.exits_logits([torch.zeros(1, 2, 32)], None, [1])


def test_lm_keeps_its_shared_tied_head_and_bad_depths_raise():
    model, _, _ = _model(task="lm")
    model.add_exit_heads([1, 2])
    assert model.exit_heads is None
    clf, _, _ = _model()
    with pytest.raises(ValueError, match="exit depth 5"):
        clf.add_exit_heads([1, 5])


@pytest.mark.parametrize("cls,cfg,depths", [
    (DHTGating, {"n_fixed": 1}, ["1", "2", "3"]),
    (DepthPredictorGating, {"min_layers": 2}, ["2", "3"]),
])
def test_strategies_create_exit_heads_unless_told_not_to(cls, cfg, depths, device):
    model, _, _ = _model(device=device)
    cls(model, {**cfg, "exit_heads": False}, {})
    assert model.exit_heads is None  # the shared head: the old default, reachable by name
    model, _, _ = _model(device=device)
    cls(model, dict(cfg), {})  # default: a classifier per exit (measured best in the development runs)
    assert sorted(model.exit_heads.keys()) == depths
    names = {n for n, _ in model.named_parameters()}
    assert {f"exit_heads.{d}.weight" for d in depths} <= names  # the optimizer's parameters
    assert all(p.device.type == device.type for p in model.exit_heads.parameters())


def test_the_stacked_exit_terms_give_the_per_exit_losses():
    """:func:`exit_terms` (every exit's per-sample loss and KD in one pass) and the per-exit path
    (taken for a loss without ``reduction``) give the same all-exit losses, with and without a
    teacher and label smoothing, for every reduction; the per-sample terms average to the
    per-exit ones; LM logits and a loss without ``reduction`` are not stacked."""
    import torch.nn.functional as F

    from archsearch.dynamic.depth.exits import all_exit_loss, distill, exit_terms, per_sample_ce, per_sample_ce_of_exits

    torch.manual_seed(2)
    exits = [torch.randn(6, 4, requires_grad=True) for _ in range(5)]
    y = torch.randint(0, 4, (6,))
    teacher = torch.randn(6, 4)

    def smooth(logits, y, reduction="mean"):
        return F.cross_entropy(logits, y, label_smoothing=0.1, reduction=reduction)

    for fn in (F.cross_entropy, smooth):
        for t in (None, teacher):
            loss, kd = exit_terms(exits, y, fn, t)
            assert loss.shape == kd.shape == (5, 6)
            for k, e in enumerate(exits):
                torch.testing.assert_close(loss[k].mean(), fn(e, y))
                torch.testing.assert_close(kd[k].mean(), distill(e, exits[-1] if t is None else t))
            for r in ("mean", "sum", "equal"):
                got = all_exit_loss(exits, y, fn, r, teacher=t)
                ref = all_exit_loss(exits, y, lambda a, b, fn=fn: fn(a, b), r, teacher=t)  # no reduction: per exit
                for a, b in zip(got, ref):
                    torch.testing.assert_close(a, b)
                grads = torch.autograd.grad(sum(got), exits)
                ref_grads = torch.autograd.grad(sum(ref), exits)
                for a, b in zip(grads, ref_grads):
                    torch.testing.assert_close(a, b)
    assert float(exit_terms(exits, y, F.cross_entropy)[1][-1].abs().max()) == 0.0  # the deepest exit: no KD
    assert exit_terms(exits, y, lambda a, b: F.cross_entropy(a, b)) is None
    assert exit_terms([torch.randn(2, 3, 7)], torch.randint(0, 7, (2, 3)), F.cross_entropy) is None
    table = per_sample_ce_of_exits(exits, y)  # (B, K)
    assert table.shape == (6, 5)
    torch.testing.assert_close(table[:, 2], per_sample_ce(exits[2], y))


def test_all_exit_loss_averages_or_sums_the_shallow_exits_and_both_strategies_use_it(device):
    import torch.nn.functional as F

    from archsearch.dynamic.depth.exits import all_exit_loss, distill

    torch.manual_seed(1)
    exits = [torch.randn(5, 3) for _ in range(4)]
    y = torch.randint(0, 3, (5,))
    parts = [(F.cross_entropy(e, y) + distill(e, exits[-1])) / 2 for e in exits[:-1]]
    deep, mean = all_exit_loss(exits, y, F.cross_entropy, "mean")
    _, total = all_exit_loss(exits, y, F.cross_entropy, "sum")
    torch.testing.assert_close(deep, F.cross_entropy(exits[-1], y))
    torch.testing.assert_close(mean, sum(parts) / 3)
    torch.testing.assert_close(total, sum(parts))
    torch.testing.assert_close(all_exit_loss(exits, y, F.cross_entropy, "equal")[1], 2 * sum(parts))
    assert float(all_exit_loss(exits[-1:], y, F.cross_entropy, "sum")[1]) == 0.0
    with pytest.raises(ValueError, match="exit_loss"):
        all_exit_loss(exits, y, F.cross_entropy, "max")
    # the strategies read the key: sum gives a larger loss than mean on the same batch
    model, x, mask = _model(device=device)
    yb = torch.randint(0, 2, (6,)).to(device)
    for cls, cfg in ((DHTGating, {"flops_budget": 0.5, "dht_warmup_steps": 5}),
                     (DepthPredictorGating, {"flops_budget": 0.5, "depth_warmup_steps": 5})):
        losses = {r: float(cls(model, {**cfg, "exit_loss": r}, {"seed": 0}).training_loss(x, mask, yb, F.cross_entropy).detach())
                  for r in ("mean", "sum", "equal")}
        assert losses["equal"] > losses["sum"] > losses["mean"]
        with pytest.raises(ValueError, match="exit_loss"):
            cls(model, {**cfg, "exit_loss": "max"}, {"seed": 0})


def test_depth_predictor_supervision_labels_the_shallowest_agreeing_exit_and_learns_it(device):
    import torch.nn.functional as F

    logits = [torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]),  # exit 1 predicts 0, 1, 0
              torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]]),  # exit 2 predicts 1, 1, 0
              torch.tensor([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]])]  # deepest predicts 1, 1, 1
    assert DepthPredictorGating.agreement_targets(logits).tolist() == [1, 0, 2]
    model, x, mask = _model(device=device)
    model.train()
    y = torch.randint(0, 2, (6,)).to(device)
    g = DepthPredictorGating(model, {"depth_supervision": 1.0, "gamma": 0.0, "depth_warmup_steps": 0}, {"seed": 0})
    with torch.no_grad():
        target = g.agreement_targets(g.exit_logits(x, mask))
    opt = torch.optim.Adam(g.predictor.parameters(), lr=1e-2)  # the trunk stays fixed: targets too
    for _ in range(60):
        opt.zero_grad()
        g.training_loss(x, mask, y, F.cross_entropy).backward()
        opt.step()
    with torch.no_grad():
        _, _, depth_logits = g._front(x, mask)
    assert depth_logits.argmax(-1).tolist() == target.tolist()
    with pytest.raises(ValueError, match="depth_supervision"):
        DepthPredictorGating(model, {"depth_supervision": 1.0, "depth_all_exits": False}, {"seed": 0})


def test_dht_exit_context_adds_the_first_exits_confidence_to_the_bandit_context(device):
    model, x, mask = _model(device=device)
    once = {"flops_budget": 0.5, "dht_routing": "once"}
    plain = DHTGating(model, {**once, "dht_exit_context": False}, {"seed": 0})
    ctx = DHTGating(model, {**once, "dht_exit_context": True}, {"seed": 0})
    h, pad = ctx._trunk(x, mask)
    X0, X = plain._context(h, pad), ctx._context(h, pad)
    assert X0.shape == (6, 17) and X.shape == (6, 19) and ctx.lin.dim == 19
    np.testing.assert_allclose(X[:, :16], X0[:, :16])
    np.testing.assert_allclose(X[:, -1], 1.0)  # the bias column stays last
    with torch.no_grad():
        p = model.head_logits(h, pad, depth=1).softmax(-1)  # (6, 2)
    np.testing.assert_allclose(X[:, 16], p.max(-1).values.cpu().numpy(), rtol=1e-5)
    ent = -(p * p.log()).sum(-1) / np.log(2)
    np.testing.assert_allclose(X[:, 17], ent.cpu().numpy(), rtol=1e-4)
