"""benchmarks/tying/tying.py's bookkeeping (fast, no long training): the reported summary is what
``summarize`` gives on the committed rows of its setup; ``converged`` fails on a curve that does
not overfit; the measured training-state memory counts a frozen alias's memory once and no
gradient or optimizer state for it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tb():
    return load_benchmark("tying.tying")


def _row(variant, seed, best, params, curve=None, mb=1.0):
    curve = curve or [3.0, 2.5, 2.2, 2.3, 2.4]
    return {"variant": variant, "seed": seed, "best_val_ppl": best, "final_val_ppl": best + 1,
            "test_ppl_at_best_val": best, "params_trainable": params, "state_peak_mb": mb * params / 100,
            "best_step": 300, "train_seconds": 1.0, "tying_map": [0], "n_distinct_layers": 1,
            "curve": [{"val_loss": v} for v in curve]}


def _rows(tb, none_curve=None):
    rows = {}
    for s in (0, 1, 2):
        for v, best, params in [("none", 9.0, 100), ("all", 9.5, 20), ("every_2", 8.9, 50),
                                ("every_4", 8.8, 30), ("rl", 9.2, 50), ("paper", 8.7, 30),
                                ("rl_fixed", 9.0, 50), ("paper_fixed", 8.75, 30)]:
            rows[(v, s)] = _row(v, s, best, params, none_curve if v == "none" else None)
    return rows


def test_summary_follows_the_protocol_and_converged_can_fail(tb):
    summary, _, extra = tb.summarize(_rows(tb), [0, 1, 2])
    assert summary["tied_minus_untied_best_val_ppl"] == pytest.approx(-0.2)  # every_4 - none
    assert summary["tying_params_ratio"] == pytest.approx(0.3)
    assert summary["tying_state_memory_ratio"] == pytest.approx(0.3)
    # rl (50 params): the best fixed map of <= 50 params is every_4 (8.8): +0.4; paper (30 params):
    # its control paper_fixed (8.75) beats every_4 (8.8): -0.05; the key is the better agent's
    assert extra["agent_minus_best_fixed"] == pytest.approx({"rl": 0.4, "paper": -0.05})
    assert extra["better_agent"] == "paper" and summary["rl_minus_best_fixed_best_val_ppl"] == pytest.approx(-0.05)
    assert summary["converged"] is True  # minimum at 3/5 of the steps, final 9% above it
    # a curve still falling at the end, one whose minimum is the last point, or a flat tail fail
    for curve in ([3.0, 2.5, 2.3, 2.2, 2.1], [3.0, 2.5, 2.2, 2.1, 2.1], [3.0, 2.2, 2.21, 2.21, 2.205]):
        assert tb.summarize(_rows(tb, curve), [0, 1, 2])[0]["converged"] is False
    assert "switch_minus_best_fixed_best_val_ppl" not in extra  # the addenda are optional


def test_the_addenda_are_scored_after_their_switch(tb):
    rows = _rows(tb)
    for s in (0, 1, 2):
        for v, after in (("switch_every_2", 8.7), ("switch_every_4", 8.9), ("switch", 8.6 + 0.1 * s)):
            params = 50 if v == "switch_every_2" else 30
            rows[(v, s)] = {**_row(v, s, 8.0, params), "best_val_ppl_after_switch": after, "switch_step": 300}
    summary, agg, extra = tb.summarize(rows, [0, 1, 2])
    # scored on the minimum after the switch (8.0, the untied part, is not theirs)
    assert extra["hindsight_switch_minus_fixed_best_val_ppl"] == pytest.approx({"every_2": -0.2, "every_4": 0.1})
    # switch (30 params): the best fixed map of <= 30 params is every_4 (8.8); all (20) is worse
    assert extra["switch_minus_best_fixed_per_seed"] == pytest.approx([-0.2, -0.1, 0.0])
    assert extra["switch_best_fixed_per_seed"] == ["every_4"] * 3
    assert "switch" in agg and summary["rl_minus_best_fixed_best_val_ppl"] == pytest.approx(-0.05)  # the agents' key unchanged


def test_measured_memory_counts_a_frozen_alias_once_without_gradient_or_state(tb):
    from archsearch.dynamic.tying.maps import apply_tying_map
    from archsearch.models.transformer import Transformer, TransformerConfig

    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=20, max_len=16, n_layers=4, d_model=16, n_heads=2,
                                          d_ffn=32, dropout=0.0, task="lm"))

    def trained_bytes(m):
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad])
        m(torch.randint(0, 20, (2, 8))).float().sum().backward()
        opt.step()
        return tb.measured_state_bytes(m, opt)

    untied = trained_bytes(copy.deepcopy(model))
    per_block = sum(p.numel() * 4 for p in model.blocks[0].parameters())
    steps = 4 * len(list(model.blocks[0].parameters()))  # AdamW's scalar float32 "step" per tensor
    frozen, shared = copy.deepcopy(model), copy.deepcopy(model)
    apply_tying_map(frozen, [0, 0, 0, 3], frozen=True)
    apply_tying_map(shared, [0, 0, 0, 3])
    # two tied blocks: their weights, gradients, both Adam moments and step counters are gone
    assert untied - trained_bytes(frozen) == 2 * (4 * per_block + steps)
    assert untied - trained_bytes(shared) == 2 * (4 * per_block + steps)
    broken = copy.deepcopy(model)  # frozen *copies* still hold their weights: caught
    for i in (1, 2):
        for (name, p), q in zip(broken.blocks[i].named_parameters(), broken.blocks[0].parameters()):
            mod, attr = broken.blocks[i].get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2]
            setattr(mod, attr, torch.nn.Parameter(q.detach().clone(), requires_grad=False))
    assert untied - trained_bytes(broken) == 2 * (3 * per_block + steps)


def test_reported_summary_regenerates_from_the_rows_of_its_setup(tb):
    result = json.loads((ROOT / "benchmarks" / "tying" / "results" / "tying.json").read_text())
    seeds = result["provenance"]["seeds"]
    rows = tb.read_rows(tb.RUNS, result["setup"])
    summary, _, _ = tb.summarize(rows, seeds)
    assert summary == result["summary"]
    assert result["ledger"][""]["test_set"] == "shakespeare:test" and result["exploratory"] is True
    assert tb.main(["check"]) == 0  # the stored result regenerates identically
