"""The structure predictor of ``gating: depth_predictor`` and RevPC (Li, Li and Wang, "From Static
to Dynamic: A Deeper, Faster, and Adaptive Language Modeling Approach"): the small MLP that maps
a pooled hidden state to a distribution over the allowed depths, and the reverse cumulative sum
that turns that distribution into the probability that each block is needed.
:class:`~archsearch.dynamic.depth.predictor.DepthPredictorGating` uses both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def revpc(probs: torch.Tensor) -> torch.Tensor:
    """Reverse cumulative sum (RevPC) of a distribution over depths.

    ``p[..., k] = sum_{j >= k} probs[..., j]``: reverse, cumulative sum, reverse back. For
    ``probs`` over the depths ``n_fixed .. n_layers``, ``p[..., k]`` is the probability that block
    ``n_fixed + k`` (1-based) is needed; ``p[..., 0]`` is the total mass (1 for a softmax). The
    result is non-increasing along the last axis for non-negative ``probs``.

    Args:
        probs: ``... x D`` tensor of non-negative probabilities (rows sum to 1).

    Returns:
        ``... x D`` tensor, same dtype.

    Source: Li, Li and Wang, "From Static to Dynamic" (RevPC).
    """
    return probs.flip(-1).cumsum(-1).flip(-1)  # (..., D)


class DepthPredictor(nn.Module):
    """The structure predictor: LayerNorm -> Linear -> GELU -> Linear over the allowed depths.

    Args:
        d_model: width ``d`` of the pooled hidden state.
        n_depths: number of allowed depths ``D``.
        hidden: MLP width.

    The output bias is zero at start (uniform ``probs``).
    """

    def __init__(self, d_model: int, n_depths: int, hidden: int = 64):
        super().__init__()
        self.d_model, self.n_depths, self.hidden = d_model, n_depths, hidden
        self.ln = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, n_depths)
        nn.init.normal_(self.fc1.weight, std=0.02)
        nn.init.zeros_(self.fc1.bias)
        nn.init.normal_(self.fc2.weight, std=0.02)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``B x d`` pooled hidden state -> ``B x D`` logits over depths."""
        return self.fc2(F.gelu(self.fc1(self.ln(h))))  # (B, D)

    def flops_per_sample(self) -> int:
        """FLOPs of one prediction (the two matrix multiplies, multiply-add = 2 FLOPs), counted
        like :func:`archsearch.models.costs.flops_per_sample` (no LayerNorm/GELU/bias)."""
        return 2 * self.d_model * self.hidden + 2 * self.hidden * self.n_depths


class DepthHistogram:
    """Exit depths taken and expected depths predicted, summed over the samples seen since
    :meth:`reset` (what ``gating: depth_predictor`` reports per evaluation).

    Args:
        depths: the allowed depths (blocks), ascending, ``n_fixed .. n_layers``.
    """

    def __init__(self, depths: list[int]):
        self.depths = [int(d) for d in depths]
        self.counts = torch.zeros(len(self.depths), dtype=torch.long)  # (D,)
        self.expected_sum: float | torch.Tensor = 0.0

    def reset(self) -> None:
        """Forget every sample."""
        self.counts = torch.zeros(len(self.depths), dtype=torch.long)
        self.expected_sum = 0.0

    def add(self, exit_index: torch.Tensor, expected: torch.Tensor) -> None:
        """Count a batch: ``B`` exit indices into ``depths`` and ``B`` expected depths (blocks),
        summed on their device (no host synchronisation; :meth:`stats` reads them)."""
        self.counts = self.counts.to(exit_index.device) + torch.bincount(exit_index, minlength=len(self.depths))
        self.expected_sum = self.expected_sum + expected.detach().double().sum()

    def stats(self) -> dict:
        """``{"depth_histogram": {"k": count}, "expected_depth": float, "mean_exit_depth": float}``
        with depths in blocks (string keys, so the dict round-trips through JSON):
        ``expected_depth`` the mean of ``sum_d d * probs_d``, ``mean_exit_depth`` the mean exit
        depth actually executed; NaN for both without samples."""
        counts = self.counts.tolist()
        n = sum(counts)
        return {
            "depth_histogram": {str(d): int(c) for d, c in zip(self.depths, counts)},
            "expected_depth": float(self.expected_sum) / n if n else float("nan"),
            "mean_exit_depth": float(sum(d * c for d, c in zip(self.depths, counts)) / n) if n else float("nan"),
        }
