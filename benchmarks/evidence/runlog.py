"""A resumable run log: one JSON object per line, appended as each measurement finishes.

A benchmark that stops (a killed process, the end of a session) restarts where it stopped: it
reads the log, skips the keys already there and appends the rest. Rows are never rewritten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (``[]`` when it does not exist yet).

    Raises:
        ValueError: a line that is not JSON, naming the file and line number.
    """
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not a JSON row ({e.msg})") from None
    return rows


class RunLog:
    """The rows of one benchmark's run log, and appending to it.

    Args:
        path: the ``.jsonl`` file (created with its folder on the first append).
        key: a row -> its identity (e.g. ``lambda r: (r["task"], r["seed"])``); rows whose key is
            already logged are :meth:`done`.
    """

    def __init__(self, path: Path | str, key: Callable[[dict], Hashable] | None = None):
        self.path = Path(path)
        self.key = key

    def rows(self) -> list[dict[str, Any]]:
        """Every logged row, in order."""
        return read_jsonl(self.path)

    def done(self) -> set:
        """The keys of the logged rows (needs ``key``)."""
        if self.key is None:
            raise ValueError("RunLog.done needs a key function")
        return {self.key(r) for r in self.rows()}

    def todo(self, items: Iterable[dict]) -> list[dict]:
        """``items`` whose key is not logged yet (``key`` applied to each item)."""
        seen = self.done()
        return [it for it in items if self.key(it) not in seen]

    def append(self, row: dict[str, Any]) -> None:
        """Append one row (keys sorted) and flush it to disk before returning."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
