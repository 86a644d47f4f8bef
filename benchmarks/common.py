"""What every benchmark script writes beside its numbers: provenance read from the machine.

A result JSON is ``{"summary": {...}, "provenance": {...}, ...}``; only the script writes it.
``provenance`` holds the git commit(s) the data came from, the command, the machine (read from
``platform``/``os.cpu_count()``/torch, never typed), the seeds and the wall time.

    from common import git_commit, machine, provenance, write_result   # benchmarks/ on sys.path

Scripts in ``benchmarks/`` import this as a sibling module (``python benchmarks/x.py`` puts
``benchmarks/`` on ``sys.path``; a test that loads a script by path must add it too).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parents[1]


def git_commit() -> str:
    """The checkout's HEAD commit (40 hex digits), plus ``+dirty`` when tracked files differ.

    Changes under ``benchmarks/results/`` do not count: they are what the benchmarks write
    (a run appending its rows, a result renamed before a rerun), not code the numbers came from.
    """
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":(exclude)benchmarks/results"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return f"{head}+dirty" if head and dirty else head


def machine() -> dict[str, Any]:
    """This machine, read at run time: platform, processor, CPU count, Python and torch versions."""
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
        extra: more keys, e.g. ``protocol``.
    """
    if commits is None:
        commits = [git_commit()]
    elif isinstance(commits, str):
        commits = [commits]
    return {"git_commit": sorted(set(commits)),
            "command": command or " ".join(["python", *sys.argv]),
            "machine": machine(), "seeds": seeds,
            "wall_s": None if wall_s is None else round(float(wall_s), 1), **extra}


def write_result(path: Path, summary: dict[str, Any], prov: dict[str, Any], **rest: Any) -> None:
    """Write ``{"summary", "provenance", **rest}`` to ``path`` (indent 1), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"summary": summary, "provenance": prov, **rest}, indent=1) + "\n")
    os.replace(tmp, path)


def write_jsonl_splits(out: Path, splits: dict[str, list[dict]]) -> None:
    """A dataset directory for :func:`archsearch.data.prepare`: one ``{split}.jsonl`` per entry
    of ``splits`` (rows as JSON objects, keys sorted), each written atomically."""
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        tmp = out / f".{name}.jsonl.tmp"
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
        os.replace(tmp, out / f"{name}.jsonl")


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """The rows of a resumable benchmark's JSON-lines file (``[]`` when it does not exist yet)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def paired_bootstrap(pairs: list[tuple[str, str]], n: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Mean gain of ``a`` over ``b`` in accuracy points, averaged over seeds, and its 95% paired
    bootstrap interval over test rows (percentile; Efron & Tibshirani 1993, ch. 16).

    Args:
        pairs: one ``(a, b)`` per seed: '0'/'1' strings (1 = correct), one character per test
            row, every string over the same rows in the same order; each resample draws the rows
            once and applies them to every seed (the seeds share the test set).
        n: resamples; ``seed``: the resampling generator's seed.

    Returns:
        ``{"mean": points, "ci95": [low, high]}`` rounded to 3 decimals.

    Raises:
        ValueError: no pairs, or strings of different lengths.
    """
    import numpy as np

    if not pairs or len({len(x) for p in pairs for x in p}) != 1:
        raise ValueError("paired_bootstrap needs (a, b) strings of one length, at least one pair")
    d = np.stack([(np.frombuffer(a.encode(), dtype=np.uint8).astype(float)
                   - np.frombuffer(b.encode(), dtype=np.uint8)) * 100 for a, b in pairs]).mean(0)  # (rows,)
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, len(d), (n, len(d)))].mean(1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"mean": round(float(d.mean()), 3), "ci95": [round(float(lo), 3), round(float(hi), 3)]}


def parse_seeds(spec: str) -> list[int]:
    """Seeds from a command-line spec: ``"0-19"``, ``"0,3,5-7"``."""
    out = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    return out
