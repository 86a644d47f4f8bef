"""Exits of a multi-exit model: their training losses, distillation, and the one cascade that
runs a batch exit by exit.

* :func:`all_exit_loss` -- the joint loss of every exit (in-place distillation with the sandwich
  rule), :func:`distill`, :func:`load_teacher` / :func:`teacher_logits` (DynaBERT's separately
  fine-tuned teacher), :func:`per_sample_ce`.
* :func:`run_cascade` -- early exit at inference (DeeBERT, Xin et al. ACL 2020, §3; PABEE, Zhou
  et al. NeurIPS 2020): at each exit the rows still running read their exit's logits, a stop rule
  decides which rows leave, and the rest run the next block as one batch. DHT's cascade, the
  depth predictor's threshold exit, the confidence exit and the benchmarks all run this one.

Shapes: ``h`` ``B x T x d`` hidden states, ``pad`` ``B x T`` bool (True = padding) or ``None``,
logits ``B x C``.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.dynamic.base import LossFn

if TYPE_CHECKING:
    from archsearch.dynamic.base import TrialContext

#: How :func:`all_exit_loss` combines the shallower exits (config key ``exit_loss``).
EXIT_LOSSES = ("mean", "sum", "equal")


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


def per_sample_ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per sample (nats): ``B x C`` logits and ``B`` labels, or ``B x T x V`` and
    ``B x T`` targets (mean over the sample's tokens) -> ``B``."""
    if logits.dim() == 3:
        ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
        return ce.view(y.shape).mean(dim=1)  # (B,)
    return F.cross_entropy(logits, y, reduction="none")  # (B,)
