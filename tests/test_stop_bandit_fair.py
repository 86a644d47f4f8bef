"""benchmarks/depth/stop_bandit_fair.py (issue 63, deliverable 2): the shipped exploration scale
of ``dht_stop_rule: bandit`` is the one its protocol chose on validation, and on a stored model
that scale plays both arms where today's earlier 0.3 never went on from exit 1."""

from __future__ import annotations

import json

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def fair():
    return load_benchmark("depth.stop_bandit_fair")


def test_the_default_alpha_is_the_one_chosen_on_validation(fair):
    from archsearch.dynamic.depth.settings import DHTSettings

    got = json.loads(fair.RESULT.read_text())
    s = got["summary"]
    assert s["chosen_alpha"] == DHTSettings().dht_stop_alpha
    assert s["chosen_alpha"] == max(fair.ALPHAS, key=lambda a: (s[f"val_score_bandit{a:g}"], -a))
    assert got["provenance"]["selection_split"] == "validation"
    for name in ("rt", "election_tweets"):
        plays = s[name]["plays_stop_continue_per_exit"]
        assert plays["0.3"][0][1] == 0  # the measured failure: no "continue" at exit 1
        share = plays[f"{s['chosen_alpha']:g}"][0][1] / sum(plays[f"{s['chosen_alpha']:g}"][0])
        assert share == pytest.approx(s[name]["bandit_continue_share_exit1"], abs=1e-3)


def test_plays_are_counted_on_a_stored_model(fair):
    """On seed 0's stored rt exits, the bandit at the chosen scale learns from both arms at
    every exit; at 0.3 it stops at exit 1 on every row while learning."""
    from benchmarks.depth import dht_seeded as ds
    from benchmarks.depth import stop_bandit as sb

    val, _ = sb.tables(ds.DATASETS["rt"]["dumps"], 0, ds.chosen_recipe())
    low = fair.plays_at_budget(0.3, val)
    assert low[0, 1] == 0 and low[0, 0] == 3 * len(val["correct"])  # 3 passes, all stopped
    chosen = fair.plays_at_budget(json.loads(fair.RESULT.read_text())["summary"]["chosen_alpha"], val)
    assert (chosen > 0).all()
