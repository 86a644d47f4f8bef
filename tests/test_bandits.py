"""Bandits on synthetic problems: regret, best-k identification, determinism, state round trip."""

import io

import numpy as np
import pytest
import torch

from archsearch.dynamic.bandits import UCB1, CombinatorialTS, LinUCB
from archsearch.dynamic.budget import DualPrice, calibrate_monotone, calibrate_price
from archsearch.dynamic.depth.stopping import LinearStopping, trajectory_context


def linear_problem(seed=0, K=4, d=6):
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=(K, d))
    theta /= np.linalg.norm(theta, axis=1, keepdims=True)
    return rng, theta


def run_linucb(seed, T=2000, decay=1.0):
    rng, theta = linear_problem(seed)
    K, d = theta.shape
    bandit = LinUCB(K, d, alpha=0.5, decay=decay)
    regret = np.zeros(T)
    choices = []
    for t in range(T):
        x = rng.normal(size=(1, d))
        x /= np.linalg.norm(x)
        means = (x @ theta.T)[0]  # (K,)
        a = int(bandit.select(x)[0])
        choices.append(a)
        bandit.update(x, [a], means[a] + 0.1 * rng.normal())
        regret[t] = means.max() - means[a]
    return regret, choices, bandit


def test_linucb_regret_is_sublinear_on_a_linear_problem():
    regret, _, _ = run_linucb(0)
    first, second = regret[:1000].sum(), regret[1000:].sum()
    assert second < 0.5 * first, (first, second)
    # and it beats picking arms uniformly at random by far
    rng, theta = linear_problem(0)
    x = rng.normal(size=(2000, theta.shape[1]))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    m = x @ theta.T  # (T, K)
    random_regret = (m.max(axis=1) - m.mean(axis=1)).sum()
    assert regret.sum() < 0.2 * random_regret


def test_linucb_batched_select_matches_rowwise_and_ties_go_to_the_last_arm():
    b = LinUCB(3, 4, alpha=1.0)
    X = np.random.default_rng(1).normal(size=(5, 4))
    assert b.select(X).tolist() == [2] * 5  # untrained: identical scores, deepest arm
    b.update(X[:3], [0, 1, 0], [1.0, -1.0, 0.5])
    batched = b.select(X)
    rowwise = [int(b.select(X[i:i + 1])[0]) for i in range(5)]
    assert batched.tolist() == rowwise
    with pytest.raises(ValueError):
        b.select(np.zeros((2, 3)))


def test_ucb1_finds_the_best_arm_per_row():
    rng = np.random.default_rng(0)
    means = np.array([[0.2, 0.5, 0.8], [0.9, 0.1, 0.3]])
    b = UCB1(3, n_rows=2, c=1.0)
    for _ in range(1500):
        arms = b.select()
        b.update([0, 1], arms, rng.random(2) < means[[0, 1], arms])
    assert b.select(greedy=True).tolist() == [2, 0]
    assert b.counts[0, 2] > 0.7 * b.counts[0].sum() and b.counts[1, 0] > 0.7 * b.counts[1].sum()


def test_thompson_sampling_finds_the_best_k_of_n_bernoulli_arms():
    rng = np.random.default_rng(0)
    p = np.array([0.1, 0.7, 0.3, 0.9, 0.5, 0.2, 0.8, 0.4, 0.6, 0.15])
    ts = CombinatorialTS(10, seed=3)
    for _ in range(1500):
        chosen = ts.select(None, 3)  # (1, 10) mask
        assert chosen.sum() == 3
        # semi-bandit feedback: each played arm succeeds with its own probability
        for arm in np.flatnonzero(chosen[0]):
            ts.update([0], (np.arange(10) == arm)[None, :], bool(rng.random() < p[arm]))
    best = set(np.flatnonzero(ts.select(None, 3, greedy=True)[0]).tolist())
    assert best == {3, 6, 1}


def test_bandits_are_deterministic_with_a_seed():
    a = run_linucb(5)[1]
    b = run_linucb(5)[1]
    assert a == b
    t1, t2, t3 = CombinatorialTS(8, n_rows=3, seed=11), CombinatorialTS(8, n_rows=3, seed=11), CombinatorialTS(8, n_rows=3, seed=12)
    k = np.array([2, 4, 6])
    s1 = [t1.select(None, k) for _ in range(20)]
    s2 = [t2.select(None, k) for _ in range(20)]
    s3 = [t3.select(None, k) for _ in range(20)]
    assert all((x == y).all() for x, y in zip(s1, s2))
    assert not all((x == y).all() for x, y in zip(s1, s3))
    assert [m.sum(axis=1).tolist() for m in s1] == [[2, 4, 6]] * 20


def test_state_dicts_round_trip_through_weights_only_torch_load():
    _, _, lin = run_linucb(0, T=50, decay=0.99)
    ucb = UCB1(4, n_rows=2, decay=0.9)
    ucb.update([0, 1, 1], [1, 2, 2], [0.5, 1.0, -1.0])
    ts = CombinatorialTS(5, n_rows=2, seed=4)
    ts.update([0], ts.select([0], 2), True)
    buf = io.BytesIO()
    torch.save({"lin": lin.state_dict(), "ucb": ucb.state_dict(), "ts": ts.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    lin2, ucb2, ts2 = LinUCB(4, 6), UCB1(4, n_rows=2), CombinatorialTS(5, n_rows=2)
    lin2.load_state_dict(state["lin"])
    ucb2.load_state_dict(state["ucb"])
    ts2.load_state_dict(state["ts"])
    X = np.random.default_rng(0).normal(size=(7, 6))
    np.testing.assert_allclose(lin2.scores(X), lin.scores(X))
    assert lin2.decay == 0.99 and ucb2.decay == 0.9
    assert (ucb2.select() == ucb.select()).all()
    assert (ts2.select(None, 2) == ts.select(None, 2)).all()  # same RNG state -> same samples


def test_invalid_arguments_raise():
    with pytest.raises(ValueError):
        UCB1(0)
    with pytest.raises(ValueError):
        LinUCB(2, 3, alpha=-1)
    with pytest.raises(ValueError):
        CombinatorialTS(3, decay=0)
    with pytest.raises(ValueError):
        CombinatorialTS(3).select(None, 4)


def budget_problem(seed=0, K=4, d=5):
    """Deeper arms cost more and are better on average; which arm is worth its cost depends
    on the context (issue 14: a depth bandit under a FLOPs budget)."""
    rng = np.random.default_rng(seed)
    theta = 0.3 * rng.normal(size=(K, d))
    theta[:, -1] = np.linspace(0.0, 0.6, K)  # intercept: deeper is better on average
    cost = np.linspace(1.0 / K, 1.0, K)  # FLOPs fraction of each depth
    return rng, theta, cost


def run_budget(budget, seed=0, rounds=1500, B=16):
    rng, theta, cost = budget_problem(seed)
    K, d = theta.shape
    lin = LinUCB(K, d, alpha=0.3)
    dual = DualPrice(budget, lr=0.05, init=0.5 if budget is not None else 0.0)
    used = []
    for _ in range(rounds):
        X = np.concatenate([rng.normal(size=(B, d - 1)), np.ones((B, 1))], axis=1)  # (B, d)
        arms = lin.select(X, offset=-dual.price * cost)  # (B,)
        q = (X @ theta.T)[np.arange(B), arms] + 0.1 * rng.normal(size=B)  # quality, no cost
        lin.update(X, arms, q)
        used.append(cost[arms].mean())
        dual.update(cost[arms].mean())
    return np.array(used), dual


def test_dual_ascent_meets_a_flops_budget_on_a_synthetic_bandit_problem():
    free, _ = run_budget(None)
    assert free[-500:].mean() > 0.75  # unconstrained, the bandit runs deep: the budget binds
    for budget in (0.35, 0.5, 0.7):
        used, dual = run_budget(budget)
        assert abs(used[-500:].mean() - budget) <= 0.05, (budget, used[-500:].mean())
        assert dual.price > 0
    # a budget that does not bind: the price falls to 0 and nothing is charged
    used, dual = run_budget(1.0)
    assert dual.price == 0.0 and used[-500:].mean() <= 1.0


def test_dual_price_state_and_validation():
    p = DualPrice(0.5, lr=0.1, init=0.2)
    assert p.update(0.9) == pytest.approx(0.24) and p.update(0.0) == pytest.approx(0.19)
    assert p.update(0.0) == pytest.approx(0.14)
    q = DualPrice(None)
    q.load_state_dict(torch.load(io.BytesIO(_saved(p.state_dict())), weights_only=True))
    assert (q.budget, q.price, q.steps) == (0.5, p.price, 3)
    free = DualPrice(None, init=0.3)
    assert free.update(5.0) == 0.3  # no budget: the price is the fixed initial one
    for bad in (dict(budget=0.0), dict(budget=0.5, lr=0.0), dict(budget=0.5, init=-1.0)):
        with pytest.raises(ValueError):
            DualPrice(**bad)


def _saved(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_calibrate_price_grows_its_bracket_beyond_1():
    """A budget that needs a price far above the first bracket [0, 1] is still met."""
    calls = []

    def frac(price):
        calls.append(price)
        return 1.0 / (1.0 + price)  # 0.05 needs price 19

    price, got = calibrate_price(frac, 0.05)
    assert abs(got - 0.05) < 1e-3 and abs(price - 19.0) < 0.5 and max(calls) >= 64
    assert calibrate_price(frac, 0.9)[0] < 1.0  # inside the first bracket


def test_trajectory_context_columns_on_known_probabilities():
    p1 = np.array([[0.9, 0.1], [0.4, 0.6]])  # exit 1: classes 0, 1
    X1, s1 = trajectory_context(p1)
    np.testing.assert_allclose(X1[:, 0], [0.9, 0.6])
    ent = -(0.9 * np.log(0.9) + 0.1 * np.log(0.1)) / np.log(2)
    np.testing.assert_allclose(X1[0, 1], ent)
    np.testing.assert_array_equal(X1[:, 2:5], 0.0)  # no previous exit
    np.testing.assert_array_equal(X1[:, 5], 1.0)
    X2, s2 = trajectory_context(np.array([[0.8, 0.2], [0.7, 0.3]]), s1)  # classes 0, 0
    np.testing.assert_array_equal(X2[:, 2], [1.0, 0.0])  # agrees with exit 1
    np.testing.assert_array_equal(X2[:, 3], [0.0, 0.0])  # no streak of two yet
    np.testing.assert_allclose(X2[:, 4], [0.9, 0.6])  # the previous exit's max probability
    X3, _ = trajectory_context(np.array([[0.95, 0.05], [0.9, 0.1]]), s2)  # classes 0, 0
    np.testing.assert_array_equal(X3[:, 2:4], [[1.0, 1.0], [1.0, 0.0]])  # patience 2 for row 0


def test_trajectory_contexts_of_every_exit_equal_the_chained_ones():
    """Training's batched contexts (all K exits at once) are the cascade's, exit by exit, bit for
    bit (a broken variant that compares each exit with the one two back fails the patience column)."""
    from archsearch.dynamic.depth.stopping import trajectory_contexts

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 64, 3, generator=g) * 2  # K=5 exits, 64 rows, 3 classes: classes change along the way
    probs = logits.double().softmax(-1)
    got = trajectory_contexts(probs)  # (64, 5, 6)
    prev, want = None, []
    for k in range(5):
        X, prev = trajectory_context(probs[k], prev)
        want.append(X)
    want = torch.stack(want, 1)
    assert got.shape == (64, 5, 6) and got.dtype == torch.float64
    assert torch.equal(got, want)
    assert 0 < float(got[:, 1:, 2].mean()) < 1 and float(got[:, 2:, 3].sum()) > 0  # both agreement columns vary


def test_calibrate_monotone_lands_on_a_step_function_target():
    cost = np.linspace(0.25, 1.0, 4)
    rng = np.random.default_rng(0)
    q = rng.normal(size=(500, 4)) * 0.2 + np.linspace(0, 0.6, 4)  # quality per (sample, arm)

    def frac(price):
        return cost[(q - price * cost).argmax(axis=1)].mean()

    for target in (0.3, 0.5, 0.8):
        price, got = calibrate_monotone(frac, target, 0.0, 10.0)
        assert abs(got - target) <= 0.05 and got == frac(price)


def test_offsets_make_selection_cost_aware():
    lin = LinUCB(3, 2, alpha=0.0)
    X = np.ones((4, 2))
    assert lin.select(X).tolist() == [2] * 4  # untrained, no price: ties go to the deepest arm
    assert lin.select(X, offset=-0.1 * np.array([1.0, 2.0, 3.0])).tolist() == [0] * 4
    ucb = UCB1(3, n_rows=1)
    ucb.update([0, 0, 0], [0, 1, 2], [0.5, 0.6, 0.7])
    assert ucb.select(greedy=True).tolist() == [2]
    assert ucb.select(greedy=True, offset=np.array([0.0, -0.05, -0.5])).tolist() == [1]
    # a row never played keeps its last arm (all heads) whatever the offset: no evidence yet
    assert UCB1(3).select(greedy=True, offset=np.array([0.0, -1.0, -2.0])).tolist() == [2]
    assert UCB1(3).select(offset=np.array([0.0, -1.0, -2.0])).tolist() == [0]  # exploring: cheapest first


def stopping_problem(n, seed, informative=True):
    """3 exits, contexts ``[f, 1]``: for ``f = 1`` every exit is right (quality 0.9); for
    ``f = 0`` only the last is (0.2, 0.5, 0.9). ``informative=False``: ``f`` is noise."""
    rng = np.random.default_rng(seed)
    f = rng.integers(0, 2, n).astype(float)
    Xs = np.repeat(np.stack([f, np.ones(n)], 1)[:, None, :], 3, axis=1)  # (n, 3, 2)
    easy = f if informative else rng.integers(0, 2, n).astype(float)
    q = np.where(easy[:, None] == 1, 0.9, np.array([0.2, 0.5, 0.9])[None, :])  # (n, 3)
    return Xs, q, f


def test_linear_stopping_stops_early_exactly_where_deeper_exits_add_nothing():
    costs = np.array([1 / 3, 2 / 3, 1.0])
    pol = LinearStopping(3, 2)
    for step in range(50):
        Xs, q, _ = stopping_problem(64, step)
        pol.update(Xs, q, costs, price=0.1)
    Xs, q, f = stopping_problem(400, 999)
    exits = pol.route(Xs, costs, price=0.1)
    assert (exits[f == 1] == 0).all() and (exits[f == 0] == 2).all()
    # the continuation targets are the realised ones: from exit 0 a hard sample ends at exit 2
    m = np.array([0.0, 1.0]) @ pol.theta[0].T  # stop quality, continuation quality / cost
    np.testing.assert_allclose(m, [0.2, 0.9, 1.0], atol=0.01)
    # a higher price stops hard samples earlier (fewer FLOPs), never later
    assert (pol.route(Xs, costs, price=5.0) <= exits).all() and pol.route(Xs, costs, price=5.0).mean() < exits.mean()
    # when the context carries no information, every sample gets the same exit
    blind = LinearStopping(3, 2)
    for step in range(50):
        Xs_b, q_b, _ = stopping_problem(64, step, informative=False)
        blind.update(Xs_b, q_b, costs, price=0.1)
    assert len(set(blind.route(Xs, costs, price=0.1).tolist())) == 1
    # state round trip, and a fresh policy computes more (continues to the last exit)
    buf = io.BytesIO()
    torch.save(pol.state_dict(), buf)
    buf.seek(0)
    fresh = LinearStopping(3, 2)
    assert (fresh.route(Xs, costs, price=0.1) == 2).all()
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert (fresh.route(Xs, costs, price=0.1) == exits).all()
    with pytest.raises(ValueError, match="n_exits"):
        LinearStopping(0, 2)
    with pytest.raises(ValueError, match="stopping state"):
        LinearStopping(4, 2).load_state_dict(pol.state_dict())


def test_linear_stopping_refit_at_a_price_plays_that_prices_optimum():
    """The continuation targets come from the policy of the price fitted at: exits of quality
    0, 0.5, 0.6 at costs 1/3, 2/3, 1 are worth -0.03, 0.43, 0.5 at price 0.1 (go to the last
    exit) and -0.33, -0.17, -0.4 at price 1 (stop at the middle one)."""
    costs = np.array([1 / 3, 2 / 3, 1.0])
    pol = LinearStopping(3, 1, window=256)
    Xs, q = np.ones((128, 3, 1)), np.tile([0.0, 0.5, 0.6], (128, 1))
    for _ in range(4):
        pol.update(Xs, q, costs, price=0.1)
    assert len(pol.q) == 256 and pol.price == 0.1  # the window keeps the last 256 samples
    assert (pol.route(Xs, costs, 0.1) == 2).all()
    pol.fit(1.0)
    assert (pol.route(Xs, costs, 1.0) == 1).all()


def heavy_tail_problem(n: int, seed: int):
    """Two exits at costs 0.2 / 1; context (confidence f ~ U(0, 1), 1). Exit 0 is right (quality
    1) when f > 0.3 and badly wrong (quality -5) below; exit 1 is always right. At price 0.5
    stopping gains +0.4 above 0.3 and loses 5.6 below, so the best cut is f > 0.3 -- but the
    least-squares line through the step crosses its break-even only at f ~ 0.69."""
    rng = np.random.default_rng(seed)
    f = rng.random(n)
    Xs = np.repeat(np.stack([f, np.ones(n)], 1)[:, None, :], 2, axis=1)  # (n, 2, 2)
    q = np.stack([np.where(f > 0.3, 1.0, -5.0), np.ones(n)], 1)  # (n, 2)
    return Xs, q, f


def test_tuned_stopping_threshold_finds_the_cut_a_misspecified_regression_misses():
    costs, price = np.array([0.2, 1.0]), 0.5
    policies = {rule: LinearStopping(2, 2, rule=rule, ridge=1e-3) for rule in ("regression", "tuned")}
    for step in range(8):
        Xs, q, _ = heavy_tail_problem(256, step)
        for pol in policies.values():
            pol.update(Xs, q, costs, price)
    Xs, q, f = heavy_tail_problem(4000, 999)

    def value(rule):  # mean realised quality - price * cost on fresh samples
        e = policies[rule].route(Xs, costs, price)
        return float(np.mean(q[np.arange(len(q)), e] - price * costs[e])), f[e == 0].min()

    (v_reg, cut_reg), (v_tuned, cut_tuned) = value("regression"), value("tuned")
    best = 0.7 * 0.4 + (1 - price)  # stop exactly above 0.3: +0.4 on 70 % of the rows over continuing
    assert abs(cut_tuned - 0.3) < 0.02 and v_tuned > best - 0.01
    assert cut_reg > 0.6 and v_reg < v_tuned - 0.1
    with pytest.raises(ValueError, match="rule"):
        LinearStopping(2, 2, rule="oracle")


def test_best_stopping_cut_is_the_exact_maximiser():
    rng = np.random.default_rng(0)
    for trial in range(20):
        adv = np.round(rng.normal(size=30), 1)  # ties included
        gain = rng.normal(size=30)
        t = LinearStopping.best_cut(adv, gain)
        brute = max([0.0] + [float(np.sum(gain[adv > c])) for c in np.concatenate([adv, adv - 1e-9])])
        assert float(np.sum(gain[adv > t])) == pytest.approx(brute)
    # the regression's own cut (0) is kept when nothing does strictly better
    assert LinearStopping.best_cut(np.array([1.0, -1.0]), np.array([1.0, -1.0])) == 0.0


def calibrated_exits(n: int, seed: int):
    """Three exits at costs 1/3, 2/3, 1; context (confidence, 1) per exit; each exit is right
    with probability its confidence (calibrated), exit 0's confidences lower than exit 1's."""
    rng = np.random.default_rng(seed)
    conf = np.stack([rng.uniform(0.5, 1.0, n), rng.uniform(0.6, 1.0, n), np.full(n, 0.95)], 1)  # (n, 3)
    Xs = np.stack([conf, np.ones_like(conf)], 2)  # (n, 3, 2)
    q = (rng.random((n, 3)) < conf).astype(float)  # (n, 3) correct or not
    return Xs, q, conf


def test_confidence_stopping_fits_per_exit_thresholds_at_least_as_good_as_one_shared():
    costs, price = np.array([1 / 3, 2 / 3, 1.0]), 0.3
    pol = LinearStopping(3, 2, rule="confidence", score_col=0, window=8192)
    for step in range(32):
        Xs, q, _ = calibrated_exits(256, step)
        pol.update(Xs, q, costs, price)
    Xs, q, conf = calibrated_exits(20000, 999)

    def value(exits):
        return float(np.mean(q[np.arange(len(q)), exits] - price * costs[exits]))

    fitted = value(pol.route(Xs, costs, price))
    shared = []
    for t in np.linspace(0.5, 1.0, 51):  # DeeBERT: stop at the first exit whose confidence passes t
        passed = np.concatenate([conf[:, :2] > t, np.ones((len(q), 1), bool)], 1)
        shared.append(value(passed.argmax(1)))
    assert fitted >= max(shared) - 0.005, (fitted, max(shared))
    # a calibrated exit is worth stopping at when conf_k - price c_k beats continuing: the
    # thresholds sit near the analytic break-even (exit 1: 0.95 - 0.3 / 3 = 0.85)
    assert abs(pol.cut[1] - 0.85) < 0.03, pol.cut
    # one offset on every threshold moves the exits monotonically (the calibration's last knob);
    # a refit clears it, and it survives a state round trip
    means = []
    for d in (-1.0, -0.1, 0.0, 0.05, 1.0):
        pol.offset = d
        means.append(pol.route(Xs, costs, price).mean())
    assert means[0] == 0 and means[-1] == 2 and all(a <= b for a, b in zip(means, means[1:]))
    pol.offset = 0.05
    fresh = LinearStopping(3, 2, rule="confidence", score_col=0)
    fresh.load_state_dict(pol.state_dict())
    assert fresh.offset == 0.05 and (fresh.route(Xs, costs, price) == pol.route(Xs, costs, price)).all()
    pol.fit(price)
    assert pol.offset == 0.0
    with pytest.raises(ValueError, match="score_col"):
        LinearStopping(3, 2, rule="confidence")
