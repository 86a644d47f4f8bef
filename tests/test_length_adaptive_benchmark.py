"""benchmarks/length/length_adaptive.py's bookkeeping on the committed rows (fast, no training): each
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
    return load_benchmark("length.length_adaptive")


def _rows(la, **kw):
    return list(la.rows_of(la.RUNS, la.protocol(**kw)).values())


@pytest.mark.parametrize("name, kw", [("length_adaptive", {"ld_steps": 1452, "ld_from": "full", "device": "cuda", "v3": True}),
                                      ("length_adaptive_5ep_test2k", {"ld_steps": 1452, "ld_from": "full", "device": "cuda"}),
                                      ("length_adaptive_2ep_cpu", {"ld_steps": 600, "ld_from": "full"}),
                                      ("length_adaptive_from_short", {"ld_steps": 600})])
def test_reported_summary_regenerates_from_the_rows_of_its_protocol(la, name, kw):
    result = json.loads((ROOT / "benchmarks" / "length" / "results" / f"{name}.json").read_text())
    seeds = result["provenance"]["seeds"]
    rows = {r["seed"]: r for r in _rows(la, **kw)}
    assert sorted(rows) == sorted(seeds)
    assert la.summarize([rows[s] for s in seeds]) == result["summary"]
    assert result["ledger"][""]["test_set"] == "20newsgroups:test" and result["exploratory"] is True


def test_check_regenerates_every_stored_result():
    la = load_benchmark("length.length_adaptive")
    assert la.main(["check"]) == 0


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


def test_the_gpu_protocol_is_a_protocol_of_its_own(la):
    cpu, gpu = la.protocol(1452, ld_from="full"), la.protocol(1452, ld_from="full", device="cuda")
    assert "device" not in cpu and gpu["device"] == "cuda" and {**gpu, "device": None} != cpu
    assert la.protocol(600, ld_from="full") == la.protocol(600, ld_from="full", device="cpu")  # old rows keep theirs
    committed = json.loads((ROOT / "benchmarks" / "length" / "protocols" / "length_adaptive_5ep.json").read_text())
    assert committed["seeds"] == [0, 1, 2] and committed["ld_steps"].startswith("1452 ")
    assert 1452 * la.BATCH <= 5 * 9293 < 1453 * la.BATCH  # 5 epochs of the 9,293 training documents


def test_issue_67s_protocol_reads_every_test_document_at_three_seeded_budgets(la):
    """The v3 rows are a protocol of their own (the issue-39 rows stay theirs), read the whole test
    set, seed a constant-ratio gene per budget into the search and carry the LengthDrop-steps curve
    from step 0 to the last step, for the sub-models and for the equal-steps control."""
    v3 = la.protocol(1452, ld_from="full", device="cuda", v3=True)
    assert v3 != la.protocol(1452, ld_from="full", device="cuda") and v3["test_n"] == "all"
    assert v3["budgets"] == [0.55, 0.5, 0.35] == v3["seeded_budgets"]
    rows = _rows(la, ld_steps=1452, ld_from="full", device="cuda", v3=True)
    assert sorted(r["seed"] for r in rows) == [0, 1, 2]
    for r in rows:
        assert len(r["rows"]["full"]["test_correct"]) == 7528
        assert set(r["seeded"]) == {"0.55", "0.5", "0.35"}
        steps = sorted(int(k) for k in r["curve"]["adaptive"])
        assert steps[0] == 0 and steps[-1] == 1452 and steps[1:-1] == list(range(100, 1452, 100))
        assert sorted(int(k) for k in r["curve"]["control"]) == steps


def _row(seed, full, adaptive_05, adaptive_035, trunc_05):
    def r(bits):
        return {"test_correct": bits, "test_accuracy": bits.count("1") / len(bits), "length_config": [seed],
                "wall_over_flops_b32": 1.0, "wall_over_flops_b1": 1.0}
    return {"seed": seed, "rows": {"full": r(full), "adaptive_0.5": r(adaptive_05), "adaptive_0.35": r(adaptive_035),
                                   "truncation_0.5": r(trunc_05)}}


def test_summary_intervals_are_paired_over_documents_and_pooled_over_seeds(la):
    n = 400
    full = "1" * 300 + "0" * 100
    rows = [_row(0, full, "1" * 296 + "0" * 104, "1" * 290 + "0" * 110, "1" * 280 + "0" * 120),
            _row(1, full, "1" * 292 + "0" * 108, "1" * 288 + "0" * 112, "1" * 284 + "0" * 116)]
    summary = la.summarize(rows)
    assert summary["lat_acc_drop_pts_at_0.5"] == pytest.approx(100 * 6 / n)  # (4 + 8) / 2 rows of 400
    lo, hi = summary["lat_acc_drop_pts_at_0.5_ci"]
    assert 0 < lo < 100 * 6 / n < hi  # the adaptive model is wrong only where the full one is: an interval above 0
    ci = la.intervals(rows)["lat_acc_drop_pts_at_0.5"]
    assert ci["per_seed"][0]["mean"] == 1.0 and ci["per_seed"][1]["mean"] == 2.0
    # pooling over seeds narrows the interval of the noisier seed's alone
    width = {k: v["ci95"][1] - v["ci95"][0] for k, v in [("pooled", ci["pooled"]), ("s1", ci["per_seed"][1])]}
    assert width["pooled"] < width["s1"]
    # paired: two models wrong on the same half of the documents differ by exactly 0 (an unpaired
    # bootstrap of the two accuracies would give about +-7 points)
    half = "1" * 200 + "0" * 200
    same = la.intervals([_row(0, half, half, half, half)])["lat_acc_drop_pts_at_0.5"]["pooled"]
    assert same == {"mean": 0.0, "ci95": [0.0, 0.0]}
    # rows without per-document results (the CPU protocol's) get no interval
    for r in rows:
        del r["rows"]["full"]["test_correct"]
    assert "lat_acc_drop_pts_at_0.5_ci" not in la.summarize(rows)


def test_paired_bootstrap_refuses_rows_of_different_lengths():
    from benchmarks.evidence.stats import paired_bootstrap

    with pytest.raises(ValueError, match="one length"):
        paired_bootstrap([("101", "10")])
    with pytest.raises(ValueError):
        paired_bootstrap([])


def test_seeded_configurations_fit_their_budgets_as_the_evaluation_counts_flops(la):
    """Issue 67's seeded genes: ``executed_flops`` (no model run) equals the FLOPs ``evaluate``
    reports for the same configuration, and each budget's constant-ratio gene is valid (non-increasing,
    not below the floor), within ``q`` x the full model's FLOPs, and distinct from the others'."""
    import torch

    from archsearch.dynamic.length.config import smallest_length_config
    from archsearch.models.transformer import Transformer, TransformerConfig

    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=50, max_len=40, n_layers=4, d_model=32, n_heads=4, d_ffn=64,
                            dropout=0.0, n_classes=3, task="classification")
    model = Transformer(cfg).eval()
    lengths = torch.randint(5, 41, (37,))
    ids = torch.randint(1, 50, (37, 40))
    mask = torch.arange(40)[None, :] < lengths[:, None]
    split = type("S", (), {"input_ids": ids * mask, "attention_mask": mask, "labels": torch.randint(0, 3, (37,))})
    batches = la.sorted_batches(split, torch.arange(37), 8)
    floor = smallest_length_config(4, 40, 0.6)  # ~0.3x here: every budget is above it
    for gene in (None, floor, (30, 20, 12, 9)):
        variant = ("full", None) if gene is None else ("adaptive", gene, "significance")
        assert la.executed_flops(cfg, batches, gene) == pytest.approx(la.evaluate(model, batches, variant)[1])
    full = la.executed_flops(cfg, batches, None)
    seeded = la.seeded_configs(cfg, batches, (0.55, 0.5, 0.35), floor)
    for q, gene in seeded.items():
        assert all(a >= b for a, b in zip(gene, floor)) and list(gene) == sorted(gene, reverse=True)
        assert la.executed_flops(cfg, batches, gene) <= q * full
    assert seeded[0.55] != seeded[0.5] != seeded[0.35]
