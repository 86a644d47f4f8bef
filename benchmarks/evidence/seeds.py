"""The one seed syntax of every benchmark command line: ``--seeds 0-2,5``."""

from __future__ import annotations


def parse_seeds(spec: str | int | list[int]) -> list[int]:
    """Seeds from a command-line spec: ``"0-19"``, ``"0,3,5-7"``, ``"4"`` (a list or int passes
    through as a list).

    Raises:
        ValueError: a part that is not ``N`` or ``N-M`` with ``N <= M``.
    """
    if isinstance(spec, int):
        return [spec]
    if isinstance(spec, list):
        return [int(s) for s in spec]
    out: list[int] = []
    for part in str(spec).split(","):
        a, _, b = part.strip().partition("-")
        try:
            lo, hi = int(a), int(b) if b else int(a)
        except ValueError:
            raise ValueError(f"--seeds: {part!r} is not N or N-M (e.g. 0-2,5)") from None
        if hi < lo:
            raise ValueError(f"--seeds: {part!r} runs backwards")
        out += list(range(lo, hi + 1))
    return out
