"""AHTO's learned scheduler (issue 38): the policy at ASHA's rungs, its Ray Tune scheduler and
Optuna pruner, the shipped weights, and ``budget.scheduler: ahto`` in a real search."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from archsearch.search.scheduler import ASHA_WEIGHTS, FEATURES, StopPolicy, load_stop_policy, rungs

ROOT = Path(__file__).resolve().parents[1]
MAX_T = 27


class _Trial:  # what a Tune scheduler reads of a trial
    def __init__(self, i):
        self.trial_id = f"t{i}"


def curves(n: int = 80, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` noisy saturating learning curves ``(n, MAX_T)`` (accuracy in 0..1) and a cost per
    curve (cheap curves learn less: a real trade-off for the cost feature)."""
    rng = np.random.default_rng(seed)
    final = rng.uniform(0.5, 0.95, n)
    rate = rng.uniform(0.05, 0.6, n)
    t = np.arange(1, MAX_T + 1)
    acc = final[:, None] * (1 - np.exp(-rate[:, None] * t)) + rng.normal(0, 0.01, (n, MAX_T))
    cost = final * 1e6 * rng.uniform(0.5, 1.5, n)
    return acc, cost


def run_tune_scheduler(sched, acc, cost=None) -> list[int]:
    """Drive a Tune scheduler sequentially (trial after trial, a result per epoch, no Tune
    controller needed); returns the epochs each trial trained."""
    from ray.tune.schedulers import TrialScheduler

    trained = []
    for i, curve in enumerate(acc):
        tr = _Trial(i)
        sched.on_trial_add(None, tr)
        for e, v in enumerate(curve, start=1):
            res = {"training_iteration": e, "accuracy": float(v)}
            if cost is not None:
                res["flops_per_sample"] = float(cost[i])
            if sched.on_trial_result(None, tr, res) == TrialScheduler.STOP:
                break
        trained.append(e)
    return trained


def test_rungs_are_rays():
    assert rungs(52, 1, 3) == (1, 3, 9, 27)
    assert rungs(27, 1, 3) == (1, 3, 9, 27)
    assert rungs(20, 2, 2) == (2, 4, 8, 16)


def test_asha_weights_make_rays_asha_decisions():
    """With ASHA's weights the learned scheduler is Ray's ASHAScheduler, trial for trial; a
    changed weight is caught by the same comparison."""
    from ray.tune.schedulers import ASHAScheduler

    from archsearch.tune.scheduler import AHTOScheduler

    acc, cost = curves()
    kw = dict(metric="accuracy", mode="max", max_t=MAX_T, grace_period=1, reduction_factor=3)
    ray_asha = run_tune_scheduler(ASHAScheduler(time_attr="training_iteration", **kw), acc)
    ours = run_tune_scheduler(AHTOScheduler(weights=ASHA_WEIGHTS, **kw), acc, cost)
    assert ours == ray_asha
    assert 1 in ours and MAX_T in ours and len(set(ours)) >= 3  # stops at several rungs
    broken = run_tune_scheduler(AHTOScheduler(weights=(1, 0, 0, 0, 0, 0, -0.5), **kw), acc, cost)
    assert broken != ray_asha


def test_min_mode_is_the_mirror_of_max():
    from archsearch.tune.scheduler import AHTOScheduler

    acc, cost = curves(seed=1)
    kw = dict(max_t=MAX_T, cost_metric="flops_per_sample", num_samples=len(acc))
    up = run_tune_scheduler(AHTOScheduler(metric="accuracy", mode="max", **kw), acc, cost)
    down = run_tune_scheduler(AHTOScheduler(metric="accuracy", mode="min", **kw), -acc, cost)
    assert up == down


def test_pruner_makes_the_schedulers_decisions():
    """Optuna's conventions (stateless ``prune`` over the study, ``report``/``should_prune``)
    give the decisions of the Tune scheduler with the same weights, costs and budget."""
    import optuna

    from archsearch.search import AHTOPruner
    from archsearch.tune.scheduler import AHTOScheduler

    acc, cost = curves(n=40, seed=2)
    w = load_stop_policy()["weights"]
    expected = run_tune_scheduler(AHTOScheduler(metric="accuracy", mode="max", max_t=MAX_T,
                                                cost_metric="flops_per_sample", num_samples=len(acc),
                                                weights=w), acc, cost)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize",
                                pruner=AHTOPruner(max_resource=MAX_T, cost_attr="flops_per_sample",
                                                  n_trials=len(acc), weights=w))
    trained = []
    for i, curve in enumerate(acc):
        t = study.ask()
        t.set_user_attr("flops_per_sample", float(cost[i]))
        for e, v in enumerate(curve, start=1):
            t.report(float(v), e)
            if t.should_prune():
                study.tell(t, state=optuna.trial.TrialState.PRUNED)
                break
        else:
            study.tell(t, float(curve[-1]))
        trained.append(e)
    assert trained == expected
    assert min(trained) < MAX_T and max(trained) == MAX_T


def _pruned_at(study, curve, check_at) -> int | None:
    """Report every epoch of ``curve`` to a new trial, call ``should_prune`` only at the epochs
    in ``check_at``; the epoch it was pruned at (``None``: it completed)."""
    import optuna

    t = study.ask()
    for e, v in enumerate(curve, start=1):
        t.report(float(v), e)
        if e in check_at and t.should_prune():
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
            return e
    study.tell(t, float(curve[-1]))
    return None


def test_pruner_judges_the_rungs_a_trial_passed_between_checks():
    """A study that calls ``should_prune`` less often than ``report`` still has every rung
    judged (as Optuna's SuccessiveHalvingPruner): a trial far below six good ones is pruned at
    its first check whether that falls on a rung (1, 3) or between rungs (2, 4); so is a trial
    whose NaN report came before the check. (The pruner that judged only the last report's rung
    let both run to the end: checked.)"""
    import optuna

    from archsearch.search import AHTOPruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    good = np.linspace(0.8, 0.9, 9)
    for check_at, expected in (((1, 2, 3, 4), 1), ((2, 4), 2)):
        study = optuna.create_study(direction="maximize",
                                    pruner=AHTOPruner(max_resource=9, weights=ASHA_WEIGHTS))
        for k in range(6):
            _pruned_at(study, good + 0.01 * k, check_at=())
        assert _pruned_at(study, np.full(9, 0.1), check_at) == expected
        nan_first = np.r_[math.nan, good[1:]]
        assert _pruned_at(study, nan_first + 0.05, check_at) == expected


def test_bad_rungs_are_value_errors():
    from archsearch.search import AHTOPruner
    from archsearch.tune.scheduler import AHTOScheduler

    for kw, match in (({"reduction_factor": 1}, "reduction_factor"), ({"reduction_factor": 0.5}, "reduction_factor"),
                      ({"grace_period": 0}, "grace_period")):
        with pytest.raises(ValueError, match=match):
            StopPolicy(ASHA_WEIGHTS, max_t=9, **kw)
        with pytest.raises(ValueError, match=match):
            AHTOScheduler(metric="accuracy", mode="max", max_t=9, weights=ASHA_WEIGHTS, **kw)
    with pytest.raises(ValueError, match="reduction_factor"):
        AHTOPruner(max_resource=9, reduction_factor=1, weights=ASHA_WEIGHTS)


def test_a_missing_or_nan_cost_leaves_the_cost_unknown():
    """A result whose cost metric is None or NaN neither crashes the scheduler (the Tune run)
    nor makes the trial the cheapest on the front: its cost stays unknown."""
    from archsearch.tune.scheduler import AHTOScheduler

    sched = AHTOScheduler(metric="accuracy", mode="max", max_t=9, cost_metric="flops_per_sample",
                          weights=ASHA_WEIGHTS)
    for i, c in enumerate((None, math.nan, 5.0)):
        tr = _Trial(i)
        sched.on_trial_add(None, tr)
        sched.on_trial_result(None, tr, {"training_iteration": 1, "accuracy": 0.5, "flops_per_sample": c})
    assert sched.policy.cost == {"t0": None, "t1": None, "t2": 5.0}


def test_pruner_refuses_multi_objective_studies():
    import optuna

    from archsearch.search import AHTOPruner

    study = optuna.create_study(directions=["maximize", "minimize"], pruner=AHTOPruner(max_resource=9))
    t = study.ask()
    with pytest.raises(ValueError, match="multi-objective"):
        study.pruner.prune(study, study._storage.get_trial(t._trial_id))


def test_scheduler_state_survives_save_and_restore(tmp_path):
    """A search resumed from a saved scheduler decides as one that never stopped."""
    from archsearch.tune.scheduler import AHTOScheduler

    acc, cost = curves(seed=3)
    kw = dict(metric="accuracy", mode="max", max_t=MAX_T, cost_metric="flops_per_sample", num_samples=len(acc))
    whole = run_tune_scheduler(AHTOScheduler(**kw), acc, cost)
    first = AHTOScheduler(**kw)
    a = run_tune_scheduler(first, acc[:30], cost[:30])
    first.save(str(tmp_path / "s.json"))
    second = AHTOScheduler(**kw)
    second.restore(str(tmp_path / "s.json"))
    # trial ids continue from 30
    from ray.tune.schedulers import TrialScheduler

    b = []
    for i in range(30, len(acc)):
        tr = _Trial(i)
        second.on_trial_add(None, tr)
        for e, v in enumerate(acc[i], start=1):
            if second.on_trial_result(None, tr, {"training_iteration": e, "accuracy": float(v),
                                                 "flops_per_sample": float(cost[i])}) == TrialScheduler.STOP:
                break
        b.append(e)
    assert a + b == whole
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="bad.json"):
        second.restore(str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="rungs"):  # another max_t: other rungs
        AHTOScheduler(**{**kw, "max_t": 9}).restore(str(tmp_path / "s.json"))


def test_restore_keeps_the_direction_tune_set(tmp_path):
    """A scheduler whose mode came from Tune (``set_search_properties``) restores as ``min``."""
    from archsearch.tune.scheduler import AHTOScheduler

    acc, cost = curves(seed=4)
    s = AHTOScheduler(max_t=MAX_T)
    assert s.set_search_properties("accuracy", "min")
    run_tune_scheduler(s, -acc[:20])
    s.save(str(tmp_path / "s.json"))
    r = AHTOScheduler(max_t=MAX_T)
    r.restore(str(tmp_path / "s.json"))
    assert (r._mode, r.policy.sign) == ("min", -1.0)
    assert run_tune_scheduler(r, -acc[20:]) == run_tune_scheduler(s, -acc[20:])


def test_a_retried_trial_keeps_its_rung_values():
    """Tune retries a failed trial with ``on_trial_error`` then ``on_trial_add``: as with Ray's
    ASHA, what it recorded keeps counting, and it is not decided again at a rung it passed."""
    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    from archsearch.tune.scheduler import AHTOScheduler

    acc, _ = curves(n=30, seed=5)
    kw = dict(metric="accuracy", mode="max", max_t=MAX_T, grace_period=1, reduction_factor=3)
    out, retried = [], set()
    for sched in (ASHAScheduler(**kw), AHTOScheduler(weights=ASHA_WEIGHTS, **kw)):
        acts = []
        for i, curve in enumerate(acc):
            tr = _Trial(i)
            sched.on_trial_add(None, tr)
            for e, v in enumerate(curve, start=1):
                if i % 4 == 0 and e == 5:  # fails after epoch 4, retried from its checkpoint
                    sched.on_trial_error(None, tr)
                    sched.on_trial_add(None, tr)
                    retried.add(i)
                a = sched.on_trial_result(None, tr, {"training_iteration": e, "accuracy": float(v)})
                acts.append(a)
                if a == TrialScheduler.STOP:
                    break
        out.append(acts)
    assert out[0] == out[1]
    assert retried and all(sched.policy.recorded[3][f"t{i}"] == acc[i][2] for i in retried)


def test_shipped_policy_is_the_validation_choice():
    """The package data holds the variant ``python -m benchmarks.schedulers.schedulers run --stage validate`` chose, with
    its manifest (features, selection rule, validation scores)."""
    pol = load_stop_policy()
    man = pol["manifest"]
    assert man["features"] == list(FEATURES)
    val = json.loads((ROOT / "benchmarks" / "schedulers" / "runs" / "scheduler_validation.json").read_text())
    assert man["variant"] == val["chosen"]
    assert man["validation_scores"] == val["scores"]
    assert all(math.isfinite(w) for w in pol["weights"]) and len(pol["weights"]) == len(FEATURES)


def test_bad_policy_files_name_the_file(tmp_path):
    bad = tmp_path / "w.json"
    bad.write_text("not json")
    with pytest.raises(ValueError, match="w.json"):
        load_stop_policy(bad)
    bad.write_text(json.dumps({"weights": [1, 2]}))
    with pytest.raises(ValueError, match="expected 7"):
        load_stop_policy(bad)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_stop_policy(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="mode"):
        StopPolicy(ASHA_WEIGHTS, max_t=9, mode="up")


def test_a_non_finite_value_stops_the_trial():
    pol = StopPolicy(ASHA_WEIGHTS, max_t=9)
    assert pol.on_result("a", 1, 0.5)
    assert not pol.on_result("b", 1, math.nan)


def test_space_picks_the_learning_curve_objective(tmp_path):
    """``budget.scheduler: ahto`` builds the AHTO scheduler on the objective that changes with
    training (accuracy, even when FLOPs come first) with FLOPs as its cost; ASHA ranks by the same
    objective, and so does ``median`` (Ray's MedianStoppingRule, per epoch, after the grace period);
    an unknown scheduler is a one-line error naming the field."""
    from conftest import tiny_space

    from archsearch.errors import UserError
    from archsearch.tune.runner import make_scheduler
    from archsearch.tune.scheduler import AHTOScheduler

    objs = [{"metric": "flops_per_sample", "mode": "min"}, {"metric": "accuracy", "mode": "max"}]
    budget = {"trials": 4, "epochs": 9, "scheduler": "ahto", "cpus_per_trial": 1}
    s = make_scheduler(tiny_space(tmp_path, objectives=objs, budget=budget))
    assert isinstance(s, AHTOScheduler)
    assert (s._metric, s._mode, s._cost_metric, s.policy.milestones) == ("accuracy", "max", "flops_per_sample",
                                                                          (1, 3, 9))
    asha = make_scheduler(tiny_space(tmp_path, objectives=objs, budget={**budget, "scheduler": "asha"}))
    assert (asha._metric, asha._mode) == ("accuracy", "max")
    median = make_scheduler(tiny_space(tmp_path, objectives=objs, budget={**budget, "scheduler": "median",
                                                                           "grace_period": 2}))
    assert type(median).__name__ == "MedianStoppingRule"
    assert (median._metric, median._mode, median._time_attr, median._grace_period) == (
        "accuracy", "max", "training_iteration", 2)
    assert make_scheduler(tiny_space(tmp_path, budget={**budget, "scheduler": "none"})) is None
    with pytest.raises(UserError, match="scheduler"):
        tiny_space(tmp_path, budget={**budget, "scheduler": "hyperband"})


def _real_search(tmp_path, scheduler: str, trials: int, max_concurrent: int) -> list[dict]:
    """The trial records of a real Ray search of ``tiny_space`` (3 epochs, random searcher)."""
    from conftest import tiny_space

    from archsearch.runs import RunDir
    from archsearch.tune.runner import run_search

    budget = {"trials": trials, "max_concurrent": max_concurrent, "epochs": 3, "batch_size": 64,
              "scheduler": scheduler, "cpus_per_trial": 1, "max_failures": 0}
    res = run_search(tiny_space(tmp_path, budget=budget), searcher="random", name=f"{scheduler}-sched",
                     storage=tmp_path / "runs", reports=tmp_path / "reports", progress=False)
    recs = RunDir(res.run_dir).read_trials()
    assert len(recs) == trials
    assert all(r["status"] in ("TERMINATED", "STOPPED") for r in recs), [r["status"] for r in recs]
    return recs


@pytest.mark.ray
@pytest.mark.slow
def test_a_real_search_with_the_ahto_scheduler(tmp_path, ray_session, cache_dir):
    """A real Ray search with ``scheduler: ahto`` finishes every trial (COMPLETE or STOPPED at a
    rung)."""
    recs = _real_search(tmp_path, "ahto", trials=4, max_concurrent=1)
    assert all(len(r["history"]) == (3 if r["status"] == "TERMINATED" else 1) for r in recs)


@pytest.mark.ray
@pytest.mark.slow
def test_a_real_search_with_the_median_stopping_rule(tmp_path, ray_session, cache_dir):
    """A real Ray search with ``scheduler: median``: every trial ends TERMINATED (all epochs) or
    STOPPED, its epochs recorded once each. (Ray's rule would pause a trial that too few others
    have overtaken while trials wait PENDING; under the searcher's concurrency limit none waits,
    so it continues: probed, 14 decisions, CONTINUE or STOP, no PAUSE.)"""
    for r in _real_search(tmp_path, "median", trials=6, max_concurrent=2):
        epochs = [h["epoch"] for h in r["history"]]
        assert epochs == list(range(1, len(epochs) + 1)), epochs
        assert len(epochs) == 3 or r["status"] == "STOPPED", (r["status"], epochs)


def test_pruner_keeps_the_replay_of_ended_trials_without_changing_a_decision():
    """The kept replay of the ended trials gives every decision a pruner that replays the
    whole study each call gives, with several trials running at once (each ends in a different
    order than it started), failed trials, and three studies run step by step in turn (three
    in-memory storages, each with study id 0, each its own curves; one minimising) sharing one
    pruner object; then a call about each ended trial. The kept replay is used, and equals a
    replay of the trials it covers. (Checked: without the storage test, or keeping a replay
    past a running trial, or using one that covers the trial asked about, this fails.)"""
    import optuna

    from archsearch.search import AHTOPruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    kw = dict(max_resource=MAX_T, cost_attr="flops_per_sample", n_trials=30)
    shared = AHTOPruner(**kw)
    checked, used = [], []  # every comparison; how many trials each kept replay covered

    def steps(study, sign, seed):
        acc, cost = curves(n=30, seed=3 + seed)
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(acc))
        running, queue = {}, list(order)  # trial -> (curve index, next epoch)
        while queue or running:
            if queue and (len(running) < 3 or rng.random() < 0.3):
                i = queue.pop(0)
                t = study.ask()
                t.set_user_attr("flops_per_sample", float(cost[i]))
                running[t] = (i, 1)
            t = list(running)[int(rng.integers(len(running)))]
            i, e = running.pop(t)
            if rng.random() < 0.03:
                study.tell(t, state=optuna.trial.TrialState.FAIL)
                continue
            t.report(sign * float(acc[i][e - 1]), e)
            frozen = study._storage.get_trial(t._trial_id)
            expected = AHTOPruner(**kw).prune(study, frozen)  # a new pruner: replays everything
            checked.append(shared.prune(study, frozen) == expected)
            kept = shared._ended
            if kept is not None and kept[0]() is study._storage:  # the kept replay: of its trials
                full = StopPolicy(shared._weights, mode="max" if sign > 0 else "min", max_t=MAX_T)
                for old in study.get_trials(deepcopy=False)[:kept[2]]:
                    if old.state != optuna.trial.TrialState.FAIL and old.intermediate_values:
                        shared._replay(full, old)
                checked.append(full.state_dict() == kept[3].state_dict())
                used.append(kept[2])
            if expected:
                study.tell(t, state=optuna.trial.TrialState.PRUNED)
            elif e == MAX_T:
                study.tell(t, sign * float(acc[i][-1]))
            else:
                running[t] = (i, e + 1)
            yield
        for old in study.get_trials(deepcopy=False):  # a call about an earlier trial, afterwards
            checked.append(shared.prune(study, old) == AHTOPruner(**kw).prune(study, old))

    runs = [steps(optuna.create_study(direction=d, pruner=shared), sign, seed)
            for seed, (d, sign) in enumerate((("maximize", 1.0), ("maximize", 1.0), ("minimize", -1.0)))]
    while runs:
        for r in list(runs):
            try:
                next(r)
            except StopIteration:
                runs.remove(r)
    assert len(checked) > 300 and all(checked), checked.index(False)
    assert len(used) > 100 and np.median(used) >= 10
