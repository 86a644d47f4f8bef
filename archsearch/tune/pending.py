"""A trial that waits for resources no node has stops the search instead of hanging it.

Before launch :func:`archsearch.tune.preflight.check_resources` refuses a request that no node
of a fixed cluster can hold. On an autoscaling cluster it only warns: the autoscaler may add a
node that fits. :class:`PendingWatch` (a Tune callback, with its :meth:`PendingWatch.stopper`
given to Tune as the experiment's stopper) then watches the trials: when one has been
``PENDING`` for longer than ``budget.pending_timeout_s`` and still no node of the cluster could
hold it (``ray.nodes()``), it stops the experiment and keeps the reason;
:func:`archsearch.tune.runner` turns that into one :class:`~archsearch.errors.UserError` line
(exit code 2). A trial that waits while another one holds the resources it needs is queueing,
not stuck, and is left alone however long it waits.

Tune pickles its callbacks and stopper with the experiment (``Tuner.restore`` brings them back),
so the verdict is kept in :attr:`PendingWatch.verdicts` under the run directory's path, where
the driver finds it whichever copy of the watch gave it, and the timers start afresh on restore.
"""

from __future__ import annotations

import time
from typing import Callable

from ray.tune import Callback
from ray.tune.stopper import Stopper

from archsearch.tune.preflight import RESOURCE_FIELDS, amount_text, describe_resources, fits


class _Stop(Stopper):
    """The experiment stopper of a :class:`PendingWatch`."""

    def __init__(self, watch: "PendingWatch"):
        self.watch = watch

    def __call__(self, trial_id, result) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.watch.key in PendingWatch.verdicts


class PendingWatch(Callback):
    """Stop the search when a trial has waited ``timeout_s`` seconds for resources (``request``,
    Ray names: ``CPU``, ``GPU``, ``memory`` bytes) that no node of the cluster has.

    Args:
        key: the run directory's path (the key of :attr:`verdicts`).
        request: one trial's resources (:func:`archsearch.tune.preflight.trial_request`).
        timeout_s: ``budget.pending_timeout_s``.
        source: the space file, named in the error.
        nodes: returns the alive nodes' resources
            (:func:`archsearch.tune.ray_session.node_resources`).
        check_every_s: how often the nodes are asked, once a trial has waited ``timeout_s``.
    """

    #: run directory path -> ``(field, message)`` of a watch that stopped its search
    verdicts: dict[str, tuple[str, str]] = {}

    def __init__(self, key: str, request: dict[str, float], timeout_s: float, *,
                 source: str | None, nodes: Callable[[], list[dict[str, float]]],
                 check_every_s: float = 2.0):
        self.key, self.request, self.timeout_s = key, dict(request), float(timeout_s)
        self.source, self.nodes, self.check_every_s = source, nodes, check_every_s
        self._since: dict[str, float] = {}
        self._checked = 0.0

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_since"], state["_checked"] = {}, 0.0
        return state

    @property
    def stopper(self) -> Stopper:
        return _Stop(self)

    def on_step_end(self, iteration, trials, **info):
        if self.key in PendingWatch.verdicts:
            return
        now = time.monotonic()
        pending = {t.trial_id for t in trials if t.status == "PENDING"}
        self._since = {tid: self._since.get(tid, now) for tid in pending}
        if not pending:
            return
        tid, since = min(self._since.items(), key=lambda kv: kv[1])
        if now - since < self.timeout_s or now - self._checked < self.check_every_s:
            return
        self._checked = now
        nodes = self.nodes()
        if fits(self.request, nodes):
            return  # queueing behind other trials, not stuck
        largest = {k: max((n.get(k, 0.0) for n in nodes), default=0.0) for k in self.request}
        res = next((k for k, v in self.request.items() if largest[k] + 1e-9 < v), next(iter(self.request)))
        fld = next(f for f, (r, _, _) in RESOURCE_FIELDS.items() if r == res)
        asks = ", ".join(amount_text(k, v) for k, v in self.request.items())
        PendingWatch.verdicts[self.key] = (
            f"budget.{fld}",
            f"trial {tid} waited {now - since:.0f} s (budget.pending_timeout_s) for {asks}, and no "
            f"node of the cluster has that ({describe_resources(nodes)}): the autoscaler added "
            f"none; the search was stopped (run: {self.key}); lower budget.{fld}, give the cluster "
            "a node type that fits, or raise budget.pending_timeout_s")


class TimeBudget(Stopper):
    """Tune's experiment stopper for ``budget.time_budget_s``, counted over every session of a
    run: a resumed search gets what the earlier sessions left, not the whole budget again.
    (Ray's ``TimeoutStopper``, which ``TuneConfig.time_budget_s`` builds, starts its clock afresh
    when ``Tuner.restore`` unpickles it.) As Ray's, a session's clock starts at Tune's first
    check, after its set-up. Tune pickles this stopper with the experiment, so the driver sets
    what each session may spend in :attr:`remaining`, under the run's name, before the session's
    ``fit``: the budget minus the wall seconds of the earlier sessions."""

    #: run name -> seconds this session may spend
    remaining: dict[str, float] = {}

    def __init__(self, run_name: str):
        self.run_name = run_name
        self._deadline: float | None = None

    def __getstate__(self):
        return {**self.__dict__, "_deadline": None}

    def __call__(self, trial_id, result) -> bool:
        return False

    def stop_all(self) -> bool:
        now = time.time()
        if self._deadline is None:
            self._deadline = now + TimeBudget.remaining[self.run_name]
        return now >= self._deadline
