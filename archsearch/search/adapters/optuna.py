"""Optuna adapter: any ask/tell :class:`~archsearch.search.base.Searcher` as an Optuna sampler.

The core proposes a whole config per trial (relative sampling over the space's
distributions); the trial's objective values reach the core in ``after_trial``. A ``PRUNED``
trial is told with the fidelity stored in its user attribute ``"fidelity"`` (fraction of the
budget) and its intermediate objective values in ``"metrics"`` when the objective set them,
otherwise it is told as failed, like a ``FAIL``.

Use with define-by-run objectives that call :meth:`SearchSpace.suggest`::

    study = optuna.create_study(directions=[...], sampler=CoreSampler(make("ahto", space)))
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.samplers import BaseSampler, RandomSampler

from archsearch.search.base import Searcher


class CoreSampler(BaseSampler):
    """Optuna ``BaseSampler`` around an ask/tell core (``seed`` seeds the fallback sampler for a
    param outside the space)."""

    def __init__(self, core: Searcher, *, seed: int = 0):
        self.core = core
        self._fallback = RandomSampler(seed=seed)

    def infer_relative_search_space(self, study, trial) -> dict[str, Any]:
        return self.core.space.to_optuna()

    def sample_relative(self, study, trial, search_space) -> dict[str, Any]:
        if not search_space:
            return {}
        tid = str(trial.number)
        if tid in self.core.pending:
            return dict(self.core.pending[tid]["config"])
        _, config = self.core.ask(tid)
        return config

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study, trial, state, values) -> None:
        tid = str(trial.number)
        if tid not in self.core.pending:
            return
        TS = optuna.trial.TrialState
        if state == TS.COMPLETE and values is not None:
            metrics = {**trial.user_attrs.get("metrics", {}), **dict(zip(self.core.metrics, values))}
            self.core.tell(tid, metrics)
        elif state == TS.PRUNED and "metrics" in trial.user_attrs:
            self.core.tell(tid, trial.user_attrs["metrics"],
                           fidelity=float(trial.user_attrs.get("fidelity", 1.0)))
        else:
            self.core.tell(tid, None, error=True)
