"""Warm starts from earlier searches (issue 65): the Gaussian-copula prior, its initial design,
the GP that uses it as its mean, and the ways a user hands history in (AHTOSampler's Optuna
studies, ``archsearch search --history RUN``), plus the transfer_gp control's enqueued configs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from archsearch.search import make, transfer
from archsearch.space import parse_space

SPACE = {
    "name": "tr",
    "objectives": [{"metric": "accuracy", "mode": "max"}, {"metric": "latency_ms", "mode": "min"}],
    "budget": {"trials": 10},
    "params": {
        "dropout": {"type": "float", "low": 0.0, "high": 0.5},
        "weight_decay": {"type": "float", "low": 0.0, "high": 0.1},
        "d_model": {"type": "categorical", "choices": [32, 64]},
    },
}
FAST = {"n_init": 3, "num_restarts": 1, "raw_samples": 16, "maxiter": 10, "mc_samples": 16, "gp_maxiter": 30}


def task(shift: float):
    """A family of related tasks: accuracy peaks at x = 0.3 + shift (scaled per task), latency
    grows with y; different scales per task (what the copula transform removes)."""
    def f(c):
        scale = 1 + 10 * shift
        x, y = c["dropout"] / 0.5, c["weight_decay"] / 0.1
        return {"accuracy": scale * (1 - (x - 0.3 - shift) ** 2) + (0.01 if c["d_model"] == 64 else 0.0),
                "latency_ms": math.exp(2 * y) * scale}
    return f


def rows(f, n=64, seed=0, extra=None):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        c = {"dropout": 0.5 * float(rng.random()), "weight_decay": 0.1 * float(rng.random()),
             "d_model": int(rng.choice([32, 64]))}
        c.update(extra or {})
        out.append({"config": c, "metrics": f(c)})
    return out


def history(k=4, **kw):
    return [rows(task(0.02 * i), seed=i, **kw) for i in range(k)]


def test_copula_is_a_rank_transform_with_mean_ranks_for_ties():
    z = transfer.copula(torch.tensor([3.0, 1.0, 2.0, 2.0], dtype=torch.double))
    assert z[1] < z[2] == z[3] < z[0]
    assert abs(float(z.sum())) < 1e-9  # symmetric around 0
    # scale-free: any increasing map gives the same values
    assert torch.allclose(z, transfer.copula(torch.tensor([30.0, -5.0, 7.0, 7.0], dtype=torch.double)))


def test_prior_ranks_a_new_task_of_the_family_and_designs_near_its_optimum():
    space = parse_space(SPACE)
    prior = transfer.CopulaPrior(space, history(), ["accuracy", "latency_ms"], [1.0, -1.0], seed=0)
    assert prior.n_tasks == 4 and prior.objectives == [0, 1] and prior.ignored == []
    new = rows(task(0.05), n=40, seed=9)
    X = torch.tensor([space.encode(r["config"]) for r in new], dtype=torch.double)
    Z = torch.stack([transfer.copula(torch.tensor([r["metrics"]["accuracy"] for r in new], dtype=torch.double)),
                     transfer.copula(torch.tensor([-r["metrics"]["latency_ms"] for r in new], dtype=torch.double))], -1)
    agree = transfer.rank_agreement(prior, X, Z)
    assert agree[0] > 0.8 and agree[1] > 0.9
    for method in ("mean", "setcover"):
        design = prior.design(space, 4, seed=0, method=method)
        assert len(design) == 4 and len({tuple(sorted(c.items())) for c in design}) == 4
        # the most accurate design point sits near the family's optimum (x about 0.33)
        best = max(design, key=lambda c: task(0.05)(c)["accuracy"])
        assert abs(best["dropout"] / 0.5 - 0.33) < 0.15, method
    assert prior.per_task(X).shape == (4, 40, 2)
    with pytest.raises(ValueError, match="design method"):
        prior.design(space, 2, method="best")


def test_prior_ignores_params_it_cannot_match_and_names_them():
    space = parse_space(SPACE)
    h = history(k=2, extra={"label_smoothing": 0.1})
    h[0][0]["config"]["weight_decay"] = 7.0  # outside the space's range: another distribution
    prior = transfer.CopulaPrior(space, h, ["accuracy", "latency_ms"], [1.0, -1.0], seed=0, steps=20)
    assert prior.ignored == ["label_smoothing", "weight_decay"]
    assert [space.dims()[j][0] for j in prior.columns] == ["dropout", "d_model", "d_model"]
    with pytest.warns(UserWarning, match="ignored: label_smoothing, weight_decay"):
        transfer.warn_ignored(prior)


def test_prior_refuses_history_it_cannot_use():
    space = parse_space(SPACE)
    with pytest.raises(ValueError, match="shares no parameter"):
        transfer.CopulaPrior(space, [[{"config": {"gamma": 1}, "metrics": {"accuracy": 1.0}}] * 5],
                             ["accuracy"], [1.0])
    with pytest.raises(ValueError, match="3 or more"):
        transfer.CopulaPrior(space, [rows(task(0), n=2)], ["accuracy"], [1.0])
    with pytest.raises(TypeError, match=r"history\[0\]"):
        transfer.history_tasks([42], ["accuracy"])


@pytest.mark.parametrize("name", ["qnehvi", "ahto"])
def test_searcher_with_history_starts_from_the_prior_and_models_residuals(name):
    space = parse_space(SPACE)
    f = task(0.05)
    s = make(name, space, seed=0, history=history(), **FAST)
    assert s.initial_configs and len(s.initial_configs) == 3
    for i in range(6):
        tid, cfg = s.ask()
        if i < 3:
            assert cfg == s.initial_configs[i]
        s.tell(tid, f(cfg))
    assert set(s.prior_weight) == {"accuracy", "latency_ms"}
    assert s.prior_weight["accuracy"] > 0.3  # a related history: the prior keeps its weight
    if name == "ahto":  # the policy never saw a prior: switched off, and the ask says so
        extra = s.observations[-1].extra
        assert extra["decided_by"] == "acquisition" and extra["policy_off"] == "history"
    # same state, same next suggestion
    s2 = make(name, space, seed=0, history=history(), **FAST)
    s2.load_state_dict(s.state_dict())
    assert s.ask()[1] == s2.ask()[1]


def test_history_mean_false_uses_the_prior_for_the_design_only():
    space = parse_space(SPACE)
    s = make("qnehvi", space, seed=0, history=history(), history_mean=False, history_design="setcover",
             history_design_share=0.5, **FAST)
    assert len(s.initial_configs) == 2  # half of n_init = 3, rounded up; Sobol fills the rest
    f = task(0.05)
    for _ in range(5):
        tid, cfg = s.ask()
        s.tell(tid, f(cfg))
    assert s.prior is not None and s.prior_weight == {}


def test_log_costs_and_grade_options_run():
    space = parse_space(SPACE)
    s = make("qnehvi", space, seed=0, noise_floor=1e-6, output_scale=True, log_costs=True, **FAST)
    f = task(0.0)
    for _ in range(5):
        tid, cfg = s.ask()
        s.tell(tid, f(cfg))
    Y, signs, how = s._modelled_outcomes(s.finished())
    assert how == {"latency_ms": "log"} and signs["latency_ms"] == -1.0
    assert torch.allclose(Y[:, 1], torch.tensor([math.log(o.metrics["latency_ms"]) for o in s.finished()],
                                                dtype=torch.double))


def test_optuna_searcher_proposes_the_enqueued_configs_first_and_resumes_after_them():
    space = parse_space(SPACE)
    given = [{"dropout": 0.1, "weight_decay": 0.02, "d_model": 64}, {"dropout": 0.4, "weight_decay": 0.08, "d_model": 32}]
    s = make("gp", space, seed=0, n_startup_trials=3, initial_configs=given)
    f = task(0.0)
    tid, cfg = s.ask()
    assert cfg == given[0]
    s.tell(tid, f(cfg))
    s2 = make("gp", space, seed=0, n_startup_trials=3, initial_configs=given)
    s2.load_state_dict(s.state_dict())
    assert s2.ask()[1] == given[1]
    assert s.ask()[1] == given[1]
    assert s.ask()[1] not in given


@pytest.mark.parametrize("name", ["gp", "tpe"])
def test_optuna_searcher_with_history_enqueues_the_priors_set_cover(name):
    """``history=`` for GPSampler / TPE: ``n_startup_trials`` configs from the copula prior's
    set cover, proposed first and the same after a restore; refused where there is no start."""
    space = parse_space(SPACE)
    s = make(name, space, seed=0, n_startup_trials=3, history=history())
    design = transfer.CopulaPrior(space, history(), ["accuracy", "latency_ms"], [1.0, -1.0], seed=0).design(
        space, 3, seed=0, method="setcover")
    assert s.initial_configs == design
    f = task(0.05)
    tid, cfg = s.ask()
    assert cfg == design[0]
    s.tell(tid, f(cfg))
    s2 = make(name, space, seed=0, n_startup_trials=3, history=history())
    s2.load_state_dict(s.state_dict())
    assert s2.ask()[1] == s.ask()[1] == design[1]
    with pytest.raises(ValueError, match="takes none"):
        make("random", space, seed=0, history=history())


def test_ahto_sampler_warm_starts_from_optuna_studies():
    optuna = pytest.importorskip("optuna")
    from archsearch.search import AHTOSampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def objective(f):
        def obj(trial):
            c = {"dropout": trial.suggest_float("dropout", 0, 0.5),
                 "weight_decay": trial.suggest_float("weight_decay", 0, 0.1), "d_model": 32}
            m = f(c)
            return m["accuracy"], m["latency_ms"]
        return obj

    past = []
    for i in range(3):
        st = optuna.create_study(directions=["maximize", "minimize"],
                                 sampler=optuna.samplers.RandomSampler(seed=i))
        st.optimize(objective(task(0.02 * i)), n_trials=12)
        past.append(st)
    sampler = AHTOSampler(seed=0, n_startup_trials=3, history=past, **{k: v for k, v in FAST.items() if k != "n_init"})
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    study.optimize(objective(task(0.05)), n_trials=6)
    assert len(sampler._priors) == 1  # fitted once, reused by every ask
    xs = [t.params["dropout"] for t in study.trials]
    assert len(set(xs)) == 6  # the warm start's configs are not proposed twice


@pytest.mark.ray
@pytest.mark.slow
def test_a_search_warm_started_from_an_earlier_run(tiny_run, tmp_path):
    """``run_search(..., history=[RUN])`` (``archsearch search --history RUN``) with the default
    searcher: GPSampler's start configs come from the prior fitted on the earlier run's finished
    trials, the run spec records where they came from, and the search runs as usual (in the
    session's Ray)."""
    from archsearch.runs import RunDir
    from archsearch.tune.runner import run_search
    from conftest import tiny_space

    res = run_search(tiny_space(tmp_path), trials=2, name="warm", storage=tmp_path / "runs",
                     reports=tmp_path / "reports", progress=False, history=[tiny_run.run_dir])
    spec = RunDir.open(res.run_dir).read_spec()
    assert spec.history == [str(Path(tiny_run.run_dir).resolve())]
    recs = RunDir.open(res.run_dir).read_trials()
    assert len(recs) == 2 and all(r["status"] == "TERMINATED" for r in recs)
