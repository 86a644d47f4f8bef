"""Exits of a multi-exit model: their training losses, distillation, and the one cascade that
runs a batch exit by exit.

* :func:`all_exit_loss` -- the joint loss of every exit (in-place distillation with the sandwich
  rule), :func:`distill`, :func:`load_teacher` / :func:`teacher_logits` (DynaBERT's separately
  fine-tuned teacher), :func:`per_sample_ce`.
* :func:`run_cascade` -- early exit at inference (DeeBERT, Xin et al. ACL 2020, §3; PABEE, Zhou
  et al. NeurIPS 2020): at each exit the rows still running read their exit's logits, a stop rule
  decides which rows leave, and the rest run the next block as one batch. DHT's cascade, the
  depth predictor's threshold exit, the confidence exit and the benchmarks all run this one.
* :func:`first_stop` -- its offline twin: the exit each row leaves at, from a table of every
  exit's stop decisions (``N x K``), for policies replayed on stored exits
  (``benchmarks/depth/stop_policies.py``, :meth:`~archsearch.dynamic.depth.stopping.LinearStopping.route`)
  and threshold calibrations.

Shapes: ``h`` ``B x T x d`` hidden states, ``pad`` ``B x T`` bool (True = real token, as
``Transformer.padding_mask`` gives it) or ``None``, logits ``B x C``.
"""

from __future__ import annotations

import inspect
import pickle
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.dynamic.base import LossFn
from archsearch.dynamic.depth.cascade_graphs import EXECUTORS

if TYPE_CHECKING:
    from archsearch.dynamic.base import TrialContext
    from archsearch.dynamic.depth.cascade_graphs import SegmentGraphs

#: How :func:`all_exit_loss` combines the shallower exits (config key ``exit_loss``).
EXIT_LOSSES = ("mean", "sum", "equal")


def distill(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """In-place distillation loss ``KL(softmax(teacher) || softmax(student))`` (nats, mean over
    samples, or over tokens for ``B x T x V``); the teacher is detached."""
    s = student.reshape(-1, student.size(-1)).log_softmax(-1)
    t = teacher.detach().reshape(-1, teacher.size(-1)).log_softmax(-1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean")


def load_teacher(path: str | None, init_from: str | None, loop: "TrialContext | None") -> "nn.Module | None":
    """The fine-tuned teacher of the exits' distillation (setting ``distill_teacher``, ``path``:
    a ``state.pt`` written by :meth:`archsearch.tune.trainable.TrialLoop.save`, or a file holding
    the model's ``state_dict``, of a full-depth model of the trial's ``init_from`` architecture),
    frozen and in eval mode on ``loop.device``; ``None`` without a path. As in DynaBERT (Hou et al. 2020, sec. 2.2),
    every sub-network learns from a separately fine-tuned full model instead of from its own
    deepest exit. Read with ``torch.load(weights_only=True)``.

    Raises:
        ValueError: the key is set without ``init_from`` or outside a trial loop, or the file is
            missing, unreadable or holds another architecture's weights (names the file).
    """
    if not path:
        return None
    if not init_from or loop is None:
        raise ValueError("distill_teacher needs init_from (the teacher's architecture) and a trial loop")
    from archsearch.models.pretrained import transformer_for_data

    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as e:
        raise ValueError(f"distill_teacher: cannot read {path} ({e.__class__.__name__})") from None
    state = state.get("model", state) if isinstance(state, dict) else state
    with torch.random.fork_rng(devices=[]):  # the trial's own random stream stays as without a teacher
        teacher = transformer_for_data(str(init_from), loop.data, dropout=0.0)
    try:
        teacher.load_state_dict(state)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"distill_teacher: {path} does not hold a full {init_from} model "
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


def _takes_reduction(loss_fn: LossFn) -> bool:
    """Whether ``loss_fn`` takes ``reduction="none"`` (``F.cross_entropy``,
    :meth:`~archsearch.tune.trainable.TrialLoop.task_loss`)."""
    try:
        return "reduction" in inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def exit_terms(exits: list[torch.Tensor], y: torch.Tensor, loss_fn: LossFn,
               teacher: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Every exit's per-sample loss and distillation term in one pass over the stacked exits
    (a handful of kernels instead of a few per exit: on a GPU's launch-bound shapes the exits'
    losses cost launches, not arithmetic; issue 35).

    Args:
        exits: ``K`` classification logits ``B x C``, shallowest first.
        y: ``B`` labels.
        loss_fn: a mean loss that takes ``reduction="none"`` (``F.cross_entropy``, the trial
            loop's ``task_loss``): its per-sample values, whose mean is ``loss_fn(logits, y)``.
        teacher: ``B x C`` logits the distillation targets, or ``None`` = the deepest exit's
            (detached either way).

    Returns:
        ``(loss, kd)``, each ``K x B`` (nats, with gradient): ``loss[k, i]`` =
        ``loss_fn`` of exit ``k`` on sample ``i``; ``kd[k, i]`` = ``KL(softmax(teacher_i) ||
        softmax(exit_k,i))`` (:func:`distill` per sample: ``kd[k].mean()`` is ``distill(exits[k],
        teacher)``; 0 for the deepest exit without a teacher). ``None`` where the exits cannot be
        stacked this way (LM logits ``B x T x V``, or a ``loss_fn`` without ``reduction``):
        callers then take the per-exit path.
    """
    if not exits or exits[0].dim() != 2 or not _takes_reduction(loss_fn):
        return None
    L = torch.stack(exits)  # (K, B, C)
    K, B, C = L.shape
    loss = loss_fn(L.reshape(K * B, C), y.repeat(K), reduction="none").view(K, B)  # (K, B)
    t = (L[-1] if teacher is None else teacher).detach().log_softmax(-1)  # (B, C)
    kd = F.kl_div(L.log_softmax(-1), t.expand(K, B, C), log_target=True, reduction="none").sum(-1)  # (K, B)
    return loss, kd


def all_exit_loss(exits: list[torch.Tensor], y: torch.Tensor, loss_fn: LossFn,
                  reduction: str = "mean", teacher: torch.Tensor | None = None,
                  terms: tuple[torch.Tensor, torch.Tensor] | None = None
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
        terms: :func:`exit_terms` of these exits (a caller that also reads the per-sample
            terms computes them once); by default computed here, and the per-exit path is
            taken where they cannot be (LM logits, a ``loss_fn`` without ``reduction``). The
            two paths give the same losses up to float rounding.

    Returns:
        two scalars (nats); the second is 0 with a single exit.

    Raises:
        ValueError: ``reduction`` not in :data:`EXIT_LOSSES` or no exits.
    """
    if reduction not in EXIT_LOSSES:
        raise ValueError(f"exit_loss must be one of {EXIT_LOSSES}, got {reduction!r}")
    if not exits:
        raise ValueError("all_exit_loss needs at least one exit")
    terms = exit_terms(exits, y, loss_fn, teacher) if terms is None else terms
    if terms is not None:  # the exits stacked: per-exit means of the per-sample terms
        ce, kd = terms[0].mean(1), terms[1].mean(1)  # (K,), (K,)
        deep = ce[-1] if teacher is None else ce[-1] + kd[-1]
        if len(exits) == 1:
            return deep, deep.new_zeros(())
        shallow = ((ce[:-1] + kd[:-1]) / 2).sum()
        if reduction == "mean":
            return deep, shallow / (len(exits) - 1)
        return deep, 2 * shallow if reduction == "equal" else shallow
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


def read_exits(model: nn.Module, hs: list[torch.Tensor], pad: torch.Tensor | None,
               depths: list[int]) -> list[torch.Tensor]:
    """The logits of several exits: ``model.head_logits(hs[k], pad, depth=depths[k])`` for each
    ``k``, as one batched call for classification (:meth:`~archsearch.models.transformer.
    Transformer.exits_logits`: ``K`` tensors ``B x C``) and exit by exit for an LM (``B x T x V``)."""
    if model.config.task == "classification" and hs:
        return list(model.exits_logits(hs, pad, depths).unbind(0))
    return [model.head_logits(h, pad, depth=d) for h, d in zip(hs, depths)]


def per_sample_ce_of_exits(exits: list[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    """:func:`per_sample_ce` of ``K`` exits at once: ``K`` logits ``B x C`` (or ``B x T x V``)
    and ``B`` labels (or ``B x T`` targets) -> ``B x K`` (nats), column ``k`` exit ``k``'s."""
    K = len(exits)
    ce = per_sample_ce(torch.stack(exits).flatten(0, 1), y.repeat((K,) + (1,) * (y.dim() - 1)))  # (K * B,)
    return ce.view(K, -1).T  # (B, K)


#: ``stop_rule(k, h, pad, logits, state) -> (stop, state)``: at exit ``k`` (index into the
#: cascade's ``depths``), for the ``b`` rows still running (``h`` ``b x T x d``, ``pad``
#: ``b x T`` or ``None``, ``logits`` ``b x C``), which rows stop (``b`` bool tensor, any device)
#: and the rule's state to carry to the next exit (``None`` or a tuple of per-row tensors /
#: numpy arrays, which :func:`run_cascade` subsets to the rows that continue).
StopRule = Callable[[int, torch.Tensor, "torch.Tensor | None", torch.Tensor, Any], "tuple[torch.Tensor, Any]"]


def _take(state: Any, keep: torch.Tensor) -> Any:
    """``state`` (``None`` or a tuple of per-row tensors / numpy arrays) at the row indices
    ``keep`` (int64 tensor)."""
    if state is None:
        return None
    keep_np = None
    out = []
    for a in state:
        if isinstance(a, torch.Tensor):
            out.append(a.index_select(0, keep.to(a.device)))
        else:
            keep_np = keep.cpu().numpy() if keep_np is None else keep_np
            out.append(a[keep_np])
    return tuple(out)


def run_cascade(model: nn.Module, h: torch.Tensor, pad: torch.Tensor | None, depths: list[int], start: int,
                stop_rule: StopRule, heads: list | None = None, state: Any = None,
                graphs: "SegmentGraphs | None" = None, key: tuple | None = None,
                executor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Early exit, exit by exit (DeeBERT, Xin et al. ACL 2020, §3; the cascade of DHT's
    ``dht_routing: cascade``): at each exit depth the rows still running read that exit's
    logits (``model.head_logits(h, pad, depth=d)``), ``stop_rule`` decides which of them stop,
    and the others run the blocks up to the next exit (``model.run_layers``) as one batch; every
    row still running at the last exit stops there. Nothing is computed for a row after it
    stops. Decisions stay on ``h``'s device; there is one host synchronisation per exit (the
    count of rows that stopped). With every exit's decisions known in advance (a rule that
    reads only its own exit's logits, replayed on stored exits), :func:`first_stop` gives the
    same exit indices offline: ``first_stop(stop)`` of the ``B x K`` table of ``stop_rule``'s
    answers.

    A *segment* is the blocks up to an exit, its head and its stop rule. With ``graphs`` (a
    :class:`~archsearch.dynamic.depth.cascade_graphs.SegmentGraphs`), on a GPU in eval mode without
    gradients, each segment runs as a CUDA graph replay where that was measured faster (the
    launch-bound regime); the results are the same.

    Three executors (:data:`~archsearch.dynamic.depth.cascade_graphs.EXECUTORS`) give the same
    logits and exit indices: ``"gather"``
    (above: the rows still running are gathered after each exit, so nothing is computed for a
    row after it stops), ``"whole"`` (every segment runs on the whole batch; a row's logits are
    kept from the first exit whose rule stops it, and the batch stops at the exit where every row
    has stopped, with the same one host synchronisation per exit) and ``"whole_async"`` (the
    whole batch through every segment to the last exit with no host synchronisation at all: the
    host queues every segment without waiting for the device). On a GPU's launch-bound shapes
    (batch 32 at length 48: the full model takes as long at any row count) the whole batch costs
    no more per segment than its survivors, and it replays one graph per segment where the
    gathered cascade meets a new row count at each exit; ``"whole_async"`` also saves the wait
    at each exit. With ``graphs`` usable, the fastest executor is measured per (rows, length)
    (:meth:`SegmentGraphs.choose_executor`); elsewhere (a CPU, training, an eager-only run) it is
    ``"gather"``. Under ``"whole"`` and ``"whole_async"`` the rows that stopped ride along: the
    FLOPs a strategy reports per sample stay those of the sample's own path.
    A batch of one row (the latency case) runs eagerly without either's bookkeeping: at each
    exit it stops or goes on.

    Args:
        model: a :class:`~archsearch.models.transformer.Transformer` (classification).
        h: ``B x T x d`` hidden states after the first ``start`` blocks.
        pad: ``B x T`` bool mask from ``model.padding_mask`` (True = real token) or ``None``.
        depths: the exit depths (blocks run before the exit), ascending, ``depths[0] >= start``.
        start: blocks already run in ``h``.
        stop_rule: see :data:`StopRule`.
        heads: ``heads_per_layer`` for blocks ``start .. depths[-1] - 1`` (one head-index list
            or ``None`` = all heads per block), or ``None`` = all heads everywhere.
        state: the stop rule's state at the first exit (``None`` or a tuple of ``B``-row
            tensors / numpy arrays).
        graphs: ``None`` (eager) or the gating's segment graphs; then ``stop_rule`` must be a
            pure function of its tensor arguments and of the constants named in ``key``, with
            a tuple-of-tensors state (it is captured once per shape).
        key: ``(prefix, extra)`` for :meth:`SegmentGraphs.run` (needed with ``graphs``).
        executor: ``None`` (chosen as above) or one of
            :data:`~archsearch.dynamic.depth.cascade_graphs.EXECUTORS`.

    Returns:
        ``(logits, exit_index)``: ``B x C`` logits of each row's exit, and ``B`` int64 indices
        into ``depths`` (on ``h``'s device).

    Raises:
        ValueError: ``depths`` empty, not ascending, or starting below ``start``; ``graphs``
            without ``key``; an unknown ``executor``.
    """
    if not depths or depths[0] < start or any(b <= a for a, b in zip(depths, depths[1:])):
        raise ValueError(f"depths must be ascending and >= start={start}, got {depths}")
    if graphs is not None and key is None:
        raise ValueError("run_cascade: graphs need a key naming the stop rule's constants")
    B, K = h.shape[0], len(depths)
    bounds = [start] + list(depths)  # segment k runs blocks bounds[k] .. bounds[k + 1] - 1

    def segment(k: int, h, pad, state):
        a, d = bounds[k], bounds[k + 1]
        if d > a:
            hp = None if heads is None else list(heads[a - start:d - start])
            h = model.run_layers(h, pad, a, d, heads_per_layer=hp)
        lg = model.head_logits(h, pad, depth=d)  # (b, C)
        if k == K - 1:
            return h, lg, None, None
        stop, state = stop_rule(k, h, pad, lg, state)
        return h, lg, stop.to(device=h.device, dtype=torch.bool), state  # (b,) bool

    if executor is not None and executor not in EXECUTORS:
        raise ValueError(f"executor: expected one of {EXECUTORS}, got {executor!r}")
    use_graphs = graphs is not None and graphs.usable(model, h)
    if executor is None and use_graphs and K > 1:
        executor, timed = graphs.choose_executor(key, B, h.shape[1])
        if timed:  # while the choice is being measured: time this run on the device
            return graphs.timed_run(key, B, h.shape[1], executor, lambda: run_cascade(
                model, h, pad, depths, start, stop_rule, heads, state, graphs, key, executor), h.device)
    if executor in ("whole", "whole_async"):
        return _run_whole(segment, h, pad, state, K, graphs if use_graphs else None, key,
                          wait=executor == "whole")
    if B == 1 and not use_graphs:  # one row (the latency case): it stops or goes on, nothing to gather
        # (the gathered loop below gives the same results with five more small ops per exit)
        for k in range(K):
            h, lg, stop, state = segment(k, h, pad, state)
            if k == K - 1 or bool(stop):  # the one host synchronisation of this exit
                return lg, torch.full((1,), k, dtype=torch.long, device=h.device)
    rows = torch.arange(B, device=h.device)
    exit_index = torch.full((B,), K - 1, dtype=torch.long, device=h.device)
    out = None
    for k in range(K):
        if use_graphs:
            h, lg, stop, state = graphs.run(key, k, segment, h, pad, state)
        else:
            h, lg, stop, state = segment(k, h, pad, state)
        if out is None:
            out = lg.new_empty((B,) + tuple(lg.shape[1:]))
        if k == K - 1:
            out.index_copy_(0, rows, lg)
            break
        # the rows that stop first, each group in its order: index_select needs no host sync
        order = torch.argsort((~stop).to(torch.uint8), stable=True)  # (b,)
        n_stop = int(stop.sum())  # the one host synchronisation of this exit
        if n_stop:
            gone = rows.index_select(0, order[:n_stop])  # (n_stop,) original row indices
            out.index_copy_(0, gone, lg.index_select(0, order[:n_stop]))
            exit_index.index_fill_(0, gone, k)
            if n_stop == len(rows):
                break
            keep = order[n_stop:]  # (b - n_stop,)
            rows, h = rows.index_select(0, keep), h.index_select(0, keep)
            pad = None if pad is None else pad.index_select(0, keep)
            state = _take(state, keep)
    return out, exit_index


def _run_whole(segment, h, pad, state, K: int, graphs, key, wait: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`run_cascade`'s ``"whole"`` executor: every segment on all ``B`` rows; a row keeps
    the logits of the first exit that stops it; the batch ends once every row has stopped (one
    host synchronisation per exit). ``wait=False`` (``"whole_async"``): no host synchronisation,
    the batch runs to the last exit."""
    B = h.shape[0]
    done = torch.zeros(B, dtype=torch.bool, device=h.device)
    exit_index = torch.full((B,), K - 1, dtype=torch.long, device=h.device)
    out = None
    for k in range(K):
        h, lg, stop, state = graphs.run(key, k, segment, h, pad, state) if graphs is not None \
            else segment(k, h, pad, state)
        if out is None:  # (a copy: a graph's outputs are overwritten by its next replay)
            out, rows = lg.clone(), (B,) + (1,) * (lg.dim() - 1)  # rows: a row mask's view shape
        if k == K - 1:
            out = torch.where(done.view(rows), out, lg)
            break
        new = stop & ~done  # (B,) rows whose first stop is this exit
        out = torch.where(new.view(rows), lg, out)
        exit_index = exit_index.masked_fill(new, k)
        done = done | stop
        if wait and bool(done.all()):  # the one host synchronisation of this exit
            break
    return out, exit_index


def first_stop(stop):
    """The exit each row leaves at, offline (the twin of :func:`run_cascade` for rules whose
    decisions at every exit are known in advance, e.g. replayed on stored exits): the first
    exit ``k`` whose decision says stop, or the last exit ``K - 1`` when none does (the last
    exit always stops; a decision after a row's exit is never read, as in the cascade).

    Args:
        stop: ``N x K`` bools (row ``i`` would stop at exit ``k``): a numpy array or a torch
            tensor (any device); not modified.

    Returns:
        ``N`` int64 exit indices in ``[0, K)``: a numpy array for a numpy input, else a tensor
        on ``stop``'s device.

    Raises:
        ValueError: ``stop`` not 2-D or with no exit (``K = 0``).
    """
    if not isinstance(stop, torch.Tensor):
        return first_stop(torch.as_tensor(stop)).numpy()
    if stop.dim() != 2 or stop.shape[1] < 1:
        raise ValueError(f"first_stop needs an N x K table with K >= 1, got shape {tuple(stop.shape)}")
    hit = stop.to(torch.bool).clone()  # (N, K)
    hit[:, -1] = True
    return hit.to(torch.int32).argmax(1).long()  # argmax: the first maximal index


def calibrate_threshold(P: torch.Tensor, F: torch.Tensor, full: float, budget: float,
                        never: float) -> tuple[float, float]:
    """The max-probability threshold of a "stop at the first exit whose max probability is >=
    the threshold" rule that spends ``budget`` of the full model's FLOPs on the rows of ``P``
    (the confidence exit's and the cascade's calibration).

    The FLOPs fraction is a non-decreasing step function of the threshold: it is bisected in
    ``[0, never]`` (:func:`archsearch.dynamic.budget.calibrate_monotone`), and the closest
    reachable step is moved to the middle of its step, so that float noise between the
    calibration's batches and the cascade's smaller ones flips no row.

    Args:
        P: ``N x K`` each row's max probability at each exit (the last column is never read:
            the last exit always stops).
        F: ``N x K`` FLOPs of stopping at each exit (per row).
        full: the full model's FLOPs on the ``N`` rows (the fraction's denominator).
        budget: the target fraction.
        never: a threshold above every probability (no row stops before the last exit).

    Returns:
        ``(threshold, fraction)``.
    """
    from archsearch.dynamic.budget import calibrate_monotone

    def fraction(thr: float) -> float:
        return float(F.gather(1, first_stop(P >= thr)[:, None]).sum()) / max(full, 1.0)

    thr, frac = calibrate_monotone(fraction, budget, 0.0, never, iters=40, decreasing=False)
    u = torch.unique(P[:, :-1].float())  # the steps' edges: a row stops at exit k iff P >= thr
    i = int(torch.searchsorted(u, torch.tensor([thr], dtype=u.dtype, device=u.device)))
    lo, hi = (float(u[i - 1]) if i else 0.0), (float(u[i]) if i < len(u) else never)
    mid = (lo + hi) / 2  # (u[i-1], u[i]] holds thr: the same exits everywhere inside
    if fraction(mid) == frac:
        thr = mid
    return float(thr), float(frac)
