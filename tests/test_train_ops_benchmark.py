"""benchmarks/gpu/train_ops.py's bookkeeping (fast, no training): the reported summary is the newest
commit's rows, and ``run --regression-check`` fails when the DHT's operator ratio went up."""

from __future__ import annotations

import json

from conftest import ROOT, load_benchmark


def test_reported_summary_regenerates_from_the_newest_commits_rows():
    ops = load_benchmark("gpu.train_ops")
    result = json.loads((ROOT / "benchmarks" / "gpu" / "results" / "train_ops.json").read_text())
    rows = [json.loads(line) for line in (ROOT / "benchmarks" / "gpu" / "runs" / "train_ops_runs.jsonl").read_text().splitlines()]
    commits = list(dict.fromkeys(r["commit"] for r in rows))
    assert result["summary"] == ops.summarize([r for r in rows if r["commit"] == commits[-1]])
    assert set(result["by_commit"]) == set(commits) and len(commits) >= 2
    # every gating's ratio is relative to the static model of the same commit
    for c in commits:
        s = ops.summarize([r for r in rows if r["commit"] == c])
        assert set(s) >= {"dht_train_ops_ratio", "depth_predictor_train_ops_ratio", "confidence_exit_train_ops_ratio"}
    assert ops.main(["check"]) == 0  # the stored result regenerates identically


def test_check_fails_when_the_dht_ratio_went_up(tmp_path):
    ops = load_benchmark("gpu.train_ops")
    from benchmarks.evidence.provenance import git_commit

    now = git_commit()

    def rows(commit, dht):
        return [{"commit": commit, "gating": g, "steps": 1, "ops_per_step": v, "host_reads_per_step": 0.0}
                for g, v in (("static", 100.0), ("dht", dht), ("depth_predictor", 200.0), ("confidence_exit", 110.0))]

    for dht_before, dht_now, rc in ((130.0, 120.0, 0), (120.0, 130.0, 1)):
        runs = tmp_path / f"runs_{rc}.jsonl"
        runs.write_text("".join(json.dumps(r) + "\n" for r in rows("0" * 40, dht_before) + rows(now, dht_now)))
        assert ops.main(["run", "--regression-check", "--runs", str(runs), "--result", str(tmp_path / "r.json")]) == rc
        assert json.loads((tmp_path / "r.json").read_text())["summary"]["dht_train_ops_ratio"] == dht_now / 100
