"""benchmarks/depth/head_gating.py (issue 36, deliverable 5) without training: the analysis of stored
per-row outcomes -- the gain is the paired difference, its interval is around it, and a
missing model stops the analysis instead of reporting a partial table."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import load_benchmark

from benchmarks.evidence.results import write_json


@pytest.fixture(scope="module")
def hg():
    return load_benchmark("depth.head_gating")


def store(out, n: int, acc: dict[str, float]) -> None:
    """Each model right on the first ``acc`` share of ``n`` test rows, at half the FLOPs."""
    out.mkdir(parents=True, exist_ok=True)
    for m in ("depth_only", "head_gating", "static3"):
        keys = ["static"] if m == "static3" else [f"b{b}" for b in (0.5, 0.33)]
        arrays = {}
        for k in keys:
            arrays.update({f"{k}_correct": np.arange(n) < round(acc[m] * n), f"{k}_flops": np.full(n, 1.0),
                           f"{k}_full_flops": np.full(n, 2.0)})
        np.savez(out / f"{m}.npz", **arrays)
        (out / f"{m}.json").write_text(json.dumps({"commit": "c", "train_s": 1.0, "wall_s": 2.0, "metrics": {}}))


def test_the_gain_is_the_paired_difference_with_an_interval_around_it(hg, tmp_path):
    store(tmp_path / "m", 400, {"depth_only": 0.6, "head_gating": 0.55, "static3": 0.5})
    write_json(tmp_path / "r.json", hg.analyze(tmp_path / "m", tmp_path / "r.json", draws=200, record_reads=False))
    s = json.loads((tmp_path / "r.json").read_text())["summary"]
    assert s["dht_head_gating_gain_pts_long_inputs"] == pytest.approx(-5.0)
    assert s["depth_only_gain_over_static_pts_at_0.5"] == pytest.approx(10.0)
    # the models are right on nested rows: every resample keeps head_gating <= depth_only
    lo, hi = s["dht_head_gating_gain_pts_long_inputs_ci"]
    assert lo < -5.0 < hi <= 0
    assert s["head_gating_0.5_flops_fraction"] == 0.5 and s["test_rows"] == 400


def test_a_missing_model_is_refused(hg, tmp_path):
    store(tmp_path / "m", 50, {"depth_only": 0.6, "head_gating": 0.55, "static3": 0.5})
    (tmp_path / "m" / "head_gating.npz").unlink()
    with pytest.raises(ValueError, match="not every model"):
        hg.analyze(tmp_path / "m", tmp_path / "r.json", draws=10, record_reads=False)
    assert not (tmp_path / "r.json").exists()


def test_the_stored_result_regenerates_from_the_stored_models(hg):
    """``check``: head_gating.json regenerates identically from benchmarks/depth/runs/head_gating/
    (provenance aside; the ledger's verdict included)."""
    assert hg.main(["check"]) == 0
