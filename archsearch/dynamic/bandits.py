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
* :class:`LinearStopping` -- per-exit stop/continue decisions of a cascade of exits, learnt by
  least-squares regression with backward induction (Longstaff & Schwartz 2001, "Valuing American
  Options by Simulation: A Simple Least-Squares Approach", Review of Financial Studies 14(1),
  §1-2), priced through ``offset``-style costs as below.
* :class:`DualPrice` -- the Lagrange multiplier of an average-cost constraint, updated by
  projected dual (sub)gradient ascent (Boyd & Vandenberghe, "Convex Optimization", 2004, §5.5 /
  Boyd's subgradient-methods notes, §6); bandits with a budget then play
  ``argmax_a (score_a - price * cost_a)`` through the ``offset`` argument of ``select``
  (the Lagrangian relaxation of bandits with knapsacks: Badanidiyuru, Kleinberg & Slivkins 2013,
  "Bandits with Knapsacks", FOCS, §1; Agrawal & Devanur 2014, "Bandits with concave rewards and
  convex knapsacks", EC).

All randomness comes from a ``numpy.random.Generator`` seeded at construction; the same seed and
the same calls give the same choices. ``state_dict()`` holds tensors, numbers and strings only
(loadable with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

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


class LinearStopping:
    """When to stop in a cascade of ``K`` exits: per exit ``k < K - 1`` a ridge regression over
    the context ``x_k`` seen there with three targets:

    * ``s_k(x)`` ~ ``E[q_k | x]``, the quality of stopping at exit ``k``;
    * ``v_k(x)`` ~ ``E[q_tau | x]`` and ``w_k(x)`` ~ ``E[c_tau | x]``: the quality and the cost
      of the exit ``tau > k`` the policy stops at if it continues.

    Decision at exit ``k`` under a price: stop iff ``s_k(x) - price * c_k > v_k(x) - price *
    w_k(x)`` (ties continue: when unsure, compute more; ``w_k`` is clipped into
    ``[c_{k+1}, c_{K-1}]`` so that a higher price never stops fewer samples); the last exit
    always stops, and before the first fit no other exit does.

    With ``rule="tuned"`` the predicted advantage ``a_k(x) = (s_k - price * c_k) - (v_k -
    price * w_k)`` only *ranks* the samples: exit ``k`` stops iff ``a_k(x) > t_k``, with the
    threshold ``t_k`` chosen on the fitting rows to maximise the value the policy realises there
    (quality minus price times cost, continuation realised from ``k + 1`` on), an exact search
    over the sorted advantages. A linear model of the qualities is mis-specified (e.g. an exit's
    accuracy is not linear in its max probability), and its zero crossing can sit far from the
    best cut even when its ranking is good; the tuned cut is never worse on the fitting rows
    than the regression's own (``t_k = 0``), which is one of the candidates. ``rule=
    "regression"`` (default): ``t_k = 0``. ``rule="confidence"``: the score is one feature of
    the context, ``x[score_col]`` (e.g. the exit's max probability), with a threshold per exit
    tuned the same way (ties: the highest, i.e. compute more) -- a confidence-threshold exit
    (DeeBERT, Xin et al. 2020, ACL, §2) with its thresholds fitted per exit and per price by
    backward induction; one threshold shared by every exit is a member of this class.

    The models are fitted (:meth:`fit`) by backward induction over a sliding window of the
    last ``window`` samples whose every exit was observed (full information: the all-exits
    training runs the deepest path for every sample): from the last exit down, the
    continuation targets of exit ``k`` are the quality and cost the policy *realises* from
    ``k + 1`` on (not its estimates), and ``tau`` then moves to ``k`` for the samples the
    refitted model stops there. This is least-squares Monte Carlo for optimal stopping
    (Longstaff & Schwartz 2001, "Valuing American Options by Simulation: A Simple
    Least-Squares Approach", Review of Financial Studies 14(1), §1-2). The policy depends on
    the price, so every fit is *at* a price: training refits at the training price after each
    batch (:meth:`update`), and a budget calibration refits at every price it tries, so the
    continuation targets always come from the policy that will be played. The stop signal is
    the exit's own confidence among other features, as a learnt early-exit policy (BERxiT,
    Xin et al. 2021, EACL, §3.2) would read it.

    Args:
        n_exits: ``K`` (>= 1).
        dim: context dimension ``d`` (>= 1; include a constant feature for an intercept).
        window: samples kept for fitting (>= 1); older ones are dropped (the exits keep
            training, so old qualities go stale).
        ridge: L2 penalty (> 0) of every regression.
        rule: ``"regression"`` (stop iff the predicted advantage is positive), ``"tuned"``
            (the threshold on it fitted by direct search) or ``"confidence"`` (a fitted
            threshold on ``x[score_col]``); see above.
        score_col: the context column ``rule="confidence"`` thresholds.

    Raises:
        ValueError: ``n_exits < 1``, ``dim < 1``, ``window < 1``, ``ridge <= 0``, an unknown
            ``rule``, or ``rule="confidence"`` without a ``score_col`` in ``[0, dim)``.
    """

    RULES = ("regression", "tuned", "confidence")

    def __init__(self, n_exits: int, dim: int, *, window: int = 2048, ridge: float = 1.0,
                 rule: str = "regression", score_col: int | None = None):
        if n_exits < 1 or dim < 1 or window < 1 or not ridge > 0:
            raise ValueError(f"need n_exits >= 1, dim >= 1, window >= 1, ridge > 0; "
                             f"got {n_exits}, {dim}, {window}, {ridge}")
        if rule not in self.RULES:
            raise ValueError(f"rule must be one of {list(self.RULES)}, got {rule!r}")
        if rule == "confidence" and not (score_col is not None and 0 <= score_col < dim):
            raise ValueError(f"rule 'confidence' needs score_col in [0, {dim}), got {score_col}")
        self.score_col = score_col
        self.n_exits, self.dim, self.window, self.ridge = int(n_exits), int(dim), int(window), float(ridge)
        self.rule = rule
        self.theta = np.zeros((max(self.n_exits - 1, 0), 3, self.dim))  # (K-1, 3, d): s, v, w
        self.cut = np.zeros(max(self.n_exits - 1, 0))  # (K-1,) thresholds t_k on the advantage
        #: added to every threshold (0 after each fit): a budget calibration's last knob, since
        #: the exits reached are monotone in it while refits at nearby prices can jump
        self.offset = 0.0
        self.Xs = np.zeros((0, self.n_exits, self.dim))  # (N, K, d) window contexts
        self.q = np.zeros((0, self.n_exits))  # (N, K) qualities
        self.c = np.zeros((0, self.n_exits))  # (N, K) costs (they depend on each batch's length)
        self.price: float | None = None  # the price of the last fit
        self.updates = 0

    def stop(self, k: int, X: np.ndarray, costs: np.ndarray, price: float) -> np.ndarray:
        """``B`` bools: stop at exit ``k`` for contexts ``X`` (``B x d``); ``costs``: the ``K``
        exits' costs (e.g. FLOPs fractions; or ``B x K``), ``price`` per unit of cost."""
        X = np.asarray(X, dtype=float)
        if k >= self.n_exits - 1:
            return np.ones(len(X), dtype=bool)
        if self.price is None:  # never fitted: no evidence, compute everything
            return np.zeros(len(X), dtype=bool)
        return self.score(k, X, costs, price) > self.cut[k] + self.offset

    def score(self, k: int, X: np.ndarray, costs: np.ndarray, price: float) -> np.ndarray:
        """``B`` scores the threshold of exit ``k`` applies to: ``x[score_col]`` for ``rule=
        "confidence"``, else :meth:`advantage`."""
        if self.rule == "confidence":
            return np.asarray(X, dtype=float)[:, self.score_col]
        return self.advantage(k, X, costs, price)

    def advantage(self, k: int, X: np.ndarray, costs: np.ndarray, price: float) -> np.ndarray:
        """``B`` predicted advantages of stopping at exit ``k < K - 1`` over continuing, in
        quality units: ``(s_k - price * c_k) - (v_k - price * w_k)`` (see :meth:`stop`)."""
        X = np.asarray(X, dtype=float)
        costs = np.asarray(costs, dtype=float)
        ck = costs[..., k]
        m = X @ self.theta[k].T  # (B, 3): stop quality, continuation quality / cost
        w = np.clip(m[:, 2], costs[..., k + 1], costs[..., -1])
        return (m[:, 0] - price * ck) - (m[:, 1] - price * w)

    @staticmethod
    def best_cut(adv: np.ndarray, gain: np.ndarray, keep_zero: bool = True) -> float:
        """The threshold ``t`` maximising ``sum(gain[adv > t])``, exactly: every cut between two
        distinct sorted scores is tried, plus one just above the highest score (no sample
        stops) and one just below the lowest (all stop); of equal sums the one that stops
        fewest. Those two are finite (the next float past the extreme score), so that the
        budget calibration's offset (:attr:`offset`) can still move them. With ``keep_zero``: 0
        (the regression's own cut) unless some cut does strictly better. ``adv``, ``gain``:
        ``N`` floats."""
        a = np.sort(adv)[::-1]
        value = np.concatenate([[0.0], np.cumsum(gain[np.argsort(-adv, kind="stable")])])  # top m stop
        cuts = np.concatenate([[np.nextafter(a[0], np.inf)], (a[:-1] + a[1:]) / 2,
                               [np.nextafter(a[-1], -np.inf)]])  # (N+1,) cut of each m
        valid = np.concatenate([[True], a[:-1] > a[1:], [True]])  # tied advantages stop together
        m = int(np.flatnonzero(valid)[np.argmax(value[valid])])
        if keep_zero and value[m] <= float(np.sum(gain[adv > 0])) + 1e-12:
            return 0.0
        return float(cuts[m])

    def route(self, Xs: np.ndarray, costs: np.ndarray, price: float) -> np.ndarray:
        """``B`` exit indices: the first exit whose :meth:`stop` says stop, for per-exit
        contexts ``Xs`` (``B x K x d``) -- what running the cascade exit by exit would give."""
        Xs = np.asarray(Xs, dtype=float)
        out = np.full(len(Xs), self.n_exits - 1)
        open_ = np.ones(len(Xs), dtype=bool)
        for k in range(self.n_exits - 1):
            s = open_ & self.stop(k, Xs[:, k], costs, price)
            out[s] = k
            open_ &= ~s
        return out

    def fit(self, price: float, data: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        """Backward induction at ``price`` (see the class docstring) over the window, or over
        ``data`` = ``(Xs, q, c)`` (``N x K x d``, ``N x K``, ``N x K``) instead (e.g. held-out
        rows; the window is kept)."""
        Xs, q, c = (self.Xs, self.q, self.c) if data is None else (np.asarray(a, dtype=float) for a in data)
        if not len(q):
            return
        self.price = float(price)
        self.offset = 0.0
        vq, vc = q[:, -1].copy(), c[:, -1].copy()  # realised quality / cost from k + 1 on
        eye = self.ridge * np.eye(self.dim)
        for k in range(self.n_exits - 2, -1, -1):
            X = Xs[:, k]  # (N, d)
            Y = np.stack([q[:, k], vq, vc], 1)  # (N, 3)
            self.theta[k] = np.linalg.solve(X.T @ X + eye, X.T @ Y).T  # (3, d)
            if self.rule != "regression":
                gain = (q[:, k] - price * c[:, k]) - (vq - price * vc)  # (N,) realised
                self.cut[k] = self.best_cut(self.score(k, X, c, price), gain,
                                            keep_zero=self.rule == "tuned")
            s = self.stop(k, X, c, price)
            vq = np.where(s, q[:, k], vq)
            vc = np.where(s, c[:, k], vc)

    def calibrate_offset(self, fraction: Callable[[], float], budget: float, frac: float) -> float:
        """A budget calibration's last step: refits at nearby prices can make the cost fraction
        jump over the budget (per-exit thresholds flip together), so with the policy of the
        calibrated price fixed, one :attr:`offset` added to every exit's threshold is bisected
        (the exits reached are monotone in it: a higher offset stops fewer samples, so more
        cost). Kept only if it lands closer than ``frac``.

        Args:
            fraction: the cost fraction of the current policy (with the current offset) on the
                calibration rows.
            budget: the target fraction.
            frac: the fraction without an offset.

        Returns:
            The fraction reached (``frac`` when no offset does better; the offset is then 0).
        """
        def at(d: float) -> float:
            self.offset = d
            return fraction()

        hi, lo = 1.0, -1.0
        while at(hi) < budget and hi < 1e6:
            hi *= 4
        while at(lo) > budget and lo > -1e6:
            lo *= 4
        d, f = calibrate_monotone(at, budget, lo, hi, iters=40, decreasing=False)
        if abs(f - budget) < abs(frac - budget):
            self.offset = d
            return f
        self.offset = 0.0
        return frac

    def update(self, Xs: np.ndarray, q: np.ndarray, costs: np.ndarray, price: float) -> None:
        """Add a batch to the window and refit at ``price``: contexts ``Xs`` (``B x K x d``),
        qualities ``q`` (``B x K``, every exit of every sample), the exits' ``costs`` (``K``,
        or ``B x K``)."""
        Xs, q = np.asarray(Xs, dtype=float), np.asarray(q, dtype=float)
        c = np.broadcast_to(np.asarray(costs, dtype=float), q.shape)
        self.Xs = np.concatenate([self.Xs, Xs])[-self.window:]
        self.q = np.concatenate([self.q, q])[-self.window:]
        self.c = np.concatenate([self.c, c])[-self.window:]
        self.fit(price)
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {"theta": _t(self.theta), "cut": _t(self.cut), "offset": self.offset, "Xs": _t(self.Xs.astype(np.float32)), "q": _t(self.q),
                "c": _t(self.c), "price": -1.0 if self.price is None else self.price,
                "updates": self.updates, "window": self.window, "ridge": self.ridge}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Raises ``ValueError`` when the state has another number of exits or context size."""
        theta = state["theta"].numpy()
        if theta.shape != self.theta.shape:
            raise ValueError(f"stopping state for {theta.shape} models, this policy has {self.theta.shape}")
        self.theta = theta.copy()
        self.cut = state["cut"].numpy().copy() if "cut" in state else np.zeros(len(self.theta))
        self.offset = float(state.get("offset", 0.0))
        self.Xs = state["Xs"].numpy().astype(np.float64)
        self.q, self.c = state["q"].numpy().copy(), state["c"].numpy().copy()
        p = float(state["price"])
        self.price = None if p < 0 else p
        self.updates, self.window, self.ridge = int(state["updates"]), int(state["window"]), float(state["ridge"])


class DualPrice:
    """The price of a resource under an average budget, by projected dual ascent.

    After each round that used a (mean) cost fraction ``c``:
    ``price <- max(0, price + lr * (c - budget))``. A policy that plays
    ``argmax_a (quality_a - price * cost_a)`` then meets ``mean(cost) ~= budget`` on average
    when the budget binds; when it does not, the price decays to 0 (no cost is charged).
    Source: dual (sub)gradient ascent on the Lagrangian of ``max E[quality] s.t. E[cost] <=
    budget`` (Boyd & Vandenberghe 2004, §5.5; Badanidiyuru, Kleinberg & Slivkins 2013, §1).

    Args:
        budget: target mean cost (same unit as the costs passed to :meth:`update`, e.g. a
            FLOPs fraction in (0, 1]); ``None`` = no budget, the price stays at ``init``.
        lr: step size ``eta`` (price units per unit of cost excess), > 0.
        init: starting price (>= 0).

    Raises:
        ValueError: ``budget <= 0``, ``lr <= 0`` or ``init < 0``.
    """

    def __init__(self, budget: float | None, *, lr: float = 0.05, init: float = 0.0):
        if budget is not None and not budget > 0:
            raise ValueError(f"budget must be > 0, got {budget}")
        if not lr > 0 or not init >= 0:
            raise ValueError(f"need lr > 0 and init >= 0, got {lr}, {init}")
        self.budget = None if budget is None else float(budget)
        self.lr, self.price = float(lr), float(init)
        self.steps = 0

    def update(self, cost: float) -> float:
        """One ascent step with the round's mean cost; returns the new price (unchanged
        without a budget)."""
        if self.budget is not None:
            self.price = max(0.0, self.price + self.lr * (float(cost) - self.budget))
        self.steps += 1
        return self.price

    def state_dict(self) -> dict[str, Any]:
        return {"budget": -1.0 if self.budget is None else self.budget, "lr": self.lr,
                "price": self.price, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        b = float(state["budget"])
        self.budget = None if b < 0 else b
        self.lr, self.price, self.steps = float(state["lr"]), float(state["price"]), int(state["steps"])


#: Columns of :func:`trajectory_context`.
TRAJECTORY_DIM = 6


def trajectory_context(probs: np.ndarray, prev: tuple | None = None) -> tuple[np.ndarray, tuple]:
    """A cascade's stop context at one exit from that exit's class probabilities and the state
    of the previous exit (``dht_stop_context: trajectory``; DHT's cascade and
    ``benchmarks/stop_policies.py`` both build their contexts here).

    The :data:`TRAJECTORY_DIM` columns: max probability; entropy / log C; whether the exit's
    class equals the previous exit's; whether it also equals the one before (PABEE's patience,
    Zhou et al. 2020, "BERT Loses Patience", NeurIPS, sec. 3); the previous exit's max
    probability; 1. At the first exit (``prev`` ``None``) columns 2-4 are 0.

    Args:
        probs: ``b x C`` class probabilities of the exit (rows sum to 1).
        prev: the state returned at the previous exit, its arrays indexed with the rows of
            ``probs`` (``None`` at the first exit).

    Returns:
        ``(X, state)``: ``X`` ``b x 6`` float64; ``state`` = ``(class, agrees, max probability)``,
        ``b`` arrays each.
    """
    p = np.asarray(probs, dtype=np.float64)
    maxp, cls = p.max(-1), p.argmax(-1)
    ent = -(p * np.log(np.clip(p, 1e-12, None))).sum(-1) / math.log(p.shape[-1])
    agree = np.zeros(len(cls), dtype=bool) if prev is None else cls == prev[0]
    X = np.ones((len(cls), TRAJECTORY_DIM))
    X[:, 0], X[:, 1], X[:, 2] = maxp, ent, agree
    if prev is None:
        X[:, 3] = X[:, 4] = 0.0
    else:
        X[:, 3], X[:, 4] = agree & prev[1], prev[2]
    return X, (cls, agree, maxp)


def calibrate_price(fraction: Callable[[float], float], budget: float, *, iters: int = 40) -> tuple[float, float]:
    """The cost price whose FLOPs fraction is closest to ``budget``: the bracket's top grows
    from 1 by x4 until ``fraction(hi) <= budget`` (at most 1e6), then :func:`calibrate_monotone`
    bisects ``[0, hi]``.

    Args:
        fraction: ``price -> cost fraction`` on the calibration rows, non-increasing in the price.
        budget: the target fraction.
        iters: bisection steps.

    Returns:
        ``(price, fraction(price))``.
    """
    hi = 1.0
    while fraction(hi) > budget and hi < 1e6:
        hi *= 4
    return calibrate_monotone(fraction, budget, 0.0, hi, iters=iters)


def calibrate_monotone(fn, target: float, lo: float, hi: float, *, iters: int = 30,
                       decreasing: bool = True) -> tuple[float, float]:
    """Bisection for a knob ``v`` in ``[lo, hi]`` whose outcome ``fn(v)`` is monotone (e.g. the
    mean FLOPs fraction on validation data as a function of a price or an exit threshold).

    Args:
        fn: ``v -> outcome`` (float), non-increasing in ``v`` if ``decreasing`` else
            non-decreasing. Step functions are fine (discrete exits).
        target: the outcome wanted (e.g. ``flops_budget``).
        lo, hi: bracket of ``v``.
        iters: bisection steps.

    Returns:
        ``(v, fn(v))``: of all evaluated points, the one whose outcome is closest to ``target``
        (ties: the one with the smaller outcome, i.e. under budget).
    """
    best = None
    for _ in range(iters + 2):
        if best is None:
            cand = [lo, hi]
        else:
            cand = [(lo + hi) / 2]
        for v in cand:
            out = float(fn(v))
            key = (abs(out - target), out)
            if best is None or key < best[0]:
                best = (key, v, out)
            if best[0][0] == 0:
                return best[1], best[2]
        if len(cand) == 1:
            v = cand[0]
            above = out > target
            if above == decreasing:  # outcome too large: move towards the side that lowers it
                lo = v
            else:
                hi = v
    return best[1], best[2]


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
