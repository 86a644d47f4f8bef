"""Run a search: check it, lay out its run directory, run a Ray Tune ``Tuner``, write a report.

``run_search`` and ``resume_search`` share one path::

    start_run / reopen_run  ->  Launch (run dir, spec, effective space, data)
    _tuner(launch)          ->  tune.Tuner (or Tuner.restore) -> fit()
    _finish(launch)         ->  reconcile lost trials, wall time, report

``start_run`` first makes every pre-launch check (:mod:`archsearch.tune.preflight`; the resources
of one trial against the cluster's once Ray is up, :func:`connect`). The run
directory's layout is :class:`archsearch.runs.RunDir`'s; what the run was started
with (searcher, seed, trials, resources per trial, Ray address, ``--fixed``) is its
:class:`~archsearch.runs.RunSpec`, and ``resume`` runs with exactly that.
"""

from __future__ import annotations

import contextlib

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from archsearch.errors import UserError
from archsearch.runs import ERROR, RUNNING, STOPPED, RunDir, RunSpec, check_run_name
from archsearch.space import SearchSpace
from archsearch.tune.preflight import check_resources, check_search
from archsearch.tune.ray_session import init_ray, print_dashboards


@dataclass
class RunResult:
    run_dir: Path
    report_dir: Path
    summary: dict
    wall_seconds: float
    #: what ``budget.keep_weights`` kept (:func:`archsearch.tune.weights.keep_weights`)
    disk: dict | None = None


@dataclass
class Launch:
    """Everything a Tuner needs: the run directory, its spec, the effective space, the data."""

    run: RunDir
    spec: RunSpec
    space: SearchSpace
    data: Any
    t0: float
    prior_wall: float = 0.0  #: wall seconds of earlier sessions (resume)
    lock: Any = None  #: :meth:`RunDir.lock`'s file: the run is this process's while it is open


# ---------------------------------------------------------------------- start and reopen
def connect(space: SearchSpace, address: str | None, *, num_cpus: int | None = None,
            dashboard: bool = False, overridden: tuple[str, ...] = ()) -> None:
    """Start local Ray (or connect to ``address``), then check that a node of the cluster can
    hold one trial (:func:`archsearch.tune.preflight.check_resources`); on an autoscaling
    cluster a request no node has now is one ``warning:`` line on stderr. A local Ray is
    checked before it starts too (:func:`archsearch.tune.preflight.local_resources`, Ray's own
    resolution of this machine), so an impossible request never waits for Ray to start.

    Raises:
        UserError: unreachable ``address``; a fixed cluster without room for one trial.
    """
    import ray

    from archsearch.tune.preflight import local_resources
    from archsearch.tune.ray_session import cluster_autoscales, node_resources

    if address is None and not ray.is_initialized():  # refused without starting Ray at all
        check_resources(space, local_resources(num_cpus), autoscaling=False, local=True,
                        overridden=overridden)
    init_ray(address, num_cpus=num_cpus, dashboard=dashboard)
    warning = check_resources(space, node_resources(), autoscaling=cluster_autoscales(address),
                              local=address is None, overridden=overridden)
    if warning:
        print(warning, file=sys.stderr)


def start_run(space: SearchSpace, *, searcher: str = "gp", trials: int | None = None,
              address: str | None = None, name: str | None = None, storage: str | Path = "runs",
              cpus_per_trial: float | None = None, gpus_per_trial: float | None = None,
              num_cpus: int | None = None, fixed: dict[str, Any] | None = None,
              ray: bool = False, ray_dashboard: bool = False, history=()) -> Launch:
    """Check everything that can be checked before launch (:mod:`archsearch.tune.preflight`),
    then create the run directory with its spec and effective space. Nothing is launched.

    With ``ray``, Ray is started (or connected to) after the checks that need no cluster and
    the resources of one trial are checked against its nodes (:func:`connect`), all before the
    run directory is made: a refused search leaves nothing behind.

    Raises:
        UserError: bad searcher, unreachable ``address``, bad checkpoint or tokenizer,
            unreadable dataset, impossible constraints, (``ray``) no node with room for one
            trial, existing run name, unwritable storage.
    """
    t0 = time.time()
    if not name:  # the run is named after the space: a name that cannot be one is refused first
        check_run_name(space.name, file=space.source, field="name")
    space, data = check_search(space, searcher=searcher, address=address, trials=trials,
                               cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial)
    from archsearch.tune.searchers import check_history

    check_history(searcher, history, space)  # before the run directory exists
    if ray:
        overridden = tuple(f for f, v in (("cpus_per_trial", cpus_per_trial),
                                          ("gpus_per_trial", gpus_per_trial)) if v is not None)
        connect(space, address, num_cpus=num_cpus, dashboard=ray_dashboard, overridden=overridden)
    name = name or f"{space.name}-{searcher}-{time.strftime('%Y%m%d-%H%M%S')}"
    run = RunDir.create(storage, name)
    lock = run.lock()
    with _released_on_error(lock):
        b = space.budget
        spec = RunSpec(name=name, searcher=searcher, seed=space.seed, trials=b.trials,
                       cpus_per_trial=b.cpus_per_trial, gpus_per_trial=b.gpus_per_trial,
                       address=address, num_cpus=num_cpus, space_file=space.source, fixed=fixed,
                       argv=list(sys.argv), started=t0, path=str(run.path),
                       history=[str(Path(h).resolve()) for h in history])
        run.write_space(space)
        run.write_spec(spec)
    return Launch(run, spec, space, data, t0, lock=lock)


def _release(lock) -> None:
    """Close :meth:`RunDir.lock`'s file now, not when a kept traceback lets it go (a notebook's
    ``sys.last_traceback``): flock is per open file, so this process could not retry."""
    if lock is not None:
        lock.close()


@contextlib.contextmanager
def _released_on_error(lock):
    """Release ``lock`` (:func:`_release`) if the block raises; keep it otherwise."""
    try:
        yield
    except BaseException:
        _release(lock)
        raise


def _moved(spec: RunSpec, run: RunDir) -> bool:
    """Whether the run directory is not the one ``spec`` was created at (the same directory
    through a symlink, a bind mount or another letter case is not moved)."""
    if spec.path is None:
        return False
    try:
        return not os.path.samefile(spec.path, run.path)
    except OSError:  # the original is gone: moved
        return True


def reopen_run(run_dir: str | Path, *, address: str | None = None,
               num_cpus: int | None = None, ray: bool = False,
               ray_dashboard: bool = False) -> Launch:
    """A stopped run, ready to continue with the spec it was started with (``address`` and
    ``num_cpus`` override the recorded ones, e.g. the cluster moved). With ``ray``, Ray is
    started (or connected to) and the resources of one trial checked (:func:`connect`) before
    the spec is touched.

    Raises:
        UserError: not a run directory, the search never started, another driver still runs
            it (:meth:`RunDir.lock`), the run directory was moved or copied from where it was
            created, (``ray``) no node with room for one trial.
    """
    run = RunDir.open(run_dir)
    if not run.tune_state_file.is_file():
        raise UserError("the search never started (no Tune experiment state): start it again "
                        "with `archsearch search`", file=str(run.path))
    lock = run.lock()
    with _released_on_error(lock):
        return _reopen(run, lock, address, num_cpus, ray, ray_dashboard)


def _reopen(run: RunDir, lock, address, num_cpus, ray, ray_dashboard) -> Launch:
    from archsearch.data import prepare_for_space

    spec = run.read_spec()
    if _moved(spec, run):
        # Tune.restore unpickles the trial recorder and the searcher with the old path: they
        # would write the records and the Optuna study there, not here
        raise UserError(f"this run was created at {spec.path} and its Ray Tune state writes "
                        "there: a moved or copied run cannot be resumed (move it back to resume; "
                        "`archsearch report` works anywhere)", file=str(run.path))
    t0 = time.time()
    if spec.wall_seconds is not None:  # the last session ended cleanly and counted itself
        prior = spec.wall_seconds
    else:  # it was killed: count it up to its last trial record
        session_start = spec.resumed[-1] if spec.resumed else spec.started
        prior = spec.wall_seconds_before + max(0.0, run.last_activity() - session_start)
    spec.wall_seconds, spec.wall_seconds_before = None, prior
    spec.resumed.append(t0)
    if address is not None:
        spec.address = address
    if num_cpus is not None:
        spec.num_cpus = num_cpus
    space = run.load_space()
    data = prepare_for_space(space)
    if ray:
        connect(space, spec.address, num_cpus=spec.num_cpus, dashboard=ray_dashboard)
    run.write_spec(spec)
    return Launch(run, spec, space, data, t0, prior, lock)


# ---------------------------------------------------------------------- Tune
def trial_resources(launch: Launch) -> dict[str, float]:
    """Ray resources of one trial, from the run spec (``memory`` in bytes, from the space's
    ``budget.memory_per_trial_gb``, when it is set)."""
    out = {"cpu": float(launch.spec.cpus_per_trial), "gpu": float(launch.spec.gpus_per_trial)}
    memory = getattr(launch.space.budget, "memory_per_trial_gb", None)
    if memory:
        out["memory"] = float(memory) * 2**30
    return out


def trial_settings(space: SearchSpace, cpus_per_trial: float) -> dict[str, Any]:
    """What the trainable needs besides its config: the budget, seed, threads, fixed values."""
    b = space.budget
    return {"epochs": b.epochs, "batch_size": b.batch_size, "steps_per_epoch": b.steps_per_epoch,
            "latency_batch_size": b.latency_batch_size, "precision": b.precision, "seed": space.seed,
            "threads": max(1, int(cpus_per_trial)), "fixed": dict(space.fixed)}


def _trainable(launch: Launch):
    from ray import tune

    from archsearch.tune.trainable import train_trial

    res = trial_resources(launch)
    return tune.with_resources(
        tune.with_parameters(train_trial, data=launch.data, settings=trial_settings(launch.space, res["cpu"])),
        res)


def _tuner(launch: Launch, progress: bool, restore: bool):
    from ray import tune

    from archsearch.tune.callbacks import ProgressBar, TrialRecorder
    from archsearch.tune.searchers import tune_searcher

    if restore:
        return tune.Tuner.restore(str(launch.run.tune_dir), trainable=_trainable(launch),
                                  resume_unfinished=True, resume_errored=False, restart_errored=False)
    space, b = launch.space, launch.space.budget
    scheduler = make_scheduler(space)
    recorder = TrialRecorder(launch.run, b.epochs)
    callbacks = [recorder, ProgressBar(recorder, b.trials, space.objectives[0])] if progress else [recorder]
    watch = pending_watch(launch)
    callbacks.append(watch)
    stop = watch.stopper
    if b.time_budget_s is not None:  # ours, not TuneConfig.time_budget_s: see TimeBudget
        from ray.tune.stopper import CombinedStopper

        from archsearch.tune.pending import TimeBudget

        stop = CombinedStopper(stop, TimeBudget(launch.run.name))
    search_alg = tune_searcher(launch.spec.searcher, space, launch.data, launch.run, seed=launch.spec.seed,
                               history=launch.spec.history)
    _check_picklable(search_alg, launch.spec.searcher)
    return tune.Tuner(
        _trainable(launch),
        tune_config=tune.TuneConfig(
            search_alg=search_alg,
            scheduler=scheduler, num_samples=b.trials, reuse_actors=True),
        run_config=tune.RunConfig(
            name=launch.run.tune_name, storage_path=str(launch.run.path), verbose=0,
            callbacks=callbacks, stop=stop,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            failure_config=tune.FailureConfig(max_failures=b.max_failures)),
    )


def _check_picklable(search_alg, name: str) -> None:
    """Tune pickles the searcher with the experiment (``tuner.pkl``) before any trial starts:
    a searcher that cannot be pickled stops the search as one line, naming it.

    Raises:
        SearchStopped: the searcher cannot be pickled.
    """
    from ray import cloudpickle

    from archsearch.search.base import state_error

    try:
        cloudpickle.dumps(search_alg)
    except Exception as e:
        raise state_error(name, e) from e


def scheduler_metrics(space) -> tuple[Any, Any]:
    """The objective a scheduler ranks trials by (the first whose value changes with training:
    not a known cost, latency or training time; else the first) and the cost objective the
    AHTO scheduler keeps cheap trials for (the first known-cost objective other than it, or
    ``None``)."""
    from archsearch.metrics import KNOWN_COSTS

    curve = [o for o in space.objectives if o.metric not in KNOWN_COSTS
             and o.metric not in ("latency_ms", "train_seconds")]
    obj = curve[0] if curve else space.objectives[0]
    cost = next((o for o in space.objectives if o is not obj and o.metric in KNOWN_COSTS and o.mode == "min"), None)
    return obj, cost


def make_scheduler(space):
    """The Tune scheduler of ``budget.scheduler``: ``asha`` (Ray's ``ASHAScheduler``), ``ahto``
    (:class:`archsearch.tune.scheduler.AHTOScheduler`: the learned policy at ASHA's rungs),
    ``median`` (Ray's ``MedianStoppingRule``: after ``grace_period`` epochs a trial whose best
    result so far is worse than the median of the other trials' running averages at the same
    epoch stops; Golovin et al. 2017, "Google Vizier", sec. 3.2.2), or ``None`` (``none``, or
    epochs <= grace period: nothing to stop)."""
    b = space.budget
    if b.scheduler == "none" or b.epochs <= b.grace_period:
        return None
    obj, cost = scheduler_metrics(space)
    if b.scheduler == "ahto":
        from archsearch.tune.scheduler import AHTOScheduler

        return AHTOScheduler(metric=obj.metric, mode=obj.mode, time_attr="training_iteration", max_t=b.epochs,
                             grace_period=b.grace_period, reduction_factor=b.reduction_factor,
                             cost_metric=cost.metric if cost else None, num_samples=b.trials)
    if b.scheduler == "median":
        from ray.tune.schedulers import MedianStoppingRule

        return MedianStoppingRule(metric=obj.metric, mode=obj.mode, time_attr="training_iteration",
                                  grace_period=b.grace_period)
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(metric=obj.metric, mode=obj.mode, time_attr="training_iteration", max_t=b.epochs,
                         grace_period=b.grace_period, reduction_factor=b.reduction_factor)


def pending_watch(launch: Launch):
    """The :class:`archsearch.tune.pending.PendingWatch` of a launch: one trial's resources,
    ``budget.pending_timeout_s``, the run directory as its key."""
    from archsearch.tune.pending import PendingWatch
    from archsearch.tune.preflight import trial_request
    from archsearch.tune.ray_session import node_resources

    space = launch.space.model_copy(update={"budget": launch.space.budget.model_copy(update={
        "cpus_per_trial": launch.spec.cpus_per_trial, "gpus_per_trial": launch.spec.gpus_per_trial})})
    return PendingWatch(str(launch.run.path), trial_request(space), launch.space.budget.pending_timeout_s,
                        source=launch.space.source, nodes=node_resources)


def _fit(launch: Launch, *, progress: bool, ray_dashboard: bool, restore: bool,
         reports: str | Path) -> RunResult:
    import optuna

    from archsearch.tune.pending import PendingWatch, TimeBudget

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # also on resume: no INFO lines
    try:
        init_ray(launch.spec.address, num_cpus=launch.spec.num_cpus, dashboard=ray_dashboard)
        if progress:
            print_dashboards(launch.run.path, launch.spec.address, ray_dashboard)
        PendingWatch.verdicts.pop(str(launch.run.path), None)
        budget_s = launch.space.budget.time_budget_s
        if budget_s is not None:  # what the earlier sessions of the run left
            TimeBudget.remaining[launch.run.name] = budget_s - launch.prior_wall
        try:
            _tuner(launch, progress, restore).fit()
        except Exception as e:  # the searcher's state could not be saved: report, then one line
            stopped = _stopped_by(e)
            if stopped is None:
                raise
            PendingWatch.verdicts.pop(str(launch.run.path), None)
            done = _finish(launch, reports)
            raise type(stopped)(f"{stopped.message}; run: {done.run_dir}; report: "
                                f"{done.report_dir / 'index.html'}", field=stopped.field) from None
        stuck = PendingWatch.verdicts.pop(str(launch.run.path), None)
        result = _finish(launch, reports)
    finally:  # the run is free for a resume in this process too (a test, a notebook)
        _release(launch.lock)
    if stuck is not None:  # the run and its report are written; the search did not finish
        raise UserError(stuck[1], file=launch.space.source, field=stuck[0])
    return result


def _stopped_by(error: BaseException):
    """The :class:`~archsearch.errors.SearchStopped` that ``error`` is or was caused by (Tune
    may wrap what a searcher raised), or ``None``."""
    from archsearch.errors import SearchStopped

    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, SearchStopped):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def check_reports_dir(reports: str | Path) -> None:
    """Check that a report can be written under ``reports``, creating nothing: it is a
    writable directory, or its nearest existing ancestor is (the report creates the rest). A bad
    ``--reports`` is found before the search, not when its report is written at the end.

    Raises:
        UserError: ``reports`` (or an ancestor) is a file, or not writable (field ``--reports``).
    """
    path = Path(reports).expanduser().absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"reports directory is not writable ({existing} is a file)",
                        file=str(path), field="--reports")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"reports directory is not writable (no write permission in {existing})",
                        file=str(path), field="--reports")


def run_search(space: SearchSpace, *, searcher: str = "gp", trials: int | None = None,
               address: str | None = None, name: str | None = None, storage: str | Path = "runs",
               reports: str | Path = "reports", progress: bool = True,
               cpus_per_trial: float | None = None, gpus_per_trial: float | None = None,
               num_cpus: int | None = None, ray_dashboard: bool = False,
               fixed: dict[str, Any] | None = None, history=()) -> RunResult:
    """Run a whole search and write its report (``fixed``: the ``--fixed`` config the space
    was pinned with, recorded in the run spec; ``history``: earlier run directories whose
    finished trials warm-start the searcher, ``--history``).

    Raises:
        UserError: see :func:`start_run` and :func:`check_reports_dir`; a trial that waited longer than
            ``budget.pending_timeout_s`` for resources no node has (the run and its report are
            written first).
    """
    check_reports_dir(reports)
    launch = start_run(space, searcher=searcher, trials=trials, address=address, name=name, history=history,
                       storage=storage, cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial,
                       num_cpus=num_cpus, fixed=fixed, ray=True, ray_dashboard=ray_dashboard)
    return _fit(launch, progress=progress, ray_dashboard=ray_dashboard, restore=False, reports=reports)


def resume_search(run_dir: str | Path, *, address: str | None = None,
                  reports: str | Path = "reports", progress: bool = True,
                  num_cpus: int | None = None, ray_dashboard: bool = False) -> RunResult:
    """Continue a search whose driver stopped (Ctrl-C, SIGKILL, a lost head node).

    Ray Tune restores the experiment (trial table, searcher state, checkpoints): finished
    trials are kept, unfinished ones continue from their last checkpoint, and the searcher
    resumes with its saved state, with the run spec's resources and address.

    Raises:
        UserError: see :func:`reopen_run` and :func:`check_reports_dir`.
    """
    check_reports_dir(reports)
    launch = reopen_run(run_dir, address=address, num_cpus=num_cpus, ray=True,
                        ray_dashboard=ray_dashboard)
    return _fit(launch, progress=progress, ray_dashboard=ray_dashboard, restore=True, reports=reports)


# ---------------------------------------------------------------------- end of a run
LOST_REASON = ("lost: the driver stopped before Ray Tune recorded this trial, and the resumed "
               "search ended before it could run it again")


def reconcile(run: RunDir, trials: int) -> None:
    """Leave no trial looking RUNNING that will never run again, in the trial records and in
    the Optuna study (:class:`archsearch.search.adapters.ray.StudyRecord`).

    * A study trial still RUNNING whose record says ERROR is marked ``FAIL`` with the record's
      error (the run's :class:`~archsearch.tune.callbacks.TrialRecorder` does this when the
      error happens; this catches a driver that stopped in between).
    * After a search that ran all its ``trials``, a trial can still look RUNNING only if the
      driver died after it was suggested and before Tune's experiment save reached storage,
      and the resumed search ended before running it again (a resumed search runs such
      trials first: :mod:`archsearch.search.adapters.ray`): its record becomes ERROR and its
      study trial ``FAIL``, both with :data:`LOST_REASON` (a record the study does not hold
      is added to it as ``FAIL``, unless a study trial took it over under a new id: its
      ``replaces``), and so does any other study trial still RUNNING (suggested, never
      started), so nothing is silently dropped or double-counted.

    A search stopped early (Ctrl-C) keeps its RUNNING trials: resume continues them.
    """
    import optuna

    from archsearch.search.adapters.ray import StudyRecord

    recs = run.read_trials()
    orphans = [r for r in recs if r["status"] == RUNNING]
    complete = len(recs) - len(orphans) >= trials
    if complete:
        for rec in orphans:
            rec["status"], rec["error"] = ERROR, LOST_REASON
            run.write_trial(rec)
    if not run.optuna_db.is_file():
        return
    record = StudyRecord(run.optuna_url, run.name)
    if record.study is None:  # no trial was ever suggested: no study yet
        return
    errors = {r["trial_id"]: r.get("error") or LOST_REASON for r in recs if r["status"] == ERROR}
    running = record.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for tid in [t.user_attrs.get("trial_id") for t in running]:
        if tid is not None and (tid in errors or complete):
            record.fail(tid, errors.get(tid, LOST_REASON))
    if complete:
        taken_over = {old for t in record.study.get_trials(deepcopy=False)
                      for old in t.user_attrs.get("replaces") or []}
        for rec in orphans:  # one the study does not hold is added as FAIL; others unchanged
            if rec["trial_id"] not in taken_over:
                record.fail(rec["trial_id"], LOST_REASON)


def stop_unfinished(run: RunDir, space: SearchSpace, time_budget_s: float) -> None:
    """Finish the trials a search's ``budget.time_budget_s`` cut off. Ray Tune stops them
    (TERMINATED in its own state, so a resume does not continue them) without telling the
    callbacks or the searcher, which would leave their records and Optuna trials RUNNING. A
    trial that reported >= 1 epoch becomes ``STOPPED`` (a valid point with fewer epochs, like
    an ASHA stop) and its Optuna trial ``PRUNED`` with its constraint values, as the searcher
    records an ASHA-stopped trial; one that reported none becomes ``ERROR`` and ``FAIL``,
    saying the time budget stopped it."""
    from archsearch.search.adapters.ray import StudyRecord

    record = StudyRecord(run.optuna_url, run.name) if run.optuna_db.is_file() else None
    for rec in run.read_trials():
        if rec["status"] != RUNNING:
            continue
        done = int(rec["metrics"].get("epoch") or 0) if rec["history"] else 0
        if done:
            rec["status"], rec["error"] = STOPPED, None
        else:
            rec["status"] = ERROR
            rec["error"] = (f"stopped: the search's time budget (budget.time_budget_s = "
                            f"{time_budget_s:g} s) ran out before this trial's first epoch")
        run.write_trial(rec)
        if record is None or record.study is None:
            continue
        if done:
            record.finish(rec["trial_id"], rec["metrics"], state="PRUNED",
                          fidelity=min(1.0, done / max(1, space.budget.epochs)),
                          constraints=space.constraint_values(rec["metrics"]))
        else:
            record.fail(rec["trial_id"], rec["error"])


def _finish(launch: Launch, reports: str | Path) -> RunResult:
    from archsearch.report import report_run

    b = launch.space.budget
    spent = launch.prior_wall + (time.time() - launch.t0)
    if b.time_budget_s is not None and spent >= b.time_budget_s:  # Tune's stopper fired
        stop_unfinished(launch.run, launch.space, b.time_budget_s)
    reconcile(launch.run, b.trials)
    launch.spec.wall_seconds = launch.prior_wall + (time.time() - launch.t0)
    launch.run.write_spec(launch.spec)
    report_dir, summary = report_run(launch.run.path, reports)
    from archsearch.tune.weights import keep_weights

    disk = keep_weights(launch.run, b.keep_weights, summary)
    return RunResult(launch.run.path, report_dir, summary, launch.spec.wall_seconds, disk)
