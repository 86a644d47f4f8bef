"""The one result schema, written only by its benchmark:

.. code-block:: text

    {"summary":     {...the numbers; sections for datasets or variants...},
     "targets":     {key: {"target": "<= 0.5", "value": 0.43, "met": true}},   (when stated)
     "protocol":    {"path": "...", "sha256": "..."}  or  {section: {...}},    (when one governs it)
     "ledger":      {section or "": {protocol, protocol_sha256, test_set,
                                     test_reads_before, exploratory, why}},    (test reads)
     "exploratory": true,                                                     (only when so)
     "provenance":  {git_commit, command, machine, seeds, wall_s, ...},
     ...anything else the result keeps (per-seed rows, curves)...}

:func:`build_result` assembles it (targets evaluated, protocols hashed, reads judged by the
ledger), :func:`write_result` writes it atomically, :func:`compare_results` says where a
regenerated result differs from the stored one (``provenance`` aside).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable

from benchmarks.evidence import ledger as _ledger
from benchmarks.evidence import targets as _targets
from benchmarks.evidence.protocol import protocol_record


def _protocols(protocol: Any) -> Any:
    if protocol is None:
        return None
    if isinstance(protocol, (str, Path)):
        return protocol_record(protocol)
    return {section: protocol_record(p) for section, p in protocol.items()}


def build_result(summary: dict[str, Any], prov: dict[str, Any], *, name: str,
                 targets: dict[str, Any] | None = None, protocol: Any = None,
                 reads: Iterable[_ledger.Read] = (), record_reads: bool = True,
                 **rest: Any) -> dict[str, Any]:
    """A result in the one schema.

    Args:
        summary: the numbers.
        prov: :func:`benchmarks.evidence.provenance.provenance`.
        name: the result's file name (``"dht.json"``): how the ledger names it.
        targets: ``{key: "OP V" | {"target", "with"}}`` (:mod:`benchmarks.evidence.targets`);
            evaluated on ``summary``.
        protocol: the protocol file, or ``{section: file}``.
        reads: the test splits this result reads (:class:`benchmarks.evidence.ledger.Read`).
        record_reads: append new reads to the ledger (false for ``check``).
        rest: more top-level keys.

    Raises:
        ValueError: a malformed target or protocol.
    """
    out: dict[str, Any] = {"summary": summary}
    if targets:
        out["targets"] = _targets.evaluate(targets, summary)
    if protocol is not None:
        out["protocol"] = _protocols(protocol)
    reads = list(reads)
    if reads:
        led = {}
        for r in reads:
            label = f"{name}#{r.section}" if r.section else name
            led[r.section] = _ledger.record(r, label, write=record_reads)
        out["ledger"] = led
        if any(v["exploratory"] for v in led.values()):
            out["exploratory"] = True
    out["provenance"] = prov
    out.update(rest)
    return out


def write_json(path: Path | str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` (indent 1, trailing newline), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def write_result(path: Path | str, summary: dict[str, Any], prov: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """:func:`build_result` (named by ``path``'s file name) written to ``path``; returns it."""
    result = build_result(summary, prov, name=Path(path).name, **kw)
    write_json(path, result)
    return result


def read_result(path: Path | str) -> dict[str, Any]:
    """A stored result.

    Raises:
        ValueError: missing or not JSON, naming the file.
    """
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such result (run the benchmark's analyze first)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None


#: How far a regenerated float may be from the stored one and still be the same number: the
#: last bits of a sum depend on the CPU's vector width (BLAS and NumPy reduce in another order on
#: another machine), so a result written on one machine regenerates on another to about 1e-15
#: relative; 1e-9 is far below any digit a claim reads.
REL_TOL, ABS_TOL = 1e-9, 1e-12


def _floats(a: Any, b: Any) -> bool:
    return (isinstance(a, float) or isinstance(b, float)) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))


def _diff(a: Any, b: Any, at: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a:
                out.append(f"{at}{k}: only in the regenerated result")
            elif k not in b:
                out.append(f"{at}{k}: only in the stored result")
            else:
                _diff(a[k], b[k], f"{at}{k}.", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{at}{i}.", out)
    elif _floats(a, b) and math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL):
        return
    elif json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True):
        out.append(f"{at.rstrip('.')}: stored {json.dumps(a)[:80]} != regenerated {json.dumps(b)[:80]}")


def compare_results(stored: dict[str, Any], regenerated: dict[str, Any],
                    ignore: Iterable[str] = ("provenance",)) -> list[str]:
    """Where two results differ (JSON-equal values, floats equal to :data:`REL_TOL` relative,
    top-level ``ignore`` keys aside): one line per differing path, ``[]`` when identical."""
    skip = set(ignore)
    out: list[str] = []
    _diff({k: v for k, v in stored.items() if k not in skip},
          json.loads(json.dumps({k: v for k, v in regenerated.items() if k not in skip})), "", out)
    return out
