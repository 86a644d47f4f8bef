"""benchmarks/length_adaptive.py's bookkeeping on the committed rows (fast, no training): each
reported JSON's summary is what ``summarize`` gives on the rows of its protocol, and the
protocol of a row is recognised, so a rerun resumes after it instead of training it again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def la():
    return load_benchmark("length_adaptive")


def _rows(la, **kw):
    want = la.protocol(**kw)
    return [r for r in map(json.loads, la.RUNS.read_text().splitlines()) if r.get("protocol") == want]


@pytest.mark.parametrize("name, kw", [("length_adaptive", {"ld_steps": 600, "ld_from": "full"}),
                                      ("length_adaptive_from_short", {"ld_steps": 600})])
def test_reported_summary_regenerates_from_the_rows_of_its_protocol(la, name, kw):
    result = json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())
    seeds = result["provenance"]["seeds"]
    rows = {r["seed"]: r for r in _rows(la, **kw)}
    assert sorted(rows) == sorted(seeds)
    summary, met = la.summarize([rows[s] for s in seeds])
    assert summary == result["summary"] and met == result["targets_met"]


def test_ld_from_full_is_a_protocol_of_its_own(la):
    short, full = la.protocol(600), la.protocol(600, ld_from="full")
    assert "ld_from" not in short and full["ld_from"] == "full" and short != full
    assert full["full"] == "std_steps + 2 * ld_steps (equal steps)"
    rows = _rows(la, ld_steps=600, ld_from="full")
    assert sorted(r["seed"] for r in rows) == [0, 1]
    # the model LengthDrop started from is a row of its own; "full" trained as many steps as adaptive
    for row in rows:
        assert {"full", "full_300_steps", "full_900_steps", "adaptive_1.0"} <= set(row["rows"])
    assert all(r["protocol"] != full for r in _rows(la, ld_steps=600))
