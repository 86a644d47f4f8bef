"""What a report is built from: a run directory, read through :class:`archsearch.runs.RunDir`.

:func:`load_run` turns one run directory into the arguments of
:func:`archsearch.report.write_report` (:class:`RunInput`); :func:`archsearch.report.report_run`
and :func:`archsearch.report.compare.compare_runs` both read runs this way. The report never
spells a file name of the run directory: the layout is :mod:`archsearch.runs`'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from archsearch.runs import RunDir

#: RunSpec fields the page does not show as such: the command line, the raw timestamps (shown
#: as ``started`` and ``wall_time_s`` instead).
_HIDDEN_SPEC_KEYS = ("argv", "started", "wall_seconds", "wall_seconds_before", "resumed", "path")
#: RunSpec fields shown only when set.
_OPTIONAL_SPEC_KEYS = ("num_cpus", "fixed")


@dataclass
class RunInput:
    """One run: what :func:`archsearch.report.write_report` takes, plus the directory it came
    from (named in errors, as the caller gave it)."""

    run_dir: str
    trials: list[dict[str, Any]]
    objectives: list[dict[str, Any]]
    constraints: dict[str, dict[str, float]] = field(default_factory=dict)
    run_info: dict[str, Any] = field(default_factory=dict)


def rel_path(path: str | Path) -> str:
    """``path`` relative to the working directory when it is inside it (reports are shared,
    so they should not spell the author's home directory)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def load_run(run_dir: str | Path) -> RunInput:
    """Read a run directory: its :class:`~archsearch.runs.RunSpec`, its effective space
    (objectives, constraints, scheduler) and its trial records.

    ``run_info`` is the run spec as the page shows it: every ``RunSpec`` field except
    ``argv``, ``resumed`` and the raw times (``num_cpus`` and ``fixed`` only when set), with
    ``space_file`` and ``run_dir`` relative to the working directory when inside it,
    ``wall_time_s`` (s), ``started`` as local ``YYYY-mm-dd HH:MM:SS``, and the space's
    ``scheduler`` and ``latency_batch_size``.

    Raises:
        UserError: not a run directory, an unreadable or incomplete ``run.json``, an invalid
            space file, or a corrupt trial record (each naming the file).
    """
    run = RunDir.open(run_dir)
    spec = run.read_spec()
    space = run.load_space()
    run_info = {**spec.to_dict(), "space_file": rel_path(spec.space_file or run.space_file),
                "run_dir": rel_path(run_dir), "wall_time_s": spec.wall_seconds,
                "scheduler": space.budget.scheduler,
                "latency_batch_size": space.budget.latency_batch_size}
    for key in _HIDDEN_SPEC_KEYS:
        run_info.pop(key, None)
    for key in _OPTIONAL_SPEC_KEYS:
        if run_info.get(key) is None:
            run_info.pop(key, None)
    if spec.started:
        run_info["started"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(spec.started))
    return RunInput(
        run_dir=str(run_dir),
        trials=run.read_trials(),
        objectives=[o.model_dump(exclude_none=True) for o in space.objectives],
        constraints={k: v.model_dump(exclude_none=True) for k, v in space.constraints.items()},
        run_info=run_info,
    )
