"""Protocols: the committed JSON that states a benchmark's variants, seeds, data, selection rule
and targets before its runs. A result records the protocol's path and sha256 (the bytes it ran
under), so a later edit to the protocol is visible."""

from __future__ import annotations

import hashlib
from pathlib import Path

from benchmarks.evidence.provenance import ROOT


def sha256(path: Path | str) -> str:
    """The sha256 (hex) of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def relpath(path: Path | str) -> str:
    """``path`` relative to the repository root (as results record it)."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


def protocol_record(path: Path | str) -> dict[str, str]:
    """``{"path", "sha256"}`` of a protocol: what a result stores under ``protocol``."""
    return {"path": relpath(path), "sha256": sha256(path)}
