"""benchmarks/stop_bandit.py (issue 36, deliverable 5) on stored outputs: the choice is made on
validation rows only, and every test key gets its paired interval."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import load_benchmark
from test_dht_seeded_benchmark import store


@pytest.fixture(scope="module")
def sb():
    return load_benchmark("stop_bandit")


def test_the_choice_reads_validation_only_and_the_keys_carry_intervals(sb, tmp_path, monkeypatch):
    import dht_seeded

    import stop_policies

    monkeypatch.setattr(dht_seeded, "chosen_recipe", lambda: None)  # the stored model is "dht"
    monkeypatch.setattr(dht_seeded, "BUDGETS", (0.3, 0.5, 0.65))  # fewer budgets: a faster test
    monkeypatch.setattr(stop_policies, "BUDGETS", (0.4, 0.5, 0.6))
    dumps = {"a": tmp_path / "a"}
    store(dumps["a"], 120, 0, {})
    out = tmp_path / "r.json"
    assert sb.analyze(dumps, out, draws=40, seeds=(0,)) == 0
    r = json.loads(out.read_text())
    s = r["summary"]
    assert s["chosen"] in sb.CANDIDATES and r["provenance"]["selection_split"] == "validation"
    best = max(sb.CANDIDATES, key=lambda p: (s[f"val_score_{p}"], p == sb.DEFAULT))
    assert s["chosen"] == best
    for name in dumps:
        for key in [*sb.PAIRS, "chosen_minus_tuned_pts_at_0.5"]:
            lo, hi = s[name][f"{key}_ci"]
            assert lo <= s[name][key] + 1e-9 and s[name][key] <= hi + 1e-9, (key, s[name][key], lo, hi)
        assert 0 < s[name][f"test_acc_{sb.BANDIT}_at_0.5"] <= 1
    # scramble every test row: the validation scores and the choice do not move; test keys do
    for d in dumps.values():
        z = dict(np.load(d / "dht_seed0.npz"))
        z["test_y"] = (z["test_y"] + 1) % 3
        np.savez(d / "dht_seed0.npz", **z)
    assert sb.analyze(dumps, out, draws=40, seeds=(0,)) == 0
    s2 = json.loads(out.read_text())["summary"]
    assert s2["chosen"] == s["chosen"]
    assert all(s2[k] == s[k] for k in s if k.startswith("val_score_"))
    assert s2["a"][f"test_acc_{sb.BANDIT}_at_0.5"] != s["a"][f"test_acc_{sb.BANDIT}_at_0.5"]
