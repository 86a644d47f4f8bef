"""Schedulers on LCBench: how much training time each needs to reach the same front (issue 38).

A search is simulated exactly on the YAHPO LCBench surrogate (``benchmarks/testbeds/lcbench.py``):
trials run one after another (one worker), each a configuration drawn uniformly from the unit
cube of LCBench's 7 hyperparameters (the **same sequence for every scheduler**: seeded by task and
seed), trained epoch by epoch up to 52; a scheduler may stop it at a report. A trial stopped
after ``e`` epochs costs LCBench's ``time`` at epoch ``e`` (seconds of training) and adds the point
(``val_accuracy`` at ``e``, ``time`` at 52) to the front: two objectives, maximise accuracy and
minimise the configuration's full-budget training time (known from the configuration, as FLOPs
are in archsearch; a stopped trial is a valid point with fewer epochs, as in the product's
reports). The search ends when the summed training time reaches the task's budget (its
horizon in full trials x the mean full-training time of the task's 4,096-point Sobol sample):
protocol v1 (``protocols/schedulers.json``) and v3 50 full trials; v2
(``protocols/schedulers_v2.json``) the horizon chosen on the training tasks by ``horizon`` (v1's
test read left 4 of 10 test tasks out of every scheduler's reach in 50 full trials; 200 did not
cure it).

Schedulers, each from its library: ``none``; ``asha`` (Ray Tune's ``ASHAScheduler``, max_t 52,
grace 1, reduction factor 3: rungs 1, 3, 9, 27); ``hyperband`` (Optuna's ``HyperbandPruner``,
min_resource 1, max_resource 52, reduction factor 3); ``median`` (Optuna's ``MedianPruner``, 5
startup trials, a report every epoch); ``ahto`` (:class:`archsearch.search.scheduler.StopPolicy`
with the shipped weights, in v2 and v3 the variant their validation chose; decisions at ASHA's
rungs). ASHA, Hyperband and AHTO report at epochs
1, 3, 9, 27, 52 (their decisions only change there); the median rule at every epoch.

Scores per (task, seed): the hypervolume curve over cumulative training time; ``time_to_95``
= the training time at which the HV first reaches 95% of the task's best-known HV (the best
final HV of any run of this benchmark on the task in v1 and v2; in v3, the default,
``protocols/schedulers_v3.json``, the best final HV of the compared runs on the same task and
seed, i.e. on the same configurations; ``inf`` if never); ``hv_at_half`` = HV at half
the budget. Per task: the median over seeds; across the 10 test tasks: the median of per-task
ratios and a paired Wilcoxon signed-rank test (task = unit).

Test set ``lcbench:scheduler_tasks`` (the split's 10 test tasks) in the ledger: v1's read came
first; v2 and v3 were written after it (v3 re-scores v1's test rows), so their results are
exploratory.

Commands (from the repository root; files under ``benchmarks/schedulers/``)::

    python -m benchmarks.schedulers.schedulers run --stage train        # PGPE on the 20 training tasks (v1, shipped)
    python -m benchmarks.schedulers.schedulers run --stage horizon      # v2: the horizon, on the training tasks
    python -m benchmarks.schedulers.schedulers run --stage validate [--protocol v1|v2|v3]   # variants, 4 validation tasks
    python -m benchmarks.schedulers.schedulers run --stage test --seeds 0-19 [--protocol ...]  # test searches
    python -m benchmarks.schedulers.schedulers analyze                  # all three results from the runs:
        # --protocol v1 -> results/schedulers_v1.json, v2 -> results/schedulers_v2.json,
        # v3 -> results/schedulers_v3.json (without --protocol: all three)
    python -m benchmarks.schedulers.schedulers check                    # regenerate in memory, compare
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.evidence.cli import Command
from benchmarks.evidence.ledger import Read
from benchmarks.evidence.protocol import relpath
from benchmarks.evidence.provenance import ROOT, git_commit, provenance
from benchmarks.evidence.results import build_result
from benchmarks.evidence.runlog import RunLog, read_jsonl
from benchmarks.evidence.seeds import parse_seeds
from benchmarks.evidence.stats import grouped_bootstrap, wilcoxon
from benchmarks.evidence.tables import markdown
from benchmarks.testbeds import lcbench as L

HERE = Path(__file__).resolve().parent
TRAINED = HERE / "runs" / "scheduler_policies"  # trained variants (weights + history)
HORIZON_RUNS = HERE / "runs" / "scheduler_horizon_runs.jsonl"
HORIZON_OUT = HERE / "runs" / "scheduler_horizon.json"
#: the test set every protocol version scores (the split's test tasks)
TEST_SET = "lcbench:scheduler_tasks"
# protocol versions, files of each: v2 = v1 with the horizon chosen on training tasks; v3 = v1's
# searches scored against a per-(task, seed) best-known HV, with its validation's ahto variant
# (its own rows: the test's ahto; the rest are v1's rows)
VERSIONS = {
    "v1": {"protocol": "protocols/schedulers.json", "runs": "runs/scheduler_runs.jsonl",
           "validation": "runs/scheduler_validation.json", "out": "results/schedulers_v1.json"},
    "v2": {"protocol": "protocols/schedulers_v2.json", "runs": "runs/scheduler_runs_v2.jsonl",
           "validation": "runs/scheduler_validation_v2.json", "out": "results/schedulers_v2.json"},
    "v3": {"protocol": "protocols/schedulers_v3.json", "runs": "runs/scheduler_runs_v3.jsonl",
           "validation": "runs/scheduler_validation_v3.json", "out": "results/schedulers_v3.json"},
}
PROTOCOL = HERE / VERSIONS["v1"]["protocol"]
RUNS = HERE / VERSIONS["v1"]["runs"]
VALIDATION_OUT = HERE / VERSIONS["v1"]["validation"]
SCHEDULERS = ("none", "asha", "hyperband", "median", "ahto")
BUDGET_FULL_TRIALS = 50
MAX_TRIALS = 3000
REPORTS = (1, 3, 9, 27, L.EPOCHS)
TARGET = 0.95
REGRET_FLOOR = 1e-4
GRID = 100


# ---------------------------------------------------------------------- the simulated search
@functools.lru_cache(maxsize=None)
def _mean_full_time(task: str) -> float:
    from scipy.stats import qmc

    s = L.surrogate()
    U = qmc.Sobol(d=len(L.PARAMS), scramble=True, seed=1).random_base2(12)
    return float(s.predict(task, s.decode(U))["time"].mean())


def task_budget(task: str, full_trials: float | None = None) -> float:
    """Training-time budget of a search on ``task`` (seconds): ``full_trials`` (default: the
    protocol's horizon, ``BUDGET_FULL_TRIALS``) x the mean epoch-52 ``time`` of a 4,096-point
    Sobol sample (seed 1)."""
    return (BUDGET_FULL_TRIALS if full_trials is None else full_trials) * _mean_full_time(task)


def max_trials(full_trials: float) -> int:
    """The trial cap of a search to ``full_trials``: ``MAX_TRIALS`` per 50 full trials."""
    return int(round(MAX_TRIALS * full_trials / 50))


class Curves:
    """The learning curves of seed ``seed``'s trials on ``task`` (configurations uniform in the
    unit cube, ``default_rng([seed, task])``: the same sequence for every scheduler and horizon),
    predicted in chunks of ``chunk`` trials as a search reaches them. ``row(i)`` -> ``(acc,
    time)``, each ``(E,)`` at ``epochs`` (default: all 52)."""

    def __init__(self, task: str, seed: int, n: int = MAX_TRIALS, epochs=None, chunk: int = 512):
        self.task, self.chunk = task, chunk
        self.epochs = np.arange(1, L.EPOCHS + 1) if epochs is None else np.asarray(epochs)
        self.U = np.random.default_rng([int(seed), int(task)]).random((n, len(L.PARAMS)))
        self.acc = np.empty((0, len(self.epochs)))
        self.time = np.empty((0, len(self.epochs)))

    def __len__(self) -> int:
        return len(self.U)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        while i >= len(self.acc):
            s, k, E = L.surrogate(), len(self.acc), len(self.epochs)
            U = self.U[k:k + self.chunk]
            y = s.predict(self.task, s.decode(U) * E, np.repeat(self.epochs, len(U)))
            self.acc = np.vstack([self.acc, y["val_accuracy"].reshape(E, len(U)).T])
            self.time = np.vstack([self.time, y["time"].reshape(E, len(U)).T])
        return self.acc[i], self.time[i]


class Front:
    """The running 2-objective front (max accuracy, min cost) and its HV above ``ref``
    (maximisation form ``(acc_ref, -cost_ref)``)."""

    def __init__(self, ref):
        self.ref, self.pts, self.hv = ref, np.empty((0, 2)), 0.0

    def add(self, acc: float, cost: float) -> bool:
        p = np.array([acc, -cost])
        if len(self.pts) and np.any(np.all(self.pts >= p, axis=1)):
            return False
        keep = ~np.all(p >= self.pts, axis=1) if len(self.pts) else np.zeros(0, bool)
        self.pts = np.vstack([self.pts[keep], p])
        self.hv = L.hv2(self.pts, self.ref)
        return True


class _Trial:  # what Ray's ASHAScheduler reads of a trial
    def __init__(self, i):
        self.trial_id = str(i)


def _decider(name: str, weights=None, seed: int = 0):
    """``(start(i, cost), report(i, epoch, acc, budget_used) -> continue?, end(i, epoch, acc))``
    and the report epochs of scheduler ``name``."""
    if name == "none":
        return (lambda i, c: None), (lambda i, e, v, b: True), (lambda i, e, v: None), (L.EPOCHS,)
    if name in ("ahto", "policy"):
        from archsearch.search.scheduler import StopPolicy

        pol = StopPolicy(weights, max_t=L.EPOCHS, grace_period=1, reduction_factor=3, mode="max")
        return pol.add, (lambda i, e, v, b: pol.on_result(i, e, v, b)), (lambda i, e, v: None), REPORTS
    if name == "asha":
        from ray.tune.schedulers import ASHAScheduler, TrialScheduler

        sched = ASHAScheduler(metric="acc", mode="max", time_attr="training_iteration", max_t=L.EPOCHS,
                              grace_period=1, reduction_factor=3)
        trials = {}

        def start(i, c):
            trials[i] = _Trial(i)
            sched.on_trial_add(None, trials[i])

        def report(i, e, v, b):
            return sched.on_trial_result(None, trials[i], {"training_iteration": e, "acc": v}) \
                != TrialScheduler.STOP

        return start, report, (lambda i, e, v: None), REPORTS
    if name in ("hyperband", "median"):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        pruner = (optuna.pruners.HyperbandPruner(min_resource=1, max_resource=L.EPOCHS, reduction_factor=3)
                  if name == "hyperband" else optuna.pruners.MedianPruner(n_startup_trials=5))
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=seed),
                                    pruner=pruner, study_name=f"sim-{seed}")
        live = {}

        def start(i, c):
            live[i] = study.ask()

        def report(i, e, v, b):
            live[i].report(v, e)
            return not live[i].should_prune()

        def end(i, e, v):
            t = live.pop(i)
            if e < L.EPOCHS:
                study.tell(t, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(t, v)

        return start, report, end, (REPORTS if name == "hyperband" else tuple(range(1, L.EPOCHS + 1)))
    raise ValueError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")


def simulate(task: str, seed: int, scheduler: str, weights=None, data: Curves | None = None,
             full_trials: float | None = None, marks=()) -> dict:
    """One search to ``full_trials`` full-trial equivalents (default: the protocol's horizon).
    Returns ``{"t": [...], "hv": [...]}`` (cumulative training seconds at each front change and
    the HV after it), ``trials``, ``stopped``, ``spent`` (seconds), ``budget``, and for each
    shorter horizon in ``marks`` (full trials) the HV where a search to it would have ended
    (``hv_at_marks``: exact for schedulers whose decisions do not read the budget)."""
    full_trials = BUDGET_FULL_TRIALS if full_trials is None else full_trials
    budget = task_budget(task, full_trials)
    ref = L.task_reference(task)["ref"]
    epochs = REPORTS if scheduler != "median" else None
    d = data or Curves(task, seed, max_trials(full_trials), epochs=epochs)
    col = {int(e): j for j, e in enumerate(d.epochs)}
    start, report, end, reports = _decider(scheduler, weights, seed)
    front, spent, ts, hvs, stopped, i = Front(ref), 0.0, [], [], 0, 0
    todo = {float(m): (task_budget(task, m), max_trials(m)) for m in marks}
    at_marks = {}
    n = min(len(d), max_trials(full_trials))
    while spent < budget and i < n:
        acc, tim = d.row(i)
        full = float(tim[col[L.EPOCHS]])
        start(i, full)
        for e in reports:
            v = float(acc[col[e]])
            if not report(i, e, v, spent / budget) and e < L.EPOCHS:
                break
        end(i, e, v)
        stopped += e < L.EPOCHS
        spent += float(tim[col[e]])
        if front.add(v, full):
            ts.append(round(spent, 3))
            hvs.append(front.hv)
        i += 1
        for m, (b, cap) in list(todo.items()):
            if spent >= b or i >= cap:
                at_marks[m] = front.hv
                del todo[m]
    at_marks.update({m: front.hv for m in todo})
    out = {"t": ts, "hv": hvs, "trials": i, "stopped": stopped, "spent": spent, "budget": budget}
    if marks:
        out["hv_at_marks"] = {str(m): h for m, h in sorted(at_marks.items())}
    return out


def hv_at(run: dict, t: float) -> float:
    """HV of ``run`` once ``t`` seconds of training were spent (0 before its first trial ended)."""
    k = np.searchsorted(np.asarray(run["t"]), t, side="right")
    return float(run["hv"][k - 1]) if k else 0.0


def time_to(run: dict, hv_target: float) -> float:
    """First cumulative training time at which ``run``'s HV reaches ``hv_target`` (``inf``: never;
    the search's last trial may end past the budget, so a time up to one trial past it counts)."""
    for t, h in zip(run["t"], run["hv"]):
        if h >= hv_target:
            return float(t)
    return math.inf


def auc_log_regret(run: dict, best: float) -> float:
    """Mean over ``GRID`` evenly spaced times in (0, budget] of log10 HV regret (floor 1e-4):
    the training objective (lower is better; each regret reduction counts for the time it saves)."""
    grid = np.linspace(run["budget"] / GRID, run["budget"], GRID)
    hv = np.array([hv_at(run, t) for t in grid])
    return float(np.mean(np.log10(np.maximum((best - hv) / best, REGRET_FLOOR))))


# ---------------------------------------------------------------------- training (PGPE)
def _episodes(job: tuple) -> list[float]:
    """Worker: AUC log-regret of each weight vector on one (task, seed) (curves computed once)."""
    task, seed, weight_list = job
    d = Curves(task, seed, epochs=REPORTS)
    best = L.task_reference(task)["best"]
    return [auc_log_regret(simulate(task, seed, "policy", w, data=d), best) for w in weight_list]


def _pool(workers: int):
    import multiprocessing as mp

    return mp.get_context("spawn").Pool(workers)


def train(*, iterations: int, pairs: int, tasks_per_iter: int, sigma: float, lr: float, l2: float,
          seed: int, workers: int, log=print, tasks: list[str] | None = None, episodes=None) -> dict:
    """Parameter-exploring policy gradient (PGPE, Sehnke et al. 2010, symmetric sampling) on the
    committed training tasks: each iteration draws ``tasks_per_iter`` training tasks (each with a
    fresh search seed, common to every perturbation: common random numbers) and ``pairs``
    perturbations ``eps ~ N(0, sigma^2)`` (the bias's with ``0.2 sigma``); the gradient estimate of
    the mean fitness (-AUC log regret) is ``mean_p (f(mu+eps_p) - f(mu-eps_p)) eps_p / (2
    sigma^2)`` for every coordinate (so the bias's is 25x smaller than its own-variance estimate:
    Adam normalises the scale, but the L2 pull weighs more on it); Adam (lr) on it, plus an L2
    pull of strength ``l2`` toward ASHA's weights. Starts at ASHA's weights. (As run for the
    shipped weights; kept so that they are reproducible.) ``tasks``: the training tasks (default
    the split's); ``episodes``: the worker that scores weight vectors on one ``(task, seed,
    weights)`` job (default :func:`_episodes`; ``no_hindsight.py`` passes its simulator's)."""
    from archsearch.search.scheduler import ASHA_WEIGHTS

    train_tasks = L.load_split()["train"] if tasks is None else list(tasks)
    episodes = _episodes if episodes is None else episodes
    rng = np.random.default_rng(seed)
    theta0 = np.array(ASHA_WEIGHTS)
    mu, m, v = theta0.copy(), np.zeros_like(theta0), np.zeros_like(theta0)
    history = []
    with _pool(workers) as pool:
        for it in range(iterations):
            t0 = time.time()
            tasks = rng.choice(train_tasks, size=tasks_per_iter, replace=False)
            seeds = rng.integers(1000, 10**6, size=tasks_per_iter)
            eps = rng.normal(0.0, sigma, size=(pairs, len(mu)))
            eps[:, -1] *= 0.2  # the bias moves every decision at once: explore it less
            ws = [mu] + [w for e in eps for w in (mu + e, mu - e)]
            res = np.array(pool.map(episodes, [(str(t), int(s), [w.tolist() for w in ws])
                                                for t, s in zip(tasks, seeds)]))  # (tasks, 1 + 2P)
            fit = -res.mean(0)
            diff = fit[1::2] - fit[2::2]
            g = (diff[:, None] * eps).mean(0) / (2 * sigma ** 2) - l2 * (mu - theta0)
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g ** 2
            mu = mu + lr * (m / (1 - 0.9 ** (it + 1))) / (np.sqrt(v / (1 - 0.999 ** (it + 1))) + 1e-8)
            history.append({"iteration": it, "auc_mu": float(res[:, 0].mean()), "mu": mu.round(4).tolist(),
                            "seconds": round(time.time() - t0, 1)})
            log(f"it {it:3d}  auc(mu) {res[:, 0].mean():+.4f}  mu {np.round(mu, 3).tolist()}  {time.time() - t0:.0f}s")
    return {"weights": mu.tolist(), "history": history}


# ---------------------------------------------------------------------- runs
def _run_job(job: tuple) -> dict:
    """``job`` = (split, task, seed, scheduler, label, weights[, full_trials[, marks]])."""
    split, task, seed, scheduler, label, weights = job[:6]
    full_trials, marks = (job[6] if len(job) > 6 else None), (job[7] if len(job) > 7 else ())
    t0 = time.time()
    r = simulate(task, seed, "policy" if weights is not None else scheduler, weights,
                 full_trials=full_trials, marks=marks)
    return {"split": split, "task": task, "seed": seed, "scheduler": scheduler, "label": label,
            **r, "seconds": round(time.time() - t0, 2)}


def run_jobs(jobs: list[tuple], *, workers: int, path: Path = RUNS, log=print) -> None:
    """Run the jobs not yet in ``path`` (resumable), appending one JSON row per search."""
    done = {(r["split"], r["task"], r["seed"], r["label"]) for r in read_jsonl(path)}
    todo = [j for j in jobs if (j[0], j[1], j[2], j[4]) not in done]
    log(f"{len(todo)} of {len(jobs)} searches to run")
    commit = git_commit()
    log_file = RunLog(path)
    with _pool(workers) as pool:
        for k, row in enumerate(pool.imap_unordered(_run_job, todo)):
            row["commit"] = commit
            log_file.append(row)  # one row per finished search, flushed before the next
            if k % 20 == 0:
                log(f"{k + 1}/{len(todo)} {row['task']} seed {row['seed']} {row['label']} {row['seconds']}s")


def protocol(version: str = "v1") -> dict:
    return json.loads((HERE / VERSIONS[version]["protocol"]).read_text())


class Setup:
    """One protocol version's files, horizon (``full_trials``: v1 and v3 50; v2 the horizon
    ``horizon`` chose, read from ``HORIZON_OUT``) and best-known HV (``per_seed_best``: v3).

    Raises:
        SystemExit: v2 before ``horizon`` has chosen its horizon.
    """

    def __init__(self, version: str):
        f = {k: HERE / v for k, v in VERSIONS[version].items()}
        self.version, self.protocol_path = version, f["protocol"]
        self.runs, self.validation, self.out = f["runs"], f["validation"], f["out"]
        self.protocol = protocol(version)
        self.per_seed_best = version == "v3"
        self.base = RUNS if version == "v3" else None  # v3 scores v1's searches
        if version in ("v1", "v3"):
            self.full_trials = BUDGET_FULL_TRIALS
        elif HORIZON_OUT.is_file():
            self.full_trials = json.loads(HORIZON_OUT.read_text())["chosen_full_trials"]
        else:
            raise SystemExit(f"{HORIZON_OUT}: not written yet: run `python -m benchmarks.schedulers.schedulers run --stage horizon` first")


def variant_weights(name: str) -> list[float] | None:
    """Weights of a validation variant: ``asha`` (untrained), or a trained file's."""
    from archsearch.search.scheduler import ASHA_WEIGHTS

    if name == "asha_rule":
        return list(ASHA_WEIGHTS)
    return json.loads((TRAINED / f"{name}.json").read_text())["weights"]



# ---------------------------------------------------------------------- scoring
def _final(run: dict) -> float:
    return float(run["hv"][-1]) if run["hv"] else 0.0


def best_known(rows: list[dict], task: str, labels: list[str], seeds: list[int], *,
               per_seed_best: bool = False, best_quantile: float = 1.0) -> dict[int, float]:
    """``{seed: best-known HV}`` of ``task``: the ``best_quantile`` quantile of the final HVs of
    every run of ``labels`` on the task (1.0: the best; v1, v2), or with ``per_seed_best`` the best
    final HV among the runs on that seed (the same configurations; v3)."""
    by = {(r["label"], r["seed"]): r for r in rows if r["task"] == task and r["label"] in labels}
    if per_seed_best:
        return {s: max(_final(r) for (lab, ss), r in by.items() if ss == s) for s in seeds}
    best = float(np.quantile([_final(r) for r in by.values() if r["hv"]], best_quantile))
    return {s: best for s in seeds}


def per_task(rows: list[dict], labels: list[str], tasks: list[str], seeds: list[int],
             best_quantile: float = 1.0, per_seed_best: bool = False) -> dict:
    """``{task: {label: {"time_to_95", "hv_at_half", "auc", "reached"}}}``: medians over seeds
    (HV at half the budget over the seed's best-known HV), the best-known HV (per seed) as
    :func:`best_known` says; a run that never reaches 95% of it counts as twice the budget."""
    by = {(r["task"], r["label"], r["seed"]): r for r in rows}
    out = {}
    for task in tasks:
        runs = {lab: [by[(task, lab, s)] for s in seeds if (task, lab, s) in by] for lab in labels}
        best = best_known(rows, task, labels, seeds, per_seed_best=per_seed_best, best_quantile=best_quantile)
        ref_best = max(max(best.values()), L.task_reference(task)["best"])
        out[task] = {"best_known_hv": best if per_seed_best else best[seeds[0]]}
        for lab, rs in runs.items():
            if not rs:
                continue
            scores = [per_seed(r, best[r["seed"]]) for r in rs]
            out[task][lab] = {
                "time_to_95_s": float(np.median([x["time_to_95_s"] for x in scores])),
                "reached": int(sum(math.isfinite(time_to(r, TARGET * best[r["seed"]])) for r in rs)),
                "hv_at_half": float(np.median([x["hv_at_half"] for x in scores])),
                "auc_log_regret": float(np.median([auc_log_regret(r, ref_best) for r in rs])),
                "trials": float(np.median([r["trials"] for r in rs])),
                "seeds": len(rs)}
    return out


def per_seed(run: dict, best: float) -> dict:
    """One search's scores (as :func:`per_task` takes their medians)."""
    return {"time_to_95_s": min(time_to(run, TARGET * best), 2 * run["budget"]),
            "hv_at_half": hv_at(run, run["budget"] / 2) / best}


def bootstrap_ratio(rows: list[dict], table: dict, a: str, b: str, key: str, n: int = 2000,
                    seed: int = 0) -> list[float]:
    """Paired bootstrap 95% interval of :func:`compare`'s ratio: seeds resampled with
    replacement within each task, the same draw for ``a`` and ``b`` (they share each seed's
    configurations), per-task medians, their ratio, the median over tasks."""
    by = {(r["task"], r["label"], r["seed"]): r for r in rows}
    xs, ys = [], []
    for t, row in table.items():
        seeds = sorted(s for (tt, lab, s) in by if tt == t and lab == a and (t, b, s) in by)
        best = row["best_known_hv"]
        best = {s: best[s] for s in seeds} if isinstance(best, dict) else {s: best for s in seeds}
        xs.append(np.array([per_seed(by[(t, a, s)], best[s])[key] for s in seeds]))
        ys.append(np.array([per_seed(by[(t, b, s)], best[s])[key] for s in seeds]))
    def stat(idx):
        return np.median([np.median(x[i]) / np.median(y[i]) for x, y, i in zip(xs, ys, idx)])

    return [round(float(q), 4) for q in grouped_bootstrap([len(x) for x in xs], stat, draws=n, seed=seed)]


def compare(table: dict, a: str, b: str, key: str) -> dict:
    """Median over tasks of ``a/b`` (per-task medians), and a paired Wilcoxon signed-rank test
    over tasks (two-sided) of the per-task values (:func:`benchmarks.evidence.stats.wilcoxon`:
    ties dropped, None under 5 non-zero differences)."""
    pairs = [(t[a][key], t[b][key]) for t in table.values() if a in t and b in t]
    x, y = np.array(pairs).T
    ratio = float(np.median(x / y))
    p = wilcoxon(x, y)
    return {"ratio": ratio, "p": p, "a_lower": int(np.sum(x < y)), "tasks": len(pairs)}


# ---------------------------------------------------------------------- commands
def cmd_train(args) -> None:
    p = protocol()["training"]
    t0 = time.time()
    out = train(iterations=p["iterations"], pairs=p["pairs"], tasks_per_iter=p["tasks_per_iteration"],
                sigma=p["sigma"], lr=p["lr"], l2=p["l2"], seed=p["seed"], workers=args.workers)
    TRAINED.mkdir(parents=True, exist_ok=True)
    hist = out["history"]
    last = np.mean([h["mu"] for h in hist[-p["average_last"]:]], axis=0)
    meta = {"training_tasks": L.load_split()["train"], "protocol": p, "commit": git_commit(),
            "seconds": round(time.time() - t0, 1), "history": hist}
    (TRAINED / "pgpe.json").write_text(json.dumps({"weights": out["weights"], **meta}, indent=1))
    (TRAINED / "pgpe_avg.json").write_text(json.dumps({"weights": last.tolist(), **meta}, indent=1))
    print("wrote", TRAINED / "pgpe.json", TRAINED / "pgpe_avg.json")


def cmd_validate(args) -> None:
    st = Setup(args.protocol)
    p = st.protocol["validation"]
    tasks, seeds = L.load_split()["validation"], parse_seeds(p["seeds"])
    jobs = [("validation", t, s, "ahto", v, variant_weights(v), st.full_trials)
            for v in p["variants"] for t in tasks for s in seeds]
    run_jobs(jobs, workers=args.workers, path=st.base or st.runs)
    rows = read_rows(st, "validation")
    table = per_task(rows, p["variants"], tasks, seeds, per_seed_best=st.per_seed_best)
    score = {}
    for v in p["variants"]:
        score[v] = float(np.mean([math.log(table[t][v]["time_to_95_s"] / table[t]["asha_rule"]["time_to_95_s"])
                                  for t in tasks]))
        print(f"{v:12s} mean log time-to-95 ratio vs ASHA {score[v]:+.4f}  "
              f"auc {np.mean([table[t][v]['auc_log_regret'] for t in tasks]):+.4f}")
    chosen = min(score, key=lambda v: (score[v], v != "asha_rule"))
    print("chosen:", chosen)
    st.validation.write_text(json.dumps({"scores": score, "chosen": chosen, "table": table,
                                         "full_trials": st.full_trials}, indent=1))



def cmd_ship(args) -> None:
    """Write ``archsearch/search/ahto_scheduler.json``: the variant protocol v1's validation chose."""
    from archsearch.search.scheduler import FEATURES, WEIGHTS_FILE

    val = json.loads(VALIDATION_OUT.read_text())
    chosen = val["chosen"]
    manifest = {"features": list(FEATURES), "variant": chosen, "validation_scores": val["scores"],
                "selection_rule": protocol()["validation"]["rule"]}
    if chosen != "asha_rule":
        src = json.loads((TRAINED / f"{chosen}.json").read_text())
        manifest.update({k: src[k] for k in ("training_tasks", "protocol", "commit", "seconds")})
        manifest["iterations"] = len(src["history"])
    WEIGHTS_FILE.write_text(json.dumps({"weights": variant_weights(chosen), "manifest": manifest}, indent=1) + "\n")
    print("wrote", WEIGHTS_FILE)


def cmd_validate_target(args) -> None:
    """A check of protocol v1's best-known-HV rule on the validation tasks (made after v1's test
    read, to see whether validation could have warned of censoring): every scheduler (ahto = the
    shipped policy), the validation seeds; prints, per candidate quantile of the runs' final HVs,
    how many (task, scheduler) medians are censored (never reach 95%)."""
    p = protocol()["validation"]
    tasks, seeds = L.load_split()["validation"], parse_seeds(p["seeds"])
    jobs = [("validation", t, s, sch, sch, None) for sch in SCHEDULERS for t in tasks for s in seeds]
    run_jobs(jobs, workers=args.workers)
    rows = [r for r in read_jsonl(RUNS) if r["split"] == "validation" and r["label"] in SCHEDULERS]
    for q in (1.0, 0.95, 0.9, 0.75, 0.5):
        table = per_task(rows, list(SCHEDULERS), tasks, seeds, best_quantile=q)
        cens = sum(table[t][b]["reached"] * 2 <= table[t][b]["seeds"] for t in tasks for b in SCHEDULERS)
        reached = sum(table[t][b]["reached"] for t in tasks for b in SCHEDULERS)
        print(f"quantile {q}: censored medians {cens}/{len(tasks) * len(SCHEDULERS)}, runs reaching "
              f"{reached}/{len(rows)}")


def tested_ahto(st: Setup) -> dict:
    """The test's ``ahto``: ``{"variant", "weights"}``: v1 the shipped policy (``weights`` None:
    the package data), v2 and v3 the variant their validation chose.

    Raises:
        SystemExit: v2/v3 before their validation ran.
    """
    if st.version == "v1":
        from archsearch.search.scheduler import load_stop_policy

        return {"variant": load_stop_policy()["manifest"].get("variant"), "weights": None}
    if not st.validation.is_file():
        raise SystemExit(f"{st.validation}: not written yet: run `python -m benchmarks.schedulers.schedulers run --stage validate --protocol {st.version}` first")
    chosen = json.loads(st.validation.read_text())["chosen"]
    return {"variant": chosen, "weights": variant_weights(chosen)}


def read_rows(st: Setup, split: str) -> list[dict]:
    """The searches of ``split`` a protocol scores: its own rows; for v3 v1's rows too, except
    v1's test ``ahto`` (v3 runs its validation's variant as ``ahto``)."""
    rows = [r for r in read_jsonl(st.runs) if r["split"] == split]
    if st.base is not None:
        own = {r["label"] for r in rows}
        if split == "test" and "ahto" not in own:
            raise SystemExit(f"{st.runs}: no test rows of ahto yet: run `python -m benchmarks.schedulers.schedulers run --stage test --protocol {st.version}`")
        rows += [r for r in read_jsonl(st.base) if r["split"] == split and r["label"] not in own]
    return rows


def cmd_run(args) -> None:
    st = Setup(args.protocol)
    tasks, seeds = L.load_split()["test"], args.seeds
    w = tested_ahto(st)["weights"]
    jobs = [("test", t, s, sch, sch, w if sch == "ahto" else None, st.full_trials)
            for sch in SCHEDULERS for t in tasks for s in seeds
            if st.base is None or sch == "ahto"]  # v3: the other four are v1's rows
    run_jobs(jobs, workers=args.workers, path=st.runs)


def cmd_horizon(args) -> None:
    """Protocol v2's horizon: the library schedulers to the longest candidate horizon on the
    training tasks, the HV where each shorter horizon would have ended, censored medians per
    candidate; writes ``HORIZON_OUT`` with the chosen horizon (the protocol's rule)."""
    t0 = time.time()
    p = protocol("v2")["horizon"]
    cands = [float(c) for c in p["candidates_full_trials"]]
    tasks, seeds = L.load_split()["train"], parse_seeds(p["seeds"])
    jobs = [("horizon", t, s, sch, sch, None, max(cands), tuple(cands))
            for sch in p["schedulers"] for t in tasks for s in seeds]
    run_jobs(jobs, workers=args.workers, path=HORIZON_RUNS)
    rows = [r for r in read_jsonl(HORIZON_RUNS) if r["split"] == "horizon"]
    table = {}
    for h in cands:
        censored, per = 0, {}
        for t in tasks:
            rs = [r for r in rows if r["task"] == t]
            best = max(r["hv_at_marks"][str(h)] for r in rs)
            per[t] = {}
            for sch in p["schedulers"]:
                reached = sum(r["hv_at_marks"][str(h)] >= TARGET * best for r in rs if r["label"] == sch)
                n = sum(r["label"] == sch for r in rs)
                per[t][sch] = f"{reached}/{n}"
                censored += reached * 2 < n
        pairs = len(tasks) * len(p["schedulers"])
        table[str(h)] = {"censored_medians": censored, "pairs": pairs, "per_task": per}
        print(f"horizon {h:g} full trials: {censored}/{pairs} censored (task, scheduler) medians")
    ok = [h for h in cands if table[str(h)]["censored_medians"] <= 0.10 * table[str(h)]["pairs"]]
    chosen = min(ok) if ok else max(cands)
    print("chosen:", chosen)
    HORIZON_OUT.write_text(json.dumps({
        "chosen_full_trials": chosen, "rule": p["rule"], "table": table,
        "provenance": provenance(commits=sorted({r["commit"] for r in rows}), seeds=seeds,
                                 wall_s=sum(r["seconds"] for r in rows) + time.time() - t0,
                                 protocol=VERSIONS["v2"]["protocol"], runs=len(rows))}, indent=1) + "\n")


def summarize(version: str, seeds: list[int], record_reads: bool = True, quiet: bool = False) -> tuple[Path, dict]:
    """Protocol ``version``'s result from its committed runs: ``(path, result)``, not written.
    ``record_reads``: append its read of the test tasks to the ledger (false for ``check``)."""
    t0 = time.time()
    st = Setup(version)
    rows = read_rows(st, "test")
    tasks = L.load_split()["test"]
    table = per_task(rows, list(SCHEDULERS), tasks, seeds, per_seed_best=st.per_seed_best)
    s: dict = {}
    for b in ("asha", "hyperband", "median", "none"):
        c = compare(table, "ahto", b, "time_to_95_s")
        s[f"ahto_time_to_95_ratio_vs_{b}"] = round(c["ratio"], 4)
        s[f"ahto_wilcoxon_p_vs_{b}"] = None if c["p"] is None else round(c["p"], 4)
        s[f"ahto_faster_than_{b}_tasks"] = f"{c['a_lower']}/{c['tasks']}"
    h = compare(table, "ahto", "asha", "hv_at_half")
    s["ahto_time_to_95_ratio_vs_asha_ci"] = bootstrap_ratio(rows, table, "ahto", "asha", "time_to_95_s")
    s["ahto_hv_ratio_vs_asha_at_equal_time"] = round(h["ratio"], 4)
    s["ahto_hv_ratio_vs_asha_at_equal_time_ci"] = bootstrap_ratio(rows, table, "ahto", "asha", "hv_at_half")
    s["ahto_hv_wilcoxon_p_vs_asha"] = None if h["p"] is None else round(h["p"], 4)
    for b in SCHEDULERS:
        s[f"{b}_time_to_95_median_budget_fraction"] = round(float(np.median(
            [table[t][b]["time_to_95_s"] / task_budget(t, st.full_trials) for t in tasks])), 4)
        s[f"{b}_reached_95_runs"] = f"{sum(table[t][b]['reached'] for t in tasks)}/{sum(table[t][b]['seeds'] for t in tasks)}"
    # hindsight reference, not a scheduler: per task the fastest of the five (its per-task median
    # time) over ASHA's; where it is 1.0 on most tasks no scheduler beat ASHA there
    s["hindsight_best_of_five_time_to_95_ratio_vs_asha"] = round(float(np.median(
        [min(row[b]["time_to_95_s"] for b in SCHEDULERS) / row["asha"]["time_to_95_s"] for row in table.values()])), 4)
    s["tasks_censored_for_every_scheduler"] = int(sum(
        all(row[b]["reached"] * 2 <= row[b]["seeds"] for b in SCHEDULERS) for row in table.values()))
    s["asha_time_to_95_ratio_vs_none"] = round(compare(table, "asha", "none", "time_to_95_s")["ratio"], 4)
    s["asha_time_to_95_ratio_vs_hyperband"] = round(compare(table, "asha", "hyperband", "time_to_95_s")["ratio"], 4)
    from archsearch.search.scheduler import load_stop_policy

    pol = tested_ahto(st)
    if pol["weights"] is None:
        pol["weights"] = load_stop_policy()["weights"]
    prov = provenance(commits=sorted({r["commit"] for r in rows}), seeds=seeds,
                      wall_s=sum(r["seconds"] for r in rows) + time.time() - t0,
                      protocol=relpath(st.protocol_path), runs=len(rows),
                      horizon_full_trials=st.full_trials)
    # the protocols' joint rule: the time ratio <= 0.85 *with* a Wilcoxon p < 0.05; the p counts
    # only in ahto's favour, jointly with its time ratio's target
    targets = {"ahto_time_to_95_ratio_vs_asha": {"target": "<= 0.85", "with": ["ahto_wilcoxon_p_vs_asha"]},
               "ahto_wilcoxon_p_vs_asha": {"target": "< 0.05", "with": ["ahto_time_to_95_ratio_vs_asha"]},
               "ahto_hv_ratio_vs_asha_at_equal_time": ">= 1.0"}
    result = build_result(s, prov, name=st.out.name, targets=targets, protocol=st.protocol_path,
                          reads=[Read(TEST_SET, st.protocol_path)], record_reads=record_reads,
                          per_task=table, policy=pol)
    if not quiet:
        print(json.dumps(s, indent=1))
        print(markdown_table(table, st.full_trials))
    return st.out, result


def _results(args) -> dict:
    versions = [args.protocol] if args.protocol else sorted(VERSIONS)
    return dict(summarize(v, args.seeds, record_reads=not args.check, quiet=args.check) for v in versions)


def markdown_table(table: dict, full_trials: float = BUDGET_FULL_TRIALS) -> str:
    """Per test task: time to 95% of the best-known HV (median over seeds, in units of the
    task's budget; ``>2`` = censored) and runs that reached it, for every scheduler."""
    rows = []
    for t, row in table.items():
        cells = [t]
        for b in SCHEDULERS:
            f = row[b]["time_to_95_s"] / task_budget(t, full_trials)
            cells.append(f"{'>2' if f >= 2 else f'{f:.3f}'} ({row[b]['reached']}/{row[b]['seeds']})")
        rows.append(cells)
    return markdown(rows, ["task", *SCHEDULERS])


STAGES = {"train": cmd_train, "horizon": cmd_horizon, "validate": cmd_validate, "ship": cmd_ship,
          "test": cmd_run, "validate-target": cmd_validate_target}


def _run(args) -> int:
    if args.stage in ("validate", "test") and args.protocol is None:
        args.protocol = "v3"
    STAGES[args.stage](args)
    return 0


def _add_arguments(p) -> None:
    p.add_argument("--stage", choices=sorted(STAGES), default="test",
                   help="run: train (PGPE, v1), horizon (v2), validate, ship, test (the test searches), "
                        "validate-target")
    p.add_argument("--protocol", choices=sorted(VERSIONS), default=None,
                   help="v1: 50 full trials, best-known HV per task (-> results/schedulers_v1.json); v2: v1 at "
                        "the horizon `--stage horizon` chose (-> schedulers_v2.json); v3: v1's searches, "
                        "best-known HV per seed (-> schedulers_v3.json). run: default v3; analyze/check: default all three")
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))


COMMAND = Command(__doc__.split("\n")[0], run=_run, results=_results, add_arguments=_add_arguments, seeds="0-19")


def main(argv=None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
