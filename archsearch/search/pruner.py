"""AHTO's learned scheduler as an Optuna pruner.

:class:`AHTOPruner` follows Optuna's pruner conventions: ``prune(study, trial)`` reads the study
(no state of its own, so it works with any storage and several processes), a single-objective
study (``Trial.report`` raises for several objectives), intermediate values at integer steps
(epochs). It rebuilds the :class:`archsearch.search.scheduler.StopPolicy` state from the other
trials' intermediate values, in trial order, then replays ``trial``'s own reports: it is pruned
if any rung it has passed says stop or any value it reported is NaN or infinite (so a study that
calls ``should_prune`` less often than ``report`` still judges every rung, as Optuna's
``SuccessiveHalvingPruner`` does). Steps are completed epochs, ``1 .. max_resource``; a trial
reporting at ``max_resource`` is complete (its value there is a finished trial's final value,
which the policy's ``final_z`` feature learns from)::

    study = optuna.create_study(direction="maximize", pruner=AHTOPruner(max_resource=20))
    ...
    for epoch in range(1, 21):
        trial.report(accuracy, epoch)
        if trial.should_prune():
            raise optuna.TrialPruned()

A trial that ran sequentially after the others gets the decision
:class:`~archsearch.tune.scheduler.AHTOScheduler` would make (tested). Only trials numbered
before ``trial`` are replayed: with several workers, a later-numbered trial that already reached
a rung is not counted (the Tune scheduler would count it).
"""

from __future__ import annotations

import math

import optuna
from optuna.trial import TrialState

from archsearch.search.scheduler import StopPolicy


class AHTOPruner(optuna.pruners.BasePruner):
    """Learned continue/stop at ASHA's rungs (``min_resource * reduction_factor**k`` steps).

    Args:
        min_resource: the first rung (steps), as ``SuccessiveHalvingPruner``'s.
        max_resource: steps of a full trial (a trial reporting at it is complete).
        reduction_factor: rung spacing.
        cost_attr: a user attribute of each trial holding a second objective to minimise,
            known before training (``flops_per_sample``); ``None``: costs unknown.
        n_trials: the study's trial budget, for the ``budget_used`` feature (0 when ``None``).
        weights: 7 policy weights (default: the shipped ``ahto_scheduler.json``).

    Raises:
        ValueError: ``max_resource < min_resource``, ``min_resource <= 0``,
            ``reduction_factor <= 1``, bad ``weights``; at ``prune``, a multi-objective study
            (as Optuna's own pruners).
    """

    def __init__(self, *, min_resource: int = 1, max_resource: int = 100, reduction_factor: float = 3,
                 cost_attr: str | None = None, n_trials: int | None = None, weights=None):
        self._args = dict(max_t=max_resource, grace_period=min_resource, reduction_factor=reduction_factor)
        self._weights = StopPolicy(weights, mode="max", **self._args).weights  # validates once
        self._cost_attr, self._n_trials = cost_attr, n_trials

    def prune(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if len(study.directions) > 1:
            raise ValueError("AHTOPruner: a multi-objective study cannot be pruned (Optuna's Trial.report "
                             "is single-objective)")
        steps = sorted(trial.intermediate_values)
        if not steps:
            return False
        mode = "max" if study.direction == optuna.study.StudyDirection.MAXIMIZE else "min"
        pol = StopPolicy(self._weights, mode=mode, **self._args)
        others = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED,
                                                                       TrialState.RUNNING))
                  if t.number < trial.number and t.intermediate_values]
        for t in others:  # replay: their reports, in trial order
            pol.add(t.number, self._cost(t))
            for step in sorted(t.intermediate_values):
                pol.on_result(t.number, step, t.intermediate_values[step])
        pol.add(trial.number, self._cost(trial))
        used = min((trial.number + 1) / self._n_trials, 1.0) if self._n_trials else 0.0
        if steps[-1] >= pol.max_t:
            return False
        # every rung the trial passed is judged, not only the one of its last report
        return not all([pol.on_result(trial.number, step, trial.intermediate_values[step], used)
                        for step in steps])

    def _cost(self, t) -> float | None:
        if self._cost_attr is None:
            return None
        c = t.user_attrs.get(self._cost_attr)
        return float(c) if isinstance(c, (int, float)) and math.isfinite(c) else None
