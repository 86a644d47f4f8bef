"""Layer tying during training: the controllers with a fixed map (``tying: all``, ``every_k``), the
held-out switch (``tying: switch``), the held-out merges (``tying: merge``), and the base every tying controller shares (apply a map, keep
the optimizer in step, report, save); the Q-learning agents (``tying: rl``, ours; ``tying:
paper``, paper-inspired: Hay & Wolf's agent) are :mod:`archsearch.dynamic.tying.rl`.

Source: Hay & Wolf, "Dynamic Layer Tying for Parameter-Efficient Transformers", ICLR 2024;
specified in docs/design.md, "Dynamic layer tying". Modules: the tying maps and real parameter
sharing (:mod:`archsearch.dynamic.tying.maps`), the agent's Q-network, replay buffer and reward
(:mod:`archsearch.dynamic.tying.agent`), the settings (:mod:`archsearch.dynamic.tying.settings`),
the Q-learning controllers (:mod:`archsearch.dynamic.tying.rl`), and here the others.

**Settings** (trial-config keys; the defaults and their reasons are in the field descriptions,
nowhere else): :class:`AllTying` has none; :class:`EveryKTying`: ``tying_k``
(:class:`~archsearch.dynamic.tying.settings.EveryKTyingSettings`);
:class:`~archsearch.dynamic.tying.rl.RLTying`: ``tying_every``, ``tying_explore_frac``,
``tying_max_distinct``, ``tying_total_steps`` and the agent's ``tying_gamma``, ``tying_lr``,
``tying_hidden``, ``tying_epsilon_end``, ``tying_replay_size``, ``tying_replay_batch``,
``tying_target_sync`` (:class:`~archsearch.dynamic.tying.settings.RLTyingSettings`);
:class:`SwitchTying`: ``tying_k``, ``tying_check_every``, ``tying_patience``, ``tying_split``
(:class:`~archsearch.dynamic.tying.settings.SwitchTyingSettings`);
:class:`~archsearch.dynamic.tying.rl.PaperTying`: the
:class:`~archsearch.dynamic.tying.settings.PaperTyingSettings` fields (``tying_every``,
``tying_gamma``, ``tying_lr``, ``tying_hidden``, ``tying_epsilon_decay``, ...).

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
from archsearch.dynamic.tying.maps import (apply_tying_map, groups_of, mean_weights, merge_blocks, model_blocks,
                                           sync_optimizer, tying_map, untie_groups)
from archsearch.dynamic.tying.settings import (AllTyingSettings, EveryKTyingSettings, MergeTyingSettings,
                                               SwitchTyingSettings)


def total_steps(settings: dict[str, Any], loop: TrialContext | None = None) -> int:
    """Optimizer steps of the whole run: the trial loop's own count
    (:func:`~archsearch.dynamic.base.planned_steps`), or without a loop ``epochs x
    settings["steps_per_epoch"]`` (default 200). :class:`~archsearch.dynamic.tying.rl.RLTying`
    uses ``tying_total_steps`` instead when it is set."""
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
    ``benchmarks/tying/tying.py`` (``benchmarks/tying/results/tying.json``, 3 seeds, data-limited char LM):
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
        self._held_out_checks("switch", loop)
        self.k = self.s.tying_k
        self.switch_step: int | None = None

    def _held_out_checks(self, name: str, loop: TrialContext | None) -> None:
        """Validate the trial loop and ``tying_split``; set the check cadence and the minimum so far."""
        if loop is None:
            raise ValueError(f"tying: {name} reads a held-out loss during training: it needs a trial loop")
        s = self.s
        splits = getattr(loop.data, "data", {})
        if s.tying_split not in splits:
            raise ValueError(f"tying_split: the trial's data has no split {s.tying_split!r} (it has {', '.join(splits)})")
        self.every, self.patience, self.split = s.tying_check_every, s.tying_patience, s.tying_split
        self.best, self.bad = math.inf, 0

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


class MergeTying(SwitchTying):
    """``tying: merge``: untied while the held-out loss improves, then greedy merges of
    neighbouring groups that keep what was learned.

    Before: as :class:`SwitchTying` (a check every ``tying_check_every`` steps; after
    ``tying_patience`` checks without a new held-out minimum merging starts). Then at each check,
    every pair of neighbouring groups is scored by the held-out loss of the model with the pair's
    blocks at their mean weights (what the merged group starts from) plus ``tying_price`` x the
    fraction of block parameters left (``n_groups / n_layers``); the best pair is merged when its
    score is below the current model's (:func:`~archsearch.dynamic.tying.maps.merge_blocks`: mean
    weights, mean AdamW moments), at most one merge per check, and merges are never undone
    in this first design (issue 67; merging by function-preserving averages in the spirit of model soups, Wortsman et
    al. ICML 2022, applied within one network's layers). Measured in
    ``benchmarks/tying/tying_regularised.py`` (``tying_merge`` rows).

    With ``tying_tentative`` (the second design, the default since it measured better:
    ``benchmarks/tying/results/tying_regularised.json``, addendum 2): the best-scored pair is merged at once and
    trained for one check interval; at the next check the merge is kept if the priced score is
    then below the score before it, else the pair is split again with
    :func:`~archsearch.dynamic.tying.maps.untie_groups` (clones of the merged group's weights and
    Adam moments) and never tried again. A check that gives a verdict makes no new merge (the
    model then stays settled for one interval, so checkpoints are not all fresh merges), and no
    tentative merge starts when fewer than ``tying_check_every`` steps of the run are left.

    Attributes:
        merge_start: the step merging started (``None`` before); merges: ``[(step, map)]`` (kept
            merges); reverts: ``[(step, blocks)]`` (tentative merges undone).

    Raises:
        ValueError: as :class:`SwitchTying`.
    """

    #: ``tying_check_every``, ``tying_patience``, ``tying_split``, ``tying_price``.
    Settings = MergeTyingSettings

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        _MapTying.__init__(self, model, cfg, settings, loop)  # SwitchTying's checks, without its tying_k
        self._held_out_checks("merge", loop)
        self.price, self.tentative = self.s.tying_price, self.s.tying_tentative
        self.merge_start: int | None = None
        self.merges: list[tuple[int, list[int]]] = []
        self.reverts: list[tuple[int, list[int]]] = []
        #: a tentative merge awaiting its verdict: step, blocks, the map and the priced score before it
        self.pending: dict[str, Any] | None = None
        self.rejected: set[tuple[int, ...]] = set()

    def _score(self, n_groups: int, loss: float) -> float:
        return loss + self.price * n_groups / self.n_layers

    def candidate_losses(self) -> list[tuple[list[int], float]]:
        """``[(blocks, held-out loss)]`` of each neighbouring pair of groups at their mean weights
        (the model is restored after each)."""
        import torch

        groups = groups_of(tying_map(self.model))
        blocks = model_blocks(self.model)
        out = []
        for a, b in zip(groups, groups[1:]):
            members = a + b
            owners = [blocks[a[0]], blocks[b[0]]]
            saved = [[p.detach().clone() for p in o.parameters()] for o in owners]
            mean = mean_weights(self.model, members)
            with torch.no_grad():
                for o in owners:
                    for p, w in zip(o.parameters(), mean, strict=True):
                        p.copy_(w)
            try:
                out.append((members, self.held_out_loss()))
            finally:
                with torch.no_grad():
                    for o, ws in zip(owners, saved):
                        for p, w in zip(o.parameters(), ws, strict=True):
                            p.copy_(w)
        return out

    def after_step(self, step: int, loss: float) -> None:
        """Every ``tying_check_every`` steps: read the held-out loss; once merging has started,
        make the best merge whose priced score beats the current model's."""
        if step % self.every:
            return
        h = self.held_out_loss()
        if self.merge_start is None:
            if h < self.best:
                self.best, self.bad = h, 0
                return
            self.bad += 1
            if self.bad < self.patience:
                return
            self.merge_start = step
        n = len(groups_of(tying_map(self.model)))
        if self.pending is not None:  # the verdict on last check's tentative merge
            pend, self.pending = self.pending, None
            if self._score(n, h) < pend["score_before"]:
                self.merges.append((pend["step"], tying_map(self.model)))
            else:
                untie_groups(self.model, pend["map_before"], self.loop)
                self.rejected.add(tuple(pend["blocks"]))
                self.reverts.append((step, list(pend["blocks"])))
            return  # a verdict: the next merge waits one interval
        if self.tentative and step + self.every > total_steps(self.settings, self.loop):
            return  # no time left to judge a new merge
        cands = self.candidate_losses() if n > 1 else []
        cands = [c for c in cands if tuple(c[0]) not in self.rejected]  # pairs a tentative merge was undone for
        if not cands:
            return
        members, hc = min(cands, key=lambda c: c[1])
        if self.tentative:
            self.pending = {"step": step, "blocks": list(members), "map_before": tying_map(self.model),
                            "score_before": self._score(n, h)}
            merge_blocks(self.model, members, self.loop)
        elif self._score(n - 1, hc) < self._score(n, h):
            self.merges.append((step, merge_blocks(self.model, members, self.loop)))

    def metrics(self) -> dict[str, Any]:
        """:class:`_MapTying`'s, ``tying_merge_start`` (-1 before), ``tying_merges`` (kept merges)
        and ``tying_reverts`` (tentative merges undone)."""
        return {**_MapTying.metrics(self), "tying_merge_start": -1 if self.merge_start is None else self.merge_start,
                "tying_merges": len(self.merges), "tying_reverts": len(self.reverts)}

    def state_dict(self) -> dict[str, Any]:
        return {**_MapTying.state_dict(self), "best": self.best, "bad": self.bad, "merge_start": self.merge_start,
                "merges": [[st, list(m)] for st, m in self.merges],
                "reverts": [[st, list(b)] for st, b in self.reverts], "pending": self.pending,
                "rejected": [list(r) for r in sorted(self.rejected)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _MapTying.load_state_dict(self, state)
        self.best, self.bad = float(state.get("best", math.inf)), int(state.get("bad", 0))
        self.merge_start = state.get("merge_start")
        self.merges = [(int(st), list(m)) for st, m in state.get("merges", [])]
        self.reverts = [(int(st), list(b)) for st, b in state.get("reverts", [])]
        self.pending = state.get("pending")
        self.rejected = {tuple(r) for r in state.get("rejected", [])}
