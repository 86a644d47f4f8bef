"""Run a search: local Ray (or a cluster), a Ray Tune ``Tuner``, an Optuna study, a report.

One run directory holds everything about a run::

    RUN_DIR/
      run.json          what was asked (space file, searcher, trials, seed) and wall time
      space.yaml        a copy of the search space
      optuna.db         the Optuna RDBStorage (SQLite) study, for `archsearch dashboard`
      tune/             Ray Tune's experiment directory (results, checkpoints)
      trials/ID.json    one record per trial: config, status, history, error

and the report lands in ``reports/<run-name>/``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from archsearch.errors import UserError
from archsearch.space import SearchSpace

SEARCHERS = ("random", "tpe", "nsga2", "ahto", "qnehvi")

#: Keys Ray Tune adds to every result; everything else a trial reports is recorded.
RAY_RESULT_KEYS = frozenset({
    "time_this_iter_s", "training_iteration", "timestamp", "date", "done",
    "trial_id", "experiment_id", "pid", "hostname", "node_ip", "config", "time_since_restore",
    "iterations_since_restore", "checkpoint_dir_name", "should_checkpoint", "experiment_tag",
    "timesteps_total", "episodes_total", "timesteps_since_restore",
})


def ray_env() -> None:
    """Environment for local and test Ray sessions (no token auth, no usage stats)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # Ray Tune: do not print the big status table; we draw our own progress.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # Save Tune's experiment state (trial table + searcher) every second instead of every
    # >= 10 s, so a driver killed soon after a trial started can resume that same trial.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")


def check_address(address: str | None, timeout_s: float = 3.0) -> None:
    """Fail fast when nothing listens at ``--address`` (Ray itself retries for minutes).

    ``auto`` is left to Ray (it fails at once when no local cluster runs); ``HOST:PORT`` and
    ``ray://HOST:PORT`` get a TCP connect with ``timeout_s``.

    Raises:
        UserError: malformed address, or no answer at HOST:PORT.
    """
    import socket

    if address is None or address == "auto":
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UserError("expected auto, HOST:PORT or ray://HOST:PORT", file=address, field="--address")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        raise UserError(f"no Ray cluster answers there ({e.strerror or e.__class__.__name__})",
                        file=address, field="--address") from None


def init_ray(address: str | None, *, num_cpus: int | None = None, dashboard: bool = False,
             dashboard_host: str = "127.0.0.1") -> None:
    """Start local Ray (``address=None``) or connect to a cluster.

    Raises:
        UserError: nothing answers at ``address``.
    """
    ray_env()
    import ray

    if ray.is_initialized():
        return
    check_address(address)
    if address is None:
        if dashboard_host not in ("127.0.0.1", "localhost"):
            print(f"warning: Ray dashboard bound to {dashboard_host}: Ray has no authentication; "
                  "anyone who can reach this port can run code on this machine", file=sys.stderr)
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(),
                 include_dashboard=dashboard, dashboard_host=dashboard_host,
                 log_to_driver=False, logging_level="ERROR")
    else:
        try:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        except Exception as e:  # Ray raises ConnectionError, RuntimeError or ValueError here
            raise UserError(f"no Ray cluster answers there ({e.__class__.__name__})",
                            file=address, field="--address") from None


def make_searcher(name: str, space: SearchSpace, *, storage, study_name: str, seed: int):
    """Ray Tune searcher for ``--searcher``: Optuna samplers through Ray's ``OptunaSearch``,
    recording every trial in the Optuna ``storage`` (the dashboard reads it).

    Raises:
        UserError: unknown searcher name.
    """
    import optuna
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    if name in ("ahto", "qnehvi"):  # archsearch.search core; records into the same storage
        from archsearch.search import make
        from archsearch.search.adapters.ray import RaySearcher
        from archsearch.search.known_costs import transformer_cost_fn

        core = make(name, space, seed=seed, cost_fn=transformer_cost_fn(prepare_data(space), space.fixed))
        alg = RaySearcher(core, epochs=space.budget.epochs, storage=storage, study_name=study_name)
        return ConcurrencyLimiter(alg, max_concurrent=space.budget.max_concurrent)
    if name == "random":
        sampler = optuna.samplers.RandomSampler(seed=seed)
    elif name == "tpe":
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(6, space.budget.trials),
                                             multivariate=True)
    elif name == "nsga2":
        pop = max(4, min(20, space.budget.trials // 3))
        sampler = optuna.samplers.NSGAIISampler(seed=seed, population_size=pop)
    else:
        raise UserError(f"unknown searcher {name!r}; choose one of {', '.join(SEARCHERS)}",
                        field="--searcher")
    metrics, modes = space.metric_names, space.modes
    alg = OptunaSearch(space=space.suggest, metric=metrics if len(metrics) > 1 else metrics[0],
                       mode=modes if len(modes) > 1 else modes[0], sampler=sampler,
                       storage=storage, study_name=study_name, seed=seed)
    return ConcurrencyLimiter(alg, max_concurrent=space.budget.max_concurrent)


def _atomic_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=_json_default))
    os.replace(tmp, path)


def _json_default(o):
    try:
        return float(o)
    except Exception:
        return str(o)


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def error_line(trace: str) -> str:
    """The ``SomeError: message`` line of a (Ray-wrapped) traceback, or its last line."""
    import re

    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Interrupt|Exit)(\([\w.]+\))?: ", ln):
            return re.sub(r"\x1b\[[0-9;]*m", "", ln)
    return lines[-1] if lines else "unknown error"


def read_trials(run_dir: Path) -> list[dict]:
    """All trial records of a run, in the order the trials started."""
    out = []
    for p in sorted((Path(run_dir) / "trials").glob("*.json")):
        out.append(json.loads(p.read_text()))
    out.sort(key=lambda r: (r.get("started", 0), r["trial_id"]))
    return out


@dataclass
class RunResult:
    run_dir: Path
    report_dir: Path
    summary: dict
    wall_seconds: float


def make_callbacks(run_dir: Path, space: SearchSpace, progress: bool):
    """Tune callbacks: one that records each trial to ``trials/ID.json`` and one that draws a
    rich progress line (trials done / running / failed, best so far)."""
    from ray.tune import Callback

    epochs = space.budget.epochs

    class Recorder(Callback):
        def __init__(self):
            self.records: dict[str, dict] = {}
            (run_dir / "trials").mkdir(parents=True, exist_ok=True)
            for r in read_trials(run_dir):
                self.records[r["trial_id"]] = r

        def __setstate__(self, state):
            self.__dict__.update(state)
            self.records = {r["trial_id"]: r for r in read_trials(run_dir)}  # disk is the truth

        def _rec(self, trial) -> dict:
            rec = self.records.get(trial.trial_id)
            if rec is None:
                rec = {"trial_id": trial.trial_id, "status": "RUNNING",
                       "config": {k: v for k, v in trial.config.items() if v is not None},
                       "metrics": {}, "history": [], "error": None, "started": time.time()}
                self.records[trial.trial_id] = rec
            return rec

        def _write(self, rec):
            _atomic_json(run_dir / "trials" / f"{rec['trial_id']}.json", rec)

        def on_trial_start(self, iteration, trials, trial, **info):
            self._write(self._rec(trial))

        def on_trial_result(self, iteration, trials, trial, result, **info):
            rec = self._rec(trial)
            m = {k: _clean(v) for k, v in result.items() if k not in RAY_RESULT_KEYS}
            # a retried trial reports its epochs again: keep one entry per epoch
            rec["history"] = [h for h in rec["history"] if h.get("epoch") != m.get("epoch")] + [m]
            rec["metrics"] = m
            self._write(rec)

        def on_trial_complete(self, iteration, trials, trial, **info):
            rec = self._rec(trial)
            done_epochs = rec["metrics"].get("epoch", 0) or 0
            rec["status"] = "TERMINATED" if done_epochs >= epochs else "STOPPED"
            self._write(rec)

        def on_trial_error(self, iteration, trials, trial, **info):
            rec = self._rec(trial)
            rec["status"] = "ERROR"
            err = None
            local = getattr(trial, "error_file", None)  # written by Tune before this callback
            if local and os.path.isfile(local):
                with open(local) as f:
                    err = f.read()
            err = err or trial.get_error() or "unknown error"
            rec["error"] = error_line(str(err))
            self._write(rec)

    class Progress(Callback):
        def __init__(self, recorder: Recorder):
            self.recorder = recorder
            self.bar = None  # created on first use: Tune pickles callbacks, rich holds locks
            self.task = None

        def __getstate__(self):
            return {**self.__dict__, "bar": None, "task": None}

        def _start(self, desc: str):
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress
            from rich.progress import TextColumn, TimeElapsedColumn

            self.bar = RichProgress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
                                    TimeElapsedColumn(), TextColumn("{task.description}"),
                                    console=Console(stderr=True), transient=False)
            self.bar.start()
            self.task = self.bar.add_task(desc, total=space.budget.trials)

        def _update(self):
            recs = list(self.recorder.records.values())
            done = [r for r in recs if r["status"] in ("TERMINATED", "STOPPED")]
            failed = [r for r in recs if r["status"] == "ERROR"]
            running = [r for r in recs if r["status"] == "RUNNING"]
            best = ""
            obj = space.objectives[0]
            vals = [r["metrics"].get(obj.metric) for r in recs if r["status"] != "ERROR"]
            vals = [v for v in vals if isinstance(v, (int, float))]
            if vals:
                b = max(vals) if obj.mode == "max" else min(vals)
                best = f"best {obj.metric} {b:.4g}"
            desc = f"running {len(running)}  failed {len(failed)}  {best}"
            if self.bar is None:
                self._start(desc)
            self.bar.update(self.task, completed=len(done) + len(failed), description=desc)

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

    rec = Recorder()
    return [rec, Progress(rec)] if progress else [rec]


def settings_for(space: SearchSpace, cpus_per_trial: float | None = None) -> dict[str, Any]:
    b = space.budget
    cpus = cpus_per_trial or b.cpus_per_trial
    return {"epochs": b.epochs, "batch_size": b.batch_size, "steps_per_epoch": b.steps_per_epoch,
            "latency_batch_size": b.latency_batch_size, "seed": space.seed,
            "threads": max(1, int(cpus)), "fixed": dict(space.fixed)}


def prepare_data(space: SearchSpace):
    """Load and tokenize the space's dataset once (cached on disk)."""
    from archsearch.data import prepare

    import dataclasses

    ds = space.dataset
    data = prepare(ds.name, vocab_size=ds.vocab_size, max_len=ds.max_len, tokenizer=ds.tokenizer,
                   text_column=ds.text_column, label_column=ds.label_column, task=space.task)
    if data.task != space.task:
        raise UserError(f"dataset {ds.name!r} is a {data.task} dataset but the space's task is "
                        f"{space.task!r}", file=space.source, field="task")
    n = ds.max_train_samples
    if n is not None:  # a fixed subset of the training split (quick runs and tests)
        train = data.train
        if data.task == "lm":
            train = train[:n]
        else:
            train = dataclasses.replace(train, input_ids=train.input_ids[:n],
                                        attention_mask=train.attention_mask[:n], labels=train.labels[:n])
        data = dataclasses.replace(data, data={**data.data, "train": train})
    return data


def smallest_config(space: SearchSpace) -> dict[str, Any]:
    """The config with every numeric param at its low end and every numeric categorical at its
    smallest choice (non-numeric categoricals: the first choice): the cheapest architecture
    the space can produce, since params and FLOPs grow with every size knob."""
    from archsearch.space import CategoricalParam

    cfg: dict[str, Any] = {}
    for key, p in space.params.items():
        if not space.active(key, cfg):
            continue
        if isinstance(p, CategoricalParam):
            nums = [c for c in p.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
            cfg[key] = min(nums) if len(nums) == len(p.choices) else p.choices[0]
        else:
            cfg[key] = p.low
    return cfg


COST_METRICS = ("params_total", "params_trainable", "flops_per_sample")


def check_constraints(space: SearchSpace, data) -> None:
    """Refuse constraints that no configuration can meet, before anything is launched.

    Only the costs the cost model knows without training are checked (``params_total``,
    ``params_trainable``, ``flops_per_sample`` at full length, untied): the smallest
    architecture of the space must satisfy every ``max``.

    Raises:
        UserError: naming ``constraints.METRIC.max``, with the smallest achievable value.
    """
    wanted = {m: b for m, b in space.constraints.items() if m in COST_METRICS and b.max is not None}
    if not wanted:
        return
    from archsearch.models import costs
    from archsearch.models.transformer import Transformer
    from archsearch.tune.trainable import DEFAULTS, model_config

    cfg = {**DEFAULTS, **space.fixed, **smallest_config(space)}
    try:
        mcfg = model_config(cfg, data)
    except ValueError as e:
        raise UserError(f"the smallest architecture is invalid: {e}", file=space.source,
                        field="params") from None
    values = {"flops_per_sample": costs.flops_per_sample(mcfg, mcfg.max_len)}
    model = Transformer(mcfg)
    values["params_total"] = costs.params_total(model)
    values["params_trainable"] = costs.params_trainable(model)
    if str(cfg.get("tying", "none")) != "none":
        values.pop("params_trainable")  # tying can lower it below the untied count
    for metric, bound in wanted.items():
        if metric in values and values[metric] > bound.max:
            raise UserError(f"no configuration can meet max {bound.max:g}: the smallest "
                            f"architecture in params has {values[metric]:,.0f}",
                            file=space.source, field=f"constraints.{metric}.max")


def check_run_dir(storage: str | Path, name: str) -> Path:
    """The new run directory ``storage/name``.

    Raises:
        UserError: it exists already (a run is never appended to by accident) or
            ``storage`` is not writable.
    """
    root = Path(storage).expanduser().resolve()
    run_dir = root / name
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UserError("a run with this name exists; pick another --name or resume it with "
                        f"`archsearch resume {run_dir}`", file=str(run_dir), field="--name")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise UserError(f"storage path is not writable ({e.strerror})", file=str(root),
                        field="--storage") from None
    return run_dir


def run_search(space: SearchSpace, *, searcher: str = "tpe", trials: int | None = None,
               address: str | None = None, name: str | None = None, storage: str | Path = "runs",
               reports: str | Path = "reports", progress: bool = True,
               cpus_per_trial: float | None = None, gpus_per_trial: float | None = None,
               num_cpus: int | None = None, ray_dashboard: bool = False) -> RunResult:
    """Run a whole search and write its report. See the module docstring for the layout.

    Raises:
        UserError: bad searcher, existing run name, unwritable storage, unreachable cluster,
            unreadable dataset.
    """
    if searcher not in SEARCHERS:
        raise UserError(f"unknown searcher {searcher!r}; choose one of {', '.join(SEARCHERS)}",
                        field="--searcher")
    if trials is not None:
        space = space.model_copy(update={"budget": space.budget.model_copy(update={"trials": trials})})
    name = name or f"{space.name}-{searcher}-{time.strftime('%Y%m%d-%H%M%S')}"
    t0 = time.time()
    check_address(address)
    data = prepare_data(space)
    check_constraints(space, data)
    run_dir = check_run_dir(storage, name)
    if space.source:
        shutil.copyfile(space.source, run_dir / "space.yaml")
    else:
        import yaml

        (run_dir / "space.yaml").write_text(yaml.safe_dump(space.model_dump(mode="json")))
    info = {"name": name, "searcher": searcher, "space_file": space.source, "trials": space.budget.trials,
            "seed": space.seed, "address": address, "started": t0, "argv": sys.argv}
    _atomic_json(run_dir / "run.json", info)

    init_ray(address, num_cpus=num_cpus, dashboard=ray_dashboard)
    _print_dashboards(run_dir, address, ray_dashboard, progress)
    tuner = _new_tuner(space, run_dir, name, searcher, data, progress, cpus_per_trial, gpus_per_trial)
    tuner.fit()
    return _finish(run_dir, info, reports, t0)


def _print_dashboards(run_dir: Path, address: str | None, ray_dashboard: bool, progress: bool) -> None:
    if not progress:
        return
    if address is None and ray_dashboard:
        import ray

        url = getattr(ray.get_runtime_context(), "dashboard_url", None) or "127.0.0.1:8265"
        print(f"Ray dashboard:    http://{url}", file=sys.stderr)
    print(f"Optuna dashboard: archsearch dashboard {run_dir}", file=sys.stderr)


def _trainable(space: SearchSpace, data, cpus_per_trial, gpus_per_trial):
    from ray import tune

    from archsearch.tune.trainable import train_trial

    b = space.budget
    cpus = cpus_per_trial or b.cpus_per_trial
    gpus = gpus_per_trial if gpus_per_trial is not None else b.gpus_per_trial
    return tune.with_resources(
        tune.with_parameters(train_trial, data=data, settings=settings_for(space, cpus)),
        {"cpu": cpus, "gpu": gpus})


def _new_tuner(space, run_dir, name, searcher, data, progress, cpus_per_trial, gpus_per_trial):
    import optuna
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage_obj = optuna.storages.RDBStorage(f"sqlite:///{run_dir / 'optuna.db'}")
    alg = make_searcher(searcher, space, storage=storage_obj, study_name=name, seed=space.seed)
    b = space.budget
    scheduler = None
    if b.scheduler == "asha" and b.epochs > b.grace_period:
        obj = space.objectives[0]
        scheduler = ASHAScheduler(metric=obj.metric, mode=obj.mode, time_attr="training_iteration",
                                  max_t=b.epochs, grace_period=b.grace_period,
                                  reduction_factor=b.reduction_factor)
    return tune.Tuner(
        _trainable(space, data, cpus_per_trial, gpus_per_trial),
        tune_config=tune.TuneConfig(search_alg=alg, scheduler=scheduler, num_samples=b.trials,
                                    reuse_actors=True, time_budget_s=b.time_budget_s),
        run_config=tune.RunConfig(
            name="tune", storage_path=str(run_dir), verbose=0,
            callbacks=make_callbacks(run_dir, space, progress),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            failure_config=tune.FailureConfig(max_failures=b.max_failures)),
    )


def _reconcile(run_dir: Path, study_name: str) -> None:
    """After a search ends, no trial may still look RUNNING. One can only if the driver died
    in the instant between a trial's start and Tune's next experiment save, so the resumed
    Tune never knew it: record it as failed (with that reason) in the trial records and in
    the Optuna study, so nothing is silently dropped or double-counted."""
    import optuna

    orphans = [r for r in read_trials(run_dir) if r["status"] == "RUNNING"]
    if not orphans:
        return
    reason = ("lost: the driver stopped before Ray Tune recorded this trial, so it could not "
              "be resumed; the searcher proposed a new trial instead")
    for rec in orphans:
        rec["status"], rec["error"] = "ERROR", reason
        _atomic_json(run_dir / "trials" / f"{rec['trial_id']}.json", rec)
    storage = optuna.storages.RDBStorage(f"sqlite:///{run_dir / 'optuna.db'}")
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:  # a searcher that keeps no Optuna study
        return
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        storage.set_trial_user_attr(t._trial_id, "error", reason)
        storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)


def _finish(run_dir: Path, info: dict, reports, t0: float) -> RunResult:
    _reconcile(run_dir, info["name"])
    wall = time.time() - t0
    info["wall_seconds"] = info.get("wall_seconds_before_resume", 0.0) + wall
    _atomic_json(run_dir / "run.json", info)
    report_dir, summary = make_report(run_dir, reports)
    return RunResult(run_dir, report_dir, summary, info["wall_seconds"])


def resume_search(run_dir: str | Path, *, address: str | None = None,
                  reports: str | Path = "reports", progress: bool = True,
                  num_cpus: int | None = None, ray_dashboard: bool = False) -> RunResult:
    """Continue a search whose driver stopped (Ctrl-C, SIGKILL, a lost head node).

    Ray Tune restores the experiment from ``RUN_DIR/tune`` (trial table, searcher state,
    checkpoints): finished trials are kept, unfinished ones continue from their last checkpoint,
    and the searcher resumes with its saved state.

    Raises:
        UserError: ``run_dir`` is not a resumable run directory.
    """
    from archsearch.space import load_space

    run_dir = Path(run_dir).expanduser().resolve()
    if not (run_dir / "run.json").is_file() or not (run_dir / "space.yaml").is_file():
        raise UserError("not a run directory (no run.json / space.yaml)", file=str(run_dir))
    tune_dir = run_dir / "tune"
    if not (tune_dir / "tuner.pkl").is_file():
        raise UserError("the search never started (no tune/tuner.pkl): start it again with "
                        "`archsearch search`", file=str(run_dir))
    info = json.loads((run_dir / "run.json").read_text())
    space = load_space(run_dir / "space.yaml")
    t0 = time.time()
    info["wall_seconds_before_resume"] = info.get("wall_seconds") or (
        max(0.0, _last_activity(run_dir) - info.get("started", t0)))
    info.setdefault("resumed", []).append(t0)
    _atomic_json(run_dir / "run.json", info)
    data = prepare_data(space)
    init_ray(address or info.get("address"), num_cpus=num_cpus, dashboard=ray_dashboard)
    _print_dashboards(run_dir, address, ray_dashboard, progress)
    from ray import tune

    tuner = tune.Tuner.restore(str(tune_dir), trainable=_trainable(space, data, None, None),
                               resume_unfinished=True, resume_errored=False, restart_errored=False)
    tuner.fit()
    return _finish(run_dir, info, reports, t0)


def _rel(path) -> str:
    """``path`` relative to the working directory when it is inside it (reports are shared)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _last_activity(run_dir: Path) -> float:
    times = [p.stat().st_mtime for p in (run_dir / "trials").glob("*.json")]
    return max(times) if times else time.time()


def make_report(run_dir: str | Path, reports: str | Path = "reports",
                out_dir: str | Path | None = None) -> tuple[Path, dict]:
    """Write ``reports/<run-name>/`` from a run directory; returns (report dir, pareto.json).

    Raises:
        UserError: ``run_dir`` is not a run directory.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "run.json").is_file():
        raise UserError("not a run directory (no run.json)", file=str(run_dir))
    from archsearch.report import write_report
    from archsearch.space import load_space

    info = json.loads((run_dir / "run.json").read_text())
    space = load_space(run_dir / "space.yaml")
    out = Path(out_dir) if out_dir else Path(reports) / info["name"]
    out.mkdir(parents=True, exist_ok=True)
    run_info = {**info, "space_file": _rel(info.get("space_file") or run_dir / "space.yaml"),
                "run_dir": _rel(run_dir), "wall_time_s": info.get("wall_seconds"),
                "scheduler": space.budget.scheduler,
                "latency_batch_size": space.budget.latency_batch_size}
    for key in ("argv", "started", "wall_seconds", "wall_seconds_before_resume", "resumed"):
        run_info.pop(key, None)
    if info.get("started"):
        run_info["started"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"]))
    summary = write_report(
        read_trials(run_dir),
        [o.model_dump(exclude_none=True) for o in space.objectives],
        out,
        constraints={k: v.model_dump(exclude_none=True) for k, v in space.constraints.items()},
        run_info=run_info,
    )
    return out, summary
