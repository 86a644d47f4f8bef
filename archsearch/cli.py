"""Command line: ``archsearch search | check | resume | submit | logs | report | export | predict | serve | compare | dashboard | data``.

Only typer is imported at module level; torch, Ray, Optuna and BoTorch are imported inside the
commands, so ``archsearch --help`` answers fast. A :class:`~archsearch.errors.UserError` is
printed as one line (``FILE: FIELD: message``) with exit code 2, never as a traceback. A
``search`` or ``resume`` in which no trial succeeded still writes its run directory and report,
then exits with code 1 and one line saying so and where they are.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import List, Optional

import typer

from archsearch.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Search transformer architectures that are accurate and cheap.")
data_app = typer.Typer(no_args_is_help=True, help="Bundled and local datasets.")
app.add_typer(data_app, name="data")


@app.command()
def search(
    space_file: Path = typer.Argument(..., help="Search space YAML (see search_spaces/)."),
    searcher: str = typer.Option("gp", help="gp (default: Optuna GPSampler) | ahto | qnehvi | random | tpe | nsga2"),
    trials: Optional[int] = typer.Option(None, min=1, help="Override budget.trials."),
    address: Optional[str] = typer.Option(None, help="Ray cluster: auto | HOST:PORT | ray://... "
                                          "(default: start local Ray)."),
    name: Optional[str] = typer.Option(None, help="Run name (default: SPACE-SEARCHER-TIME)."),
    storage: Path = typer.Option(Path("runs"), help="Where run directories go (shared path on a cluster)."),
    reports: Path = typer.Option(Path("reports"), help="Where reports go."),
    cpus_per_trial: Optional[float] = typer.Option(None, help="Override budget.cpus_per_trial."),
    gpus_per_trial: Optional[float] = typer.Option(None, help="Override budget.gpus_per_trial."),
    ray_dashboard: bool = typer.Option(True, help="Start the Ray dashboard on 127.0.0.1:8265 (local Ray only)."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    fixed: Optional[str] = typer.Option(None, help="JSON config to pin (e.g. a Pareto trial's, "
                                        "from a report): re-runs exactly that architecture."),
    history: Optional[List[Path]] = typer.Option(
        None, help="An earlier run directory whose finished trials warm-start the searcher "
        "(gp, ahto, qnehvi: a transfer prior); repeat for several."),
):
    """Run an architecture search and write its Pareto-front report."""
    from archsearch.space import load_space, parse_fixed
    from archsearch.tune.runner import run_search

    space = load_space(space_file)
    pinned = None
    if fixed is not None:
        pinned = parse_fixed(fixed)
        space = space.pinned(pinned)
    res = run_search(space, searcher=searcher, trials=trials, address=address, name=name,
                     storage=storage, reports=reports, progress=progress,
                     cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial,
                     ray_dashboard=ray_dashboard, fixed=pinned, history=history or ())
    _print_summary(res.summary, res.report_dir, res.run_dir, res.wall_seconds, res.disk)
    _exit_if_nothing_succeeded(res)


@app.command()
def check(
    space_file: Path = typer.Argument(..., help="Search space YAML."),
    searcher: str = typer.Option("gp", help="gp (default: Optuna GPSampler) | ahto | qnehvi | random | tpe | nsga2"),
    trials: Optional[int] = typer.Option(None, min=1, help="Override budget.trials."),
    cpus_per_trial: Optional[float] = typer.Option(None, help="Override budget.cpus_per_trial."),
    gpus_per_trial: Optional[float] = typer.Option(None, help="Override budget.gpus_per_trial."),
    fixed: Optional[str] = typer.Option(None, help="JSON config to pin (as for `search`)."),
):
    """Run every check `search` makes before it launches anything (the space, --fixed, the
    searcher, checkpoints and tokenizer, the dataset, the constraints, one trial's resources
    against this machine), without starting Ray or writing a run; exit 0 when all pass. The
    dataset is prepared (tokenised and cached), so the search that follows starts faster. A
    cluster's resources are checked when `search --address` connects to it."""
    from archsearch.space import load_space, parse_fixed
    from archsearch.tune.preflight import check_resources, check_search, local_resources

    space = load_space(space_file)
    if fixed is not None:
        space = space.pinned(parse_fixed(fixed))
    space, data = check_search(space, searcher=searcher, address=None, trials=trials,
                               cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial)
    overridden = tuple(f for f, v in (("cpus_per_trial", cpus_per_trial),
                                      ("gpus_per_trial", gpus_per_trial)) if v is not None)
    check_resources(space, local_resources(), autoscaling=False, local=True, overridden=overridden)
    b = space.budget
    typer.echo(f"ok: {space_file}: {space.task} on {space.dataset.name} ({len(data.train):,} "
               f"training {'rows' if space.task == 'classification' else 'tokens'}); "
               f"{b.trials} trials, {b.cpus_per_trial:g} CPU and {b.gpus_per_trial:g} GPU each; "
               "Ray not started")


def _exit_if_nothing_succeeded(res) -> None:
    """Exit with code 1 and one stderr line when every trial of the run failed (or none ran):
    a search without a single result is not a success, even though its run and report exist."""
    n, failed = res.summary["n_trials"], res.summary["n_failed"]
    if n and failed < n:
        return
    from archsearch.runs import RunDir

    recs = RunDir(res.run_dir).read_trials()
    errors = [r["error"] for r in recs if r.get("error")]
    unfinished = sum(r["status"] == "RUNNING" for r in recs)
    what = f"all {n} trials failed" if n else "no trial ran"
    if unfinished:  # stopped early (Ctrl-C): a resume continues those trials
        what = (f"no trial succeeded: {unfinished} of {n} stopped unfinished (continue them: "
                f"archsearch resume {res.run_dir})")
    if errors:
        first = " ".join(str(errors[0]).split())
        what += f" (first error: {first[:150]}{'...' if len(first) > 150 else ''})"
    print(f"error: {what}; run: {res.run_dir}; report: {res.report_dir / 'index.html'}",
          file=sys.stderr)
    raise typer.Exit(1)


def _print_summary(summary: dict, report_dir: Path, run_dir: Path | None, wall: float | None,
                   disk: dict | None = None):
    from rich.console import Console
    from rich.table import Table

    from archsearch.report.values import to_float

    con = Console(markup=False)  # config values and paths are printed as they are ("[/bold]")
    objs = [o["metric"] for o in summary["objectives"]]
    t = Table(title=f"Pareto front ({len(summary['pareto'])} of {summary['n_trials']} trials, "
                    f"{summary['n_failed']} failed)")
    t.add_column("trial")
    for m in objs:
        t.add_column(m, justify="right")
    t.add_column("config")
    for p in summary["pareto"]:
        t.add_row(p["trial_id"], *[f"{to_float(p['metrics'].get(m)):.4g}" for m in objs],
                  ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in p["config"].items()))
    con.print(t)
    con.print(f"hypervolume {summary['hypervolume']:.6g} (reference point "
              f"{summary['reference_point']})")
    if wall is not None:
        con.print(f"wall time {wall:.0f} s")
    if disk is not None:
        con.print(f"disk:   {disk['run_mb']:.0f} MB (checkpoints {disk['tune_mb_before']:.0f} -> "
                  f"{disk['tune_mb_after']:.0f} MB: budget.keep_weights {disk['policy']} kept the "
                  f"weights of {len(disk['kept'])} trials)")
    if run_dir is not None:
        con.print(f"run:    {run_dir}")
    con.print(f"report: {report_dir / 'index.html'}")


@app.command()
def resume(
    run_dir: Path = typer.Argument(..., help="The run directory of a stopped search (runs/NAME)."),
    address: Optional[str] = typer.Option(None, help="Ray cluster (default: the run's own, or local)."),
    reports: Path = typer.Option(Path("reports"), help="Where reports go."),
    ray_dashboard: bool = typer.Option(True, help="Start the Ray dashboard on 127.0.0.1:8265 (local Ray only)."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
):
    """Continue a stopped search (driver killed, Ctrl-C) with the searcher's state restored and
    the settings it was started with (--fixed, --trials, resources per trial, --address)."""
    from archsearch.tune.runner import resume_search

    res = resume_search(run_dir, address=address, reports=reports, progress=progress,
                        ray_dashboard=ray_dashboard)
    _print_summary(res.summary, res.report_dir, res.run_dir, res.wall_seconds, res.disk)
    _exit_if_nothing_succeeded(res)


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="A run directory (runs/NAME)."),
    out: Optional[Path] = typer.Option(None, help="Report directory (default reports/NAME)."),
    reports: Path = typer.Option(Path("reports"), help="Where reports go."),
):
    """(Re)write the report of a run from its recorded trials."""
    from archsearch.report import report_run

    out_dir, summary = report_run(run_dir, reports, out)
    _print_summary(summary, out_dir, None, None)
    # a run without one result: the report is written, and the exit code says so (as search's)
    _exit_if_nothing_succeeded(SimpleNamespace(summary=summary, run_dir=run_dir, report_dir=out_dir))


@app.command()
def export(
    run_dir: Path = typer.Argument(..., help="A run directory (runs/NAME)."),
    out: Path = typer.Option(..., help="The new directory to write (with --pareto: one "
                             "subdirectory per trial)."),
    trial: Optional[str] = typer.Option(None, help="The trial id as in the report (a sub-trial "
                                        "ID#k exports at its own operating point)."),
    best: Optional[str] = typer.Option(None, help="Export the successful trial best in this metric "
                                       "(e.g. accuracy)."),
    pareto: bool = typer.Option(False, help="Export every trial and sub-trial on the Pareto front "
                                "(sub-trial ID#k to OUT/ID-k)."),
    format_: str = typer.Option("safetensors", "--format", help="safetensors, or onnx: the same "
                                "directory plus model.onnx (checked with onnxruntime; static, "
                                "untied trials only)."),
):
    """Write a trained trial as a model directory: weights (safetensors), gating state,
    tokenizer, archsearch.json (with --format onnx also model.onnx); load it with
    archsearch.load(DIR) or archsearch predict."""
    from archsearch.export import check_format, export_dirname, export_trial, select_trials

    ids = select_trials(run_dir, trial=trial, best=best, pareto=pareto)
    check_format(run_dir, ids, format_)  # every trial, before the first is written
    if pareto and out.exists():
        raise UserError("already exists: export writes a new directory", file=str(out), field="--out")
    for tid in ids:
        dest = out / export_dirname(tid) if pareto else out
        export_trial(run_dir, tid, dest, format=format_)
        typer.echo(f"trial {tid}: {dest}")


@app.command()
def predict(
    model_dir: Path = typer.Argument(..., help="A directory written by archsearch export."),
    data: Path = typer.Argument(..., help="Texts to classify: .csv, .tsv, .jsonl/.json or .parquet."),
    out: Path = typer.Option(..., help="Where to write the predictions (.csv)."),
    text_column: Optional[str] = typer.Option(None, help="The column holding the text (default: "
                                              "the first of text, sentence, content, review, ...)."),
    batch_size: int = typer.Option(64, min=1, help="Rows per forward pass."),
    device: str = typer.Option("cpu", help="cpu, cuda, cuda:1, ..."),
    regime: str = typer.Option("auto", help="How batches run: auto (chosen per batch size and "
                               "length by timing on the device), cascade (the trial's own per-row "
                               "exits), static (a cut within the FLOPs budget) or full."),
    adapt: str = typer.Option("none", help="none; dual: the stop rule's threshold follows the FLOPs "
                              "budget on these rows; bandit: dual plus 5% explored rows it refits from "
                              "(a DHT trial; benchmarks/depth/results/shift*.json)."),
    state: Optional[Path] = typer.Option(None, help="With --adapt: a file the learned state "
                                         "is read from (if there) and written to."),
):
    """Classify the rows of a file with an exported model; prints rows/s, the mean executed
    FLOPs, the exit histogram, the regimes that ran and the predicted label counts."""
    from archsearch.runtime import REGIME_CHOICES

    from archsearch.runtime import ADAPT_CHOICES

    if regime not in REGIME_CHOICES:
        raise UserError(f"{regime!r} is not one of {', '.join(REGIME_CHOICES)}", field="--regime")
    if adapt not in ADAPT_CHOICES:
        raise UserError(f"{adapt!r} is not one of {', '.join(ADAPT_CHOICES)}", field="--adapt")
    if state is not None and adapt == "none":
        raise UserError("a state file is only read and written with --adapt dual or bandit", field="--state")
    from archsearch.export import predict_file

    try:
        stats = predict_file(model_dir, data, out, text_column=text_column, batch_size=batch_size,
                             device=device, regime=regime, adapt=adapt, state=state)
    except ValueError as e:  # a regime this model cannot run (no exits, no cut in the budget)
        raise UserError(str(e), file=str(model_dir), field="--regime") from None
    budget = stats["flops_budget"]
    typer.echo(f"{stats['rows']} rows in {stats['seconds']:.2f} s ({stats['rows_per_s']:.1f} rows/s); "
               f"mean executed FLOPs {stats['mean_flops']:.4g} per row "
               f"({stats['mean_flops_fraction']:.3f} of the full model's"
               + (f"; budget {budget:.3f}" if budget is not None else "") + ")"
               + (f"; adapt {adapt} explored {stats['explored_share']:.3f} of rows" if "explored_share" in stats else ""))
    typer.echo("exit depth (blocks: rows): " + ", ".join(f"{k}: {v}" for k, v in stats["exit_histogram"].items()))
    typer.echo("regimes (rows): " + ", ".join(f"{k} {v}" for k, v in stats["regimes"].items()))
    typer.echo("labels: " + ", ".join(f"{k} {v}" for k, v in stats["label_counts"].items()))
    typer.echo(f"predictions: {out}")


@app.command()
def compare(
    run_dirs: list[Path] = typer.Argument(..., help="Two or more run directories (runs/NAME) "
                                          "with the same objectives."),
    out: Optional[Path] = typer.Option(None, help="Report directory (default "
                                       "reports/compare-NAME1-vs-NAME2...)."),
    reports: Path = typer.Option(Path("reports"), help="Where reports go."),
):
    """One report comparing runs: hypervolume curves on one plot, trials coloured by run."""
    from archsearch.report.compare import compare_runs

    out_dir, summary = compare_runs(run_dirs, out=out, reports=reports)
    for r in summary["runs"]:
        typer.echo(f"{r['name']}: {r['n_trials']} trials, {r['n_failed']} failed, "
                   f"hypervolume {r['hypervolume']:.6g}")
    typer.echo(f"report: {out_dir / 'index.html'}")
    if all(r["n_failed"] >= r["n_trials"] for r in summary["runs"]):  # nothing to compare (as report)
        print("error: no run has a successful trial: nothing to compare", file=sys.stderr)
        raise typer.Exit(1)


@app.command()
def dashboard(
    run_dir: Path = typer.Argument(..., help="A run directory (runs/NAME)."),
    host: str = typer.Option("127.0.0.1", help="Bind address. Anything but 127.0.0.1 exposes "
                             "the study to the network without authentication."),
    port: int = typer.Option(8080, help="Port."),
):
    """Serve the run's Optuna study with optuna-dashboard (127.0.0.1 by default)."""
    from archsearch.runs import RunDir

    run = RunDir(run_dir)
    if not run.optuna_db.is_file():
        raise UserError(f"no {run.optuna_db.name} here: not a run directory", file=str(run_dir))
    if host not in ("127.0.0.1", "localhost", "::1"):
        typer.echo(f"warning: binding {host}: the dashboard has no authentication", err=True)
    from optuna_dashboard import run_server

    refused = _check_dashboard(run, host, port)
    typer.echo(f"optuna-dashboard: http://{host}:{port}/  (Ctrl-C to stop)")
    try:
        run_server(run.optuna_url, host=host, port=port)
    except OSError as e:  # taken in between
        raise refused(e) from None


def _bind_refusal(host: str, port: int):
    """The function that turns a bind error on ``host:port`` into one line (``--port`` when the
    port is in use, else ``--host``)."""
    import errno

    def refused(e: OSError) -> UserError:  # port in use, an address this machine does not have
        return UserError(f"cannot serve on {host}:{port}: {e.strerror or e}",
                         field="--port" if e.errno == errno.EADDRINUSE else "--host")

    return refused


def _check_bind(host: str, port: int) -> None:
    """``port`` is a port and ``host:port`` can be bound now (as a server binds: address reuse on).

    Raises:
        UserError: naming ``--port`` or ``--host``.
    """
    import socket

    if not 0 <= port <= 65535:
        raise UserError(f"{port} is not a port (0 .. 65535)", field="--port")
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as e:
        raise _bind_refusal(host, port)(e) from None


def _check_dashboard(run, host: str, port: int):
    """Before the server starts (it prints its banner before it binds): the port is one,
    ``run``'s ``optuna.db`` is an Optuna database (opened read-only) and ``host:port`` can be
    bound. Returns the function that turns a later bind error into the same one line.

    Raises:
        UserError: naming ``--port``, ``--host`` or the database file.
    """
    import sqlite3
    from urllib.parse import quote

    if not 0 <= port <= 65535:
        raise UserError(f"{port} is not a port (0 .. 65535)", field="--port")
    try:
        with sqlite3.connect(f"file:{quote(str(run.optuna_db.resolve()))}?mode=ro", uri=True) as db:
            db.execute("SELECT count(*) FROM studies").fetchone()
    except sqlite3.Error as e:
        raise UserError(f"not an Optuna study database ({e})", file=str(run.optuna_db)) from None
    _check_bind(host, port)
    return _bind_refusal(host, port)


@app.command()
def serve(
    model_dir: Path = typer.Argument(..., help="A directory written by archsearch export."),
    host: str = typer.Option("127.0.0.1", help="Address the HTTP proxy binds (0.0.0.0: every "
                             "interface; not the default)."),
    port: int = typer.Option(8000, help="HTTP port."),
    address: Optional[str] = typer.Option(None, help="A running Ray cluster to deploy on "
                                          "(default: start Ray on this machine)."),
    cpus: Optional[float] = typer.Option(None, min=0.01, help="CPUs per replica (also its torch "
                                         "threads; default: 2, or this machine's count if fewer: "
                                         "measured faster than 1, benchmarks/product/results/export.json)."),
    replicas: int = typer.Option(1, min=1, help="Replicas behind the proxy."),
    max_batch_size: int = typer.Option(32, min=1, help="Requests batched into one forward pass."),
    device: str = typer.Option("cpu", help="cpu, cuda, ..."),
    regime: str = typer.Option("auto", help="How batches run: auto (chosen per batch size and "
                               "length by timing on the device), cascade, static or full."),
    adapt: str = typer.Option("none", help="none, dual or bandit: the stop rule keeps following the "
                              "FLOPs budget on the traffic (a DHT trial; see archsearch predict --help)."),
    state: Optional[Path] = typer.Option(None, help="With --adapt: the learned state's file "
                                         "(read at start, written as it learns and at shutdown; "
                                         "default DIR/runtime_state.pt)."),
):
    """Serve an exported model on Ray Serve: POST /predict {"texts": [...]} answers with one
    prediction per text; concurrent requests are batched. Ctrl-C stops it."""
    import os

    from archsearch.runtime import REGIME_CHOICES
    from archsearch.serve import serve_model

    if regime not in REGIME_CHOICES:
        raise UserError(f"{regime!r} is not one of {', '.join(REGIME_CHOICES)}", field="--regime")
    if adapt not in ("none", "dual", "bandit"):
        raise UserError(f"{adapt!r} is not one of none, dual, bandit", field="--adapt")
    if state is not None and adapt == "none":
        raise UserError("a state file is only read and written with --adapt dual or bandit", field="--state")
    if adapt != "none" and regime in ("static", "full"):
        raise UserError(f"--adapt {adapt} runs the cascade: --regime auto or cascade", field="--regime")
    if adapt != "none" and state is None:
        state = model_dir / "runtime_state.pt"

    if address is None:
        _check_bind(host, port)
    if cpus is None:
        cpus = float(min(2, os.cpu_count() or 1))
    serve_model(model_dir, host=host, port=port, address=address, num_cpus=cpus,
                num_replicas=replicas, max_batch_size=max_batch_size, device=device, regime=regime,
                adapt=adapt, state=state)


_JOB_API_HELP = ("The head's dashboard (Ray job API): http://HEAD:8265 (default "
                 "$RAY_API_SERVER_ADDRESS, else http://127.0.0.1:8265: a local head, or an SSH "
                 "tunnel / kubectl port-forward to a remote one). Not the GCS port 6379, not ray://.")


@app.command()
def submit(
    space_file: Path = typer.Argument(..., help="Search space YAML on this machine (shipped with the job)."),
    address: Optional[str] = typer.Option(None, help=_JOB_API_HELP),
    storage: str = typer.Option(..., help="Where run directories go ON THE CLUSTER: an absolute "
                                "path every node shares (NFS, EFS, a ReadWriteMany volume, a "
                                "bucket mounted with s3fs/gcsfuse). s3:// and gs:// URIs are not "
                                "accepted: the search writes plain files (optuna.db, records)."),
    reports: Optional[str] = typer.Option(None, help="Where reports go on the cluster (absolute "
                                          "path; default: 'reports' next to --storage)."),
    searcher: str = typer.Option("gp", help="gp (default: Optuna GPSampler) | ahto | qnehvi | random | tpe | nsga2"),
    trials: Optional[int] = typer.Option(None, min=1, help="Override budget.trials."),
    name: Optional[str] = typer.Option(None, help="Run name (default: SPACE-SEARCHER-TIME, made "
                                       "here so the run directory is known at once)."),
    cpus_per_trial: Optional[float] = typer.Option(None, help="Override budget.cpus_per_trial."),
    gpus_per_trial: Optional[float] = typer.Option(None, help="Override budget.gpus_per_trial."),
    fixed: Optional[str] = typer.Option(None, help="JSON config to pin (as for `search`)."),
    wait: bool = typer.Option(False, help="Follow the job's logs until it ends; exit non-zero "
                              "if it did not succeed (the search's own exit code when known). "
                              "Ctrl-C stops the waiting, not the job."),
    env: list[str] = typer.Option([], help="KEY=VALUE in the job's environment (repeatable), "
                                  "e.g. ARCHSEARCH_AUTOSCALING=1 or HF_HUB_OFFLINE=1."),
):
    """Submit a search to a Ray cluster as a Ray job: the project directory (without .venv,
    .git, reports, runs, benchmarks) and the space file are shipped, and the cluster runs
    `python -m archsearch.cli search SPACE --address auto --storage STORAGE ...`."""
    from archsearch.tune.submit import submit_search, wait_for

    job_env = {}
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not key or not key.replace("_", "").isalnum() or key[0].isdigit():
            raise UserError(f"{item!r}: expected KEY=VALUE with KEY a variable name", field="--env")
        job_env[key] = value
    sub = submit_search(space_file, address=address, storage=storage, reports=reports,
                        searcher=searcher, trials=trials, name=name, fixed=fixed,
                        cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial, env=job_env)
    typer.echo(f"submitted job {sub.job_id} to {sub.address}")
    typer.echo(f"run:     {sub.run_dir} (on the cluster)")
    typer.echo(f"report:  {sub.report_dir}/index.html (on the cluster)")
    typer.echo(f"follow:  archsearch logs {sub.job_id} --address {sub.address} --follow")
    typer.echo(f"         ray job logs {sub.job_id} --address {sub.address} --follow")
    typer.echo(f"stop:    ray job stop {sub.job_id} --address {sub.address}")
    if wait:
        try:
            code = wait_for(sub.address, sub.job_id, follow=True)
        except KeyboardInterrupt:
            print(f"stopped waiting; job {sub.job_id} goes on (archsearch logs {sub.job_id} "
                  f"--address {sub.address} --follow)", file=sys.stderr)
            raise typer.Exit(130) from None
        if code:
            raise typer.Exit(code)
        typer.echo(f"job {sub.job_id} SUCCEEDED; run: {sub.run_dir}")


@app.command()
def logs(
    job_id: str = typer.Argument(..., help="The job id `archsearch submit` printed (raysubmit_...)."),
    address: Optional[str] = typer.Option(None, help=_JOB_API_HELP),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
):
    """Print the logs of a submitted search (or --follow them)."""
    from archsearch.tune.submit import print_logs

    print_logs(address, job_id, follow=follow)


@data_app.command("list")
def data_list():
    """List the bundled datasets."""
    from archsearch.data import list_datasets

    for d in list_datasets():
        rows = ", ".join(f"{k} {v}" for k, v in d.n_rows.items())
        typer.echo(f"{d.name:28s} {d.task:15s} {rows}  ({d.license})")


@data_app.command("prepare")
def data_prepare(
    name: str = typer.Argument("rotten_tomatoes_sentences", help="Bundled name, file path or hub name."),
    text_column: Optional[str] = typer.Option(None),
    label_column: Optional[str] = typer.Option(None),
    task: Optional[str] = typer.Option(None, help="classification | lm"),
    tokenizer: Optional[str] = typer.Option(None, help="bpe | wordpiece | char | a pretrained checkpoint directory or Hugging Face Hub id (default: char for lm, bpe otherwise)"),
    vocab_size: int = typer.Option(8000),
    max_len: int = typer.Option(48),
):
    """Load, tokenize and cache a dataset; print its sizes."""
    from pydantic import ValidationError

    from archsearch.data import prepare
    from archsearch.space import DatasetSpec

    options = dict(text_column=text_column, label_column=label_column, tokenizer=tokenizer,
                   vocab_size=vocab_size, max_len=max_len)

    def option(field) -> str:  # a dataset field as its command-line option
        return f"--{str(field).replace('_', '-')}"

    try:  # the limits a space file's dataset section has
        DatasetSpec(name=name, **options)
    except ValidationError as e:
        err = e.errors()[0]
        raise UserError(err["msg"], field=option(err["loc"][0])) from None
    if task not in (None, "classification", "lm"):
        raise UserError(f"expected classification or lm, got {task!r}", field="--task")
    try:
        d = prepare(name, task=task, **options)
    except UserError as e:
        if e.field not in ({*options} | {"task"}):
            raise
        raise UserError(e.message, file=e.file, field=option(e.field)) from None
    typer.echo(f"{name}: task {d.task}, vocab {d.vocab_size}, max_len {d.max_len}")


def _usage_errors() -> tuple[type, ...]:
    """The exception classes of command-line usage errors: click's, and the copy of click that
    recent typer releases (0.29 here) ship inside themselves (its errors are not
    ``click.ClickException``)."""
    classes: list[type] = []
    try:
        import click

        classes.append(click.ClickException)
    except ImportError:
        pass
    try:
        from typer._click.exceptions import ClickException
    except ImportError:
        pass
    else:
        classes.append(ClickException)
    return tuple(classes)


def main() -> None:
    """Console entry point: run the app, turning UserError into one line and exit code 2."""
    try:
        code = app(standalone_mode=False)  # a command's typer.Exit(N) comes back as N
    except UserError as e:
        print(f"error: {e.one_line()}", file=sys.stderr)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        if isinstance(e, _usage_errors()):  # a bad option, value, command or missing argument
            print(f"error: {' '.join(e.format_message().split())} (archsearch --help)", file=sys.stderr)
            sys.exit(2)
        raise
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    main()
