"""Interfaces between the trainable and the inner loop, and their static defaults.

The trainable's loop, per training batch::

    loss = gating.training_loss(x, mask, y, loss_fn)   # may run several forwards (sandwich)
    loss.backward(); clip; optimizer.step(); scheduler.step()
    gating.after_step(loss.item())                     # e.g. bandit rewards
    tying.after_step(step, loss.item())                # may tie/untie layers, fix the optimizer

and per evaluation (once, before its batches)::

    gating.before_evaluate(split_name)                 # e.g. calibrate a price to a FLOPs budget

and per evaluation batch::

    logits, flops = gating.predict(x, mask)            # flops: FLOPs executed per sample

``gating.metrics()`` and ``tying.metrics()`` add entries to each epoch's results (histograms,
maps: JSON-serialisable); ``gating.finalize()`` runs once after the last epoch (e.g. the
evolutionary search of sub-networks) and returns entries for the final results, e.g.
``anytime_curve: [{"flops_per_sample": f, "accuracy": a, "latency_ms": t, "config": ...}]``.
``state_dict()`` / ``load_state_dict()`` go into the trial checkpoint, which is read with
``torch.load(weights_only=True)``: tensors, numbers, strings, lists and dicts only.

Strategies see the trial loop only through :class:`TrialContext` (the ``loop`` argument, or
``None`` when a strategy runs on its own, e.g. in tests): they never touch its other attributes.

Shapes: ``x`` ``B x T`` token ids; ``mask`` ``B x T`` bool (True = real token) or ``None``
(LM); ``y`` ``B`` labels or ``B x T`` next-token ids; logits ``B x C`` or ``B x T x V``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable, Protocol, runtime_checkable

import torch
from torch import nn

from archsearch.models import costs
from archsearch.dynamic.settings import StrategySettings
from archsearch.models.config import EVAL_BATCH_SIZE

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: ``(x, mask, y)``: ``B x T`` ids, ``B x T`` bool or ``None`` (LM), ``B`` labels or ``B x T`` targets.
Batch = tuple[torch.Tensor, "torch.Tensor | None", torch.Tensor]


@runtime_checkable
class TrialContext(Protocol):
    """What a strategy may use of the trial loop that runs it
    (:class:`archsearch.tune.trainable.TrialLoop` implements it).

    Attributes:
        cfg: the complete trial config (defaults, fixed and searched values).
        data: the run's :class:`archsearch.data.PreparedData` (splits, ``task``, ``max_len``...).
        device: where the model and the batches a strategy builds must live.
        settings: the trial budget (``epochs``, ``batch_size``, ``seed``...).
        step: optimizer steps taken so far (int, counts across epochs).
        epoch: finished epochs (int).
        train_seconds: cumulative training wall time of the trial (s).
        opt: the optimizer over :meth:`trainable_parameters` (``torch.optim.Optimizer``), or
            ``None`` until the loop has built it (while strategies are being constructed).
    """

    cfg: dict[str, Any]
    data: Any
    device: torch.device
    settings: dict[str, Any]
    step: int
    epoch: int
    train_seconds: float
    opt: "torch.optim.Optimizer | None"

    def eval_batches(self, split_name: str = "validation",
                     batch_size: int = EVAL_BATCH_SIZE) -> Iterator[Batch]:
        """The evaluation batches of ``split_name`` in order, as evaluation runs them (CPU
        tensors): classification ``B x T'`` trimmed by
        :func:`archsearch.models.config.trim_padding`; LM ``B x max_len`` blocks."""
        ...

    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch (LM: ``settings["steps_per_epoch"]``; classification:
        ``ceil(train rows / batch size)``)."""
        ...

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Distinct trainable Parameters of the model and of the strategies' extra modules
        (a Parameter shared by tied layers appears once)."""
        ...

    def rebuild_optimizer(self) -> None:
        """Replace ``opt`` (and its LR schedule, at the current ``step``) by a fresh one over
        :meth:`trainable_parameters`; optimizer state is not carried over."""
        ...

    def latency_ms(self) -> float:
        """Median forward time per sample (ms) of the gating strategy's :meth:`GatingStrategy.predict`
        path on one validation batch of ``settings["latency_batch_size"]``."""
        ...


def planned_steps(loop: TrialContext) -> int:
    """Optimizer steps the trial loop will take in all (``epochs x steps per epoch``): what a
    strategy's step-count defaults (e.g. a warm-up of 10% of training) are relative to."""
    return int(loop.settings.get("epochs", 1)) * int(loop.steps_per_epoch())


class GatingStrategy:
    """Decides which parts of the model each sample runs. Subclass and override.

    A subclass declares its knobs as :attr:`Settings` (a frozen
    :class:`~archsearch.dynamic.settings.StrategySettings`); the constructor reads them from the
    trial config into :attr:`s`, and the strategy reads no other key of ``cfg``.

    Args:
        model: the trial's :class:`archsearch.models.transformer.Transformer`.
        cfg: the trial config (searched and fixed values, e.g. ``flops_budget``).
        settings: the budget (``epochs``, ``batch_size``, ``seed``...).
        loop: the :class:`TrialContext` running the strategy (data, evaluation batches), or
            ``None``.

    Raises:
        ValueError: a value of ``cfg`` that :attr:`Settings` refuses (names the key).
    """

    #: The strategy's settings model (no knobs here).
    Settings: type[StrategySettings] = StrategySettings

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        self.model, self.cfg, self.settings, self.loop = model, cfg, settings, loop
        self.s = self.Settings.from_config(cfg, task=getattr(getattr(model, "config", None), "task", None))

    @classmethod
    def known_cost(cls, cfg: dict[str, Any], model_config) -> tuple[float, int]:
        """What this gating changes in the costs known before training
        (:func:`archsearch.dynamic.known_costs.known_costs_fn`), for the complete trial config
        ``cfg`` and the trial's ``model_config`` (a
        :class:`~archsearch.models.transformer.TransformerConfig`):

        * ``flops_fraction``: the fraction of the static full-depth model's FLOPs per sample the
          trial reports. ``flops_budget`` when :attr:`Settings` declares that field and it is set
          (by the config or as the default): the inner loop meets it on validation, within
          about 0.05; else 1.0 (the static value, an upper bound for a gating that skips work).
        * ``extra_params``: parameter scalars the strategy adds to the trial's model, which
          ``TrialLoop.evaluate`` counts (all trainable): the exit heads of
          :meth:`exit_head_depths` (:func:`archsearch.models.costs.exit_head_params`). Modules
          the strategy holds itself (:meth:`extra_modules`) are not counted by the trial, nor here.

        A gating that adds other modules to the model or may execute more than the full model
        overrides it (``cascade``: its cut models; without a budget, the bound of every row
        escalating).

        Raises:
            ValueError: a value of ``cfg`` that :attr:`Settings` refuses (names the key).
        """
        s = cls.Settings.from_config(cfg, task=model_config.task)
        budget = getattr(s, "flops_budget", None)
        depths = cls.exit_head_depths(s, model_config)
        return (1.0 if budget is None else float(budget),
                costs.exit_head_params(model_config, depths) if depths else 0)

    @classmethod
    def exit_head_depths(cls, s: StrategySettings, model_config) -> list[int]:
        """The depths (blocks) the strategy built on ``model_config`` with settings ``s`` passes
        to :meth:`~archsearch.models.transformer.Transformer.add_exit_heads` (``[]``: none)."""
        return []

    #: Learning rate of :meth:`extra_modules` (``None`` = the trial's ``lr``): a module trained
    #: from scratch beside a fine-tuned checkpoint needs more than the fine-tuning lr.
    extra_lr: float | None = None

    def extra_modules(self) -> list[nn.Module]:
        """Trainable modules the strategy owns (e.g. a depth predictor); the optimizer gets
        their parameters too (at :attr:`extra_lr`)."""
        return []

    def training_loss(self, x, mask, y, loss_fn: LossFn) -> torch.Tensor:
        """Scalar training loss of one batch (with any regulariser the strategy adds)."""
        return loss_fn(self.model(x, mask), y)

    def after_step(self, loss: float) -> None:
        """Called after each optimizer step with the batch's training loss (nats)."""

    def before_evaluate(self, split_name: str = "validation") -> None:
        """Called once before an evaluation pass over ``split_name`` (the model is in eval
        mode); e.g. calibrate an exit threshold or price to a FLOPs budget on validation data."""

    def calibration_batches(self, rows: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first validation batches of :attr:`loop` holding at least ``rows`` rows (all of
        them if fewer), as ``(x, mask)`` pairs (``B x T`` ids, ``B x T`` bool): the data a
        strategy calibrates its exit threshold or price on before an evaluation."""
        out, seen = [], 0
        for x, mask, _ in self.loop.eval_batches("validation"):
            out.append((x, mask))
            seen += x.shape[0]
            if seen >= rows:
                break
        return out

    def predict(self, x, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """Inference: ``(logits, flops)`` with ``flops`` a float64 tensor ``(B,)`` of FLOPs
        executed per sample (multiply-add = 2)."""
        logits = self.model(x, mask)
        f = costs.flops_per_sample(self.model.config, x.shape[1])
        return logits, torch.full((x.shape[0],), float(f), dtype=torch.float64)

    def predict_exits(self, x, mask) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`predict` plus the exit depth of each row: ``(logits, flops, depth)``, ``depth``
        an int64 ``(B,)`` tensor of the blocks the row ran before its output head. An early-exit
        gating overrides it (and :meth:`exit_depths`); here every row runs every block."""
        logits, flops = self.predict(x, mask)
        depth = torch.full((x.shape[0],), int(self.model.config.n_layers), dtype=torch.long)
        return logits, flops, depth

    def exit_depths(self) -> list[int] | None:
        """The depths (blocks) where :meth:`predict` may stop a row, ascending, the last one the
        full model's; ``None`` for a gating without per-sample early exit (the runtime of an
        exported model, :mod:`archsearch.runtime`, then has one way to run a batch)."""
        return None

    def exit_model(self, depth: int) -> nn.Module:
        """The :class:`~archsearch.models.transformer.Transformer` whose first ``depth`` blocks
        and exit ``depth``'s head answer a row that leaves at ``depth`` (one of
        :meth:`exit_depths`): what the runtime's static cut and full model run
        (:mod:`archsearch.runtime`). The trial's model here; a cascade of complete models
        (``gating: cascade``) returns the cut of that depth."""
        return self.model

    def metrics(self) -> dict[str, Any]:
        """Extra per-epoch results (JSON-serialisable)."""
        return {}

    def finalize(self) -> dict[str, Any]:
        """Run once after training; extra entries for the final results."""
        return {}

    def set_operating_point(self, config: dict[str, Any]) -> None:
        """Make :meth:`predict` run at one point of the ``anytime_curve`` :meth:`finalize`
        reported (the sub-trial ``ID#k`` an export writes): ``config`` is the point's settings,
        its keys other than metrics plus the entries of its ``"config"`` dict (as the report's
        sub-trial holds them). A gating whose :meth:`finalize` writes an anytime curve overrides
        it.

        Raises:
            ValueError: the gating has no operating points (here), or ``config`` is not one of
                its points' settings.
        """
        raise ValueError(f"gating {self.cfg.get('gating', type(self).__name__)!r} has no operating points")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class StaticGating(GatingStrategy):
    """Every sample runs every layer and head of the trial's model (``gating: static``): a
    static cut to the first ``n_layers`` blocks of an ``init_from`` checkpoint is this gating
    with the model key ``n_layers``; no knobs of its own."""


class PredictModule(nn.Module):
    """Wrap a strategy's :meth:`GatingStrategy.predict` as a module returning logits, so
    :func:`archsearch.models.costs.latency_ms` times the same path evaluation runs. Starts in
    the model's train/eval mode, so restoring its own mode leaves the model's as it was."""

    def __init__(self, strategy: GatingStrategy):
        super().__init__()
        self.strategy = strategy
        self.inner = strategy.model
        self.train(strategy.model.training)

    def forward(self, input_ids, attention_mask=None):
        return self.strategy.predict(input_ids, attention_mask)[0]


class TyingController:
    """Decides which layers share weights during training (``tying:``). Subclass and override.

    Args:
        model: the trial's Transformer.
        cfg: the trial config (``tying``, ``tying_k``...).
        settings: the budget.
        loop: the :class:`TrialContext`, or ``None``; a controller that changes parameters must
            keep ``loop.opt`` consistent (each trainable tensor once, no stale state), e.g. with
            :meth:`TrialContext.rebuild_optimizer`.
    """

    #: The controller's settings model (no knobs here).
    Settings: type[StrategySettings] = StrategySettings

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        self.model, self.cfg, self.settings, self.loop = model, cfg, settings, loop
        self.s = self.Settings.from_config(cfg, task=getattr(getattr(model, "config", None), "task", None))

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
