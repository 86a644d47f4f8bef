"""A cascade of complete models (``gating: cascade``): CascadeBERT, the baseline of complete
truncated models against internal exits.

Source: Li, Lin, Chen, Ren, Li, Zhou and Sun, "CascadeBERT: Accelerating Inference of
Pre-trained Language Models via Calibrated Complete Models Cascade", Findings of EMNLP 2021,
§3: instead of off-ramps inside one network (DeeBERT, ``gating: confidence_exit``), a few
*complete* models of increasing size run one after the other; a row answered confidently by a
small one stops there, the others go on to the next. Each stage is a whole model, so nothing of
a stage is reused by the next: an escalated row pays for every stage it ran. (CascadeBERT also
calibrates the small models' confidences with a difficulty-aware objective, §3.2; here every
stage is fine-tuned with plain cross-entropy, the cascade of §3.1.)

* Stages: one cut per depth ``k`` of ``cascade_depths`` (the first ``k`` blocks of the trial's
  model with its own copy of the embeddings, final LayerNorm and head: a
  :class:`~archsearch.models.transformer.Transformer` of ``n_layers=k`` with independent
  parameters, initialised from the model's weights, so a cut of an ``init_from`` checkpoint
  starts from the same pretrained layers), then the full model. The cuts are submodules of the
  model (``model.cascade_cuts``, a ``ModuleDict`` keyed by depth): the trial's optimizer trains
  them, its parameter counts include them, and checkpoints and exports hold them; tying
  controllers act on ``model.blocks`` only and leave them alone.
* Training (:meth:`CascadeGating.training_loss`): the sum of each model's own loss. The models
  share no parameter, so each gets exactly the gradient of its own fine-tuning; only the trial
  loop's global gradient-norm clip (``clip_grad_norm_(..., 1.0)`` over every trainable
  parameter) couples their steps.
* Inference (:meth:`CascadeGating.predict`): stage by stage on the rows still running; a row
  whose max softmax probability at a cut is >= the threshold is answered by that cut, the others
  run the next stage from their tokens; the full model answers whatever reaches it.
* Budget: with ``flops_budget`` the threshold is calibrated before each evaluation
  (:meth:`CascadeGating.before_evaluate`) on up to ``cascade_calibration_rows`` validation rows,
  without their labels, so that the executed FLOPs fraction lands on the budget
  (:func:`~archsearch.dynamic.budget.calibrate_monotone`, a non-decreasing step function of the
  threshold, as ``gating: confidence_exit``). The cheapest a row can be is the first cut, so a
  budget below its fraction lands on that fraction (every row answered by the first cut;
  :attr:`CascadeGating.calibrated_fraction` says so). Without a budget: ``exit_threshold``.

FLOPs of a row: the sum over the stages it ran of each stage's
:func:`~archsearch.models.costs.flops_per_sample` (cut ``k``: ``n_layers=k``, its blocks and
head; the full model: all of it), so a row that escalates costs more than the full model alone.
The exit depth of a row is the depth of the model that answered it (``n_layers`` for the full
model). Classification only.

Shapes: ``x`` ``B x T`` ids, ``mask`` ``B x T`` bool (True = real token), logits ``B x C``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from torch import nn

from archsearch.dynamic.base import LossFn, TrialContext
from archsearch.dynamic.depth.confidence_exit import ThresholdExits
from archsearch.dynamic.depth.settings import CascadeSettings
from archsearch.models import costs
from archsearch.models.transformer import Transformer, TransformerConfig


def cut_depths(s: CascadeSettings, model_config) -> list[int]:
    """The cut depths of ``s`` checked against ``model_config`` (a classification
    :class:`~archsearch.models.transformer.TransformerConfig`).

    Raises:
        ValueError: an LM config, or a depth outside ``1 .. n_layers - 1`` (names
            ``cascade_depths``).
    """
    if model_config.task != "classification":
        raise ValueError(f"gating 'cascade' needs a classification model, got task {model_config.task!r}")
    n = int(model_config.n_layers)
    if n < 2:
        raise ValueError(f"cascade_depths: a {n}-block model has no cut (the cascade needs n_layers >= 2)")
    if s.cascade_depths is None:  # the default: a third and half of the depth (2 and 3 of 6)
        return sorted({max(1, n // 3), max(1, n // 2)})
    depths = [int(k) for k in s.cascade_depths]
    bad = [k for k in depths if not 1 <= k < model_config.n_layers]
    if bad:
        raise ValueError(f"cascade_depths: {bad[0]} is not a cut of a {model_config.n_layers}-block model "
                         f"(each depth in 1 .. {model_config.n_layers - 1})")
    return depths


@functools.lru_cache(maxsize=256)
def _cut_params(fields: tuple, depth: int) -> int:
    config = dataclasses.replace(TransformerConfig(*fields), n_layers=depth)
    with torch.device("meta"):  # no memory, no initialisation
        return costs.params_total(Transformer(config))


def cut_params(model_config, depth: int) -> int:
    """Parameter scalars of the cut of ``depth`` blocks of a model of ``model_config``: those of
    ``Transformer(model_config with n_layers=depth)`` (:func:`~archsearch.models.costs.params_total`
    of one built on the ``meta`` device; cached per config)."""
    return _cut_params(dataclasses.astuple(model_config), int(depth))


class CascadeGating(ThresholdExits):
    """CascadeBERT's cascade of complete models (module docstring).

    Args:
        model: a classification :class:`~archsearch.models.transformer.Transformer`; gets the
            cuts as ``model.cascade_cuts`` (those it already has under the same depths are kept).
        cfg: the trial config (:class:`CascadeSettings` keys).
        settings: the trial budget (unused).
        loop: the :class:`~archsearch.dynamic.base.TrialContext` whose validation rows
            calibrate the threshold, or ``None`` (then :meth:`calibrate` by hand).

    Raises:
        ValueError: an LM model, a cut depth outside ``1 .. n_layers - 1``, or a value the
            settings refuse (names the key).

    Attributes:
        depths: the stages' depths: ``cascade_depths``, then ``n_layers`` (the full model).
        threshold: the max-probability threshold inference uses (``exit_threshold``, or the
            calibrated one).
        calibrated_fraction: FLOPs fraction on the calibration rows at :attr:`threshold`
            (``None`` before a calibration).
    """

    Settings = CascadeSettings

    @classmethod
    def known_cost(cls, cfg: dict[str, Any], model_config) -> tuple[float, int]:
        """``(flops_fraction, extra_params)`` (:meth:`GatingStrategy.known_cost`):

        * ``flops_fraction``: ``flops_budget`` when set; without one an upper bound, every row
          escalating through every stage: ``1 + sum_k F_k(1) / F_L(1)`` with ``F_k(T)`` the
          FLOPs of ``k`` blocks and a head at length ``T`` (a cut's share of the full model's
          FLOPs is largest at ``T = 1``, where the head weighs most).
        * ``extra_params``: the cuts' parameters (:func:`cut_params`), all trainable: exactly
          what ``TrialLoop.evaluate`` counts on top of the full model.

        Raises:
            ValueError: an LM config, a refused value, a cut depth outside ``1 .. n_layers - 1``
                (names ``cascade_depths``).
        """
        s = cls.Settings.from_config(cfg, task=model_config.task)
        depths = cut_depths(s, model_config)
        if s.flops_budget is not None:
            fraction = float(s.flops_budget)
        else:
            full = costs.flops_per_sample(model_config, 1)
            fraction = 1.0 + sum(costs.flops_per_sample(model_config, 1, n_layers=k) for k in depths) / full
        return fraction, sum(cut_params(model_config, k) for k in depths)

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        conf = model.config
        cuts = cut_depths(self.s, conf)
        self.depths = cuts + [int(conf.n_layers)]
        have = getattr(model, "cascade_cuts", None) or {}
        p = next(model.parameters())
        src = None
        made = {}
        for k in cuts:
            if str(k) in have:
                made[str(k)] = have[str(k)]
                continue
            if src is None:
                src = model.state_dict()
            with torch.device("meta"):  # the weights come from the model: no initialisation
                cut = Transformer(dataclasses.replace(conf, n_layers=k))
            cut = cut.to_empty(device=p.device).to(p.dtype)
            cut.load_state_dict({name: src[name] for name in cut.state_dict()})
            made[str(k)] = cut.train(model.training)
        model.cascade_cuts = nn.ModuleDict(made)
        self.threshold = float(self.s.exit_threshold)
        self.calibrated_fraction: float | None = None
        self._flops: dict[tuple, tuple[torch.Tensor, float]] = {}
        self._counts = torch.zeros(len(self.depths), dtype=torch.long, device=p.device)  # rows per stage

    def stages(self) -> list[nn.Module]:
        """The models in the order they run: the cuts (``model.cascade_cuts``), shallowest first,
        then the full model."""
        cuts = self.model.cascade_cuts
        return [cuts[str(k)] for k in self.depths[:-1]] + [self.model]

    def exit_model(self, depth: int) -> nn.Module:
        """The stage of ``depth`` blocks (:meth:`GatingStrategy.exit_model`): the cut, or the full
        model for ``n_layers``.

        Raises:
            ValueError: ``depth`` is not one of :attr:`depths`.
        """
        return self.stages()[self.depths.index(int(depth))]

    def exit_depths(self) -> list[int]:
        return list(self.depths)

    # ------------------------------------------------------------------ training
    def training_loss(self, x, mask, y, loss_fn: LossFn) -> torch.Tensor:
        """Every model's own loss, summed: ``loss_fn(full, y) + sum_k loss_fn(cut_k, y)`` (scalar,
        nats); disjoint parameters, so each model gets the gradient of its own fine-tuning."""
        stages = self.stages()
        loss = loss_fn(stages[-1](x, mask), y)
        for cut in stages[:-1]:
            loss = loss + loss_fn(cut(x, mask), y)
        return loss

    # ------------------------------------------------------------------ inference
    def stage_flops(self, T: int, device: torch.device) -> tuple[torch.Tensor, float]:
        """``(S float64 FLOPs per sample of a row answered at each stage, FLOPs of the full model)``
        at length ``T``: stage ``s``'s entry is the sum of the FLOPs of stages ``0 .. s``
        (:func:`archsearch.models.costs.flops_per_sample`), the first on ``device``."""
        key = (int(T), str(device))
        if key not in self._flops:
            c = self.model.config
            own = [float(costs.flops_per_sample(c, T, n_layers=d)) for d in self.depths]
            self._flops[key] = (torch.tensor(own, dtype=torch.float64, device=device).cumsum(0), own[-1])
        return self._flops[key]

    def predict(self, x, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """The cascade at :attr:`threshold`.

        Returns:
            ``(logits, flops)``: ``B x C`` logits of the model that answered each row, and ``B``
            float64 FLOPs executed per row (:meth:`stage_flops` of its stage), both on ``x``'s
            device.
        """
        return self.predict_exits(x, mask)[:2]

    @torch.no_grad()
    def predict_exits(self, x, mask) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`predict` and each row's exit depth (``B`` int64: the depth of the model that
        answered it, on ``x``'s device). Each stage runs on the rows still open only."""
        stages, S, B = self.stages(), len(self.depths), x.shape[0]
        rows = torch.arange(B, device=x.device)
        stage = torch.full((B,), S - 1, dtype=torch.long, device=x.device)
        out, xs, ms = None, x, mask
        for s, net in enumerate(stages):
            lg = net(xs, ms)  # (b, C)
            if out is None:
                out = lg.new_empty((B,) + tuple(lg.shape[1:]))
            if s == S - 1:
                out.index_copy_(0, rows, lg)
                break
            stop = lg.softmax(-1).amax(-1) >= self.threshold  # (b,)
            n_stop = int(stop.sum())  # the one host synchronisation of this stage
            if n_stop:
                gone = rows[stop]  # (n_stop,) original row indices
                out.index_copy_(0, gone, lg[stop])
                stage.index_fill_(0, gone, s)
                if n_stop == len(rows):
                    break
                keep = ~stop
                rows, xs = rows[keep], xs[keep]
                ms = None if ms is None else ms[keep]
        cum, _ = self.stage_flops(x.shape[1], x.device)
        self._counts = self._counts.to(stage.device) + torch.bincount(stage, minlength=S)
        depth = torch.as_tensor(self.depths, dtype=torch.long).to(stage.device)[stage]  # (B,)
        return out, cum[stage], depth

    def before_evaluate(self, split_name: str = "validation") -> None:
        """Forget the stage counts (so :meth:`metrics` describes this pass only) and, with a
        ``flops_budget`` and a ``loop``, calibrate the threshold on the first
        ``cascade_calibration_rows`` validation rows (:meth:`calibrate`; labels unread)."""
        self._reset_counts()
        if self.loop is not None and self.s.flops_budget is not None:
            self.calibrate(self.calibration_batches(self.s.cascade_calibration_rows))

    def _confidences(self, x, mask, device) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Every stage's max probability on one calibration batch (``b x S``: each stage reads
        every row; the full model's column is never read, it always answers), the FLOPs of a row
        answered at each stage and the full model's (:meth:`stage_flops`)."""
        maxp = torch.stack([net(x, mask).softmax(-1).amax(-1) for net in self.stages()], 1)  # (b, S)
        cum, full = self.stage_flops(x.shape[1], device)
        return maxp, cum, full

    # ------------------------------------------------------------------ reporting, state
    def metrics(self) -> dict[str, Any]:
        """The keys of ``gating: confidence_exit`` (:meth:`ThresholdExits.metrics`; here
        ``exit_depth_hist`` counts rows per answering model and ``exit_mean_depth`` is the
        depth of the answering model, not the blocks executed) and ``cascade_escalated_share``
        (fraction of rows the full model answered, i.e. that ran every stage). The counts reset."""
        c = self._counts.tolist()
        escalated = c[-1] / sum(c) if sum(c) else float("nan")
        return {**super().metrics(), "cascade_escalated_share": escalated}
