"""``tying: merge`` (issue 67): a tie that keeps what was learned (mean weights, mean AdamW
moments), candidates scored as the merged model scores, one merge per check, never undone."""

import pytest
import torch

from archsearch.data import prepare
from archsearch.dynamic.tying.maps import groups_of, merge_blocks, tying_map
from archsearch.models import costs
from archsearch.tune.trainable import TrialLoop

torch.set_num_threads(1)

TINY = {"n_layers": 4, "d_model": 32, "n_heads": 2, "d_ffn_mult": 2, "dropout": 0.0, "lr": 3e-3,
        "warmup_steps": 2}
SETTINGS = {"epochs": 3, "steps_per_epoch": 4, "batch_size": 8, "seed": 0, "eval_blocks": 16,
            "latency_batch_size": 4}


@pytest.fixture(scope="module")
def data():
    return prepare("shakespeare", max_len=32)


@pytest.fixture()
def settings(device):
    return {**SETTINGS, "device": str(device)}


def test_a_merge_takes_the_mean_weights_and_the_mean_moments(data, settings):
    loop = TrialLoop({**TINY, "tying": "none"}, data, settings)
    loop.train_epoch()
    b = loop.model.blocks
    w1, w2 = b[1].attn.q.weight.detach().clone(), b[2].attn.q.weight.detach().clone()
    st1, st2 = (loop.opt.state[b[i].attn.q.weight] for i in (1, 2))
    m1, m2, v1, v2 = st1["exp_avg"].clone(), st2["exp_avg"].clone(), st1["exp_avg_sq"].clone(), st2["exp_avg_sq"].clone()
    untied = costs.params_trainable(loop.model)
    assert merge_blocks(loop.model, [1, 2], loop) == [0, 1, 1, 3]
    q = b[1].attn.q.weight
    assert q is b[2].attn.q.weight  # shared Parameters, not copies
    torch.testing.assert_close(q.detach(), (w1 + w2) / 2)
    st = loop.opt.state[q]
    torch.testing.assert_close(st["exp_avg"], (m1 + m2) / 2)
    torch.testing.assert_close(st["exp_avg_sq"], (v1 + v2) / 2)
    assert costs.params_trainable(loop.model) < untied
    in_opt = [p for g in loop.opt.param_groups for p in g["params"]]
    assert {id(p) for p in in_opt} == {id(p) for p in loop.trainable_parameters()}
    assert {id(p) for p in loop.opt.state} <= {id(p) for p in in_opt}
    loop.train_epoch()  # trains on, tied
    assert tying_map(loop.model) == [0, 1, 1, 3] and b[1].attn.q.weight is b[2].attn.q.weight
    # a group is merged whole: (2, 3) would leave block 1 pointing at a follower
    before = [p.detach().clone() for p in loop.model.parameters()]
    with pytest.raises(ValueError):
        merge_blocks(loop.model, [2, 3], loop)
    assert all(torch.equal(a, p.detach()) for a, p in zip(before, loop.model.parameters()))
    with pytest.raises(ValueError, match="at least 2"):
        merge_blocks(loop.model, [3], loop)


def test_a_candidate_is_scored_by_the_loss_of_the_merged_model(data, settings):
    loop = TrialLoop({**TINY, "tying": "merge", "tying_check_every": 1000}, data, settings)
    loop.train_epoch()
    loss_before = loop.tying.held_out_loss()
    cands = loop.tying.candidate_losses()
    assert [m for m, _ in cands] == [[0, 1], [1, 2], [2, 3]]
    assert loop.tying.held_out_loss() == pytest.approx(loss_before, abs=1e-7)  # the model restored
    members, h = cands[1]
    merge_blocks(loop.model, members, loop)
    assert loop.tying.held_out_loss() == pytest.approx(h, abs=1e-6)


def test_merging_starts_at_the_first_rise_one_merge_per_check_never_undone(data, settings, tmp_path):
    cfg = {**TINY, "tying": "merge", "tying_check_every": 2, "tying_price": 100.0,
           "tying_tentative": False}  # every merge pays
    loop = TrialLoop(cfg, data, settings)
    real = loop.tying.held_out_loss
    scripted = iter([3.0, 2.5, 2.6])  # checks at steps 2, 4, 6: the rise at 6
    loop.tying.held_out_loss = lambda: next(scripted, None) or real()
    loop.train_epoch()  # steps 1-4
    assert loop.tying.merge_start is None and tying_map(loop.model) == [0, 1, 2, 3]
    loop.train_epoch()  # steps 5-8: merging starts at 6, a second merge at 8
    assert loop.tying.merge_start == 6
    assert [s for s, _ in loop.tying.merges] == [6, 8]
    assert len(groups_of(tying_map(loop.model))) == 2
    assert all(len(g) == g[-1] - g[0] + 1 for g in groups_of(tying_map(loop.model)))  # neighbours only
    m = loop.evaluate()
    assert (m["tying_merge_start"], m["tying_merges"], m["n_distinct_layers"]) == (6, 2, 2)
    loop.save(str(tmp_path))
    restored = TrialLoop(cfg, data, settings)
    restored.load(str(tmp_path))
    assert tying_map(restored.model) == tying_map(loop.model)
    assert (restored.tying.merge_start, restored.tying.merges) == (6, loop.tying.merges)
    loop.train_epoch()  # steps 9-12: down to one group, then nothing left to merge
    assert len(groups_of(tying_map(loop.model))) == 1 and len(loop.tying.merges) == 3


def test_a_free_price_merges_only_what_lowers_the_held_out_loss(data, settings):
    cfg = {**TINY, "tying": "merge", "tying_check_every": 2, "tying_price": 0.0, "tying_tentative": False}
    loop = TrialLoop(cfg, data, settings)
    loop.tying.merge_start = 0  # merging from the first check
    loop.tying.held_out_loss = lambda: 1.0  # the current model's loss
    loop.tying.candidate_losses = lambda: [([0, 1], 1.0), ([1, 2], 1.01), ([2, 3], 1.02)]
    loop.train_epoch()
    assert loop.tying.merges == []  # no candidate is strictly better
    loop.tying.candidate_losses = lambda: [([0, 1], 1.0), ([1, 2], 0.99), ([2, 3], 0.98)]
    loop.train_epoch()
    assert [m for _, m in loop.tying.merges][:1] == [[0, 1, 2, 2]]  # the best pair, (2, 3)


def test_untie_clones_the_groups_weights_and_moments(data, settings):
    """Issue 67's untie: each half gets a copy of the merged group's weights and AdamW state
    (not a fresh optimizer), and trains apart from then on."""
    from archsearch.dynamic.tying.maps import untie_groups

    loop = TrialLoop({**TINY, "tying": "none"}, data, settings)
    loop.train_epoch()
    merge_blocks(loop.model, [1, 2], loop)
    loop.train_epoch()
    b = loop.model.blocks
    w, st = b[1].attn.q.weight.detach().clone(), {k: v.clone() for k, v in loop.opt.state[b[1].attn.q.weight].items()}
    assert untie_groups(loop.model, [0, 1, 2, 3], loop) == [0, 1, 2, 3]
    assert b[1].attn.q.weight is not b[2].attn.q.weight
    for i in (1, 2):
        q = b[i].attn.q.weight
        torch.testing.assert_close(q.detach(), w)
        for k in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(loop.opt.state[q][k], st[k])
    assert loop.opt.state[b[1].attn.q.weight]["exp_avg"] is not loop.opt.state[b[2].attn.q.weight]["exp_avg"]
    loop.train_epoch()
    assert not torch.equal(b[1].attn.q.weight, b[2].attn.q.weight)  # apart from then on
    with pytest.raises(ValueError, match="only splits"):
        untie_groups(loop.model, [0, 0, 2, 3], loop)


def test_a_tentative_merge_is_kept_when_the_held_out_score_recovers_else_undone_for_good(data, settings):
    cfg = {**TINY, "tying": "merge", "tying_check_every": 2, "tying_price": 0.0, "tying_tentative": True}
    loop = TrialLoop(cfg, data, settings)  # 12 steps planned: checks at 2, 4, ..., 12
    loop.tying.merge_start = 0
    # checks at 2 (merge 0-1), 4 (kept: 0.9 < 1.0; a verdict, so no new merge), 6 (merge all),
    # 8 (undone: 1.3 >= 1.2), 10 (the one pair left is rejected), 12 (too late for a new merge)
    losses = iter([1.0, 0.9, 1.2, 1.3, 1.0, 0.5])
    loop.tying.held_out_loss = lambda: next(losses)
    cands = {4: [([0, 1], 5.0), ([2, 3], 6.0)], 3: [([0, 1, 2, 3], 5.0)], 2: [([0, 1, 2, 3], 5.0)]}
    loop.tying.candidate_losses = lambda: cands[len(groups_of(tying_map(loop.model)))]
    loop.train_epoch()  # steps 1-4
    assert loop.tying.merges == [(2, [0, 0, 2, 3])] and loop.tying.pending is None
    loop.train_epoch()  # steps 5-8
    assert loop.tying.reverts == [(8, [0, 1, 2, 3])] and tying_map(loop.model) == [0, 0, 2, 3]
    assert (0, 1, 2, 3) in loop.tying.rejected and loop.tying.pending is None
    loop.train_epoch()  # steps 9-12
    assert tying_map(loop.model) == [0, 0, 2, 3] and loop.tying.pending is None
    m = loop.evaluate()
    assert (m["tying_merges"], m["tying_reverts"]) == (1, 1)


def test_a_pending_tentative_merge_survives_a_save(data, settings):
    cfg = {**TINY, "tying": "merge", "tying_check_every": 1000, "tying_tentative": True}
    loop = TrialLoop(cfg, data, settings)
    loop.train_epoch()
    loop.tying.merge_start = 0
    loop.tying.every = 1  # one check by hand, at step 4
    loop.tying.after_step(4, 0.0)
    pending = loop.tying.pending
    assert pending["step"] == 4 and len(groups_of(tying_map(loop.model))) == 3
    restored = TrialLoop(cfg, data, settings)
    restored.tying.load_state_dict(loop.tying.state_dict())
    assert restored.tying.pending == pending and tying_map(restored.model) == tying_map(loop.model)
