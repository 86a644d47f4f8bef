"""benchmarks/searchers/searchers.py (issue 15's benchmark) checks itself: the replay restriction, the
repeat / off-table counts (which must catch a deliberately broken searcher), the Optuna
baselines replayed through the CLI's factory (NSGA-II really breeds a second generation, TPE
sees feasible trials as feasible), trials-to-95% and the summary keys."""

from __future__ import annotations

import json
import statistics

import pytest

from conftest import load_benchmark

FAST = {"n_init": 3, "num_restarts": 1, "raw_samples": 16, "maxiter": 10, "mc_samples": 16, "gp_maxiter": 30}


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("searchers.searchers")


@pytest.fixture(scope="module")
def replay(bench):
    return bench.Replay()


def _space(dim=3, constraint=True):
    from archsearch.space import Bound, Budget, FloatParam, Objective, SearchSpace

    params = {f"x{i}": FloatParam(type="float", low=0.0, high=1.0) for i in range(dim)}
    objs = [Objective.model_construct(metric=f"f{j}", mode="min", ref=1.1) for j in range(2)]
    return SearchSpace.model_construct(name="t", task="classification", params=params, objectives=objs,
                                       constraints={"slack": Bound(min=0.0)} if constraint else {},
                                       budget=Budget(trials=80), fixed={}, seed=0, source=None)


# ---------------------------------------------------------------------- restriction
@pytest.mark.parametrize("name", ["ahto", "qnehvi"])
def test_restricted_searchers_never_repeat_nor_leave_the_table(bench, replay, name):
    from archsearch.search import make

    core = make(name, replay.space, seed=0, cost_fn=replay.cost_fn, **FAST)
    r = bench.run_one(replay, name, 0, budget=10, core=core)
    assert r["restricted"] and r["offtable"] == 0 and r["repeats"] == 0
    assert len(set(r["rows"])) == 10 and r["n_table"] == 160
    assert "table" in r["sources"]  # the model phase ranked the table's rows
    assert all(o.config in replay.table for o in core.observations)


def test_a_table_can_be_exhausted_once_each(bench):
    from archsearch.search import make

    small = bench.Replay(max_records=8)
    core = make("qnehvi", small.space, seed=1, cost_fn=small.cost_fn, **FAST)
    r = bench.run_one(small, "qnehvi", 1, budget=8, core=core)
    assert sorted(r["rows"]) == list(range(8)) and r["repeats"] == 0 and r["offtable"] == 0
    assert r["curve"][-1] == pytest.approx(1.0)  # every row seen: the whole table's HV


class _Stuck:
    """Deliberately broken: always suggests the same config (and can pretend to be restricted
    while ignoring the table)."""

    def __init__(self, space, config, claims_restriction=False):
        from archsearch.search.base import Searcher

        class Stuck(Searcher):
            name = "stuck"
            supports_restriction = claims_restriction

            def restrict_configurations(self, configs):
                self.ignored = configs  # says yes, does nothing

            def _suggest(self, trial_id):
                return dict(config), {"source": "stuck"}

        self.core = Stuck(space)


def test_broken_searchers_are_caught_by_the_counts(bench, replay):
    row = replay.table[5]
    # always the same table row: every ask after the first repeats a row
    r = bench.run_one(replay, "stuck", 0, budget=10, core=_Stuck(replay.space, row).core)
    assert r["repeats"] == 9 and r["offtable"] == 0 and set(r["rows"]) == {5}
    # claims restriction but proposes an off-table config: every ask is answered by a neighbour
    off = {**row, "lr": row["lr"] * 1.01}
    r = bench.run_one(replay, "liar", 0, budget=10, core=_Stuck(replay.space, off, claims_restriction=True).core)
    assert r["restricted"] and r["offtable"] == 10 and r["repeats"] == 9
    assert r["curve"][-1] == r["curve"][0]  # nine wasted trials


def test_nearest_row_mapping_counts_offtable(bench, replay):
    from archsearch.search import make

    # every row is exactly on the table (distance 0.0, not cdist's ~3e-8 for equal rows)
    assert all(replay.nearest(c) == (i, 0.0) for i, c in enumerate(replay.table))
    for i in (0, 3, 17, 159):  # a row, slightly moved, maps back to itself
        cfg = dict(replay.table[i], dropout=min(replay.table[i]["dropout"] + 1e-4, 0.3))
        j, dist = replay.nearest(cfg)
        assert j == i and 0 < dist < 1e-3
    core = make("random", replay.space, seed=0, cost_fn=replay.cost_fn)
    r = bench.run_one(replay, "random", 0, budget=15, core=core)
    assert not r["restricted"]
    assert r["offtable"] == 15  # continuous lr/dropout never land exactly on a row
    assert r["repeats"] == 15 - len(set(r["rows"]))
    done = [t for t in core.study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 15 and all(t.params in replay.table for t in done)  # told what ran


# ---------------------------------------------------------------------- baselines in replay
def test_nsga2_breeds_a_second_generation_when_told_other_configs():
    """Replay tells NSGA-II another config than it asked: those trials must count in its
    generation, else it never leaves generation 0 and is random search under another name."""
    from archsearch.search import make

    space = _space()
    cores = {k: make(k, space, seed=0) for k in ("nsga2", "random")}
    asked = {k: [] for k in cores}
    for k, s in cores.items():
        for _ in range(40):
            tid, cfg = s.ask()
            asked[k].append(cfg)
            ran = {p: v / 10 for p, v in cfg.items()}  # "the nearest row": always in [0, 0.1]^3
            s.tell(tid, {"f0": ran["x0"], "f1": 1 - ran["x0"] + ran["x1"], "slack": 0.1}, config=ran)
    s = cores["nsga2"]
    assert s.study.sampler._population_size == 20  # min(20, 80 // 3), as in a real run
    key = "NSGAIISampler:generation"
    gens = [t.system_attrs.get(key) for t in s.study.trials if t.state.name == "COMPLETE"]
    assert gens == [0] * 20 + [1] * 20
    assert len(s.study.sampler.get_parent_population(s.study, 1)) == 20
    # generation 0 is random (same seed, same draws); generation 1 is bred from parents in
    # [0, 0.1]^3 by crossover / mutation, so most of its values lie there, unlike random's
    assert asked["nsga2"][:20] == asked["random"][:20]

    def share_low(cfgs):
        return statistics.mean(v <= 0.1 for c in cfgs for v in c.values())

    assert share_low(asked["nsga2"][20:]) > 0.5 > 0.25 > share_low(asked["random"][20:])


def test_tpe_sees_feasible_trials_as_feasible(bench, replay):
    from optuna.samplers._tpe.sampler import _get_infeasible_trial_score

    from archsearch.search import make

    core = make("tpe", replay.space, seed=0, cost_fn=replay.cost_fn)
    bench.run_one(replay, "tpe", 0, budget=8, core=core)
    done = [t for t in core.study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 8
    for t in done:  # every table row is feasible (params_trainable <= 2e6)
        assert set(t.constraints) == {"params_trainable.max"} and t.constraints["params_trainable.max"] <= 0
        assert _get_infeasible_trial_score(t) == 0
    # C2DTLZ2: the learned constraint, feasible exactly when slack >= 0
    c2 = bench.Synthetic("c2dtlz2", bench.HORIZON)
    core = make("tpe", c2.space, seed=0)
    bench.run_one(c2, "tpe", 0, budget=30, core=core)
    done = [t for t in core.study.trials if t.state.name == "COMPLETE"]
    feas = []
    for t in done:
        _, m, _ = c2.evaluate(t.params)
        assert t.constraints == {"slack.min": pytest.approx(-m["slack"])}
        assert (_get_infeasible_trial_score(t) == 0) == c2.feasible(m)
        feas.append(c2.feasible(m))
    assert any(feas) and not all(feas)  # both kinds occurred, so the check could fail


def test_c2dtlz2_problem(bench):
    c2 = bench.Synthetic("c2dtlz2", bench.HORIZON)
    assert c2.space.constraints["slack"].min == 0.0
    assert c2.max_hv >= float(c2.f.max_hv) and c2.max_hv == pytest.approx(0.39994, abs=1e-4)
    _, m, _ = c2.evaluate({f"x{i}": 0.5 for i in range(6)})  # on the front at t = 0.5: feasible
    assert c2.feasible(m) and m["slack"] >= 0
    # the grid reproduces DTLZ2's analytic max HV (a lower bound, within 0.1%)
    assert bench.dtlz2_grid_hv(False) == pytest.approx(float(bench.Synthetic("dtlz2", bench.HORIZON).max_hv), rel=1e-3)


# ---------------------------------------------------------------------- statistics
def test_trials_to_95_counts_never_reached_as_budget_plus_one(bench):
    assert bench.trials_to([0.2, 0.96, 1.0]) == 2
    assert bench.trials_to([0.9] * 80) == 81
    assert bench.trials_to([0.9] * 30 + [0.99] * 50, budget=20) == 21
    assert bench.trials_to([0.95], budget=80) == 1


def _fake_run(problem, searcher, seed, level, offtable=0, repeats=0):
    curve = [level * min(1.0, (i + 1) / 40) for i in range(80)]
    policy = searcher == "ahto_policy"  # recorded as "ahto" with the policy deciding, as at 5de6cd6
    return {"problem": problem, "searcher": "ahto" if policy else searcher, "seed": seed, "budget": 80,
            "curve": curve, "hv": [2.0 * v for v in curve], "max_hv": 2.0, "max_hv_method": "fake",
            "restricted": False, "asks": 80, "offtable": offtable, "repeats": repeats,
            "rows": [0] * 80 if problem == "replay" else None, "sources": ["sobol"] * 80,
            "decided_by": [None] * 14 + ["policy"] * 66 if policy else [None] * 80,
            "ask_seconds": [0.01] * 80, "ask_cpu_seconds": [0.01] * 80, "torch_threads": 1, "seconds": 1.0,
            "commit": "abc"}


LEVEL = {"ahto_policy": 0.9, "qnehvi": 1.0, "random": 0.5, "tpe": 0.6, "nsga2": 0.55}


def _fake_file(bench, tmp_path, extra=()):
    runs = [_fake_run(p, s, seed, LEVEL[s] * (1 - 0.01 * seed), offtable=80 * (s in bench.BASELINES),
                      repeats=8 * (s == "random"))
            for p in ("replay", "dtlz2", "c2dtlz2") for s in LEVEL for seed in (0, 1, 2)]
    runs.append(_fake_run("replay", "ahto_policy", 3, 1.0))  # a seed only one searcher ran: not compared
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*runs, *extra]))
    times = tmp_path / "times.json"
    times.write_text(json.dumps({"100obs_1pending": {"wall_median": 0.5}, "500obs_64pending": {"wall_median": 3.0}}))
    return bench.summarize(path, tmp_path / "s.json", tmp_path / "s.png", times, quiet=True,
                           lc_runs=tmp_path / "no_lcbench_runs.jsonl", cond_runs=tmp_path / "no_cond.jsonl")


def test_summary_keys_on_a_fake_runs_file(bench, tmp_path):
    out = _fake_file(bench, tmp_path)
    assert json.loads((tmp_path / "s.json").read_text())["summary"] == out["summary"]
    assert (tmp_path / "s.png").stat().st_size > 0
    s = out["summary"]
    assert list(s)[:10] == ["ahto_hv_ratio_replay_20", "ahto_hv_ratio_replay_40", "ahto_hv_ratio_dtlz2_20",
                            "ahto_hv_ratio_c2dtlz2_40", "ahto_trials_to_95_over_tpe", "policy_gain_replay_20",
                            "suggest_s_500obs_64pending", "suggest_s_100obs", "replay_offtable_rate",
                            "replay_repeat_rate"]
    # policy-era "ahto" rows are relabelled; without policy-free "ahto" rows the ahto_* keys read
    # the qnehvi rows (the same searcher since the policy went)
    assert s["ahto_rows"] == "qnehvi"
    # medians over seeds 0-2 (seed 3 is ahto_policy's alone); the best baseline is tpe (level 0.6)
    assert s["ahto_hv_ratio_replay_20"] == pytest.approx(1.0 / 0.6)
    assert s["ahto_hv_ratio_c2dtlz2_40"] == pytest.approx(1.0 / 0.6)
    assert s["policy_gain_replay_20"] == pytest.approx(0.9)  # the ablation: policy / qnehvi
    assert s["policy_gain_at_20_40_80"]["replay"] == "0.900 / 0.900 / 0.900"
    assert s["best_median_at_80"] == {"replay": "qnehvi", "dtlz2": "qnehvi", "c2dtlz2": "qnehvi"}
    # the qnehvi median seed (level 0.99) reaches 0.95 at trial 39; TPE never does: 81
    t95 = out["details"]["trials_to_95"]["replay"]
    assert t95["qnehvi"]["median"] == 39 and t95["qnehvi"]["reached"] == 1.0
    assert t95["tpe"]["median"] == 81 and t95["tpe"]["reached"] == 0.0
    assert t95["tpe"]["per_seed"] == {0: 81, 1: 81, 2: 81}
    assert s["ahto_trials_to_95_over_tpe"] == pytest.approx(39 / 81)
    assert s["replay_offtable_rate"] == {"ahto_policy": 0, "qnehvi": 0, "random": 1, "tpe": 1, "nsga2": 1}
    assert s["replay_repeat_rate"]["random"] == pytest.approx(0.1) and s["replay_repeat_rate"]["tpe"] == 0
    assert s["suggest_s_100obs"] == 0.5 and s["suggest_s_500obs_64pending"] == 3.0
    assert set(out["targets"]) == set(bench.TARGETS) and set(bench.TARGETS) <= set(s)
    assert out["targets"]["suggest_s_100obs"]["met"] and not out["targets"]["suggest_s_500obs_64pending"]["met"]
    assert out["targets"]["ahto_hv_ratio_replay_20"]["met"] and not out["targets"]["policy_gain_replay_20"]["met"]
    assert out["details"]["seeds"]["replay"] == {k: 3 for k in LEVEL}
    assert out["provenance"]["git_commit"] == ["abc"]
    # branin_currin not run yet: absent, and the keys that need it would be None (not an error)
    assert "branin_currin" not in out["details"]["hv_table"]


def test_policy_free_ahto_rows_take_precedence(bench, tmp_path):
    extra = [_fake_run(p, "ahto", seed, 0.3) for p in ("replay", "dtlz2", "c2dtlz2") for seed in (0, 1, 2)]
    s = _fake_file(bench, tmp_path, extra)["summary"]
    assert s["ahto_rows"] == "ahto" and s["ahto_hv_ratio_replay_20"] == pytest.approx(0.3 / (0.6 * 0.99))
    assert s["policy_gain_replay_20"] == pytest.approx(0.9)


def test_stored_result_regenerates(bench):
    """searchers.json regenerates from the committed run logs (``check``)."""
    assert bench.main(["check"]) == 0
