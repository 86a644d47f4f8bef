"""Dynamic layer tying: real sharing, untying, the agent's rounds and action space, epsilon and
freezing, the reward deciding the map, the target network, the optimizer following every change,
the Q-update on a tiny MDP, and a checkpoint round trip on the Shakespeare LM."""

import itertools

import pytest
import torch

from archsearch.data import prepare
from archsearch.dynamic import tying_class
from archsearch.dynamic.tying.agent import ImprovementReward, QNetwork, TyingAgent
from archsearch.dynamic.tying.controllers import AllTying, EveryKTying
from archsearch.dynamic.tying.maps import (
    apply_tying_map,
    check_map,
    next_map,
    set_layer,
    sync_optimizer,
    tying_map,
)
from archsearch.dynamic.tying.rl import RLTying
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


@pytest.fixture()
def settings(device):
    """:data:`SETTINGS` on the test device."""
    return {**SETTINGS, "device": str(device)}


def tiny_model(n_layers=4, device="cpu"):
    """A tiny LM initialised on the CPU from seed 0, on ``device``."""
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=20, max_len=16, n_layers=n_layers, d_model=16,
                                         n_heads=2, d_ffn=32, dropout=0.0, task="lm")).to(device)


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


def test_tied_layers_share_storage_and_parameters_drop(device):
    model = tiny_model(device=device)
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
    x = torch.randint(0, 20, (2, 8)).to(device)
    model(x).sum().backward()
    assert model.blocks[3].ffn.fc1.weight.grad is model.blocks[0].ffn.fc1.weight.grad

    model = tiny_model(5, device=device)
    EveryKTying(model, {"tying_k": 2}, {})
    assert tying_map(model) == [0, 0, 2, 2, 4]
    assert model.blocks[3].attn.q.weight.data_ptr() == model.blocks[2].attn.q.weight.data_ptr()
    assert model.blocks[3].attn.q.weight.data_ptr() != model.blocks[1].attn.q.weight.data_ptr()
    with pytest.raises(ValueError, match="tying_k"):
        EveryKTying(tiny_model(), {"tying_k": 0}, {})
    assert tying_class("all") is AllTying and tying_class("rl") is RLTying


def test_untying_makes_independent_copies_with_equal_values(device):
    model = tiny_model(device=device)
    apply_tying_map(model, [0, 0, 0, 0])
    assert set_layer(model, 2, 2)  # untie block 2
    assert tying_map(model) == [0, 0, 2, 0]
    for p, q in zip(block_params(model, 2), block_params(model, 0), strict=True):
        assert p is not q and p.data_ptr() != q.data_ptr()
        assert torch.equal(p, q) and p.requires_grad and p.device == q.device  # copied where it was
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


def test_next_map_matches_the_model_and_maps_are_validated(device):
    """The pure transition function agrees with what set_layer does to a real model."""
    model = tiny_model(device=device)
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


def run_agent(model, seed, steps, loss_of_map, every=1):
    """Drive RLTying on ``model`` (no trial loop) with training losses computed from its map."""
    rl = RLTying(model, {"tying_every": every}, {"seed": seed, "epochs": 1, "steps_per_epoch": steps})
    for step in range(1, steps + 1):
        rl.after_step(step, loss_of_map(tying_map(model)))
    return rl


def test_agent_decides_every_layer_each_round_and_only_legal_ties(device):
    model = tiny_model(5, device=device)
    rl = RLTying(model, {"tying_every": 1}, {"seed": 3, "epochs": 1, "steps_per_epoch": 200})
    assert tying_map(model) == [0] * 5  # starts with everything tied to block 0
    seen = set()
    for step in range(1, 81):  # the exploring rounds (40% of 200)
        before = tying_map(model)
        rl.after_step(step, 2.0 + 0.1 * (step % 7))
        assert [t["layer"] for t in rl.pending] == [1, 2, 3, 4]  # every block, in order
        cur = before
        for t in rl.pending:  # each decision sees the map the earlier ones left
            assert t["state"] == cur and 0 <= t["action"] <= t["layer"]
            cur = next_map(cur, t["layer"], t["action"])
            assert t["next_state"] == cur
            seen.add((t["layer"], t["action"]))
        assert tying_map(model) == cur  # the model carries exactly the decided changes
    assert rl.rounds == 80 and rl.decisions == 80 * 4 and not rl.frozen
    # exploration reached every legal action of every block (block 0 has no choice)
    assert seen == {(i, j) for i in range(1, 5) for j in range(i + 1)}
    assert len(rl.agent.buffer) == 79 * 4  # the last round is rewarded at the next interval
    agent = TyingAgent(4, seed=0, epsilon=0.0)
    for s in ([0, 0, 0, 0], [0, 1, 2, 3], [0, 1, 1, 3]):
        for layer in range(4):
            assert 0 <= agent.act(s, layer) <= layer


def test_epsilon_reaches_005_at_40_percent_then_the_map_freezes(device):
    steps, every = 400, 4  # 100 rounds: 40 exploring, then one greedy round and frozen
    model = tiny_model(4, device=device)
    rl = RLTying(model, {"tying_every": every}, {"seed": 0, "epochs": 2, "steps_per_epoch": steps // 2})
    assert rl.total_rounds == 100 and rl.explore_rounds == 40
    eps = []
    for step in range(1, steps + 1):
        rl.after_step(step, 2.0 + 0.05 * (step % 5))
        if step % every == 0:
            eps.append((step, rl.agent.epsilon, rl.frozen, rl.decisions, tying_map(model)))
    # epsilon decays per decision: 3 decisions a round, 1.0 -> 0.05 over the 120 exploring ones
    by_step = {s: (e, f, d, m) for s, e, f, d, m in eps}
    assert by_step[4][0] == pytest.approx(0.05 ** (3 / 120))
    assert by_step[80][0] == pytest.approx(0.05 ** 0.5)  # halfway through exploration
    assert by_step[160][0] == pytest.approx(0.05) and not by_step[160][1]  # 40% of the run
    assert by_step[164][1] and by_step[164][2] == 41 * 3  # the greedy final round, then frozen
    final = by_step[164][3]
    for s, (e, f, d, m) in by_step.items():
        if s >= 164:
            assert f and d == 41 * 3 and m == final and e == pytest.approx(0.05)
    assert rl.metrics()["tying_map"] == final
    with pytest.raises(ValueError, match="tying_explore_frac"):
        RLTying(tiny_model(), {"tying_explore_frac": 0.0}, {"epochs": 1})
    # the greedy final round is left even at tying_explore_frac 1 (before: every round explored,
    # and the final map was an exploring round's, never frozen)
    whole = RLTying(tiny_model(), {"tying_every": 4, "tying_explore_frac": 1.0},
                    {"seed": 0, "epochs": 1, "steps_per_epoch": 16})
    for step in range(1, 17):
        whole.after_step(step, 3.0 - 0.01 * step)
    assert (whole.total_rounds, whole.explore_rounds, whole.rounds, whole.frozen) == (4, 3, 3, True)


def test_the_reward_decides_the_final_map(device):
    """Losses that favour a known map lead the agent to it; constant losses (reward 0) leave a
    different map for the same seed (same exploration RNG, so only the reward differs)."""
    target = [0, 1, 1, 3]

    def favour(s):  # 0.1 nats per block tied differently from the target
        return 2.0 + 0.1 * sum(a != b for a, b in zip(s, target, strict=True))

    const_hits = 0
    for seed in range(3):
        good = run_agent(tiny_model(4, device=device), seed, 800, favour)
        const = run_agent(tiny_model(4, device=device), seed, 800, lambda s: 2.0)
        assert good.frozen and const.frozen
        assert tying_map(good.model) == target, seed
        assert const.agent.buffer.rewards[:len(const.agent.buffer)].abs().max() == 0.0
        const_hits += tying_map(const.model) == target
    assert const_hits <= 1  # without a reward the target is a 1-in-15 accident


def test_reward_is_detrended_and_normalised():
    rew = ImprovementReward(beta=0.9)
    assert rew(2.0) is None  # the first interval sets the baseline
    assert [rew(2.0) for _ in range(5)] == [0.0] * 5  # constant loss: no reward
    # a steady downward trend earns ~nothing once the trend is learnt; a jump up is punished
    rs = [rew(2.0 - 0.01 * k) for k in range(1, 200)]
    assert abs(sum(rs[-50:]) / 50) < 0.3
    assert rew(2.5) == pytest.approx(-3.0)  # clipped
    assert rew(float("nan")) == -3.0


def test_td_target_uses_the_target_network():
    agent = TyingAgent(3, gamma=0.9, seed=0, target_sync=1000)
    with torch.no_grad():  # target network: constant outputs 0..5; online network differs
        agent.q_target.net[2].weight.zero_()
        agent.q_target.net[2].bias.copy_(torch.arange(6.0))
        agent.q.net[2].bias.add_(100.0)
    states, layers, actions = [[0, 0, 0], [0, 1, 1]], [1, 2], [0, 2]
    rewards, next_states, next_layers = [1.0, -1.0], [[0, 1, 1], [0, 0, 2]], [2, 1]
    target = agent.td_target(rewards, next_states, next_layers)
    # block 2's outputs are 3, 4, 5 -> max 5; block 1's are 1, 2 -> max 2
    assert target.tolist() == pytest.approx([1.0 + 0.9 * 5.0, -1.0 + 0.9 * 2.0])
    with torch.no_grad():
        q = agent.q(agent.encode(states))[[0, 1], [1 + 0, 3 + 2]]
    loss = agent.td_update(states, layers, actions, rewards, next_states, next_layers)
    assert loss == pytest.approx(float(((q - target) ** 2).mean()), rel=1e-5)
    # the target network only changes at a sync
    assert torch.equal(agent.q_target.net[2].bias, torch.arange(6.0))
    assert torch.equal(agent.td_target(rewards, next_states, next_layers), target)
    agent.target_sync = agent.updates + 1
    agent.td_update(states, layers, actions, rewards, next_states, next_layers)
    for k, v in agent.q.state_dict().items():
        assert torch.equal(v, agent.q_target.state_dict()[k])
    # replay draws its minibatches from the buffer
    agent.remember([0, 0, 0], 1, 1, 0.5, [0, 1, 0], 2)
    assert len(agent.buffer) == 1 and agent.replay(2) is not None


def test_optimizer_follows_tie_and_untie_changes(data, settings):
    loop = TrialLoop({**TINY, "tying": "all"}, data, settings)
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
    rl = TrialLoop({**TINY, "tying": "rl", "tying_every": 1}, data, settings)
    rl.train_epoch()  # 12 steps in all: 5 exploring rounds, the greedy one, frozen
    assert rl.tying.decisions == SETTINGS["steps_per_epoch"] * (TINY["n_layers"] - 1)
    assert rl.tying.frozen
    assert_optimizer_consistent(rl)
    m = rl.evaluate()
    s = tying_map(rl.model)
    assert m["tying_map"] == s and m["n_distinct_layers"] == len(set(s))
    # each block that shares another's weights saves one block of parameters
    untied = costs.static_costs_fn(data)(TINY).costs["params_trainable"]
    per_block = sum(p.numel() for p in rl.model.blocks[0].parameters())
    assert m["params_trainable"] == untied - (TINY["n_layers"] - len(set(s))) * per_block


def test_q_update_converges_on_a_tiny_deterministic_mdp():
    """States: the canonical tying maps of 3 blocks; the block decided alternates 1, 2, 1, ...;
    reward 1 when the new map is [0, 1, 1] (one extra set of weights shared by blocks 1 and 2),
    else 0. Q* from value iteration; the agent's full-batch TD updates
    (target network synced every 10) must reach it."""
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
    agent = TyingAgent(L, gamma=gamma, seed=0, target_sync=10)  # AdamW lr 1e-3
    batch = ([list(s) for s, _, _ in transitions], [i for _, i, _ in transitions],
             [j for _, _, j in transitions], rewards, [list(ns) for ns in next_states],
             [nxt_layer[i] for _, i, _ in transitions])
    for _ in range(4000):
        loss = agent.td_update(*batch)
    assert loss < 1e-3
    err = max(abs(float(agent.q_values(list(s), i)[j]) - q_star[(s, i, j)]) for s, i, j in transitions)
    assert err < 0.05 * max(q_star.values())
    for s, i in itertools.product(states, (1, 2)):  # greedy policy is optimal
        best = max(q_star[(s, i, j)] for j in range(i + 1))
        assert q_star[(s, i, agent.act(list(s), i, greedy=True))] == pytest.approx(best)


def test_checkpoint_round_trip_restores_tying_and_eval_loss(data, tmp_path, settings):
    cfg = {**TINY, "n_layers": 3, "tying": "rl", "tying_every": 2, "tying_explore_frac": 1.0}
    loop = TrialLoop(cfg, data, settings)
    loop.train_epoch()
    if apply_tying_map(loop.model, [0, 1, 1]):  # a map with both a tie and an untied block
        sync_optimizer(loop)
    saved_map = tying_map(loop.model)
    loop.save(str(tmp_path))
    before = loop.evaluate()

    restored = TrialLoop(cfg, data, settings)
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
    assert (b.agent.epsilon, b.rounds, b.decisions, b.pending, b.frozen, b.losses) == \
        (a.agent.epsilon, a.rounds, a.decisions, a.pending, a.frozen, a.losses)
    assert b.reward.state_dict() == a.reward.state_dict()
    for net in ("q", "q_target"):
        for k, v in getattr(a.agent, net).state_dict().items():
            assert torch.equal(v, getattr(b.agent, net).state_dict()[k])
    assert len(b.agent.buffer) == len(a.agent.buffer) > 0
    assert torch.equal(b.agent.buffer.rewards, a.agent.buffer.rewards)
    # training continues identically (same data RNG, agent RNG, Adam state; no dropout)
    a_loss, b_loss = loop.train_epoch(), restored.train_epoch()
    assert b_loss == pytest.approx(a_loss, rel=1e-5)
    assert tying_map(restored.model) == tying_map(loop.model)


def test_tying_space_loads():
    from pathlib import Path

    from archsearch.space import load_space

    space = load_space(Path(__file__).resolve().parents[1] / "search_spaces" / "shakespeare_tying.yaml")
    assert "rl" in space.params["tying"].choices


def test_a_budget_of_distinct_blocks_is_never_exceeded_and_bounds_the_td_max(device):
    """``tying_max_distinct: 2``: every map the agent leaves during exploration and at the end
    has at most 2 blocks with weights of their own; the TD target's max skips actions that
    would exceed it; a bad budget raises."""
    model = tiny_model(5, device=device)
    rl = RLTying(model, {"tying_every": 1, "tying_max_distinct": 2}, {"seed": 1, "epochs": 1, "steps_per_epoch": 100})
    distinct = []
    for step in range(1, 101):
        rl.after_step(step, 2.0 + 0.1 * (step % 7))
        s = tying_map(model)
        distinct.append(sum(i == j for i, j in enumerate(s)))
    assert rl.frozen and max(distinct) == 2  # reached the budget, never beyond it
    assert rl.feasible([0, 1, 1, 1, 1], 4) == [True, True, True, True, False]  # own weights: 3
    agent = rl.agent
    st = [0, 1, 1, 1, 1]
    with torch.no_grad():  # make the infeasible action (block 4 on its own) the best by far
        agent.q_target.net[-1].bias[QNetwork.offset(4) + 4] = 100.0
    capped = agent.td_target([0.0], [st], [4])
    agent.feasible = None
    free = agent.td_target([0.0], [st], [4])
    assert float(free) > 50 and float(capped) < 50
    with pytest.raises(ValueError, match="tying_max_distinct"):
        RLTying(tiny_model(4), {"tying_max_distinct": 5}, {"epochs": 1})


def test_settings_are_declared_validated_and_registered():
    """Each controller's knobs are its ``Settings`` fields: an unknown key and a bad value are
    refused with the key in the message, the controllers read them from there, and the registry
    lists them for the space's key check."""
    from archsearch.dynamic import settings_owners
    from archsearch.dynamic.settings import StrategySettings

    with pytest.raises(ValueError, match="tying_evry"):
        RLTying.Settings(tying_evry=4)
    with pytest.raises(ValueError, match="tying_every"):
        RLTying.Settings.from_config({"tying_every": 0})
    for bad in ({"tying_explore_frac": 1.5}, {"tying_gamma": -0.1}, {"tying_lr": 0.0},
                {"tying_max_distinct": 0}, {"tying_total_steps": 0}, {"tying_every": "often"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RLTying.Settings.from_config(bad)
    with pytest.raises(ValueError, match="^tying_every: "):  # the constructor too, key first
        RLTying(tiny_model(), {"tying_every": 0}, {"epochs": 1})
    with pytest.raises(ValueError, match="^tying_max_distinct: "):
        RLTying(tiny_model(4), {"tying_max_distinct": 5}, {"epochs": 1})
    s = RLTying.Settings.from_config({"tying_every": 3, "lr": 1.0, "tying_k": 4, "tying_gamma": None})
    assert s.tying_every == 3 and s.tying_gamma == 0.9  # other strategies' keys and None ignored
    with pytest.raises(Exception):
        s.tying_every = 4  # frozen
    for cls in (RLTying, AllTying, EveryKTying):
        assert issubclass(cls.Settings, StrategySettings) and cls.Settings is not StrategySettings
        for key, info in cls.Settings.model_fields.items():
            assert key.startswith("tying_") and info.description, key  # documented
    assert list(EveryKTying.Settings.model_fields) == ["tying_k"] and not AllTying.Settings.model_fields

    # the controllers use the settings (no key read from cfg behind their back)
    rl = RLTying(tiny_model(4), {"tying_every": 5, "tying_total_steps": 100, "tying_explore_frac": 0.5,
                                 "tying_gamma": 0.5, "tying_lr": 0.01, "tying_hidden": 8,
                                 "tying_epsilon_end": 0.1, "tying_replay_size": 7,
                                 "tying_replay_batch": 3, "tying_target_sync": 9}, {"epochs": 1})
    a = rl.agent
    assert (rl.every, rl.total_rounds, rl.explore_rounds) == (5, 20, 10)
    assert (a.gamma, a.epsilon_min, a.buffer.capacity, a.batch_size, a.target_sync) == (0.5, 0.1, 7, 3, 9)
    assert a.opt.param_groups[0]["lr"] == 0.01 and a.q.net[0].out_features == 8
    assert a.epsilon_decay == pytest.approx(0.1 ** (1 / 30))
    d = RLTying(tiny_model(4), {}, {"epochs": 1}).agent  # defaults: the Settings' defaults
    dflt = RLTying.Settings()
    assert (d.gamma, d.epsilon_min, d.buffer.capacity, d.batch_size, d.target_sync) == (
        dflt.tying_gamma, dflt.tying_epsilon_end, dflt.tying_replay_size, dflt.tying_replay_batch,
        dflt.tying_target_sync)
    assert EveryKTying(tiny_model(5), {}, {}).k == EveryKTying.Settings().tying_k

    owners = settings_owners()
    assert owners["tying_every"] == [("tying", "rl"), ("tying", "paper")]
    assert owners["tying_k"] == [("tying", "every_k"), ("tying", "switch")]
    assert set(RLTying.Settings.model_fields) <= set(owners)


def test_a_frozen_alias_follows_its_source_gets_no_gradient_and_no_optimizer_state(data, settings):
    """``set_layer(..., frozen=True)`` (Hay & Wolf's tying): the tied block computes with the
    source's current weights (after the source's optimizer step too), gets no gradient, and the
    optimizer holds nothing for it; re-tying the owner hands its weights and Adam state to the
    first follower; a frozen *copy* (a broken alias) would stop following and is caught."""
    loop = TrialLoop({**TINY, "tying": "none"}, data, settings)
    loop.train_epoch()
    n_untied = costs.params_trainable(loop.model)
    per_block = sum(p.numel() for p in loop.model.blocks[0].parameters())
    assert set_layer(loop.model, 2, 1, frozen=True) and set_layer(loop.model, 3, 1, frozen=True)
    sync_optimizer(loop)
    assert not set_layer(loop.model, 3, 1, frozen=True)  # already a frozen alias of block 1
    assert tying_map(loop.model) == [0, 1, 1, 1]
    src, alias = loop.model.blocks[1].attn.q.weight, loop.model.blocks[2].attn.q.weight
    assert alias is not src and not alias.requires_grad and src.requires_grad
    assert alias.data_ptr() == src.data_ptr()
    assert costs.params_trainable(loop.model) == n_untied - 2 * per_block
    assert costs.params_total(loop.model) == n_untied - 2 * per_block  # the memory is shared
    assert_optimizer_consistent(loop)
    before = src.detach().clone()
    loop.train_epoch()
    assert not torch.equal(src, before)
    assert torch.equal(alias, src) and alias.grad is None  # follows the trained source
    assert_optimizer_consistent(loop)
    # no gradient reaches the source through the alias's use: a shared tie's gradient differs
    grads = {}
    for frozen in (True, False):
        torch.manual_seed(0)
        m = tiny_model()
        apply_tying_map(m, [0, 0, 2, 3], frozen=frozen)
        m(torch.randint(0, 20, (2, 8))).float().pow(2).mean().backward()
        grads[frozen] = m.blocks[0].attn.q.weight.grad.clone()
        assert (m.blocks[1].attn.q.weight.grad is None) == frozen
    assert not torch.allclose(grads[True], grads[False])
    # the owner leaves: block 2 becomes the owner of the same memory and keeps the Adam state
    state_before = {k: v.clone() for k, v in loop.opt.state[src].items()}
    assert set_layer(loop.model, 1, 0, frozen=True)
    sync_optimizer(loop)
    assert tying_map(loop.model) == [0, 0, 2, 2]
    owner = loop.model.blocks[2].attn.q.weight
    assert owner.requires_grad and owner.data_ptr() == alias.data_ptr()
    assert torch.equal(loop.opt.state[owner]["exp_avg"], state_before["exp_avg"])
    assert not loop.model.blocks[3].attn.q.weight.requires_grad
    assert_optimizer_consistent(loop)
    # re-tying an owner of frozen aliases in shared mode still hands its weights to a follower
    mixed = tiny_model()
    apply_tying_map(mixed, [0, 1, 1, 3], frozen=True)
    set_layer(mixed, 1, 0)
    assert tying_map(mixed) == [0, 0, 2, 3] and mixed.blocks[2].attn.q.weight.requires_grad
    # untying a frozen alias gives a trainable copy
    assert set_layer(loop.model, 3, 3, frozen=True)
    sync_optimizer(loop)
    assert loop.model.blocks[3].attn.q.weight.requires_grad and tying_map(loop.model) == [0, 0, 2, 3]
    assert_optimizer_consistent(loop)
    # a broken alias (a frozen copy of the source) stops following it: the check above catches it
    broken = TrialLoop({**TINY, "tying": "none"}, data, settings)
    for (m, name), q in zip([(m, n) for _, m in broken.model.blocks[2].named_modules() for n in m._parameters],
                            broken.model.blocks[1].parameters(), strict=True):
        setattr(m, name, torch.nn.Parameter(q.detach().clone(), requires_grad=False))
    broken.rebuild_optimizer()
    assert torch.equal(broken.model.blocks[2].attn.q.weight, broken.model.blocks[1].attn.q.weight)
    broken.train_epoch()
    assert not torch.equal(broken.model.blocks[2].attn.q.weight, broken.model.blocks[1].attn.q.weight)


def test_the_paper_agent_sweeps_one_block_per_interval_rewards_minus_perplexity_and_resumes(data, settings, tmp_path):
    """``tying: paper``: one decision every ``tying_every`` steps, blocks 1..L-1 in turn, epsilon
    x0.95 per sweep, each decision rewarded by -exp(CE) of the next batch with one online TD
    update; ties are frozen aliases; a checkpoint resumes it exactly."""
    cfg = {**TINY, "tying": "paper", "tying_every": 2}
    loop = TrialLoop(cfg, data, settings)
    pt = loop.tying
    assert type(pt).__name__ == "PaperTying" and tying_map(loop.model) == [0, 1, 2, 3]
    loss = loop.train_epoch()  # 6 steps: decisions at steps 2, 4, 6 for blocks 1, 2, 3
    assert pt.decisions == 3 and pt.sweeps == 1 and pt.layer == 1
    assert pt.agent.epsilon == pytest.approx(0.95)
    assert pt.agent.updates == 2  # the decision at step 6 waits for the next batch
    assert pt.last_reward is not None and -pt.s.tying_reward_clip <= pt.last_reward < -1 and loss > 0
    for i, j in enumerate(tying_map(loop.model)):
        if j != i:
            assert not loop.model.blocks[i].attn.q.weight.requires_grad
    assert_optimizer_consistent(loop)
    loop.save(str(tmp_path))
    restored = TrialLoop(cfg, data, settings)
    restored.load(str(tmp_path))
    assert tying_map(restored.model) == tying_map(loop.model)
    a, b = loop.tying, restored.tying
    assert (b.decisions, b.sweeps, b.layer, b.pending, b.agent.epsilon) == \
        (a.decisions, a.sweeps, a.layer, a.pending, a.agent.epsilon)
    assert_optimizer_consistent(restored)
    assert restored.train_epoch() == pytest.approx(loop.train_epoch(), rel=1e-5)
    assert tying_map(restored.model) == tying_map(loop.model)
    assert b.agent.updates == a.agent.updates == 5


# ------------------------------------------------------------------ tying: switch
def test_switch_reads_the_held_out_loss_as_evaluation_does(data, settings):
    loop = TrialLoop({**TINY, "tying": "switch", "tying_check_every": 3}, data, settings)
    loop.train_epoch()
    assert loop.tying.switch_step is None and tying_map(loop.model) == [0, 1, 2, 3]
    loop.model.train()
    h = loop.tying.held_out_loss()
    assert loop.model.training  # the check leaves training mode as it found it
    assert h == pytest.approx(loop.evaluate("validation")["val_loss"], rel=1e-5)
    with pytest.raises(ValueError, match="trial loop"):
        tying_class("switch")(tiny_model(), {}, {})
    with pytest.raises(ValueError, match="tying_split.*'holdout'"):
        TrialLoop({**TINY, "tying": "switch", "tying_split": "holdout"}, data, settings)


@pytest.mark.parametrize("patience,losses,switch_check", [
    (1, [3.0, 2.5, 2.6, 2.4], 3),            # the first rise
    (2, [3.0, 2.5, 2.6, 2.4, 2.45, 2.5], 6),  # a new minimum resets the count
])
def test_switch_ties_once_after_patience_checks_without_a_new_minimum(data, settings, patience, losses, switch_check):
    cfg = {**TINY, "tying": "switch", "tying_check_every": 2, "tying_patience": patience, "tying_k": 2}
    loop = TrialLoop(cfg, data, {**settings, "epochs": 3})
    scripted = iter(losses + [9.0] * 10)
    loop.tying.held_out_loss = lambda: next(scripted)
    while loop.tying.switch_step is None and loop.step < 2 * len(losses):
        loop.train_epoch()
    assert loop.tying.switch_step == 2 * switch_check
    assert tying_map(loop.model) == [0, 0, 2, 2]
    assert loop.model.blocks[1].attn.q.weight is loop.model.blocks[0].attn.q.weight
    assert_optimizer_consistent(loop)
    loop.train_epoch()  # trains on, tied, and never switches again
    assert loop.tying.switch_step == 2 * switch_check and tying_map(loop.model) == [0, 0, 2, 2]
    m = loop.evaluate()
    assert m["tying_switch_step"] == 2 * switch_check and m["n_distinct_layers"] == 2


def test_switch_checkpoint_round_trip(data, settings, tmp_path):
    cfg = {**TINY, "tying": "switch", "tying_check_every": 2, "tying_k": 4}
    loop = TrialLoop(cfg, data, settings)
    scripted = iter([3.0, 2.0, 2.5] + [9.0] * 10)
    loop.tying.held_out_loss = lambda: next(scripted)
    loop.train_epoch()  # 6 steps: checks at 2, 4, 6 -> switch at 6
    assert loop.tying.switch_step == 6
    loop.save(str(tmp_path))
    restored = TrialLoop(cfg, data, settings)
    restored.load(str(tmp_path))
    assert tying_map(restored.model) == [0, 0, 0, 0] and restored.tying.switch_step == 6
    assert (restored.tying.best, restored.tying.bad) == (2.0, 1)
    assert restored.evaluate()["val_loss"] == pytest.approx(loop.evaluate()["val_loss"], abs=1e-6)
