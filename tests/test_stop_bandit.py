"""The per-exit {stop, continue} bandit (``dht_stop_rule: bandit``): bandit feedback only,
exploration that matters, greedy decisions, a state that restores them."""

import copy

import numpy as np
import pytest
import torch

from archsearch.dynamic.depth.stop_bandit import BanditStopping
from archsearch.dynamic.depth.stopping import LinearStopping

K, D = 4, 3


def cascade(n=600, seed=0):
    """Contexts ``n x K x 3`` (confidence, confidence squared, 1), qualities that rise with the
    exit and with confidence, and per-exit costs (the fraction of the deepest exit's)."""
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0, 1, (n, K)) * np.linspace(0.6, 1.0, K)
    X = np.stack([conf, conf ** 2, np.ones_like(conf)], -1)
    q = (rng.uniform(0, 1, (n, K)) < np.clip(conf + 0.1 * np.arange(K), 0, 1)).astype(float)
    q[:, -1] = 1.0
    c = np.broadcast_to(np.arange(1, K + 1) / K, (n, K)).copy()
    return X, q, c


def test_bandit_reads_only_the_qualities_of_the_arms_it_plays():
    X, q, c = cascade(64)
    b = BanditStopping(K, D, alpha=1.0)
    b.fit(0.3, data=cascade(300, seed=1))  # something learnt, so rows stop at different exits
    ref = copy.deepcopy(b)
    tau = ref._learn(X, q, c, 0.3)
    assert len(set(tau.tolist())) > 1  # the batch really spreads over the exits
    blind = np.full_like(q, np.nan)  # only the exit each row stops at is revealed
    blind[np.arange(len(q)), tau] = q[np.arange(len(q)), tau]
    assert (b._learn(X, blind, c, 0.3) == tau).all()
    assert np.isfinite(b.b).all() and np.allclose(b.b, ref.b) and np.allclose(b.A, ref.A)
    # a full-information fit reads the blinded exits and is poisoned by them (the check can fail)
    full = LinearStopping(K, D)
    full.fit(0.3, data=(X, blind, c))
    assert not np.isfinite(full.theta).all()


def test_exploration_is_what_makes_the_bandit_try_going_on():
    X, q, c = cascade()
    greedy, ucb = BanditStopping(K, D, alpha=0.0), BanditStopping(K, D, alpha=1.0)
    for b in (greedy, ucb):
        b.fit(0.5, data=(X, q, c))
    # greedy from empty models: stopping at exit 0 is cheaper, so it never learns what going on is worth
    assert greedy.plays[0, 1] == 0 and (greedy.route(X, c[0], 0.5) == 0).all()
    assert ucb.plays[0, 1] > 0 and ucb.plays[1:].sum() > 0
    assert len(np.unique(ucb.route(X, c[0], 0.5))) > 1


def test_the_greedy_bandit_prices_depth_like_the_full_information_fit():
    X, q, c = cascade(2000)
    test = cascade(2000, seed=3)
    for price in (0.2, 1.0):
        b, ls = BanditStopping(K, D, alpha=1.0), LinearStopping(K, D)
        b.fit(price, data=(X, q, c))
        ls.fit(price, data=(X, q, c))
        eb, el = b.route(test[0], c[0], price), ls.route(test[0], c[0], price)
        rows = np.arange(len(eb))

        def value(e):
            return test[1][rows, e].mean() - price * c[0][e].mean()

        assert value(eb) >= value(el) - 0.03, (price, value(eb), value(el))
    # a higher price stops earlier
    cheap, dear = BanditStopping(K, D), BanditStopping(K, D)
    cheap.fit(0.05, data=(X, q, c))
    dear.fit(2.0, data=(X, q, c))
    assert dear.route(X, c[0], 2.0).mean() < cheap.route(X, c[0], 0.05).mean()


def test_online_updates_keep_what_was_learnt_and_the_state_restores_the_decisions():
    X, q, c = cascade(256)
    b = BanditStopping(K, D, alpha=0.5, window=100)
    for i in range(0, 256, 32):
        b.update(X[i:i + 32], q[i:i + 32], c[0], 0.4)
    assert b.updates == 8 and len(b.q) == 100
    assert b.plays[0].sum() == 256  # every row played an arm at exit 0, over all updates
    state = b.state_dict()
    saved = torch.load(_roundtrip(state), weights_only=True)
    other = BanditStopping(K, D)
    other.load_state_dict(saved)
    assert np.allclose(other.A, b.A) and other.alpha == 0.5
    assert (other.route(X, c[0], 0.4) == b.route(X, c[0], 0.4)).all()
    with pytest.raises(ValueError, match="no bandit statistics"):
        other.load_state_dict(LinearStopping(K, D).state_dict())


def _roundtrip(state):
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return buf


def test_bad_arguments_raise():
    for kw in ({"alpha": -1}, {"passes": 0}, {"batch": 0}):
        with pytest.raises(ValueError, match="alpha >= 0"):
            BanditStopping(K, D, **kw)
