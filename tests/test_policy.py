"""AHTO's meta-trained acquisition policy (archsearch/search/policy.py) and its benchmark, LCBench.

Checks: the residual starts at zero (an untrained policy picks the acquisition's argmax over the
pool); a policy with a non-zero residual changes the choice the way its weights say; features
are dimension-free; weights files round-trip and bad ones fail naming the file; the shipped
weights were trained on training tasks only; the Optuna and Ray drop-ins have visible
signatures; the vendored LCBench surrogate reproduces yahpo-gym's numbers.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch

from archsearch.search import make, policy as pol
from archsearch.space import FloatParam, IntParam, ObjectiveSpec, ParamSpace

ROOT = Path(__file__).resolve().parents[1]
def space():
    """A ParamSpace (what the Optuna/Ray drop-ins build): 2 floats, 1 int, 2 objectives."""
    return ParamSpace(objectives=[ObjectiveSpec(metric="acc", mode="max"), ObjectiveSpec(metric="lat", mode="min")],
                      params={"x0": FloatParam(type="float", low=0.0, high=1.0),
                              "x1": FloatParam(type="float", low=0.0, high=1.0),
                              "n": IntParam(type="int", low=1, high=8)})


FAST = {"n_init": 4, "num_restarts": 1, "raw_samples": 16, "maxiter": 5, "mc_samples": 16, "gp_maxiter": 20,
        "n_sobol": 16, "n_perturb": 4}


def metrics(cfg):
    return {"acc": 0.5 + 0.3 * cfg["x0"] - 0.2 * (cfg["x1"] - 0.3) ** 2 + 0.01 * cfg["n"],
            "lat": 1.0 + cfg["n"] + 2 * cfg["x0"]}


def drive(s, n):
    for _ in range(n):
        tid, cfg = s.ask()
        s.tell(tid, metrics(cfg))


def write_weights(path, net, manifest=None):
    path.write_text(json.dumps(net.to_json(manifest or {})))
    return str(path)


def test_untrained_policy_is_the_acquisition_argmax(tmp_path):
    """Zero residual: the policy's pick is the pool's best log acquisition (index 0 of the
    acquisition-sorted pool), and the extra says it did not change the choice."""
    f = write_weights(tmp_path / "zero.json", pol.PolicyNet())
    s = make("ahto", space(), seed=0, policy=f, record_pool=True, **FAST)
    drive(s, 4)
    tid, cfg = s.ask()
    pool = s.last_pool
    assert pool["chosen"] == 0 and cfg == pool["configs"][0]
    assert s.pending[tid]["extra"] == {"source": s.pending[tid]["extra"]["source"], "decided_by": "meta_policy",
                                       "policy_changed": False}
    F = pool["features"]
    assert F.shape == (len(pool["configs"]), len(pol.FEATURES))
    assert F[0, 0] == 0 and (F[:, 0] <= 0).all()  # log acquisition gap to the pool's best


def test_a_residual_changes_the_choice_as_its_weights_say(tmp_path):
    """A hand-set residual that rewards the distance to observed points outweighs the log
    acquisition: the chosen candidate is the pool's farthest from the observations, not the
    acquisition's argmax. A broken policy (residual ignored) would pick index 0 and fail."""
    net = pol.PolicyNet(hidden=1)
    j = pol.FEATURES.index("dist_observed")
    with torch.no_grad():
        net.net[0].weight.zero_()
        net.net[0].weight[0, j] = 1.0     # hidden = tanh(dist): monotone in the distance
        net.net[2].weight.fill_(1.0)
        net.net[2].bias.zero_()
        net.net[-1].weight.fill_(1e4)     # dominates any acquisition gap (clamped at -30)
    f = write_weights(tmp_path / "far.json", net)
    s = make("ahto", space(), seed=0, policy=f, record_pool=True, **FAST)
    drive(s, 4)
    tid, cfg = s.ask()
    F = s.last_pool["features"]
    assert s.last_pool["chosen"] == int(torch.argmax(F[:, j]))
    assert s.last_pool["chosen"] != 0 and s.pending[tid]["extra"]["policy_changed"] is True


def test_features_are_dimension_free():
    g = torch.Generator().manual_seed(0)
    shapes = set()
    for d in (2, 7, 30):
        X, src = pol.candidate_pool(torch.rand(2, d, dtype=torch.double), torch.rand(3, d, dtype=torch.double), d,
                                    n_sobol=8, n_perturb=4, scale=0.1, generator=g)
        n = len(X)
        assert X.min() >= 0 and X.max() <= 1 and len(src) == n
        for m in (1, 2):
            F = pol.candidate_features(
                log_acq=torch.randn(n, dtype=torch.double), mean=torch.randn(n, m, dtype=torch.double),
                sd=torch.rand(n, m, dtype=torch.double), best=torch.zeros(m, dtype=torch.double),
                y_sd=torch.ones(m, dtype=torch.double), p_feasible=torch.ones(n, dtype=torch.double), X=X,
                X_obs=torch.rand(5, d, dtype=torch.double), X_front=torch.rand(2, d, dtype=torch.double),
                budget_used=0.5, sources=src)
            shapes.add(F.shape[1])
            assert torch.isfinite(F).all()
    assert shapes == {len(pol.FEATURES)}


def test_weights_round_trip_and_bad_files(tmp_path):
    net = pol.PolicyNet(hidden=4)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_()
    f = write_weights(tmp_path / "w.json", net, {"training_tasks": ["1"]})
    back = pol.load_policy(f)
    x = torch.randn(5, len(pol.FEATURES), dtype=torch.double)
    assert torch.allclose(back(x), net(x))
    bad = tmp_path / "bad.json"
    bad.write_text('{"features": ["x"], "hidden": 4, "state": {}}')
    with pytest.raises(ValueError, match="bad.json"):
        pol.load_policy(bad)
    bad.write_text("not json")
    with pytest.raises(ValueError, match="bad.json"):
        pol.load_policy(bad)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        pol.load_policy(tmp_path / "missing.json")


def test_linear_policy_zero_is_the_argmax_and_its_budget_products_act(tmp_path):
    """The episode-trained kind (``LinearPolicy``): zero weights pick the acquisition's argmax
    inside AHTO; a weight on ``budget_used * dist_observed`` changes the choice late in the
    budget only (at budget 0 the product is 0); the file round-trips; a wrong feature list fails
    naming the file."""
    f = write_weights(tmp_path / "lin0.json", pol.LinearPolicy())
    s = make("ahto", space(), seed=0, policy=f, record_pool=True, **FAST)
    drive(s, 4)
    s.ask()
    assert s.last_pool["chosen"] == 0
    w = torch.zeros(len(pol.FEATURES) + len(pol.BUDGET_PRODUCTS), dtype=torch.double)
    w[len(pol.FEATURES) + pol.BUDGET_PRODUCTS.index("dist_observed")] = 1e4
    lin = pol.LinearPolicy(w)
    x = torch.rand(6, len(pol.FEATURES), dtype=torch.double)
    x[:, 0] = -torch.arange(6, dtype=torch.double)  # index 0: the acquisition's best
    j, b = pol.FEATURES.index("dist_observed"), pol.FEATURES.index("budget_used")
    x[:, j] = torch.tensor([0.1, 0.2, 0.9, 0.3, 0.4, 0.5], dtype=torch.double)
    x[:, b] = 0.0
    assert int(torch.argmax(lin(x))) == 0
    x[:, b] = 0.5
    assert int(torch.argmax(lin(x))) == 2
    back = pol.load_policy(write_weights(tmp_path / "lin.json", lin, {"iterations": 1}))
    assert isinstance(back, pol.LinearPolicy) and torch.allclose(back(x), lin(x))
    bad = tmp_path / "badlin.json"
    bad.write_text(json.dumps({**lin.to_json({}), "budget_products": ["sd_0"]}))
    with pytest.raises(ValueError, match="badlin.json"):
        pol.load_policy(bad)
    with pytest.raises(ValueError, match="weights"):
        pol.LinearPolicy(torch.zeros(3, dtype=torch.double))


def test_shipped_policy_was_trained_on_training_tasks_only():
    """The manifest names its training tasks: all from the committed split's train part, none
    from validation or test (a leak would be caught here)."""
    if not pol.WEIGHTS.exists():
        pytest.skip("no shipped policy weights yet (python -m benchmarks.ahto_policy.ahto_policy run --stage train)")
    blob = json.loads(pol.WEIGHTS.read_text())
    split = json.loads((ROOT / "benchmarks" / "testbeds" / "data" / "lcbench_split.json").read_text())["split"]
    man = blob["manifest"]
    assert man["training_tasks"] and set(man["training_tasks"]) <= set(split["train"])
    assert not set(man["training_tasks"]) & (set(split["validation"]) | set(split["test"]))
    for key in ("commit", "train_seconds", "collect_seconds", "hyperparameters", "episodes"):
        assert key in man
    assert pol.load_policy() is not None


@pytest.mark.parametrize("cls_name", ["AHTOSampler", "QNEHVISampler", "AHTOSearch", "QNEHVISearch"])
def test_drop_ins_have_visible_documented_signatures(cls_name):
    import archsearch.search as search

    cls = getattr(search, cls_name)
    params = inspect.signature(cls).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    doc = inspect.getdoc(cls)
    for name in params:
        assert name in doc, f"{cls_name}: parameter {name} is not documented"


# ---------------------------------------------------------------------- LCBench
@pytest.fixture(scope="module")
def lcbench():
    pytest.importorskip("onnxruntime")
    from benchmarks.testbeds import lcbench as lc

    return lc


def test_lcbench_surrogate_matches_yahpo_gym(lcbench):
    """Two rows computed with yahpo-gym 1.0.2's BenchmarkSet.objective_function (throwaway
    environment; benchmarks/searchers/results/lcbench_check.json compares 300)."""
    s = lcbench.surrogate()
    cfg = {"batch_size": 91, "learning_rate": 0.0031622777, "momentum": 0.545, "weight_decay": 0.050005,
           "num_layers": 3, "max_units": 256, "max_dropout": 0.5}
    got = s.predict("3945", [cfg, cfg], epoch=[52, 10])
    check = json.loads((ROOT / "benchmarks" / "searchers" / "results" / "lcbench_check.json").read_text())["summary"]
    assert check["agrees"] and check["rows"] >= 300
    assert got["val_accuracy"].shape == (2,) and (got["time"] > 0).all()
    assert got["time"][0] > got["time"][1]  # 52 epochs take longer than 10
    assert 0 < got["val_accuracy"][0] <= 100


def test_lcbench_hypervolume_matches_archsearch(lcbench):
    from archsearch.pareto import hypervolume

    g = torch.Generator().manual_seed(0)
    Y = torch.rand(30, 2, generator=g, dtype=torch.double).tolist()
    ref = [0.1, 0.2]
    assert lcbench.hv2(Y, ref) == pytest.approx(hypervolume(Y, ["max", "max"], ref))


def test_initial_configs_come_first():
    """The transfer baseline's warm start: the given configs, in order, then the Sobol design."""
    first = [{"x0": 0.1, "x1": 0.2, "n": 3}, {"x0": 0.9, "x1": 0.8, "n": 1}]
    s = make("qnehvi", space(), seed=0, initial_configs=first, n_init=4)
    asked = [s.ask()[1] for _ in range(3)]
    assert asked[:2] == first and asked[2] not in first


def _fake_lc_runs(path, tasks, level):
    """Runs whose regret at every trial is ``level[searcher](task)`` (HV = max_hv (1 - regret))."""
    rows = []
    for t in tasks:
        for s, f in level.items():
            for seed in range(5):
                reg = f(t) * (1 + 0.01 * seed)
                rows.append({"problem": f"lcbench_{t}", "searcher": s, "seed": seed, "max_hv": 100.0,
                             "hv": [100.0 * (1 - reg)] * 20, "curve": [1 - reg] * 20, "seconds": 1.0,
                             "commit": "x", "torch_threads": 1})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_lcbench_keys_detect_a_gain_and_not_a_copy(lcbench, tmp_path):
    """searchers.py's issue-37 keys on fake runs: ahto at half of qnehvi's regret on 9 of 10 test
    tasks gives ratio 0.5, p < 0.05, 1 task worse; a copy of qnehvi (the broken variant) gives
    ratio 1, no p (every difference is zero) and no task worse."""
    from benchmarks.searchers import searchers

    tasks = lcbench.load_split()["test"]
    worse = tasks[0]
    level = {"qnehvi": lambda t: 0.1, "tpe": lambda t: 0.2, "gp": lambda t: 0.1,
             "ahto": lambda t: 0.12 if t == worse else 0.05}
    keys, details = searchers.lcbench_keys(_fake_lc_runs(tmp_path / "a.jsonl", tasks, level))
    assert keys["ahto_regret_ratio_vs_qnehvi_at_20"] == pytest.approx(0.5)
    assert keys["ahto_wilcoxon_p_vs_qnehvi_at_20"] < 0.05
    assert keys["ahto_tasks_worse_than_qnehvi_at_20"] == 1
    assert keys["ahto_regret_ratio_vs_tpe_at_20"] == pytest.approx(0.25)
    level["ahto"] = level["qnehvi"]
    keys, _ = searchers.lcbench_keys(_fake_lc_runs(tmp_path / "b.jsonl", tasks, level))
    assert keys["ahto_regret_ratio_vs_qnehvi_at_20"] == pytest.approx(1.0)
    assert keys["ahto_wilcoxon_p_vs_qnehvi_at_20"] is None and keys["ahto_tasks_worse_than_qnehvi_at_20"] == 0


def test_episode_return_is_group_relative_and_draws_are_fixed(lcbench):
    """benchmarks/ahto_policy/episodes.py: a rollout that copies the base earns exactly 0, one
    with more hypervolume at every checkpoint earns more than 0 and one with less earns less;
    only the checkpoints within the horizon count; an iteration's draws are the same on every
    call (a resumed run repeats them) and differ between iterations."""
    import numpy as np

    from benchmarks.ahto_policy import episodes as E

    task = lcbench.load_split()["train"][0]
    best = lcbench.task_reference(task)["best"]
    base = [best * (0.5 + 0.4 * k / 40) for k in range(40)]
    up = [min(h * 1.05, best) for h in base]
    down = [h * 0.9 for h in base]
    cps, (same, better, worse) = E.group_returns(task, 20, base, [base, up, down])
    assert list(cps) == [10, 20] and same == 0.0 and better > 0 > worse
    g1, u1 = E.draws(3, ["a", "b", "c"])
    g2, u2 = E.draws(3, ["a", "b", "c"])
    g3, u3 = E.draws(4, ["a", "b", "c"])
    assert g1 == g2 and np.array_equal(u1, u2) and not np.array_equal(u1, u3)
    assert u1.shape == (E.GROUPS, E.PAIRS, E.n_weights())
    assert all(g["horizon"] in E.HORIZONS and g["seed"] >= 1000 for g in g1)
