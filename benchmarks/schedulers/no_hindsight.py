"""Schedulers on LCBench without hindsight, cross-validated over all 34 tasks (issue 66, protocol v4).

``schedulers.py``'s simulator (v1-v3) let the schedulers know what a real search would not: each
configuration's 52-epoch training time before its first epoch, noise-free learning curves, and a
95% target taken from the best front the compared searches themselves reached. Protocol v4
(``protocols/schedulers_v4.json``, written before its runs) removes the three:

* **costs as observed**: a trial's cost reaches :class:`~archsearch.search.scheduler.StopPolicy`
  only after its first epoch, as ``52 x`` its epoch-1 time (no other scheduler reads costs);
* **seed noise**, a stated model (LCBench's repeated runs are not available offline): a reported
  validation accuracy is the surrogate's value ``+ b + e_t``, ``b ~ N(0, OFFSET_SD^2)`` per trial,
  ``e_t ~ N(0, EPOCH_SD^2)`` per epoch, the same draws for every scheduler. Decisions and the
  front's membership use the noisy values; the HV scored is that of the front members'
  noise-free values (:class:`ScoredFront`);
* **a target fixed per task before any compared run**: ``0.95 x`` the median final HV of a
  no-stopping search on reference seeds (``REFERENCE_SEEDS``) whose configurations no compared
  search sees.

Schedulers: ``schedulers.py``'s ``none``, ``asha`` (Ray Tune), ``hyperband`` and ``median`` (Optuna),
the one-epoch rule (``one_epoch``; Egele et al., "Is One Epoch All You Need For Multi-Fidelity
Hyperparameter Optimization?", ESANN 2023, online: a trial goes on to 52 epochs iff its epoch-1 value is in
the top ``ONE_EPOCH_SHARE`` = 1/27 of the earlier trials', the share ASHA trains past epoch 9), and
``ahto`` (the learned StopPolicy).

Cross-validation: the 34 tasks in 3 folds (:func:`folds`); per fold, PGPE (``schedulers.train``,
v1's hyperparameters, :data:`TRAINING`) in this simulator on the other folds' tasks; the fold's
policy is the mean of the last 10 iterates; each task is tested with a policy never trained on
it, over seeds 0-9. Scores: time to the target (``2 x`` budget when never reached) and the HV at
half the budget; per task the median over seeds; across tasks the median of per-task ratios, a
paired Wilcoxon test over tasks and a grouped bootstrap interval. Test set
``lcbench:scheduler_cv``; the ``*_unread_tasks`` keys leave out the 10 tasks v1-v3 test-read.

Commands (from the repository root)::

    python -m benchmarks.schedulers.no_hindsight run --stage reference   # the per-task targets
    python -m benchmarks.schedulers.no_hindsight run --stage train       # PGPE, one policy per fold
    python -m benchmarks.schedulers.no_hindsight run --stage test        # 34 tasks x 10 seeds x 6
    python -m benchmarks.schedulers.no_hindsight analyze                 # results/schedulers.json
    python -m benchmarks.schedulers.no_hindsight check
"""

from __future__ import annotations

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
from benchmarks.evidence.provenance import git_commit, provenance
from benchmarks.evidence.results import build_result, read_result
from benchmarks.evidence.runlog import RunLog, read_jsonl
from benchmarks.evidence.stats import grouped_bootstrap
from benchmarks.evidence.tables import markdown
from benchmarks.schedulers import schedulers as S
from benchmarks.testbeds import lcbench as L

HERE = Path(__file__).resolve().parent
PROTOCOL = HERE / "protocols" / "schedulers_v4.json"
RUNS = HERE / "runs" / "scheduler_runs_v4.jsonl"
POLICIES = HERE / "runs" / "scheduler_policies"
OUT = HERE / "results" / "schedulers.json"
REAL = HERE / "results" / "scheduler_search_v2.json"  # issue 66 item 4: its summary keys are repeated here
TEST_SET = "lcbench:scheduler_cv"
OFFSET_SD, EPOCH_SD = 1.0, 0.5
FOLDS = 3
REFERENCE_SEEDS = list(range(1000, 1010))
SCHEDULERS = ("none", "asha", "hyperband", "median", "one_epoch", "ahto")
ONE_EPOCH_SHARE = 1 / 27
TRAINING = {"iterations": 30, "tasks_per_iter": 8, "pairs": 4, "sigma": 0.5, "lr": 0.1, "l2": 0.01,
            "average_last": 10}
TARGET = 0.95


def all_tasks() -> list[str]:
    """The 34 LCBench tasks (the committed split's three parts), sorted by id."""
    sp = L.load_split()
    return sorted(sp["train"] + sp["validation"] + sp["test"], key=int)


def folds() -> list[list[str]]:
    """The 3 folds: :func:`all_tasks` in ``default_rng(4)``'s permutation, cut 12 / 11 / 11."""
    tasks = all_tasks()
    order = [tasks[i] for i in np.random.default_rng(4).permutation(len(tasks))]
    cuts = np.cumsum([0] + [len(a) for a in np.array_split(np.arange(len(tasks)), FOLDS)])
    return [order[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


def fold_of(task: str) -> int:
    return next(k for k, f in enumerate(folds()) if task in f)


class NoisyCurves(S.Curves):
    """:class:`schedulers.Curves` plus the v4 seed noise: ``observed(i)`` = ``row(i)[0] + b_i + e_i``
    at the same epochs, drawn for all 52 epochs from ``default_rng([seed, task, 7])`` so that every
    scheduler (whatever epochs it reads) sees the same noise."""

    def __init__(self, task: str, seed: int, n: int = S.MAX_TRIALS, epochs=None):
        super().__init__(task, seed, n, epochs)
        rng = np.random.default_rng([int(seed), int(task), 7])
        self.offset = rng.normal(0.0, OFFSET_SD, n)  # (n,)
        self.noise = rng.normal(0.0, EPOCH_SD, (n, L.EPOCHS))[:, self.epochs - 1]  # (n, E)

    def observed(self, i: int) -> np.ndarray:
        return self.row(i)[0] + self.offset[i] + self.noise[i]


class ScoredFront:
    """The front a search holds, by its noisy reports (max accuracy, min cost), and the HV of its
    members' noise-free values above ``ref`` (what the selected models are worth)."""

    def __init__(self, ref):
        self.ref, self.obs, self.true, self.hv = ref, np.empty((0, 2)), np.empty((0, 2)), 0.0

    def add(self, observed: float, true: float, cost: float) -> bool:
        p = np.array([observed, -cost])
        if len(self.obs) and np.any(np.all(self.obs >= p, axis=1)):
            return False
        keep = ~np.all(p >= self.obs, axis=1) if len(self.obs) else np.zeros(0, bool)
        self.obs = np.vstack([self.obs[keep], p])
        self.true = np.vstack([self.true[keep], [true, -cost]])
        self.hv = L.hv2(self.true, self.ref)
        return True


def _decider(name: str, weights=None, seed: int = 0):
    """``(start(i), report(i, epoch, value, budget_used) -> continue?, end(i, epoch, value),
    observed_cost(i, cost), reports)``: ``schedulers._decider``'s, the StopPolicy told a trial's
    cost only when it is observed, and the one-epoch rule."""
    if name in ("ahto", "policy"):
        from archsearch.search.scheduler import StopPolicy

        pol = StopPolicy(weights, max_t=L.EPOCHS, grace_period=1, reduction_factor=3, mode="max")
        return (lambda i: pol.add(i, None)), pol.on_result, (lambda i, e, v: None), pol.add, S.REPORTS
    if name == "one_epoch":
        first: list[float] = []

        def report(i, e, v, b):
            if e != 1:
                return True
            go = not first or v >= float(np.quantile(first, 1 - ONE_EPOCH_SHARE))
            first.append(v)
            return go

        return (lambda i: None), report, (lambda i, e, v: None), (lambda i, c: None), (1, L.EPOCHS)
    start, report, end, reports = S._decider(name, weights, seed)
    return (lambda i: start(i, None)), report, end, (lambda i, c: None), reports


def simulate(task: str, seed: int, scheduler: str, weights=None, data: NoisyCurves | None = None) -> dict:
    """One v4 search (50 full trials of training time). Returns ``{"t", "hv"}`` (cumulative
    training seconds at each change of the front and the scored HV after it), ``trials``,
    ``stopped``, ``spent``, ``budget``."""
    budget = S.task_budget(task)
    ref = L.task_reference(task)["ref"]
    d = data or NoisyCurves(task, seed, S.max_trials(S.BUDGET_FULL_TRIALS),
                            epochs=None if scheduler == "median" else S.REPORTS)
    col = {int(e): j for j, e in enumerate(d.epochs)}
    start, report, end, observed_cost, reports = _decider(scheduler, weights, seed)
    front, spent, ts, hvs, stopped, i = ScoredFront(ref), 0.0, [], [], 0, 0
    n = min(len(d), S.max_trials(S.BUDGET_FULL_TRIALS))
    while spent < budget and i < n:
        true, tim = d.row(i)
        obs = d.observed(i)
        start(i)
        for e in reports:
            if e == reports[0] and 1 in col:
                observed_cost(i, L.EPOCHS * float(tim[col[1]]))  # known once epoch 1 ran
            v = float(obs[col[e]])
            if not report(i, e, v, spent / budget) and e < L.EPOCHS:
                break
        end(i, e, v)
        stopped += e < L.EPOCHS
        spent += float(tim[col[e]])
        if front.add(v, float(true[col[e]]), float(tim[col[L.EPOCHS]])):
            ts.append(round(spent, 3))
            hvs.append(front.hv)
        i += 1
    return {"t": ts, "hv": hvs, "trials": i, "stopped": stopped, "spent": spent, "budget": budget}


def _episodes(job: tuple) -> list[float]:
    """PGPE worker: AUC log-regret of each weight vector on one (task, seed) in this simulator."""
    task, seed, weight_list = job
    d = NoisyCurves(task, seed, epochs=S.REPORTS)
    best = L.task_reference(task)["best"]
    return [S.auc_log_regret(simulate(task, seed, "policy", w, data=d), best) for w in weight_list]


def _run_job(job: tuple) -> dict:
    split, task, seed, label, weights, fold = job
    t0 = time.time()
    r = simulate(task, seed, label, weights)
    return {"split": split, "task": task, "seed": seed, "label": label, "fold": fold, **r,
            "seconds": round(time.time() - t0, 2)}


def run_jobs(jobs: list[tuple], workers: int) -> None:
    """The jobs not yet in :data:`RUNS` (resumable), one JSON row per search."""
    done = {(r["split"], r["task"], r["seed"], r["label"]) for r in read_jsonl(RUNS)}
    todo = [j for j in jobs if j[:4] not in done]
    print(f"{len(todo)} of {len(jobs)} searches to run", flush=True)
    commit, log = git_commit(), RunLog(RUNS)
    with S._pool(workers) as pool:
        for k, row in enumerate(pool.imap_unordered(_run_job, todo)):
            log.append({**row, "commit": commit})
            if k % 50 == 0:
                print(f"{k + 1}/{len(todo)} {row['task']} seed {row['seed']} {row['label']} {row['seconds']}s", flush=True)


def policy_file(fold: int) -> Path:
    return POLICIES / f"v4_fold{fold}.json"


def cmd_reference(args) -> None:
    run_jobs([("reference", t, s, "none", None, fold_of(t)) for t in all_tasks() for s in REFERENCE_SEEDS],
             args.workers)


def cmd_train(args) -> None:
    fs = folds()
    for k in range(FOLDS):
        if policy_file(k).is_file():
            print(f"fold {k}: {policy_file(k)} exists", flush=True)
            continue
        tasks = [t for j, f in enumerate(fs) if j != k for t in f]
        t0 = time.time()
        p = TRAINING
        out = S.train(iterations=p["iterations"], pairs=p["pairs"], tasks_per_iter=p["tasks_per_iter"],
                      sigma=p["sigma"], lr=p["lr"], l2=p["l2"], seed=100 + k, workers=args.workers,
                      tasks=tasks, episodes=_episodes)
        avg = np.mean([h["mu"] for h in out["history"][-p["average_last"]:]], axis=0)
        POLICIES.mkdir(parents=True, exist_ok=True)
        policy_file(k).write_text(json.dumps({
            "weights": avg.tolist(), "last_iterate": out["weights"], "fold": k, "training_tasks": tasks,
            "training": p, "protocol": relpath(PROTOCOL), "commit": git_commit(),
            "seconds": round(time.time() - t0, 1), "history": out["history"]}, indent=1) + "\n")
        print(f"fold {k}: wrote {policy_file(k)}", flush=True)


def cmd_test(args) -> None:
    missing = [k for k in range(FOLDS) if not policy_file(k).is_file()]
    if missing:
        raise SystemExit(f"{relpath(policy_file(missing[0]))}: not trained yet: run --stage train first")
    jobs = []
    for k, tasks in enumerate(folds()):
        w = json.loads(policy_file(k).read_text())["weights"]
        jobs += [("test", t, s, sch, w if sch == "ahto" else None, k)
                 for sch in SCHEDULERS for t in tasks for s in args.seeds]
    run_jobs(jobs, args.workers)


STAGES = {"reference": cmd_reference, "train": cmd_train, "test": cmd_test}


# ---------------------------------------------------------------------- scoring
def targets(rows: list[dict]) -> dict[str, float]:
    """Per task: :data:`TARGET` x the median final HV of its reference searches."""
    out = {}
    for t in all_tasks():
        finals = [r["hv"][-1] if r["hv"] else 0.0 for r in rows if r["split"] == "reference" and r["task"] == t]
        if len(finals) != len(REFERENCE_SEEDS):
            raise SystemExit(f"{relpath(RUNS)}: {len(finals)} reference searches of task {t}, "
                             f"{len(REFERENCE_SEEDS)} expected: run --stage reference")
        out[t] = TARGET * float(np.median(finals))
    return out


def scores(run: dict, target: float) -> dict:
    return {"time_to_target_s": min(S.time_to(run, target), 2 * run["budget"]),
            "hv_at_half": S.hv_at(run, run["budget"] / 2) / target}


def per_task(rows: list[dict], tgt: dict, seeds: list[int]) -> dict:
    """``{task: {"target_hv", scheduler: {time_to_target_s, hv_at_half, reached, trials, seeds}}}``:
    medians over seeds."""
    by = {(r["task"], r["label"], r["seed"]): r for r in rows if r["split"] == "test"}
    out = {}
    for t in all_tasks():
        out[t] = {"target_hv": tgt[t], "fold": fold_of(t)}
        for b in SCHEDULERS:
            rs = [by[(t, b, s)] for s in seeds if (t, b, s) in by]
            if not rs:
                continue
            sc = [scores(r, tgt[t]) for r in rs]
            out[t][b] = {"time_to_target_s": float(np.median([x["time_to_target_s"] for x in sc])),
                         "hv_at_half": float(np.median([x["hv_at_half"] for x in sc])),
                         "reached": int(sum(math.isfinite(S.time_to(r, tgt[t])) for r in rs)),
                         "trials": float(np.median([r["trials"] for r in rs])), "seeds": len(rs)}
    return out


def compare(table: dict, a: str, b: str, key: str, tasks: list[str]) -> dict:
    """:func:`schedulers.compare` over ``tasks`` only."""
    return S.compare({t: table[t] for t in tasks}, a, b, key)


def bootstrap_ratio(rows: list[dict], tgt: dict, a: str, b: str, key: str, tasks: list[str],
                    seeds: list[int]) -> list[float]:
    """Grouped bootstrap 95% interval of the median over tasks of per-task median ratios (seeds
    resampled within tasks, the same draw for ``a`` and ``b``)."""
    by = {(r["task"], r["label"], r["seed"]): r for r in rows if r["split"] == "test"}
    xs = [np.array([scores(by[(t, a, s)], tgt[t])[key] for s in seeds]) for t in tasks]
    ys = [np.array([scores(by[(t, b, s)], tgt[t])[key] for s in seeds]) for t in tasks]

    def stat(idx):
        return np.median([np.median(x[i]) / np.median(y[i]) for x, y, i in zip(xs, ys, idx)])

    return [round(float(q), 4) for q in grouped_bootstrap([len(x) for x in xs], stat, seed=0)]


def summarize(rows: list[dict], seeds: list[int]) -> tuple[dict, dict]:
    tgt = targets(rows)
    table = per_task(rows, tgt, seeds)
    old_test = set(L.load_split()["test"])
    s: dict = {}
    for suffix, tasks in (("", all_tasks()), ("_unread_tasks", [t for t in all_tasks() if t not in old_test])):
        for b in ("asha", "one_epoch", "hyperband", "median", "none"):
            c = compare(table, "ahto", b, "time_to_target_s", tasks)
            s[f"ahto_time_to_target_ratio_vs_{b}{suffix}"] = round(c["ratio"], 4)
            s[f"ahto_wilcoxon_p_vs_{b}{suffix}"] = None if c["p"] is None else round(c["p"], 4)
            s[f"ahto_faster_than_{b}_tasks{suffix}"] = f"{c['a_lower']}/{c['tasks']}"
        s[f"ahto_time_to_target_ratio_vs_asha{suffix}_ci"] = bootstrap_ratio(
            rows, tgt, "ahto", "asha", "time_to_target_s", tasks, seeds)
        c = compare(table, "one_epoch", "asha", "time_to_target_s", tasks)
        s[f"one_epoch_time_to_target_ratio_vs_asha{suffix}"] = round(c["ratio"], 4)
        s[f"one_epoch_wilcoxon_p_vs_asha{suffix}"] = None if c["p"] is None else round(c["p"], 4)
    unread = [t for t in all_tasks() if t not in old_test]
    s["ahto_hv_ratio_vs_asha_at_equal_time_unread_tasks"] = round(
        compare(table, "ahto", "asha", "hv_at_half", unread)["ratio"], 4)
    h = compare(table, "ahto", "asha", "hv_at_half", all_tasks())
    s["ahto_hv_ratio_vs_asha_at_equal_time"] = round(h["ratio"], 4)
    s["ahto_hv_ratio_vs_asha_at_equal_time_ci"] = bootstrap_ratio(rows, tgt, "ahto", "asha", "hv_at_half",
                                                                  all_tasks(), seeds)
    for b in SCHEDULERS:
        s[f"{b}_reached_target_runs"] = (f"{sum(table[t][b]['reached'] for t in all_tasks())}/"
                                         f"{sum(table[t][b]['seeds'] for t in all_tasks())}")
        s[f"{b}_median_trials"] = float(np.median([table[t][b]["trials"] for t in all_tasks()]))
    return s, table


def results(args) -> dict[Path, dict]:
    t0 = time.time()
    rows = read_jsonl(RUNS)
    test_seeds = args.seeds
    s, table = summarize(rows, test_seeds)
    real = read_result(REAL)["summary"]  # the real searches' keys, so the issue's keys sit in one result
    s.update({k: v for k, v in real.items() if k.startswith("ahto_real_hv_ratio_vs_asha")})
    s["ahto_real_hv_ratio_source"] = relpath(REAL)
    pols = {k: json.loads(policy_file(k).read_text()) for k in range(FOLDS)}
    prov = provenance(commits=sorted({r["commit"] for r in rows}), seeds=test_seeds,
                      wall_s=sum(r["seconds"] for r in rows) + sum(p["seconds"] for p in pols.values())
                      + time.time() - t0, protocol=relpath(PROTOCOL), runs=len(rows),
                      reference_seeds=REFERENCE_SEEDS)
    tg = {"ahto_time_to_target_ratio_vs_asha": {"target": "<= 0.85", "with": ["ahto_wilcoxon_p_vs_asha"]},
          "ahto_wilcoxon_p_vs_asha": {"target": "< 0.05", "with": ["ahto_time_to_target_ratio_vs_asha"]},
          "ahto_time_to_target_ratio_vs_one_epoch": "<= 1.0",
          "ahto_real_hv_ratio_vs_asha_at_equal_time": ">= 1.0"}
    result = build_result(s, prov, name=OUT.name, targets=tg, protocol=PROTOCOL,
                          reads=[Read(TEST_SET, PROTOCOL)], record_reads=not args.check,
                          folds=folds(), policies={k: {"weights": p["weights"], "training_tasks": p["training_tasks"]}
                                                   for k, p in pols.items()},
                          per_task=table)
    if not args.check:
        print(json.dumps(s, indent=1))
        print(markdown_table(table))
    return {OUT: result}


def markdown_table(table: dict) -> str:
    """Per task: time to the target in units of its budget (median over seeds; ``>2``: censored)
    and the runs that reached it, for every scheduler."""
    rows = []
    for t, row in table.items():
        cells = [t, str(row["fold"])]
        for b in SCHEDULERS:
            f = row[b]["time_to_target_s"] / S.task_budget(t)
            cells.append(f"{'>2' if f >= 2 else f'{f:.3f}'} ({row[b]['reached']}/{row[b]['seeds']})")
        rows.append(cells)
    return markdown(rows, ["task", "fold", *SCHEDULERS])


def _run(args) -> int:
    STAGES[args.stage](args)
    return 0


def _add_arguments(p) -> None:
    p.add_argument("--stage", choices=sorted(STAGES), default="test",
                   help="reference (the per-task targets), train (PGPE per fold), test (the searches)")
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))


COMMAND = Command(__doc__.split("\n")[0], run=_run, results=results, add_arguments=_add_arguments, seeds="0-9")


def main(argv=None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
