"""Console tables: what a benchmark prints after its numbers (results are the JSON; this is for
the person watching)."""

from __future__ import annotations

from typing import Any, Sequence


def fmt(v: Any, digits: int = 3) -> str:
    """A cell: ``-`` for None, a float with ``digits`` decimals, ``[a, b]`` for an interval."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v):
        return f"[{fmt(v[0], digits)}, {fmt(v[1], digits)}]"
    return str(v)


def table(rows: Sequence[Sequence[Any]], header: Sequence[str], digits: int = 3) -> str:
    """A plain-text table: columns padded to their widest cell, a rule under the header."""
    cells = [[str(h) for h in header]] + [[fmt(c, digits) for c in r] for r in rows]
    width = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, width)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in width))
    return "\n".join(lines)


def print_table(rows: Sequence[Sequence[Any]], header: Sequence[str], digits: int = 3) -> None:
    """Print :func:`table`."""
    print(table(rows, header, digits), flush=True)


def markdown(rows: Sequence[Sequence[Any]], header: Sequence[str], digits: int = 3) -> str:
    """A GitHub markdown table: ``| a | b |`` lines, a ``|---|---|`` rule under the header."""
    lines = ["| " + " | ".join(str(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c, digits) for c in r) + " |" for r in rows]
    return "\n".join(lines)
