"""benchmarks/searchers/acqf_retry.py without searching: the paired statistic of its protocol
(noretry minus retry, log10 regret per (task, seed)), and the searcher option it measures."""

from __future__ import annotations

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def ar():
    return load_benchmark("searchers.acqf_retry")


def rows(ar, shift: float) -> list[dict]:
    """Both variants on every validation task and seeds 0-4; noretry's HV is ``shift`` lower
    (a fraction of the frozen normaliser) at every trial."""
    hv = ar.protocol()["frozen_normaliser"]["hv"]
    out = []
    for t in ar.L.tasks_of("validation"):
        for seed in range(5):
            base = hv[t] * (0.9 + 0.01 * seed)
            for v, h in (("ahto_retry", base), ("ahto_noretry", base - shift * hv[t])):
                out.append({"task": t, "searcher": v, "seed": seed, "hv": [h] * 40, "ask_seconds": [0.1] * 40})
    return out


def test_identical_searches_differ_by_nothing_and_a_worse_variant_is_caught(ar):
    same = ar.summarize(rows(ar, 0.0))
    assert same["pairs"] == 20 and same["acqf_retry_log10_regret_diff_at_20"] == 0.0
    assert same["acqf_retry_log10_regret_diff_at_20_ci"] == [0.0, 0.0] and same["acqf_retry_default"] is False
    worse = ar.summarize(rows(ar, 0.05))  # regret 0.1 -> 0.15 etc.: log10 differences of ~0.1 to 0.2
    assert worse["acqf_retry_log10_regret_diff_at_20"] > 0.1 and worse["acqf_retry_default"] is True


def test_the_searcher_passes_the_option_to_optimize_acqf(monkeypatch):
    import botorch.optim

    from archsearch.search import make

    seen = []

    def fake(acqf, bounds, q, num_restarts, raw_samples, return_best_only, retry_on_optimization_warning, options):
        seen.append(retry_on_optimization_warning)
        import torch
        return torch.rand(num_restarts, 1, bounds.shape[1], dtype=bounds.dtype), None

    monkeypatch.setattr(botorch.optim, "optimize_acqf", fake)
    from benchmarks.testbeds import lcbench as L

    p = L.LCBenchProblem(L.tasks_of("validation")[0], 2, 10)
    for flag in (True, False):
        s = make("ahto", p.space, seed=0, cost_fn=p.cost_fn, acqf_retry=flag)
        s._optimiser_candidates(None)
    assert seen == [True, False]
