"""benchmarks/gpu/gpu.py: its summary arithmetic, the stored gpu.json regenerated from the committed
device calls' rows, and a real (time-boxed) run on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, load_benchmark


def test_paired_bootstrap_is_centred_on_the_gain_and_narrows_with_rows():
    gpu = load_benchmark("gpu.gpu")
    a, b = "1" * 60 + "0" * 40, "1" * 50 + "0" * 50  # a right on 10 more rows of 100: +10 points
    r = gpu.paired_bootstrap(a, b)
    assert r["mean"] == 10.0 and r["ci95"][0] < 10.0 < r["ci95"][1]
    wide = gpu.paired_bootstrap(a, b)["ci95"]
    narrow = gpu.paired_bootstrap(a * 10, b * 10)["ci95"]
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    assert gpu.paired_bootstrap(a, a) == {"mean": 0.0, "ci95": [0.0, 0.0]}


def test_summary_ratios_come_from_the_rows():
    gpu = load_benchmark("gpu.gpu")
    rows = [{"name": "static6/s0/fp32", "device": "cpu", "wall_s_b1": 2.0, "train_seconds": 10.0,
             "flops_per_sample": 100.0, "accuracy": 0.8},
            {"name": "dht@0.5/s0/fp32", "wall_s_b1": 1.0, "train_seconds": 15.0, "flops_per_sample": 50.0,
             "accuracy": 0.79}]
    s = gpu.summarize(rows)
    assert s["dht_wall_ratio_b1_at_0.5"] == 0.5 and s["dht_train_time_ratio"] == 1.5
    assert s["dht_flops_ratio_at_0.5"] == 0.5 and s["confidence_exit_wall_ratio_b1_at_0.5"] is None


def test_the_routed_forward_choice_follows_the_protocol_rule_on_validation_accuracy():
    """'shared' is chosen when its mean validation accuracy over 3 seeds is at most 0.5 points
    below 'separate''s, whatever the test rows say; the dht_* keys then come from its rows; with a
    seed missing, or 0.6 points below, 'separate' stays."""
    gpu = load_benchmark("gpu.gpu")

    def rows(shared_val, shared_seeds=3):
        out = [{"name": "static6/s0/fp32", "device": "cuda", "wall_s_b1": 2.0, "train_seconds": 10.0,
                "flops_per_sample": 100.0, "accuracy": 0.8}]
        for k in range(3):
            out.append({"name": f"dht@0.5/s{k}/fp32", "val_accuracy": 0.800, "accuracy": 0.70,
                        "train_seconds": 20.0, "wall_s_b1": 1.0, "flops_per_sample": 50.0, "correct": "10"})
            if k < shared_seeds:
                out.append({"name": f"dht+shared@0.5/s{k}/fp32", "val_accuracy": shared_val, "accuracy": 0.90,
                            "train_seconds": 12.0, "wall_s_b1": 0.5, "flops_per_sample": 50.0, "correct": "11"})
        return out

    s = gpu.summarize(rows(0.796))
    assert s["dht_routed_forward_chosen"] == "shared" and s["dht_shared_minus_separate_val_acc_pts"] == -0.4
    assert s["dht_train_time_ratio"] == 1.2 and s["dht_wall_ratio_b1_at_0.5"] == 0.25
    assert s["dht_accuracy_at_0.5"] == pytest.approx(0.9) and s["dht_separate_train_time_ratio"] == 2.0
    for bad in (gpu.summarize(rows(0.794)), gpu.summarize(rows(0.9, shared_seeds=2))):
        assert bad["dht_routed_forward_chosen"] == "separate" and bad["dht_train_time_ratio"] == 2.0
        assert bad["dht_accuracy_at_0.5"] == pytest.approx(0.7)


def test_timings_are_compared_within_a_machine_and_the_worst_machine_is_reported():
    """A ratio never divides one machine's seconds by another's: each machine's rows give their
    own ratios (``by_machine``); the top-level key is the worst machine's; a machine without the
    full model's row gives none; accuracy keys read every row."""
    gpu = load_benchmark("gpu.gpu")

    def row(name, machine, wall, acc):
        return {"name": name, "machine": machine, "device": "cuda", "wall_s_b1": wall, "train_seconds": wall,
                "flops_per_sample": 50.0 if "dht" in name else 100.0, "accuracy": acc}

    rows = [row("static6/s0/fp32", "a", 2.0, 0.8), row("dht@0.5/s0/fp32", "a", 1.0, 0.7),
            row("static6/s0/fp32", "b", 1.0, 0.8), row("dht@0.5/s0/fp32", "b", 0.8, 0.9),
            row("dht@0.5/s0/fp32", "c", 0.1, 0.9)]  # c has no full-model row: no ratio from it
    s = gpu.summarize(rows)
    assert s["by_machine"]["a"]["dht_wall_ratio_b1_at_0.5"] == 0.5
    assert s["by_machine"]["b"]["dht_wall_ratio_b1_at_0.5"] == 0.8 and "c" not in s["by_machine"]
    assert s["dht_wall_ratio_b1_at_0.5"] == 0.8 and s["dht_train_time_ratio"] == 0.8
    assert s["dht_accuracy_at_0.5"] == 0.9  # the last record of the name
    broken = [dict(r, machine="one") for r in rows]  # the same rows as if from one machine
    assert gpu.summarize(broken)["dht_wall_ratio_b1_at_0.5"] == 0.1  # mixes machines: c's 0.1 / b's 1.0


def test_merge_attributes_each_row_to_the_first_call_that_holds_it(tmp_path, monkeypatch):
    from benchmarks.evidence import ledger

    monkeypatch.setattr(ledger, "LEDGER", tmp_path / "ledger")  # the reads of these made-up rows stay here
    gpu = load_benchmark("gpu.gpu")
    base = {"seed": 0, "device": "cuda", "flops_per_sample": 100.0, "accuracy": 0.8, "train_seconds": 1.0}
    full_a = {**base, "name": "static6/s0/fp32", "wall_s_b1": 2.0}
    dht_a = {**base, "name": "dht@0.5/s0/fp32", "wall_s_b1": 1.0, "flops_per_sample": 50.0}
    dht_b = {**dht_a, "wall_s_b1": 0.3}
    full_b = {**full_a, "wall_s_b1": 0.5}
    calls = []
    for i, recs in enumerate(([full_a, dht_a], [full_a, dht_b], [full_a, dht_b, full_b])):
        p = tmp_path / f"call{i}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in recs))
        calls.append((str(p), "a" if i == 0 else "b"))
    out = tmp_path / "gpu.json"
    assert gpu.merge(calls, out) == 0
    data = json.loads(out.read_text())
    assert [(r["name"], r["machine"]) for r in data["rows"]] == [
        ("static6/s0/fp32", "a"), ("dht@0.5/s0/fp32", "a"), ("dht@0.5/s0/fp32", "b"), ("static6/s0/fp32", "b")]
    by = data["summary"]["by_machine"]
    assert by["a"]["dht_wall_ratio_b1_at_0.5"] == 0.5 and by["b"]["dht_wall_ratio_b1_at_0.5"] == 0.6
    assert data["summary"]["dht_wall_ratio_b1_at_0.5"] == 0.6


def test_check_regenerates_the_stored_result_from_the_committed_calls():
    gpu = load_benchmark("gpu.gpu")
    assert gpu.main(["check"]) == 0


@pytest.mark.slow
def test_a_time_boxed_cpu_run_writes_rows_and_a_summary(tmp_path):
    out, rows = tmp_path / "gpu.json", tmp_path / "rows.jsonl"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu.gpu", "run", "--device", "cpu",
                           "--quick", "--max-seconds", "1", "--rounds", "1", "--out", str(out), "--rows", str(rows)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    (row,) = data["rows"]  # the time box lets exactly the first row run
    assert row["name"] == "static6/s0/fp32" and len(row["correct"]) > 0 and row["wall_s_b1"] > 0
    assert data["summary"]["device"] == "cpu" and data["protocol"]["path"] == "benchmarks/gpu/protocols/gpu.json"
    assert "ledger" not in data  # a --quick smoke reads no test split of the protocol
