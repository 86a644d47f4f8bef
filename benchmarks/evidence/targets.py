"""Targets: ``"<= 0.5"``-style bounds on summary keys, joint rules, and their evaluation.

A protocol or runner states targets as ``{key: "OP VALUE"}`` (``OP`` one of ``<= >= < > ==``;
a bare number means ``<=``) or, for a joint rule, ``{key: {"target": "OP VALUE", "with":
[other keys]}}``: the key is met only when its bound holds and every key in ``with`` is met too
(e.g. a time ratio that must also be significant). ``key`` is a path into the summary: sections
joined by ``.`` (``"rt.dht_gain_over_static_pts_at_0.5"``: the key ``dht_gain_over_static_pts_at_0.5``
of section ``rt``; a key that itself contains dots is found whole first).

:func:`evaluate` returns the one shape every result stores: ``{key: {"target": "OP VALUE",
"value": v, "met": bool}}`` (``met`` is false when the value is missing or not a number).
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt, "==": operator.eq}


def parse(target: str | float | int) -> tuple[str, float]:
    """``"<= 0.5"`` -> ``("<=", 0.5)``; a bare number ``v`` -> ``("<=", v)``.

    Raises:
        ValueError: not ``OP VALUE`` with a known ``OP``.
    """
    if isinstance(target, (int, float)) and not isinstance(target, bool):
        return "<=", float(target)
    parts = str(target).split()
    if len(parts) != 2 or parts[0] not in OPS:
        raise ValueError(f"target {target!r} is not 'OP VALUE' with OP in {' '.join(OPS)}")
    try:
        return parts[0], float(parts[1])
    except ValueError:
        raise ValueError(f"target {target!r}: {parts[1]!r} is not a number") from None


def lookup(summary: dict, key: str) -> Any:
    """The value at ``key`` (sections joined by ``.``) in ``summary``; ``None`` when absent."""
    if key in summary:
        return summary[key]
    head = ""
    for part in key.split(".")[:-1]:
        head = f"{head}.{part}" if head else part
        if isinstance(summary.get(head), dict):
            found = lookup(summary[head], key[len(head) + 1:])
            if found is not None:
                return found
    return None


def holds(value: Any, target: str | float) -> bool:
    """Whether a number meets ``target``; false for a missing, boolean or NaN value."""
    op, bound = parse(target)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return False
    return OPS[op](float(value), bound)


def normalise(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{key: "OP V" | number | {"target": ..., "with": [...]}}`` -> ``{key: {"target": "OP V",
    "with": [...]}}`` (``with`` only where given).

    Raises:
        ValueError: a malformed target, or a ``with`` naming a key that has no target.
    """
    out = {}
    for key, t in spec.items():
        if isinstance(t, dict):
            op, bound = parse(t["target"])
            out[key] = {"target": t["target"] if isinstance(t["target"], str) else f"{op} {bound:g}",
                        **({"with": list(t["with"])} if t.get("with") else {})}
        else:
            op, bound = parse(t)
            out[key] = {"target": t if isinstance(t, str) else f"{op} {bound:g}"}
    for key, t in out.items():
        missing = [w for w in t.get("with", []) if w not in out]
        if missing:
            raise ValueError(f"target {key!r}: 'with' names keys without a target: {missing}")
    return out


def evaluate(spec: dict[str, Any], summary: dict) -> dict[str, dict[str, Any]]:
    """Every target of ``spec`` evaluated on ``summary``: ``{key: {"target", "value", "met"}}``
    (and ``"with"`` for a joint rule, met only when its partners are met as well)."""
    norm = normalise(spec)
    alone = {k: holds(lookup(summary, k), t["target"]) for k, t in norm.items()}
    out = {}
    for key, t in norm.items():
        out[key] = {"target": t["target"], "value": lookup(summary, key),
                    "met": alone[key] and all(alone[w] for w in t.get("with", []))}
        if t.get("with"):
            out[key]["with"] = t["with"]
    return out


def count_met(evaluated: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """``(met, total)`` of an :func:`evaluate` output."""
    return sum(bool(t["met"]) for t in evaluated.values()), len(evaluated)
