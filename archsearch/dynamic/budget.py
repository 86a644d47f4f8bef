"""Meeting a FLOPs budget: a price on cost by dual ascent in training, and calibration to the
budget on validation data before an evaluation.

* :class:`DualPrice` -- the Lagrange multiplier of an average-cost constraint, updated by
  projected dual (sub)gradient ascent (Boyd & Vandenberghe, "Convex Optimization", 2004, §5.5 /
  Boyd's subgradient-methods notes, §6); a policy then plays ``argmax_a (score_a - price *
  cost_a)`` (the Lagrangian relaxation of bandits with knapsacks: Badanidiyuru, Kleinberg &
  Slivkins 2013, "Bandits with Knapsacks", FOCS, §1; Agrawal & Devanur 2014, EC).
* :func:`calibrate_price` / :func:`calibrate_monotone` -- bisection of a price or threshold so
  that the policy's FLOPs fraction on calibration rows lands on the budget.
"""

from __future__ import annotations

from typing import Any, Callable


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
