"""Layer tying during training: Q-learning agents (``tying: rl``, ours; ``tying: paper``, Hay &
Wolf's as their code runs it), a held-out switch (``tying: switch``) and fixed maps (``all``,
``every_k``).

Source: Hay & Wolf, "Dynamic Layer Tying for Parameter-Efficient Transformers", ICLR 2024;
specified in docs/design.md, "Dynamic layer tying". Modules: the tying maps and real parameter
sharing (:mod:`archsearch.dynamic.tying_maps`), the agent's Q-network, replay buffer and reward
(:mod:`archsearch.dynamic.tying_agent`), the settings (:mod:`archsearch.dynamic.tying_settings`),
and here the controllers the trial loop runs.

**Settings** (trial-config keys; the defaults and their reasons are in the field descriptions,
nowhere else): :class:`AllTying` has none; :class:`EveryKTying`: ``tying_k``
(:class:`~archsearch.dynamic.tying_settings.EveryKTyingSettings`); :class:`RLTying`:
``tying_every``, ``tying_explore_frac``, ``tying_max_distinct``, ``tying_total_steps`` and the
agent's ``tying_gamma``, ``tying_lr``, ``tying_hidden``, ``tying_epsilon_end``,
``tying_replay_size``, ``tying_replay_batch``, ``tying_target_sync``
(:class:`~archsearch.dynamic.tying_settings.RLTyingSettings`); :class:`SwitchTying`:
``tying_k``, ``tying_check_every``, ``tying_patience``, ``tying_split``
(:class:`~archsearch.dynamic.tying_settings.SwitchTyingSettings`); :class:`PaperTying`: the
:class:`~archsearch.dynamic.tying_settings.PaperTyingSettings` fields (``tying_every``,
``tying_gamma``, ``tying_lr``, ``tying_hidden``, ``tying_epsilon_decay``, ...).

**The agent** (``tying: rl``, :class:`RLTying`): the state starts with every block tied to block
0. Training runs in intervals of ``tying_every`` batches. At the end of each interval the agent
runs a *round*: it decides for every block ``1 .. L-1`` in turn (block 0 has only one choice;
each decision sees the map the earlier ones left): copy an earlier block ``j < i`` or train
independently (``j = i``). Q-network: MLP ``L -> tying_hidden -> ReLU -> L(L+1)/2`` on the state
(scaled to [0, 1] by ``L - 1``); block ``i``'s ``i + 1`` action values are outputs
``i(i+1)/2 .. i(i+1)/2 + i``. Reward (:class:`~archsearch.dynamic.tying_agent.ImprovementReward`),
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

Baselines: :class:`AllTying` (``tying: all``, ALBERT-style, every block shares block 0) and
:class:`EveryKTying` (``tying: every_k``: consecutive groups of ``tying_k`` blocks share one set
of weights, ``s[i] = k * (i // k)``, the "sequence" pattern of Takase & Kiyono 2021, "Lessons on
Parameter Sharing across Layers in Transformers").
"""

from __future__ import annotations

from collections.abc import Sequence
import math
from typing import Any

from torch import nn

from archsearch.dynamic.base import TrialContext, TyingController, planned_steps
from archsearch.dynamic.tying_agent import ImprovementReward, TyingAgent
from archsearch.dynamic.tying_maps import (
    apply_tying_map,
    model_blocks,
    next_map,
    set_layer,
    sync_optimizer,
    tying_map,
)
from archsearch.dynamic.tying_settings import (
    AllTyingSettings,
    EveryKTyingSettings,
    PaperTyingSettings,
    RLTyingSettings,
    SwitchTyingSettings,
)

#: TD updates (replay minibatches) after each rewarded round.
UPDATES_PER_ROUND = 4


def total_steps(settings: dict[str, Any], loop: TrialContext | None = None) -> int:
    """Optimizer steps of the whole run: the trial loop's own count
    (:func:`~archsearch.dynamic.base.planned_steps`), or without a loop ``epochs x
    settings["steps_per_epoch"]`` (default 200). :class:`RLTying` uses ``tying_total_steps``
    instead when it is set."""
    if loop is not None:
        return planned_steps(loop)
    return int(settings.get("epochs", 1)) * int(settings.get("steps_per_epoch") or 200)


def distinct_budget(cap: int | None, n_layers: int) -> int:
    """Blocks that may keep weights of their own: ``tying_max_distinct`` (``cap``), or all
    ``n_layers`` when it is None.

    Raises:
        ValueError: ``cap`` above ``n_layers`` (names the key).
    """
    budget = n_layers if cap is None else cap
    if budget > max(n_layers, 1):
        raise ValueError(f"tying_max_distinct: must be at most n_layers={n_layers}, got {cap}")
    return budget


class _MapTying(TyingController):
    """Shared part of the controllers: apply a map, keep the optimizer in step, report, save."""

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        self.n_layers = len(model_blocks(model))

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

    #: No knobs.
    Settings = AllTyingSettings

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        self._apply([0] * self.n_layers)


def every_k_map(n_layers: int, k: int) -> list[int]:
    """The ``every_k`` map: ``s[i] = k * (i // k)`` (consecutive groups of ``k`` blocks)."""
    return [k * (i // k) for i in range(n_layers)]


class EveryKTying(_MapTying):
    """``tying: every_k``: blocks ``k*m .. k*m + k-1`` share block ``k*m``'s weights, fixed.

    ``k`` = ``tying_k``; ``k = 1`` unties everything, ``k >= L`` ties all.

    Raises:
        ValueError: ``tying_k < 1`` or not an int (names the key).
    """

    #: ``tying_k``.
    Settings = EveryKTyingSettings

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        self.k = self.s.tying_k
        self._apply(every_k_map(self.n_layers, self.k))


class SwitchTying(_MapTying):
    """``tying: switch``: untied while the loss on a held-out split improves, then the
    ``every_k`` map (shared Parameters, each group taking its first block's weights; the Adam
    state of the Parameters kept) for the rest of the run.

    Tying regularises an over-parameterised model (Hay & Wolf, ICLR 2024, sec. 4) but a tied
    model also learns more slowly while the untied one still generalises better; this switches
    when the untied model starts to overfit: every ``tying_check_every`` steps the mean loss on
    ``tying_split`` (the trial loop's evaluation batches through the full model, no gradient) is
    read, and after ``tying_patience`` checks in a row without a new minimum the map is applied,
    once. (Progressive sharing in the other direction, deep from shallow, is Gong et al.,
    "Efficient Training of BERT by Progressively Stacking", ICML 2019.) Measured in
    ``benchmarks/tying.py`` (``benchmarks/results/tying.json``, 3 seeds, data-limited char LM):
    level with the best fixed map of its size (+0.001 validation perplexity; per seed -0.12,
    -0.11, +0.24), so not a recommended default; kept for regimes where the switch's timing
    matters more.

    Attributes:
        switch_step: the step of the switch (``None`` before); best: the held-out minimum so far.

    Raises:
        ValueError: no trial loop (the held-out loss needs one), a ``tying_split`` the trial's
            data lacks, or a value :attr:`Settings` refuses (names the key).
    """

    #: ``tying_k``, ``tying_check_every``, ``tying_patience``, ``tying_split``.
    Settings = SwitchTyingSettings

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        if loop is None:
            raise ValueError("tying: switch reads a held-out loss during training: it needs a trial loop")
        s = self.s
        splits = getattr(loop.data, "data", {})
        if s.tying_split not in splits:
            raise ValueError(f"tying_split: the trial's data has no split {s.tying_split!r} (it has {', '.join(splits)})")
        self.k, self.every, self.patience, self.split = s.tying_k, s.tying_check_every, s.tying_patience, s.tying_split
        self.best = math.inf
        self.bad = 0
        self.switch_step: int | None = None

    def held_out_loss(self) -> float:
        """Mean loss (nats per token or per sample) on ``tying_split``'s evaluation batches."""
        import torch

        loop, was = self.loop, self.model.training
        self.model.eval()
        total, count = 0.0, 0
        try:
            with torch.inference_mode():
                for x, mask, y in loop.eval_batches(self.split):
                    x, y = x.to(loop.device), y.to(loop.device)
                    mask = None if mask is None else mask.to(loop.device)
                    logits = self.model(x, mask)  # the full model: no gating's calibration state
                    total += float(loop.task_loss(logits.float(), y)) * y.numel()
                    count += y.numel()
        finally:
            self.model.train(was)
        return total / max(count, 1)

    def after_step(self, step: int, loss: float) -> None:
        """Every ``tying_check_every`` steps until the switch: read the held-out loss; switch after
        ``tying_patience`` checks without a new minimum."""
        if self.switch_step is not None or step % self.every:
            return
        h = self.held_out_loss()
        if h < self.best:
            self.best, self.bad = h, 0
            return
        self.bad += 1
        if self.bad >= self.patience:
            self._apply(every_k_map(self.n_layers, self.k))
            self.switch_step = step

    def metrics(self) -> dict[str, Any]:
        """:class:`_MapTying`'s, and ``tying_switch_step`` (-1 before the switch)."""
        return {**super().metrics(), "tying_switch_step": -1 if self.switch_step is None else self.switch_step}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best": self.best, "bad": self.bad, "switch_step": self.switch_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.best, self.bad = float(state.get("best", math.inf)), int(state.get("bad", 0))
        self.switch_step = state.get("switch_step")


class RLTying(_MapTying):
    """``tying: rl``: a Q-learning agent re-decides the tying of every block once per round
    (every ``tying_every`` batches) until ``tying_explore_frac`` of the run, then freezes the map.

    Starts with every block tied to block 0. See the module docstring for the algorithm
    (Hay & Wolf, ICLR 2024) and :class:`~archsearch.dynamic.tying_settings.RLTyingSettings` for
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
    """``tying: paper``: Hay & Wolf's agent as their code runs it (ICLR 2024, Sec. 3), beside our
    :class:`RLTying` for comparison.

    Every ``tying_every`` batches the agent decides for ONE block, sweeping ``1 .. L-1`` in turn for
    the whole run (the map is never frozen): copy an earlier block ``j < i`` or train on its own.
    A tied block is a *frozen alias* of its source (:func:`~archsearch.dynamic.tying_maps.set_layer`
    with ``frozen=True``: it computes with the source's current weights, gets no gradient and
    holds no optimizer state). The reward of a decision is ``-min(exp(CE), tying_reward_clip)``,
    CE the loss of the training batch that follows it; each transition gets one online TD update
    (no replay, no target network: :class:`~archsearch.dynamic.tying_agent.TyingAgent` with a
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
