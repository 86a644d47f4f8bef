"""When to stop in a cascade of exits: an optimal-stopping regression (the same decision learnt
as a contextual bandit is :mod:`archsearch.dynamic.depth.stop_bandit`).

* :class:`LinearStopping` -- per-exit stop/continue decisions of a cascade of exits, learnt by
  least-squares regression with backward induction (Longstaff & Schwartz 2001, "Valuing American
  Options by Simulation: A Simple Least-Squares Approach", Review of Financial Studies 14(1),
  §1-2), charged ``price * cost`` per exit (the price of :mod:`archsearch.dynamic.budget`).
* :func:`trajectory_context` -- the stop context built from an exit's probabilities and the
  previous exits' (PABEE's patience signal).

State dicts hold tensors, numbers and strings only (``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch

from archsearch.dynamic.bandits import _t
from archsearch.dynamic.budget import calibrate_monotone


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
                 rule: str = "regression", score_col: int | None = None, refit_every: int = 1):
        if n_exits < 1 or dim < 1 or window < 1 or not ridge > 0:
            raise ValueError(f"need n_exits >= 1, dim >= 1, window >= 1, ridge > 0; "
                             f"got {n_exits}, {dim}, {window}, {ridge}")
        if rule not in self.RULES:
            raise ValueError(f"rule must be one of {list(self.RULES)}, got {rule!r}")
        if rule == "confidence" and not (score_col is not None and 0 <= score_col < dim):
            raise ValueError(f"rule 'confidence' needs score_col in [0, {dim}), got {score_col}")
        if refit_every < 1:
            raise ValueError(f"refit_every must be >= 1, got {refit_every}")
        self.score_col, self.refit_every = score_col, int(refit_every)
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

    def _theta_on(self, device: torch.device) -> torch.Tensor:
        """The fitted models as a float64 tensor on ``device`` (copied once per fit)."""
        cache = self.__dict__.setdefault("_theta_cache", {})
        if device not in cache:
            cache[device] = torch.as_tensor(self.theta, dtype=torch.float64).to(device)
        return cache[device]

    def stop(self, k: int, X, costs: np.ndarray, price: float):
        """``B`` bools: stop at exit ``k`` for contexts ``X`` (``B x d``); ``costs``: the ``K``
        exits' costs (e.g. FLOPs fractions; or ``B x K``), ``price`` per unit of cost. ``X`` a
        numpy array (numpy out) or a tensor (a bool tensor on its device out, computed there in
        float64 with the same fitted models: the cascade decides on the model's device)."""
        if isinstance(X, torch.Tensor):
            if k >= self.n_exits - 1 or self.price is None:  # the last exit / never fitted
                return torch.full((len(X),), k >= self.n_exits - 1, dtype=torch.bool, device=X.device)
            return self.score(k, X, costs, price) > float(self.cut[k] + self.offset)
        X = np.asarray(X, dtype=float)
        if k >= self.n_exits - 1:
            return np.ones(len(X), dtype=bool)
        if self.price is None:  # never fitted: no evidence, compute everything
            return np.zeros(len(X), dtype=bool)
        return self.score(k, X, costs, price) > self.cut[k] + self.offset

    #: Weight of the confidence column in a regression score: it only orders rows whose
    #: predicted advantages tie (e.g. every exit agrees with the deepest on the fitting rows,
    #: so the fit is flat), the more confident stopping first, so that the budget offset can
    #: still move the cost fraction row by row.
    TIE_BREAK = 1e-6

    def score(self, k: int, X: np.ndarray, costs: np.ndarray, price: float) -> np.ndarray:
        """``B`` scores the threshold of exit ``k`` applies to: ``x[score_col]`` for ``rule=
        "confidence"``, else :meth:`advantage` (+ :data:`TIE_BREAK` x ``x[score_col]``)."""
        X = X.double() if isinstance(X, torch.Tensor) else np.asarray(X, dtype=float)
        if self.rule == "confidence":
            return X[:, self.score_col]
        adv = self.advantage(k, X, costs, price)
        return adv if self.score_col is None else adv + self.TIE_BREAK * X[:, self.score_col]

    def advantage(self, k: int, X: np.ndarray, costs: np.ndarray, price: float) -> np.ndarray:
        """``B`` predicted advantages of stopping at exit ``k < K - 1`` over continuing, in
        quality units: ``(s_k - price * c_k) - (v_k - price * w_k)`` (see :meth:`stop`)."""
        costs = np.asarray(costs, dtype=float)
        if isinstance(X, torch.Tensor):  # on the context's device; costs per exit only (K,)
            theta = self._theta_on(X.device)[k]  # (3, d)
            m = X.double() @ theta.T  # (B, 3)
            w = m[:, 2].clamp(float(costs[k + 1]), float(costs[-1]))
            return (m[:, 0] - price * float(costs[k])) - (m[:, 1] - price * w)
        X = np.asarray(X, dtype=float)
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
        contexts ``Xs`` (``B x K x d``) -- what running the cascade exit by exit would give
        (:func:`archsearch.dynamic.depth.exits.first_stop`, the offline twin of ``run_cascade``)."""
        from archsearch.dynamic.depth.exits import first_stop

        Xs = np.asarray(Xs, dtype=float)
        return first_stop(np.stack([self.stop(k, Xs[:, k], costs, price) for k in range(self.n_exits)], 1))

    def fit(self, price: float, data: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        """Backward induction at ``price`` (see the class docstring) over the window, or over
        ``data`` = ``(Xs, q, c)`` (``N x K x d``, ``N x K``, ``N x K``) instead (e.g. held-out
        rows; the window is kept)."""
        Xs, q, c = (self.Xs, self.q, self.c) if data is None else (np.asarray(a, dtype=float) for a in data)
        if not len(q):
            return
        self.price = float(price)
        self.offset = 0.0
        self.__dict__.pop("_theta_cache", None)  # refitted: the device copies are stale
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
        """Add a batch to the window and refit at ``price`` (every ``refit_every``-th update,
        and always at the first): contexts ``Xs`` (``B x K x d``), qualities ``q`` (``B x K``,
        every exit of every sample), the exits' ``costs`` (``K``, or ``B x K``)."""
        self._remember(Xs, q, costs)
        if self.price is None or self.updates % self.refit_every == 0:
            self.fit(price)
        self.updates += 1

    def _remember(self, Xs, q, costs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Add a batch to the window (the last :attr:`window` rows); returns it as float
        arrays ``(Xs, q, c)``, ``c`` broadcast to ``q``'s shape."""
        Xs, q = np.asarray(Xs, dtype=float), np.asarray(q, dtype=float)
        c = np.broadcast_to(np.asarray(costs, dtype=float), q.shape)
        self.Xs = np.concatenate([self.Xs, Xs])[-self.window:]
        self.q = np.concatenate([self.q, q])[-self.window:]
        self.c = np.concatenate([self.c, c])[-self.window:]
        return Xs, q, c

    def state_dict(self) -> dict[str, Any]:
        return {"theta": _t(self.theta), "cut": _t(self.cut), "offset": self.offset, "Xs": _t(self.Xs.astype(np.float32)), "q": _t(self.q),
                "c": _t(self.c), "price": -1.0 if self.price is None else self.price,
                "updates": self.updates, "window": self.window, "ridge": self.ridge}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.__dict__.pop("_theta_cache", None)
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


#: Columns of :func:`trajectory_context`.
TRAJECTORY_DIM = 6


def _confidence(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(max probability, class, entropy / log C)`` over the last axis of ``probs``
    (``... x C``), float64 (the class int64)."""
    p = probs.double()
    maxp, cls = p.max(-1)
    ent = -(p * p.clamp_min(1e-12).log()).sum(-1) / math.log(p.shape[-1])
    return maxp, cls, ent


def trajectory_context(probs, prev: tuple | None = None) -> tuple:
    """A cascade's stop context at one exit from that exit's class probabilities and the state
    of the previous exit (``dht_stop_context: trajectory``; DHT's cascade and
    ``benchmarks/depth/stop_policies.py`` both build their contexts here).

    The :data:`TRAJECTORY_DIM` columns: max probability; entropy / log C; whether the exit's
    class equals the previous exit's; whether it also equals the one before (PABEE's patience,
    Zhou et al. 2020, "BERT Loses Patience", NeurIPS, sec. 3); the previous exit's max
    probability; 1. At the first exit (``prev`` ``None``) columns 2-4 are 0.

    Args:
        probs: ``b x C`` class probabilities of the exit (rows sum to 1): a numpy array, or a
            tensor (then everything stays on its device: no host synchronisation).
        prev: the state returned at the previous exit, its arrays indexed with the rows of
            ``probs`` (``None`` at the first exit).

    Returns:
        ``(X, state)``: ``X`` ``b x 6`` float64; ``state`` = ``(class, agrees, max probability)``,
        ``b`` arrays each; numpy in, numpy out; tensors in, tensors out.
    """
    if not isinstance(probs, torch.Tensor):
        X, state = trajectory_context(torch.from_numpy(np.asarray(probs, dtype=np.float64)),
                                      None if prev is None else tuple(torch.from_numpy(np.asarray(a)) for a in prev))
        return X.numpy(), tuple(a.numpy() for a in state)
    maxp, cls, ent = _confidence(probs)  # (b,) each
    one = torch.ones_like(maxp)  # (b,) float64
    if prev is None:
        agree, zero = torch.zeros_like(cls, dtype=torch.bool), torch.zeros_like(maxp)
        cols = (maxp, ent, zero, zero, zero, one)
    else:
        agree = cls == prev[0]
        cols = (maxp, ent, agree.double(), (agree & prev[1]).double(), prev[2].double(), one)
    return torch.stack(cols, 1), (cls, agree, maxp)  # X: (b, TRAJECTORY_DIM) in one op


def trajectory_contexts(probs: torch.Tensor) -> torch.Tensor:
    """:func:`trajectory_context` at every exit of the deepest path at once (training reads all
    of them): the same values as chaining it exit by exit, in a few kernels.

    Args:
        probs: ``K x B x C`` class probabilities of the ``K`` exits, shallowest first (a tensor;
            everything stays on its device).

    Returns:
        ``B x K x`` :data:`TRAJECTORY_DIM` float64 contexts.
    """
    maxp, cls, ent = _confidence(probs)  # (K, B) each
    zero = torch.zeros_like(maxp[:1])  # (1, B)
    agree = torch.cat([torch.zeros_like(cls[:1], dtype=torch.bool), cls[1:] == cls[:-1]])  # (K, B)
    both = torch.cat([torch.zeros_like(agree[:1]), agree[1:] & agree[:-1]])  # (K, B)
    prev_max = torch.cat([zero, maxp[:-1]])  # (K, B)
    cols = (maxp, ent, agree.double(), both.double(), prev_max, torch.ones_like(maxp))
    return torch.stack(cols, -1).transpose(0, 1)  # (B, K, TRAJECTORY_DIM)
