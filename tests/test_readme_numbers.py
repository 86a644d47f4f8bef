"""The README's headline and docs/measured.md are exactly what benchmarks/summarize.py writes
from the result files, so no number in them can drift from its JSON (standard library only, fast)."""

import difflib
import json
from pathlib import Path

import pytest

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
summarize = load_benchmark("summarize")


@pytest.mark.parametrize("page", ["README.md", "docs/measured.md"])
def test_measured_section_is_what_summarize_writes(page):
    current = (ROOT / page).read_text()
    assert summarize.BEGIN in current and summarize.END in current, f"{page} lacks the measured markers"
    generated, _ = summarize.pages(ROOT)
    expected = generated[ROOT / page][1]
    diff = "".join(difflib.unified_diff(current.splitlines(True), expected.splitlines(True), page, "generated", n=0))
    assert current == expected, f"{page} differs; run `python benchmarks/summarize.py`:\n{diff}"


def test_readme_has_the_headline_only_and_measured_md_has_everything():
    readme, measured = (ROOT / "README.md").read_text(), (ROOT / "docs" / "measured.md").read_text()
    head = summarize.headline(summarize.load_results())
    assert len(head) - 2 <= 25 and "\n".join(head) in readme and "\n".join(head) in measured
    assert "| benchmark | metric | value | target |" in measured and "| benchmark | metric |" not in readme
    assert "| benchmark | commit | machine | wall | command |" in measured


def test_every_result_file_appears():
    section = summarize.render()
    paths = summarize.result_paths()
    assert "dht" in paths and "searchers" in paths
    for name in paths:
        assert f"| {name} |" in section or f"| {name} (exploratory" in section, name


def test_results_are_found_by_name_in_any_results_folder_and_a_name_twice_is_an_error(tmp_path):
    for rel in ("benchmarks/results/old.json", "benchmarks/depth/results/dht.json",
                "benchmarks/searchers/results/searchers.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(json.dumps({"summary": {"x_y": 1}}))
    assert list(summarize.result_paths(tmp_path)) == ["dht", "old", "searchers"]
    (tmp_path / "benchmarks/product/results").mkdir(parents=True)
    (tmp_path / "benchmarks/product/results/dht.json").write_text("{}")
    with pytest.raises(summarize.DuplicateResult, match="'dht' is in two places"):
        summarize.result_paths(tmp_path)
    (tmp_path / "README.md").write_text(f"{summarize.BEGIN}\n{summarize.END}\n")
    assert summarize.main(["--check", "--root", str(tmp_path)]) == 2


def test_missing_summary_provenance_and_broken_json_are_shown_not_fatal(tmp_path):
    prov = {"git_commit": ["0123456789abcdef0123456789abcdef01234567+dirty"], "command": "python benchmarks/a.py",
            "machine": {"platform": "Linux-6.1-x86_64", "processor": "x86_64", "cpu_count": 2,
                        "python": "3.11.7", "torch": "2.5.0", "torch_threads": 2},
            "seeds": 0, "wall_s": 12.34}
    (tmp_path / "a.json").write_text(json.dumps({
        "summary": {"ratio": 0.123456, "bytes": 1234567, "ok": True, "none": None,
                    "curve": [{"gamma": 0.1, "speedup": 2.5}],
                    "hv": {"x": {"10": 0.5, "40": 0.75}, "y": {"10": 0.25, "40": 1.0}},
                    "by": {"p": {"x": 1.5, "y": None}, "q": {"x": 2.0, "y": 3}},
                    "nested": {"deep": {"k": 1}, "flat": 2}},
        "provenance": prov, "targets": {"ratio": "<= 0.1", "bytes": 2000000}}))
    (tmp_path / "b.json").write_text(json.dumps({"rows": [1, 2]}))
    (tmp_path / "c.json").write_text(json.dumps({"summary": {"n": 3},
                                                  "targets": {"n": {"target": ">= 4", "value": 3, "met": False}}}))
    (tmp_path / "d.json").write_text("{not json")
    text = summarize.render(tmp_path, tmp_path / "no-example")
    rows = text.splitlines()
    assert "| a | `ratio` | 0.1235 | <= 0.1: missed |" in rows
    assert "| a | `bytes` | 1,234,567 | <= 2,000,000: met |" in rows
    assert "| a | `ok` | yes |  |" in rows and "| a | `none` | none |  |" in rows
    assert "| a | `curve[gamma=0.1]` | speedup 2.5 |  |" in rows
    assert "| a | `hv (at 10 / 40)` | x 0.5 / 0.75; y 0.25 / 1 |  |" in rows
    assert "| a | `by.p` | x 1.5, y none |  |" in rows and "| a | `by.q` | x 2, y 3 |  |" in rows
    assert "| a | `nested.deep` | k 1 |  |" in rows and "| a | `nested.flat` | 2 |  |" in rows
    assert "| b | no summary | | |" in rows
    assert "| c | `n` | 3 | >= 4: missed |" in rows
    assert "| d | unreadable JSON | | |" in rows
    assert ("| a | 0123456+dirty | Linux x86_64, 2 CPUs, Python 3.11.7, torch 2.5.0 (2 threads) | 12.34 s "
            "| python benchmarks/a.py |") in rows
    for name in "bc":
        assert f"| {name} | no provenance | | | |" in rows
    assert summarize.render(tmp_path, tmp_path / "no-example") == text  # deterministic


def test_check_exits_1_with_a_diff(tmp_path, capsys):
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "a.json").write_text(json.dumps({"summary": {"a_b": 0.5}}))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{summarize.BEGIN}\nstale\n{summarize.END}\n")
    assert summarize.main(["--check", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "-stale" in out and "docs/measured.md (generated)" in out  # created when missing
    assert summarize.main(["--root", str(tmp_path)]) == 0
    assert summarize.main(["--check", "--root", str(tmp_path)]) == 0
    assert readme.read_text().startswith(f"# x\n\n{summarize.BEGIN}\n<!-- generated")
    measured = (tmp_path / "docs" / "measured.md").read_text()
    assert "| a | `a_b` | 0.5 |  |" in measured and "`a_b`" not in readme.read_text()


def test_new_target_schema_and_exploratory_results_are_shown(tmp_path):
    """The evidence library's ``targets: {key: {target, value, met}}`` (its ``met`` is the verdict,
    joint rules included) beside the old shapes; an exploratory result says so in every table."""
    (tmp_path / "schedulers.json").write_text(json.dumps({
        "summary": {"ahto_time_to_target_ratio_vs_asha": 0.8, "ahto_wilcoxon_p_vs_asha": 0.01,
                    "ahto_time_to_target_ratio_vs_hyperband": 0.9, "other_key": 3},
        "targets": {"ahto_time_to_target_ratio_vs_asha": {"target": "<= 0.85", "value": 0.8, "met": False,
                                                      "with": ["ahto_wilcoxon_p_vs_asha"]},
                    "ahto_wilcoxon_p_vs_asha": {"target": "< 0.05", "value": 0.01, "met": True},
                    "other_key": {"target": ">= 1", "value": 3, "met": True}},
        "exploratory": True,
        "ledger": {"protocol": "p.json", "protocol_sha256": "0" * 64, "test_reads_before": 2,
                   "exploratory": True, "why": "protocol amended after a test read"},
        "provenance": {"git_commit": "abcdef0123", "command": "x"}}))
    (tmp_path / "old.json").write_text(json.dumps({"summary": {"m_n": 2}, "targets": {"m_n": "<= 1"},
                                                   "targets_met": 0}))
    rows = summarize.render(tmp_path, tmp_path / "no-example").splitlines()
    assert "| schedulers (exploratory) | `other_key` | 3 | >= 1: met |" in rows
    assert "| old | `m_n` | 2 | <= 1: missed |" in rows
    assert any(r.startswith("| schedulers (exploratory: protocol amended after a test read) | abcdef0 |") for r in rows)
    sched = next(r for r in rows if r.startswith("| AHTO scheduler"))
    assert "(exploratory) |" in sched
    assert sched.endswith("| <= 0.85: missed; and `ahto_wilcoxon_p_vs_asha` < 0.05: met (0.01): **missed** |")


def test_headline_rows_read_their_result_interval_and_target(tmp_path):
    """A headline row shows the result's value, its ``_ci`` interval (or says there is none), the
    baseline's keys filled in and the target's verdict; a result without the metric reads "not
    measured" instead of failing."""
    (tmp_path / "schedulers.json").write_text(json.dumps({
        "summary": {"ahto_time_to_target_ratio_vs_asha": 0.8, "ahto_time_to_target_ratio_vs_asha_ci": [0.7, 0.9],
                    "ahto_wilcoxon_p_vs_asha": 0.01, "ahto_faster_than_asha_tasks": "20/34",
                    "ahto_time_to_target_ratio_vs_hyperband": 0.95},
        "targets": {"ahto_time_to_target_ratio_vs_asha": {"target": "<= 0.85", "with": ["ahto_wilcoxon_p_vs_asha"]},
                    "ahto_wilcoxon_p_vs_asha": "< 0.05"}}))
    (tmp_path / "dht.json").write_text(json.dumps({  # one summary section per dataset
        "summary": {"rt": {"dht_gain_over_static_pts_at_0.5": 1.0, "confidence_exit_gain_over_static_pts_at_0.5": 0.5,
                           "dht_acc_drop_pts_at_0.5": 2.0},
                    "election_tweets": {"dht_gain_over_static_pts_at_0.5": 2.0,
                                        "dht_gain_over_static_pts_at_0.5_ci": [0.5, 3.5]}},
        "targets": {"rt.dht_gain_over_static_pts_at_0.5": ">= 3.0",
                    "election_tweets.dht_gain_over_static_pts_at_0.5": ">= 1.5"}}))
    rows = summarize.render(tmp_path, tmp_path / "no-example").splitlines()
    sched = next(r for r in rows if r.startswith("| AHTO scheduler"))
    assert ("**0.8** x ASHA's (Wilcoxon p 0.01, faster on 20/34 tasks; the target also asks p < 0.05); 95% CI 0.7 to 0.9"
            in sched and "Hyperband: 0.95x" in sched)
    # the ratio's target holds only with the p-value's (the result's joint rule, "with")
    assert sched.endswith("| <= 0.85: met; and `ahto_wilcoxon_p_vs_asha` < 0.05: met (0.01): **met** |")
    dht, second = (r for r in rows if r.startswith("| Per-sample depth"))
    assert "**1** accuracy points over the static cut (3 seeds each; DHT's stop rule" in dht and "; no interval" in dht
    assert "confidence exit on the same models: 0.5; full model: 2 above DHT" in dht
    assert dht.endswith("| >= 3: missed |")
    assert "**2** accuracy points over the static cut (3 seeds each); 95% CI 0.5 to 3.5" in second
    assert "confidence exit on the same models: ?" in second and second.endswith("| >= 1.5: met |")
    tying = next(r for r in rows if r.startswith("| Layer tying"))
    assert "not measured (`tying.json` has no `tied_minus_untied_best_val_ppl`)" in tying
    # a ratio that meets its bound without significance is missed
    data = json.loads((tmp_path / "schedulers.json").read_text())
    data["summary"]["ahto_wilcoxon_p_vs_asha"] = 0.375
    (tmp_path / "schedulers.json").write_text(json.dumps(data))
    sched = next(r for r in summarize.render(tmp_path, tmp_path / "no-example").splitlines()
                 if r.startswith("| AHTO scheduler"))
    assert sched.endswith("| <= 0.85: met; and `ahto_wilcoxon_p_vs_asha` < 0.05: missed (0.375): **missed** |")


def test_provenance_commit_is_dirty_for_code_not_for_results(tmp_path, monkeypatch):
    """``git_commit`` flags uncommitted code, not the benchmark's own output (rows appended to a
    result file, a result renamed before its rerun): those would mark every row of a run dirty."""
    import subprocess

    from benchmarks.evidence import provenance as common

    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)
    (tmp_path / "benchmarks" / "depth" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "depth" / "results" / "a.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    monkeypatch.setattr(common, "ROOT", tmp_path)
    head = common.git_commit()
    assert len(head) == 40
    (tmp_path / "benchmarks" / "depth" / "results" / "a.json").write_text('{"rows": []}')
    git("mv", "benchmarks/depth/results/a.json", "benchmarks/depth/results/b.json")
    assert common.git_commit() == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert common.git_commit() == head + "+dirty"


def test_a_sections_exploratory_sub_read_is_said_in_its_headline_row(tmp_path):
    """A section whose own read is not exploratory but whose rows added under a later protocol
    (``ledger["election_tweets.cascade"]``) are: the baseline cell says which rows."""
    (tmp_path / "dht.json").write_text(json.dumps({
        "summary": {"election_tweets": {"dht_gain_over_static_pts_at_0.5": 0.3, "cascade_gain_over_static_pts_at_0.5": 0.4}},
        "ledger": {"election_tweets": {"exploratory": False},
                   "election_tweets.cascade": {"exploratory": True, "why": "read before"}}}))
    rows = summarize.render(tmp_path, tmp_path / "no-example").splitlines()
    row = next(r for r in rows if r.startswith("| Per-sample depth (DHT) at 0.5x FLOPs, election tweets"))
    assert "(exploratory)" not in row.split("|")[1] and "(cascade rows exploratory)" in row
