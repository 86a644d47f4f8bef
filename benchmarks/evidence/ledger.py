"""The test-read ledger: which protocol read which test split, in what order.

``benchmarks/ledger/<test set>.json`` (committed; one file per test set) lists every read of
that test split, oldest first, one entry per (protocol version, result): ``{"test_set",
"protocol", "protocol_sha256", "result", "commit", "date", "note"}``. A *test set* names the rows
or tasks a claim is scored on (``"rt_sentences:test"``, ``"lcbench:test_tasks"``...), shared by
every protocol scoring them, whichever question it belongs to.

A result records, per read, how many reads of the same test set came before it, and is
**exploratory** when any earlier read was made under another protocol (or another version of
the same protocol, by sha256): its protocol was written or changed after the test split had
been seen, so the split no longer tests a choice made blind. Reading a split again under the
same protocol version (re-analysing the same runs) is the same read, not a new one. The rule is
applied here, never by hand; known reads from before the ledger were backfilled from git
history (their ``note`` says so).
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.evidence.protocol import protocol_record
from benchmarks.evidence.provenance import ROOT, git_commit

#: The committed ledger: one JSON file per test set.
LEDGER = ROOT / "benchmarks" / "ledger"


def ledger_file(test_set: str, ledger: Path | None = None) -> Path:
    """The file holding ``test_set``'s reads (``:`` and ``/`` become ``__``)."""
    return Path(ledger or LEDGER) / (test_set.replace(":", "__").replace("/", "__") + ".json")


@dataclass(frozen=True)
class Read:
    """One read of a test split by a result.

    Args:
        test_set: the rows or tasks scored (``"rt_sentences:test"``).
        protocol: the protocol file it ran under.
        section: the result's section the read belongs to (``""``: the whole result).
    """

    test_set: str
    protocol: Path | str
    section: str = ""


def load(test_set: str, ledger: Path | None = None) -> list[dict[str, Any]]:
    """``test_set``'s reads, oldest first (``[]`` when there are none).

    Raises:
        ValueError: the file is not a JSON object with a ``reads`` list (naming the file).
    """
    path = ledger_file(test_set, ledger)
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("reads"), list):
        raise ValueError(f"{path}: reads: expected a list of test reads")
    return data["reads"]


def _save(test_set: str, entries: list[dict[str, Any]], ledger: Path | None) -> None:
    path = ledger_file(test_set, ledger)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"about": "reads of this test split, oldest first: benchmarks/evidence/ledger.py",
                               "test_set": test_set, "reads": entries}, indent=1) + "\n")
    os.replace(tmp, path)


def backfill(test_set: str, protocol: str, protocol_sha256: str, result: str, commit: str, date: str,
             note: str, ledger: Path | None = None) -> None:
    """Append a read made before the ledger existed, as git history shows it (``protocol``: the
    path it ran under, ``protocol_sha256``: of that file at ``commit`` — ``git show
    COMMIT:PATH | sha256sum`` — or a label such as ``"none: stop 27"`` where a choice was made
    on the test split without a protocol). Entries stay in the order they are appended: backfill
    oldest first. An equal (protocol version, result) entry is not added twice."""
    entries = load(test_set, ledger)
    if any((e["protocol_sha256"], e["result"]) == (protocol_sha256, result) for e in entries):
        return
    entries.append({"test_set": test_set, "protocol": protocol, "protocol_sha256": protocol_sha256,
                    "result": result, "commit": commit, "date": date, "note": note})
    _save(test_set, entries, ledger)


def assess(entries: list[dict[str, Any]], test_set: str, sha: str, result: str) -> dict[str, Any]:
    """The ledger's verdict on one read (``entries``: the test set's reads; the read is placed where an
    equal entry already is, else after every entry).

    Returns:
        ``{"test_set", "test_reads_before", "exploratory", "why"}``.
    """
    pos = next((i for i, e in enumerate(entries) if (e["protocol_sha256"], e["result"]) == (sha, result)),
               len(entries))
    earlier = entries[:pos]
    other = [e for e in earlier if e["protocol_sha256"] != sha]
    why = ""
    if other:
        seen = sorted({f"{e['protocol']} ({e['result']}, {e['commit'][:7]})" for e in other})
        why = f"{test_set} was read before this protocol version by " + "; ".join(seen)
    return {"test_set": test_set, "test_reads_before": len(earlier), "exploratory": bool(other), "why": why}


def record(read: Read, result: str, *, write: bool = True, ledger: Path | None = None,
           note: str = "") -> dict[str, Any]:
    """Record ``read`` by ``result`` (e.g. ``"dht.json#rt"``) and return what the result stores:
    ``{"protocol", "protocol_sha256", "test_set", "test_reads_before", "exploratory", "why"}``.

    With ``write=False`` (``check``) the ledger is left as it is and the verdict is the one an
    append would give. Recording the same (test set, protocol version, result) twice changes
    nothing.
    """
    proto = protocol_record(read.protocol)
    entries = load(read.test_set, ledger)
    verdict = assess(entries, read.test_set, proto["sha256"], result)
    known = any((e["protocol_sha256"], e["result"]) == (proto["sha256"], result) for e in entries)
    if write and not known:
        entries.append({"test_set": read.test_set, "protocol": proto["path"], "protocol_sha256": proto["sha256"],
                        "result": result, "commit": git_commit(),
                        "date": datetime.date.today().isoformat(), "note": note})
        _save(read.test_set, entries, ledger)
    return {"protocol": proto["path"], "protocol_sha256": proto["sha256"], **verdict}
