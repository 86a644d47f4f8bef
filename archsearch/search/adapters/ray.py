"""Ray Tune adapter: any ask/tell :class:`~archsearch.search.base.Searcher` as a Tune ``Searcher``.

``suggest`` asks the core (inactive conditional params are ``None``, as in
:meth:`SearchSpace.to_ray`); ``on_trial_complete`` tells it the trial's last result with its
fidelity (``epoch / epochs``: ASHA-stopped trials count at their fraction of the budget) or
``error=True`` for a failed trial; ``save``/``restore`` write the core's full state (atomic).
When an Optuna ``storage`` is given, every finished trial is also added to the Optuna study
``study_name`` (``study.add_trial``, with the Tune trial id as user attribute ``trial_id``) so
``archsearch dashboard`` shows the run. Recording is idempotent: a trial Tune reports again
after a resume (it finished after the last experiment save) is not added twice.
"""

from __future__ import annotations

import math
from typing import Any

from ray.tune.search import Searcher as _TuneSearcher

from archsearch.search.base import Searcher


class RaySearcher(_TuneSearcher):
    """Tune ``Searcher`` around an ask/tell core.

    Args:
        core: the searcher core.
        epochs: the trials' full epoch budget (for the fidelity of early-stopped trials).
        storage: optional Optuna storage (object or URL) to record trials in; study_name: its study.
    """

    def __init__(self, core: Searcher, *, epochs: int | None = None, storage=None,
                 study_name: str | None = None):
        space = core.space
        super().__init__(metric=space.objectives[0].metric, mode=space.objectives[0].mode)
        self.core, self.epochs = core, epochs
        self.storage, self.study_name = storage, study_name
        self._study = None
        self._recorded: set[str] | None = None  # Tune trial ids already in the study

    def __getstate__(self):
        return {**self.__dict__, "_study": None, "_recorded": None}

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # the objectives come from the search space

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        _, config = self.core.ask(trial_id)
        return {k: config.get(k) for k in self.core.space.params}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        p = self.core.pending.get(trial_id)
        if p is None:
            return
        config = p["config"]
        fidelity = 1.0
        if result and self.epochs and result.get("epoch"):
            fidelity = min(1.0, max(float(result["epoch"]) / self.epochs, 1e-6))
        bad = error or not result or not all(
            isinstance(result.get(k), (int, float)) and math.isfinite(result[k]) for k in self.core.metrics)
        self.core.tell(trial_id, None if bad else result, error=bad, fidelity=fidelity)
        self._record(trial_id, config, None if bad else result, fidelity)

    def _record(self, trial_id: str, config: dict, result: dict | None, fidelity: float) -> None:
        if self.storage is None:
            return
        import optuna

        if self._study is None:
            self._study = optuna.create_study(
                storage=self.storage, study_name=self.study_name, load_if_exists=True,
                directions=["maximize" if o.mode == "max" else "minimize" for o in self.core.space.objectives])
        if self._recorded is None:
            self._recorded = {t.user_attrs.get("trial_id") for t in self._study.get_trials(deepcopy=False)}
        if trial_id in self._recorded:
            return
        self._recorded.add(trial_id)
        dists = self.core.space.to_optuna()
        TS = optuna.trial.TrialState
        state = TS.FAIL if result is None else (TS.COMPLETE if fidelity >= 1.0 else TS.PRUNED)
        values = [float(result[k]) for k in self.core.metrics] if state == TS.COMPLETE else None
        constraints = self.core.constraint_values(result) if state == TS.COMPLETE else None
        attrs = {k: float(v) for k, v in (result or {}).items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                 and k not in ("time_this_iter_s", "time_total_s", "timestamp", "pid",
                               "time_since_restore", "iterations_since_restore")}
        self._study.add_trial(optuna.trial.create_trial(
            params=dict(config), distributions={k: dists[k] for k in config}, values=values,
            constraints=constraints or None,
            state=state, user_attrs={**attrs, "fidelity": fidelity, "searcher": self.core.name,
                                     "trial_id": trial_id}))

    def save(self, checkpoint_path: str) -> None:
        self.core.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        self.core.restore(checkpoint_path)
