"""Mini-batch iterators over :class:`~archsearch.data.PreparedData` tensors (CPU, no DataLoader).

Both are plain generators: cheap to create once per epoch, deterministic given a
``torch.Generator``, and they never copy the whole dataset.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from archsearch.data.prepare import ClassificationSplit


def num_batches(n: int, batch_size: int, drop_last: bool = False) -> int:
    """Number of batches an epoch of ``n`` items yields."""
    return n // batch_size if drop_last else math.ceil(n / batch_size)


def classification_batches(
    split: "ClassificationSplit",
    batch_size: int,
    shuffle: bool = True,
    generator: "torch.Generator | None" = None,
    *,
    drop_last: bool = False,
    trim: bool = False,
) -> Iterator[dict[str, "torch.Tensor"]]:
    """Yield one epoch of classification batches.

    Args:
        split: a :class:`ClassificationSplit` (``data.train``, ``data.validation``...).
        batch_size: rows per batch B (the last batch may be smaller unless ``drop_last``).
        shuffle: random row order (from ``generator``) instead of the stored order.
        generator: ``torch.Generator`` for the permutation (reproducible epochs).
        drop_last: skip a final incomplete batch.
        trim: cut the padding columns that no row of the batch uses, so T = the longest row
            in the batch instead of ``max_len`` (less compute; shapes then vary per batch).

    Yields:
        ``{"input_ids": LongTensor (B, T), "attention_mask": BoolTensor (B, T),
        "labels": LongTensor (B,)}`` with T = ``max_len`` (or less with ``trim``).
    """
    import torch

    from archsearch.models.config import trim_padding

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = len(split)
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    stop = (n // batch_size) * batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        idx = order[start:start + batch_size]
        ids, mask = split.input_ids[idx], split.attention_mask[idx]
        if trim:
            ids, mask = trim_padding(ids, mask)
        yield {"input_ids": ids, "attention_mask": mask, "labels": split.labels[idx]}


def lm_batches(
    stream: "torch.Tensor",
    block_size: int,
    batch_size: int,
    generator: "torch.Generator | None" = None,
    *,
    shuffle: bool = True,
    drop_last: bool = False,
) -> Iterator[tuple["torch.Tensor", "torch.Tensor"]]:
    """Yield one epoch of (input, next-token target) blocks from a 1-D token stream.

    The stream is cut into non-overlapping blocks of ``block_size`` tokens (each block reads one
    extra token for its last target). With ``shuffle`` the cut starts at a random offset in
    ``[0, block_size)`` and the blocks come in random order, so every epoch sees each token about
    once with different block boundaries; without it blocks start at 0 in order (use this for
    evaluation: every token except the first is predicted exactly once up to the remainder).

    Args:
        stream: LongTensor (n_tokens,).
        block_size: T, tokens per row.
        batch_size: B, rows per batch (the last batch may be smaller unless ``drop_last``).
        generator: ``torch.Generator`` for the offset and order.

    Yields:
        ``(x, y)``: LongTensors (B, T); a row starting at ``s`` has ``x[t] = stream[s + t]`` and
        ``y[t] = stream[s + t + 1]`` (the next token).

    Raises:
        ValueError: the stream has fewer than ``block_size + 1`` tokens.
    """
    import torch

    if stream.dim() != 1:
        raise ValueError(f"stream must be 1-D, got shape {tuple(stream.shape)}")
    if block_size < 1 or batch_size < 1:
        raise ValueError("block_size and batch_size must be >= 1")
    n = stream.shape[0]
    if n < block_size + 1:
        raise ValueError(f"stream has {n} tokens, needs at least block_size + 1 = {block_size + 1}")
    offset = 0
    if shuffle:
        max_off = min(block_size, n - block_size - 1)
        offset = int(torch.randint(0, max_off + 1, (1,), generator=generator))
    n_blocks = (n - 1 - offset) // block_size
    starts = offset + torch.arange(n_blocks) * block_size
    if shuffle:
        starts = starts[torch.randperm(n_blocks, generator=generator)]
    cols = torch.arange(block_size + 1)
    stop = (n_blocks // batch_size) * batch_size if drop_last else n_blocks
    for b in range(0, stop, batch_size):
        rows = stream[starts[b:b + batch_size, None] + cols]  # (B, T+1)
        yield rows[:, :-1], rows[:, 1:]
