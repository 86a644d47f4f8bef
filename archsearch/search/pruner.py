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

Cost: the replay of the trials numbered below the first one that has not finished is kept
(per study and storage, in this process) and reused, since a finished trial's reports never
change; each call replays the rest. Without it a study's pruning time grew with the cube of
its trials. The decisions are the same (tested against a pruner that replays everything each
call).
"""

from __future__ import annotations

import copy
import math
import threading
import weakref

import optuna
from optuna.trial import TrialState

from archsearch.metrics import is_number
from archsearch.search.scheduler import StopPolicy

_ENDED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
_REPLAYED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)


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
        self._lock = threading.Lock()
        self._ended = None  # (storage weakref, study id, n, policy after replaying trials 0 .. n-1)

    def __getstate__(self):  # the kept replay holds a weak reference: not pickled
        return {**self.__dict__, "_lock": None, "_ended": None}

    def __setstate__(self, state):
        self.__dict__.update(state, _lock=threading.Lock())

    def prune(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if len(study.directions) > 1:
            raise ValueError("AHTOPruner: a multi-objective study cannot be pruned (Optuna's Trial.report "
                             "is single-objective)")
        steps = sorted(trial.intermediate_values)
        if not steps:
            return False
        mode = "max" if study.direction == optuna.study.StudyDirection.MAXIMIZE else "min"
        trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
        # trials 0 .. ended-1 have all ended (their reports are final) and come before this one
        ended = next((t.number for t in trials if t.state not in _ENDED or t.number >= trial.number),
                     trial.number)
        pol, start = self._kept(study, mode, ended)
        for t in trials:
            if t.number >= trial.number:
                break
            if t.number == ended and start < ended:
                self._keep(study, ended, pol)
            if t.number >= start and t.state in _REPLAYED and t.intermediate_values:
                self._replay(pol, t)
        if ended == trial.number and start < ended:
            self._keep(study, ended, pol)
        pol.add(trial.number, self._cost(trial))
        used = min((trial.number + 1) / self._n_trials, 1.0) if self._n_trials else 0.0
        if steps[-1] >= pol.max_t:
            return False
        # every rung the trial passed is judged, not only the one of its last report
        return not all([pol.on_result(trial.number, step, trial.intermediate_values[step], used)
                        for step in steps])

    def _replay(self, pol: StopPolicy, t) -> None:
        """``t``'s reports, in step order, into ``pol``."""
        pol.add(t.number, self._cost(t))
        for step in sorted(t.intermediate_values):
            pol.on_result(t.number, step, t.intermediate_values[step])

    def _kept(self, study, mode: str, ended: int) -> tuple[StopPolicy, int]:
        """A copy of the kept replay of this study's first trials if it covers at most the
        ``ended`` trials that have ended, and the trial number to replay from; else a new
        policy and 0."""
        with self._lock:
            kept = self._ended
        if self._of(kept, study) and kept[2] <= ended and kept[3].sign == (1.0 if mode == "max" else -1.0):
            return copy.deepcopy(kept[3]), kept[2]
        return StopPolicy(self._weights, mode=mode, **self._args), 0

    def _keep(self, study, n: int, pol: StopPolicy) -> None:
        """Keep a copy of ``pol``, the replay of trials ``0 .. n-1`` (all ended)."""
        with self._lock:
            if not self._of(self._ended, study) or self._ended[2] < n:
                self._ended = (weakref.ref(study._storage), study._study_id, n, copy.deepcopy(pol))

    @staticmethod
    def _of(kept, study) -> bool:
        """Whether ``kept`` is a replay of ``study`` (the same storage object and study id)."""
        return kept is not None and kept[0]() is study._storage and kept[1] == study._study_id

    def _cost(self, t) -> float | None:
        if self._cost_attr is None:
            return None
        c = t.user_attrs.get(self._cost_attr)
        return float(c) if is_number(c) and math.isfinite(c) else None
