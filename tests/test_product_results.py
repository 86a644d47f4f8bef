"""The product question's results (``benchmarks/product/``) in the one schema.

``faults`` and ``scaling`` are rebuilt from their committed run logs; the others (export, fuzz,
report, minilm_search, baselines) need Ray, a real search, the fuzz campaign or a dataset, so
their ``check`` restates the stored result through the runner's own builder. Either way
``check`` must find the stored result identical (provenance aside).
"""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, load_benchmark

RUNNERS = ["faults", "scaling", "export", "fuzz", "report", "minilm_search", "baselines"]


@pytest.mark.parametrize("runner", RUNNERS)
def test_stored_result_regenerates_identically(runner, capsys):
    assert load_benchmark(f"product.{runner}").main(["check"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("runner", RUNNERS)
def test_result_is_in_the_one_schema(runner):
    result = json.loads((ROOT / "benchmarks" / "product" / "results" / f"{runner}.json").read_text())
    assert list(result)[0] == "summary" and "provenance" in result
    assert not {"targets_met", "targets_met_detail", "targets_total"} & set(result)
    assert "targets_met" not in result["summary"]
    for t in result.get("targets", {}).values():
        assert set(t) >= {"target", "value", "met"}
    if "protocol" in result:
        assert set(result["protocol"]) == {"path", "sha256"} and (ROOT / result["protocol"]["path"]).is_file()


def test_restating_keeps_every_number(tmp_path, monkeypatch):
    """An old-shape result (prose protocol, targets_met) restated: the summary and the other keys
    unchanged, the prose under ``method``, the targets evaluated."""
    from benchmarks.product import minilm_search, stored

    old = {"summary": {"minutes_to_beat_tfidf": 3.91, "beats_tfidf": True}, "provenance": {"wall_s": 1.0},
           "trials": [{"a": 1}], "targets": {"minutes_to_beat_tfidf": "<= 15"}, "targets_met": {"x": True},
           "protocol": "the prose"}
    path = tmp_path / "minilm_search.json"
    path.write_text(json.dumps(old))
    new = stored.restate(path, minilm_search.build, record_reads=False)
    assert new["summary"] == old["summary"] and new["provenance"] == old["provenance"]
    assert new["trials"] == old["trials"] and new["method"] == "the prose" and "targets_met" not in new
    assert new["targets"] == {"minutes_to_beat_tfidf": {"target": "<= 15", "value": 3.91, "met": True}}


def test_faults_node_driver_imports_the_package():
    """The node-killed driver (a child process) imports the runner as a package module, with the
    checkout on PYTHONPATH (set in the child's environment), never by editing the import path."""
    faults = load_benchmark("product.faults")
    assert "path.insert" not in faults.NODE_DRIVER and "argv[3]))" in faults.NODE_DRIVER
    assert "from benchmarks.product import faults as F" in faults.NODE_DRIVER
