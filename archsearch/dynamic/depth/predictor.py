"""Adaptive depth: a structure predictor with RevPC and per-sample early exit (``gating: depth_predictor``).

Source: Li, Li and Wang, "From Static to Dynamic: A Deeper, Faster, and Adaptive Language
Modeling Approach" (structure predictor, RevPC, the gamma-weighted depth penalty; ALBERT-base
1.68x faster at a GLUE average of 85.3 against 84.4). Our specification is the adaptive-depth
section of docs/design.md:

* Every sample runs the first ``n_fixed`` blocks. Its hidden states there, pooled as the
  classifier pools them (mean over non-pad tokens, ``Transformer.pool``), go through a small MLP
  (:class:`~archsearch.dynamic.depth.predictor_model.DepthPredictor`) and a softmax over the
  allowed depths ``n_fixed .. n_layers``: ``probs`` (``B x D``, ``D = n_layers - n_fixed + 1``).
* RevPC (:func:`~archsearch.dynamic.depth.predictor_model.revpc`): ``p_k = sum_{j >= k} probs_j``
  (reverse, cumulative sum, reverse back) is the probability that the depth is at least
  ``n_fixed + k``, i.e. that block ``n_fixed + k`` (1-based) is needed. ``p_0 = 1``.
* Training (:meth:`DepthPredictorGating.scaled_forward`) scales each residual branch of every
  block after the fixed group by its ``p``: ``H~ = H + p * MHA(LN(H))``,
  ``H = H~ + p * FFN(LN(H~))``; blocks' own sub-modules are reused, so with all ``p = 1`` it is
  exactly the model's forward. Post-LN blocks (BERT, MiniLM: the residuals sit inside the
  LayerNorms) are scaled whole, ``H = H + p * (Block(H) - H)``: the same two ends (``p = 1`` the
  block, ``p = 0`` skipped).
* Loss: ``CE + gamma * E[depth] / n_layers`` with ``E[depth] = sum_d d * probs_d`` (blocks)
  averaged over the batch. Normalising by ``n_layers`` puts the penalty in ``[n_fixed/n_layers,
  1]`` whatever the model depth, so one ``gamma`` means the same trade-off for every depth the
  outer loop picks (the seed's ablation: gamma 0.1 slow, 0.9 fast and less accurate).
* Every exit is trained (issue 14; ``depth_all_exits``): each step also runs the unscaled full
  model once and reads every allowed depth's exit (its own head with ``exit_heads``); loss ``+
  CE(deepest) +`` the shallower exits' ``(CE_k + KD_k) / 2`` combined by ``exit_loss``
  (:func:`~archsearch.dynamic.depth.exits.all_exit_loss`: in-place distillation toward the detached
  deepest exit, or toward ``distill_teacher``, :func:`~archsearch.dynamic.depth.exits.load_teacher`),
  so that an early exit is worth taking; after the warm-up, ``depth_supervision`` weighs a
  per-sample label for the predictor (:meth:`DepthPredictorGating.agreement_targets`).
* Budget (issue 14): with ``flops_budget`` gamma is a price, updated after every step by dual
  ascent ``gamma <- max(0, gamma + depth_price_lr * (F - flops_budget))`` with ``F`` the batch's
  expected FLOPs fraction ``sum_d probs_d * FLOPs(d) / FLOPs(full)`` (the configured ``gamma``
  is the initial price); before each evaluation (:meth:`DepthPredictorGating.before_evaluate`)
  the exit threshold is calibrated on validation rows so that the executed FLOPs fraction lands
  on the budget (:meth:`DepthPredictorGating.calibrate`, bisection).
* Inference (:meth:`DepthPredictorGating.predict`): each sample runs block ``n_fixed + k`` while
  ``P(depth >= n_fixed + k) = p_k >= threshold`` -- the median of its predicted depth
  distribution at ``exit_threshold`` 0.5 (the arg-max rule used until issue 14 sent every sample
  to depth 1), or the calibrated threshold under a budget. The batch then runs as one cascade
  (:func:`~archsearch.dynamic.depth.exits.run_cascade`): the rows still running go through each block
  together and leave at their predicted depth; skipped blocks are not computed.

Settings: :class:`~archsearch.dynamic.depth.settings.DepthPredictorSettings` (the strategy's
:attr:`~DepthPredictorGating.Settings`: every key, its range, unit, source and default, the
defaults being the recipe the development runs settled on,
``benchmarks/depth/runs/dynamic_depth_legacy/depth_predictor.json``). The structure
predictor and RevPC live in :mod:`archsearch.dynamic.depth.predictor_model`; the exit rule,
calibration, prediction and depth statistics in :mod:`archsearch.dynamic.depth.predictor_eval`.

Measured: ``benchmarks/depth/results/depth_predictor.json`` (MiniLM-L6, the settings' defaults, 3 seeds,
two datasets, against the same 3-seed static cuts as DHT; ``benchmarks/depth/dht_seeded.py run --dp``).

Classification only (the predictor reads a pooled sequence; a causal LM would need per-token
exits).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.dynamic.base import GatingStrategy, LossFn, TrialContext, planned_steps
from archsearch.dynamic.budget import DualPrice
from archsearch.dynamic.depth.exits import all_exit_loss, load_teacher, read_exits, teacher_logits
from archsearch.dynamic.depth.predictor_eval import DepthPredictorInference
from archsearch.dynamic.depth.predictor_model import DepthHistogram, DepthPredictor, revpc
from archsearch.dynamic.depth.settings import DepthPredictorSettings
from archsearch.models import costs

__all__ = ["DepthPredictor", "DepthPredictorGating", "DepthPredictorSettings", "revpc"]


class DepthPredictorGating(DepthPredictorInference, GatingStrategy):
    """Per-sample adaptive depth with a learned structure predictor (``gating: depth_predictor``).

    See the module docstring for the algorithm and :attr:`Settings` for the config keys.

    Args:
        model: a classification :class:`~archsearch.models.transformer.Transformer`.
        cfg: the trial config (the keys of :attr:`Settings`; ``init_from``, the model key, names
            the architecture of a ``distill_teacher``).
        settings: the trial budget (``epochs``, ``batch_size``: the default warm-up's length).
        loop: the :class:`~archsearch.dynamic.base.TrialContext`, or ``None``; when given,
            :meth:`before_evaluate` calibrates on ``loop.eval_batches()`` under a budget, and
            the default warm-up is 10% of the loop's optimizer steps.

    Raises:
        ValueError: an LM model, a value :attr:`Settings` refuses (names the key),
            ``min_layers`` above ``n_layers``, a ``distill_teacher`` that cannot be loaded.

    Attributes:
        s: the :class:`~archsearch.dynamic.depth.settings.DepthPredictorSettings` in effect.
        threshold: the exit threshold inference uses (``exit_threshold``; set by
            :meth:`calibrate`).
        price: the :class:`~archsearch.dynamic.budget.DualPrice` whose ``price`` is gamma.
        warmup_steps: the warm-up in optimizer steps (``depth_warmup_steps`` resolved).
    """

    Settings = DepthPredictorSettings

    @classmethod
    def exit_head_depths(cls, s: DepthPredictorSettings, model_config) -> list[int]:
        """The allowed depths ``min_layers .. n_layers`` when the exits are trained with their
        own heads (``depth_all_exits`` and ``exit_heads``), as :meth:`__init__` builds them.
        The structure predictor is held by the strategy, not by the model: not counted."""
        if not (s.depth_all_exits and s.exit_heads):
            return []
        return list(range(s.min_layers, int(model_config.n_layers) + 1))

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        config = model.config
        if config.task != "classification":
            raise ValueError("gating 'depth_predictor' needs a classification model "
                             f"(the predictor reads the pooled sequence), got task {config.task!r}")
        super().__init__(model, cfg, settings, loop)
        s = self.s
        self.n_layers = int(config.n_layers)
        self.n_fixed = s.min_layers
        if self.n_fixed > self.n_layers:
            raise ValueError(f"min_layers: must be in [1, n_layers={self.n_layers}], got {self.n_fixed}")
        known = (None if loop is None or s.depth_warmup_steps is not None  # the default's length
                 else planned_steps(loop))
        self.warmup_steps = s.warmup_steps(known)
        self.extra_lr = s.predictor_lr  # the trainable's param group for the predictor
        self.flops_budget = s.flops_budget
        self.price = DualPrice(self.flops_budget, lr=s.depth_price_lr, init=s.gamma)  # price = gamma
        self.all_exits, self.exit_loss, self.supervision = s.depth_all_exits, s.exit_loss, s.supervision
        self.teacher = load_teacher(s.distill_teacher, cfg.get("init_from"), loop)  # KD from a fine-tuned model
        self.threshold = s.exit_threshold
        self.calibration_rows = s.depth_calibration_rows
        self.calibrated_fraction: float | None = None
        self.n_depths = self.n_layers - self.n_fixed + 1
        self.predictor = DepthPredictor(config.d_model, self.n_depths, s.predictor_hidden)
        device = next(model.parameters()).device
        self.predictor.to(device)
        self.depths = torch.arange(self.n_fixed, self.n_layers + 1, device=device)  # (D,) blocks
        if self.all_exits and s.exit_heads:  # trained exits only
            model.add_exit_heads(self.depths.tolist())  # an own classifier per exit
        self.steps = 0  # training steps taken (for the warm-up)
        self.hist = DepthHistogram(self.depths.tolist())  # what predict() did since reset_stats()
        self._last_train = {"expected_depth": float("nan"), "depth_penalty": float("nan")}

    # ------------------------------------------------------------------ the interface
    def extra_modules(self) -> list[nn.Module]:
        """The structure predictor (its parameters join the trial's optimizer)."""
        return [self.predictor]

    @property
    def gamma(self) -> float:
        """The price of depth (the configured gamma, or its dual-ascent value under a budget)."""
        return self.price.price

    @gamma.setter
    def gamma(self, value: float) -> None:
        self.price.price = float(value)

    def _front(self, x: torch.Tensor, mask: torch.Tensor | None):
        """Embed, run the fixed blocks and predict: ``(h, pad_mask, depth_logits)`` with ``h``
        ``B x T x d`` after block ``n_fixed`` and ``depth_logits`` ``B x D`` (from the
        mean over non-pad tokens, as the classifier pools)."""
        pad_mask = self.model.padding_mask(x, mask)  # (B, T)
        h = self.model.embed(x)  # (B, T, d)
        h = self.model.run_layers(h, pad_mask, 0, self.n_fixed)  # (B, T, d)
        self.predictor.train(self.model.training)
        return h, pad_mask, self.predictor(self.model.pool(h, pad_mask))  # pooled as the head pools -> (B, D)

    def scaled_forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, *, full: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The training forward: every block after the fixed group runs with its residual
        branches scaled by the RevPC probability ``p`` that the block is needed.

        Args:
            x: ``B x T`` token ids.
            mask: ``B x T`` bool, True = real token (or ``None``: derived from ``pad_id``).
            full: use ``p = 1`` for every block (warm-up); the result then equals
                ``model(x, mask)`` exactly.

        Returns:
            ``(logits, probs)``: ``B x C`` class logits and ``B x D`` depth probabilities.
        """
        h, pad_mask, depth_logits = self._front(x, mask)
        probs = depth_logits.softmax(-1)  # (B, D)
        p = torch.ones_like(probs) if full else revpc(probs)  # (B, D); p[:, k] scales block n_fixed+k
        attn_mask = self.model._attn_mask(pad_mask, x.shape[1])  # same mask run_layers builds
        for i in range(self.n_fixed, self.n_layers):
            blk = self.model.blocks[i]
            s = p[:, i - self.n_fixed + 1].view(-1, 1, 1)  # (B, 1, 1)
            if blk.post_norm:  # BERT: the residuals sit inside the LayerNorms; scale the whole block
                h = h + s * (blk(h, attn_mask) - h)  # (B, T, d)
                continue
            h = h + s * blk.attn(blk.ln1(h), attn_mask)  # (B, T, d)
            h = h + s * blk.ffn(blk.ln2(h))  # (B, T, d)
        return self.model.head_logits(h, pad_mask), probs  # (B, C), (B, D)

    def expected_depth(self, probs: torch.Tensor) -> torch.Tensor:
        """``B x D`` depth probabilities -> ``B`` expected number of blocks executed."""
        return probs @ self.depths.to(device=probs.device, dtype=probs.dtype)  # (B,)

    def exit_logits(self, x, mask) -> list[torch.Tensor]:
        """The unscaled full model (one forward) read at every allowed depth (its exit head, or
        the shared head): ``D`` tensors ``B x C``, shallowest first."""
        pad_mask = self.model.padding_mask(x, mask)  # (B, T)
        h = self.model.run_layers(self.model.embed(x), pad_mask, 0, self.n_fixed)  # (B, T, d)
        hs = [h]  # exit n_fixed
        for i in range(self.n_fixed, self.n_layers):
            h = self.model.run_layers(h, pad_mask, i, i + 1)
            hs.append(h)
        return read_exits(self.model, hs, pad_mask, list(range(self.n_fixed, self.n_layers + 1)))  # D x (B, C)

    def exit_losses(self, x, mask, y, loss_fn: LossFn) -> tuple[torch.Tensor, torch.Tensor]:
        """All exits of the unscaled full model (:meth:`exit_logits`): ``(CE of the deepest exit,
        the shallower exits' (CE_k + KD_k) / 2 combined by exit_loss)`` (scalars, nats; the
        second is 0 with a single allowed depth; :func:`~archsearch.dynamic.depth.exits.all_exit_loss`;
        with ``distill_teacher``, the KD terms target the teacher)."""
        return all_exit_loss(self.exit_logits(x, mask), y, loss_fn, self.exit_loss,
                             teacher=teacher_logits(self.teacher, x, mask))

    @staticmethod
    def agreement_targets(exits: list[torch.Tensor]) -> torch.Tensor:
        """Per-sample depth targets: the index (into the allowed depths) of the shallowest exit
        whose prediction equals the deepest exit's (``D`` tensors ``B x C`` -> ``B`` long in
        ``[0, D)``; the deepest always agrees with itself). The oracle exit of BERxiT / PABEE-style
        analyses (the cheapest exit that changes nothing), used as a label for the predictor."""
        preds = torch.stack([e.argmax(-1) for e in exits], 1)  # (B, D)
        agree = preds == preds[:, -1:]  # (B, D), last column all True
        return agree.float().argmax(1)  # first True per row -> (B,)

    def _depth_flops(self, T: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """``D`` float64 FLOPs per sample of the allowed depths at length ``T`` (predictor
        included), on ``device`` (cached per length and device)."""
        cache = self.__dict__.setdefault("_depth_flops_cache", {})
        key = (int(T), str(device))
        if key not in cache:
            extra = self.predictor.flops_per_sample()
            depths = range(self.n_fixed, self.n_layers + 1)  # = self.depths, read without a host sync
            cache[key] = torch.tensor([costs.flops_per_sample(self.model.config, T, n_layers=d) + extra
                                       for d in depths], dtype=torch.float64).to(device)
        return cache[key]

    def training_loss(self, x, mask, y, loss_fn: LossFn) -> torch.Tensor:
        """``loss_fn(logits, y) + gamma * mean(E[depth]) / n_layers`` (scalar), plus the all-exit
        term (:meth:`exit_losses`, both parts) when ``depth_all_exits``; during the warm-up
        (:attr:`warmup_steps`) all ``p = 1`` and there is no penalty (with ``depth_all_exits``
        the loss is then the all-exit term alone); after it, with
        ``depth_supervision > 0``, ``+ depth_supervision * NLL(probs, agreement target)``
        (:meth:`agreement_targets` of the detached exits). Records the batch's
        expected FLOPs fraction for the dual ascent in :meth:`after_step`."""
        if self.steps < self.warmup_steps:
            if self.all_exits:
                deep, shallow = self.exit_losses(x, mask, y, loss_fn)
                return deep + shallow
            logits, probs = self.scaled_forward(x, mask, full=True)
            return loss_fn(logits, y)
        logits, probs = self.scaled_forward(x, mask)
        exp_depth = self.expected_depth(probs).mean()  # blocks
        penalty = exp_depth / self.n_layers
        with torch.no_grad():  # the three statistics in one host copy (one device synchronisation)
            fr = self._depth_flops(x.shape[1], probs.device) / costs.flops_per_sample(self.model.config, x.shape[1])
            stats = torch.stack([exp_depth.detach().double(), penalty.detach().double(),
                                 (probs.detach().double() @ fr).mean()]).cpu().tolist()
        self._last_train = dict(zip(("expected_depth", "depth_penalty", "flops_fraction"), stats))
        loss = loss_fn(logits, y) + self.gamma * penalty
        if self.all_exits:
            exits = self.exit_logits(x, mask)
            deep, shallow = all_exit_loss(exits, y, loss_fn, self.exit_loss,
                                          teacher=teacher_logits(self.teacher, x, mask))
            loss = loss + deep + shallow
            if self.supervision > 0:  # per-sample depth labels (deliverable 4, optional)
                target = self.agreement_targets([e.detach() for e in exits])  # (B,)
                loss = loss + self.supervision * F.nll_loss(probs.clamp_min(1e-12).log(), target)
        return loss

    def after_step(self, loss: float) -> None:
        """Count the step; under a budget, one dual-ascent step of gamma on the batch's
        expected FLOPs fraction."""
        self.steps += 1
        frac = self._last_train.pop("flops_fraction", None)
        if frac is not None:
            self.price.update(frac)

    def state_dict(self) -> dict[str, Any]:
        """Predictor weights and the step count (tensors and numbers only)."""
        return {"predictor": self.predictor.state_dict(), "steps": self.steps,
                "price": self.price.state_dict(), "threshold": self.threshold}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.predictor.load_state_dict(state["predictor"])
        self.steps = int(state.get("steps", 0))
        if "price" in state:  # checkpoints from before issue 14 keep the configured gamma
            self.price.load_state_dict(state["price"])
            self.threshold = float(state["threshold"])
