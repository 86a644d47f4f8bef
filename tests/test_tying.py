"""Dynamic layer tying: real sharing, untying, the agent's action space, the optimizer following
every change, the Q-update on a tiny MDP, and a checkpoint round trip on the Shakespeare LM."""

import itertools

import pytest
import torch

from archsearch.data import prepare
from archsearch.dynamic import tying_class
from archsearch.dynamic.tying import (
    AllTying,
    EveryKTying,
    RLTying,
    TyingAgent,
    apply_tying_map,
    check_map,
    next_map,
    reward_from_loss,
    set_layer,
    sync_optimizer,
    tying_map,
)
from archsearch.models import costs
from archsearch.models.transformer import Transformer, TransformerConfig
from archsearch.tune.trainable import TrialLoop

torch.set_num_threads(1)

TINY = {"n_layers": 4, "d_model": 32, "n_heads": 2, "d_ffn_mult": 2, "dropout": 0.0, "lr": 3e-3,
        "warmup_steps": 2}
SETTINGS = {"epochs": 2, "steps_per_epoch": 6, "batch_size": 8, "seed": 0, "eval_blocks": 16,
            "latency_batch_size": 4}


@pytest.fixture(scope="module")
def data():
    return prepare("shakespeare", max_len=32)


def tiny_model(n_layers=4):
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=20, max_len=16, n_layers=n_layers, d_model=16,
                                         n_heads=2, d_ffn=32, dropout=0.0, task="lm"))


def block_params(model, i):
    return list(model.blocks[i].parameters())


def assert_optimizer_consistent(loop):
    """Each distinct trainable tensor exactly once in the optimizer, no state for anything else."""
    in_opt = [p for g in loop.opt.param_groups for p in g["params"]]
    trainable = loop.trainable_parameters()
    assert len({id(p) for p in in_opt}) == len(in_opt)  # nothing twice
    assert {id(p) for p in in_opt} == {id(p) for p in trainable}
    assert {p.data_ptr() for p in in_opt} == {p.data_ptr() for p in trainable}
    assert len({p.data_ptr() for p in in_opt}) == len(in_opt)  # no two entries on one storage
    assert {id(p) for p in loop.opt.state} <= {id(p) for p in in_opt}  # no stale state
    assert sum(p.numel() for p in in_opt) == costs.params_trainable(loop.model)


def test_tied_layers_share_storage_and_parameters_drop():
    model = tiny_model()
    untied = costs.params_trainable(model)
    per_block = sum(p.numel() for p in block_params(model, 0))
    AllTying(model, {}, {})
    assert tying_map(model) == [0, 0, 0, 0]
    for i in range(1, 4):
        for p, q in zip(block_params(model, i), block_params(model, 0), strict=True):
            assert p is q and p.data_ptr() == q.data_ptr()
    assert costs.params_trainable(model) == untied - 3 * per_block
    assert costs.params_total(model) == untied - 3 * per_block
    # a gradient step on the shared tensor is seen by every block
    x = torch.randint(0, 20, (2, 8))
    model(x).sum().backward()
    assert model.blocks[3].ffn.fc1.weight.grad is model.blocks[0].ffn.fc1.weight.grad

    model = tiny_model(5)
    EveryKTying(model, {"tying_k": 2}, {})
    assert tying_map(model) == [0, 0, 2, 2, 4]
    assert model.blocks[3].attn.q.weight.data_ptr() == model.blocks[2].attn.q.weight.data_ptr()
    assert model.blocks[3].attn.q.weight.data_ptr() != model.blocks[1].attn.q.weight.data_ptr()
    with pytest.raises(ValueError, match="tying_k"):
        EveryKTying(tiny_model(), {"tying_k": 0}, {})
    assert tying_class("all") is AllTying and tying_class("rl") is RLTying


def test_untying_makes_independent_copies_with_equal_values():
    model = tiny_model()
    apply_tying_map(model, [0, 0, 0, 0])
    assert set_layer(model, 2, 2)  # untie block 2
    assert tying_map(model) == [0, 0, 2, 0]
    for p, q in zip(block_params(model, 2), block_params(model, 0), strict=True):
        assert p is not q and p.data_ptr() != q.data_ptr()
        assert torch.equal(p, q) and p.requires_grad
    with torch.no_grad():
        model.blocks[2].attn.v.weight.add_(1.0)
    assert not torch.equal(model.blocks[2].attn.v.weight, model.blocks[0].attn.v.weight)
    assert model.blocks[3].attn.v.weight is model.blocks[0].attn.v.weight  # others untouched
    assert not set_layer(model, 2, 2)  # already independent: nothing changes
    # block 1 owns nothing; re-tying block 3 to block 2 uses block 2's tensors
    assert set_layer(model, 3, 2) and tying_map(model) == [0, 0, 2, 2]
    assert model.blocks[3].attn.v.weight is model.blocks[2].attn.v.weight
    with pytest.raises(ValueError):
        set_layer(model, 1, 2)  # only earlier blocks (or itself)


def test_next_map_matches_the_model_and_maps_are_validated():
    """The pure transition function agrees with what set_layer does to a real model."""
    model = tiny_model()
    rng = torch.Generator().manual_seed(1)
    for _ in range(60):
        i = int(torch.randint(1, 4, (), generator=rng))
        j = int(torch.randint(0, i + 1, (), generator=rng))
        expected = next_map(tying_map(model), i, j)
        set_layer(model, i, j)
        assert tying_map(model) == expected
        assert check_map(expected, 4) == expected
    for bad in ([0, 0, 1, 0], [1, 1, 2, 3], [0, 0, 3, 3], [0, 0]):
        with pytest.raises(ValueError):
            check_map(bad, 4)


def test_agent_only_ties_a_layer_to_itself_or_an_earlier_one():
    model = tiny_model(5)
    rl = RLTying(model, {"tying_every": 1}, {"seed": 3})
    assert tying_map(model) == [0] * 5  # starts with everything tied to block 0
    seen = set()
    for step in range(1, 201):
        layer, before = rl.layer, tying_map(model)
        rl.after_step(step, 2.0 + 0.1 * (step % 7))
        p = rl.pending
        assert p["layer"] == layer and 0 <= p["action"] <= layer
        assert p["state"] == before
        # the model now carries exactly the decided change (and nothing else)
        assert tying_map(model) == next_map(before, layer, p["action"])
        seen.add((layer, p["action"]))
    # exploration reached every legal action of every block (block 0 has no choice)
    assert seen == {(i, j) for i in range(1, 5) for j in range(i + 1)}
    assert rl.sweeps == 50 and rl.agent.epsilon == pytest.approx(0.95 ** 50)
    agent = TyingAgent(4, seed=0, epsilon=0.0)
    for s in ([0, 0, 0, 0], [0, 1, 2, 3], [0, 1, 1, 3]):
        for layer in range(4):
            assert 0 <= agent.act(s, layer) <= layer
    assert reward_from_loss(0.5) == pytest.approx(-1.6487, abs=1e-4)
    assert reward_from_loss(4.0) == -10.0 and reward_from_loss(float("nan")) == -10.0


def test_optimizer_follows_tie_and_untie_changes(data):
    loop = TrialLoop({**TINY, "tying": "all"}, data, SETTINGS)
    assert_optimizer_consistent(loop)
    assert len(loop.opt.param_groups[0]["params"]) == len(list(loop.model.parameters()))
    loop.train_epoch()  # Adam state exists now
    shared = loop.model.blocks[0].ffn.fc1.weight
    step_before = float(loop.opt.state[shared]["step"])
    exp_avg_before = loop.opt.state[shared]["exp_avg"].clone()
    lr_before = loop.opt.param_groups[0]["lr"]
    for i, j in [(2, 2), (3, 2), (1, 1), (3, 3), (2, 0), (1, 0), (3, 1), (3, 3)]:
        if set_layer(loop.model, i, j):
            sync_optimizer(loop)
        assert_optimizer_consistent(loop)
        # surviving parameters keep their Adam state; new copies start without
        assert float(loop.opt.state[shared]["step"]) == step_before
        assert torch.equal(loop.opt.state[shared]["exp_avg"], exp_avg_before)
        assert loop.opt.param_groups[0]["lr"] == pytest.approx(lr_before)
        assert loop.sched.optimizer is loop.opt
    assert tying_map(loop.model) == [0, 0, 0, 3]
    fresh = loop.model.blocks[3].ffn.fc1.weight
    assert fresh not in loop.opt.state
    before = fresh.detach().clone()
    loop.train_epoch()  # training still works on the re-tied model
    assert_optimizer_consistent(loop)
    assert not torch.equal(fresh, before)  # the new copy is trained
    assert loop.opt.state[fresh]["step"] == SETTINGS["steps_per_epoch"]
    assert loop.opt.state[shared]["step"] == step_before + SETTINGS["steps_per_epoch"]

    # the agent itself, deciding at every batch, keeps the optimizer consistent
    rl = TrialLoop({**TINY, "tying": "rl", "tying_every": 1}, data, SETTINGS)
    rl.train_epoch()
    assert rl.tying.decisions == SETTINGS["steps_per_epoch"]
    assert_optimizer_consistent(rl)
    m = rl.evaluate()
    s = tying_map(rl.model)
    assert m["tying_map"] == s and m["n_distinct_layers"] == len(set(s))
    # each block that shares another's weights saves one block of parameters
    untied = costs.known_costs_fn(data)(TINY)["params_trainable"]
    per_block = sum(p.numel() for p in rl.model.blocks[0].parameters())
    assert m["params_trainable"] == untied - (TINY["n_layers"] - len(set(s))) * per_block


def test_q_update_converges_on_a_tiny_deterministic_mdp():
    """States: the canonical tying maps of 3 blocks; the block decided alternates 1, 2, 1, ...;
    reward 1 when the new map is [0, 1, 1] (one extra set of weights shared by blocks 1 and 2),
    else 0. Q* from value iteration; the agent's full-batch TD updates must reach it."""
    L, gamma = 3, 0.9
    states = sorted({tuple(next_map(next_map([0, 0, 0], 1, a), 2, b)) for a in (0, 1) for b in (0, 1, 2)})
    nxt_layer = {1: 2, 2: 1}
    transitions = [(s, i, j) for s in states for i in (1, 2) for j in range(i + 1)]
    next_states = [tuple(next_map(s, i, j)) for s, i, j in transitions]
    rewards = [1.0 if ns == (0, 1, 1) else 0.0 for ns in next_states]
    q_star = {t: 0.0 for t in transitions}
    for _ in range(300):  # value iteration
        v = {(s, i): max(q_star[(s, i, j)] for j in range(i + 1)) for s in states for i in (1, 2)}
        q_star = {t: r + gamma * v[(ns, nxt_layer[t[1]])]
                  for t, r, ns in zip(transitions, rewards, next_states, strict=True)}
    agent = TyingAgent(L, gamma=gamma, seed=0)  # AdamW lr 1e-3
    batch = ([list(s) for s, _, _ in transitions], [i for _, i, _ in transitions],
             [j for _, _, j in transitions], rewards, [list(ns) for ns in next_states],
             [nxt_layer[i] for _, i, _ in transitions])
    for _ in range(1500):
        loss = agent.td_update(*batch)
    assert loss < 1e-3
    err = max(abs(float(agent.q_values(list(s), i)[j]) - q_star[(s, i, j)]) for s, i, j in transitions)
    assert err < 0.05 * max(q_star.values())
    for s, i in itertools.product(states, (1, 2)):  # greedy policy is optimal
        best = max(q_star[(s, i, j)] for j in range(i + 1))
        assert q_star[(s, i, agent.act(list(s), i, greedy=True))] == pytest.approx(best)


def test_checkpoint_round_trip_restores_tying_and_eval_loss(data, tmp_path):
    cfg = {**TINY, "n_layers": 3, "tying": "rl", "tying_every": 2}
    loop = TrialLoop(cfg, data, SETTINGS)
    loop.train_epoch()
    if apply_tying_map(loop.model, [0, 1, 1]):  # a map with both a tie and an untied block
        sync_optimizer(loop)
    saved_map = tying_map(loop.model)
    loop.save(str(tmp_path))
    before = loop.evaluate()

    restored = TrialLoop(cfg, data, SETTINGS)
    assert tying_map(restored.model) == [0, 0, 0]
    restored.load(str(tmp_path))
    assert tying_map(restored.model) == saved_map
    for i, j in enumerate(saved_map):  # real sharing again, not equal copies
        assert restored.model.blocks[i].attn.q.weight is restored.model.blocks[j].attn.q.weight
    after = restored.evaluate()
    assert after["val_loss"] == pytest.approx(before["val_loss"], abs=1e-6)
    assert after["params_trainable"] == before["params_trainable"]
    assert_optimizer_consistent(restored)
    a, b = loop.tying, restored.tying
    assert (b.agent.epsilon, b.layer, b.decisions, b.pending) == \
        (a.agent.epsilon, a.layer, a.decisions, a.pending)
    for k, v in a.agent.q.state_dict().items():
        assert torch.equal(v, b.agent.q.state_dict()[k])
    # training continues identically (same data RNG, agent RNG, Adam state; no dropout)
    a_loss, b_loss = loop.train_epoch(), restored.train_epoch()
    assert b_loss == pytest.approx(a_loss, rel=1e-5)
    assert tying_map(restored.model) == tying_map(loop.model)


def test_tying_space_loads():
    from pathlib import Path

    from archsearch.space import load_space

    space = load_space(Path(__file__).resolve().parents[1] / "search_spaces" / "shakespeare_tying.yaml")
    assert "rl" in space.params["tying"].choices
