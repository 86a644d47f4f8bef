"""benchmarks/searchers/conditional.py (issues 37, 65): the summary reads only the protocol's test
seeds, pairs the seeds for the difference against TPE, and a short run of the default
AHTOSampler on the branched objective never proposes a param outside its branch."""

from __future__ import annotations

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def cond():
    return load_benchmark("searchers.conditional")


def _row(sampler, seed, hv40):
    return {"sampler": sampler, "seed": seed, "curve": [hv40 / 2] * 39 + [hv40], "branch_a": 20}


def test_summary_reads_the_test_seeds_and_pairs_them(cond):
    runs = [_row(s, seed, {"ahto": 0.8, "tpe": 0.6, "gp": 0.4}.get(s, 0.5) + 0.01 * (seed % 3))
            for s in cond.SAMPLERS for seed in range(30)]
    runs += [_row("ahto", 3, 0.0)]  # a validation seed's row, replaced: the test keys ignore it
    got = cond.summary(runs)
    assert got["seeds"] == list(cond.TEST_SEEDS)
    assert got["ahto_minus_tpe_hv_conditional_at_40"] == pytest.approx(0.2)
    assert got["ahto_minus_tpe_hv_conditional_at_40_ci"] == pytest.approx([0.2, 0.2])
    assert got["ahto_hv_ratio_vs_gp_conditional_at_40"] == pytest.approx(0.81 / 0.41)
    assert got["ahto_minus_tpe_hv_conditional_at_40_wilcoxon_p"] < 0.05
    val = cond.summary(runs, seeds=cond.VALIDATION_SEEDS)
    assert val["seeds"] == list(range(10)) and min(r["curve"][39] for r in runs if r["seed"] == 3) == 0.0


def test_ahto_on_the_branched_objective_stays_inside_a_branch(cond):
    """Every trial's params are exactly one branch's: the inferred conditions never hand the
    objective a value it does not ask for (a relative param outside the branch would be
    ignored by Optuna, but then the GP would have scored a configuration no trial can run)."""
    import optuna

    from archsearch.search import AHTOSampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["minimize", "minimize"],
                                sampler=AHTOSampler(seed=0, n_startup_trials=4, n_sobol=16, n_perturb=4))
    study.optimize(cond.objective, n_trials=7)
    for t in study.trials:
        want = {"kind", "x", "ya", "za"} if t.params["kind"] == "a" else {"kind", "x", "yb"}
        assert set(t.params) == want
    core = study.sampler.build_core(study, study.sampler.infer_relative_search_space(study, study.trials[-1]))
    assert not any(k.endswith("?active") for k in core.space.params)
