"""Cost model of :class:`~archsearch.models.transformer.Transformer`: params, FLOPs, latency.

Every function is named with its unit (see the metric table in docs/design.md):

* :func:`params_total` / :func:`params_trainable` -- counts of scalars.
* :func:`flops_per_sample` -- analytic forward FLOPs for one sequence (a multiply-add = 2 FLOPs).
* :func:`count_flops_torch` -- the same quantity measured with ``FlopCounterMode`` (the check).
* :func:`latency_ms` -- median wall-clock forward milliseconds per sample on this machine.
* :func:`static_costs_fn` -- the costs of a trial config's static full-depth model known
  without training (FLOPs per sample on the validation batches; parameter counts);
  :func:`exit_head_params` -- the parameters of per-exit classifiers. What a gating changes in
  them (a FLOPs budget, exit heads) is the gating's own
  (:func:`archsearch.dynamic.known_costs.known_costs_fn`, the one cost function searchers and
  pre-launch constraint checks share).

What the FLOP count covers: exactly what ``torch.utils.flop_counter.FlopCounterMode`` counts for
our model, i.e. matrix multiplies only:

* per executed block with ``h`` computed heads (``dh`` = d_model / n_heads, ``a = h * dh``):
  Q, K, V projections ``3 * 2*T*d*a``; attention scores ``QK^T`` ``2*h*T*T*dh``; ``AV``
  ``2*h*T*T*dh``; O projection ``2*T*a*d``; FFN ``2 * 2*T*d*d_ffn``;
* output head: classification ``2*d*C`` (on the pooled vector, once per sample); LM
  ``2*T*d*V`` (vocabulary projection at every position).

Not counted (by either side): embedding lookups, bias additions, LayerNorm, softmax, GELU,
dropout, masking, residual additions and mean pooling -- together a few percent of the total
at our sizes. Sequence length ``T`` is the padded length the model actually runs on. Causal
attention is counted as full ``T x T`` (that is what the kernels compute). Bias additions are
counted by neither (``FlopCounterMode`` counts ``addmm`` as ``2*M*N*K``).

``FlopCounterMode`` reports 0 FLOPs for ``scaled_dot_product_attention`` on CPU, so
:func:`count_flops_torch` runs the model with ``attention_impl="math"`` (explicit matmuls).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch
from torch import nn

from archsearch.models.config import eval_lengths, model_config, trial_config
from archsearch.models.transformer import MultiHeadAttention, Transformer, TransformerConfig


def params_total(model: nn.Module) -> int:
    """Number of parameter scalars stored by ``model`` (trainable or frozen).

    Each distinct tensor is counted once: a Parameter shared by several modules (weight tying)
    and distinct Parameter objects that view the same memory both count once. Buffers are not
    parameters and are not counted.
    """
    seen_ids: set[int] = set()
    seen_memory: set[tuple] = set()
    total = 0
    for _, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen_ids:
            continue
        seen_ids.add(id(p))
        if p.device.type != "meta":
            key = (p.data_ptr(), tuple(p.shape), p.stride(), p.dtype)
            if key in seen_memory:
                continue
            seen_memory.add(key)
        total += p.numel()
    return total


def params_trainable(model: nn.Module) -> int:
    """Number of distinct trainable parameter scalars (``requires_grad``) of ``model``.

    Shared / tied Parameters are counted once, by object identity: that is what an optimizer
    updates and holds state for, so layer tying lowers this number.
    """
    seen: set[int] = set()
    total = 0
    for _, p in model.named_parameters(remove_duplicate=False):
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def flops_per_sample(
    config: TransformerConfig,
    seq_len: int,
    *,
    n_layers: int | None = None,
    heads_per_layer: Sequence[int] | None = None,
) -> int:
    """Analytic forward FLOPs for one sequence of ``seq_len`` tokens (multiply-add = 2 FLOPs).

    Counts the matrix multiplies listed in the module docstring, the same operations
    ``FlopCounterMode`` counts (they agree to within rounding; tested within 2%).

    Args:
        config: the model's config.
        seq_len: tokens per sequence ``T`` as run (padded length), ``1..max_len``.
        n_layers: blocks executed (early exit), ``0..config.n_layers``; ``None`` = all.
        heads_per_layer: number of heads computed in each executed block (one int per block,
            each ``0..n_heads``); ``None`` = all heads. Only the count matters for FLOPs: pass
            ``[len(h) for h in head_subsets]`` for index lists.

    Returns:
        FLOPs per sample (int).

    Raises:
        ValueError: ``seq_len``, ``n_layers`` or a head count out of range, or
            ``heads_per_layer`` length != executed layers.
    """
    T, d, dh = seq_len, config.d_model, config.d_head
    if not 1 <= T <= config.max_len:
        raise ValueError(f"seq_len must be in [1, max_len={config.max_len}], got {T}")
    L = config.n_layers if n_layers is None else n_layers
    if not 0 <= L <= config.n_layers:
        raise ValueError(f"n_layers must be in [0, {config.n_layers}], got {L}")
    heads = [config.n_heads] * L if heads_per_layer is None else [int(h) for h in heads_per_layer]
    if len(heads) != L:
        raise ValueError(f"heads_per_layer has {len(heads)} entries, expected {L} (one per executed layer)")
    flops = 0
    for h in heads:
        if not 0 <= h <= config.n_heads:
            raise ValueError(f"head count must be in [0, {config.n_heads}], got {h}")
        a = h * dh  # width of the computed heads
        if h:
            flops += 3 * 2 * T * d * a  # Q, K, V projections
            flops += 2 * h * T * T * dh  # scores Q K^T
            flops += 2 * h * T * T * dh  # probabilities @ V
            flops += 2 * T * a * d  # O projection
        flops += 2 * 2 * T * d * config.d_ffn  # FFN up + down
    if config.task == "classification":
        flops += 2 * d * config.n_classes  # head on the pooled vector
    else:
        flops += 2 * T * d * config.vocab_size  # vocabulary projection at every position
    return flops


def count_flops_torch(
    model: Transformer,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    n_layers: int | None = None,
    heads_per_layer: Sequence[Sequence[int] | None] | None = None,
) -> int:
    """Forward FLOPs per sample measured by ``torch.utils.flop_counter.FlopCounterMode``.

    Runs one forward pass (eval mode, no grad) on ``input_ids`` (``B x T``) and divides the
    total by ``B``. Attention modules are switched to ``attention_impl="math"`` for the
    measurement (FlopCounterMode counts 0 FLOPs for SDPA on CPU) and restored afterwards, as
    is the train/eval mode.

    Args:
        model: a :class:`Transformer`.
        input_ids: ``B x T`` token ids.
        attention_mask: ``B x T`` or ``None``, as in ``Transformer.forward``.
        n_layers, heads_per_layer: passed to ``Transformer.forward``.

    Returns:
        FLOPs per sample (int).
    """
    from torch.utils.flop_counter import FlopCounterMode

    attn_modules = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    saved_impl = [m.attention_impl for m in attn_modules]
    was_training = model.training
    try:
        for m in attn_modules:
            m.attention_impl = "math"
        model.eval()
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(input_ids, attention_mask, n_layers=n_layers, heads_per_layer=heads_per_layer)
    finally:
        for m, impl in zip(attn_modules, saved_impl):
            m.attention_impl = impl
        model.train(was_training)
    return int(counter.get_total_flops()) // input_ids.shape[0]


def _synchronize(device: torch.device) -> None:
    """Wait for the device's queued kernels (CUDA); a no-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device | str) -> str:
    """A readable name of ``device`` for the records: the GPU's name
    (``torch.cuda.get_device_name``) or ``"cpu"``."""
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def latency_ms(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    batch_size: int = 32,
    repeats: int = 20,
    warmup: int = 3,
    forward_kwargs: Mapping[str, Any] | None = None,
) -> float:
    """Median wall-clock forward time PER SAMPLE, in milliseconds, on this machine.

    The first ``batch_size`` rows of ``input_ids`` (rows are repeated cyclically if there are
    fewer) form one batch; it is run ``warmup`` times untimed, then ``repeats`` times timed with
    ``time.perf_counter``, under ``torch.inference_mode`` with ``model.eval()`` (the previous
    train/eval mode is restored). Returns median batch time / ``batch_size``. Uses whatever
    ``torch.get_num_threads()`` is set to; report it with the number. On CUDA every timed call
    is synchronised before and after (``torch.cuda.synchronize``), so the time is the kernels'.

    Args:
        model: called as ``model(input_ids, attention_mask, **forward_kwargs)``.
        input_ids: ``N x T`` token ids.
        attention_mask: ``N x T`` or ``None``.
        batch_size: samples per forward call (report it: per-sample latency depends on it).
        repeats: timed forward calls (>= 1).
        warmup: untimed forward calls before timing (>= 0).
        forward_kwargs: extra keyword arguments for the forward call, e.g.
            ``{"n_layers": 2, "heads_per_layer": [[0, 1], [0, 1]]}`` to time a gated model.

    Raises:
        ValueError: ``batch_size < 1``, ``repeats < 1``, ``warmup < 0`` or empty ``input_ids``.
    """
    if batch_size < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"need batch_size >= 1, repeats >= 1, warmup >= 0; got {batch_size}, {repeats}, {warmup}")
    n = input_ids.shape[0]
    if n == 0:
        raise ValueError("input_ids is empty")
    rows = torch.arange(batch_size, device=input_ids.device) % n  # on the ids' device: no copy per call
    ids = input_ids[rows]  # (batch_size, T)
    mask = None if attention_mask is None else attention_mask[rows]  # (batch_size, T)
    kwargs = dict(forward_kwargs or {})
    was_training = model.training
    model.eval()
    times: list[float] = []
    try:
        with torch.inference_mode():
            for _ in range(warmup):
                model(ids, mask, **kwargs)
            for _ in range(repeats):
                _synchronize(ids.device)
                t0 = time.perf_counter()
                model(ids, mask, **kwargs)
                _synchronize(ids.device)  # CUDA runs asynchronously: time the kernels, not their launch
                times.append(time.perf_counter() - t0)
    finally:
        model.train(was_training)
    return statistics.median(times) * 1000.0 / batch_size


def exit_head_params(config: TransformerConfig, depths: Iterable[int]) -> int:
    """Parameter scalars :meth:`Transformer.add_exit_heads` adds for exits at ``depths``
    (blocks): classification, one ``Linear(d_model, n_classes)`` (``d*C + C`` scalars, all
    trainable) per distinct depth below ``n_layers`` (the deepest exit keeps :attr:`head`);
    LM, 0 (no-op there). Exact: what :func:`params_total` and :func:`params_trainable` of the
    model gain.

    Raises:
        ValueError: a depth outside ``[0, n_layers]`` (as ``add_exit_heads``).
    """
    if config.task != "classification":
        return 0
    ks = {int(k) for k in depths}
    bad = sorted(k for k in ks if not 0 <= k <= config.n_layers)
    if bad:
        raise ValueError(f"exit depth {bad[0]} outside [0, n_layers={config.n_layers}]")
    per_head = config.d_model * config.n_classes + config.n_classes
    return per_head * sum(1 for k in ks if k < config.n_layers)


class StaticCosts(NamedTuple):
    """What :func:`static_costs_fn` knows of one trial config."""

    #: The complete trial config (:func:`~archsearch.models.config.trial_config`).
    cfg: dict[str, Any]
    #: The :class:`TransformerConfig` it builds (:func:`~archsearch.models.config.model_config`).
    model_config: TransformerConfig
    #: ``{"flops_per_sample", "params_total", "params_trainable"}`` of the static full-depth
    #: model (floats; a fresh dict per call).
    costs: dict[str, float]


def static_costs_fn(data, fixed: Mapping[str, Any] | None = None) -> Callable[[Mapping[str, Any]], StaticCosts]:
    """The costs of a trial config's static, full-depth model, known without training: the
    gating-free part of :func:`archsearch.dynamic.known_costs.known_costs_fn` (which applies
    what the config's gating changes).

    ``static(config)`` merges ``config`` as the trainable does
    (:func:`archsearch.models.config.trial_config`), builds its
    :func:`~archsearch.models.config.model_config` and returns a :class:`StaticCosts` whose
    ``costs`` are floats:

    * ``flops_per_sample`` (FLOPs): :func:`flops_per_sample` of every block and the output head,
      averaged over the validation batches exactly as the trainable evaluates them
      (:func:`~archsearch.models.config.eval_lengths`: batches trimmed to their last real token;
      LM blocks of ``max_len``). Exactly the metric a ``static`` trial reports.
    * ``params_total`` / ``params_trainable`` (counts): :func:`params_total` /
      :func:`params_trainable` of the :class:`Transformer` built on the ``meta`` device (no
      memory, no initialisation), without exit heads: exactly what a ``static`` untied trial
      reports. Layer tying is not applied: for ``tying`` other than ``none`` both are the untied
      model's, an upper bound.

    Costs are cached per model config (up to the fields that change no cost: dropout, LayerNorm
    epsilon, activation, attention kernel), so configs differing only in optimiser or strategy
    keys share the entry. The function keeps only the scalars it needs (not the dataset), so it
    stays small when pickled (Ray).

    Args:
        data: the run's :class:`archsearch.data.PreparedData` (``task``, ``vocab_size``,
            ``max_len``, ``pad_id``, ``n_classes`` and the validation masks are read).
        fixed: the space's ``fixed`` values (merged under each config).

    Returns:
        ``static(config) -> StaticCosts``; it raises what
        :func:`~archsearch.models.config.model_config` raises (``ValueError`` for an invalid
        architecture or checkpoint).
    """
    lengths = eval_lengths(data)  # [(T', rows)]
    total = sum(n for _, n in lengths)
    scalars = SimpleNamespace(vocab_size=int(data.vocab_size), max_len=int(data.max_len),
                              pad_id=int(data.pad_id), task=data.task,
                              n_classes=int(getattr(data, "n_classes", 0) or 0))
    fixed = dict(fixed or {})
    cache: dict[tuple, dict[str, float]] = {}

    def static(config: Mapping[str, Any]) -> StaticCosts:
        cfg = trial_config(config, fixed)
        mcfg = model_config(cfg, scalars)
        # dropout, LayerNorm epsilon, activation and attention kernel change neither FLOPs
        # (as counted) nor parameters: one cache entry for all of their values
        key = dataclasses.astuple(dataclasses.replace(mcfg, dropout=0.0, layer_norm_eps=1e-5,
                                                      activation="gelu", attention_impl="sdpa"))
        hit = cache.get(key)
        if hit is None:
            flops = sum(n * flops_per_sample(mcfg, T) for T, n in lengths) / total
            with torch.device("meta"):
                model = Transformer(mcfg)
            hit = {"flops_per_sample": float(flops), "params_total": float(params_total(model)),
                   "params_trainable": float(params_trainable(model))}
            cache[key] = hit
        return StaticCosts(cfg, mcfg, dict(hit))

    return static
