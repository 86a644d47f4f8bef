"""archsearch.metrics is the one table of metrics: every other metric table is derived from it,
so adding a metric is adding one row."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from archsearch import metrics
from archsearch.metrics import METRICS, Metric

ROOT = Path(__file__).resolve().parents[1]


def derived_tables() -> dict[str, tuple[object, object]]:
    """Every table derived from the registry: name -> (the table, what the registry says)."""
    from archsearch import space
    from archsearch.report import records, values
    from archsearch.search import base

    rows = METRICS.values()
    return {
        "space.METRICS": (dict(space.METRICS), {m.name: m.mode for m in rows}),
        "report.values.METRIC_UNITS": (dict(values.METRIC_UNITS), {m.name: m.unit for m in rows}),
        "report.values.LOG_SCALE_METRICS": (set(values.LOG_SCALE_METRICS), {m.name for m in rows if m.log_scale}),
        "search.base.KNOWN_COST_METRICS": (set(base.KNOWN_COST_METRICS), {m.name for m in rows if m.known_cost}),
        "report.records.MODEL_METRICS": (set(records.MODEL_METRICS), {m.name for m in rows if m.per_model}),
    }


def test_every_derived_table_agrees_with_the_registry():
    for name, (table, expected) in derived_tables().items():
        assert table == expected, name
    assert list(metrics.DIRECTIONS) == list(METRICS)  # the registry's order
    assert all(m.mode in ("max", "min") and m.unit and m.meaning for m in METRICS.values())
    assert all(name == m.name for name, m in METRICS.items())


def test_a_new_row_shows_up_in_every_derived_table(monkeypatch):
    from archsearch.report.values import metric_label
    from archsearch.space import parse_space

    monkeypatch.setitem(METRICS, "energy_j", Metric("energy_j", "min", "J", "energy per sample",
                                                    log_scale=True, known_cost=True, per_model=True))
    for name, (table, expected) in derived_tables().items():
        assert "energy_j" in table and table == expected, name
    assert metric_label("energy_j") == "energy_j [J]"
    assert metrics.KNOWN_COSTS & {"energy_j", "accuracy"} == {"energy_j"}
    # a space may name it as an objective and a constraint
    space = parse_space({"name": "t", "objectives": [{"metric": "accuracy", "mode": "max"},
                                                     {"metric": "energy_j", "mode": "min"}],
                         "constraints": {"energy_j": {"max": 1.0}},
                         "params": {"lr": {"type": "float", "low": 1e-4, "high": 1e-3}}})
    assert [o.metric for o in space.objectives] == ["accuracy", "energy_j"]
    monkeypatch.delitem(METRICS, "energy_j")
    for name, (table, expected) in derived_tables().items():
        assert "energy_j" not in table and table == expected, name
    assert "energy_j" not in metrics.KNOWN_COSTS and len(metrics.UNITS) == len(METRICS)


def test_views_are_read_only_and_answer_like_the_tables_they_replace():
    with pytest.raises(KeyError):
        metrics.UNITS["no_such_metric"]
    with pytest.raises(KeyError):
        metrics.Column("unit", lambda m: m.known_cost)["accuracy"]  # exists, not in this view
    assert metrics.UNITS.get("no_such_metric") is None and "accuracy" in metrics.DIRECTIONS
    assert 3 not in metrics.KNOWN_COSTS and "accuracy" not in metrics.KNOWN_COSTS
    assert isinstance(metrics.KNOWN_COSTS | {"x"}, frozenset)
    with pytest.raises(TypeError):
        metrics.UNITS["accuracy"] = "%"  # type: ignore[index]


@pytest.mark.parametrize("doc", ["README.md", "docs/design.md"])
def test_the_docs_metric_tables_are_generated_from_the_registry(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    found = re.search(r"<!-- metrics:begin[^\n]*-->\n(.*?)\n<!-- metrics:end -->", text, re.S)
    assert found, f"{doc} lacks the metrics:begin / metrics:end markers"
    assert found.group(1) == metrics.markdown_table(), (
        f"{doc}'s metric table is stale: replace it with `python -m archsearch.metrics`")


def test_metrics_imports_nothing_heavy():
    code = ("import sys, archsearch.metrics; heavy = [m for m in ('torch', 'numpy', 'ray', 'pydantic', "
            "'yaml') if m in sys.modules]; assert not heavy, heavy; "
            "assert not [m for m in sys.modules if m.startswith('archsearch.') and m != 'archsearch.metrics']")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
