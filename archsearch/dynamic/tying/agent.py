"""The Q-learning parts of ``tying: rl``: Q-network, replay buffer, agent and reward.

Hay & Wolf, "Dynamic Layer Tying for Parameter-Efficient Transformers", ICLR 2024, Sec. 3: the
Q-learning formulation (a state of tying choices, an action per block, a Q-network over them).
Ours, not the paper's (issue 16; the paper's agent is ``tying: paper``,
:class:`archsearch.dynamic.tying.rl.PaperTying`): the replay buffer, the target network and
:class:`ImprovementReward` (the paper rewards each decision with minus the perplexity of one
training batch). :class:`archsearch.dynamic.tying.rl.RLTying` runs them (rounds, exploration
schedule, freezing).
:class:`TyingAgent`'s defaults are the fields of
:class:`~archsearch.dynamic.tying.settings.RLTyingSettings` (``tying_hidden``, ``tying_gamma``,
``tying_lr``, ``tying_epsilon_end``, ``tying_replay_size``, ``tying_replay_batch``,
``tying_target_sync``), where each one's reason is given.

A decision of block ``i`` is an action ``j`` in ``0..i`` (use block ``j``'s weights; ``j = i``:
its own) taken in a tying state ``s`` (:mod:`archsearch.dynamic.tying.maps`); the Q-network reads
``s`` scaled to [0, 1] by ``L - 1`` and gives every block's action values at once. A transition is
``(s, i, a, r, s', i')`` with ``i'`` the block decided next; the TD target maxes over ``i'``'s
(allowed) actions of the *target* network.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.dynamic.tying.settings import RLTyingSettings

#: The agent's defaults (one place: the settings fields).
_D = RLTyingSettings()


class QNetwork(nn.Module):
    """MLP ``L -> hidden -> ReLU -> L(L+1)/2``: action values of every block's choices.

    Block ``i`` owns outputs ``offset(i) .. offset(i) + i`` (``offset(i) = i(i+1)/2``); output
    ``offset(i) + j`` is the value of "block ``i`` uses block ``j``'s weights" (``j = i``: its own).
    """

    def __init__(self, n_layers: int, hidden: int = _D.tying_hidden):
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

    Args (keyword-only after ``n_layers``; defaults: the ``RLTyingSettings`` field named):
        n_layers: ``L``, blocks of the model.
        hidden: Q-network hidden width (``tying_hidden``).
        gamma: discount (``tying_gamma``).
        lr: AdamW learning rate of the Q-network (``tying_lr``).
        epsilon, epsilon_decay, epsilon_min: exploration start (1.0), factor applied after each
            decision (:meth:`decay_epsilon`, 1.0 = constant) and floor (``tying_epsilon_end``).
        buffer_size: replay capacity in transitions (``tying_replay_size``); batch_size:
            transitions per TD update (``tying_replay_batch``).
        target_sync: TD updates between two copies of the online Q-network into the target
            network (``tying_target_sync``).
        seed: seeds the Q-network init, exploration and replay sampling (the global RNG is untouched).

    Raises:
        ValueError: ``n_layers < 1``, ``gamma`` outside [0, 1], non-positive ``lr``, epsilons
            outside [0, 1], non-positive sizes.
    """

    def __init__(self, n_layers: int, *, hidden: int = _D.tying_hidden, gamma: float = _D.tying_gamma,
                 lr: float = _D.tying_lr, epsilon: float = 1.0, epsilon_decay: float = 1.0,
                 epsilon_min: float = _D.tying_epsilon_end, buffer_size: int = _D.tying_replay_size,
                 batch_size: int = _D.tying_replay_batch, target_sync: int = _D.tying_target_sync,
                 seed: int = 0):
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
