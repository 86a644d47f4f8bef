"""Pareto-front report of a run: ``index.html``, ``pareto.png``, ``hypervolume.png``,
``trials.csv``, ``pareto.json``; and a comparison of several runs.

Entry points: :func:`report_run` (a run directory -> ``reports/<run name>/``),
:func:`write_report` (one run's records, e.g. synthetic ones) and :func:`write_comparison` /
:func:`archsearch.report.compare.compare_runs` (several runs on the same objectives;
``archsearch compare``). The Pareto arithmetic is :mod:`archsearch.pareto`'s; run directories
are read through :class:`archsearch.runs.RunDir` (:mod:`archsearch.report.inputs`); every file
is written with :func:`archsearch.runs.atomic_write`.

Modules, by job (each imports only those above it in this list):

* :mod:`~archsearch.report.values`: metric units and labels, the text form of values;
* :mod:`~archsearch.report.records`: validation and classification of the runner's records,
  anytime-curve sub-trials;
* :mod:`~archsearch.report.data`: :class:`~archsearch.report.data.ReportData`, the computed
  report (front, reference point, hypervolume history);
* :mod:`~archsearch.report.style`: the look shared by all figures (colours, marker legend,
  panels, axes, hover text);
* :mod:`~archsearch.report.figures` / :mod:`~archsearch.report.compare_figures`: plotly
  figure specs of one run / of a comparison;
* :mod:`~archsearch.report.pngs`: the matplotlib PNGs;
* :mod:`~archsearch.report.page`: the page shell: jinja2 templates with autoescape
  (``templates/*.html.j2``), ``plotly.min.js`` once per directory, figures, PNGs;
* :mod:`~archsearch.report.html`: the page of one run;
* :mod:`~archsearch.report.files`: the files of one run's report;
* :mod:`~archsearch.report.inputs`: reading a run directory;
* :mod:`~archsearch.report.compare`: the comparison report;
* :mod:`~archsearch.report.synthetic`: synthetic records shaped like the runner's (tests,
  benchmark).

Importing this package is cheap (standard library only): numpy, pydantic, jinja2, plotly and
matplotlib are imported when a report is written; torch and BoTorch only for hypervolumes of
four or more objectives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["report_run", "write_report", "write_comparison"]


def report_run(run_dir: str | Path, reports: str | Path = "reports",
               out_dir: str | Path | None = None) -> tuple[Path, dict[str, Any]]:
    """Write the report of a run directory and return ``(report directory, pareto.json
    content)`` (``archsearch report``, and the runner once a search ends).

    Args:
        run_dir: a run directory (:class:`archsearch.runs.RunDir`: ``run.json``,
            ``space.yaml``, ``trials/``).
        reports: the directory reports go under; the report is ``reports/<run name>/``.
        out_dir: write here instead of ``reports/<run name>/``.

    The page's header shows the run spec (searcher, seed, trials, resources per trial, Ray
    address, ...), the space file, the scheduler and the wall time: see
    :func:`archsearch.report.inputs.load_run`. The objectives and constraints are the run's
    effective space's.

    Raises:
        UserError: ``run_dir`` is not a run directory, its ``run.json`` is unreadable or
            incomplete, its space is invalid, a trial record is corrupt or breaks the contract
            of :func:`write_report` (naming the file), or the report cannot be written there.
    """
    from archsearch.errors import UserError
    from archsearch.report.inputs import load_run

    run = load_run(run_dir)
    # the directory's own name, not run.json's ``name``: a copied or renamed run reports under
    # its new name, and a ``name`` such as ``../x`` in a run from elsewhere writes nothing outside
    out = Path(out_dir) if out_dir else Path(reports) / Path(run_dir).expanduser().resolve().name
    try:
        summary = write_report(run.trials, run.objectives, out, constraints=run.constraints,
                               run_info=run.run_info)
    except ValueError as e:
        raise UserError(f"bad trial records: {e}", file=str(run_dir)) from None
    except OSError as e:
        raise UserError(f"cannot write the report ({e.strerror or e.__class__.__name__})",
                        file=str(out), field="--out" if out_dir else "--reports") from None
    return out, summary


def write_comparison(runs, out_dir, **kwargs):
    """See :func:`archsearch.report.compare.write_comparison`."""
    from archsearch.report.compare import write_comparison as _write

    return _write(runs, out_dir, **kwargs)


def write_report(
    trials: Sequence[Mapping[str, Any]],
    objectives: Sequence[Mapping[str, Any]],
    out_dir: Path | str,
    *,
    constraints: Mapping[str, Mapping[str, float]] | None = None,
    run_info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the report of one run into ``out_dir`` and return the ``pareto.json`` content.

    Args:
        trials: the runner's records, in the order the trials ran, each
            ``{"trial_id": str, "status": "TERMINATED" | "ERROR" | "STOPPED",
            "config": {name: value}, "metrics": {metric: float} (last reported),
            "history": [{metric: float, "epoch": int, ...}, ...], "error": str | None}``.
            ``STOPPED`` = stopped early (ASHA or AHTO scheduler, time budget): a valid point with fewer epochs; ``RUNNING``
            = unfinished, counted as failed. ``metrics`` may hold ``anytime_curve`` (a
            dynamic trial's operating points, which become sub-trials ``ID#k`` that can be
            on the front: :mod:`archsearch.report.records`) and ``tying_map`` (shown with
            the config).
        objectives: ``[{"metric": "accuracy", "mode": "max"},
            {"metric": "flops_per_sample", "mode": "min", "ref": 2e9}, ...]``; ``ref`` is an
            optional reference value in the metric's unit; ``metric`` is one of docs/design.md's
            metric names (``archsearch.space.METRICS``); each becomes an
            :class:`archsearch.space.Objective`.
        out_dir: directory to write into (created if missing; files are replaced).
        constraints: ``{metric: {"max": v}}`` / ``{"min": v}`` (both allowed), inclusive.
            Trials outside them are infeasible: drawn, but not on the front.
        run_info: shown in the page header. Known keys: ``name``, ``searcher``,
            ``space_file`` (used in the repro command), ``scheduler``, ``wall_time_s``
            (seconds; ``wall_time`` accepted), ``latency_batch_size``, ``started``,
            ``finished``, and ``repro_command`` (template with ``{config_json}`` and
            ``{space}``, which are substituted shell-quoted). Other keys are listed as-is.

    Returns:
        Exactly ``{"objectives": [{"metric", "mode"}, ...], "reference_point": [float, ...],
        "hypervolume": float, "pareto": [{"trial_id", "config", "metrics"}, ...],
        "n_trials": int, "n_failed": int}``. ``pareto`` may list sub-trials ``"ID#k"``
        (config = the trial's config plus the point's settings). ``reference_point`` entries
        are ``None`` only
        when no feasible trial exists and no user ``ref`` was given; then ``hypervolume`` is
        ``0.0``. Non-finite metric values appear as ``null``. ``n_trials`` counts every
        record; ``n_failed`` counts ERROR trials and trials whose objective/constraint
        metrics are missing or NaN/inf.

    Files written in ``out_dir``: ``index.html`` (opens offline; loads plotly.js from
    ``plotly.min.js`` beside it, written only when absent or different),
    ``pareto.png`` and ``hypervolume.png`` (matplotlib), ``trials.csv`` (one row per trial
    and sub-trial: ``trial_id, status, config/<name>..., <metrics>..., feasible, pareto``),
    ``pareto.json``.

    Raises:
        ValueError: input that breaks the contract above (unknown status, bad mode, unknown
            objective metric, duplicate trial_id, malformed constraint, ...), naming the
            offending item.
    """
    from archsearch.report.data import build_report_data
    from archsearch.report.files import write_report_data

    data = build_report_data(trials, objectives, constraints, run_info)
    return write_report_data(data, out_dir)
