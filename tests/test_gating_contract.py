"""The contract every registered gating meets (issue 34; like the searcher suite): real training
of a tiny model on real data through the product's :class:`~archsearch.tune.trainable.TrialLoop`,
on the test device (``ARCHSEARCH_TEST_DEVICE``).

For each gating in :data:`archsearch.dynamic.GATING`, with its default settings:

* a ``flops_budget`` (gatings whose Settings declare one) is met within +-0.05 on validation;
* the depth histogram counts exactly the rows just evaluated;
* the costs known before training (:func:`archsearch.dynamic.known_costs.known_costs_fn`) are
  what the trial reports: parameters exactly, FLOPs within 0.05 x static of the budget (an upper
  bound without one);
* a checkpoint round trip (save on the test device, load into a fresh loop) predicts the same;
* the same seed gives the same result, and the calibration reads no labels: validation and test
  labels poisoned (shuffled), the decisions and FLOPs are identical.
"""

from __future__ import annotations

import dataclasses

import pytest

from conftest import sentence_subsets
import torch

from archsearch.dynamic import GATING, gating_class
from archsearch.errors import UserError

N_TRAIN, N_VAL, N_TEST = 512, 192, 160
BUDGET = 0.5


@pytest.fixture(scope="module")
def small_data(cache_dir):
    return sentence_subsets(train=N_TRAIN, validation=N_VAL, test=N_TEST)


def poisoned(data):
    """``data`` with the validation and test labels shuffled (training labels untouched)."""
    parts = dict(data.data)
    for split in ("validation", "test"):
        s = parts[split]
        perm = torch.randperm(len(s), generator=torch.Generator().manual_seed(7))
        parts[split] = dataclasses.replace(s, labels=1 - s.labels[perm])
    return dataclasses.replace(data, data=parts)


def budgeted(name: str) -> bool:
    return "flops_budget" in gating_class(name).Settings.model_fields


def make_loop(name, data, device, seed=0):
    from archsearch.tune.trainable import TrialLoop

    cfg = {"gating": name, "n_layers": 3, "d_model": 32, "n_heads": 4, "warmup_steps": 4, "lr": 2e-3}
    if budgeted(name):
        cfg["flops_budget"] = BUDGET
    return TrialLoop(cfg, data, {"epochs": 1, "batch_size": 32, "seed": seed, "latency_batch_size": 16,
                                 "device": str(device)})


def trained(name, data, device, seed=0):
    torch.set_num_threads(1)
    loop = make_loop(name, data, device, seed)
    loop.train_epoch()
    return loop


def predictions(loop, split="test"):
    """``(logits, flops)`` of every row of ``split``, as evaluation runs them (CPU tensors)."""
    loop.model.eval()
    out, flops = [], []
    with torch.inference_mode():
        for x, mask, _ in loop.eval_batches(split):
            lg, f = loop.gating.predict(x.to(loop.device), None if mask is None else mask.to(loop.device))
            out.append(lg.float().cpu())
            flops.append(f.cpu())
    loop.gating.metrics()  # reset the evaluation counters these passes touched
    return torch.cat(out), torch.cat(flops)


def hist_rows(name: str, m: dict) -> int | None:
    """Rows the gating's depth histogram counts (``None``: the gating reports none)."""
    if "dht_eval_samples" in m:
        return m["dht_eval_samples"]
    if "exit_eval_samples" in m:
        return m["exit_eval_samples"]
    if "depth_histogram" in m:
        return int(sum(m["depth_histogram"].values()))
    return None


@pytest.fixture(scope="module", params=sorted(GATING))
def gating_run(request, small_data, device):
    name = request.param
    loop = trained(name, small_data, device)
    val = loop.evaluate("validation")
    test = loop.evaluate("test")
    return name, loop, val, test


def test_the_flops_budget_is_met_on_validation(gating_run, small_data):
    from archsearch.models import costs

    name, loop, val, _ = gating_run
    if not budgeted(name):
        pytest.skip(f"{name} has no flops_budget")
    full = sum(costs.flops_per_sample(loop.model.config, x.shape[1]) * x.shape[0]
               for x, _, _ in loop.eval_batches("validation")) / N_VAL
    assert abs(val["flops_per_sample"] / full - BUDGET) <= 0.05, (name, val["flops_per_sample"] / full)


def test_the_depth_histogram_counts_exactly_the_evaluated_rows(gating_run):
    name, _, val, test = gating_run
    for m, n in ((val, N_VAL), (test, N_TEST)):
        rows = hist_rows(name, m)
        if rows is None:
            assert name in ("static", "length_drop"), f"{name} reports no depth histogram"
            continue
        assert rows == n, (name, rows, n)


def test_the_known_costs_are_what_the_trial_reports(gating_run, small_data):
    from archsearch.dynamic.known_costs import known_costs_fn

    name, loop, val, _ = gating_run
    cost_fn = known_costs_fn(small_data)
    known = cost_fn(loop.cfg)
    static = cost_fn({**loop.cfg, "gating": "static"})["flops_per_sample"]
    assert (known["params_total"], known["params_trainable"]) == (val["params_total"], val["params_trainable"]), name
    if budgeted(name):
        assert known["flops_per_sample"] == pytest.approx(BUDGET * static, rel=1e-12)
        assert abs(val["flops_per_sample"] - known["flops_per_sample"]) <= 0.05 * static, name
    else:
        assert val["flops_per_sample"] <= known["flops_per_sample"] * (1 + 1e-9), name
        if name == "static":
            assert val["flops_per_sample"] == pytest.approx(known["flops_per_sample"], rel=1e-9)


def test_a_checkpoint_round_trip_predicts_the_same(gating_run, small_data, device, tmp_path):
    name, loop, _, _ = gating_run
    before = predictions(loop)
    loop.save(str(tmp_path))
    fresh = make_loop(name, small_data, device, seed=3)  # other seed: everything must come from the file
    fresh.load(str(tmp_path))
    after = predictions(fresh)
    torch.testing.assert_close(after[0], before[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(after[1], before[1])


def test_an_export_round_trip_predicts_the_same(gating_run, small_data, tmp_path):
    """``archsearch export``'s directory (weights in safetensors, the gating's calibrated state,
    the tokenizer) loaded by :func:`archsearch.export.load` predicts what the trained loop does:
    logits within 1e-5, the same executed FLOPs, and the trial's validation accuracy exactly."""
    from archsearch.export import export_loop, load

    name, loop, val, _ = gating_run
    before = predictions(loop)
    export_loop(loop, tmp_path / "model")
    model = load(tmp_path / "model", device=str(loop.device))
    test = small_data["test"]
    logits, flops, depth, _ = model.predict_ids(test.input_ids, test.attention_mask, batch_size=256,
                                                regime="cascade")
    torch.testing.assert_close(logits, before[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(flops, before[1].to(torch.float64), rtol=0, atol=0)
    exits = model.gating.exit_depths() or [loop.model.config.n_layers]
    assert set(depth.tolist()) <= set(exits), name
    v = small_data["validation"]
    logits = model.predict_ids(v.input_ids, v.attention_mask, batch_size=256, regime="cascade").logits
    assert int((logits.argmax(-1) == v.labels).sum()) / len(v.labels) == pytest.approx(val["accuracy"], abs=1e-12), name


@pytest.mark.parametrize("tying", ["every_k", "paper"])
def test_an_export_of_a_tied_model_keeps_its_tying(tying, small_data, device, tmp_path):
    """Tied blocks are stored per name (safetensors keeps no shared tensors) and tied again on
    load, a fixed map (every_k) and one the agent chose while training (paper): the loaded model
    has the trial's map and parameter count and predicts the same."""
    from archsearch.export import export_loop, load
    from archsearch.models import costs
    from archsearch.models.transformer import Transformer
    from archsearch.tune.trainable import TrialLoop

    torch.set_num_threads(1)
    loop = TrialLoop({"gating": "static", "tying": tying, "n_layers": 4, "d_model": 32, "n_heads": 4,
                      "warmup_steps": 4, "lr": 2e-3}, small_data,
                     {"epochs": 1, "batch_size": 32, "seed": 0, "device": str(device)})
    loop.train_epoch()
    before = predictions(loop)
    export_loop(loop, tmp_path / "model")
    model = load(tmp_path / "model", device=str(device))
    test = small_data["test"]
    logits = model.predict_ids(test.input_ids, test.attention_mask, batch_size=256).logits
    torch.testing.assert_close(logits, before[0], rtol=0, atol=1e-5)
    assert model.tying.state_dict()["tying_map"] == loop.tying.state_dict()["tying_map"]
    untied = Transformer(loop.model.config)
    assert costs.params_total(model.model) == costs.params_total(loop.model) < costs.params_total(untied)


def test_same_seed_same_result_and_calibration_reads_no_labels(gating_run, small_data, device):
    name, loop, val, _ = gating_run
    twin = trained(name, poisoned(small_data), device)
    tval = twin.evaluate("validation")
    assert tval["flops_per_sample"] == val["flops_per_sample"], name
    a, b = predictions(loop), predictions(twin)
    torch.testing.assert_close(b[0], a[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b[1], a[1])
    if hist_rows(name, val) is not None:
        for key in ("dht_depth_hist", "exit_depth_hist", "depth_histogram"):
            if key in val:
                assert tval[key] == val[key], (name, key)
    # the labels did change: poisoning is not a no-op
    assert tval["accuracy"] != val["accuracy"] or N_VAL == 0


def test_a_broken_gating_is_caught_by_the_budget_check(small_data, device, monkeypatch):
    """The budget check can fail: a confidence exit whose calibration is skipped misses it."""
    from archsearch.dynamic.depth.confidence_exit import ConfidenceExitGating
    from archsearch.models import costs

    monkeypatch.setattr(ConfidenceExitGating, "before_evaluate", lambda self, split="validation": None)
    loop = trained("confidence_exit", small_data, device)
    val = loop.evaluate("validation")
    full = sum(costs.flops_per_sample(loop.model.config, x.shape[1]) * x.shape[0]
               for x, _, _ in loop.eval_batches("validation")) / N_VAL
    assert abs(val["flops_per_sample"] / full - BUDGET) > 0.05


def test_a_weights_only_checkpoint_holds_weights_and_predicts_the_same(small_data, device, tmp_path):
    """The last epoch's checkpoint (``save(weights_only=True)``, written by the trainable when a
    trial has no epoch left) holds the model, gating and tying state only, and a loop restored
    from it predicts what the trained loop does."""
    from archsearch.tune.trainable import TrialLoop
    from archsearch.tune.weights import WEIGHTS_KEYS

    torch.set_num_threads(1)
    cfg = {"gating": "confidence_exit", "n_layers": 2, "d_model": 32, "n_heads": 4, "warmup_steps": 4}
    settings = {"epochs": 1, "batch_size": 32, "seed": 0, "device": str(device)}
    loop = TrialLoop(cfg, small_data, settings)
    loop.train_epoch()
    (tmp_path / "full").mkdir()
    (tmp_path / "w").mkdir()
    loop.save(str(tmp_path / "full"))
    loop.save(str(tmp_path / "w"), weights_only=True)
    assert set(torch.load(tmp_path / "w" / "state.pt", weights_only=True)) == set(WEIGHTS_KEYS)
    assert (tmp_path / "w" / "state.pt").stat().st_size < 0.5 * (tmp_path / "full" / "state.pt").stat().st_size
    restored = TrialLoop(cfg, small_data, settings)
    restored.load(str(tmp_path / "w"))
    want, got = predictions(loop), predictions(restored)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-6)


def test_an_exported_dht_adapts_online_and_resumes_after_a_restart(small_data, device, tmp_path):
    """``adapt="bandit"`` (issue 64) on an exported DHT cascade: a share of rows runs to the
    last exit (the feedback), the others leave where the rule says; after a restart from the
    saved state the decisions are those of an uninterrupted run; the same seed gives the same
    decisions; no label is ever an input (the runtime gets token ids only)."""
    from archsearch.export import export_loop, load

    loop = trained("dht", small_data, device)
    loop.evaluate("validation")  # calibrates the stop rule, as the trial's evaluation did
    export_loop(loop, tmp_path / "model")
    test = small_data["test"]
    ids, mask = test.input_ids, test.attention_mask

    def run(model, lo, hi):
        return model.predict_ids(ids[lo:hi], mask[lo:hi], batch_size=32)

    a = load(tmp_path / "model", device=str(device), adapt="bandit")
    whole = run(a, 0, len(ids))
    ad = a.runtime.adapter
    assert ad.rows == len(ids) and 0 < ad.explored < 0.2 * len(ids)
    L = max(a.gating.exit_depths())
    assert (whole.depth == L).sum() >= ad.explored and set(whole.regime) == {"cascade"}
    assert ad.rule.offset != 0.0  # the dual steps moved it
    again = load(tmp_path / "model", device=str(device), adapt="bandit")
    torch.testing.assert_close(run(again, 0, len(ids)).logits, whole.logits, rtol=0, atol=0)  # same seed
    half = 4 * 32
    first = load(tmp_path / "model", device=str(device), adapt="bandit")
    out1 = run(first, 0, half)
    first.save_state(tmp_path / "state.pt")
    restarted = load(tmp_path / "model", device=str(device), adapt="bandit")
    assert restarted.load_state(tmp_path / "state.pt")
    out2 = run(restarted, half, len(ids))
    assert torch.equal(torch.cat([out1.depth, out2.depth]), whole.depth)
    assert restarted.runtime.adapter.rows == len(ids)
    counted = load(tmp_path / "model", device=str(device))  # a server never reads metrics():
    counted.gating.PENDING_FOLD = 3  # its device-side exit counts are folded as they pile up
    counted.predict_ids(ids, mask, batch_size=32, regime="cascade")
    assert len(counted.gating._pending_counts) < 3
    assert counted.gating.metrics()["dht_eval_samples"] == len(ids)  # nothing lost in the folds
    dual = load(tmp_path / "model", device=str(device), adapt="dual")  # the dual step alone
    run(dual, 0, len(ids))
    assert dual.runtime.adapter.explored == 0 and dual.runtime.adapter.rows == len(ids)
    assert dual.runtime.adapter.refits == 0 and dual.runtime.adapter.rule.offset != 0.0
    with pytest.raises(UserError, match="adapt"):
        load(tmp_path / "model", device=str(device), adapt="sometimes")
    with pytest.raises(UserError, match="state"):  # a bandit's state does not fit the dual adapter
        dual.load_state(tmp_path / "state.pt")
    Xs, q, c = a.gating.calibration_window  # the rows the rule was calibrated on, exported with it
    assert Xs.shape[:2] == q.shape == c.shape and len(Xs) >= 32


@pytest.mark.ray
@pytest.mark.slow
def test_ray_serve_adapts_online_and_keeps_its_state_over_a_restart(small_data, device, tmp_path, ray_session):
    """``archsearch serve --adapt dual --state FILE`` (issue 64) on real Ray Serve: concurrent
    requests, batched together, all update one replica's adapter (under its lock); shutting
    the application down writes the learned state; a new application reads it and continues
    from the rows already seen."""
    import json
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from ray import serve

    from archsearch.export import export_loop, load
    from archsearch.serve import serve_model
    from conftest import free_port

    if device.type != "cpu":
        pytest.skip("Ray Serve replicas run on the CPU here")
    loop = trained("dht", small_data, device)
    loop.evaluate("validation")
    export_loop(loop, tmp_path / "model")
    texts = [f"{w} film, {v} acting" for w in ("a fine", "a dull", "an odd", "a warm") for v in ("great", "poor", "plain")]
    state, port = tmp_path / "state.pt", free_port()  # Serve's HTTP proxy keeps its first port

    def serve_once(n_requests):
        url = serve_model(tmp_path / "model", port=port, blocking=False, num_cpus=0.5,
                          regime="cascade", adapt="dual", state=state)

        def post(i):
            req = urllib.request.Request(url, data=json.dumps({"texts": texts[i % len(texts):][:3]}).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, len(json.load(r)["predictions"])

        try:
            with ThreadPoolExecutor(8) as pool:
                got = list(pool.map(post, range(n_requests)))
        finally:
            serve.delete("archsearch")  # the replica shuts down: its state is written
        assert all(s == 200 for s, _ in got)
        return sum(n for _, n in got)

    rows = serve_once(16)
    assert state.exists()
    first = load(tmp_path / "model", adapt="dual")
    assert first.load_state(state) and first.runtime.adapter.rows == rows
    offset = first.runtime.adapter.rule.offset
    rows += serve_once(8)
    again = load(tmp_path / "model", adapt="dual")
    assert again.load_state(state) and again.runtime.adapter.rows == rows  # carried on, not restarted
    assert again.runtime.adapter.rule.offset != offset
