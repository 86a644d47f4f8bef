"""Interfaces between the trainable and the inner loop, and their static defaults.

The trainable's loop, per training batch::

    loss = gating.training_loss(x, mask, y, loss_fn)   # may run several forwards (sandwich)
    loss.backward(); clip; optimizer.step(); scheduler.step()
    gating.after_step(loss.item())                     # e.g. bandit rewards
    tying.after_step(step, loss.item())                # may tie/untie layers, fix the optimizer

and per evaluation batch::

    logits, flops = gating.predict(x, mask)            # flops: FLOPs executed per sample

``gating.metrics()`` and ``tying.metrics()`` add entries to each epoch's results (histograms,
maps: JSON-serialisable); ``gating.finalize()`` runs once after the last epoch (e.g. the
evolutionary search of sub-networks) and returns entries for the final results, e.g.
``anytime_curve: [{"flops_per_sample": f, "accuracy": a, "latency_ms": t, "config": ...}]``.
``state_dict()`` / ``load_state_dict()`` go into the trial checkpoint, which is read with
``torch.load(weights_only=True)``: tensors, numbers, strings, lists and dicts only.

Shapes: ``x`` ``B x T`` token ids; ``mask`` ``B x T`` bool (True = real token) or ``None``
(LM); ``y`` ``B`` labels or ``B x T`` next-token ids; logits ``B x C`` or ``B x T x V``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from archsearch.models import costs

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class GatingStrategy:
    """Decides which parts of the model each sample runs. Subclass and override.

    Args:
        model: the trial's :class:`archsearch.models.transformer.Transformer`.
        cfg: the trial config (searched and fixed values, e.g. ``dht_lambda``, ``gamma``).
        settings: the budget (``epochs``, ``batch_size``, ``seed``...).
        loop: the :class:`archsearch.tune.trainable.TrialLoop` (data, evaluation helpers).
    """

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any], loop=None):
        self.model, self.cfg, self.settings, self.loop = model, cfg, settings, loop

    def extra_modules(self) -> list[nn.Module]:
        """Trainable modules the strategy owns (e.g. a depth predictor); the optimizer gets
        their parameters too."""
        return []

    def training_loss(self, x, mask, y, loss_fn: LossFn) -> torch.Tensor:
        """Scalar training loss of one batch (with any regulariser the strategy adds)."""
        return loss_fn(self.model(x, mask), y)

    def after_step(self, loss: float) -> None:
        """Called after each optimizer step with the batch's training loss (nats)."""

    def predict(self, x, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """Inference: ``(logits, flops)`` with ``flops`` a float tensor ``(B,)`` of FLOPs
        executed per sample (multiply-add = 2)."""
        logits = self.model(x, mask)
        f = costs.flops_per_sample(self.model.config, x.shape[1])
        return logits, torch.full((x.shape[0],), float(f))

    def metrics(self) -> dict[str, Any]:
        """Extra per-epoch results (JSON-serialisable)."""
        return {}

    def finalize(self) -> dict[str, Any]:
        """Run once after training; extra entries for the final results."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class StaticGating(GatingStrategy):
    """Every sample runs every layer and head (``gating: static``)."""


class PredictModule(nn.Module):
    """Wrap a strategy's :meth:`GatingStrategy.predict` as a module returning logits, so
    :func:`archsearch.models.costs.latency_ms` times the same path evaluation runs."""

    def __init__(self, strategy: GatingStrategy):
        super().__init__()
        self.strategy = strategy
        self.inner = strategy.model

    def forward(self, input_ids, attention_mask=None):
        return self.strategy.predict(input_ids, attention_mask)[0]


class TyingController:
    """Decides which layers share weights during training (``tying:``). Subclass and override.

    Args:
        model: the trial's Transformer.
        cfg: the trial config (``tying``, ``tying_k``...).
        settings: the budget.
        loop: the TrialLoop; a controller that changes parameters must keep ``loop.opt``
            consistent (each trainable tensor once, no stale state).
    """

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any], loop=None):
        self.model, self.cfg, self.settings, self.loop = model, cfg, settings, loop

    def after_step(self, step: int, loss: float) -> None:
        """Called after each optimizer step (global step count, batch loss in nats)."""

    def metrics(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class NoTying(TyingController):
    """Every layer has its own weights (``tying: none``)."""
