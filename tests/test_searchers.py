"""One shared suite every searcher passes (after Optuna's ``optuna/testing/pytest_samplers.py``).

The searchers optimise a deterministic two-objective function of the config (accuracy-like
quality, FLOPs from a known cost function) on a mixed space with a conditional param and a
known constraint: what a search does between trials, without training (the end-to-end
training path is covered by the ``archsearch search`` runs). Model-based searchers run with
small optimiser settings and a 3-trial Sobol design so that their GP path is exercised quickly.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from archsearch.search.ahto import MODEL_SOURCES

from archsearch.search import SEARCHERS, make
from archsearch.space import parse_space

SPACE = {
    "name": "t",
    "objectives": [{"metric": "accuracy", "mode": "max", "ref": 0.5},
                   {"metric": "flops_per_sample", "mode": "min"}],
    "constraints": {"params_trainable": {"max": 60000}},
    "budget": {"trials": 8},
    "params": {
        "n_layers": {"type": "int", "low": 1, "high": 4},
        "d_model": {"type": "categorical", "choices": [32, 64, 128]},
        "lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
        "gating": {"type": "categorical", "choices": ["static", "dht"]},
        "dht_lambda": {"type": "float", "low": 0.0, "high": 1.0, "when": {"gating": "dht"}},
    },
}
# feasible: d_model 32 (any depth) and d_model 64 with n_layers <= 2; never d_model 128


def costs(cfg):
    d, L = cfg["d_model"], cfg["n_layers"]
    return {"flops_per_sample": 48.0 * L * 12 * d * d, "params_trainable": 500.0 * d + L * 4 * d * d}


def quality(cfg):
    acc = 0.6 + 0.05 * math.log2(cfg["d_model"] / 32) + 0.02 * cfg["n_layers"]
    acc -= 0.04 * abs(math.log10(cfg["lr"]) + 3)
    if cfg["gating"] == "dht":
        acc -= 0.03 * cfg["dht_lambda"]
    return {"accuracy": acc}


FAST = {"n_init": 3, "num_restarts": 1, "raw_samples": 16, "maxiter": 10, "mc_samples": 16,
        "gp_maxiter": 30}


def build(name, seed=0, cost_fn=costs):
    space = parse_space(SPACE)
    kw = dict(FAST) if name in ("ahto", "qnehvi") else {}
    return make(name, space, seed=seed, cost_fn=cost_fn, **kw)


def drive(s, n):
    out = []
    for _ in range(n):
        tid, cfg = s.ask()
        s.tell(tid, quality(cfg))
        out.append(cfg)
    return out


def check_valid(space, cfg):
    assert set(cfg) <= set(space.params)
    for key, p in space.params.items():
        if not space.active(key, cfg):
            assert key not in cfg, f"inactive {key} suggested"
            continue
        assert key in cfg, f"active {key} missing"
        v = cfg[key]
        if p.type == "categorical":
            assert v in p.choices
        else:
            assert p.low <= v <= p.high
            if p.type == "int":
                assert isinstance(v, int)


@pytest.mark.parametrize("name", SEARCHERS)
def test_valid_in_bounds_and_constrained(name):
    s = build(name)
    cfgs = drive(s, 5)
    for cfg in cfgs:
        check_valid(s.space, cfg)
        assert costs(cfg)["params_trainable"] <= 60000, cfg  # known constraint respected
    assert s.pending == {} and len(s.finished()) == 5


@pytest.mark.parametrize("name", SEARCHERS)
def test_conditional_params_both_ways(name):
    s = build(name, cost_fn=None)  # no constraint check: more of the space
    cfgs = drive(s, 6)
    for cfg in cfgs:
        check_valid(s.space, cfg)
    assert {c["gating"] for c in cfgs} == {"static", "dht"}


@pytest.mark.parametrize("name", SEARCHERS)
def test_same_seed_same_suggestions(name):
    a, b = drive(build(name, seed=3), 4), drive(build(name, seed=3), 4)
    assert a == b
    assert drive(build(name, seed=4), 3) != a[:3]


@pytest.mark.parametrize("name", SEARCHERS)
def test_save_restore_same_next_suggestion(name, tmp_path):
    s = build(name, seed=1)
    drive(s, 3)
    pending_id, _ = s.ask()  # a running trial survives the round trip too
    s.save(tmp_path / "state.pkl")
    r = build(name, seed=1)
    r.restore(tmp_path / "state.pkl")
    assert r.ask()[1] == s.ask()[1]
    r.tell(pending_id, {"accuracy": 0.7})  # and can still be told


def _library_objects(obj, path="state"):
    """Paths in a state that hold an object of Optuna's (or anything but plain data)."""
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _library_objects(v, f"{path}.{k}")]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in _library_objects(v, f"{path}[{i}]")]
    plain = (str, bytes, int, float, bool, type(None), np.ndarray, np.generic)
    return [] if isinstance(obj, plain) else [f"{path}: {type(obj).__module__}.{type(obj).__name__}"]


@pytest.mark.parametrize("name", ["random", "tpe", "nsga2", "gp"])
def test_optuna_state_is_plain_data_and_restores_past_the_startup(name):
    """The Optuna searchers' state holds no Optuna object (a pickled sampler breaks between
    releases: Optuna 5.1's NSGA-II holds a lock), and past the random start (TPE's and the GP's
    models fitted, NSGA-II's third generation bred) a restored searcher makes the same next
    suggestions, from its state and from a pickle of the searcher itself (Tune's tuner.pkl)."""
    s = build(name, seed=5)
    drive(s, 10)  # startup 6 trials; NSGA-II's population is 4
    s.ask()  # a running trial
    state = s.state_dict()
    assert _library_objects(state) == []
    if name == "gp":  # the kernel parameters its next fit starts from
        assert state["impl"]["study"]["gp_caches"]["_gprs_cache_list"]
    restored = build(name, seed=5)
    restored.load_state_dict(pickle.loads(pickle.dumps(state)))
    unpickled = pickle.loads(pickle.dumps(s))
    assert drive(restored, 3) == drive(unpickled, 3) == drive(s, 3)


@pytest.mark.parametrize("name", SEARCHERS)
def test_errored_trials_do_not_crash(name):
    s = build(name, seed=2)
    t1, _ = s.ask()
    t2, c2 = s.ask()
    s.tell(t1, None, error=True)
    s.tell(t2, {"accuracy": float("nan")})  # a NaN objective is a failure, not a data point
    drive(s, 2)
    t3, c3 = s.ask()
    s.tell(t3, None, error=True)
    check_valid(s.space, s.ask()[1])
    assert len(s.finished()) == 2 and len(s.observations) == 5


def test_model_based_uses_gp_and_fidelity():
    s = build("ahto", seed=0)
    drive(s, 3)
    tid, cfg = s.ask()
    s.tell(tid, {"accuracy": 0.55}, fidelity=0.25)  # an ASHA-stopped trial
    tid, cfg = s.ask()
    assert s.pending[tid]["extra"]["source"] in MODEL_SOURCES  # the optimiser or AHTO's pool
    assert s.last_info["n_candidates"] >= 1 and s.pending[tid]["extra"]["decided_by"] == "meta_policy"
    with pytest.raises(ValueError):
        s.tell(tid, {"accuracy": 0.6}, fidelity=0.0)


def test_ahto_without_policy_is_qnehvi():
    """``policy="none"``: AHTO is plain qLogNEHVI (same seed, same suggestions, same state), the
    ablation benchmarks/testbeds/lcbench.py compares against. A state saved by the removed per-run
    policy (``policy`` / ``rewards`` entries) still restores."""
    space = parse_space(SPACE)
    a = make("ahto", space, seed=3, cost_fn=costs, policy="none", **FAST)
    q = build("qnehvi", seed=3)
    assert drive(a, 6) == drive(q, 6)
    assert a.state_dict()["impl"] == q.state_dict()["impl"]
    old = a.state_dict()
    old["impl"] = {**old["impl"], "policy": {"net": {}}, "rewards": [0.1]}  # saved with the old policy
    b = make("ahto", space, seed=3, cost_fn=costs, policy="none", **FAST)
    b.load_state_dict(old)
    assert b.ask()[1] == a.ask()[1]


def test_unknown_trial_and_searcher_errors():
    s = build("random")
    with pytest.raises(KeyError):
        s.tell("nope", {"accuracy": 0.6})
    tid, _ = s.ask()
    with pytest.raises(ValueError):
        s.ask(tid)
    with pytest.raises(ValueError):
        make("bogus", s.space)


def test_feasible_agrees_with_the_constraint_values_and_rejects_nan():
    s = build("random")
    assert s.feasible({"params_trainable": 60000.0}) and s.feasible({"accuracy": 0.7})  # unknown: no verdict
    assert not s.feasible({"params_trainable": 60001.0})
    for bad in (math.nan, math.inf):  # a broken cost metric must not pass as feasible
        assert not s.feasible({"params_trainable": bad})
        assert s.constraint_values({"params_trainable": bad})["params_trainable.max"] > 0


def test_ray_adapter_suggest_complete_save_restore(tmp_path):
    import optuna

    from archsearch.search.adapters.ray import RaySearcher

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}")
    alg = RaySearcher(build("tpe"), epochs=4, storage=storage, study_name="run")
    cfg = alg.suggest("a")
    assert set(cfg) == set(SPACE["params"])  # inactive conditional params are None
    alg.on_trial_complete("a", {**quality({k: v for k, v in cfg.items() if v is not None}),
                                "flops_per_sample": 1e6, "epoch": 1})
    alg.suggest("b")
    alg.on_trial_complete("b", None, error=True)
    alg.save(str(tmp_path / "s.pkl"))
    alg2 = RaySearcher(build("tpe"), epochs=4)
    alg2.restore(str(tmp_path / "s.pkl"))
    assert alg2.suggest("c") == alg.suggest("c")
    trials = optuna.load_study(study_name="run", storage=storage).trials
    # trials are recorded when suggested: "c" (suggested by alg, the one with the storage) runs
    assert [t.state.name for t in trials] == ["PRUNED", "FAIL", "RUNNING"]
    assert trials[0].user_attrs["fidelity"] == 0.25


def test_ray_adapter_runs_again_a_trial_the_restored_tune_lost(tmp_path):
    """A trial suggested after Tune's last experiment save is unknown to the restored Tune,
    which asks for a new trial in its place: the adapter answers with the lost config, the
    same Optuna trial takes the new id (``replaces``), and the run's recorder drops the old
    record when the new trial starts. Nothing is lost, nothing counted twice."""
    import pickle

    import optuna
    from ray.tune.experiment import Trial

    from archsearch.runs import RunDir, new_trial_record
    from archsearch.search.adapters.ray import RaySearcher
    from archsearch.tune.callbacks import TrialRecorder

    run = RunDir(tmp_path / "r")
    run.trials_dir.mkdir(parents=True)
    alg = RaySearcher(build("random"), epochs=1, storage=run.optuna_url, study_name=run.name)
    alg.suggest("a")
    alg.save(str(tmp_path / "s.pkl"))  # Tune's last experiment save
    lost = alg.suggest("b")  # suggested (and started) after it; then the driver dies
    run.write_trial(new_trial_record("b", {k: v for k, v in lost.items() if v is not None}))

    resumed = RaySearcher(build("random"), epochs=1, storage=run.optuna_url, study_name=run.name)
    resumed.restore(str(tmp_path / "s.pkl"))
    assert resumed.suggest("c") == lost  # the restored Tune's new trial runs the lost config
    assert set(resumed.core.pending) == {"a", "c"}
    assert resumed.core.pending["c"]["extra"]["run_again_from"] == "b"
    fresh = resumed.suggest("d")  # then the core proposes as usual
    assert fresh != lost and set(resumed.core.pending) == {"a", "c", "d"}

    recorder = pickle.loads(pickle.dumps(TrialRecorder(run, epochs=1)))  # as Tuner.restore has it
    recorder.on_trial_start(0, [], Trial("f", config=lost, trial_id="c", stub=True))
    assert [r["trial_id"] for r in run.read_trials()] == ["c"]  # b's record went with it

    resumed.on_trial_complete("c", {**quality({k: v for k, v in lost.items() if v is not None}),
                                    "flops_per_sample": 1e6, "epoch": 1})
    trials = optuna.load_study(study_name=run.name, storage=run.optuna_url).trials
    assert [(t.user_attrs["trial_id"], t.state.name) for t in trials] == [
        ("a", "RUNNING"), ("c", "COMPLETE"), ("d", "RUNNING")]
    assert trials[1].user_attrs["replaces"] == ["b"] and trials[1].user_attrs["resumed"] == 1
    assert trials[1].params == {k: v for k, v in lost.items() if v is not None}


def test_ray_adapter_runs_again_a_trial_enqueued_but_never_asked_for(tmp_path, monkeypatch):
    """``StudyRecord.open`` enqueues a trial, then asks for it: a driver that dies between
    the two leaves a WAITING study trial. The resumed search runs it again like a lost
    RUNNING one, instead of failing it and proposing a new config."""
    import optuna

    from archsearch.runs import RunDir
    from archsearch.search.adapters.ray import RaySearcher

    run = RunDir(tmp_path / "r")
    run.trials_dir.mkdir(parents=True)
    alg = RaySearcher(build("random"), epochs=1, storage=run.optuna_url, study_name=run.name)
    alg.suggest("a")
    alg.save(str(tmp_path / "s.pkl"))

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the driver dies right after the enqueue

    monkeypatch.setattr(alg.record.study, "ask", killed)
    with pytest.raises(KeyboardInterrupt):
        alg.suggest("b")
    study = optuna.load_study(study_name=run.name, storage=run.optuna_url)
    assert [t.state.name for t in study.trials] == ["RUNNING", "WAITING"]
    lost = study.trials[1].system_attrs["fixed_params"]

    resumed = RaySearcher(build("random"), epochs=1, storage=run.optuna_url, study_name=run.name)
    resumed.restore(str(tmp_path / "s.pkl"))
    config = resumed.suggest("c")
    assert {k: v for k, v in config.items() if v is not None} == lost
    resumed.on_trial_complete("c", {**quality(lost), "flops_per_sample": 1e6, "epoch": 1})
    trials = optuna.load_study(study_name=run.name, storage=run.optuna_url).trials
    assert [(t.user_attrs["trial_id"], t.state.name) for t in trials] == [
        ("a", "RUNNING"), ("c", "COMPLETE")]  # no FAIL, no extra trial
    assert trials[1].user_attrs["replaces"] == ["b"] and trials[1].params == lost


@pytest.mark.slow
@pytest.mark.ray
def test_single_objective_search_through_the_cli_with_ahto(tmp_path):
    """One objective (accuracy): ``archsearch search --searcher ahto`` runs qLogNEI after the
    Sobol design instead of crashing at the first model-based ask."""
    import optuna

    from conftest import TINY_SPACE, run_cli, tiny_space_file

    space = tiny_space_file(tmp_path, objectives=[{"metric": "accuracy", "mode": "max"}],
                            budget={**TINY_SPACE["budget"], "trials": 4, "max_concurrent": 1,
                                    "epochs": 1})
    proc = run_cli("search", space, "--searcher", "ahto", "--name", "single",
                   "--storage", tmp_path / "runs", "--reports", tmp_path / "reports",
                   "--no-progress", "--no-ray-dashboard", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'runs' / 'single' / 'optuna.db'}")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 4 and all(0.0 <= t.value <= 1.0 for t in done)
    sources = [t.user_attrs["proposed_by"] for t in sorted(done, key=lambda t: t.number)]
    # the Sobol design is min(2 (4 params + 1), max(2, 4 // 3)) = 2 trials, then the model decides
    # (the acquisition ranks the optimizer's candidates and uniform points; never the Sobol fallback)
    assert sources[:2] == ["sobol", "sobol"] and set(sources[2:]) <= MODEL_SOURCES, sources


@pytest.mark.parametrize("name", ["ahto", "qnehvi"])
def test_restricted_to_a_table_each_row_once(name):
    """restrict_configurations (replay on a recorded table): every ask is an unvisited row."""
    s = build(name, seed=0)
    r = build("random", seed=1)
    rows = [c for c in (r.ask()[1] for _ in range(40)) if costs(c)["params_trainable"] <= 60000]
    rows = [dict(t) for t in dict.fromkeys(tuple(sorted(c.items())) for c in rows)][:9]
    assert len(rows) == 9
    s.restrict_configurations(rows)
    asked = []
    for _ in range(len(rows)):
        tid, cfg = s.ask()
        assert cfg in rows and cfg not in asked
        asked.append(cfg)
        s.tell(tid, quality(cfg))
    assert {o.extra["source"] for o in s.observations} <= {"sobol", "table"}
    assert s.observations[-1].extra["source"] == "table"
    with pytest.raises(RuntimeError, match="every configuration"):
        s.ask()
    with pytest.raises(NotImplementedError):
        build("tpe").restrict_configurations(rows)


def test_trust_region_until_an_observation_is_inside_the_reference_box():
    """With a reference value no trial reaches yet, candidates come from a box of side 0.2
    around the nearest observation, not from across the cube."""
    spec = {**SPACE, "objectives": [{"metric": "accuracy", "mode": "max", "ref": 0.95},
                                    {"metric": "flops_per_sample", "mode": "min", "ref": 1e9}]}
    s = make("qnehvi", parse_space(spec), seed=0, cost_fn=costs, **FAST)
    drive(s, 3)
    tr = s.trust_region(s.finished())
    assert tr is not None and bool(((tr[1] - tr[0]) <= 0.2 + 1e-9).all())
    tid, cfg = s.ask()
    assert s.pending[tid]["extra"]["source"] in ("optimizer", "trust_region")
    s.tell(tid, {"accuracy": 0.97})  # now inside the box
    assert s.trust_region(s.finished()) is None


def test_gp_subset_bounds_the_fit_and_keeps_the_front():
    from botorch.utils.multi_objective.pareto import is_non_dominated
    import torch

    s = make("qnehvi", parse_space(SPACE), seed=0, cost_fn=costs, max_gp_points=20, **FAST)
    r = build("random", seed=3)
    for _ in range(50):
        tid, cfg = r.ask()
        s.tell(tid, {**quality(cfg), **costs(cfg)}, config=cfg)
    obs = s.finished()
    sub = s.gp_subset(obs)
    assert len(sub) == 20 and len({o.trial_id for o in sub}) == 20
    Y = torch.tensor([s.objective_values(o.metrics) for o in obs], dtype=torch.double)
    front = {obs[i].trial_id for i in range(len(obs)) if is_non_dominated(Y)[i]}
    assert front <= {o.trial_id for o in sub}
    assert obs[-1] in sub  # the most recent is kept
