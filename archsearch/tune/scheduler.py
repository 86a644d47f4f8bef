"""AHTO's learned scheduler as a Ray Tune ``TrialScheduler`` (``budget.scheduler: ahto``).

:class:`AHTOScheduler` stops or continues a trial at ASHA's rungs with the policy of
:mod:`archsearch.search.scheduler` (meta-trained on LCBench, ``benchmarks/schedulers/schedulers.py``); with
``weights=ASHA_WEIGHTS`` it makes exactly the decisions of Ray's ``ASHAScheduler`` (one
bracket, ``stop_last_trials=True``). Use it as any Tune scheduler::

    from archsearch.tune.scheduler import AHTOScheduler
    tune.TuneConfig(scheduler=AHTOScheduler(metric="accuracy", mode="max", max_t=20,
                                            cost_metric="flops_per_sample", num_samples=50))

Differences from Ray's ASHA with ASHA's weights: a non-finite value stops the trial (Ray's lets
it go on). As for Ray's ASHA, Tune does not call :meth:`save`/:meth:`restore` when a run is
resumed (``Tuner.restore`` rebuilds the scheduler from the Tuner's pickle): a resumed search
starts its rungs empty. They are there for callers that checkpoint the scheduler themselves.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from archsearch.metrics import is_number
from archsearch.search.scheduler import StopPolicy


class AHTOScheduler(FIFOScheduler):
    """Learned continue/stop decisions at ASHA's rungs (see :mod:`archsearch.search.scheduler`).

    Args:
        metric, mode: the learning-curve metric each result reports and its direction (Tune sets
            them from ``TuneConfig`` when left ``None``).
        time_attr: the result key that counts training progress (epochs).
        max_t: ``time_attr`` of a full trial; a trial reaching it is stopped (as ASHA).
        grace_period, reduction_factor: ASHA's rungs (``grace_period * reduction_factor**k``).
        cost_metric: a result key of a second objective to minimise, known at the first report
            (``flops_per_sample``, ``params_trainable``): a trial cheaper than every better one
            is worth keeping. ``None``: costs unknown.
        num_samples: the search's trial budget, for the ``budget_used`` feature (trials that
            reported / ``num_samples``; 0 when ``None``). The policy was trained with the fraction
            of a *time* budget spent; a trial fraction is the product's nearest equivalent.
        weights: 7 policy weights (default: the shipped ``ahto_scheduler.json``).

    Raises:
        ValueError: bad ``mode``, ``weights`` or ``max_t < grace_period``; on the first trial,
            no ``metric``/``mode`` set here nor by Tune.
    """

    def __init__(self, *, metric: str | None = None, mode: str | None = None,
                 time_attr: str = "training_iteration", max_t: int = 100, grace_period: int = 1,
                 reduction_factor: float = 3, cost_metric: str | None = None,
                 num_samples: int | None = None, weights=None):
        super().__init__()
        self._metric, self._mode, self._time_attr = metric, mode, time_attr
        self._cost_metric, self._num_samples = cost_metric, num_samples
        self._args = dict(max_t=max_t, grace_period=grace_period, reduction_factor=reduction_factor)
        self.policy = StopPolicy(weights, mode=mode or "max", **self._args)
        self._reported: set = set()  # trials that reported at least once (budget_used)
        self._num_stopped = 0

    def set_search_properties(self, metric: str | None, mode: str | None, **spec) -> bool:
        from ray.tune.result import DEFAULT_METRIC

        if (self._metric and metric) or (self._mode and mode):
            return False
        self._metric = self._metric or metric
        if mode:
            self._mode = mode
            self.policy.sign = 1.0 if mode == "max" else -1.0
        if self._metric is None and self._mode:
            self._metric = DEFAULT_METRIC
        return True

    def on_trial_add(self, tune_controller, trial) -> None:
        if not self._metric or self._mode not in ("max", "min"):
            raise ValueError(f"AHTOScheduler: metric ({self._metric!r}) and mode ({self._mode!r}) must be set, "
                             "here or in tune.TuneConfig")
        if trial.trial_id not in self.policy.cost:  # a retried trial keeps what it recorded
            self.policy.add(trial.trial_id)

    def on_trial_result(self, tune_controller, trial, result: dict[str, Any]) -> str:
        if result.get(self._time_attr) is None or result.get(self._metric) is None:
            return TrialScheduler.CONTINUE
        if self._cost_metric and self.policy.cost.get(trial.trial_id) is None:
            c = result.get(self._cost_metric)  # a missing, non-numeric or NaN cost stays unknown
            if is_number(c):
                self.policy.add(trial.trial_id, float(c))
        self._reported.add(trial.trial_id)
        t = result[self._time_attr]
        used = min(len(self._reported) / self._num_samples, 1.0) if self._num_samples else 0.0
        go_on = self.policy.on_result(trial.trial_id, t, float(result[self._metric]), used)
        if t >= self.policy.max_t or not go_on:
            self._num_stopped += 1
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller, trial, result: dict[str, Any]) -> None:
        if result and result.get(self._time_attr) is not None and result.get(self._metric) is not None:
            self.policy.record(trial.trial_id, result[self._time_attr], float(result[self._metric]))

    def on_trial_error(self, tune_controller, trial) -> None:
        pass  # as Ray's ASHA: what the trial recorded keeps counting (Tune may retry it)

    def on_trial_remove(self, tune_controller, trial) -> None:
        pass  # a stopped trial's values keep counting (its point is on the report's front)

    def debug_string(self) -> str:
        return (f"AHTOScheduler: {self.policy.decisions} rung decisions, {self._num_stopped} stopped; "
                f"rungs {self.policy.milestones}")

    def save(self, checkpoint_path: str) -> None:
        """Write the scheduler's state (JSON; atomic)."""
        state = {"policy": self.policy.state_dict(), "reported": sorted(self._reported),
                 "stopped": self._num_stopped, "metric": self._metric, "mode": self._mode}
        tmp = f"{checkpoint_path}.tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        """Read a state written by :meth:`save` (direction included).

        Raises:
            ValueError: the file is not such a state, or its rungs differ (names the file).
        """
        try:
            with open(checkpoint_path) as f:
                state = json.load(f)
            self.policy.load_state_dict(state["policy"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{checkpoint_path}: not an AHTOScheduler state of these rungs ({e})") from None
        self._reported, self._num_stopped = set(state["reported"]), int(state["stopped"])
        self._metric, self._mode = state["metric"], state["mode"]
