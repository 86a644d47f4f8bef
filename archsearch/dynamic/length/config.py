"""Length configurations of the Length-Adaptive Transformer: validation, LengthDrop sampling,
the smallest and the constant-ratio configurations, per-sample kept counts.

Shared by :mod:`archsearch.dynamic.length.drop` (training and inference) and
:mod:`archsearch.dynamic.length.evolution` (the search over configurations). Source: Kim & Cho,
"Length-Adaptive Transformer", ACL 2021, arXiv 2010.07003, sec. 3-4.

**Length configuration.** A tuple ``(l_1, ..., l_L)`` (one int per block, non-increasing,
``l_i >= min_tokens``, ``l_1 <= n``) in tokens *of a full sequence of ``n = max_len`` tokens*:
``l_i`` tokens leave block ``i`` and go on to block ``i + 1``. A sequence with ``m`` real tokens
keeps ``k_i = clamp(ceil(l_i * m / n), min(min_tokens, m), m)`` of them (proportional scaling),
so a configuration means the same *fraction* of every sentence whatever its length; padding is
never a kept token. For the causal LM ``m`` is the block length ``T`` of the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

#: The paper's LengthDrop bound ``p`` (Kim & Cho 2021, sec. 3.1, over 12-layer BERT-base): the
#: default of the functions below; ``gating: length_drop`` has its own default,
#: :class:`archsearch.dynamic.length.settings.LengthDropSettings` ``length_drop_p``.
PAPER_P = 0.2
#: Fewest tokens a block keeps (or all real ones, if fewer).
MIN_TOKENS = 2


def _ceil_frac(p_keep: float, n: int) -> int:
    """``ceil(p_keep * n)`` robust to float noise (0.8 * 40 must give 32, not 33)."""
    return math.ceil(round(p_keep * n, 9))


def check_length_config(length_config: Sequence[int], n_layers: int, n: int,
                        min_tokens: int = MIN_TOKENS) -> tuple[int, ...]:
    """Validate a length configuration and return it as a tuple of ints.

    Raises:
        ValueError: wrong number of entries, an entry outside ``[min(min_tokens, n), n]`` or
            a length larger than the previous one.
    """
    cfg = tuple(int(v) for v in length_config)
    if len(cfg) != n_layers:
        raise ValueError(f"length config has {len(cfg)} entries, expected one per layer ({n_layers})")
    lo = min(min_tokens, n)
    prev = n
    for i, v in enumerate(cfg):
        if not lo <= v <= prev:
            raise ValueError(f"length config {list(cfg)}: entry {i} = {v} must be in [{lo}, {prev}] "
                             f"(non-increasing, at least {lo}, at most n={n})")
        prev = v
    return cfg


def smallest_length_config(n_layers: int, n: int, p: float = PAPER_P,
                           min_tokens: int = MIN_TOKENS) -> tuple[int, ...]:
    """The smallest LengthDrop sub-model: ``l_{i+1} = max(min_tokens, ceil((1 - p) l_i))``,
    ``l_0 = n`` (Kim & Cho 2021, sec. 3.2, sandwich rule)."""
    out, prev = [], n
    for _ in range(n_layers):
        prev = min(prev, max(min_tokens, _ceil_frac(1.0 - p, prev)))
        out.append(prev)
    return tuple(out)


def sample_length_config(n_layers: int, n: int, p: float = PAPER_P, *,
                         min_tokens: int = MIN_TOKENS,
                         generator: torch.Generator | None = None) -> tuple[int, ...]:
    """LengthDrop: ``l_{i+1} ~ Uniform{ceil((1 - p) l_i), ..., l_i}`` (integers), ``l_0 = n``,
    never below ``min_tokens`` (Kim & Cho 2021, sec. 3.1).

    Args:
        n_layers: number of blocks ``L``.
        n: reference sequence length (``max_len``).
        p: LengthDrop probability, ``0 <= p < 1``.
        min_tokens: lower bound of every length.
        generator: torch RNG (reproducible sampling).

    Returns:
        ``L`` non-increasing ints.

    Raises:
        ValueError: ``p`` outside ``[0, 1)`` or ``n < 1``.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"length drop p must be in [0, 1), got {p}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    out, prev = [], n
    for _ in range(n_layers):
        lo = min(prev, max(min_tokens, _ceil_frac(1.0 - p, prev)))
        prev = int(torch.randint(lo, prev + 1, (1,), generator=generator))
        out.append(prev)
    return tuple(out)


def constant_ratio_config(n_layers: int, n: int, keep: float,
                          min_tokens: int = MIN_TOKENS) -> tuple[int, ...]:
    """Every block keeps the fraction ``keep`` of its input tokens:
    ``l_i = max(min_tokens, ceil(keep * l_{i-1}))``, ``l_0 = n`` (the paper's initial
    population, sec. 4).

    Raises:
        ValueError: ``keep`` outside ``[0, 1]``.
    """
    if not 0.0 <= keep <= 1.0:
        raise ValueError(f"keep must be in [0, 1], got {keep}")
    return smallest_length_config(n_layers, n, 1.0 - keep, min_tokens)


def scale_counts(length, real: torch.Tensor, n: int, min_tokens: int = MIN_TOKENS) -> torch.Tensor:
    """Per-sample kept counts ``clamp(ceil(length * m / n), min(min_tokens, m), m)``.

    Args:
        length: ``l_i`` in tokens of a full ``n``-token sequence (an int), or ``(L, 1)`` int64
            lengths of ``L`` blocks at once.
        real: ``(B,)`` (or ``(1, B)``) int64 real-token counts ``m``.
        n: reference length.

    Returns:
        ``(B,)`` int64 counts (``(L, B)`` for ``(L, 1)`` lengths).
    """
    k = (length * real + n - 1) // n  # (B,) ceil
    return torch.maximum(k, real.clamp(max=min_tokens)).minimum(real)  # (B,)
