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
0. Every ``tying_every`` (default 4) training batches it decides for one block, sweeping blocks
``1 .. L-1`` (block 0 has only one choice): copy an earlier block ``j < i`` or train
independently (``j = i``). Q-network: MLP ``L -> 128 -> ReLU -> L(L+1)/2`` on the state (scaled
to [0, 1] by ``L - 1``); block ``i``'s ``i + 1`` action values are outputs
``i(i+1)/2 .. i(i+1)/2 + i``. Reward of a decision: ``-exp(mean cross-entropy of the
tying_every training batches that follow it)``, clipped to [-10, 10]. One-step Q-learning: MSE
between ``Q(s, a)`` and ``r + gamma * max_a' Q(s', a')`` (``a'`` over the next block's actions,
target without gradient), ``gamma = 0.99``, AdamW lr 1e-3; epsilon-greedy with epsilon from 1.0,
times 0.95 after each sweep, floor 0.01. Seeded from ``settings["seed"]``.

Baselines: :class:`AllTying` (``tying: all``, ALBERT-style, every block shares block 0) and
:class:`EveryKTying` (``tying: every_k``: consecutive groups of ``tying_k`` blocks share one set
of weights, ``s[i] = k * (i // k)``, the "sequence" pattern of Takase & Kiyono 2021, "Lessons on
Parameter Sharing across Layers in Transformers").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.dynamic.base import TrialContext, TyingController

#: Training batches between two decisions of the agent (``tying_every``).
DEFAULT_TYING_EVERY = 4
#: Blocks per shared group of ``tying: every_k`` when ``tying_k`` is not given.
DEFAULT_TYING_K = 2
REWARD_CLIP = 10.0


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


class TyingAgent:
    """Epsilon-greedy one-step Q-learning over tying decisions (Hay & Wolf 2024, Sec. 3).

    Args (keyword-only after ``n_layers``):
        n_layers: ``L``, blocks of the model.
        hidden: Q-network hidden width (128).
        gamma: discount (0.99).
        lr: AdamW learning rate of the Q-network (1e-3).
        epsilon, epsilon_decay, epsilon_min: exploration start (1.0), factor per sweep (0.95)
            and floor (0.01).
        seed: seeds the Q-network init and the exploration RNG (the global RNG is untouched).

    Raises:
        ValueError: ``n_layers < 1``, ``gamma`` outside [0, 1], non-positive ``lr``, epsilons
            outside [0, 1].
    """

    def __init__(self, n_layers: int, *, hidden: int = 128, gamma: float = 0.99, lr: float = 1e-3,
                 epsilon: float = 1.0, epsilon_decay: float = 0.95, epsilon_min: float = 0.01,
                 seed: int = 0):
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        for name, v in (("epsilon", epsilon), ("epsilon_decay", epsilon_decay), ("epsilon_min", epsilon_min)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        self.n_layers, self.gamma = int(n_layers), float(gamma)
        self.epsilon, self.epsilon_decay = float(epsilon), float(epsilon_decay)
        self.epsilon_min = float(epsilon_min)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            self.q = QNetwork(self.n_layers, hidden)
        self.opt = torch.optim.AdamW(self.q.parameters(), lr=float(lr))
        self.rng = torch.Generator().manual_seed(int(seed))
        self.updates = 0

    def encode(self, states: Sequence[Sequence[int]] | torch.Tensor) -> torch.Tensor:
        """Tying states (``N`` lists of ``L`` ints) -> ``N x L`` floats in [0, 1]."""
        s = torch.as_tensor(states, dtype=torch.float32).reshape(-1, self.n_layers)  # (N, L)
        return s / max(1, self.n_layers - 1)

    def q_values(self, state: Sequence[int], layer: int) -> torch.Tensor:
        """``(layer + 1,)`` action values of block ``layer`` in ``state`` (no gradient)."""
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
        if not greedy and float(torch.rand((), generator=self.rng)) < self.epsilon:
            return int(torch.randint(0, layer + 1, (), generator=self.rng))
        return int(self.q_values(state, layer).argmax())

    def td_update(self, states, layers, actions, rewards, next_states, next_layers) -> float:
        """One AdamW step on the MSE between ``Q(s, a)`` and ``r + gamma * max_a' Q(s', a')``.

        Args:
            states, next_states: ``N`` tying states (lists of ``L`` ints) or an ``N x L`` tensor.
            layers: ``N`` blocks the actions were taken for; ``actions``: ``N`` ints, ``0..layer``.
            rewards: ``N`` floats.
            next_layers: ``N`` blocks decided next (the max runs over their actions only).

        Returns:
            the loss before the step (squared TD error, mean over ``N``).
        """
        layers_t = torch.as_tensor(layers, dtype=torch.long)  # (N,)
        actions_t = torch.as_tensor(actions, dtype=torch.long)  # (N,)
        if bool(((actions_t < 0) | (actions_t > layers_t)).any()):
            raise ValueError("each action must be in [0, layer]")
        rewards_t = torch.as_tensor(rewards, dtype=torch.float32)  # (N,)
        nxt = torch.as_tensor(next_layers, dtype=torch.long)  # (N,)
        idx = layers_t * (layers_t + 1) // 2 + actions_t  # (N,)
        with torch.no_grad():
            qn = self.q(self.encode(next_states))  # (N, n_out)
            valid = self.q.out_layer[None, :] == nxt[:, None]  # (N, n_out)
            target = rewards_t + self.gamma * qn.masked_fill(~valid, float("-inf")).amax(dim=1)  # (N,)
        q = self.q(self.encode(states)).gather(1, idx[:, None])[:, 0]  # (N,)
        loss = F.mse_loss(q, target)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.updates += 1
        return float(loss.detach())

    def end_sweep(self) -> None:
        """Decay epsilon once (after each sweep over the blocks)."""
        self.epsilon = max(self.epsilon_min, self.epsilon * self.epsilon_decay)

    def state_dict(self) -> dict[str, Any]:
        """Q-network, its optimizer, epsilon, counters and RNG (tensors, numbers, dicts only)."""
        return {"q": self.q.state_dict(), "opt": self.opt.state_dict(), "epsilon": self.epsilon,
                "updates": self.updates, "rng": self.rng.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.opt.load_state_dict(state["opt"])
        self.epsilon = float(state["epsilon"])
        self.updates = int(state["updates"])
        self.rng.set_state(state["rng"])


def reward_from_loss(cross_entropy: float) -> float:
    """``-exp(cross_entropy)`` clipped to [-10, 10] (non-finite losses give -10)."""
    if not math.isfinite(cross_entropy) or cross_entropy > math.log(REWARD_CLIP):
        return -REWARD_CLIP
    return max(-REWARD_CLIP, min(REWARD_CLIP, -math.exp(cross_entropy)))


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
    """``tying: rl``: a Q-learning agent re-ties one block every ``tying_every`` batches.

    Starts with every block tied to block 0. See the module docstring for the algorithm
    (Hay & Wolf, ICLR 2024). Config: ``tying_every`` (batches per decision, default 4); the
    agent is seeded with ``settings["seed"]``.

    Raises:
        ValueError: ``tying_every < 1``.
    """

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        every = cfg.get("tying_every")
        self.every = DEFAULT_TYING_EVERY if every is None else int(every)
        if self.every < 1:
            raise ValueError(f"tying_every must be >= 1, got {every!r}")
        self.agent = TyingAgent(self.n_layers, seed=int(settings.get("seed", 0)))
        self.layer = 1  # next block to decide for
        self.losses: list[float] = []  # training losses since the last decision
        self.pending: dict[str, Any] = {}  # the last decision, rewarded at the next one
        self.decisions = 0
        self.sweeps = 0
        self._apply([0] * self.n_layers)

    def after_step(self, step: int, loss: float) -> None:
        """Collect the batch loss; every ``tying_every`` batches reward the previous decision,
        update the Q-network and decide for the next block (re-tying it, fixing the optimizer)."""
        if self.n_layers < 2:
            return
        self.losses.append(float(loss))
        if len(self.losses) < self.every:
            return
        reward = reward_from_loss(sum(self.losses) / len(self.losses))
        self.losses = []
        state = tying_map(self.model)
        if self.pending:
            p = self.pending
            self.agent.td_update([p["state"]], [p["layer"]], [p["action"]], [reward], [state], [self.layer])
        action = self.agent.act(state, self.layer)
        if set_layer(self.model, self.layer, action):
            sync_optimizer(self.loop)
        self.pending = {"state": state, "layer": self.layer, "action": action}
        self.decisions += 1
        self.layer += 1
        if self.layer >= self.n_layers:
            self.layer = 1
            self.sweeps += 1
            self.agent.end_sweep()

    def state_dict(self) -> dict[str, Any]:
        return {"tying_map": tying_map(self.model), "agent": self.agent.state_dict(),
                "layer": self.layer, "losses": list(self.losses), "pending": dict(self.pending),
                "decisions": self.decisions, "sweeps": self.sweeps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "agent" in state:
            self.agent.load_state_dict(state["agent"])
            self.layer = int(state["layer"])
            self.losses = [float(v) for v in state["losses"]]
            self.pending = {k: ([int(x) for x in v] if k == "state" else int(v))
                            for k, v in state["pending"].items()}
            self.decisions = int(state["decisions"])
            self.sweeps = int(state["sweeps"])
