"""A cascade's stop rule that keeps learning on unlabeled traffic (issue 64): the FLOPs budget
held by a dual variable, the rule refitted from explored rows.

DHT's stop rule (:class:`~archsearch.dynamic.depth.stopping.LinearStopping`) is fitted and
calibrated to a FLOPs budget once, label-free, on the training domain's validation rows. On
other traffic its confidences move, and with them the executed FLOPs: a rule calibrated to
0.5x on Rotten Tomatoes ran 0.543x on New York Times editorials. :class:`OnlineStopping` wraps
the fitted rule and, batch by batch, on the stream itself (labels are never read):

* **Budget** -- dual ascent on the rule's threshold offset (``rule.offset``: a row stops at exit
  ``k`` when its score exceeds ``cut[k] + offset``; a higher offset stops fewer rows, so the
  executed fraction rises with it): after each batch, ``offset -= step * (f - budget) / g``,
  ``f`` the batch's executed FLOPs fraction and ``g`` the fraction's sensitivity to the offset
  measured on the calibration rows (:func:`offset_sensitivity`), so one step corrects about
  ``step`` of the miss whatever the score's scale. This is the Lagrangian dual of "maximise
  agreement subject to mean cost <= budget" updated by (sub)gradient steps on the constraint's
  violation (Boyd & Vandenberghe, "Convex Optimization", 2004, §5; the online form: Mahdavi,
  Jin & Yang, "Trading regret for efficiency: online convex optimization with long term
  constraints", JMLR 13, 2012).
* **Bandit feedback** -- stopping at exit ``k`` hides what deeper exits would have said, so a
  share :attr:`explore` of rows (drawn per row from a seeded generator) runs to the last exit
  whatever the rule says; for those rows every exit's label-free quality is known (1 when its
  class is the last exit's, the quality DHT's rule is fitted with, ``dht_stop_quality: match``),
  and they join the rule's window (which starts as the calibration rows). Every
  :attr:`refit_every` explored rows the rule is refitted at its price by backward induction
  (:meth:`LinearStopping.fit`) and the offset kept (the dual steps correct what the refit moves).
  This is epsilon-greedy exploration over stop/continue arms with full-information rounds
  (CeeBERT, Zhang et al., Findings of ACL 2024, learns exit thresholds online from unlabeled
  traffic by UCB; here the explored rows feed the project's own least-squares rule).

The rule's decisions read :attr:`LinearStopping.offset`, so a gating that holds the same rule
object (DHT's ``stopping``) decides with the adapted offset. :meth:`observe` and the decisions
hold a lock: one replica's concurrent batches update it one at a time. The state
(:meth:`state_dict`) holds the rule's, the counters and the generator's: a restart resumes it.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from archsearch.dynamic.depth.stopping import LinearStopping


def executed_fraction(exits: np.ndarray, costs: np.ndarray) -> float:
    """Executed FLOPs of rows leaving at ``exits`` (``n`` ints) over the full model's, ``costs``
    ``n x K`` (each row's FLOPs at each exit, any unit); 0 for no rows."""
    costs = np.asarray(costs, dtype=float)
    if not len(costs):
        return 0.0
    return float(costs[np.arange(len(costs)), np.asarray(exits)].sum() / costs[:, -1].sum())


def offset_sensitivity(rule: LinearStopping, Xs: np.ndarray, costs: np.ndarray, price: float,
                       rel_step: float = 0.05) -> float:
    """How fast the executed fraction on calibration rows (contexts ``Xs`` ``n x K x d``,
    ``costs`` ``n x K``) rises with ``rule.offset``: a central difference of half-width
    ``rel_step`` times the spread (90th - 10th percentile) of the rule's first-exit scores,
    widened until the fraction moves; ``rule.offset`` is left as it was. Returns a positive
    slope (fraction per unit of offset).

    Raises:
        ValueError: no rows.
    """
    Xs, costs = np.asarray(Xs, dtype=float), np.asarray(costs, dtype=float)
    if not len(Xs):
        raise ValueError("offset_sensitivity needs calibration rows")
    base = rule.offset
    scores = rule.score(0, Xs[:, 0], costs, price)
    spread = float(np.quantile(scores, 0.9) - np.quantile(scores, 0.1)) or 1.0
    d = rel_step * spread
    try:
        for _ in range(8):
            rule.offset = base + d
            hi = executed_fraction(rule.route(Xs, costs, price), costs)
            rule.offset = base - d
            lo = executed_fraction(rule.route(Xs, costs, price), costs)
            if hi > lo:
                return (hi - lo) / (2 * d)
            d *= 2
    finally:
        rule.offset = base
    return 1.0 / spread


class OnlineStopping:
    """A fitted stop rule adapted online on unlabeled rows (module docstring).

    Args:
        rule: the fitted, calibrated rule (its ``offset`` is the dual variable; modified in place).
        price: the price it was calibrated at (per unit of cost; refits use it).
        budget: the executed FLOPs fraction to hold.
        sensitivity: :func:`offset_sensitivity` on the calibration rows (> 0).
        step: the dual step, as a share of the miss corrected per batch (default 0.5).
        explore: share of rows run to the last exit (default 0.05; 0 switches learning off).
        refit_every: explored rows between refits (default 64); ``refit=False``: never refit
            (a rule with nothing to fit, e.g. one confidence threshold).
        seed: the exploration draws' generator seed.

    Raises:
        ValueError: a budget outside (0, 1], a non-positive sensitivity, an exploration share
            outside [0, 1).
    """

    def __init__(self, rule: LinearStopping, *, price: float, budget: float, sensitivity: float,
                 step: float = 0.5, explore: float = 0.05, refit_every: int = 64, refit: bool = True,
                 seed: int = 0):
        if not 0 < budget <= 1:
            raise ValueError(f"budget must be in (0, 1], got {budget}")
        if not sensitivity > 0:
            raise ValueError(f"sensitivity must be > 0, got {sensitivity}")
        if not 0 <= explore < 1:
            raise ValueError(f"explore must be in [0, 1), got {explore}")
        self.rule, self.price, self.budget = rule, float(price), float(budget)
        self.sensitivity, self.step, self.explore = float(sensitivity), float(step), float(explore)
        self.refit_every, self.refit = int(refit_every), bool(refit)
        self.rng = np.random.default_rng(seed)
        self.rows = self.explored = self.pending = self.refits = 0
        self.executed = self.full = 0.0
        self.lock = threading.RLock()

    # ------------------------------------------------------------------ decisions
    def explore_mask(self, n: int) -> np.ndarray:
        """``n`` bools: which of ``n`` arriving rows run to the last exit (drawn in arrival order)."""
        with self.lock:
            return self.rng.random(n) < self.explore

    def stop(self, k: int, X, costs) -> Any:
        """The rule's decisions at exit ``k`` with the current offset
        (:meth:`LinearStopping.stop` at :attr:`price`): ``B`` bools for contexts ``X`` ``B x d``."""
        return self.rule.stop(k, X, costs, self.price)

    def route(self, Xs: np.ndarray, costs: np.ndarray, explored: np.ndarray) -> np.ndarray:
        """Exit indices (``n`` ints) of rows with per-exit contexts ``Xs`` (``n x K x d``) and
        costs ``n x K``: the first exit the rule stops at, the last for explored rows."""
        exits = self.rule.route(Xs, costs, self.price)
        return np.where(np.asarray(explored, dtype=bool), self.rule.n_exits - 1, exits)

    # ------------------------------------------------------------------ learning
    def observe(self, exits: np.ndarray, costs: np.ndarray, explored: np.ndarray | None = None,
                Xs: np.ndarray | None = None, classes: np.ndarray | None = None) -> None:
        """What a batch ran: one dual step on the offset, and the explored rows' feedback.

        Args:
            exits: ``n`` exit indices the rows left at.
            costs: ``n x K`` each row's FLOPs at each exit.
            explored: ``n`` bools (rows run to the last exit for feedback); ``None``: none.
            Xs: ``n x K x d`` contexts (read for explored rows only).
            classes: ``n x K`` each exit's predicted class (read for explored rows only; never
                a label).
        """
        exits, costs = np.asarray(exits), np.asarray(costs, dtype=float)
        if not len(exits):
            return
        with self.lock:
            f = executed_fraction(exits, costs)
            self.rule.offset -= self.step * (f - self.budget) / self.sensitivity
            self.rows += len(exits)
            self.executed += float(costs[np.arange(len(costs)), exits].sum())
            self.full += float(costs[:, -1].sum())
            e = np.zeros(len(exits), dtype=bool) if explored is None else np.asarray(explored, dtype=bool)
            if not e.any() or Xs is None or classes is None:
                return
            cls = np.asarray(classes)[e]
            q = (cls == cls[:, -1:]).astype(float)  # (m, K): agreement with the last exit
            self.explored += int(e.sum())
            if not self.refit:
                return
            self.rule._remember(np.asarray(Xs, dtype=float)[e], q, costs[e])
            self.pending += int(e.sum())
            if self.pending >= self.refit_every:
                offset = self.rule.offset
                self.rule.fit(self.price)  # (resets the offset: the dual variable carries on)
                self.rule.offset = offset
                self.pending, self.refits = 0, self.refits + 1

    def play(self, Xs: np.ndarray, classes: np.ndarray, costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One batch offline (stored exits): draw the explored rows, route, observe. Returns
        ``(exits, explored)``."""
        explored = self.explore_mask(len(Xs))
        exits = self.route(Xs, costs, explored)
        self.observe(exits, costs, explored, Xs, classes)
        return exits, explored

    @property
    def fraction(self) -> float:
        """Executed FLOPs fraction over every row observed (0 before any)."""
        return self.executed / self.full if self.full else 0.0

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The rule's state, the counters and the exploration generator's state (JSON-able
        besides the rule's tensors)."""
        with self.lock:
            return {"rule": self.rule.state_dict(), "price": self.price, "budget": self.budget,
                    "sensitivity": self.sensitivity, "step": self.step, "explore": self.explore,
                    "refit_every": self.refit_every, "refit": self.refit,
                    "counters": {"rows": self.rows, "explored": self.explored, "pending": self.pending,
                                 "refits": self.refits, "executed": self.executed, "full": self.full},
                    "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Raises:
            ValueError: the rule's shapes differ, or the state was saved under another budget or
                another mode (exploration share, refits) than this adapter's.
        """
        if (float(state["budget"]), float(state["explore"]), bool(state["refit"])) != (
                self.budget, self.explore, self.refit):
            raise ValueError(f"state saved with budget {state['budget']}, explore {state['explore']}, refit "
                             f"{state['refit']}; this adapter has {self.budget}, {self.explore}, {self.refit}")
        with self.lock:
            self.rule.load_state_dict(state["rule"])
            self.price, self.budget = float(state["price"]), float(state["budget"])
            self.sensitivity, self.step = float(state["sensitivity"]), float(state["step"])
            self.explore, self.refit_every = float(state["explore"]), int(state["refit_every"])
            self.refit = bool(state["refit"])
            c = state["counters"]
            self.rows, self.explored, self.pending = int(c["rows"]), int(c["explored"]), int(c["pending"])
            self.refits, self.executed, self.full = int(c["refits"]), float(c["executed"]), float(c["full"])
            self.rng.bit_generator.state = state["rng"]
