"""AHTO / qLogNEHVI as Optuna samplers a plain Optuna user drops in (archsearch.search.samplers).

Optuna's own sampler test suite (``optuna.testing.pytest_samplers``: basic, relative and
multi-objective cases) runs against both samplers, with a short Sobol design so the GP and the
acquisition are exercised, plus what the suite does not check: constraints set with
``Trial.set_constraint`` are learned, and everything in the storage (added trials, a resumed
study, another worker's running trials) informs the next suggestion.
"""

from __future__ import annotations

import math

import optuna
import pytest
import torch

from archsearch.search.ahto import MODEL_SOURCES
from optuna.testing.pytest_samplers import (BasicSamplerTestCase, MultiObjectiveSamplerTestCase,
                                            RelativeSamplerTestCase)
from optuna.trial import TrialState

from archsearch.search.samplers import (EXTRA_ATTR, AHTOSampler, QNEHVISampler,
                                        param_space_from_distributions)

optuna.logging.set_verbosity(optuna.logging.WARNING)

#: small optimiser effort so the suite stays fast; 2 Sobol trials, then the GP decides
FAST = dict(n_startup_trials=2, num_restarts=1, raw_samples=16, maxiter=5, gp_maxiter=20)


def _ahto():
    return AHTOSampler(seed=0, **FAST)


def _qnehvi():
    return QNEHVISampler(seed=0, **FAST)


@pytest.fixture(params=[_ahto, _qnehvi], ids=["ahto", "qnehvi"])
def _factory(request):
    return request.param


class TestBasic(BasicSamplerTestCase):
    @pytest.fixture
    def sampler(self, _factory):
        return _factory


class TestRelative(RelativeSamplerTestCase):
    @pytest.fixture
    def sampler(self, _factory):
        return _factory


class TestMultiObjective(MultiObjectiveSamplerTestCase):
    @pytest.fixture
    def sampler(self, _factory):
        return _factory


# --------------------------------------------------------------------------- beyond the suite
def _constrained(trial):
    x = trial.suggest_float("x", 0.0, 1.0)
    y = trial.suggest_int("y", 0, 8)
    trial.set_constraint("x_min", 0.6 - x)  # feasible: x >= 0.6
    return (x - 0.3) ** 2 + 0.01 * y


@pytest.mark.slow
def test_set_constraint_is_learned():
    """The unconstrained optimum (x = 0.3) is infeasible, the constrained one is on the
    boundary x = 0.6: model-based trials must close in on it from the feasible side, breaking
    the learned constraint by no more than a hair (random search breaks it by > 0.01 in about
    half its trials; an ignored constraint sends AHTO to x = 0.3)."""
    sampler = AHTOSampler(seed=0, n_startup_trials=5)
    study = optuna.create_study(sampler=sampler)
    study.optimize(_constrained, n_trials=20)
    model_based = [t for t in study.trials[5:]]
    broken = sum(t.constraints["x_min"] > 0.01 for t in model_based)
    assert broken <= 1, [(t.params, t.constraints) for t in model_based]
    assert 0.6 - 1e-9 <= study.best_trial.params["x"] <= 0.62
    sources = [t.system_attrs[EXTRA_ATTR]["source"] for t in study.trials]
    # trial 0 has no relative search space yet (Optuna's rule): the independent sampler draws it
    assert sources[:5] == ["independent"] + ["sobol"] * 4 and "sobol" not in sources[5:]


def _two(trial):
    x = trial.suggest_float("x", 0.0, 1.0)
    c = trial.suggest_categorical("c", ["a", "b"])
    return x + (c == "b"), 1.0 - x


def test_everything_in_the_storage_informs_the_core(tmp_path):
    """Trials added by hand, a resumed study (a new sampler on the same storage) and another
    worker's running trial all reach the core; nothing is kept in the sampler between calls."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    study = optuna.create_study(directions=["minimize", "minimize"], storage=url, study_name="s",
                                sampler=QNEHVISampler(seed=0, n_startup_trials=10))
    study.optimize(_two, n_trials=3)
    dists = study.trials[0].distributions
    study.add_trial(optuna.trial.create_trial(params={"x": 0.9, "c": "a"}, distributions=dists,
                                              values=[0.9, 0.1]))
    running = study.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0),
                         "c": optuna.distributions.CategoricalDistribution(["a", "b"])})

    resumed = optuna.load_study(study_name="s", storage=url, sampler=QNEHVISampler(seed=0))
    core = resumed.sampler.build_core(resumed, resumed.sampler.infer_relative_search_space(
        resumed, running), exclude=None)
    told = {o.trial_id: o for o in core.observations}
    assert set(told) == {f"optuna-{i}" for i in range(4)}
    assert told["optuna-3"].config == {"x": 0.9, "c": "a"} and told["optuna-3"].metrics["objective_0"] == 0.9
    assert list(core.pending) == [f"optuna-{running.number}"]
    assert core.pending[f"optuna-{running.number}"]["config"] == running.params
    assert core.sobol_pos == 5  # the design continues after the trials already in the study

    # a failed trial is an error, not an observation; a pruned one is left out
    failed = resumed.ask(dists)
    resumed.tell(failed, state=TrialState.FAIL)
    core = resumed.sampler.build_core(resumed, dists)
    assert sum(not o.ok for o in core.observations) == 1


def test_metric_names_and_constraints_become_the_space():
    dists = {"lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True),
             "n": optuna.distributions.IntDistribution(1, 9, step=2),
             "w": optuna.distributions.FloatDistribution(0.0, 1.0, step=0.25),
             "act": optuna.distributions.CategoricalDistribution(["gelu", "relu"])}
    space = param_space_from_distributions(
        dists, [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE],
        ["accuracy", "flops"], ["params"])
    assert space.metric_names == ["accuracy", "flops"] and space.modes == ["max", "min"]
    assert set(space.constraints) == {"constraint:params"}
    for u in (0.0, 0.13, 0.5, 0.77, 1.0):
        cfg = space.decode([u] * len(space.dims()))
        assert cfg["n"] in (1, 3, 5, 7, 9) and cfg["w"] in (0.0, 0.25, 0.5, 0.75, 1.0)
        assert 1e-4 <= cfg["lr"] <= 1e-1 and cfg["act"] in ("gelu", "relu")
    with pytest.raises(ValueError, match="choices"):
        param_space_from_distributions({"c": optuna.distributions.CategoricalDistribution([None, 1])},
                                       [optuna.study.StudyDirection.MINIMIZE])


def _inf_left(trial):
    x, y = trial.suggest_float("x", 0.0, 1.0), trial.suggest_float("y", 0.0, 1.0)
    return math.inf if x < 0.4 else (x - 0.4) + (y - 0.5) ** 2


@pytest.mark.slow
def test_an_infinite_objective_is_learned_as_the_worst_value():
    """An objective that returns inf (a diverged configuration) is clipped to the worst value
    seen, as Optuna's GPSampler does, so the model learns to avoid the region. (Dropped as an
    error, it kept the model there: 9 of the 10 model-based trials returned inf.)"""
    study = optuna.create_study(sampler=AHTOSampler(seed=0, n_startup_trials=5))
    study.optimize(_inf_left, n_trials=15)
    model_based = study.trials[5:]
    assert sum(math.isinf(t.value) for t in model_based) <= 4, [t.params for t in model_based]
    assert study.best_value < 0.06
    core = study.sampler.build_core(study, study.trials[0].distributions)
    infinite = [o for o in core.observations if math.isinf(o.metrics["objective_0"])]
    assert infinite and all(o.ok for o in infinite)  # recorded as they came: inf
    worst = max(o.metrics["objective_0"] for o in core.observations if math.isfinite(o.metrics["objective_0"]))
    clipped = {o.trial_id: o.metrics["objective_0"] for o in core.modelled_observations()}
    assert all(clipped[o.trial_id] == worst for o in infinite)


def test_an_infinite_constraint_value_is_not_modelled_and_a_repeated_metric_name_is_not_merged():
    """Clipped, an infinite constraint value could look feasible: that trial stays out of the
    model. Two objectives Optuna lets share a name stay two objectives (before: the second's
    values replaced the first's)."""
    study = optuna.create_study(directions=["minimize", "maximize"], sampler=QNEHVISampler(seed=0))
    study.set_metric_names(["score", "score"])
    dist = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    for i, (x, c) in enumerate(((0.1, -1.0), (0.5, math.inf), (0.9, -2.0))):
        study.add_trial(optuna.trial.create_trial(params={"x": x}, distributions=dist, values=[x, 10 + i],
                                                  constraints={"c": c}))
    core = study.sampler.build_core(study, dist)
    assert [o.metric for o in core.space.objectives] == ["objective_0", "objective_1"]
    from archsearch.search import make
    from archsearch.space import ParamSpace

    both = make("ahto", ParamSpace(objectives=[{"metric": "val_loss", "mode": "min"}],
                                   constraints={"val_loss": {"max": 1.0}},
                                   params={"x": {"type": "float", "low": 0, "high": 1}}), seed=0)
    for i, v in enumerate((0.5, 0.8, math.inf)):  # an objective that is also constrained
        both.tell(f"t{i}", {"val_loss": v}, config={"x": i / 4})
    assert [o.metrics["val_loss"] for o in both.modelled_observations()] == [0.5, 0.8]  # not 0.8: feasible
    assert core.observations[0].metrics["objective_0"] == 0.1 and core.observations[0].metrics["objective_1"] == 10
    assert [o.trial_id for o in core.modelled_observations()] == ["optuna-0", "optuna-2"]


def test_none_among_the_choices_is_modelled_by_index():
    """``suggest_categorical("act", [None, "relu", "gelu"])`` is modelled (its index), as the
    Ray searcher models ``tune.choice([None, ...])`` (before: sampled at random outside the
    model); the objective gets the values themselves."""
    def objective(t):
        act = t.suggest_categorical("act", [None, "relu", "gelu"])
        return (t.suggest_float("x", 0, 1) - 0.3) ** 2 + (act is not None)

    study = optuna.create_study(sampler=_ahto())
    study.optimize(objective, n_trials=6)
    assert all(t.params["act"] in (None, "relu", "gelu") for t in study.trials)
    last = study.trials[-1]
    assert "act" in study.sampler.infer_relative_search_space(study, last)
    core = study.sampler.build_core(study, study.sampler.infer_relative_search_space(study, last))
    assert core.space.params["act"].choices == [0, 1, 2]
    assert {o.config["act"] for o in core.observations} <= {0, 1, 2}
    sources = [t.system_attrs[EXTRA_ATTR]["source"] for t in study.trials]
    assert set(sources[2:]) <= MODEL_SOURCES, sources


def test_single_objective_study_uses_the_model():
    study = optuna.create_study(sampler=_ahto())
    study.optimize(lambda t: (t.suggest_float("x", -2, 2) - 0.5) ** 2, n_trials=8)
    sources = [t.system_attrs[EXTRA_ATTR]["source"] for t in study.trials]
    assert sources[:2] == ["independent", "sobol"] and set(sources[2:]) <= MODEL_SOURCES
    assert all(math.isfinite(t.value) for t in study.trials)


def test_told_config_not_the_asked_one_is_what_the_model_learns():
    """Replay on a table answers a suggestion with the nearest recorded config: the core must
    learn that config (its encoding goes into the GP's training data), not the one it asked."""
    import torch

    from archsearch.search import make

    space = param_space_from_distributions(
        {"x": optuna.distributions.FloatDistribution(0.0, 1.0),
         "n": optuna.distributions.IntDistribution(1, 8)},
        [optuna.study.StudyDirection.MINIMIZE])
    core = make("qnehvi", space, seed=0, n_init=3, num_restarts=1, raw_samples=16, maxiter=5)
    answered = []
    for i in range(4):
        tid, asked = core.ask()
        row = {"x": round(1.0 - asked["x"], 3), "n": 9 - asked["n"]}  # never the asked config
        core.tell(tid, {"objective_0": row["x"] ** 2 + row["n"] / 10}, config=row)
        answered.append(row)
    assert [o.config for o in core.observations] == answered
    model, _, _ = core._acquisition(core.finished())
    X = model.train_inputs[0] if not hasattr(model, "models") else model.models[0].train_inputs[0]
    want = torch.tensor([space.encode(r) for r in answered], dtype=X.dtype)
    assert torch.allclose(X.reshape(-1, X.shape[-1])[-4:], want)


def test_conditions_are_inferred_from_the_trials_nested_and_on_floats():
    """``infer_conditions``: a categorical whose values split the trials with and without a
    param explains it (nested branches through the inner categorical); a param whose presence
    no categorical explains (a branch on a float) gets none; a value seen on both sides
    removes a coincidental condition."""
    from archsearch.search.samplers import infer_conditions

    trials = [{"kind": "a", "sub": 1, "p": 0.1, "y": 0.5}, {"kind": "a", "sub": 2, "y": 0.2},
              {"kind": "b", "z": 0.3}, {"kind": "b", "z": 0.9, "f": 0.7}, {"kind": "b", "z": 0.1}]
    got = infer_conditions(trials, ["sub", "p", "y", "z", "f"], ["kind", "sub"])
    assert got["y"] == {"kind": ["a"]} and got["sub"] == {"kind": ["a"]} and got["z"] == {"kind": ["b"]}
    assert got["p"] == {"sub": [1]}  # nested: kind is a on both sides of p, sub is not
    assert "f" not in got  # present on some kind-b trials only: no categorical explains it
    # "opt" splits like kind by chance (the tie goes by name) until a trial contradicts it
    trials = [{"kind": "a", "opt": "adam", "y": 0.1}, {"kind": "b", "opt": "sgd"}]
    assert infer_conditions(trials, ["y"], ["opt", "kind"])["y"] == {"kind": ["a"]}
    trials.append({"kind": "a", "opt": "sgd", "y": 0.4})
    assert infer_conditions(trials, ["y"], ["opt", "kind"])["y"] == {"kind": ["a"]}
    trials.append({"kind": "b", "opt": "adam"})
    assert infer_conditions(trials, ["y"], ["kind", "opt"])["y"] == {"kind": ["a"]}


def test_a_branch_on_a_float_keeps_its_indicator_and_a_nested_branch_its_condition():
    """In a study, a param no categorical explains keeps the indicator column while the
    others become conditions, chained through the space (``p`` only when ``kind`` is a and
    ``sub`` is 1)."""
    def objective(trial):
        kind = trial.suggest_categorical("kind", ["a", "b"])
        x = trial.suggest_float("x", 0.0, 1.0)
        if kind == "a" and trial.suggest_categorical("sub", [1, 2]) == 1:
            x += trial.suggest_float("p", 0.0, 1.0)
        if x > 0.5:
            x += trial.suggest_float("f", 0.0, 1.0)
        return x

    study = optuna.create_study(sampler=QNEHVISampler(seed=0, n_startup_trials=20))
    for params in ({"kind": "a", "sub": 1, "x": 0.9}, {"kind": "a", "sub": 2, "x": 0.1},
                   {"kind": "b", "x": 0.7}, {"kind": "b", "x": 0.2}):
        study.enqueue_trial(params)
    study.optimize(objective, n_trials=4)
    sampler = study.sampler
    core = sampler.build_core(study, sampler.infer_relative_search_space(study, study.trials[-1]))
    params = core.space.params
    assert params["sub"].when == {"kind": ["a"]} and params["p"].when == {"sub": [1]}
    assert params["f"].when is None and "f?active" in params
    assert list(params).index("sub") < list(params).index("p")
    assert "p" not in core.space.decode(core.space.encode({"kind": "b", "x": 0.5, "sub": 1, "p": 0.3}))


def _branched(trial):
    kind = trial.suggest_categorical("kind", ["a", "b"])
    x = trial.suggest_float("x", 0.0, 1.0)
    if kind == "a":
        return x + (trial.suggest_float("ya", 0.0, 1.0) - 0.3) ** 2
    return x + 0.2 + (trial.suggest_float("yb", 0.0, 1.0) - 0.5) ** 2


@pytest.mark.parametrize("model_branches", [True, "indicators", False])
def test_branch_params_are_modelled_or_left_to_the_independent_sampler(model_branches):
    """A define-by-run objective with branches: with ``model_branches`` the relative search
    space is the union (kind, x, ya, yb) and the core learns from every trial; by default the
    branch params become conditions of the core's space (ya when kind is a), so no candidate
    is a configuration the objective cannot produce; with ``"indicators"`` an "active"
    indicator per branch param instead; without it only (kind, x) is modelled (the ablation)."""
    study = optuna.create_study(sampler=QNEHVISampler(seed=0, model_branches=model_branches, **FAST))
    for kind in ("a", "b", "a", "b"):
        study.enqueue_trial({"kind": kind})
    study.optimize(_branched, n_trials=6)
    sampler = study.sampler
    space = sampler.infer_relative_search_space(study, study.trials[-1])
    core = sampler.build_core(study, space)
    if model_branches is True:
        assert set(space) == {"kind", "x", "ya", "yb"} and len(core.finished()) == 6
        assert not any(k.endswith("?active") for k in core.space.params)
        assert core.space.params["ya"].when == {"kind": ["a"]} and core.space.params["yb"].when == {"kind": ["b"]}
        # every point of the cube decodes to a configuration of one branch
        for x in torch.rand(64, len(core.space.dims()), generator=torch.Generator().manual_seed(0)).tolist():
            cfg = core.space.decode(x)
            assert ("ya" in cfg) == (cfg["kind"] == "a") and ("yb" in cfg) == (cfg["kind"] == "b")
    elif model_branches == "indicators":
        assert set(space) == {"kind", "x", "ya", "yb"}
        assert {"ya?active", "yb?active"} <= set(core.space.params)
        assert len(core.finished()) == 6  # every trial informs the GP, whatever its branch
        # each trial's indicators say which branch it ran: (ya active, yb active)
        assert {(o.config["ya?active"], o.config["yb?active"]) for o in core.finished()} == {(1, 0), (0, 1)}
    else:
        assert set(space) == {"kind", "x"} and len(core.finished()) == 6
        assert not any(k.endswith("?active") for k in core.space.params)
    sources = [t.system_attrs[EXTRA_ATTR]["source"] for t in study.trials]
    assert "optimizer" in sources
    if model_branches:
        # another worker's trial, created and not sampled yet, is no pending point (it was
        # one at the low corner of the cube); a sampled running one is
        fresh, sampled, partial = study.ask(), study.ask(), study.ask()
        sampled.suggest_categorical("kind", ["a", "b"]), sampled.suggest_float("x", 0.0, 1.0)
        partial.suggest_categorical("kind", ["a", "b"])  # x not suggested yet: still a point
        core = sampler.build_core(study, space)
        assert f"optuna-{fresh.number}" not in core.pending
        assert f"optuna-{sampled.number}" in core.pending and f"optuna-{partial.number}" in core.pending
