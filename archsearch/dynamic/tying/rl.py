"""Layer tying learnt by Q-learning: ``tying: rl`` (:class:`RLTying`, ours) and ``tying: paper``
(:class:`PaperTying`, paper-inspired: Hay & Wolf's agent, which differs from their code in the
four ways docs/design.md lists), both built on the map controller
of :mod:`archsearch.dynamic.tying.controllers` (whose docstring lists every controller's settings).

Source: Hay & Wolf, "Dynamic Layer Tying for Parameter-Efficient Transformers", ICLR 2024;
specified in docs/design.md, "Dynamic layer tying". The agent's Q-network, replay buffer and
reward are :mod:`archsearch.dynamic.tying.agent`, the settings
:mod:`archsearch.dynamic.tying.settings`.

**The agent** (``tying: rl``, :class:`RLTying`): the state starts with every block tied to block
0. Training runs in intervals of ``tying_every`` batches. At the end of each interval the agent
runs a *round*: it decides for every block ``1 .. L-1`` in turn (block 0 has only one choice;
each decision sees the map the earlier ones left): copy an earlier block ``j < i`` or train
independently (``j = i``). Q-network: MLP ``L -> tying_hidden -> ReLU -> L(L+1)/2`` on the state
(scaled to [0, 1] by ``L - 1``); block ``i``'s ``i + 1`` action values are outputs
``i(i+1)/2 .. i(i+1)/2 + i``. Reward (:class:`~archsearch.dynamic.tying.agent.ImprovementReward`),
shared by the decisions of a round and computed from the mean training loss of the interval that
follows it: the relative perplexity improvement over the EMA of earlier intervals' perplexities,
minus the EMA of those improvements (detrended: training improves on its own), divided by the
running RMS (normalised), clipped to [-3, 3]. Each decision is a transition ``(s, i, a, r, s',
i+1)`` (block ``L-1`` leads to block 1 of the next round) in a replay buffer of
``tying_replay_size``; after each rewarded round, ``UPDATES_PER_ROUND`` TD updates on minibatches
of ``tying_replay_batch``: MSE between ``Q(s, a)`` and ``r + tying_gamma * max_a' Q_target(s',
a')`` with a target network copied from the online one every ``tying_target_sync`` updates,
AdamW at ``tying_lr``. Epsilon-greedy with epsilon decayed after every decision from 1 to
``tying_epsilon_end`` at the last decision of the first ``tying_explore_frac`` of the run's rounds
(run length: ``tying_total_steps``); then one greedy round sets the final map, which stays frozen
for the rest of training. Seeded from ``settings["seed"]``.

Why (issue 16): with a raw ``-exp(loss)`` reward, gamma 0.99 and single-sample TD updates, one
block decided per interval and epsilon decayed per sweep (still 0.60 at the end), the reward had
no effect on the final map (constant fake rewards gave the same maps) and the constant churn, not
the sharing, cost the perplexity: the agent's final map trained fixed from step 0 reached a
perplexity ratio of 1.027 at the same parameter ratio.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
from typing import Any

from torch import nn

from archsearch.dynamic.base import TrialContext
from archsearch.dynamic.tying.agent import ImprovementReward, TyingAgent
from archsearch.dynamic.tying.controllers import _MapTying, distinct_budget, total_steps
from archsearch.dynamic.tying.maps import apply_tying_map, next_map, set_layer, sync_optimizer, tying_map
from archsearch.dynamic.tying.settings import PaperTyingSettings, RLTyingSettings

#: TD updates (replay minibatches) after each rewarded round.
UPDATES_PER_ROUND = 4


class RLTying(_MapTying):
    """``tying: rl``: a Q-learning agent re-decides the tying of every block once per round
    (every ``tying_every`` batches) until ``tying_explore_frac`` of the run, then freezes the map.

    Starts with every block tied to block 0. See the module docstring for the algorithm
    (Hay & Wolf, ICLR 2024) and :class:`~archsearch.dynamic.tying.settings.RLTyingSettings` for
    the knobs (``tying_every``, ``tying_explore_frac``, ``tying_max_distinct``: a budget of
    blocks with weights of their own, ``tying_total_steps``, the agent's ``tying_gamma``...); the
    agent is seeded with ``settings["seed"]``.

    Attributes:
        rounds: exploring rounds taken; decisions: block decisions taken (incl. the final greedy
        round); frozen: the map is final; last_reward / last_td_loss: of the latest round.

    Raises:
        ValueError: a value :attr:`Settings` refuses (``tying_every < 1``, ``tying_explore_frac``
            outside (0, 1]...) or ``tying_max_distinct`` above ``L``; the message names the key.
    """

    #: ``tying_every``, ``tying_explore_frac``, ``tying_max_distinct``, ``tying_total_steps`` and
    #: the agent's knobs.
    Settings = RLTyingSettings

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        s = self.s
        self.every = s.tying_every
        self.max_distinct = distinct_budget(s.tying_max_distinct, self.n_layers)
        steps = s.tying_total_steps or total_steps(settings, loop)
        self.total_rounds = max(1, steps // self.every)
        #: rounds with exploration; the greedy final round follows them (one round is left for
        #: it even at tying_explore_frac 1, unless the run has a single round)
        self.explore_rounds = max(1, min(round(s.tying_explore_frac * self.total_rounds), self.total_rounds - 1))
        n_explore = self.explore_rounds * max(1, self.n_layers - 1)
        self.agent = TyingAgent(self.n_layers, hidden=s.tying_hidden, gamma=s.tying_gamma, lr=s.tying_lr,
                                epsilon=1.0, epsilon_min=s.tying_epsilon_end,
                                epsilon_decay=s.tying_epsilon_end ** (1.0 / n_explore),
                                buffer_size=s.tying_replay_size, batch_size=s.tying_replay_batch,
                                target_sync=s.tying_target_sync, seed=int(settings.get("seed", 0)))
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


class PaperTying(_MapTying):
    """``tying: paper``: paper-inspired, Hay & Wolf's agent (ICLR 2024, Sec. 3; four differences from
    the authors' code in docs/design.md, "Dynamic layer tying"), beside our
    :class:`RLTying` for comparison.

    Every ``tying_every`` batches the agent decides for ONE block, sweeping ``1 .. L-1`` in turn for
    the whole run (the map is never frozen): copy an earlier block ``j < i`` or train on its own.
    A tied block is a *frozen alias* of its source (:func:`~archsearch.dynamic.tying.maps.set_layer`
    with ``frozen=True``: it computes with the source's current weights, gets no gradient and
    holds no optimizer state). The reward of a decision is ``-min(exp(CE), tying_reward_clip)``,
    CE the loss of the training batch that follows it; each transition gets one online TD update
    (no replay, no target network: :class:`~archsearch.dynamic.tying.agent.TyingAgent` with a
    buffer and a batch of one and the target synced after every update), discount
    ``tying_gamma``; epsilon starts at 1 and is multiplied by ``tying_epsilon_decay`` after each
    sweep, down to ``tying_epsilon_end``. Starts untied (the paper starts from an untied model).
    Seeded from ``settings["seed"]``.

    Attributes:
        decisions: decisions taken; sweeps: full sweeps over the blocks; last_reward / last_td_loss.

    Raises:
        ValueError: a value :attr:`Settings` refuses, or ``tying_max_distinct`` above ``L``.
    """

    #: ``tying_every``, ``tying_gamma``, ``tying_lr``, ``tying_hidden``, ``tying_epsilon_decay``,
    #: ``tying_epsilon_end``, ``tying_reward_clip``, ``tying_max_distinct``.
    Settings = PaperTyingSettings

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        s = self.s
        self.max_distinct = distinct_budget(s.tying_max_distinct, self.n_layers)
        self.agent = TyingAgent(self.n_layers, hidden=s.tying_hidden, gamma=s.tying_gamma, lr=s.tying_lr,
                                epsilon=1.0, epsilon_min=s.tying_epsilon_end, epsilon_decay=s.tying_epsilon_decay,
                                buffer_size=1, batch_size=1, target_sync=1, seed=int(settings.get("seed", 0)))
        if self.max_distinct < self.n_layers:
            self.agent.feasible = self.feasible
        self.pending: dict[str, Any] | None = None  # the last decision, rewarded by the next batch
        self.layer = 1  # the block decided next
        self.decisions = 0
        self.sweeps = 0
        self.last_reward: float | None = None
        self.last_td_loss: float | None = None
        if self.max_distinct < self.n_layers:  # start within the budget: every block on block 0
            self._apply([0] * self.n_layers)

    feasible = RLTying.feasible

    def _apply(self, s: Sequence[int]) -> None:
        if apply_tying_map(self.model, s, frozen=True):
            sync_optimizer(self.loop)

    def after_step(self, step: int, loss: float) -> None:
        """Reward the pending decision with this batch's loss (one online TD update); every
        ``tying_every`` steps decide for the next block of the sweep."""
        if self.n_layers < 2:
            return
        if self.pending is not None:
            r = -min(math.exp(min(float(loss), 700.0)), self.s.tying_reward_clip)
            t = self.pending
            self.last_td_loss = self.agent.td_update([t["state"]], [t["layer"]], [t["action"]], [r],
                                                     [t["next_state"]], [t["next_layer"]])
            self.last_reward = r
            self.pending = None
        if step % self.s.tying_every:
            return
        state = tying_map(self.model)
        layer = self.layer
        action = self.agent.act(state, layer)
        nxt = next_map(state, layer, action)
        if set_layer(self.model, layer, action, frozen=True):
            sync_optimizer(self.loop)
        self.layer = layer + 1 if layer + 1 < self.n_layers else 1
        self.pending = {"state": state, "layer": layer, "action": action, "next_state": nxt,
                        "next_layer": self.layer}
        self.decisions += 1
        if self.layer == 1:
            self.sweeps += 1
            self.agent.decay_epsilon()

    def state_dict(self) -> dict[str, Any]:
        return {"tying_map": tying_map(self.model), "agent": self.agent.state_dict(),
                "pending": None if self.pending is None else dict(self.pending), "layer": self.layer,
                "decisions": self.decisions, "sweeps": self.sweeps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "agent" in state:
            self.agent.load_state_dict(state["agent"])
            p = state["pending"]
            self.pending = None if p is None else {
                k: ([int(x) for x in v] if k in ("state", "next_state") else int(v)) for k, v in p.items()}
            self.layer = int(state["layer"])
            self.decisions = int(state["decisions"])
            self.sweeps = int(state["sweeps"])
