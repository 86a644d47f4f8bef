"""Layer tying during training: a Q-learning agent (``tying: rl``) and fixed baselines.

Source: Hay & Wolf, "Dynamic Layer Tying for Parameter-Efficient Transformers", ICLR 2024;
specified in docs/design.md, "Dynamic layer tying".

**Tying state.** A list ``s`` of ``L`` ints (``L`` = number of blocks): ``s[i] = j`` means block
``i`` uses block ``j``'s weights, ``j <= i``; ``s[i] = i`` means block ``i`` has weights no earlier
block uses. The state is *derived from the model* (:func:`tying_map`: ``s[i]`` is the first block
whose Parameters are the very same objects as block ``i``'s), so it is always canonical
(``s[s[i]] == s[i]``) and can never disagree with what is actually shared.

**Real sharing.** Tying block ``i`` to block ``j`` assigns block ``j``'s ``nn.Parameter`` objects
into block ``i``'s modules (``setattr(module, name, param)``): both blocks then hold the same
Parameters, the forward pass reads one tensor twice, gradients accumulate into it, the optimizer
holds it (and its Adam state) once, and ``costs.params_trainable`` / ``costs.params_total`` drop.
Untying gives block ``i`` fresh Parameters holding copies of its current values. Only block
``i``'s own slots change, so the blocks that shared with ``i`` keep their weights.

**Optimizer.** After a change during training, :func:`sync_optimizer` rebuilds ``loop.opt`` over
the distinct trainable Parameters (``loop.rebuild_optimizer()`` of the
:class:`~archsearch.dynamic.base.TrialContext`, which also rebuilds the LR schedule at the current
step) and carries the AdamW state of every surviving Parameter over; new copies
start with fresh state, dropped Parameters take theirs with them.

**The agent** (``tying: rl``, :class:`RLTying`): the state starts with every block tied to block
0. Training runs in intervals of ``tying_every`` (default 8) batches. At the end of each interval
the agent runs a *round*: it decides for every block ``1 .. L-1`` in turn (block 0 has only one
choice; each decision sees the map the earlier ones left): copy an earlier block ``j < i`` or
train independently (``j = i``). Q-network: MLP ``L -> 128 -> ReLU -> L(L+1)/2`` on the state
(scaled to [0, 1] by ``L - 1``); block ``i``'s ``i + 1`` action values are outputs
``i(i+1)/2 .. i(i+1)/2 + i``. Reward (:class:`ImprovementReward`), shared by the decisions of a
round and computed from the mean training loss of the interval that follows it: the relative
perplexity improvement over the EMA of earlier intervals' perplexities, minus the EMA of those
improvements (detrended: training improves on its own), divided by the running RMS (normalised),
clipped to [-3, 3]. Each decision is a transition ``(s, i, a, r, s', i+1)`` (block ``L-1`` leads
to block 1 of the next round) in a replay buffer (4096); after each rewarded round, 4 TD updates
on minibatches of 32: MSE between ``Q(s, a)`` and ``r + gamma * max_a' Q_target(s', a')`` with a
target network copied from the online one every 50 updates, ``gamma = 0.9``, AdamW lr 1e-3.
Epsilon-greedy with epsilon decayed after every decision from 1.0 to 0.05 at the last decision
of the first ``tying_explore_frac`` (0.4) of the run's rounds; then one greedy round sets the
final map, which stays frozen for the rest of training. Seeded from ``settings["seed"]``.

Why (issue 16): with a raw ``-exp(loss)`` reward, gamma 0.99 and single-sample TD updates, one
block decided per interval and epsilon decayed per sweep (still 0.60 at the end), the reward had
no effect on the final map (constant fake rewards gave the same maps) and the constant churn, not
the sharing, cost the perplexity: the agent's final map trained fixed from step 0 reached a
perplexity ratio of 1.027 at the same parameter ratio.

Baselines: :class:`AllTying` (``tying: all``, ALBERT-style, every block shares block 0) and
:class:`EveryKTying` (``tying: every_k``: consecutive groups of ``tying_k`` blocks share one set
of weights, ``s[i] = k * (i // k)``, the "sequence" pattern of Takase & Kiyono 2021, "Lessons on
Parameter Sharing across Layers in Transformers").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.dynamic.base import TrialContext, TyingController

#: Training batches between two rounds of the agent (``tying_every``).
DEFAULT_TYING_EVERY = 8
#: Fraction of the run's rounds in which the agent explores (``tying_explore_frac``); then frozen.
DEFAULT_EXPLORE_FRAC = 0.4
#: Exploration rate reached at the last exploring decision.
EPSILON_END = 0.05
#: TD updates (replay minibatches) after each rewarded round.
UPDATES_PER_ROUND = 4
#: Blocks per shared group of ``tying: every_k`` when ``tying_k`` is not given.
DEFAULT_TYING_K = 2


# ---------------------------------------------------------------------------- sharing primitives

def _blocks(model: nn.Module) -> nn.ModuleList:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise ValueError("layer tying needs a model with an nn.ModuleList `blocks`")
    return blocks


def _slots(block: nn.Module) -> list[tuple[nn.Module, str]]:
    """``(module, name)`` of every parameter of ``block``, in a fixed order."""
    return [(m, n) for _, m in block.named_modules() for n, p in m._parameters.items() if p is not None]


def _key(block: nn.Module) -> tuple[int, ...]:
    return tuple(id(getattr(m, n)) for m, n in _slots(block))


def tying_map(model: nn.Module) -> list[int]:
    """The tying state of ``model``: ``s[i]`` = the first block whose Parameters are block ``i``'s.

    Returns:
        list of ``L`` ints with ``s[i] <= i`` and ``s[s[i]] == s[i]``.

    Raises:
        ValueError: ``model`` has no ``blocks`` ModuleList.
    """
    keys: list[tuple[int, ...]] = []
    out = []
    for i, block in enumerate(_blocks(model)):
        k = _key(block)
        out.append(next((j for j, kj in enumerate(keys) if kj == k), i))
        keys.append(k)
    return out


def n_distinct_layers(model: nn.Module) -> int:
    """Number of blocks with their own weights (``s[i] == i``)."""
    return sum(1 for i, j in enumerate(tying_map(model)) if i == j)


def set_layer(model: nn.Module, i: int, j: int) -> bool:
    """Make block ``i`` use block ``j``'s weights (``j < i``) or train on its own (``j == i``).

    ``j < i``: block ``i``'s Parameter slots are assigned block ``j``'s Parameter objects (which
    are block ``s[j]``'s). ``j == i``: if block ``i`` shares with an earlier block it gets fresh
    Parameters with copies of the current values (``requires_grad`` kept); otherwise nothing
    changes. Other blocks are never modified.

    Returns:
        True if block ``i``'s Parameters changed (the optimizer must then follow).

    Raises:
        ValueError: not ``0 <= j <= i < L``.
    """
    blocks = _blocks(model)
    if not 0 <= j <= i < len(blocks):
        raise ValueError(f"need 0 <= j <= i < n_layers={len(blocks)}, got i={i}, j={j}")
    if j < i:
        if _key(blocks[i]) == _key(blocks[j]):
            return False
        for (mi, name), (mj, name_j) in zip(_slots(blocks[i]), _slots(blocks[j]), strict=True):
            assert name == name_j
            setattr(mi, name, getattr(mj, name_j))
        return True
    if tying_map(model)[i] == i:
        return False
    for m, name in _slots(blocks[i]):
        p = getattr(m, name)
        setattr(m, name, nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad))
    return True


def next_map(s: Sequence[int], i: int, j: int) -> list[int]:
    """The tying state after :func:`set_layer` ``(i, j)`` on a model in state ``s`` (pure).

    Block ``i`` moves to block ``j``'s group (``j < i``) or to a group of its own (``j == i``);
    if block ``i`` owned weights that later blocks share, those blocks keep the weights and the
    first of them becomes their owner.

    Raises:
        ValueError: ``s`` is not a valid map, or not ``0 <= j <= i < len(s)``.
    """
    s = check_map(s, len(s))
    if not 0 <= j <= i < len(s):
        raise ValueError(f"need 0 <= j <= i < {len(s)}, got i={i}, j={j}")
    target = s[j] if j < i else i
    if target == s[i]:
        return s
    out = list(s)
    out[i] = target
    followers = [k for k in range(len(s)) if s[k] == i and k != i]
    for k in followers:  # block i owned these weights: the first follower now owns them
        out[k] = followers[0]
    return out


def check_map(s: Sequence[int], n_layers: int) -> list[int]:
    """Validate a tying state: ``n_layers`` ints, ``0 <= s[i] <= i``, ``s[s[i]] == s[i]``.

    Raises:
        ValueError: wrong length or an entry breaking those rules.
    """
    s = [int(v) for v in s]
    if len(s) != n_layers:
        raise ValueError(f"tying map has {len(s)} entries, expected {n_layers}")
    for i, j in enumerate(s):
        if not 0 <= j <= i:
            raise ValueError(f"tying map entry s[{i}] = {j} must be in [0, {i}]")
        if s[j] != j:
            raise ValueError(f"tying map entry s[{i}] = {j} points at block {j}, which is itself tied "
                             f"to {s[j]}; point at the block that owns the weights")
    return s


def apply_tying_map(model: nn.Module, s: Sequence[int]) -> bool:
    """Re-tie ``model`` so that :func:`tying_map` returns ``s``.

    Returns:
        True if any Parameter changed.

    Raises:
        ValueError: ``s`` is not a valid map for the model (see :func:`check_map`).
    """
    s = check_map(s, len(_blocks(model)))
    changed = False
    for i, j in enumerate(s):  # blocks < i already match s and are never touched again
        changed |= set_layer(model, i, j)
    return changed


def sync_optimizer(loop: TrialContext | None) -> None:
    """Rebuild ``loop.opt`` (and its LR schedule) after the parameter set changed.

    Calls ``loop.rebuild_optimizer()`` (a fresh AdamW over ``loop.trainable_parameters()``, each
    distinct Parameter once, schedule at the current step) and copies the per-parameter state
    (``step``, ``exp_avg``, ``exp_avg_sq``) of every Parameter the old optimizer also held. New
    Parameters (untied copies) start with empty state; state of Parameters no longer in the model
    is dropped. No-op when ``loop`` is None or has no optimizer yet.
    """
    old = loop.opt if loop is not None else None
    if old is None:
        return
    old_state = old.state
    loop.rebuild_optimizer()
    for group in loop.opt.param_groups:
        for p in group["params"]:
            if p in old_state:
                loop.opt.state[p] = old_state[p]


# ---------------------------------------------------------------------------- Q-learning agent

class QNetwork(nn.Module):
    """MLP ``L -> hidden -> ReLU -> L(L+1)/2``: action values of every block's choices.

    Block ``i`` owns outputs ``offset(i) .. offset(i) + i`` (``offset(i) = i(i+1)/2``); output
    ``offset(i) + j`` is the value of "block ``i`` uses block ``j``'s weights" (``j = i``: its own).
    """

    def __init__(self, n_layers: int, hidden: int = 128):
        super().__init__()
        if n_layers < 1 or hidden < 1:
            raise ValueError(f"need n_layers >= 1 and hidden >= 1, got {n_layers}, {hidden}")
        self.n_layers = n_layers
        self.n_out = n_layers * (n_layers + 1) // 2
        self.net = nn.Sequential(nn.Linear(n_layers, hidden), nn.ReLU(), nn.Linear(hidden, self.n_out))
        #: (n_out,) the block each output belongs to
        self.register_buffer(
            "out_layer", torch.tensor([i for i in range(n_layers) for _ in range(i + 1)]), persistent=False)

    @staticmethod
    def offset(layer: int) -> int:
        """Index of block ``layer``'s first output."""
        return layer * (layer + 1) // 2

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """``N x L`` float states (scaled to [0, 1]) -> ``N x L(L+1)/2`` action values."""
        return self.net(states)


class ReplayBuffer:
    """Ring buffer of transitions ``(s, layer, a, r, s', layer')`` (oldest overwritten first).

    Tensors: ``states``/``next_states`` ``capacity x L`` long, ``layers``/``actions``/
    ``next_layers`` ``(capacity,)`` long, ``rewards`` ``(capacity,)`` float32; rows ``< size`` hold data.
    """

    def __init__(self, capacity: int, n_layers: int):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.states = torch.zeros(self.capacity, n_layers, dtype=torch.long)
        self.next_states = torch.zeros(self.capacity, n_layers, dtype=torch.long)
        self.layers = torch.zeros(self.capacity, dtype=torch.long)
        self.actions = torch.zeros(self.capacity, dtype=torch.long)
        self.next_layers = torch.zeros(self.capacity, dtype=torch.long)
        self.rewards = torch.zeros(self.capacity, dtype=torch.float32)
        self.size = 0
        self.pos = 0

    def __len__(self) -> int:
        return self.size

    def push(self, state: Sequence[int], layer: int, action: int, reward: float,
             next_state: Sequence[int], next_layer: int) -> None:
        k = self.pos
        self.states[k] = torch.as_tensor(list(state), dtype=torch.long)
        self.next_states[k] = torch.as_tensor(list(next_state), dtype=torch.long)
        self.layers[k], self.actions[k], self.next_layers[k] = int(layer), int(action), int(next_layer)
        self.rewards[k] = float(reward)
        self.pos = (k + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        """``n`` transitions drawn uniformly with replacement: ``(states, layers, actions,
        rewards, next_states, next_layers)`` as the arguments of :meth:`TyingAgent.td_update`."""
        if self.size == 0:
            raise ValueError("the replay buffer is empty")
        idx = torch.randint(0, self.size, (int(n),), generator=generator)  # (n,)
        return (self.states[idx], self.layers[idx], self.actions[idx], self.rewards[idx],
                self.next_states[idx], self.next_layers[idx])

    def state_dict(self) -> dict[str, Any]:
        return {"states": self.states.clone(), "next_states": self.next_states.clone(),
                "layers": self.layers.clone(), "actions": self.actions.clone(),
                "next_layers": self.next_layers.clone(), "rewards": self.rewards.clone(),
                "size": self.size, "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("states", "next_states", "layers", "actions", "next_layers", "rewards"):
            getattr(self, name).copy_(state[name])
        self.size, self.pos = int(state["size"]), int(state["pos"])


class TyingAgent:
    """Epsilon-greedy Q-learning over tying decisions (Hay & Wolf 2024, Sec. 3) with a replay
    buffer and a target network.

    Args (keyword-only after ``n_layers``):
        n_layers: ``L``, blocks of the model.
        hidden: Q-network hidden width (128).
        gamma: discount (0.9).
        lr: AdamW learning rate of the Q-network (1e-3).
        epsilon, epsilon_decay, epsilon_min: exploration start (1.0), factor applied after each
            decision (:meth:`decay_epsilon`, 1.0 = constant) and floor (0.05).
        buffer_size: replay capacity (4096 transitions); batch_size: transitions per TD update (32).
        target_sync: TD updates between two copies of the online Q-network into the target
            network (50).
        seed: seeds the Q-network init, exploration and replay sampling (the global RNG is untouched).

    Raises:
        ValueError: ``n_layers < 1``, ``gamma`` outside [0, 1], non-positive ``lr``, epsilons
            outside [0, 1], non-positive sizes.
    """

    def __init__(self, n_layers: int, *, hidden: int = 128, gamma: float = 0.9, lr: float = 1e-3,
                 epsilon: float = 1.0, epsilon_decay: float = 1.0, epsilon_min: float = 0.05,
                 buffer_size: int = 4096, batch_size: int = 32, target_sync: int = 50, seed: int = 0):
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        for name, v in (("epsilon", epsilon), ("epsilon_decay", epsilon_decay), ("epsilon_min", epsilon_min)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        if batch_size < 1 or target_sync < 1:
            raise ValueError(f"batch_size and target_sync must be >= 1, got {batch_size}, {target_sync}")
        self.n_layers, self.gamma = int(n_layers), float(gamma)
        self.epsilon, self.epsilon_decay = float(epsilon), float(epsilon_decay)
        self.epsilon_min = float(epsilon_min)
        self.batch_size, self.target_sync = int(batch_size), int(target_sync)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            self.q = QNetwork(self.n_layers, hidden)
            self.q_target = QNetwork(self.n_layers, hidden)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self.opt = torch.optim.AdamW(self.q.parameters(), lr=float(lr))
        self.rng = torch.Generator().manual_seed(int(seed))
        self.buffer = ReplayBuffer(buffer_size, self.n_layers)
        self.updates = 0
        #: ``(state, layer) -> layer + 1`` bools: the actions allowed there (``None`` = all); the
        #: controller sets it for a budget of distinct blocks (``tying_max_distinct``)
        self.feasible: Callable[[Sequence[int], int], Sequence[bool]] | None = None

    def _allowed(self, state: Sequence[int], layer: int) -> torch.Tensor:
        if self.feasible is None:
            return torch.ones(layer + 1, dtype=torch.bool)
        ok = torch.as_tensor(list(self.feasible(state, layer)), dtype=torch.bool)  # (layer + 1,)
        if ok.shape != (layer + 1,) or not bool(ok.any()):
            raise ValueError(f"feasible() must allow at least one of the {layer + 1} actions of block {layer}")
        return ok

    def encode(self, states: Sequence[Sequence[int]] | torch.Tensor) -> torch.Tensor:
        """Tying states (``N`` lists of ``L`` ints) -> ``N x L`` floats in [0, 1]."""
        s = torch.as_tensor(states, dtype=torch.float32).reshape(-1, self.n_layers)  # (N, L)
        return s / max(1, self.n_layers - 1)

    def q_values(self, state: Sequence[int], layer: int) -> torch.Tensor:
        """``(layer + 1,)`` action values of block ``layer`` in ``state`` (online network, no gradient)."""
        with torch.no_grad():
            q = self.q(self.encode([state]))[0]  # (n_out,)
        o = QNetwork.offset(layer)
        return q[o:o + layer + 1]

    def act(self, state: Sequence[int], layer: int, *, greedy: bool = False) -> int:
        """Choose ``j`` in ``0..layer`` for block ``layer``: random with probability epsilon (unless
        ``greedy``), else the argmax of its action values.

        Raises:
            ValueError: ``layer`` outside ``[0, L)``.
        """
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be in [0, {self.n_layers}), got {layer}")
        ok = self._allowed(state, layer)  # (layer + 1,)
        if not greedy and float(torch.rand((), generator=self.rng)) < self.epsilon:
            choices = ok.nonzero()[:, 0]
            return int(choices[torch.randint(0, len(choices), (), generator=self.rng)])
        return int(self.q_values(state, layer).masked_fill(~ok, float("-inf")).argmax())

    def decay_epsilon(self) -> None:
        """One decision taken: ``epsilon <- max(epsilon_min, epsilon * epsilon_decay)``."""
        self.epsilon = max(self.epsilon_min, self.epsilon * self.epsilon_decay)

    def td_target(self, rewards, next_states, next_layers) -> torch.Tensor:
        """``(N,)`` TD targets ``r + gamma * max_a' Q_target(s', a')``, ``a'`` over the actions of
        block ``next_layers[n]`` (the allowed ones, with :attr:`feasible`), from the *target*
        network (no gradient)."""
        rewards_t = torch.as_tensor(rewards, dtype=torch.float32).reshape(-1)  # (N,)
        nxt = torch.as_tensor(next_layers, dtype=torch.long).reshape(-1)  # (N,)
        with torch.no_grad():
            qn = self.q_target(self.encode(next_states))  # (N, n_out)
            valid = self.q_target.out_layer[None, :] == nxt[:, None]  # (N, n_out)
            if self.feasible is not None:
                states = torch.as_tensor(next_states).reshape(-1, self.n_layers).tolist()
                for n, (st, nl) in enumerate(zip(states, nxt.tolist())):
                    o = QNetwork.offset(nl)
                    valid[n, o:o + nl + 1] &= self._allowed(st, nl)
            return rewards_t + self.gamma * qn.masked_fill(~valid, float("-inf")).amax(dim=1)

    def td_update(self, states, layers, actions, rewards, next_states, next_layers) -> float:
        """One AdamW step on the MSE between ``Q(s, a)`` and :meth:`td_target`; every
        ``target_sync`` updates the target network becomes a copy of the online one.

        Args:
            states, next_states: ``N`` tying states (lists of ``L`` ints) or an ``N x L`` tensor.
            layers: ``N`` blocks the actions were taken for; ``actions``: ``N`` ints, ``0..layer``.
            rewards: ``N`` floats.
            next_layers: ``N`` blocks decided next (the max runs over their actions only).

        Returns:
            the loss before the step (squared TD error, mean over ``N``).
        """
        layers_t = torch.as_tensor(layers, dtype=torch.long).reshape(-1)  # (N,)
        actions_t = torch.as_tensor(actions, dtype=torch.long).reshape(-1)  # (N,)
        if bool(((actions_t < 0) | (actions_t > layers_t)).any()):
            raise ValueError("each action must be in [0, layer]")
        idx = layers_t * (layers_t + 1) // 2 + actions_t  # (N,)
        target = self.td_target(rewards, next_states, next_layers)  # (N,)
        q = self.q(self.encode(states)).gather(1, idx[:, None])[:, 0]  # (N,)
        loss = F.mse_loss(q, target)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.updates += 1
        if self.updates % self.target_sync == 0:
            self.sync_target()
        return float(loss.detach())

    def sync_target(self) -> None:
        """Copy the online Q-network into the target network."""
        self.q_target.load_state_dict(self.q.state_dict())

    def remember(self, state, layer, action, reward, next_state, next_layer) -> None:
        """Store one transition in the replay buffer."""
        self.buffer.push(state, layer, action, reward, next_state, next_layer)

    def replay(self, n_updates: int) -> float | None:
        """``n_updates`` TD updates on minibatches of ``batch_size`` drawn from the buffer.

        Returns:
            the mean TD loss, or None when the buffer is empty.
        """
        if len(self.buffer) == 0 or n_updates < 1:
            return None
        losses = [self.td_update(*self.buffer.sample(self.batch_size, self.rng)) for _ in range(n_updates)]
        return sum(losses) / len(losses)

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizer, epsilon, counters, RNG and replay buffer (tensors, numbers, dicts)."""
        return {"q": self.q.state_dict(), "q_target": self.q_target.state_dict(),
                "opt": self.opt.state_dict(), "epsilon": self.epsilon, "updates": self.updates,
                "rng": self.rng.get_state(), "buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.q_target.load_state_dict(state["q_target"])
        self.opt.load_state_dict(state["opt"])
        self.epsilon = float(state["epsilon"])
        self.updates = int(state["updates"])
        self.rng.set_state(state["rng"])
        self.buffer.load_state_dict(state["buffer"])


class ImprovementReward:
    """Detrended, normalised reward of one interval from its mean training loss (nats).

    ``ppl = exp(loss)``; ``g = (ema_ppl - ppl) / ema_ppl`` is the relative perplexity improvement
    over the EMA of the earlier intervals' perplexities; ``d = g - trend`` removes the EMA of past
    improvements (training improves on its own; the agent is paid for doing better than that);
    the reward is ``d / sqrt(EMA of d^2)``, clipped to ``[-clip, clip]``. All EMAs use ``beta``.
    The first interval only sets the baseline (returns None). A non-finite loss gives ``-clip``.
    Constant losses give reward 0.
    """

    def __init__(self, beta: float = 0.9, clip: float = 3.0):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        self.beta, self.clip = float(beta), float(clip)
        self.ema_ppl: float | None = None
        self.trend = 0.0
        self.var: float | None = None

    def __call__(self, loss: float) -> float | None:
        if not math.isfinite(loss):
            return -self.clip
        ppl = math.exp(min(float(loss), 50.0))
        if self.ema_ppl is None:
            self.ema_ppl = ppl
            return None
        b = self.beta
        g = (self.ema_ppl - ppl) / self.ema_ppl
        d = g - self.trend
        self.var = d * d if self.var is None else b * self.var + (1 - b) * d * d
        self.trend = b * self.trend + (1 - b) * g
        self.ema_ppl = b * self.ema_ppl + (1 - b) * ppl
        r = d / math.sqrt(self.var) if self.var > 1e-24 else 0.0
        return max(-self.clip, min(self.clip, r))

    def state_dict(self) -> dict[str, Any]:
        return {"ema_ppl": self.ema_ppl, "trend": self.trend, "var": self.var}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema_ppl = None if state["ema_ppl"] is None else float(state["ema_ppl"])
        self.trend = float(state["trend"])
        self.var = None if state["var"] is None else float(state["var"])


def total_steps(cfg: dict[str, Any], settings: dict[str, Any], loop: TrialContext | None = None) -> int:
    """Optimizer steps of the whole run, as the trial loop counts them: ``cfg["tying_total_steps"]``
    if given, else ``epochs x steps per epoch`` (LM: ``settings["steps_per_epoch"]``, default 200;
    classification: ``ceil(train rows / batch size)``)."""
    if cfg.get("tying_total_steps"):
        return int(cfg["tying_total_steps"])
    epochs = int(settings.get("epochs", 1))
    data = getattr(loop, "data", None) if loop is not None else None
    if data is not None and getattr(data, "task", "lm") != "lm":
        bs = int(cfg.get("batch_size") or settings.get("batch_size", 64))
        return epochs * math.ceil(len(data.train) / bs)
    return epochs * int(settings.get("steps_per_epoch") or 200)


# ---------------------------------------------------------------------------- controllers

class _MapTying(TyingController):
    """Shared part of the controllers: apply a map, keep the optimizer in step, report, save."""

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        self.n_layers = len(_blocks(model))

    def _apply(self, s: Sequence[int]) -> None:
        if apply_tying_map(self.model, s):
            sync_optimizer(self.loop)

    def metrics(self) -> dict[str, Any]:
        """``tying_map`` (list of ``L`` ints) and ``n_distinct_layers`` (blocks with own weights)."""
        s = tying_map(self.model)
        return {"tying_map": s, "n_distinct_layers": sum(1 for i, j in enumerate(s) if i == j)}

    def state_dict(self) -> dict[str, Any]:
        return {"tying_map": tying_map(self.model)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Re-create the saved sharing (before the model's weights are loaded into it).

        Raises:
            ValueError: the saved map does not fit this model.
        """
        if state.get("tying_map") is not None:
            self._apply(state["tying_map"])


class AllTying(_MapTying):
    """``tying: all``: every block shares block 0's weights for the whole run (ALBERT-style)."""

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        self._apply([0] * self.n_layers)


class EveryKTying(_MapTying):
    """``tying: every_k``: blocks ``k*m .. k*m + k-1`` share block ``k*m``'s weights, fixed.

    ``k`` = ``cfg["tying_k"]`` (default 2); ``k = 1`` unties everything, ``k >= L`` ties all.

    Raises:
        ValueError: ``tying_k < 1``.
    """

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        k = cfg.get("tying_k")
        self.k = DEFAULT_TYING_K if k is None else int(k)
        if self.k < 1:
            raise ValueError(f"tying_k must be >= 1, got {k!r}")
        self._apply([self.k * (i // self.k) for i in range(self.n_layers)])


class RLTying(_MapTying):
    """``tying: rl``: a Q-learning agent re-decides the tying of every block once per round
    (every ``tying_every`` batches) until ``tying_explore_frac`` of the run, then freezes the map.

    Starts with every block tied to block 0. See the module docstring for the algorithm
    (Hay & Wolf, ICLR 2024). Config: ``tying_max_distinct`` (at most this many blocks with
    weights of their own, default ``L`` = no limit: a budget of trainable parameters; actions
    that would exceed it are never taken nor bootstrapped from), ``tying_every`` (batches per
    round, default 8),
    ``tying_explore_frac`` (fraction of the run's rounds with decisions, default 0.4),
    ``tying_total_steps`` (run length in steps, default from ``settings``: :func:`total_steps`);
    the agent is seeded with ``settings["seed"]``.

    Attributes:
        rounds: exploring rounds taken; decisions: block decisions taken (incl. the final greedy
        round); frozen: the map is final; last_reward / last_td_loss: of the latest round.

    Raises:
        ValueError: ``tying_every < 1``, ``tying_explore_frac`` outside (0, 1] or
            ``tying_max_distinct`` outside ``[1, L]``.
    """

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        every = cfg.get("tying_every")
        self.every = DEFAULT_TYING_EVERY if every is None else int(every)
        if self.every < 1:
            raise ValueError(f"tying_every must be >= 1, got {every!r}")
        cap = cfg.get("tying_max_distinct")
        self.max_distinct = self.n_layers if cap is None else int(cap)
        if not 1 <= self.max_distinct <= max(self.n_layers, 1):
            raise ValueError(f"tying_max_distinct must be in [1, n_layers={self.n_layers}], got {cap!r}")
        frac = cfg.get("tying_explore_frac")
        frac = DEFAULT_EXPLORE_FRAC if frac is None else float(frac)
        if not 0.0 < frac <= 1.0:
            raise ValueError(f"tying_explore_frac must be in (0, 1], got {frac!r}")
        self.total_rounds = max(1, total_steps(cfg, settings, loop) // self.every)
        #: rounds with exploration; the greedy final round follows them
        self.explore_rounds = max(1, round(frac * self.total_rounds))
        n_explore = self.explore_rounds * max(1, self.n_layers - 1)
        self.agent = TyingAgent(self.n_layers, epsilon=1.0, epsilon_min=EPSILON_END,
                                epsilon_decay=EPSILON_END ** (1.0 / n_explore),
                                seed=int(settings.get("seed", 0)))
        if self.max_distinct < self.n_layers:
            self.agent.feasible = self.feasible
        self.reward = ImprovementReward()
        self.losses: list[float] = []  # training losses of the current interval
        self.pending: list[dict[str, Any]] = []  # the last round's transitions, rewarded next
        self.rounds = 0
        self.decisions = 0
        self.frozen = False
        self.last_reward: float | None = None
        self.last_td_loss: float | None = None
        self._apply([0] * self.n_layers)

    def feasible(self, state: Sequence[int], layer: int) -> list[bool]:
        """Which actions ``j = 0..layer`` of block ``layer`` keep the map within
        ``tying_max_distinct`` distinct blocks (the budget of trainable parameters: all blocks
        have the same size)."""
        return [sum(i == t for i, t in enumerate(next_map(state, layer, j))) <= self.max_distinct
                for j in range(layer + 1)]

    def after_step(self, step: int, loss: float) -> None:
        """Collect the batch loss; at the end of each interval reward the previous round's
        decisions (replay + TD updates), then run the next round (or the final greedy one)."""
        if self.n_layers < 2 or self.frozen:
            return
        self.losses.append(float(loss))
        if len(self.losses) < self.every:
            return
        r = self.reward(sum(self.losses) / len(self.losses))
        self.losses = []
        if self.pending and r is not None:
            for t in self.pending:
                self.agent.remember(t["state"], t["layer"], t["action"], r, t["next_state"], t["next_layer"])
            self.last_td_loss = self.agent.replay(UPDATES_PER_ROUND)
        self.last_reward = r
        self.pending = []
        greedy = self.rounds >= self.explore_rounds
        self._round(greedy)
        if greedy:
            self.frozen = True
        else:
            self.rounds += 1

    def _round(self, greedy: bool) -> None:
        """Decide for blocks ``1 .. L-1`` in turn (each sees the map the earlier ones left)."""
        state = tying_map(self.model)
        changed = False
        for layer in range(1, self.n_layers):
            action = self.agent.act(state, layer, greedy=greedy)
            nxt = next_map(state, layer, action)
            changed |= set_layer(self.model, layer, action)
            self.pending.append({"state": state, "layer": layer, "action": action, "next_state": nxt,
                                 "next_layer": layer + 1 if layer + 1 < self.n_layers else 1})
            state = nxt
            self.decisions += 1
            if not greedy:
                self.agent.decay_epsilon()
        if greedy:
            self.pending = []
        if changed:
            sync_optimizer(self.loop)

    def state_dict(self) -> dict[str, Any]:
        return {"tying_map": tying_map(self.model), "agent": self.agent.state_dict(),
                "reward": self.reward.state_dict(), "losses": list(self.losses),
                "pending": [dict(t) for t in self.pending], "rounds": self.rounds,
                "decisions": self.decisions, "frozen": self.frozen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "agent" in state:
            self.agent.load_state_dict(state["agent"])
            self.reward.load_state_dict(state["reward"])
            self.losses = [float(v) for v in state["losses"]]
            self.pending = [{k: ([int(x) for x in v] if k in ("state", "next_state") else int(v))
                             for k, v in t.items()} for t in state["pending"]]
            self.rounds = int(state["rounds"])
            self.decisions = int(state["decisions"])
            self.frozen = bool(state["frozen"])
