"""The test-read ledger: which protocol read which test split, in what order.

``benchmarks/ledger.json`` (committed) lists every read of a test split, oldest first, one entry
per (test set, protocol version, result): ``{"test_set", "protocol", "protocol_sha256",
"result", "commit", "date", "note"}``. A *test set* names the rows or tasks a claim is scored on
(``"rt_sentences:test"``, ``"lcbench:test_tasks"``...), shared by every protocol scoring them.

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

#: The committed ledger.
LEDGER = ROOT / "benchmarks" / "ledger.json"


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


def load(ledger: Path = LEDGER) -> list[dict[str, Any]]:
    """The ledger's entries, oldest first (``[]`` when there is none).

    Raises:
        ValueError: the file is not a JSON object with a ``reads`` list.
    """
    if not Path(ledger).exists():
        return []
    data = json.loads(Path(ledger).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("reads"), list):
        raise ValueError(f"{ledger}: reads: expected a list of test reads")
    return data["reads"]


def _save(entries: list[dict[str, Any]], ledger: Path) -> None:
    tmp = Path(ledger).with_name(Path(ledger).name + ".tmp")
    tmp.write_text(json.dumps({"about": "test reads, oldest first: benchmarks/evidence/ledger.py",
                               "reads": entries}, indent=1) + "\n")
    os.replace(tmp, ledger)


def assess(entries: list[dict[str, Any]], test_set: str, sha: str, result: str) -> dict[str, Any]:
    """The ledger's verdict on one read (``entries``: the ledger; the read is placed where an
    equal entry already is, else after every entry).

    Returns:
        ``{"test_set", "test_reads_before", "exploratory", "why"}``.
    """
    pos = next((i for i, e in enumerate(entries) if (e["test_set"], e["protocol_sha256"], e["result"])
                == (test_set, sha, result)), len(entries))
    earlier = [e for e in entries[:pos] if e["test_set"] == test_set]
    other = [e for e in earlier if e["protocol_sha256"] != sha]
    why = ""
    if other:
        seen = sorted({f"{e['protocol']} ({e['result']}, {e['commit'][:7]})" for e in other})
        why = f"{test_set} was read before this protocol version by " + "; ".join(seen)
    return {"test_set": test_set, "test_reads_before": len(earlier), "exploratory": bool(other), "why": why}


def record(read: Read, result: str, *, write: bool = True, ledger: Path = LEDGER,
           note: str = "") -> dict[str, Any]:
    """Record ``read`` by ``result`` (e.g. ``"dht.json#rt"``) and return what the result stores:
    ``{"protocol", "protocol_sha256", "test_set", "test_reads_before", "exploratory", "why"}``.

    With ``write=False`` (``check``) the ledger is left as it is and the verdict is the one an
    append would give. Recording the same (test set, protocol version, result) twice changes
    nothing.
    """
    proto = protocol_record(read.protocol)
    entries = load(ledger)
    verdict = assess(entries, read.test_set, proto["sha256"], result)
    known = any((e["test_set"], e["protocol_sha256"], e["result"]) == (read.test_set, proto["sha256"], result)
                for e in entries)
    if write and not known:
        entries.append({"test_set": read.test_set, "protocol": proto["path"], "protocol_sha256": proto["sha256"],
                        "result": result, "commit": git_commit(),
                        "date": datetime.date.today().isoformat(), "note": note})
        _save(entries, ledger)
    return {"protocol": proto["path"], "protocol_sha256": proto["sha256"], **verdict}
