"""The computed report of one run: :class:`ReportData` and :func:`build_report_data`.

:func:`build_report_data` validates the runner's records (:mod:`archsearch.report.records`),
classifies every trial and sub-trial, and computes the Pareto front, the reference point and
the hypervolume history with :mod:`archsearch.pareto` (feasible rows only). The CSV/JSON
writers, the figures and the page all read the one :class:`ReportData` it returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from archsearch import pareto
from archsearch.report.records import (
    STATIC_GATING,
    TrialRow,
    classify,
    make_subtrials,
    parse_constraints,
    parse_objectives,
    parse_trial,
)
from archsearch.report.values import to_float
from archsearch.space import Objective


@dataclass
class ReportData:
    """Everything the report shows, computed once.

    ``trials`` are the runner's records (trial order); ``subtrials`` the anytime-curve points
    of dynamic trials; ``rows`` is both, and ``row.index`` is the row's position in it and in
    ``Y``. ``Y`` is ``(n_rows, n_objectives)`` in the objectives' units with NaN rows for
    failed rows; ``reference_point`` and ``hypervolume`` use feasible rows only;
    ``hv_history[i]`` is the hypervolume after trial ``i`` (trial order, with its sub-trials).
    """

    objectives: list[Objective]
    constraints: dict[str, dict[str, float]]
    run_info: dict[str, Any]
    trials: list[TrialRow]
    Y: np.ndarray
    reference_point: list[float | None]
    hypervolume: float
    hv_history: list[float]
    subtrials: list[TrialRow] = field(default_factory=list)
    n_dropped_points: int = 0

    @property
    def rows(self) -> list[TrialRow]:
        return self.trials + self.subtrials

    @property
    def modes(self) -> list[str]:
        return [o.mode for o in self.objectives]

    @property
    def n_trials(self) -> int:
        return len(self.trials)

    @property
    def n_failed(self) -> int:
        return sum(t.failed for t in self.trials)

    @property
    def n_successful(self) -> int:
        return self.n_trials - self.n_failed

    @property
    def n_feasible(self) -> int:
        return sum(t.feasible for t in self.trials)

    @property
    def n_stopped(self) -> int:
        return sum(t.stopped and not t.failed for t in self.trials)

    @property
    def n_pareto(self) -> int:
        return sum(r.pareto for r in self.rows)

    def pareto_trials(self) -> list[TrialRow]:
        """Pareto rows (trials and sub-trials) sorted best-first on the first objective
        (ties: trial_id)."""
        rows = [t for t in self.rows if t.pareto]
        sign = -1.0 if self.objectives[0].mode == "max" else 1.0
        return sorted(rows, key=lambda t: (sign * float(self.Y[t.index, 0]), t.trial_id))

    def failed_trials(self) -> list[TrialRow]:
        return [t for t in self.trials if t.failed]

    def subtrials_of(self, trial_id: str) -> list[TrialRow]:
        """The sub-trials of one trial, in curve order."""
        by_parent: dict[str, list[TrialRow]] = {}
        for s in self.subtrials:
            by_parent.setdefault(s.parent, []).append(s)
        return by_parent.get(trial_id, [])

    @cached_property
    def mixes_gating(self) -> bool:
        """Whether the successful trials include both static ones (``gating: static`` or no
        gating in the config) and trials of another gating (``dht``, ``depth_predictor``...):
        then the figures draw the static trials' own front and say each point's gating."""
        static = {t.gating == STATIC_GATING for t in self.trials if not t.failed}
        return static == {True, False}

    def dynamic_trials(self) -> list[TrialRow]:
        """Trials that have sub-trials (an anytime curve with at least one usable point)."""
        parents = {s.parent for s in self.subtrials}
        return [t for t in self.trials if t.trial_id in parents]

    def metric_names(self, *, scalar_only: bool = False) -> list[str]:
        """Objective metrics first, then every other reported metric name, sorted.

        ``scalar_only``: leave out metrics whose values are lists or dicts (``anytime_curve``,
        ``tying_map``, histograms), for table columns.
        """
        first = [o.metric for o in self.objectives]
        names = {k for t in self.rows for k in t.metrics} - set(first)
        if scalar_only:
            names = {k for k in names
                     if not any(isinstance(t.metrics.get(k), (Mapping, list, tuple))
                                for t in self.rows)}
        return first + sorted(names)

    def config_names(self) -> list[str]:
        """Union of config keys over all rows, sorted."""
        return sorted({k for t in self.rows for k in t.config})

    def rescore(self, ref: Sequence[float | None]) -> None:
        """Recompute ``hypervolume`` and ``hv_history`` with the reference point ``ref``
        (objectives' units), e.g. one shared by several runs (:mod:`archsearch.report.compare`).

        Raises:
            ValueError: ``ref`` of the wrong length or with non-finite values.
        """
        ref = [None if r is None else float(r) for r in ref]
        if len(ref) != len(self.objectives):
            raise ValueError(f"reference point has {len(ref)} values for "
                             f"{len(self.objectives)} objectives")
        self.reference_point = ref
        feasible = np.array([r.feasible for r in self.rows], dtype=bool)
        if not feasible.any() or any(r is None for r in ref):
            self.hypervolume, self.hv_history = 0.0, [0.0] * self.n_trials
            return
        Y_feasible = np.where(feasible[:, None], self.Y, np.nan)
        # trial order, each trial followed by its sub-trials
        order: list[int] = []
        last_of_trial: list[int] = []
        subs: dict[str, list[int]] = {}
        for s in self.subtrials:
            subs.setdefault(s.parent, []).append(s.index)
        for t in self.trials:
            order.append(t.index)
            order.extend(subs.get(t.trial_id, []))
            last_of_trial.append(len(order) - 1)
        history = pareto.hypervolume_history(Y_feasible[order], self.modes, ref)
        self.hv_history = [history[i] for i in last_of_trial]
        self.hypervolume = self.hv_history[-1] if self.hv_history else 0.0


def build_report_data(
    trials: Sequence[Mapping[str, Any]],
    objectives: Sequence[Mapping[str, Any]],
    constraints: Mapping[str, Any] | None = None,
    run_info: Mapping[str, Any] | None = None,
    *,
    reference: Sequence[float | None] | None = None,
) -> ReportData:
    """Validate the inputs; compute failures, feasibility, sub-trials, the front and the
    hypervolume.

    Args:
        trials, objectives, constraints, run_info: as :func:`archsearch.report.write_report`.
        reference: a reference point to use instead of the automatic one (objectives' units;
            e.g. shared by several runs). ``None`` entries fall back to the automatic rule.

    Raises:
        ValueError: any contract violation (see the ``parse_*`` functions) or duplicate
            ``trial_id``.
    """
    objs = parse_objectives(objectives)
    cons = parse_constraints(constraints)
    rows = [parse_trial(i, rec) for i, rec in enumerate(trials)]
    ids = [r.trial_id for r in rows]
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dupes = sorted({i for i in ids if i in seen or seen.add(i)})[:5]
        raise ValueError(f"duplicate trial_id in trials: {dupes}")
    for row in rows:
        classify(row, objs, cons)
    subtrials: list[TrialRow] = []
    dropped = 0
    for row in rows:
        subs, n_drop = make_subtrials(row, len(rows) + len(subtrials), objs, cons)
        subtrials += subs
        dropped += n_drop

    every = rows + subtrials
    modes = [o.mode for o in objs]
    Y = np.full((len(every), len(objs)), np.nan)
    for row in every:
        if not row.failed:
            Y[row.index] = [to_float(row.metrics[o.metric]) for o in objs]
    feasible = np.array([r.feasible for r in every], dtype=bool)
    Y_feasible = np.where(feasible[:, None], Y, np.nan)

    mask = pareto.non_dominated_mask(Y_feasible, modes)
    for row in every:
        row.pareto = bool(mask[row.index])

    user_refs = [o.ref for o in objs]
    if reference is not None:
        if len(reference) != len(objs):
            raise ValueError(f"reference point has {len(reference)} values for {len(objs)} objectives")
        user_refs = [r if r is not None else u for r, u in zip(reference, user_refs)]
    ref = pareto.reference_point(Y_feasible, modes, user_refs)
    data = ReportData(
        objectives=objs,
        constraints=cons,
        run_info=dict(run_info or {}),
        trials=rows,
        Y=Y,
        reference_point=ref,
        hypervolume=0.0,
        hv_history=[0.0] * len(rows),
        subtrials=subtrials,
        n_dropped_points=dropped,
    )
    data.rescore(ref)
    return data
