"""CUDA graphs of the cascade's segments (:mod:`archsearch.dynamic.depth.cascade_graphs`): on a GPU every
per-sample gating gives the same logits, exits and FLOPs through graph replays as eagerly, the
graphs follow a change of the stop rule's constants, and a key that forgets one is caught. The
graph tests run with ``ARCHSEARCH_TEST_DEVICE=cuda`` (they skip on a CPU, where graphs are never
used, which the first tests check)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from archsearch.dynamic.depth.cascade_graphs import SegmentGraphs, _rows_bucket
from archsearch.dynamic.depth.dht import DHTGating
from archsearch.dynamic.depth.exits import EXECUTORS, run_cascade
from archsearch.dynamic.depth.predictor import DepthPredictorGating
from test_confidence_exit import confident_gating
from test_depth_predictor import make_batch, make_model, one_thread, spread_depths  # noqa: F401 (autouse)
from test_dht import PAPER, train_steps


def needs_cuda(device):
    if device.type != "cuda":
        pytest.skip("CUDA graphs: run with ARCHSEARCH_TEST_DEVICE=cuda")


def batches(device, sizes=(1, 3, 17, 32)):
    """Batches of several row counts (each bucket of rows) and lengths."""
    out = []
    for i, B in enumerate(sizes):
        x, m = make_batch(B=B, T=12 - (i % 3), seed=40 + i, device=device)
        out.append((x, m))
    return out


def both_ways(g, xs, graphs: SegmentGraphs, repeat=3):
    """Each batch's ``predict`` through ``graphs`` (``repeat`` times: the shapes get captured and
    replayed) and eagerly: ``[(graph (logits, flops), eager (logits, flops)), ...]``."""
    g._segment_graphs = graphs
    out = []
    with torch.inference_mode():
        for x, m in xs:
            for _ in range(repeat):
                graphs.enabled = True
                got = g.predict(x, m)
            graphs.enabled = False
            out.append((got, g.predict(x, m)))
    graphs.enabled = True
    return out


def assert_same(pairs):
    for (lg, fl), (lg_e, fl_e) in pairs:
        torch.testing.assert_close(lg, lg_e, rtol=1e-5, atol=1e-5)
        assert torch.equal(fl.cpu(), fl_e.cpu())


def test_rows_are_bucketed_to_powers_of_two():
    assert [_rows_bucket(b) for b in (1, 2, 3, 4, 5, 17, 32, 33)] == [1, 2, 4, 4, 8, 32, 32, 64]


def test_graphs_need_a_key_and_stay_off_on_a_cpu():
    model = make_model().eval()
    x, m = make_batch(B=4)
    h, pad = model.embed(x), model.padding_mask(x, m)

    def never(k, h, pad, logits, state):
        return torch.zeros(len(h), dtype=torch.bool), None

    with pytest.raises(ValueError, match="key"):
        run_cascade(model, h, pad, [2, 4], 0, never, graphs=SegmentGraphs())
    graphs = SegmentGraphs()
    with torch.no_grad():
        out, idx = run_cascade(model, h, pad, [2, 4], 0, never, graphs=graphs, key=(("x",), None))
    assert not graphs.usable(model, h) and graphs.counts["replays"] == graphs.counts["eager_runs"] == 0
    torch.testing.assert_close(out, model(x, m), rtol=1e-5, atol=1e-6)


def test_confidence_exit_through_graphs_equals_eager(device):
    needs_cuda(device)
    g = confident_gating({"flops_budget": 0.5}, device=device)
    xs = batches(device)
    g.calibrate(xs)
    graphs = SegmentGraphs(measure=False)
    assert_same(both_ways(g, xs, graphs))
    assert graphs.counts["captured"] > 0 and graphs.counts["replays"] > 0 and graphs.counts["failed"] == 0
    measured = SegmentGraphs()  # the default: each shape keeps the faster of eager and graph
    assert_same(both_ways(g, xs, measured))


def test_a_new_threshold_is_followed_and_a_key_without_it_is_caught(device):
    """The graphs bake the threshold in: with it in the key's prefix a new threshold recaptures;
    a key that leaves it out (the broken variant) replays the old decisions."""
    needs_cuda(device)
    g = confident_gating({"flops_budget": 0.5}, device=device)
    m = g.model
    x, mask = make_batch(B=32, seed=7, device=device)
    h, pad = m.embed(x).detach(), m.padding_mask(x, mask)

    def exits(thr, graphs, key):
        with torch.no_grad():
            for _ in range(3):
                # one executor: the default choice cycles executors while it measures, and a
                # shape first captured under the second threshold would not be stale
                _, idx = run_cascade(m, h, pad, g.depths, 0, g.stop_rule(thr), graphs=graphs, key=key,
                                     executor="gather")
        return idx

    lo, hi = 0.55, 0.95
    eager_lo, eager_hi = (exits(t, None, None) for t in (lo, hi))
    assert not torch.equal(eager_lo, eager_hi)  # the two thresholds route differently
    right = SegmentGraphs(measure=False)
    assert torch.equal(exits(lo, right, (("ce", lo), None)), eager_lo)
    assert torch.equal(exits(hi, right, (("ce", hi), None)), eager_hi)
    broken = SegmentGraphs(measure=False)
    assert torch.equal(exits(lo, broken, (("ce",), None)), eager_lo)
    assert torch.equal(exits(hi, broken, (("ce",), None)), eager_lo)  # stale: caught


def test_dht_cascade_through_graphs_equals_eager(device):
    needs_cuda(device)
    torch.manual_seed(0)
    model = make_model(device=device)
    x, mask = make_batch(B=32, seed=3, device=device)
    dht = DHTGating(model, {**PAPER, "n_fixed": 1, "dht_warmup_steps": 0, "dht_warmup_max_steps": 2,
                            "flops_budget": 0.5, "dht_routing": "cascade", "min_heads": 4,
                            "dht_stop_context": "trajectory"}, {"seed": 0})
    model.train()
    train_steps(dht, model, x, mask, torch.randint(0, 2, (32,)).to(device), 4)
    model.eval()
    dht.eval_price = 0.3
    for seed in range(50):  # fitted models that send the rows to several exits
        dht.stopping.theta = 5.0 * np.random.default_rng(seed).normal(size=dht.stopping.theta.shape)
        dht.stopping.__dict__.pop("_theta_cache", None)
        dht._segment_graphs = SegmentGraphs()
        dht._segment_graphs.enabled = False
        if len(dht.plan(x, mask)) >= 2:
            break
    graphs = SegmentGraphs(measure=False)
    pairs = both_ways(dht, batches(device), graphs)
    assert_same(pairs)
    assert graphs.counts["replays"] > 0 and graphs.counts["failed"] == 0
    assert len(dht.plan(x, mask)) >= 2  # the rows really leave at different exits
    with torch.inference_mode():
        _, arms_g, _ = dht._run_cascade(*dht._trunk(x, mask, 0))
    dht._segment_graphs.enabled = False
    with torch.inference_mode():
        _, arms_e, _ = dht._run_cascade(*dht._trunk(x, mask, 0))
    assert torch.equal(arms_g, arms_e)


def test_depth_predictor_through_graphs_equals_eager(device):
    needs_cuda(device)
    model = make_model(device=device).eval()
    gating = DepthPredictorGating(model, {"gamma": 0.5}, {})
    spread_depths(gating)
    graphs = SegmentGraphs(measure=False)
    assert_same(both_ways(gating, batches(device), graphs))
    assert graphs.counts["replays"] > 0 and graphs.counts["failed"] == 0


# ------------------------------------------------------------------ the two executors
def test_the_whole_batch_executors_give_the_gathered_cascades_results(device):
    """``executor="whole"`` (every segment on the whole batch until every row has stopped) and
    ``"whole_async"`` (to the last exit, no host synchronisation) give each row the logits and
    exit of the gathered cascade, also for a rule that carries a state (a broken variant that
    keeps a row's logits from its last stopping exit instead of its first fails here)."""
    g = confident_gating({"flops_budget": 0.5}, device=device)
    m = g.model
    x, mask = make_batch(B=32, seed=7, device=device)
    with torch.no_grad():
        h, pad = m.embed(x), m.padding_mask(x, mask)
        for thr in (0.55, 0.8, 0.95):
            got = {e: run_cascade(m, h, pad, g.depths, 0, g.stop_rule(thr), executor=e) for e in EXECUTORS}
            for e in ("whole", "whole_async"):
                torch.testing.assert_close(got[e][0], got["gather"][0], rtol=1e-5, atol=1e-6)
                assert torch.equal(got[e][1], got["gather"][1])
        idx = got["gather"][1]
        assert len(set(idx.tolist())) >= 2  # the rows leave at different exits

        def by_target(k, hk, pk, logits, state):  # stop at the exit the state names
            (target,) = state
            return target <= k, (target,)

        target = torch.randint(0, len(g.depths), (32,), generator=torch.Generator().manual_seed(1)).to(device)
        ref = run_cascade(m, h, pad, g.depths, 0, by_target, state=(target,), executor="gather")
        assert torch.equal(ref[1], target)
        for e in ("whole", "whole_async"):
            whole = run_cascade(m, h, pad, g.depths, 0, by_target, state=(target,), executor=e)
            assert torch.equal(whole[1], target)
            torch.testing.assert_close(whole[0], ref[0], rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match="executor"):
            run_cascade(m, h, pad, g.depths, 0, by_target, state=(target,), executor="masked")


def test_one_row_runs_without_gathers_and_keeps_the_batch_results(device):
    """A batch of one row (the latency case) takes the cascade's single-row path: each row alone
    gets the logits and exit it gets inside the batch, for the confidence rule at 3 thresholds
    and for a state-carrying rule (a broken variant that reports the exit after the one the row
    stopped at fails here)."""
    g = confident_gating({"flops_budget": 0.5}, device=device)
    m = g.model
    x, mask = make_batch(B=12, seed=9, device=device)

    def by_target(k, hk, pk, logits, state):
        (target,) = state
        return target <= k, (target,)

    target = torch.randint(0, len(g.depths), (12,), generator=torch.Generator().manual_seed(2)).to(device)
    with torch.no_grad():
        h, pad = m.embed(x), m.padding_mask(x, mask)
        runs = [(g.stop_rule(t), None) for t in (0.55, 0.8, 0.95)] + [(by_target, target)]
        seen = set()
        for rule, st in runs:
            lg, idx = run_cascade(m, h, pad, g.depths, 0, rule, state=None if st is None else (st,), executor="gather")
            seen |= set(idx.tolist())
            for i in range(12):
                r = slice(i, i + 1)
                lg1, idx1 = run_cascade(m, h[r], pad[r], g.depths, 0, rule, state=None if st is None else (st[r],))
                assert idx1.shape == (1,) and int(idx1) == int(idx[i])
                torch.testing.assert_close(lg1, lg[r], rtol=1e-4, atol=1e-5)
        assert len(seen) >= 3  # the rows leave at several exits


def test_the_executor_is_chosen_by_its_measured_time():
    """:meth:`SegmentGraphs.choose_executor`: two untimed meetings of each executor, then timed
    ones in turn until each has two clean timings; the fastest is kept for that shape; a run
    during which a graph was captured is not counted; one row, a compute-bound shape and a new
    key prefix are handled as documented."""
    sg, key = SegmentGraphs(), (("p",), None)
    cpu = torch.device("cpu")
    seen = [sg.choose_executor(key, 32, 48) for _ in range(6)]
    assert seen == [(e, False) for e in EXECUTORS for _ in range(2)]
    cost = {"gather": 0.02, "whole": 0.002, "whole_async": 0.01}
    captures = [1]  # the first timed run of "whole" captures a graph (slow): not counted
    while (32, 48) not in sg.executors:
        ex, timed = sg.choose_executor(key, 32, 48)
        if (32, 48) in sg.executors:
            break
        assert timed

        def run(ex=ex):
            if ex == "whole" and captures:
                sg.counts["captured"] += captures.pop()
                time.sleep(0.05)
            time.sleep(cost[ex])
            return ex

        assert sg.timed_run(key, 32, 48, ex, run, cpu) == ex
    assert sg.executors[(32, 48)] == "whole"
    assert sg.choose_executor(key, 32, 48) == ("whole", False)
    cost = {"gather": 0.002, "whole": 0.02, "whole_async": 0.01}  # a shape where the gathered cascade is faster
    for _ in range(18):
        ex, timed = sg.choose_executor(key, 16, 48)
        if timed:
            sg.timed_run(key, 16, 48, ex, lambda ex=ex: time.sleep(cost[ex]), cpu)
    assert sg.executors[(16, 48)] == "gather"
    cost = {"gather": 0.01, "whole": 0.02, "whole_async": 0.002}  # and one where no waiting pays
    for _ in range(18):
        ex, timed = sg.choose_executor(key, 8, 48)
        if timed:
            sg.timed_run(key, 8, 48, ex, lambda ex=ex: time.sleep(cost[ex]), cpu)
    assert sg.executors[(8, 48)] == "whole_async"
    assert sg.choose_executor(key, 1, 48) == ("gather", False)
    assert sg.choose_executor(key, 64, 512) == ("gather", False)  # over max_tokens
    sg.choose_executor((("q",), None), 32, 48)  # other constants: every choice is measured again
    assert (32, 48) not in sg.executors


def test_graphs_choose_an_executor_per_shape_and_keep_the_results(device):
    """On a GPU: the DHT cascade through graphs with the executor chosen by measurement (every
    phase of the choice met) gives the eager gathered cascade's logits, exits and FLOPs."""
    needs_cuda(device)
    g = confident_gating({"flops_budget": 0.5}, device=device)
    xs = batches(device, sizes=(3, 17, 32))
    g.calibrate(xs)
    graphs = SegmentGraphs()
    assert_same(both_ways(g, xs, graphs, repeat=18))
    assert set(graphs.executors.values()) <= set(EXECUTORS) and len(graphs.executors) == 3


class _EagerChooser(SegmentGraphs):
    """The chooser's whole path on a CPU: usable everywhere, segments never captured (eager)."""

    def usable(self, model, h):
        return self.enabled and not model.training and not torch.is_grad_enabled()


def test_the_chooser_path_of_run_cascade_keeps_the_results_on_a_cpu(device):
    """run_cascade with graphs and no executor walks every phase of the choice (untimed, timed,
    chosen) and gives the gathered cascade's results each time; the choice is recorded."""
    g = confident_gating({"flops_budget": 0.5}, device=device)
    m = g.model
    x, mask = make_batch(B=32, seed=7, device=device)
    sg = _EagerChooser(capture_after=10**9)
    with torch.no_grad():
        h, pad = m.embed(x), m.padding_mask(x, mask)
        ref = run_cascade(m, h, pad, g.depths, 0, g.stop_rule(0.8), executor="gather")
        for _ in range(18):
            out = run_cascade(m, h, pad, g.depths, 0, g.stop_rule(0.8), graphs=sg, key=(("ce", 0.8), None))
            torch.testing.assert_close(out[0], ref[0], rtol=1e-5, atol=1e-6)
            assert torch.equal(out[1], ref[1])
    assert sg.executors.get((32, x.shape[1])) in EXECUTORS and not sg.choosing
    assert sg.counts["captured"] == 0 and sg.counts["eager_runs"] > 0
