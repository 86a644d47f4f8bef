"""AHTO's learned scheduler: continue or stop a running trial at ASHA's rungs (numpy only).

The AHTO paper's time claim ("less training time at equal quality") is a scheduler's to make:
most of a search's compute goes to trials not worth finishing. :class:`StopPolicy` decides, when
a trial reports at a rung (``grace_period * reduction_factor**k`` epochs, ASHA's milestones:
Li et al., "A System for Massively Parallel Hyperparameter Tuning", MLSys 2020, Alg. 2), whether
it goes on, from 7 dimension-free features (:data:`FEATURES`):

==================  ==========================================================================
``asha``            (value - ASHA's cutoff at this rung) / sd of the rung's recorded values,
                    the cutoff being the ``1 - 1/reduction_factor`` quantile of the values the
                    other trials recorded there (+1 while none did)
``front_gap``       (value - the best value of any other trial that costs no more) / sd of
                    all trials' latest values: how far the trial is from the front at its cost
``final_z``         z-score of the predicted final value against that same front value:
                    a Bayesian linear regression of final on rung value over the trials that
                    finished, its predictive mean and sd (the current value and the sd of all
                    trials' values while fewer than 3 finished)
``log_epoch``       ``log(epoch) / log(max_t)``
``budget_used``     fraction of the search's budget spent (time or trials)
``cost_rank``       fraction of the other trials that cost less (0.5 without costs)
``bias``            1
==================  ==========================================================================

The trial continues iff ``weights . features >= 0`` (features clipped to [-5, 5]). With
``weights = (1, 0, ..., 0)`` (:data:`ASHA_WEIGHTS`) that is exactly Ray's ``ASHAScheduler`` with one
bracket, so a policy starts as ASHA; ``python -m benchmarks.schedulers.schedulers run --stage train`` moves the weights by
parameter-exploring policy gradient (PGPE: Sehnke et al., Neural Networks 2010) across LCBench
training tasks, reward = the area under the log hypervolume-regret curve over training time
(HV-regret reduction weighted by the time it saves), and ships them as package data
(``ahto_scheduler.json``, weights + manifest) that :func:`load_stop_policy` reads.

Costs (``cost``) are a trial's second objective when it is known before training (FLOPs,
parameters; on LCBench the full-budget training time); a trial that is cheaper than every
trial better than it stays on the front even when ASHA would stop it.

Used by :class:`archsearch.tune.scheduler.AHTOScheduler` (Ray Tune ``TrialScheduler``,
``budget.scheduler: ahto``) and :class:`archsearch.search.pruner.AHTOPruner` (Optuna pruner).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np

FEATURES = ("asha", "front_gap", "final_z", "log_epoch", "budget_used", "cost_rank", "bias")
ASHA_WEIGHTS = (1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
CLIP = 5.0
WEIGHTS_FILE = Path(__file__).with_name("ahto_scheduler.json")


def rungs(max_t: int, grace_period: int = 1, reduction_factor: float = 3) -> tuple[float, ...]:
    """ASHA's milestones, as Ray's ``_Bracket`` (one bracket) builds them: ``grace_period *
    reduction_factor**k`` for ``k < int(log(max_t / grace_period) / log(reduction_factor) + 1)``
    (not rounded: a fractional factor gives fractional milestones, as in Ray).
    ``rungs(52, 1, 3) == (1, 3, 9, 27)``.

    Raises:
        ZeroDivisionError, ValueError: ``reduction_factor == 1``, ``grace_period <= 0``
            (:class:`StopPolicy` checks both first and raises ``ValueError``)."""
    n = int(math.log(max_t / grace_period) / math.log(reduction_factor) + 1)
    return tuple(grace_period * reduction_factor ** k for k in range(n))


class StopPolicy:
    """Continue/stop decisions for one search (state: every trial's rung values, latest value
    and cost).

    Args:
        weights: ``(7,)`` in :data:`FEATURES` order (default: the shipped policy).
        max_t: epochs of a full trial.
        grace_period, reduction_factor: ASHA's rungs (:func:`rungs`).
        mode: ``"max"`` or ``"min"``: the direction of the reported value.

    Raises:
        ValueError: ``weights`` not of length 7, ``mode`` not max/min, ``grace_period <= 0``,
            ``reduction_factor <= 1`` (as Ray's ASHA asserts), ``max_t < grace_period``.
    """

    def __init__(self, weights=None, *, max_t: int, grace_period: int = 1, reduction_factor: float = 3,
                 mode: str = "max"):
        w = np.asarray(load_stop_policy()["weights"] if weights is None else weights, dtype=np.float64)
        if w.shape != (len(FEATURES),):
            raise ValueError(f"weights: expected {len(FEATURES)} values ({', '.join(FEATURES)}), got {w.shape}")
        if mode not in ("max", "min"):
            raise ValueError(f"mode: expected 'max' or 'min', got {mode!r}")
        if not grace_period > 0:
            raise ValueError(f"grace_period must be > 0, got {grace_period}")
        if not reduction_factor > 1:
            raise ValueError(f"reduction_factor must be > 1, got {reduction_factor}")
        if max_t < grace_period:
            raise ValueError(f"max_t ({max_t}) < grace_period ({grace_period})")
        self.weights, self.max_t, self.rf = w, int(max_t), float(reduction_factor)
        self.sign = 1.0 if mode == "max" else -1.0
        self.milestones = rungs(max_t, grace_period, reduction_factor)
        self.recorded: dict[float, dict] = {m: {} for m in self.milestones}  # rung -> trial -> value
        self.latest: dict = {}      # trial -> latest value (max form)
        self.cost: dict = {}        # trial -> cost (None: unknown)
        self.final: dict = {}       # trial -> value at max_t (max form)
        self.decisions = 0

    # ------------------------------------------------------------------ state
    def add(self, trial, cost: float | None = None) -> None:
        """Register a trial (its ``cost``: a known second objective, lower is better)."""
        self.cost[trial] = None if cost is None or not math.isfinite(cost) else float(cost)

    def record(self, trial, epoch: float, value: float) -> None:
        """Record a trial's last value without a decision (it ended: completed, or stopped by
        something else); at ``max_t`` it becomes a finished trial's final value."""
        if trial not in self.cost:
            self.add(trial)
        if math.isfinite(value):
            self.latest[trial] = self.sign * float(value)
            if epoch >= self.max_t:
                self.final[trial] = self.latest[trial]

    def state_dict(self) -> dict:
        """JSON-able state: weights, direction, rungs, every trial's values and costs."""
        return {"weights": self.weights.tolist(), "sign": self.sign, "max_t": self.max_t, "rf": self.rf,
                "milestones": list(self.milestones), "recorded": [[m, self.recorded[m]] for m in self.milestones],
                "latest": self.latest, "cost": self.cost, "final": self.final, "decisions": self.decisions}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            ValueError: the state's rungs differ from this policy's (another ``max_t``,
                ``grace_period`` or ``reduction_factor``).
        """
        if [float(m) for m in state["milestones"]] != [float(m) for m in self.milestones]:
            raise ValueError(f"rungs {state['milestones']} in the state, {list(self.milestones)} here")
        self.weights = np.asarray(state["weights"], dtype=np.float64)
        self.sign = float(state["sign"])
        self.recorded = {m: dict(v) for m, (_, v) in zip(self.milestones, state["recorded"])}
        self.latest, self.cost, self.final = dict(state["latest"]), dict(state["cost"]), dict(state["final"])
        self.decisions = int(state["decisions"])

    # ------------------------------------------------------------------ decisions
    def on_result(self, trial, epoch: int, value: float, budget_used: float = 0.0) -> bool:
        """Record ``value`` (the trial's metric after ``epoch`` epochs) and say whether the trial
        continues. Decides only at the first report at or past a rung the trial has not passed
        yet (as Ray's ASHA); ``True`` elsewhere. A non-finite value stops the trial."""
        if trial not in self.cost:
            self.add(trial)
        if not math.isfinite(value):  # (Ray's ASHA lets a NaN trial go on; a NaN trial is lost anyway)
            return False
        v = self.sign * float(value)
        self.latest[trial] = v
        if epoch >= self.max_t:
            self.final[trial] = v
            return True
        rung = next((m for m in reversed(self.milestones) if epoch >= m and trial not in self.recorded[m]), None)
        if rung is None:
            return True
        phi = self.features(trial, rung, v, budget_used)
        self.recorded[rung][trial] = v
        self.decisions += 1
        return bool(self.weights @ phi >= 0.0)

    def features(self, trial, rung: int, v: float, budget_used: float = 0.0) -> np.ndarray:
        """The ``(7,)`` state of ``trial`` reporting ``v`` (max form) at ``rung``: see the module
        docstring (the trial itself is left out of every statistic)."""
        rec = np.fromiter((x for t, x in self.recorded[rung].items() if t != trial), dtype=np.float64)
        if rec.size:
            cutoff = float(np.nanpercentile(rec, (1 - 1 / self.rf) * 100))
            asha = (v - cutoff) / (float(rec.std()) + 1e-9)
        else:
            asha = 1.0
        others = [t for t in self.latest if t != trial]
        vals = np.fromiter((self.latest[t] for t in others), dtype=np.float64, count=len(others))
        spread = float(vals.std()) + 1e-9 if vals.size >= 2 else 1.0
        c = self.cost.get(trial)
        costs = np.fromiter((np.nan if self.cost.get(t) is None else self.cost[t] for t in others),
                            dtype=np.float64, count=len(others))
        if c is not None and vals.size:
            cheaper = costs <= c  # NaN (unknown cost) compares False
            need = float(vals[cheaper].max()) if cheaper.any() else -math.inf
            cost_rank = float(np.mean(costs < c))
        else:
            need = float(vals.max()) if vals.size else -math.inf
            cost_rank = 0.5
        mu, sd = self._predict_final(rung, v, spread)
        if math.isinf(need):
            front_gap = final_z = CLIP
        else:
            front_gap = (v - need) / spread
            final_z = (mu - need) / sd
        phi = np.array([asha, front_gap, final_z, math.log(max(rung, 1)) / math.log(max(self.max_t, 2)),
                        budget_used, cost_rank, 1.0])
        return np.clip(np.nan_to_num(phi, nan=0.0, posinf=CLIP, neginf=-CLIP), -CLIP, CLIP)

    def _predict_final(self, rung: int, v: float, spread: float) -> tuple[float, float]:
        """Predictive mean and sd of the final value of a trial at ``v`` on ``rung``: least
        squares of final on rung value over finished trials (Bayesian linear regression with a
        flat prior: ``sd^2 = s^2 (1 + 1/n + (v - mean)^2 / Sxx)``)."""
        rec = self.recorded[rung]
        pairs = [(rec[t], f) for t, f in self.final.items() if t in rec]
        if len(pairs) < 3:
            return v, spread
        x, y = np.array(pairs).T
        xm, sxx = x.mean(), float(((x - x.mean()) ** 2).sum())
        if sxx <= 1e-12:
            return float(y.mean()), float(y.std()) + 1e-9
        b = float(((x - xm) * (y - y.mean())).sum()) / sxx
        a = float(y.mean()) - b * xm
        res = y - (a + b * x)
        s2 = float((res ** 2).sum()) / max(len(x) - 2, 1)
        sd = math.sqrt(s2 * (1 + 1 / len(x) + (v - xm) ** 2 / sxx)) + 1e-9
        return a + b * v, sd


@functools.lru_cache(maxsize=4)
def _read(path: str) -> dict:
    return json.loads(Path(path).read_text())


def load_stop_policy(path: str | Path | None = None) -> dict:
    """The shipped scheduler policy: ``{"weights": [7 floats], "manifest": {...}}`` (JSON, no
    pickle). Falls back to :data:`ASHA_WEIGHTS` only if the package data is absent.

    Raises:
        FileNotFoundError: an explicit ``path`` that does not exist.
        ValueError: the file exists but is not such a JSON (names the file).
    """
    p = Path(path) if path is not None else WEIGHTS_FILE
    if not p.is_file():
        if path is not None:
            raise FileNotFoundError(f"{p}: no such scheduler policy file")
        return {"weights": list(ASHA_WEIGHTS), "manifest": {"note": "untrained: ASHA's rule"}}
    try:
        data = _read(str(p.resolve()))
        w = [float(x) for x in data["weights"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{p}: not a scheduler policy (weights: {e})") from None
    if len(w) != len(FEATURES):
        raise ValueError(f"{p}: weights: expected {len(FEATURES)} values, got {len(w)}")
    return {"weights": w, "manifest": data.get("manifest", {})}
