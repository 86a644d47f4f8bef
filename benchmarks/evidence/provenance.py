"""What every result writes beside its numbers: provenance read from the machine, never typed.

``provenance`` holds the git commit(s) the data came from, the command, the machine (read from
``platform``/``os.cpu_count()``/torch), the seeds and the wall time.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

#: The repository root.
ROOT = Path(__file__).resolve().parents[2]

#: What benchmarks write (results, run logs): changes there do not make the checkout dirty.
_WRITTEN = [":(exclude,glob)benchmarks/**/results/**",
            ":(exclude,glob)benchmarks/**/runs/**", ":(exclude,glob)benchmarks/ledger/**"]


def git_commit() -> str:
    """The checkout's HEAD commit (40 hex digits), plus ``+dirty`` when tracked files differ.

    Changes to results, run logs and the ledger do not count: they are what the benchmarks write
    (a run appending its rows, a result renamed before a rerun), not code the numbers came from.
    """
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *_WRITTEN],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return f"{head}+dirty" if head and dirty else head


def machine() -> dict[str, Any]:
    """This machine, read at run time: platform, processor, CPU count, Python and torch versions
    (torch only where it is already imported or importable)."""
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:  # a benchmark that does not use torch
        pass
    return info


def provenance(*, commits: Iterable[str] | str | None = None, command: str | None = None,
               seeds: Any = None, wall_s: float | None = None, **extra: Any) -> dict[str, Any]:
    """The ``provenance`` object of a result JSON.

    Args:
        commits: the commit(s) the measured data came from (a resumable benchmark may have rows
            from several); default: the current HEAD.
        command: the command line; default: this process's ``sys.argv``.
        seeds: the seeds used (any JSON value).
        wall_s: the benchmark's wall time in seconds (summed over resumed pieces).
        extra: more keys.
    """
    if commits is None:
        commits = [git_commit()]
    elif isinstance(commits, str):
        commits = [commits]
    return {"git_commit": sorted(set(commits)),
            "command": command or " ".join(["python", *sys.argv]),
            "machine": machine(), "seeds": seeds,
            "wall_s": None if wall_s is None else round(float(wall_s), 1), **extra}
