"""Adaptive depth: a structure predictor with RevPC and per-sample early exit (``gating: depth_predictor``).

Source: Li, Li and Wang, "From Static to Dynamic: A Deeper, Faster, and Adaptive Language
Modeling Approach" (structure predictor, RevPC, the gamma-weighted depth penalty; ALBERT-base
1.68x faster at a GLUE average of 85.3 against 84.4). Our specification is the adaptive-depth
section of docs/design.md:

* Every sample runs the first ``n_fixed`` blocks. Its hidden states there, pooled as the
  classifier pools them (mean over non-pad tokens, ``Transformer.pool``), go through a small MLP
  (:class:`DepthPredictor`) and a softmax over the allowed depths ``n_fixed .. n_layers``:
  ``probs`` (``B x D``, ``D = n_layers - n_fixed + 1``). (Until issue 14 it read the first
  token's state while the classifier mean-pools.)
* RevPC (:func:`revpc`): ``p_k = sum_{j >= k} probs_j`` (reverse, cumulative sum, reverse back)
  is the probability that the depth is at least ``n_fixed + k``, i.e. that block
  ``n_fixed + k`` (1-based) is needed. ``p_0 = 1``.
* Training (:meth:`DepthPredictorGating.scaled_forward`) scales each residual branch of every
  block after the fixed group by its ``p``: ``H~ = H + p * MHA(LN(H))``,
  ``H = H~ + p * FFN(LN(H~))``; blocks' own sub-modules are reused, so with all ``p = 1`` it is
  exactly the model's forward. Post-LN blocks (BERT, MiniLM: the residuals sit inside the
  LayerNorms) are scaled whole, ``H = H + p * (Block(H) - H)``: the same two ends (``p = 1`` the
  block, ``p = 0`` skipped). Before stop 28 they were run as pre-LN blocks (a wrong network in
  training; inference, which runs the model's own blocks, was right).
* Loss: ``CE + gamma * E[depth] / n_layers`` with ``E[depth] = sum_d d * probs_d`` (blocks)
  averaged over the batch. Normalising by ``n_layers`` puts the penalty in ``[n_fixed/n_layers,
  1]`` whatever the model depth, so one ``gamma`` means the same trade-off for every depth the
  outer loop picks (the seed's ablation: gamma 0.1 slow, 0.9 fast and less accurate).
* Every exit is trained (issue 14; ``depth_all_exits``, default on): each step also runs the
  unscaled full model once and reads the shared output head after every allowed depth; loss
  ``+ CE(deepest) + mean_k (CE_k + KD_k) / 2`` over the shallower exits, ``KD_k`` the KL
  divergence from the detached deepest exit (in-place distillation, sandwich rule: Yu & Huang
  2019, "Universally Slimmable Networks", §3.2-3.3; Kim & Cho 2021, "Length-Adaptive
  Transformer", §2.2), so that an early exit is worth taking.
* Budget (issue 14): with ``flops_budget`` (fraction of the full model's FLOPs, (0, 1]) gamma is
  a price, updated after every step by dual ascent ``gamma <- max(0, gamma + eta * (F -
  flops_budget))`` with ``F`` the batch's expected FLOPs fraction ``sum_d probs_d *
  FLOPs(d) / FLOPs(full)`` (``eta = depth_price_lr``, default 0.05; the configured ``gamma`` is
  the initial price); and before each evaluation (:meth:`DepthPredictorGating.before_evaluate`)
  the exit threshold is calibrated on validation data so that the executed FLOPs fraction lands
  on the budget (:meth:`DepthPredictorGating.calibrate`, bisection).
* Inference (:meth:`DepthPredictorGating.predict`): each sample runs block ``n_fixed + k`` while
  ``P(depth >= n_fixed + k) = p_k >= threshold`` -- the median of its predicted depth
  distribution at the default threshold 0.5 (the arg-max rule used until issue 14 sent every
  sample to depth 1), or the calibrated threshold under a budget. Samples are grouped by depth
  and each group runs as one real batch through only its blocks (``Transformer.run_layers`` +
  ``head_logits``): skipped blocks are not computed.

Measured before issue 14 (``benchmarks/depth_predictor.py``, from-scratch d=64, 4 layers, 2
epochs on rotten_tomatoes_sentences, first-token input, arg-max exit, no exit training): at gamma
0.1, 0.5 and 0.9 the predictor sent every validation sample to depth 1 (3.2-3.3x faster at batch
32 with accuracy within 0.2 points, but a static 1-layer model did as well). Not re-measured
since.

Classification only (the predictor reads a pooled sequence; a causal LM would need per-token
exits).

Config keys read from the trial config: ``gamma`` (float >= 0, default 0.5, searchable; the
initial price under a budget), ``flops_budget`` (None = no budget), ``min_layers`` (=
``n_fixed``, default 1). Programmatic-only keys (not in the search-space schema; pass them in
``settings["fixed"]``): ``depth_warmup_steps`` (default 0: training steps with all ``p = 1`` and
no penalty before the predictor takes over), ``predictor_hidden`` (MLP width, default 64),
``depth_all_exits`` (default True), ``depth_price_lr`` (0.05), ``exit_threshold`` (0.5),
``depth_calibration_rows`` (2048), ``predictor_lr`` (default: the trial's ``lr``; the
predictor is trained from scratch, and at a fine-tuning lr of 5e-5 its MLP barely leaves its
initialisation in one epoch, so every sample gets the same depth distribution),
``depth_supervision`` (default 0: the weight of a per-sample label for the predictor, NLL of
its depth distribution at the shallowest exit that agrees with the deepest,
:meth:`DepthPredictorGating.agreement_targets`; needs ``depth_all_exits``), ``exit_loss``
(``mean`` or ``sum``: how the shallower exits' losses combine,
:func:`~archsearch.dynamic.exits.all_exit_loss`). Programmatic: ``distill_teacher`` (a
fine-tuned full model's ``state.pt``: the exits distil toward it;
:func:`~archsearch.dynamic.exits.load_teacher`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.dynamic.base import GatingStrategy, LossFn, TrialContext
from archsearch.dynamic.budget import DualPrice, calibrate_monotone
from archsearch.dynamic.exits import all_exit_loss, load_teacher, teacher_logits
from archsearch.models import costs
from archsearch.models.config import trim_padding


def revpc(probs: torch.Tensor) -> torch.Tensor:
    """Reverse cumulative sum (RevPC) of a distribution over depths.

    ``p[..., k] = sum_{j >= k} probs[..., j]``: reverse, cumulative sum, reverse back. For
    ``probs`` over the depths ``n_fixed .. n_layers``, ``p[..., k]`` is the probability that block
    ``n_fixed + k`` (1-based) is needed; ``p[..., 0]`` is the total mass (1 for a softmax). The
    result is non-increasing along the last axis for non-negative ``probs``.

    Args:
        probs: ``... x D`` tensor of non-negative probabilities (rows sum to 1).

    Returns:
        ``... x D`` tensor, same dtype.

    Source: Li, Li and Wang, "From Static to Dynamic" (RevPC).
    """
    return probs.flip(-1).cumsum(-1).flip(-1)  # (..., D)


class DepthPredictor(nn.Module):
    """The structure predictor: LayerNorm -> Linear -> GELU -> Linear over the allowed depths.

    Args:
        d_model: width ``d`` of the pooled hidden state.
        n_depths: number of allowed depths ``D``.
        hidden: MLP width.

    The output bias is zero at start (uniform ``probs``).
    """

    def __init__(self, d_model: int, n_depths: int, hidden: int = 64):
        super().__init__()
        self.d_model, self.n_depths, self.hidden = d_model, n_depths, hidden
        self.ln = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, n_depths)
        nn.init.normal_(self.fc1.weight, std=0.02)
        nn.init.zeros_(self.fc1.bias)
        nn.init.normal_(self.fc2.weight, std=0.02)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``B x d`` pooled hidden state -> ``B x D`` logits over depths."""
        return self.fc2(F.gelu(self.fc1(self.ln(h))))  # (B, D)

    def flops_per_sample(self) -> int:
        """FLOPs of one prediction (the two matrix multiplies, multiply-add = 2 FLOPs), counted
        like :func:`archsearch.models.costs.flops_per_sample` (no LayerNorm/GELU/bias)."""
        return 2 * self.d_model * self.hidden + 2 * self.hidden * self.n_depths


class DepthPredictorGating(GatingStrategy):
    """Per-sample adaptive depth with a learned structure predictor (``gating: depth_predictor``).

    See the module docstring for the algorithm and the config keys.

    Args:
        model: a classification :class:`~archsearch.models.transformer.Transformer`.
        cfg: the trial config (``gamma``, ``flops_budget``, ``min_layers``, and the
            programmatic keys of the module docstring).
        settings: the trial budget (unused).
        loop: the :class:`~archsearch.dynamic.base.TrialContext`, or ``None``; when given,
            :meth:`metrics` runs the predictor on ``loop.eval_batches()``.

    Raises:
        ValueError: an LM model, ``gamma < 0``, ``min_layers`` outside ``[1, n_layers]``,
            negative warm-up, ``predictor_hidden < 1``, ``predictor_lr <= 0``, ``flops_budget``
            outside ``(0, 1]``,
            ``exit_threshold`` outside ``(0, 1]``, negative ``depth_supervision`` (or positive
            without ``depth_all_exits``), ``exit_loss`` not in
            :data:`~archsearch.dynamic.exits.EXIT_LOSSES`.

    Attributes:
        threshold: the exit threshold inference uses (0.5 = the median; set by
            :meth:`calibrate`).
        price: the :class:`~archsearch.dynamic.bandits.DualPrice` whose ``price`` is gamma.
    """

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        config = model.config
        if config.task != "classification":
            raise ValueError("gating 'depth_predictor' needs a classification model "
                             f"(first-token pooling), got task {config.task!r}")
        self.n_layers = int(config.n_layers)
        self.n_fixed = int(cfg.get("min_layers") or 1)
        if not 1 <= self.n_fixed <= self.n_layers:
            raise ValueError(f"min_layers (n_fixed) must be in [1, n_layers={self.n_layers}], got {self.n_fixed}")
        gamma = cfg.get("gamma")
        self.gamma = 0.5 if gamma is None else float(gamma)
        if not self.gamma >= 0.0:
            raise ValueError(f"gamma must be >= 0, got {self.gamma}")
        self.warmup_steps = int(cfg.get("depth_warmup_steps") or 0)
        if self.warmup_steps < 0:
            raise ValueError(f"depth_warmup_steps must be >= 0, got {self.warmup_steps}")
        plr = cfg.get("predictor_lr")
        self.extra_lr = None if plr is None else float(plr)  # the trainable's param group for the predictor
        if self.extra_lr is not None and not self.extra_lr > 0:
            raise ValueError(f"predictor_lr must be > 0, got {self.extra_lr}")
        hidden = int(cfg.get("predictor_hidden") or 64)
        if hidden < 1:
            raise ValueError(f"predictor_hidden must be >= 1, got {hidden}")
        budget = cfg.get("flops_budget")
        self.flops_budget = None if budget is None else float(budget)
        if self.flops_budget is not None and not 0 < self.flops_budget <= 1:
            raise ValueError(f"flops_budget must be in (0, 1], got {self.flops_budget}")
        self.price = DualPrice(self.flops_budget, lr=float(cfg.get("depth_price_lr") or 0.05), init=self.gamma)
        self.all_exits = bool(cfg.get("depth_all_exits", True))
        self.exit_loss = str(cfg.get("exit_loss") or "mean")
        if cfg.get("distill_teacher") and not self.all_exits:
            raise ValueError("distill_teacher needs depth_all_exits (the teacher trains the exits)")
        self.teacher = load_teacher(cfg, loop)  # ``distill_teacher``: KD from a fine-tuned model
        self.supervision = float(cfg.get("depth_supervision") or 0.0)
        if self.supervision < 0 or (self.supervision > 0 and not self.all_exits):
            raise ValueError(f"depth_supervision must be >= 0 and needs depth_all_exits, got {self.supervision}")
        thr = cfg.get("exit_threshold")
        self.threshold = 0.5 if thr is None else float(thr)
        if not 0 < self.threshold <= 1:
            raise ValueError(f"exit_threshold must be in (0, 1], got {self.threshold}")
        self.calibration_rows = int(cfg.get("depth_calibration_rows") or 2048)
        self.calibrated_fraction: float | None = None
        self.n_depths = self.n_layers - self.n_fixed + 1
        self.predictor = DepthPredictor(config.d_model, self.n_depths, hidden)
        device = next(model.parameters()).device
        self.predictor.to(device)
        self.depths = torch.arange(self.n_fixed, self.n_layers + 1, device=device)  # (D,) blocks
        if self.all_exits and bool(cfg.get("exit_heads", False)):  # trained exits only
            model.add_exit_heads(self.depths.tolist())  # an own classifier per exit
        self.steps = 0  # training steps taken (for the warm-up)
        self._hist = torch.zeros(self.n_depths, dtype=torch.long)  # counts since reset_stats()
        self._expected_sum = 0.0
        self._last_train = {"expected_depth": float("nan"), "depth_penalty": float("nan")}

    # ------------------------------------------------------------------ the interface
    def extra_modules(self) -> list[nn.Module]:
        """The structure predictor (its parameters join the trial's optimizer)."""
        return [self.predictor]

    @property
    def gamma(self) -> float:
        """The price of depth (the configured gamma, or its dual-ascent value under a budget)."""
        return self.price.price if hasattr(self, "price") else self._gamma0

    @gamma.setter
    def gamma(self, value: float) -> None:
        if hasattr(self, "price"):
            self.price.price = float(value)
        else:
            self._gamma0 = float(value)

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
        return probs @ self.depths.to(probs.dtype)  # (B,)

    def exit_logits(self, x, mask) -> list[torch.Tensor]:
        """The unscaled full model (one forward) read at every allowed depth (its exit head, or
        the shared head): ``D`` tensors ``B x C``, shallowest first."""
        pad_mask = self.model.padding_mask(x, mask)  # (B, T)
        h = self.model.run_layers(self.model.embed(x), pad_mask, 0, self.n_fixed)  # (B, T, d)
        exits = [self.model.head_logits(h, pad_mask, depth=self.n_fixed)]  # exit n_fixed: (B, C)
        for i in range(self.n_fixed, self.n_layers):
            h = self.model.run_layers(h, pad_mask, i, i + 1)
            exits.append(self.model.head_logits(h, pad_mask, depth=i + 1))
        return exits

    def exit_losses(self, x, mask, y, loss_fn: LossFn) -> tuple[torch.Tensor, torch.Tensor]:
        """All exits of the unscaled full model (:meth:`exit_logits`): ``(CE of the deepest exit,
        mean_k (CE_k + KD_k) / 2 over the shallower exits)`` (scalars, nats; the second is 0 with
        a single allowed depth; summed instead of averaged with ``exit_loss: sum``, at full weight with ``equal``;
        :func:`~archsearch.dynamic.exits.all_exit_loss`; with ``distill_teacher``, the KD terms
        target the teacher)."""
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

    def _flops_fractions(self, T: int) -> torch.Tensor:
        """``D`` FLOPs fractions of the allowed depths at length ``T`` (predictor included)."""
        full = costs.flops_per_sample(self.model.config, T)
        extra = self.predictor.flops_per_sample()
        return torch.tensor([(costs.flops_per_sample(self.model.config, T, n_layers=int(d)) + extra) / full
                             for d in self.depths.tolist()], dtype=torch.float64)

    def training_loss(self, x, mask, y, loss_fn: LossFn) -> torch.Tensor:
        """``loss_fn(logits, y) + gamma * mean(E[depth]) / n_layers`` (scalar), plus the all-exit
        term (:meth:`exit_losses`, both parts) when ``depth_all_exits``; during the warm-up
        (``depth_warmup_steps``) all ``p = 1`` and there is no penalty; after it, with
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
        with torch.no_grad():
            frac = float((probs.detach().double().cpu() @ self._flops_fractions(x.shape[1])).mean())
        self._last_train = {"expected_depth": float(exp_depth.detach()),
                            "depth_penalty": float(penalty.detach()), "flops_fraction": frac}
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

    def exit_index(self, depth_logits: torch.Tensor, threshold: float | None = None) -> torch.Tensor:
        """``B x D`` depth logits -> ``B`` exit indices into ``depths``: the number of blocks
        after the fixed group with ``P(depth >= block) >= threshold`` (RevPC; 0.5 = the median
        of the predicted depth distribution)."""
        thr = self.threshold if threshold is None else threshold
        p = revpc(depth_logits.softmax(-1))  # (B, D), non-increasing
        return (p[:, 1:] >= thr).sum(-1)  # (B,)

    def before_evaluate(self, split_name: str = "validation") -> None:
        """Start an evaluation pass over ``split_name``: forget the depth counts
        (:meth:`reset_stats`, so :meth:`metrics` describes this pass only) and, under a
        ``flops_budget`` and with a ``loop``, calibrate the exit threshold on (up to
        ``depth_calibration_rows``) validation rows (:meth:`calibrate`)."""
        self.reset_stats()
        if self.loop is None or self.flops_budget is None:
            return
        self.calibrate(self.calibration_batches(self.calibration_rows))

    @torch.no_grad()
    def calibrate(self, batches, budget: float | None = None) -> tuple[float, float]:
        """Set :attr:`threshold` so that inference on ``batches`` runs ``budget`` of the full
        model's FLOPs (sum of executed FLOPs incl. the predictor / sum of full-model FLOPs), by
        bisection on the threshold in ``(0, 1]`` (the fraction is non-increasing in it; a step
        function, so the result is the closest reachable point).

        Args:
            batches: iterable of ``(x, mask)`` or ``(x, mask, y)``: ``B x T`` ids and bool masks.
            budget: target fraction in (0, 1]; default ``flops_budget``.

        Returns:
            ``(threshold, fraction)``.

        Raises:
            ValueError: no budget given and no ``flops_budget`` configured.
        """
        budget = self.flops_budget if budget is None else float(budget)
        if budget is None:
            raise ValueError("calibrate needs a budget (flops_budget is not set)")
        was = self.model.training
        self.model.eval()
        dev = self.depths.device
        cached = []  # (p (b, D-1), used FLOPs per depth (D,), full FLOPs (scalar), b)
        try:
            for b in batches:
                x, m = b[0].to(dev), None if b[1] is None else b[1].to(dev)
                _, _, dl = self._front(x, m)
                T = x.shape[1]
                full = float(costs.flops_per_sample(self.model.config, T))
                cached.append((revpc(dl.softmax(-1))[:, 1:].cpu(), self._flops_fractions(T) * full, full, x.shape[0]))
        finally:
            self.model.train(was)
            self.predictor.train(was)

        def fraction(thr: float) -> float:
            used = tot = 0.0
            for p, fl, full, n in cached:
                used += float(fl[(p >= thr).sum(-1)].sum())
                tot += n * full
            return used / max(tot, 1.0)

        thr, frac = calibrate_monotone(fraction, budget, 1e-6, 1.0, iters=40)
        self.threshold, self.calibrated_fraction = float(thr), float(frac)
        return self.threshold, self.calibrated_fraction

    @torch.no_grad()
    def predict_depths(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The exit depth (blocks, ``n_fixed .. n_layers``) the predictor picks for each sample:
        ``B`` int64 (:meth:`exit_index` at :attr:`threshold`)."""
        _, _, depth_logits = self._front(x, mask)
        return self.n_fixed + self.exit_index(depth_logits)  # (B,)

    @torch.no_grad()
    def predict(self, x, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """Inference with per-sample early exit.

        Each sample exits at depth ``k`` = :meth:`exit_index` (the median of its predicted depth
        distribution, or the calibrated threshold); samples with the same ``k`` run as one batch
        through blocks ``n_fixed .. k-1`` only (nothing is computed for skipped blocks), then
        the final LayerNorm and head.

        Args:
            x: ``B x T`` token ids; mask: ``B x T`` bool or ``None``.

        Returns:
            ``(logits, flops)``: ``B x C`` logits in the input order, and ``B`` float64 FLOPs
            executed per sample (``costs.flops_per_sample(config, T, n_layers=k)`` plus the
            predictor's own).
        """
        h, pad_mask, depth_logits = self._front(x, mask)
        probs = depth_logits.softmax(-1)  # (B, D)
        k_idx = self.exit_index(depth_logits)  # (B,) index into depths
        B, T = x.shape
        extra = self.predictor.flops_per_sample()
        groups = torch.unique(k_idx).tolist()
        self._hist += torch.bincount(k_idx.cpu(), minlength=self.n_depths)
        self._expected_sum += float(self.expected_depth(probs).sum())
        if len(groups) == 1:  # one depth for the whole batch: no gather / scatter needed
            depth = self.n_fixed + int(groups[0])
            h = self.model.run_layers(h, pad_mask, self.n_fixed, depth)  # (B, T, d)
            f = costs.flops_per_sample(self.model.config, T, n_layers=depth) + extra
            return self.model.head_logits(h, pad_mask, depth=depth), torch.full((B,), float(f), dtype=torch.float64)
        logits = h.new_empty(B, self.model.config.n_classes)  # (B, C)
        flops = torch.empty(B, dtype=torch.float64)
        for k in groups:
            rows = (k_idx == k).nonzero(as_tuple=True)[0]  # (B_k,)
            depth = self.n_fixed + int(k)
            pm = None if pad_mask is None else pad_mask[rows]  # (B_k, T)
            hk = self.model.run_layers(h[rows], pm, self.n_fixed, depth)  # (B_k, T, d)
            logits[rows] = self.model.head_logits(hk, pm, depth=depth)  # (B_k, C)
            flops[rows.cpu()] = float(costs.flops_per_sample(self.model.config, T, n_layers=depth) + extra)
        return logits, flops

    # ------------------------------------------------------------------ reporting
    def reset_stats(self) -> None:
        """Forget the depth counts accumulated by :meth:`predict`."""
        self._hist.zero_()
        self._expected_sum = 0.0

    def depth_stats(self, split=None, batch_size: int = 256) -> dict[str, Any]:
        """Predicted-depth statistics.

        Args:
            split: a :class:`~archsearch.data.ClassificationSplit` to run the predictor on
                (embedding, fixed blocks and predictor only, eval mode; consecutive batches
                trimmed by :func:`~archsearch.models.config.trim_padding`), or ``None`` for
                the counts accumulated by :meth:`predict` since :meth:`reset_stats`.
            batch_size: rows per forward when ``split`` is given.

        Returns:
            ``{"depth_histogram": {"k": count}, "expected_depth": float, "mean_exit_depth": float}``
            with depths in blocks (keys are strings so the dict round-trips through JSON);
            ``expected_depth`` is the mean of ``sum_d d * probs_d``, ``mean_exit_depth`` the
            mean exit depth actually executed (:meth:`exit_index`).
        """
        if split is None:
            return self._stats(self._hist.clone(), self._expected_sum)
        batches = (trim_padding(split.input_ids[i:i + batch_size], split.attention_mask[i:i + batch_size])
                   for i in range(0, len(split), batch_size))
        return self._stats_over(batches)

    def _stats_over(self, batches) -> dict[str, Any]:
        """:meth:`depth_stats` of the predictions on ``batches`` (``(ids, mask)``, ``b x T``)."""
        hist, exp_sum = torch.zeros(self.n_depths, dtype=torch.long), 0.0
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                dev = self.depths.device
                for ids, m in batches:
                    _, _, dl = self._front(ids.to(dev), m.to(dev))  # dl: (b, D)
                    hist += torch.bincount(self.exit_index(dl).cpu(), minlength=self.n_depths)
                    exp_sum += float(self.expected_depth(dl.softmax(-1)).sum())
        finally:
            self.model.train(was_training)
            self.predictor.train(was_training)
        return self._stats(hist, exp_sum)

    def _stats(self, hist: torch.Tensor, exp_sum: float) -> dict[str, Any]:
        n = int(hist.sum())
        depths = list(range(self.n_fixed, self.n_layers + 1))
        return {
            "depth_histogram": {str(d): int(c) for d, c in zip(depths, hist.tolist())},
            "expected_depth": exp_sum / n if n else float("nan"),
            "mean_exit_depth": float(sum(d * c for d, c in zip(depths, hist.tolist())) / n) if n else float("nan"),
        }

    def metrics(self) -> dict[str, Any]:
        """Per-epoch results: the depth histogram of the samples just evaluated
        (``depth_histogram``, ``expected_depth``, ``mean_exit_depth``; see :meth:`depth_stats`),
        the last training batch's ``train_expected_depth``, ``depth_gamma`` (the current price
        of depth), ``exit_threshold`` and, after a calibration, ``depth_calibrated_flops_fraction``
        (FLOPs fraction on the calibration rows).

        The histogram counts the exits :meth:`predict` took since :meth:`before_evaluate` (or
        :meth:`reset_stats`): in ``TrialLoop.evaluate(split_name)`` exactly the samples of
        ``split_name`` (the test split in a test evaluation), read before the latency timing
        (which also runs :meth:`predict`). (It used to be recomputed on the validation split,
        whatever split had been evaluated.)
        """
        out = self.depth_stats()
        out["train_expected_depth"] = self._last_train["expected_depth"]
        out["depth_gamma"] = float(self.gamma)
        out["exit_threshold"] = float(self.threshold)
        if self.calibrated_fraction is not None:
            out["depth_calibrated_flops_fraction"] = float(self.calibrated_fraction)
        return out

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
