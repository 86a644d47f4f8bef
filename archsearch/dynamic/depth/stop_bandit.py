"""A cascade's stop / continue decision learnt as a contextual bandit (``dht_stop_rule: bandit``).

:class:`BanditStopping` keeps :class:`~archsearch.dynamic.depth.stopping.LinearStopping`'s decision
(stop at exit ``k`` iff the predicted value of stopping beats the predicted value of going on)
and its budget machinery (price, offset, routing on the model's device), but learns the models
the way a contextual bandit does: per exit ``k < K - 1`` two arms, **stop** and **continue**,
each a disjoint LinUCB ridge model over the exit's context (Li, Chu, Langford & Schapire 2010,
"A Contextual-Bandit Approach to Personalized News Article Recommendation", WWW, Algorithm 1).
While learning, each row walks the cascade and at every exit plays the arm with the higher
upper confidence bound; it observes **only what it played**: the quality of the exit it stopped
at, and for every exit it went on from, the quality and cost of the exit it finally stopped at
(bandit feedback; no exit beyond the stop is read). At inference the arms are played greedily
(the models' means, no bonus). :class:`LinearStopping` instead reads every exit of every row
(full information) and fits by backward induction; the bandit is the issue-36 ask ("a per-exit
contextual bandit over {stop, continue} learnt with exploration, used greedily"), measured
against it in ``benchmarks/depth/stop_bandit.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from archsearch.dynamic.bandits import _t
from archsearch.dynamic.depth.stopping import LinearStopping


class BanditStopping(LinearStopping):
    """Per-exit {stop, continue} LinUCB bandits of a cascade of ``K`` exits (see the module).

    Arm models at exit ``k < K - 1`` (ridge ``A = ridge * I + sum x x^T``, ``theta = A^-1 b``):
    stop: ``s_k(x)`` ~ the quality ``q_k``; continue: ``v_k(x)``, ``w_k(x)`` ~ the quality and
    cost of the exit ``tau > k`` the row stops at. Optimistic values at ``price``:
    ``s_k(x) - price * c_k + alpha * ||x||_{A_s^-1}`` and ``v_k(x) - price * w_k(x) + alpha *
    ||x||_{A_c^-1}`` (``w_k`` clipped into ``[c_{k+1}, c_{K-1}]``); a row stops where the first
    beats the second (ties continue), and always at the last exit. Rows are played in minibatches
    of ``batch`` (the models are updated after each, as training updates after each step).

    :meth:`fit` forgets and learns from ``data`` (or the window) in ``passes`` shuffled passes at
    ``price``; :meth:`update` (training) learns from one batch online, keeping what was learnt.
    Decisions afterwards (:meth:`stop`, :meth:`route`) are the greedy ones: ``rule`` is
    ``"regression"`` with the arm means as :attr:`theta`.

    Args:
        n_exits: ``K`` (>= 1).
        dim: context dimension ``d`` (>= 1; include a constant feature).
        alpha: exploration scale (>= 0; 0 = greedy while learning too).
        passes: passes over the rows in :meth:`fit` (>= 1).
        batch: rows per bandit update (>= 1).
        seed: seeds the order of the rows in :meth:`fit`.
        window, ridge, score_col: as :class:`LinearStopping`.

    Raises:
        ValueError: as :class:`LinearStopping`, or ``alpha < 0``, ``passes < 1``, ``batch < 1``.
    """

    def __init__(self, n_exits: int, dim: int, *, alpha: float = 1.0, passes: int = 3, batch: int = 32,
                 seed: int = 0, window: int = 2048, ridge: float = 1.0, score_col: int | None = None):
        super().__init__(n_exits, dim, window=window, ridge=ridge, rule="regression", score_col=score_col)
        if alpha < 0 or passes < 1 or batch < 1:
            raise ValueError(f"need alpha >= 0, passes >= 1, batch >= 1; got {alpha}, {passes}, {batch}")
        self.alpha, self.passes, self.batch, self.seed = float(alpha), int(passes), int(batch), int(seed)
        self._reset()

    def _reset(self) -> None:
        k, d = max(self.n_exits - 1, 0), self.dim
        self.A = np.tile(self.ridge * np.eye(d), (k, 2, 1, 1))  # (K-1, 2, d, d): stop, continue
        self.b = np.zeros((k, 3, d))  # (K-1, 3, d): stop quality; continuation quality, cost
        self.plays = np.zeros((k, 2))  # (K-1, 2) times each arm was played (for reports)

    def _models(self) -> tuple[np.ndarray, np.ndarray]:
        """``(theta, A_inv)``: ``(K-1, 3, d)`` arm means and ``(K-1, 2, d, d)`` inverses."""
        A_inv = np.linalg.inv(self.A)
        theta = np.stack([np.einsum("kij,kj->ki", A_inv[:, 0], self.b[:, 0]),
                          np.einsum("kij,kj->ki", A_inv[:, 1], self.b[:, 1]),
                          np.einsum("kij,kj->ki", A_inv[:, 1], self.b[:, 2])], 1)
        return theta, A_inv

    def _learn(self, Xs: np.ndarray, q: np.ndarray, c: np.ndarray, price: float) -> np.ndarray:
        """Play one batch (``B x K x d``, ``B x K``, ``B x K``) optimistically, update the arms
        with what was played; returns the ``B`` exits stopped at."""
        theta, A_inv = self._models()
        B, K = q.shape
        tau = np.full(B, K - 1)
        alive = np.ones(B, dtype=bool)
        for k in range(K - 1):
            x = Xs[:, k]  # (B, d)
            bonus = self.alpha * np.sqrt(np.maximum(np.einsum("bi,aij,bj->ba", x, A_inv[k], x), 0.0))  # (B, 2)
            m = x @ theta[k].T  # (B, 3)
            w = np.clip(m[:, 2], c[:, k + 1], c[:, -1])
            stop = alive & ((m[:, 0] - price * c[:, k] + bonus[:, 0]) > (m[:, 1] - price * w + bonus[:, 1]))
            tau[stop] = k
            alive &= ~stop
        rows = np.arange(B)
        qt, ct = q[rows, tau], c[rows, tau]
        for k in range(K - 1):
            x = Xs[:, k]
            s, go = tau == k, tau > k  # played stop here / played continue here
            self.A[k, 0] += x[s].T @ x[s]
            self.b[k, 0] += x[s].T @ q[s, k]
            self.A[k, 1] += x[go].T @ x[go]
            self.b[k, 1] += x[go].T @ qt[go]
            self.b[k, 2] += x[go].T @ ct[go]
            self.plays[k] += (s.sum(), go.sum())
        return tau

    def _greedy(self, price: float) -> None:
        self.theta = self._models()[0]
        self.cut[:] = 0.0
        self.price, self.offset = float(price), 0.0
        self.__dict__.pop("_theta_cache", None)  # the device copies are stale

    def fit(self, price: float, data: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        """Forget, then learn at ``price`` from ``data`` = ``(Xs, q, c)`` (``N x K x d``,
        ``N x K``, ``N x K``; default: the window) in :attr:`passes` shuffled passes of
        :attr:`batch` rows, each with bandit feedback only (see the class docstring)."""
        Xs, q, c = (self.Xs, self.q, self.c) if data is None else (np.asarray(a, dtype=float) for a in data)
        if not len(q):
            return
        self._reset()
        rng = np.random.default_rng(self.seed)
        for _ in range(self.passes):
            order = rng.permutation(len(q))
            for i in range(0, len(order), self.batch):
                idx = order[i:i + self.batch]
                self._learn(Xs[idx], q[idx], c[idx], price)
        self._greedy(price)

    def update(self, Xs: np.ndarray, q: np.ndarray, costs: np.ndarray, price: float) -> None:
        """Training: add a batch to the window and learn from it online at ``price`` (the arms
        keep everything learnt before); contexts ``Xs`` (``B x K x d``), qualities ``q`` (``B x
        K``; only the exits the bandit plays are read), the exits' ``costs`` (``K`` or ``B x K``)."""
        self._learn(*self._remember(Xs, q, costs), price)
        self._greedy(price)
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "bandit_A": _t(self.A), "bandit_b": _t(self.b),
                "bandit_plays": _t(self.plays), "alpha": self.alpha}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Raises ``ValueError`` when the state has another number of exits or context size,
        or holds no bandit statistics (a :class:`LinearStopping` state)."""
        super().load_state_dict(state)
        if "bandit_A" not in state:
            raise ValueError("stopping state has no bandit statistics (saved with another dht_stop_rule)")
        self.A, self.b = state["bandit_A"].numpy().copy(), state["bandit_b"].numpy().copy()
        self.plays, self.alpha = state["bandit_plays"].numpy().copy(), float(state["alpha"])
