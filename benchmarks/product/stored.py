"""Restating a stored result in the one schema, for the runners whose numbers cannot be
regenerated offline (they need Ray, a real search, the fuzz campaign or a dataset download).

Their ``analyze`` and ``check`` read the committed result and pass its numbers through the
runner's own result builder (the function ``run`` writes with): ``summary`` and provenance as
stored, targets evaluated again, the protocol hashed, the test reads judged by the ledger. A
prose ``protocol`` string of an older result becomes its ``method``; the old ``targets_met``
shapes are dropped (the evaluated ``targets`` replace them). The numbers never change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from benchmarks.evidence.results import read_result

#: Keys the builder writes itself (or that the one schema replaced): not carried over.
SCHEMA = ("summary", "targets", "targets_met", "targets_met_detail", "targets_total", "protocol",
          "ledger", "exploratory", "provenance")


def restate(path: Path | str, build: Callable[..., dict[str, Any]], *, record_reads: bool,
            summary: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The stored result at ``path`` rebuilt by ``build(summary, prov, record_reads=..., **rest)``.

    Args:
        path: the committed result.
        build: the runner's result builder.
        record_reads: append test reads to the ledger (false for ``check``).
        summary: the stored summary -> the summary to build with (default: unchanged).

    Raises:
        ValueError: the result is missing or not JSON.
    """
    stored = read_result(path)
    rest: dict[str, Any] = {}
    for key, value in stored.items():
        if key == "protocol" and isinstance(value, str):
            rest["method"] = value  # the prose the old result called its protocol
        elif key not in SCHEMA:
            rest[key] = value
    s = stored["summary"] if summary is None else summary(stored["summary"])
    return build(s, stored["provenance"], record_reads=record_reads, **rest)
