"""benchmarks/tying/tying_regularised.py's bookkeeping (fast, no long training): the dropout is
chosen on validation per map, gaps and their block-bootstrap intervals come from the stored block
losses, merge meets the best fixed map of at most its size, and the saved-activation counter sees
what a backward pass keeps (and not the parameters)."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import load_benchmark


@pytest.fixture(scope="module")
def tr():
    return load_benchmark("tying.tying_regularised")


def _row(variant, best, params, block=None, n=64, **kw):
    """A row whose block losses average to log(best) (so exp(mean) = best)."""
    rng = torch.Generator().manual_seed(hash(variant) % 1000)
    noise = (torch.rand(n, generator=rng) - 0.5) * 0.02
    loss = (math.log(best) + noise - noise.mean()).tolist() if block is None else block
    return {"variant": variant, "best_val_ppl": best, "final_val_ppl": best + 1, "test_ppl_at_best_val": best,
            "params_trainable": params, "state_peak_mb": params / 100, "saved_peak_mb": 50.0,
            "peak_mb": 50.0 + params / 100, "best_step": 300, "val_block_loss": loss, "test_block_loss": loss, **kw}


def _rows(tr, with_addendum=False):
    best = {"none@0": 9.0, "none@0.1": 8.6, "none@0.2": 8.8,
            "every_4@0": 8.9, "every_4@0.1": 8.7, "every_4@0.2": 8.95}
    rows = {}
    for s in (0, 1, 2):
        for v, b in best.items():
            rows[(v, s)] = _row(v, b, 100 if v.startswith("none") else 27)
        if with_addendum:
            for d, e2, merged in ((0.0, 8.85, 8.8), (0.1, 8.5, 8.4)):
                rows[(f"every_2@{d:g}", s)] = _row(f"every_2@{d:g}", e2, 51)
                rows[(f"merge@{d:g}", s)] = _row(f"merge@{d:g}", 8.9, 51, best_val_ppl_after_merge_start=merged,
                                                 block=_row("m", merged, 51)["val_block_loss"], merge_start=1200,
                                                 tying_map=[0, 0, 2, 2, 4, 4, 6, 6])
    return rows


def test_the_dropout_is_chosen_per_map_on_validation_and_the_gaps_follow(tr):
    summary, agg = tr.summarize(_rows(tr), [0, 1, 2])
    assert (summary["untied_dropout"], summary["tied_dropout"]) == (0.1, 0.1)
    assert summary["tied_minus_untied_regularised_best_val_ppl"] == pytest.approx(0.1, abs=1e-3)  # 8.7 - 8.6
    assert summary["tied_minus_untied_unregularised_best_val_ppl"] == pytest.approx(-0.1, abs=1e-3)  # 8.9 - 9.0
    lo, hi = summary["tied_minus_untied_regularised_best_val_ppl_ci"]
    assert lo <= 0.1 <= hi and hi - lo < 0.2
    assert summary["tying_params_ratio"] == pytest.approx(0.27)
    assert summary["tying_peak_memory_ratio"] == pytest.approx((50 + 0.27) / (50 + 1.0))
    assert "merge_minus_best_fixed_best_val_ppl" not in summary  # the addendum is optional


def test_merge_meets_the_best_fixed_map_of_at_most_its_size(tr):
    summary, agg = tr.summarize(_rows(tr, with_addendum=True), [0, 1, 2])
    # at dropout 0.1: merge (51 params) after its start 8.4; fixed maps of <= 51: every_2 8.5, every_4 8.7
    assert summary["merge_minus_best_fixed_best_val_ppl"] == pytest.approx(-0.1, abs=1e-3)
    assert agg["merge@0.1"]["best_fixed_per_seed"] == ["every_2@0.1"] * 3
    assert summary["merge_params_ratio"] == pytest.approx(0.51)
    lo, hi = summary["merge_minus_best_fixed_best_val_ppl_ci"]
    assert lo <= -0.1 <= hi


def test_saved_bytes_count_what_backward_keeps_but_not_the_parameters(tr):
    lin = torch.nn.Linear(256, 256)
    ptrs = {p.untyped_storage().data_ptr() for p in lin.parameters()}
    saved = tr.SavedBytes(lambda: ptrs)
    x = torch.randn(64, 256, requires_grad=True)
    with saved:
        torch.relu(lin(x)).sum().backward()
    n = saved.take()
    # x (saved for the weight's gradient) and relu's output: 2 x 64 x 256 floats; the weight is excluded
    assert n == 2 * 64 * 256 * 4
    assert saved.take() == 0  # take() resets


def test_the_stored_result_regenerates_from_its_rows(tr):
    """``check``: tying_regularised.json regenerates identically from its committed rows."""
    assert tr.main(["check"]) == 0
