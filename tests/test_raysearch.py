"""AHTO as a plain Ray Tune searcher (archsearch.search.raysearch): a Ray user's param_space."""

from __future__ import annotations

import pytest
from ray import tune

from archsearch.search.ahto import MODEL_SOURCES
from archsearch.search.raysearch import AHTOSearch, QNEHVISearch, distributions_from_ray

FAST = dict(n_init=3, num_restarts=1, raw_samples=16, maxiter=5, gp_maxiter=20)

PARAM_SPACE = {
    "lr": tune.loguniform(1e-4, 1e-1),
    "model": {"layers": tune.randint(1, 7), "width": tune.qrandint(32, 128, 32),
              "act": tune.choice(["gelu", "relu"])},
    "dropout": tune.quniform(0.0, 0.5, 0.1),
    "epochs": 3,  # a constant: Tune passes it through
}


def test_param_space_conversion():
    import optuna.distributions as od

    d = distributions_from_ray(PARAM_SPACE)
    assert d == {"lr": od.FloatDistribution(1e-4, 1e-1, log=True),
                 "model/layers": od.IntDistribution(1, 6),  # randint: upper bound exclusive
                 "model/width": od.IntDistribution(32, 128, step=32),  # qrandint: inclusive
                 "model/act": od.CategoricalDistribution(["gelu", "relu"]),
                 "dropout": od.FloatDistribution(0.0, 0.5, step=0.1)}
    with pytest.raises(ValueError, match="grid search"):
        distributions_from_ray({"a": tune.grid_search([1, 2])})
    with pytest.raises(ValueError, match="b: Float with sampler _Normal cannot be searched"):
        distributions_from_ray({"b": tune.randn(0, 1)})
    with pytest.raises(ValueError, match="2 modes"):
        AHTOSearch(metric="a", mode=["min", "max"])


def _check(cfg):
    assert 1e-4 <= cfg["lr"] <= 1e-1 and cfg["epochs"] == 3
    m = cfg["model"]
    assert m["layers"] in range(1, 7) and m["width"] in (32, 64, 96, 128) and m["act"] in ("gelu", "relu")
    assert any(abs(cfg["dropout"] - v) < 1e-9 for v in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5))


def _train(config):
    m = config["model"]
    acc = 1.0 - abs(config["lr"] - 0.01) - 0.02 * abs(m["layers"] - 4) - config["dropout"] / 10
    tune.report({"acc": acc, "flops": m["layers"] * m["width"], "cfg": config})


@pytest.mark.slow
def test_tuner_with_plain_param_space(ray_session, tmp_path):
    """tune.Tuner + function trainable + plain param_space, multi-objective, ConcurrencyLimiter;
    then the searcher's checkpoint restores to the same next suggestion."""
    import sys

    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    search = AHTOSearch(metric=["acc", "flops"], mode=["max", "min"], seed=0, **FAST)
    tuner = tune.Tuner(
        _train, param_space=PARAM_SPACE,
        tune_config=tune.TuneConfig(num_samples=8, search_alg=tune.search.ConcurrencyLimiter(
            search, max_concurrent=2)),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="plain", verbose=0))
    results = tuner.fit()
    assert len(results) == 8 and not results.errors
    for r in results:
        _check(r.metrics["cfg"])
    core = search.core
    assert len(core.finished()) == 8 and not core.pending
    # the first n_init = 3 asks are the Sobol design, then the model decides. Observations are
    # in completion order, and two trials run at once, so the third Sobol trial may finish
    # after the fourth trial: count the sources instead of reading the list's order
    sources = [o.extra["source"] for o in core.observations]
    assert sources.count("sobol") == 3, sources
    assert set(sources) - {"sobol"} <= MODEL_SOURCES, sources

    search.save(str(tmp_path / "s.pkl"))
    again = AHTOSearch(seed=0, **FAST)
    again.restore(str(tmp_path / "s.pkl"))
    assert search.suggest("next") == again.suggest("next")


def test_single_objective_from_tune_config():
    """metric/mode from TuneConfig (set_search_properties), one objective: qLogNEI after Sobol."""
    s = QNEHVISearch(seed=1, **FAST)
    assert s.set_search_properties("acc", "max", PARAM_SPACE)
    assert not s.set_search_properties("acc", "max", PARAM_SPACE)  # already has its space
    for i in range(6):
        cfg = s.suggest(f"t{i}")
        _check({**cfg, "epochs": 3})
        m = cfg["model"]
        s.on_trial_complete(f"t{i}", {"acc": -abs(m["layers"] - 4) - cfg["lr"]})
    assert len(s.core.finished()) == 6
    assert s.core.observations[-1].extra["source"] == "optimizer"
    s.on_trial_complete("t-unknown", {"acc": 1.0})  # unknown ids are ignored, as Tune expects
    s.suggest("bad")
    s.on_trial_complete("bad", {"other": 1.0})  # no objective value: an error, not a crash
    assert not s.core.observations[-1].ok


def test_a_partial_point_to_evaluate_is_completed_by_the_searcher():
    """``points_to_evaluate`` entries may give some params (as Ray's OptunaSearch takes them):
    the given values are kept and the searcher proposes the rest (a KeyError before)."""
    ps = {"lr": tune.loguniform(1e-4, 1e-1), "model": {"layers": tune.randint(1, 7)},
          "act": tune.choice(["a", "b"])}
    s = QNEHVISearch(metric="acc", mode="max", seed=0, n_init=3, points_to_evaluate=[{"lr": 0.01}])
    assert s.set_search_properties(None, None, ps)
    first = s.suggest("t0")
    assert first["lr"] == 0.01 and first["act"] in ("a", "b") and 1 <= first["model"]["layers"] <= 6
    assert s.core.pending["t0"]["extra"]["source"] == "points_to_evaluate"
    assert s.suggest("t1")["lr"] != 0.01  # the point was used once


def test_an_infinite_constraint_value_does_not_stop_the_search():
    """Optuna's ``set_constraint`` accepts inf (and a Tune result's constraint metric can be
    NaN): the GP fit is made on finite rows only, the trial still counts as infeasible. Before,
    every ask after it raised botorch's InputDataError (NaN in the fit)."""
    import optuna

    from archsearch.search.samplers import QNEHVISampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def objective(t):
        x = t.suggest_float("x", 0.0, 1.0)
        t.set_constraint("c", float("inf") if t.number == 1 else x - 0.5)
        return (x - 0.3) ** 2

    study = optuna.create_study(sampler=QNEHVISampler(seed=0, n_startup_trials=3))
    study.optimize(objective, n_trials=6)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 6
    assert study.trials[1].constraints == {"c": float("inf")}
    sources = [t.system_attrs.get("archsearch:ask", {}).get("source") for t in study.trials]
    assert "optimizer" in sources[3:], sources


def test_numpy_metric_values_are_numbers():
    """A trainable that reports NumPy scalars (``np.float32`` from a tensor's ``.numpy()``,
    ``np.int64``) reports numbers, as Ray's own searchers take them: the trial is an observation,
    not a failure. A bool is still not a number. (Before: ``np.float32`` and ``np.int64`` were
    recorded as failed trials.)"""
    import numpy as np

    s = QNEHVISearch(seed=1, **FAST)
    s.set_search_properties("acc", "max", PARAM_SPACE)
    for i, v in enumerate([np.float32(0.5), np.int64(1), 0.25, np.bool_(True), True]):
        s.suggest(f"t{i}")
        s.on_trial_complete(f"t{i}", {"acc": v})
    assert [o.ok for o in s.core.observations] == [True, True, True, False, False]
    assert s.core.observations[0].metrics == {"acc": 0.5}


def test_choices_of_any_value_are_searched_by_their_index(tmp_path):
    """``tune.choice`` of ``None`` and of lists (layer sizes), as ``OptunaSearch`` takes them
    (before: a ValueError when the Tuner started): the trainable gets the values themselves,
    a ``points_to_evaluate`` entry gives them too, and a restored searcher continues alike."""
    import warnings

    from ray import tune

    space = {"lr": tune.loguniform(1e-4, 1e-1), "dropout": tune.choice([None, 0.1]),
             "net": {"layers": tune.choice([[64, 64], [128]])}}
    effort = {k: v for k, v in FAST.items() if k != "n_init"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna's warning about list choices stays inside
        s = QNEHVISearch(seed=0, n_init=2, param_space=space, metric="acc", mode="max",
                         points_to_evaluate=[{"dropout": None, "net": {"layers": [128]}}], **effort)
    first = s.suggest("p")
    assert first["dropout"] is None and first["net"]["layers"] == [128]
    s.on_trial_complete("p", {"acc": 0.5})
    for i in range(4):
        cfg = s.suggest(f"t{i}")
        assert cfg["dropout"] in (None, 0.1) and cfg["net"]["layers"] in ([64, 64], [128]), cfg
        s.on_trial_complete(f"t{i}", {"acc": float(cfg["dropout"] or 0) + len(cfg["net"]["layers"])})
    assert all(o.ok for o in s.core.observations)
    s.save(str(tmp_path / "s.pkl"))
    again = QNEHVISearch(seed=0, n_init=2, **effort)
    again.restore(str(tmp_path / "s.pkl"))
    assert s.suggest("next") == again.suggest("next")
    dicts = {"opt": tune.choice([{"n": i} for i in range(6)]), "lr": tune.uniform(0, 1)}
    for seed in range(3):  # a dict choice in a point is taken whole (flattened, it was lost)
        d = QNEHVISearch(seed=seed, param_space=dicts, metric="acc", mode="max",
                         points_to_evaluate=[{"opt": {"n": 5}, "lr": 0.5}])
        assert d.suggest("p") == {"opt": {"n": 5}, "lr": 0.5}
    with pytest.raises(ValueError, match="a metric is listed twice"):
        QNEHVISearch(metric=["loss", "loss"], mode=["min", "max"])
    bad = QNEHVISearch(seed=0, param_space=space, metric="acc", mode="max",
                       points_to_evaluate=[{"dropout": 0.7}])
    with pytest.raises(ValueError, match=r"points_to_evaluate: dropout=0.7 is not one of \[None, 0.1\]"):
        bad.suggest("b")


def test_ahto_search_takes_history_rows_in_the_flattened_param_names():
    """``AHTOSearch(history=...)`` (issue 65): rows whose configs use the Tuner's flattened
    names (``model/layers``) fit the transfer prior, whose design opens the search."""
    import numpy as np

    ps = {"lr": tune.loguniform(1e-4, 1e-1), "model": {"layers": tune.randint(1, 7)}}
    rng = np.random.default_rng(0)
    past = [[{"config": {"lr": float(10 ** rng.uniform(-4, -1)), "model/layers": int(rng.integers(1, 7))},
              "metrics": {"acc": 0.0}} for _ in range(12)] for _ in range(2)]
    for task in past:
        for r in task:
            r["metrics"]["acc"] = -abs(r["config"]["model/layers"] - 4) - r["config"]["lr"]
    s = AHTOSearch(metric="acc", mode="max", seed=0, n_init=3, history=past, num_restarts=1, raw_samples=16)
    assert s.set_search_properties(None, None, ps)
    assert s.core.prior is not None and s.core.prior.n_tasks == 2
    first = s.suggest("t0")
    assert first == {"lr": s.core.initial_configs[0]["lr"], "model": {"layers": s.core.initial_configs[0]["model/layers"]}}
