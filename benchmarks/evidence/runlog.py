"""A resumable run log: one JSON object per line, appended as each measurement finishes.

A benchmark that stops (a killed process, the end of a session) restarts where it stopped: it
reads the log, skips the rows already there and appends the rest. Rows are never rewritten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


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
    """One benchmark's run log: its rows, and appending to it.

    Args:
        path: the ``.jsonl`` file (created with its folder on the first append).
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def rows(self) -> list[dict[str, Any]]:
        """Every logged row, in order."""
        return read_jsonl(self.path)

    def append(self, row: dict[str, Any]) -> None:
        """Append one row (keys sorted) and flush it to disk before returning."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
