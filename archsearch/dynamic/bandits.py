"""Multi-armed bandits for the DHT inner loop, vectorised with numpy and seeded.

* :class:`UCB1` -- Auer, Cesa-Bianchi & Fischer 2002, "Finite-time Analysis of the Multiarmed
  Bandit Problem" (Machine Learning 47), Fig. 1. Several independent bandits in one object (one
  row each), so the DHT's per-layer head-count bandits update in one call.
* :class:`LinUCB` -- Li, Chu, Langford & Schapire 2010, "A Contextual-Bandit Approach to
  Personalized News Article Recommendation" (WWW), Algorithm 1 (disjoint linear models). Selects
  for a whole batch of contexts at once.
* :class:`CombinatorialTS` -- Thompson sampling with a Beta-Bernoulli posterior per base arm,
  playing the top-k of the sampled means: Chapelle & Li 2011, "An Empirical Evaluation of
  Thompson Sampling" (NeurIPS), Alg. 2; Wang & Chen 2018, "Thompson Sampling for Combinatorial
  Semi-bandits" (ICML), CTS with the top-k oracle. Several rows, as UCB1.

A bandit with a budget plays ``argmax_a (score_a - price * cost_a)`` through the ``offset``
argument of ``select``, the price coming from :class:`archsearch.dynamic.budget.DualPrice`.
The cascade's stop policy is :mod:`archsearch.dynamic.depth.stopping` (least squares) or
:mod:`archsearch.dynamic.depth.stop_bandit` (per-exit {stop, continue} LinUCB bandits).

All randomness comes from a ``numpy.random.Generator`` seeded at construction; the same seed and
the same calls give the same choices. ``state_dict()`` holds tensors, numbers and strings only
(loadable with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).copy())


class UCB1:
    """``n_rows`` independent UCB1 bandits with ``n_arms`` arms each.

    Index of arm ``a`` in a row after ``t`` plays of that row: ``mean_a + c * sqrt(2 ln t / n_a)``;
    arms never played come first (lowest index first). Rewards may have any scale; ``c`` should
    match it (``c = 1`` for rewards in [0, 1]).

    Args:
        n_arms: arms per bandit (>= 1).
        n_rows: independent bandits (>= 1).
        c: exploration scale (>= 0).
        decay: factor in (0, 1] applied to all counts and sums at each :meth:`update` (1 = the
            stationary bandit of the paper; < 1 forgets old rewards, for drifting rewards such as
            a model that is still training; "discounted UCB", Garivier & Moulines 2011).

    Raises:
        ValueError: ``n_arms < 1``, ``n_rows < 1``, ``c < 0`` or ``decay`` outside (0, 1].
    """

    def __init__(self, n_arms: int, *, n_rows: int = 1, c: float = 1.0, decay: float = 1.0):
        if n_arms < 1 or n_rows < 1 or c < 0 or not 0 < decay <= 1:
            raise ValueError(f"need n_arms >= 1, n_rows >= 1, c >= 0, 0 < decay <= 1; "
                             f"got {n_arms}, {n_rows}, {c}, {decay}")
        self.n_arms, self.n_rows, self.c, self.decay = int(n_arms), int(n_rows), float(c), float(decay)
        self.counts = np.zeros((n_rows, n_arms))  # plays per (row, arm)
        self.sums = np.zeros((n_rows, n_arms))  # summed rewards per (row, arm)

    def means(self) -> np.ndarray:
        """``n_rows x n_arms`` empirical mean rewards (0 for arms never played)."""
        return self.sums / np.maximum(self.counts, 1)

    def select(self, rows: np.ndarray | None = None, *, greedy: bool = False,
               offset: np.ndarray | None = None) -> np.ndarray:
        """One arm per requested row.

        Args:
            rows: row indices (``R``,), default all rows.
            greedy: pick the best empirical mean (plus ``offset``) among played arms (no
                exploration); a row never played returns its last arm (for head counts: all
                heads -- no evidence, no pruning).
            offset: ``K`` or ``R x K`` values added to every arm's score (e.g.
                ``-price * cost_a``: a cost-aware choice); arms never played still come first
                (in exploration), ordered by ``offset``.

        Returns:
            ``R`` int array of arm indices.
        """
        rows = np.arange(self.n_rows) if rows is None else np.asarray(rows, dtype=int)
        n = self.counts[rows]  # (R, K), possibly fractional with decay
        mean = self.sums[rows] / np.maximum(n, 1)  # (R, K)
        off = np.zeros_like(mean) if offset is None else np.broadcast_to(np.asarray(offset, float), mean.shape)
        if greedy:
            score = np.where(n > 0, mean + off, -np.inf)
            unplayed = (n == 0).all(axis=1)
            score[unplayed] = 0.0
            score[unplayed, :-1] = -np.inf  # unplayed row: the last arm
        else:
            t = np.maximum(n.sum(axis=1, keepdims=True), 1)  # (R, 1)
            bonus = self.c * np.sqrt(2.0 * np.log(t) / np.maximum(n, 1))  # (R, K)
            fresh = n <= 1e-3  # never played (or decayed to nothing): play first
            score = np.where(fresh, 1e12 + off, mean + bonus + off)
        return score.argmax(axis=1)

    def update(self, rows: np.ndarray, arms: np.ndarray, rewards: np.ndarray | float) -> None:
        """Record reward(s) for played ``(row, arm)`` pairs (arrays of equal length ``R``;
        a scalar reward applies to all). Repeated pairs accumulate."""
        rows, arms = np.asarray(rows, dtype=int), np.asarray(arms, dtype=int)
        r = np.broadcast_to(np.asarray(rewards, dtype=float), rows.shape)
        if self.decay < 1:
            self.counts *= self.decay
            self.sums *= self.decay
        np.add.at(self.counts, (rows, arms), 1.0)
        np.add.at(self.sums, (rows, arms), r)

    def state_dict(self) -> dict[str, Any]:
        return {"counts": _t(self.counts), "sums": _t(self.sums), "c": self.c, "decay": self.decay}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = state["counts"].numpy().copy()
        self.sums = state["sums"].numpy().copy()
        self.c, self.decay = float(state["c"]), float(state["decay"])


class LinUCB:
    """Disjoint LinUCB: one ridge-regression model per arm over a ``d``-dim context.

    Per arm ``a``: ``A_a = I + sum x x^T``, ``b_a = sum r x``, ``theta_a = A_a^-1 b_a``; score of
    context ``x``: ``x . theta_a + alpha * sqrt(x^T A_a^-1 x)``. Ties go to the HIGHEST arm index
    (for the DHT that is the deepest allowed depth: when unsure, compute more).

    Args:
        n_arms: number of arms ``K`` (>= 1).
        dim: context dimension ``d`` (>= 1); include a constant feature for an intercept.
        alpha: exploration scale (>= 0).
        decay: factor in (0, 1] applied to the data part of every ``A_a`` (``A_a - I``) and to
            ``b_a`` at each :meth:`update` (1 = the paper; < 1 forgets old observations).

    Raises:
        ValueError: bad sizes, ``alpha < 0`` or ``decay`` outside (0, 1].
    """

    def __init__(self, n_arms: int, dim: int, *, alpha: float = 1.0, decay: float = 1.0):
        if n_arms < 1 or dim < 1 or alpha < 0 or not 0 < decay <= 1:
            raise ValueError(f"need n_arms >= 1, dim >= 1, alpha >= 0, 0 < decay <= 1; "
                             f"got {n_arms}, {dim}, {alpha}, {decay}")
        self.n_arms, self.dim, self.alpha, self.decay = int(n_arms), int(dim), float(alpha), float(decay)
        self.A = np.tile(np.eye(dim), (n_arms, 1, 1))  # (K, d, d)
        self.b = np.zeros((n_arms, dim))  # (K, d)
        self._refresh()

    def _refresh(self) -> None:
        self.A_inv = np.linalg.inv(self.A)  # (K, d, d)
        self.theta = np.einsum("kij,kj->ki", self.A_inv, self.b)  # (K, d)

    def scores(self, X: np.ndarray, *, greedy: bool = False) -> np.ndarray:
        """``B x K`` scores for contexts ``X`` (``B x d``): means, plus the confidence width
        unless ``greedy``.

        Raises:
            ValueError: ``X`` not ``B x d``.
        """
        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or X.shape[1] != self.dim:
            raise ValueError(f"contexts must be B x {self.dim}, got shape {X.shape}")
        mean = X @ self.theta.T  # (B, K)
        if greedy or self.alpha == 0:
            return mean
        var = np.einsum("bi,kij,bj->bk", X, self.A_inv, X)  # (B, K)
        return mean + self.alpha * np.sqrt(np.maximum(var, 0.0))

    def select(self, X: np.ndarray, *, greedy: bool = False, offset: np.ndarray | None = None) -> np.ndarray:
        """One arm per context row of ``X`` (``B x d``) -> ``B`` int array (ties: highest arm).

        ``offset`` (``K`` or ``B x K``) is added to the scores: ``-price * cost_a`` turns the
        choice into the Lagrangian ``argmax_a (score_a - price * cost_a)`` of a cost budget."""
        s = self.scores(X, greedy=greedy)
        if offset is not None:
            s = s + np.broadcast_to(np.asarray(offset, float), s.shape)
        s = s[:, ::-1]  # (B, K), reversed: argmax picks the last max
        return self.n_arms - 1 - s.argmax(axis=1)

    def update(self, X: np.ndarray, arms: np.ndarray, rewards: np.ndarray | float) -> None:
        """Add observations: contexts ``X`` (``B x d``), played ``arms`` (``B``), ``rewards``
        (``B`` or a scalar for all)."""
        X = np.asarray(X, dtype=float)
        arms = np.asarray(arms, dtype=int)
        r = np.broadcast_to(np.asarray(rewards, dtype=float), arms.shape)
        onehot = np.zeros((len(arms), self.n_arms))  # (B, K)
        onehot[np.arange(len(arms)), arms] = 1.0
        if self.decay < 1:
            eye = np.eye(self.dim)
            self.A = self.decay * (self.A - eye) + eye
            self.b *= self.decay
        self.A += np.einsum("bk,bi,bj->kij", onehot, X, X)
        self.b += np.einsum("bk,b,bi->ki", onehot, r, X)
        self._refresh()

    def state_dict(self) -> dict[str, Any]:
        return {"A": _t(self.A), "b": _t(self.b), "alpha": self.alpha, "decay": self.decay}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.A = state["A"].numpy().copy()
        self.b = state["b"].numpy().copy()
        self.alpha, self.decay = float(state["alpha"]), float(state["decay"])
        self._refresh()


class CombinatorialTS:
    """``n_rows`` independent combinatorial Thompson samplers over ``n_arms`` Bernoulli base arms.

    Each base arm has a ``Beta(1 + successes, 1 + failures)`` posterior. A play samples every
    posterior and takes the ``k`` arms with the largest samples (semi-bandit feedback: each played
    arm then gets its own success / failure).

    Args:
        n_arms: base arms per row (>= 1).
        n_rows: independent samplers (>= 1).
        seed: seed of the sampler's ``numpy.random.Generator``.
        decay: factor in (0, 1] applied to the success and failure counts at each
            :meth:`update` (1 = stationary; < 1 forgets).

    Raises:
        ValueError: ``n_arms < 1``, ``n_rows < 1`` or ``decay`` outside (0, 1].
    """

    def __init__(self, n_arms: int, *, n_rows: int = 1, seed: int = 0, decay: float = 1.0):
        if n_arms < 1 or n_rows < 1 or not 0 < decay <= 1:
            raise ValueError(f"need n_arms >= 1, n_rows >= 1, 0 < decay <= 1; got {n_arms}, {n_rows}, {decay}")
        self.n_arms, self.n_rows, self.decay = int(n_arms), int(n_rows), float(decay)
        self.alpha = np.ones((n_rows, n_arms))  # 1 + successes
        self.beta = np.ones((n_rows, n_arms))  # 1 + failures
        self.rng = np.random.default_rng(seed)

    def posterior_mean(self) -> np.ndarray:
        """``n_rows x n_arms`` posterior means ``alpha / (alpha + beta)``."""
        return self.alpha / (self.alpha + self.beta)

    def select(self, rows: np.ndarray | None, k: np.ndarray | int, *, greedy: bool = False) -> np.ndarray:
        """Top-``k`` arms per requested row.

        Args:
            rows: row indices (``R``,), ``None`` = all rows.
            k: arms to play per row: an int or an ``R`` array, each in ``0..n_arms``.
            greedy: rank by posterior mean instead of a posterior sample (ties: lower index).

        Returns:
            ``R x n_arms`` boolean mask of the chosen arms (row ``i`` has ``k[i]`` Trues).

        Raises:
            ValueError: a ``k`` outside ``0..n_arms``.
        """
        rows = np.arange(self.n_rows) if rows is None else np.asarray(rows, dtype=int)
        k = np.broadcast_to(np.asarray(k, dtype=int), rows.shape)
        if (k < 0).any() or (k > self.n_arms).any():
            raise ValueError(f"k must be in [0, {self.n_arms}], got {k.tolist()}")
        a, b = self.alpha[rows], self.beta[rows]  # (R, n)
        theta = a / (a + b) if greedy else self.rng.beta(a, b)  # (R, n)
        order = np.argsort(-theta, axis=1, kind="stable")  # (R, n) best first
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(self.n_arms)[None, :].repeat(len(rows), 0), axis=1)
        return rank < k[:, None]  # (R, n)

    def update(self, rows: np.ndarray, chosen: np.ndarray, success: np.ndarray | bool) -> None:
        """Feedback for played arms: ``chosen`` ``R x n_arms`` mask from :meth:`select`,
        ``success`` a bool per row (``R``) or one bool for all."""
        rows = np.asarray(rows, dtype=int)
        chosen = np.asarray(chosen, dtype=float)
        s = np.broadcast_to(np.asarray(success, dtype=float), rows.shape)[:, None]  # (R, 1)
        if self.decay < 1:
            self.alpha = 1.0 + self.decay * (self.alpha - 1.0)
            self.beta = 1.0 + self.decay * (self.beta - 1.0)
        np.add.at(self.alpha, rows, chosen * s)
        np.add.at(self.beta, rows, chosen * (1.0 - s))

    def state_dict(self) -> dict[str, Any]:
        return {"alpha": _t(self.alpha), "beta": _t(self.beta), "decay": self.decay,
                "rng": json.dumps(self.rng.bit_generator.state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alpha = state["alpha"].numpy().copy()
        self.beta = state["beta"].numpy().copy()
        self.decay = float(state["decay"])
        self.rng.bit_generator.state = json.loads(state["rng"])
