"""Trial config -> model config, and the evaluation-batch shapes costs are measured on.

One owner for three facts that the trainable, the inner-loop strategies, the searchers' cost
function and the pre-launch checks must agree on:

* :data:`DEFAULTS` and :func:`trial_config`: the values a trial runs with (defaults, then the
  space's ``fixed`` values, then the searched values).
* :func:`model_config`: the :class:`~archsearch.models.transformer.TransformerConfig` a trial
  config builds (``init_from`` reads the checkpoint's architecture; ``n_layers`` with it keeps
  the checkpoint's first blocks).
* :func:`trim_padding` and :func:`eval_lengths`: the one rule that cuts a batch's trailing
  all-padding columns, and the lengths ``T'`` the validation batches run at, so FLOPs known
  before training equal the ``flops_per_sample`` a static trial reports.

torch is imported inside the functions that need it: the CLI imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from archsearch.models.transformer import TransformerConfig

#: Values for config keys a search space may leave out.
DEFAULTS: dict[str, Any] = {
    "n_layers": 2,  # from scratch only: with init_from, the checkpoint's depth (trial_config)
    "d_model": 64,
    "n_heads": 4,
    "d_ffn_mult": 4,
    "dropout": 0.1,
    "lr": 1e-3,
    "weight_decay": 0.01,
    "warmup_steps": 50,
    "label_smoothing": 0.0,
    "gating": "static",
    "tying": "none",
}

#: Rows per validation batch when a trial evaluates (and when costs are known in advance).
EVAL_BATCH_SIZE = 256


def trial_config(cfg: Mapping[str, Any], fixed: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The values a trial runs with: :data:`DEFAULTS`, overridden by ``fixed`` (the space's
    fixed values), overridden by the non-``None`` entries of ``cfg`` (the searched values; a
    ``None`` is an inactive conditional parameter).

    With ``init_from`` (a checkpoint) the default ``n_layers`` is left out: the model keeps
    every layer of the checkpoint unless ``fixed`` or ``cfg`` gives ``n_layers`` (a static
    cut, see :func:`model_config`), e.g. a ``when:`` condition active for this trial only.
    """
    searched = {k: v for k, v in cfg.items() if v is not None}
    out = {**DEFAULTS, **(fixed or {}), **searched}
    if out.get("init_from") and "n_layers" not in searched and (fixed or {}).get("n_layers") is None:
        del out["n_layers"]  # the checkpoint's depth, not the from-scratch default
    return out


def model_config(cfg: Mapping[str, Any], data) -> "TransformerConfig":
    """The :class:`TransformerConfig` a trial config builds on the run's data.

    Args:
        cfg: a complete trial config (see :func:`trial_config`): ``n_layers``, ``d_model``,
            ``n_heads``, ``d_ffn`` or ``d_ffn_mult`` (FFN width = mult x d_model), ``dropout``;
            with ``init_from: PATH`` the architecture is the checkpoint's instead, cut to its
            first ``n_layers`` blocks when ``cfg`` has ``n_layers`` (a static cut; without
            it, all of them).
        data: anything with ``vocab_size``, ``max_len`` (tokens), ``pad_id``, ``task``
            (``"classification"`` / ``"lm"``) and ``n_classes`` (classification), e.g.
            :class:`archsearch.data.PreparedData`.

    Raises:
        KeyError: a required key is missing from ``cfg``.
        ValueError: an invalid architecture (e.g. ``d_model % n_heads != 0``), or
            ``init_from`` with language-modelling data, an unreadable checkpoint config or
            ``n_layers`` outside ``1 ..`` the checkpoint's layer count.
        FileNotFoundError: ``init_from`` names no checkpoint directory.
    """
    from archsearch.models.transformer import TransformerConfig

    if cfg.get("init_from"):
        from archsearch.models.pretrained import bert_transformer_config

        if data.task != "classification":
            raise ValueError(f"init_from supports classification only, the data is {data.task!r}")
        return bert_transformer_config(str(cfg["init_from"]), max_len=int(data.max_len),
                                       n_classes=int(data.n_classes), dropout=float(cfg["dropout"]),
                                       pad_id=int(data.pad_id), n_layers=cfg.get("n_layers"))
    d_model = int(cfg["d_model"])
    d_ffn = int(cfg["d_ffn"]) if cfg.get("d_ffn") else int(round(float(cfg["d_ffn_mult"]) * d_model))
    kwargs: dict[str, Any] = dict(
        vocab_size=int(data.vocab_size),
        max_len=int(data.max_len),
        n_layers=int(cfg["n_layers"]),
        d_model=d_model,
        n_heads=int(cfg["n_heads"]),
        d_ffn=d_ffn,
        dropout=float(cfg["dropout"]),
        task=data.task,
        pad_id=int(data.pad_id),
    )
    if data.task == "classification":
        kwargs["n_classes"] = int(data.n_classes)
    return TransformerConfig(**kwargs)


def _trimmed_length(mask: "torch.Tensor") -> int:
    """``T'``: 1 + the last column of ``mask`` (``B x T`` bool) holding a real token; 1 if none."""
    cols = mask.any(0).nonzero()  # (n_real_columns, 1)
    return int(cols[-1]) + 1 if len(cols) else 1


def trim_padding(ids: "torch.Tensor", mask: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """Drop a batch's trailing all-padding columns (the one trim rule of the package).

    Args:
        ids: ``B x T`` token ids.
        mask: ``B x T`` bool, True = real token.

    Returns:
        ``(ids, mask)`` sliced to ``B x T'``, ``T'`` = 1 + the last column in which some row has
        a real token (at least 1, also for an all-padding batch). Views, not copies.
    """
    t = _trimmed_length(mask)
    return ids[:, :t], mask[:, :t]


def eval_lengths(data, batch_size: int = EVAL_BATCH_SIZE) -> list[tuple[int, int]]:
    """``(T', n)`` for each validation batch as the trainable evaluates it: consecutive rows in
    batches of ``batch_size``, each trimmed by :func:`trim_padding` (``T'`` tokens, ``n`` rows).

    Language modelling evaluates blocks of ``max_len`` tokens: ``[(max_len, 1)]``.

    Args:
        data: :class:`archsearch.data.PreparedData` (its ``"validation"`` split).
        batch_size: rows per validation batch (>= 1).

    Raises:
        ValueError: ``batch_size < 1``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if data.task == "lm":
        return [(int(data.max_len), 1)]
    mask = data["validation"].attention_mask  # (N, T) bool
    return [(_trimmed_length(mask[i:i + batch_size]), int(mask[i:i + batch_size].shape[0]))
            for i in range(0, mask.shape[0], batch_size)]
