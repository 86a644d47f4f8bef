"""benchmarks/evidence: the library every benchmark's numbers pass through.

The golden values were computed by the bodies the library replaced (benchmarks/common.py's
paired_bootstrap, dht_seeded.with_intervals, stop_policies.bootstrap_gain, schedulers.bootstrap_ratio,
searchers._paired_p and lcbench.compare, searchers.hv2_min) before they were removed, on the
inputs drawn here; a change to a draw order or a rule shows up as a failure.
"""

import json

import numpy as np
import pytest

from benchmarks.evidence import cli, frontier, ledger, results, stats, targets
from benchmarks.evidence.seeds import parse_seeds


def _inputs():
    rng = np.random.default_rng(42)
    s = ["".join(map(str, rng.integers(0, 2, 300))) for _ in range(4)]
    x = rng.normal(size=200)
    xs = [rng.uniform(1, 2, 5) for _ in range(4)]
    ys = [rng.uniform(1, 2, 5) for _ in range(4)]
    P = rng.uniform(0, 1, (30, 2))
    return s, x, xs, ys, P


def test_paired_bootstrap_golden():
    s, *_ = _inputs()
    assert stats.paired_bootstrap([(s[0], s[1]), (s[2], s[3])], n=500, seed=3) == {
        "mean": 1.167, "ci95": [-4.588, 6.587]}
    with pytest.raises(ValueError):
        stats.paired_bootstrap([("01", "011")])


def test_paired_bootstrap_stat_golden():
    _, x, *_ = _inputs()
    point, boot = stats.paired_bootstrap_stat(lambda idx: x[idx].mean(1), len(x), draws=1000, seed=0)
    assert float(point[0]) == pytest.approx(float(x.mean()))
    assert stats.bootstrap_ci(boot) == [-0.2187337879997406, 0.09089199710287942]


def test_grouped_bootstrap_golden():
    _, _, xs, ys, _ = _inputs()

    def ratio(idx):
        return np.median([np.median(a[i]) / np.median(b[i]) for a, b, i in zip(xs, ys, idx)])

    lo, hi = stats.grouped_bootstrap([5] * 4, ratio, draws=300, seed=0)
    assert [round(lo, 4), round(hi, 4)] == [0.8176, 1.1747]


def test_wilcoxon_one_rule():
    assert stats.wilcoxon([0.1, -0.3, 0.25, 0.4, 0.0, 0.5, 0.05]) == 0.21875  # zeros dropped
    x = np.array([3., 2., 5., 1., 4., 6., 7., 2.])
    y = np.array([2., 2., 3., 2., 1., 3., 5., 1.])
    assert stats.wilcoxon(x, y) == 0.0625  # the schedulers' old wilcoxon(x, y): same here
    assert stats.wilcoxon([1, 2, 3, 0, 0, 0]) is None  # fewer than 5 non-zero differences
    assert stats.wilcoxon([1, 1], [1, 1]) is None  # all equal: not tested (the old rule said 1.0)


def test_hypervolume_on_archsearch_pareto():
    *_, P = _inputs()
    assert frontier.hv2_min(P, [1.0, 1.1]) == pytest.approx(0.9217301046658691, rel=1e-12)
    assert frontier.hv2(-P, [-1.0, -1.1]) == pytest.approx(0.9217301046658691, rel=1e-12)
    assert frontier.hv2([], [0, 0]) == 0.0
    assert frontier.hv_history([[1, 1], [2, 2]], [0, 0]) == [1.0, 4.0]


def test_interp_at():
    assert stats.interp_at(0.5, [1.0, 0.25, 0.75], [90, 70, 80]) == 75.0


def test_targets_parse_evaluate_joint():
    assert targets.parse("<= 0.5") == ("<=", 0.5) and targets.parse(3) == ("<=", 3.0)
    for bad in ("~ 1", "<= x", "0.5"):
        with pytest.raises(ValueError):
            targets.parse(bad)
    summary = {"rt": {"gain_at_0.5": 1.7}, "ratio": 0.8, "p": 0.2, "nan": float("nan")}
    ev = targets.evaluate({"rt.gain_at_0.5": ">= 1.5", "ratio": {"target": "<= 0.85", "with": ["p"]},
                           "p": "< 0.05", "nan": "<= 1", "missing": ">= 0"}, summary)
    assert ev["rt.gain_at_0.5"] == {"target": ">= 1.5", "value": 1.7, "met": True}
    assert ev["ratio"]["met"] is False and ev["p"]["met"] is False  # joint: p misses
    assert ev["nan"]["met"] is False and ev["missing"] == {"target": ">= 0", "value": None, "met": False}
    assert targets.count_met(ev) == (1, 5)
    with pytest.raises(ValueError):
        targets.evaluate({"a": {"target": "<= 1", "with": ["b"]}}, {"a": 0})


def test_seeds():
    assert parse_seeds("0-2,5") == [0, 1, 2, 5] and parse_seeds("4") == [4]
    for bad in ("a", "3-1"):
        with pytest.raises(ValueError):
            parse_seeds(bad)


def test_ledger_marks_a_protocol_written_after_a_test_read(tmp_path):
    led = tmp_path / "ledger"
    p1, p2 = tmp_path / "v1.json", tmp_path / "v2.json"
    p1.write_text('{"v": 1}')
    p2.write_text('{"v": 2}')
    first = ledger.record(ledger.Read("rt:test", p1), "a.json", ledger=led)
    assert first["test_reads_before"] == 0 and not first["exploratory"]
    again = ledger.record(ledger.Read("rt:test", p1), "a.json", ledger=led)  # re-analysis: the same read
    assert again == first and len(ledger.load("rt:test", led)) == 1
    later = ledger.record(ledger.Read("rt:test", p2), "b.json", ledger=led)
    assert later["test_reads_before"] == 1 and later["exploratory"] and "v1.json" in later["why"]
    other = ledger.record(ledger.Read("tweets:test", p2), "b.json", ledger=led)
    assert not other["exploratory"]
    p1.write_text('{"v": 1, "changed": true}')  # the same file changed after its read
    changed = ledger.record(ledger.Read("rt:test", p1), "a.json", ledger=led, write=False)
    assert changed["exploratory"] and len(ledger.load("rt:test", led)) == 2  # check mode writes nothing
    ledger.backfill("rt:test", "old.json", "abc", "old.json", "0" * 40, "2026-11-01", "backfilled", ledger=led)
    assert ledger.load("rt:test", led)[-1]["note"] == "backfilled"


def test_result_schema_and_compare(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger, "LEDGER", tmp_path / "ledger")
    proto = tmp_path / "p.json"
    proto.write_text("{}")
    path = tmp_path / "r.json"
    r = results.write_result(path, {"a": 1.0}, {"git_commit": ["x"]}, targets={"a": ">= 2"},
                             protocol=proto, per_seed=[1, 2])
    stored = json.loads(path.read_text())
    assert stored == r and list(stored) == ["summary", "targets", "protocol", "provenance", "per_seed"]
    assert stored["targets"]["a"]["met"] is False and len(stored["protocol"]["sha256"]) == 64
    other = dict(stored, provenance={"git_commit": ["y"]})
    assert results.compare_results(stored, other) == []
    diff = results.compare_results(stored, dict(other, summary={"a": 1.5}))
    assert diff and diff[0].startswith("summary.a:")
    # another CPU sums in another order: the last bits may differ, a digit may not
    assert results.compare_results(stored, dict(other, summary={"a": 1.0 + 3e-16})) == []
    assert results.compare_results(stored, dict(other, summary={"a": 1.0 + 1e-6}))
    assert results.compare_results({"x": [0.0, True]}, {"x": [1e-13, 1]})  # a bool is not a number


def test_cli_check_fails_on_a_changed_result(tmp_path, capsys):
    path = tmp_path / "r.json"
    value = {"v": 1.0}

    def build(args):
        return {path: results.build_result(dict(value), {}, name="r.json")}

    cmd = cli.Command("test", results=build)
    assert cmd.main(["analyze"]) == 0 and cmd.main(["check"]) == 0
    value["v"] = 2.0
    assert cmd.main(["check"]) == 1 and "summary.v" in capsys.readouterr().out
    path.unlink()
    assert cmd.main(["check"]) == 2  # one line, no traceback
    assert "no such result" in capsys.readouterr().err
