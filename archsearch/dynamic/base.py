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

import pickle
from collections.abc import Iterator
from typing import Any, Callable, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.models import costs
from archsearch.models.config import EVAL_BATCH_SIZE
from archsearch.space import KEY_CHOICES

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: ``(x, mask, y)``: ``B x T`` ids, ``B x T`` bool or ``None`` (LM), ``B`` labels or ``B x T`` targets.
Batch = tuple[torch.Tensor, "torch.Tensor | None", torch.Tensor]


#: How :func:`all_exit_loss` combines the shallower exits (config key ``exit_loss``).
EXIT_LOSSES = KEY_CHOICES["exit_loss"]  # ("mean", "sum", "equal")


def exit_loss_setting(cfg: dict[str, Any]) -> str:
    """The trial config's ``exit_loss`` (default ``"mean"``), for :func:`all_exit_loss`.

    Raises:
        ValueError: a value not in :data:`EXIT_LOSSES`.
    """
    value = str(cfg.get("exit_loss") or "mean")
    if value not in EXIT_LOSSES:
        raise ValueError(f"exit_loss must be one of {EXIT_LOSSES}, got {value!r}")
    return value


def distill(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """In-place distillation loss ``KL(softmax(teacher) || softmax(student))`` (nats, mean over
    samples, or over tokens for ``B x T x V``); the teacher is detached."""
    s = student.reshape(-1, student.size(-1)).log_softmax(-1)
    t = teacher.detach().reshape(-1, teacher.size(-1)).log_softmax(-1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean")


def load_teacher(cfg: dict[str, Any], loop: "TrialContext | None") -> "nn.Module | None":
    """The fine-tuned teacher of the exits' distillation (trial-config key ``distill_teacher``:
    a ``state.pt`` written by :meth:`archsearch.tune.trainable.TrialLoop.save`, or a file holding
    the model's ``state_dict``, of a full-depth model of the trial's ``init_from`` architecture),
    frozen and in eval mode; ``None`` without the key. As in DynaBERT (Hou et al. 2020, sec. 2.2),
    every sub-network learns from a separately fine-tuned full model instead of from its own
    deepest exit. Read with ``torch.load(weights_only=True)``.

    Raises:
        ValueError: the key is set without ``init_from`` or outside a trial loop, or the file is
            missing, unreadable or holds another architecture's weights (names the file).
    """
    path = cfg.get("distill_teacher")
    if not path:
        return None
    if not cfg.get("init_from") or loop is None:
        raise ValueError("distill_teacher needs init_from (the teacher's architecture) and a trial loop")
    from archsearch.models.pretrained import transformer_for_data

    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as e:
        raise ValueError(f"distill_teacher: cannot read {path} ({e.__class__.__name__})") from None
    state = state.get("model", state) if isinstance(state, dict) else state
    with torch.random.fork_rng(devices=[]):  # the trial's own random stream stays as without a teacher
        teacher = transformer_for_data(str(cfg["init_from"]), loop.data, dropout=0.0)
    try:
        teacher.load_state_dict(state)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"distill_teacher: {path} does not hold a full {cfg['init_from']} model "
                         f"({str(e).splitlines()[0][:120]})") from None
    teacher.to(loop.device).eval()
    for q in teacher.parameters():
        q.requires_grad_(False)
    return teacher


def teacher_logits(teacher: "nn.Module | None", x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """``B x C`` logits of the :func:`load_teacher` model for token ids ``x`` (``B x T``) and
    padding mask ``mask`` (``B x T``), computed without gradient; ``None`` without a teacher."""
    if teacher is None:
        return None
    with torch.no_grad():
        return teacher(x, mask)


def all_exit_loss(exits: list[torch.Tensor], y: torch.Tensor, loss_fn: LossFn,
                  reduction: str = "mean", teacher: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Training loss of a multi-exit model (issue 14): ``(CE of the deepest exit, shallow term)``
    with the shallow term ``(CE_k + KD_k) / 2`` per shallower exit ``k``, ``KD_k`` =
    :func:`distill` toward the detached deepest exit (in-place distillation with the sandwich
    rule: Yu & Huang 2019, "Universally Slimmable Networks", §3.2-3.3; Kim & Cho 2021,
    "Length-Adaptive Transformer", §2.2), averaged (``reduction="mean"``: the shallow exits
    together weigh as much as half the deepest) or summed (``"sum"``: each shallow exit's CE
    weighs half the deepest's), or summed at full weight (``"equal"``: ``CE_k + KD_k`` per
    shallower exit, each exit's CE weighing as much as the deepest's, as in the equal-weight
    exit losses of DeeBERT / PABEE, Xin et al. 2020 sec. 3; Zhou et al. 2020 sec. 3.2).

    With ``teacher`` (the logits of a separately fine-tuned model, :func:`load_teacher`),
    every ``KD_k`` targets it instead of the deepest exit, and the deepest exit's term is
    ``CE + KD`` (its CE keeps its weight relative to the shallower exits').

    Args:
        exits: logits of every exit, shallowest first, deepest last (each ``B x C`` or
            ``B x T x V``).
        y: ``B`` labels or ``B x T`` targets.
        teacher: ``None`` or logits shaped like each exit's.

    Returns:
        two scalars (nats); the second is 0 with a single exit.

    Raises:
        ValueError: ``reduction`` not in :data:`EXIT_LOSSES` or no exits.
    """
    if reduction not in EXIT_LOSSES:
        raise ValueError(f"exit_loss must be one of {EXIT_LOSSES}, got {reduction!r}")
    if not exits:
        raise ValueError("all_exit_loss needs at least one exit")
    if teacher is None:
        teacher = exits[-1]
        deep = loss_fn(teacher, y)
    else:
        deep = loss_fn(exits[-1], y) + distill(exits[-1], teacher)
    if len(exits) == 1:
        return deep, deep.new_zeros(())
    shallow = sum((loss_fn(e, y) + distill(e, teacher)) / 2 for e in exits[:-1])
    if reduction == "mean":
        return deep, shallow / (len(exits) - 1)
    return deep, 2 * shallow if reduction == "equal" else shallow


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


class GatingStrategy:
    """Decides which parts of the model each sample runs. Subclass and override.

    Args:
        model: the trial's :class:`archsearch.models.transformer.Transformer`.
        cfg: the trial config (searched and fixed values, e.g. ``dht_lambda``, ``gamma``).
        settings: the budget (``epochs``, ``batch_size``, ``seed``...).
        loop: the :class:`TrialContext` running the strategy (data, evaluation batches), or
            ``None``.
    """

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        self.model, self.cfg, self.settings, self.loop = model, cfg, settings, loop

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

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
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
