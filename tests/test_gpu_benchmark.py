"""benchmarks/gpu.py: its summary arithmetic, and a real (time-boxed) run on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, load_benchmark


def test_paired_bootstrap_is_centred_on_the_gain_and_narrows_with_rows():
    gpu = load_benchmark("gpu")
    a, b = "1" * 60 + "0" * 40, "1" * 50 + "0" * 50  # a right on 10 more rows of 100: +10 points
    r = gpu.paired_bootstrap(a, b)
    assert r["mean"] == 10.0 and r["ci95"][0] < 10.0 < r["ci95"][1]
    wide = gpu.paired_bootstrap(a, b)["ci95"]
    narrow = gpu.paired_bootstrap(a * 10, b * 10)["ci95"]
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    assert gpu.paired_bootstrap(a, a) == {"mean": 0.0, "ci95": [0.0, 0.0]}


def test_summary_ratios_come_from_the_rows():
    gpu = load_benchmark("gpu")
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
    gpu = load_benchmark("gpu")

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


@pytest.mark.slow
def test_a_time_boxed_cpu_run_writes_rows_and_a_summary(tmp_path):
    out, rows = tmp_path / "gpu.json", tmp_path / "rows.jsonl"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "run", "--device", "cpu",
                           "--quick", "--max-seconds", "1", "--rounds", "1", "--out", str(out), "--rows", str(rows)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    (row,) = data["rows"]  # the time box lets exactly the first row run
    assert row["name"] == "static6/s0/fp32" and len(row["correct"]) > 0 and row["wall_s_b1"] > 0
    assert data["summary"]["device"] == "cpu" and data["provenance"]["protocol"] == "benchmarks/protocols/gpu.json"
