"""Ray Tune callbacks: one records each trial in the run directory, one draws progress.

:class:`TrialRecorder` writes ``trials/ID.json`` (through :class:`archsearch.runs.RunDir`) at
every start, result, completion and error (and removes the record of a trial that a resumed
search runs again under a new id); the records are what reports, ``archsearch
compare`` and the fault checks read. It also finishes the Optuna study trial of a trial that
errored as ``FAIL`` with the error line as user attribute ``error``
(:meth:`archsearch.search.adapters.ray.StudyRecord.fail`): Ray Tune tells the searcher about
the error first, without the message, so the Ray adapter leaves that ``FAIL`` to this callback
(``RaySearcher(fail_errors=False)``, as :func:`archsearch.tune.searchers.tune_searcher`
builds it). :class:`ProgressBar` draws one rich line (trials done,
running, failed, best objective so far) on stderr.
"""

from __future__ import annotations

import os
import re

from ray.tune import Callback

from archsearch.metrics import is_number
from archsearch.runs import ERROR, FINISHED, RUNNING, STOPPED, TERMINATED, RunDir, new_trial_record
from archsearch.search.adapters.ray import StudyRecord

#: Keys Ray Tune adds to every result; everything else a trial reports is recorded.
RAY_RESULT_KEYS = frozenset({
    "time_this_iter_s", "training_iteration", "timestamp", "date", "done",
    "trial_id", "experiment_id", "pid", "hostname", "node_ip", "config", "time_since_restore",
    "iterations_since_restore", "checkpoint_dir_name", "should_checkpoint", "experiment_tag",
    "timesteps_total", "episodes_total", "timesteps_since_restore",
})


def error_line(trace: str) -> str:
    """The ``SomeError: message`` line of a (Ray-wrapped) traceback, or its last line."""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Interrupt|Exit)(\([\w.]+\))?: ", ln):
            return re.sub(r"\x1b\[[0-9;]*m", "", ln)
    return lines[-1] if lines else "unknown error"


class TrialRecorder(Callback):
    """Record every trial to the run directory (the disk is the truth after a resume).

    Args:
        run: the run directory.
        epochs: the full budget; a trial completed with fewer epochs was stopped early
            (status ``STOPPED``), otherwise ``TERMINATED``.
        study: record errors in the run's Optuna study (``run.optuna_url``, study ``run.name``).
    """

    def __init__(self, run: RunDir, epochs: int, *, study: bool = True):
        self.run, self.epochs = run, int(epochs)
        self.records = {r["trial_id"]: r for r in run.read_trials()}
        self.study = StudyRecord(run.optuna_url, run.name) if study else None
        self.resumed = False  #: unpickled by ``Tuner.restore``: trials may be run again

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.records = {r["trial_id"]: r for r in self.run.read_trials()}
        self.resumed = True
        if "study" not in state:  # pickled by a version that did not record errors in the study
            self.study = StudyRecord(self.run.optuna_url, self.run.name)

    def _rec(self, trial) -> dict:
        rec = self.records.get(trial.trial_id)
        if rec is None:
            rec = self.records[trial.trial_id] = new_trial_record(trial.trial_id, trial.config)
        return rec

    def on_trial_start(self, iteration, trials, trial, **info):
        rec = self._rec(trial)
        rec["status"], rec["error"] = RUNNING, None  # also a trial Tune retries or resumes
        self.run.write_trial(rec)
        # a trial the resumed Tune had lost runs again under this id: its old record goes
        # (the Ray adapter re-keyed its Optuna trial: StudyRecord.rekey). Only a resumed
        # search does that: a fresh one skips the study lookup (one read of every trial)
        if not (self.resumed and self.study is not None):
            return
        for old in self.study.replaces(trial.trial_id):
            if old != trial.trial_id:
                self.records.pop(old, None)
                self.run.remove_trial(old)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        rec = self._rec(trial)
        m = {k: v for k, v in result.items() if k not in RAY_RESULT_KEYS}
        # a retried trial reports its epochs again: keep one entry per epoch
        rec["history"] = [h for h in rec["history"] if h.get("epoch") != m.get("epoch")] + [m]
        rec["metrics"] = m
        rec["pid"], rec["node_ip"] = result.get("pid"), result.get("node_ip")  # where it runs now
        self.run.write_trial(rec)

    def on_trial_complete(self, iteration, trials, trial, **info):
        rec = self._rec(trial)
        done_epochs = rec["metrics"].get("epoch", 0) or 0
        rec["status"] = TERMINATED if done_epochs >= self.epochs else STOPPED
        self.run.write_trial(rec)

    def on_trial_error(self, iteration, trials, trial, **info):
        rec = self._rec(trial)
        rec["status"] = ERROR
        err = None
        local = getattr(trial, "error_file", None)  # written by Tune before this callback
        if local and os.path.isfile(local):
            with open(local) as f:
                err = f.read()
        rec["error"] = error_line(str(err or trial.get_error() or "unknown error"))
        self.run.write_trial(rec)
        if self.study is not None:
            self.study.fail(trial.trial_id, rec["error"], result=rec["metrics"] or None)


class ProgressBar(Callback):
    """One rich progress line on stderr, from a :class:`TrialRecorder`'s records.

    Args:
        recorder: the run's recorder; total: trials expected; objective: the first objective
            (``space.objectives[0]``: ``metric`` and ``mode``) for "best so far".
    """

    def __init__(self, recorder: TrialRecorder, total: int, objective):
        self.recorder, self.total = recorder, int(total)
        self.metric, self.mode = objective.metric, objective.mode
        self.bar = None  # created on first use: Tune pickles callbacks, rich holds locks
        self.task = None

    def __getstate__(self):
        return {**self.__dict__, "bar": None, "task": None}

    def _start(self, desc: str):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.description}"),
                            console=Console(stderr=True), transient=False)
        self.bar.start()
        self.task = self.bar.add_task(desc, total=self.total)

    def _update(self):
        recs = list(self.recorder.records.values())
        count = {s: sum(r["status"] == s for r in recs) for s in (RUNNING, ERROR)}
        done = sum(r["status"] in FINISHED for r in recs)
        vals = [r["metrics"].get(self.metric) for r in recs if r["status"] != ERROR]
        vals = [v for v in vals if is_number(v)]
        best = f"best {self.metric} {(max if self.mode == 'max' else min)(vals):.4g}" if vals else ""
        desc = f"running {count[RUNNING]}  failed {count[ERROR]}  {best}"
        if self.bar is None:
            self._start(desc)
        self.bar.update(self.task, completed=done + count[ERROR], description=desc)

    def on_step_end(self, iteration, trials, **info):
        if iteration % 20 == 0:
            self._update()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._update()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._update()

    def on_trial_error(self, iteration, trials, trial, **info):
        self._update()

    def on_experiment_end(self, trials, **info):
        self._update()
        if self.bar is not None:
            self.bar.stop()
