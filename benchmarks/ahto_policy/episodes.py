"""Issue 65 item 3, design 2: AHTO's acquisition policy trained on whole episodes, under
``protocols/ahto_policy_episodes.json``.

Design 1 (:mod:`benchmarks.ahto_policy.ahto_policy`) trained a network on the exact one-step
reward of every candidate; it added nothing on the test tasks. Here a 21-weight
:class:`archsearch.search.policy.LinearPolicy` (zero weights: the argmax of the log acquisition
over AHTO's candidate pool, the base) is trained by evolution strategies with antithetic
sampling (PGPE, Sehnke et al. 2010; Salimans et al. 2017, sec. 2) on the return of whole
searches: the reduction of log10 hypervolume regret at 10, 20 and 40 trials (those within the
horizon) relative to the base's own rollout on the same task and seed, horizons drawn from
{10, 20, 40}, on the 20 LCBench training tasks.

Stages (each resumable; one JSON line per unit of work in ``runs/episodes/``)::

    python -m benchmarks.ahto_policy.episodes run --stage train        # 30 ES iterations
    python -m benchmarks.ahto_policy.episodes run --stage validation   # 4 labels x 4 tasks x 10 seeds
    python -m benchmarks.ahto_policy.episodes analyze                  # results/ahto_policy_episodes.json
    python -m benchmarks.ahto_policy.episodes run --stage test         # only if the choice passed

``train`` writes the final weights to ``weights/ahto_policy_es.json`` after its last iteration.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.evidence.cli import Command
from benchmarks.evidence.provenance import git_commit, provenance
from benchmarks.evidence.runlog import RunLog
from benchmarks.testbeds import lcbench as L

HERE = Path(__file__).resolve().parent
PROTOCOL = HERE / "protocols" / "ahto_policy_episodes.json"
RUNDIR = HERE / "runs" / "episodes"
ITERATIONS_LOG = RUNDIR / "es_iterations.jsonl"
RUNS = RUNDIR / "episode_runs.jsonl"
#: the trained weights (a policy file, not a result; runs recorded before 2026-12-05 04:25 name
#: the same file at its first place, results/ahto_policy_es.json)
WEIGHTS_OUT = HERE / "weights" / "ahto_policy_es.json"
OUT = HERE / "results" / "ahto_policy_episodes.json"
#: the addendum protocol (after the validation read): the base on the conditional problem, and
#: the episode-trained policy on the test tasks (exploratory)
ADDENDUM = HERE / "protocols" / "ahto_policy_base.json"
COND_RUNS = RUNDIR / "conditional_base_runs.jsonl"  # python -m benchmarks.searchers.conditional run
#   --samplers ahto_base --seeds 0-29 --out benchmarks/ahto_policy/runs/episodes/conditional_base_runs.jsonl
#: the branched problem's rows of design 1 (``ahto``) and TPE, read as data (another question's log)
COND_V2_RUNS = HERE.parent / "searchers" / "runs" / "conditional_v2_runs.jsonl"
COND_VALIDATION_SEEDS, COND_TEST_SEEDS = range(10), range(10, 30)  # as protocols/conditional_v2.json

ITERATIONS = 30
GROUPS = 2
PAIRS = 2
SIGMA = 0.2
LR = 0.1
HORIZONS = (10, 20, 40)
CHECKPOINTS = (10, 20, 40)
VALIDATION_SEEDS = list(range(10))
TEST_SEEDS = list(range(20))
LABELS = ("ahto_es", "ahto_pool0", "qnehvi", "ahto")
MARGIN = 0.05
TARGETS = {
    "ahto_regret_ratio_vs_ahto_base_at_20": {"target": "<= 0.95", "with": ["ahto_wilcoxon_p_vs_ahto_base_at_20"]},
    "ahto_wilcoxon_p_vs_ahto_base_at_20": "< 0.05",
}


def n_weights() -> int:
    from archsearch.search.policy import BUDGET_PRODUCTS, FEATURES

    return len(FEATURES) + len(BUDGET_PRODUCTS)


def write_weights(path: Path, w, manifest: dict) -> Path:
    """``w`` as a :class:`LinearPolicy` weights file at ``path``."""
    import torch

    from archsearch.search.policy import LinearPolicy

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(LinearPolicy(torch.tensor(list(w), dtype=torch.double)).to_json(manifest)) + "\n")
    return path


def episode(job: tuple) -> dict:
    """One search of AHTO with linear weights ``w`` on ``task`` for ``horizon`` trials: its HV
    curve, the override share and the seconds taken."""
    import torch

    torch.set_num_threads(1)
    from benchmarks.testbeds.search_loop import run_one

    task, seed, horizon, w, role = job
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        f = write_weights(Path(d) / "w.json", w, {"role": role})
        problem = L.LCBenchProblem(task, 2, horizon)
        core = L.build_searcher("ahto", problem, seed, policy=str(f))
        r = run_one(problem, "ahto", seed, budget=horizon, core=core)
    changed = [c for c in r["policy_changed"] if c is not None]
    return {"task": task, "seed": seed, "horizon": horizon, "role": role, "hv": r["hv"],
            "override": sum(changed) / max(len(changed), 1), "seconds": round(time.time() - t0, 2)}


def draws(iteration: int, tasks: list[str]) -> tuple[list[dict], np.ndarray]:
    """The protocol's draws of one iteration: ``GROUPS`` (task, seed, horizon) and ``(GROUPS,
    PAIRS, n)`` standard normal directions."""
    rng = np.random.default_rng(65_000 + iteration)
    groups = []
    for g in range(GROUPS):
        groups.append({"task": tasks[int(rng.integers(len(tasks)))], "horizon": int(rng.choice(HORIZONS)),
                       "seed": 1000 + 2 * iteration + g})
    return groups, rng.standard_normal((GROUPS, PAIRS, n_weights()))


def group_returns(task: str, horizon: int, base_hv: list[float], hvs: list[list[float]]) -> tuple[dict, list[float]]:
    """The base's log10 regrets at the checkpoints and each rollout's return ``A``: the mean
    over checkpoints of (base log10 regret - rollout log10 regret)."""
    best = max(L.task_reference(task)["best"], max(base_hv), *(max(h) for h in hvs))
    cps = [c for c in CHECKPOINTS if c <= horizon]
    base = {c: L.log_regret(base_hv[c - 1], best) for c in cps}
    return base, [statistics.mean(base[c] - L.log_regret(h[c - 1], best) for c in cps) for h in hvs]


def current_weights() -> tuple[int, np.ndarray]:
    rows = RunLog(ITERATIONS_LOG).rows() if ITERATIONS_LOG.exists() else []
    if not rows:
        return 0, np.zeros(n_weights())
    return len(rows), np.array(rows[-1]["w_after"])


def cmd_train(args) -> None:
    from multiprocessing import get_context

    tasks = L.load_split()["train"]
    done, w = current_weights()
    print(f"train: iteration {done} of {ITERATIONS} -> {ITERATIONS_LOG}", flush=True)
    commit = git_commit()
    with get_context("spawn").Pool(args.workers) as pool:
        for it in range(done, ITERATIONS):
            t0 = time.time()
            groups, U = draws(it, tasks)
            jobs = []
            for g, G in enumerate(groups):
                # the base (w = 0: the acquisition's argmax over the pool), not the current mean:
                # A is then the gain of the perturbed policies over the base (the training curve);
                # the antithetic gradient is the same either way (the base cancels in A+ - A-)
                jobs.append((G["task"], G["seed"], G["horizon"], [0.0] * len(w), f"base:{g}"))
                for p in range(PAIRS):
                    for sgn in (1, -1):
                        jobs.append((G["task"], G["seed"], G["horizon"], (w + sgn * SIGMA * U[g, p]).tolist(),
                                     f"{'+' if sgn > 0 else '-'}:{g}:{p}"))
            out = {r["role"]: r for r in pool.map(episode, jobs)}
            grad = np.zeros_like(w)
            A_all, recs = [], []
            for g, G in enumerate(groups):
                roles = [f"{s}:{g}:{p}" for p in range(PAIRS) for s in "+-"]
                base, A = group_returns(G["task"], G["horizon"], out[f"base:{g}"]["hv"], [out[r]["hv"] for r in roles])
                for role, a in zip(roles, A):
                    s, _, p = role.split(":")
                    grad += a * (1 if s == "+" else -1) * U[g, int(p)]
                A_all += A
                recs.append({**G, "base_log10_regret": {str(c): v for c, v in base.items()},
                             "returns": dict(zip(roles, A)),
                             "override": {r: out[r]["override"] for r in roles},
                             "seconds": {r: out[r]["seconds"] for r in [f"base:{g}", *roles]}})
            grad /= len(A_all) * SIGMA
            w_new = w + LR * grad
            RunLog(ITERATIONS_LOG).append({"iteration": it, "w_before": w.tolist(), "w_after": w_new.tolist(),
                                           "groups": recs, "mean_advantage": statistics.mean(A_all),
                                           "grad_norm": float(np.linalg.norm(grad)), "commit": commit,
                                           "seconds": round(time.time() - t0, 1)})
            print(f"[{it + 1}/{ITERATIONS}] " + " ".join(f"{G['task']}/H{G['horizon']}" for G in groups)
                  + f" mean A {statistics.mean(A_all):+.4f} |grad| {np.linalg.norm(grad):.3f} "
                    f"|w| {np.linalg.norm(w_new):.3f} {time.time() - t0:.0f}s", flush=True)
            w = w_new
    final_weights()


def final_weights() -> Path | None:
    """The mean weights after the last iteration as ``weights/ahto_policy_es.json`` (None
    before training is complete)."""
    done, w = current_weights()
    if done < ITERATIONS:
        return None
    rows = RunLog(ITERATIONS_LOG).rows()
    manifest = {"protocol": str(PROTOCOL.relative_to(HERE.parent.parent)), "iterations": done,
                "training_tasks": sorted({g["task"] for r in rows for g in r["groups"]}),
                "episodes": sum(len(g["seconds"]) for r in rows for g in r["groups"]),
                "episode_seconds": round(sum(s for r in rows for g in r["groups"] for s in g["seconds"].values()), 1),
                "commits": sorted({r["commit"] for r in rows}),
                "hyperparameters": {"sigma": SIGMA, "lr": LR, "groups": GROUPS, "pairs": PAIRS,
                                    "horizons": list(HORIZONS), "checkpoints": list(CHECKPOINTS)}}
    return write_weights(WEIGHTS_OUT, w, manifest)


def label_kwargs(label: str) -> dict:
    """AHTO's keyword arguments for a validation label."""
    if label == "ahto_es":
        if not WEIGHTS_OUT.exists():
            raise SystemExit(f"{WEIGHTS_OUT}: no trained weights (run --stage train to the end first)")
        return {"policy": str(WEIGHTS_OUT.relative_to(HERE.parent.parent))}
    if label == "ahto_pool0":
        return {"policy": str(write_weights(RUNDIR / "pool0.json", np.zeros(n_weights()),
                                            {"role": "the base: zero weights"}).relative_to(HERE.parent.parent))}
    if label == "qnehvi":
        return {"policy": "none"}
    return {}


def cmd_searches(args, stage: str, labels: tuple[str, ...], seeds: list[int]) -> None:
    done = L.done_runs(RUNS, 20)
    jobs = [(t, label, "ahto", label_kwargs(label), s, 20) for s in seeds for t in L.tasks_of(stage) for label in labels
            if (f"lcbench_{t}", label, s) not in done]
    L.run_searches(L.search_job, jobs, RUNS, args.workers, stage)


def validation_scores() -> dict:
    """Per label the protocol's validation score, and whether every label has every seed."""
    runs = L.read_runs(RUNS) if RUNS.exists() else []
    tasks = L.tasks_of("validation")
    S = L.summarize_lcbench(runs, tasks, list(LABELS), budgets=(10, 20), seeds=VALIDATION_SEEDS)
    complete = len(S["table"]) == len(tasks) and all(S["seeds"][t] == VALIDATION_SEEDS for t in S["table"])
    scores = {lab: statistics.mean(S["table"][t][lab]["20"] for t in S["table"]) for lab in LABELS} if S["table"] else {}
    return {"complete": complete, "scores": scores, "table": S["table"], "runs": runs}


def choose(V: dict) -> dict:
    """The protocol's selection rule on :func:`validation_scores`."""
    if not V["complete"]:
        return {"complete": False}
    s = V["scores"]
    passed = all(s["ahto_es"] <= s[b] - MARGIN for b in ("qnehvi", "ahto_pool0", "ahto"))
    return {"complete": True, "passed": passed, "margin": MARGIN,
            "ahto_es_minus_best_other": s["ahto_es"] - min(s[b] for b in ("qnehvi", "ahto_pool0", "ahto"))}


def conditional_keys() -> dict:
    """The addendum protocol's conditional keys: the base's rows beside tpe's and design 1's
    (``ahto``) of conditional_v2_runs.jsonl, test seeds 10-29."""
    from benchmarks.evidence.runlog import read_jsonl
    from benchmarks.evidence.stats import bootstrap_ci, bootstrap_indices, wilcoxon

    rows = read_jsonl(COND_V2_RUNS) + read_jsonl(COND_RUNS)  # the last row per (sampler, seed) counts
    by = {s: {r["seed"]: r for r in rows if r["sampler"] == s} for s in ("tpe", "ahto", "ahto_base")}
    seeds = [k for k in COND_TEST_SEEDS if all(k in v for v in by.values())]
    val = [k for k in COND_VALIDATION_SEEDS if all(k in v for v in by.values())]
    if seeds != list(COND_TEST_SEEDS) or val != list(COND_VALIDATION_SEEDS):
        return {}
    med = {s: statistics.median(v[k]["curve"][39] for k in seeds) for s, v in by.items()}
    med_val = {s: statistics.median(v[k]["curve"][39] for k in val) for s, v in by.items()}
    d = np.array([by["ahto_base"][k]["curve"][39] - by["tpe"][k]["curve"][39] for k in seeds])
    return {"ahto_base_hv_ratio_vs_tpe_group_conditional_at_40": med["ahto_base"] / med["tpe"],
            "ahto_base_hv_ratio_vs_ahto_policy_conditional_at_40": med["ahto_base"] / med["ahto"],
            "ahto_base_minus_tpe_hv_conditional_at_40": float(d.mean()),
            "ahto_base_minus_tpe_hv_conditional_at_40_ci": bootstrap_ci(d[bootstrap_indices(len(d))].mean(1)),
            "ahto_base_minus_tpe_hv_conditional_at_40_wilcoxon_p": wilcoxon(d),
            "conditional_hv_median_at_40_test": med,
            # validation seeds 0-9: what the default's choice rests on
            "conditional_hv_median_at_40_validation": med_val,
            "ahto_base_hv_ratio_vs_ahto_policy_conditional_at_40_validation": med_val["ahto_base"] / med_val["ahto"]}


def cmd_run(args) -> None:
    if args.stage == "train":
        cmd_train(args)
    elif args.stage == "validation":
        cmd_searches(args, "validation", LABELS, VALIDATION_SEEDS)
    elif args.stage == "conditional":
        raise SystemExit("the conditional stage runs in its own question: python -m benchmarks.searchers.conditional "
                         f"run --samplers ahto_base --seeds 0-29 --out {COND_RUNS.relative_to(HERE.parent.parent)}")
    elif args.stage == "test_exploratory":
        cmd_searches(args, "test", ("ahto_es",), TEST_SEEDS)
    else:
        c = choose(validation_scores())
        if not c.get("passed"):
            raise SystemExit(f"{PROTOCOL.name}: the validation choice did not pass ({json.dumps(c)}): no test stage")
        cmd_searches(args, "test", ("ahto_es",), TEST_SEEDS)


def override_rate(runs: list[dict], label: str) -> dict:
    """Share of model-based asks where ``label``'s choice differs from the acquisition's."""
    ch = [c for r in runs if r["searcher"] == label for c in (r.get("policy_changed") or []) if c is not None]
    return {"asks": len(ch), "rate": sum(ch) / len(ch) if ch else None}


def test_comparison(own_test: list[dict], test_tasks: list[str]) -> tuple[dict, dict]:
    """ahto_es's test rows beside qnehvi's and ahto's of lcbench_runs.jsonl (seeds 0-19): the
    per-task table and :func:`lcbench.compare` at 20 trials against each."""
    stored = [r for r in L.read_runs(L.ROOT / "benchmarks" / "searchers" / "runs" / "lcbench_runs.jsonl")
              if r["searcher"] in ("qnehvi", "ahto")]
    S = L.summarize_lcbench(own_test + stored, test_tasks, ["ahto_es", "qnehvi", "ahto"], budgets=(10, 20),
                            seeds=TEST_SEEDS)
    return S["table"], {base: L.compare(S["table"], "ahto_es", base, 20) for base in ("qnehvi", "ahto")}


def build(record_reads: bool = True) -> dict[Path, dict]:
    from benchmarks.evidence.ledger import Read
    from benchmarks.evidence.results import build_result

    t0 = time.time()
    rows = RunLog(ITERATIONS_LOG).rows() if ITERATIONS_LOG.exists() else []
    if len(rows) < ITERATIONS:
        print(f"training: {len(rows)} of {ITERATIONS} iterations stored; nothing to write")
        return {}
    summary: dict = {
        "train_iterations": len(rows),
        "train_mean_advantage_per_iteration": [r["mean_advantage"] for r in rows],
        "train_mean_advantage_last10": statistics.mean(r["mean_advantage"] for r in rows[-10:]),
        "train_episode_hours": sum(s for r in rows for g in r["groups"] for s in g["seconds"].values()) / 3600,
        "final_weight_norm": float(np.linalg.norm(rows[-1]["w_after"])),
    }
    V = validation_scores()
    print("validation (mean over tasks of median log10 regret at 20, seeds 0-9):")
    for lab, s in sorted(V["scores"].items(), key=lambda kv: kv[1]):
        print(f"  {lab:12s} {s:7.3f}")
    if not V["complete"]:
        prov = provenance(commits=[r["commit"] for r in rows], wall_s=time.time() - t0)
        return {OUT: build_result(summary, prov, name=OUT.name, protocol=PROTOCOL, record_reads=record_reads)}
    choice = choose(V)
    summary.update({"validation_scores": V["scores"], "validation_passed": choice["passed"],
                    "validation_ahto_es_minus_best_other": choice["ahto_es_minus_best_other"],
                    "override_rate": override_rate([r for r in V["runs"] if r["problem"].split("_")[-1]
                                                    in L.tasks_of("validation")], "ahto_es")["rate"]})
    commits = [r["commit"] for r in rows] + [r["commit"] for r in V["runs"]]
    extra: dict = {"validation_table": V["table"]}
    reads = []
    test_tasks = L.tasks_of("test")
    own_test = [r for r in V["runs"] if r["searcher"] == "ahto_es" and r["problem"].split("_")[-1] in test_tasks]
    seeds = sorted({r["seed"] for r in own_test})
    if choice["passed"] and seeds == TEST_SEEDS and len(own_test) == len(TEST_SEEDS) * len(test_tasks):
        S, cmp = test_comparison(own_test, test_tasks)
        for key, base in (("ahto_base", "qnehvi"), ("ahto_onestep", "ahto")):
            c = cmp[base]
            summary[f"ahto_regret_ratio_vs_{key}_at_20"] = c["ratio"]
            summary[f"ahto_wilcoxon_p_vs_{key}_at_20"] = c["p"]
            summary[f"ahto_tasks_worse_vs_{key}_at_20"] = c["worse"]
        extra["test_table"] = S
        reads = [Read("lcbench:test_tasks", PROTOCOL)]
    elif not choice["passed"]:  # the addendum (protocols/ahto_policy_base.json), after the choice
        cond = conditional_keys()
        if cond:
            summary.update(cond)
            reads.append(Read("conditional:test_seeds_10_29", ADDENDUM, "conditional"))
            # the protocol's fallback ("the base ships alone") is not applied where the base is
            # worse on the branched problem's validation seeds: design 1 then stays the default
            keep = cond["ahto_base_hv_ratio_vs_ahto_policy_conditional_at_40_validation"] < 1.0
            summary["default_policy"] = "design 1 (ahto_policy.json)" if keep else "none (the base alone)"
        if seeds == TEST_SEEDS and len(own_test) == len(TEST_SEEDS) * len(test_tasks):
            S, cmp = test_comparison(own_test, test_tasks)
            for base, c in cmp.items():
                key = f"exploratory_ahto_es_regret_ratio_vs_{base}_at_20"
                summary[key] = c["ratio"]
                summary[key.replace("regret_ratio", "wilcoxon_p")] = c["p"]
                summary[key.replace("regret_ratio", "tasks_worse")] = c["worse"]
            summary["exploratory_override_rate_test"] = override_rate(own_test, "ahto_es")["rate"]
            extra["test_table_exploratory"] = S
            reads.append(Read("lcbench:test_tasks", ADDENDUM, "test_exploratory"))
    prov = provenance(commits=commits, seeds=VALIDATION_SEEDS, wall_s=time.time() - t0,
                      selection_split="validation")
    return {OUT: build_result(summary, prov, name=OUT.name, protocol={"episodes": PROTOCOL, "addendum": ADDENDUM},
                              targets=TARGETS if choice["passed"] and reads else None, reads=reads, record_reads=record_reads,
                              choice=choice, **extra)}


def _run(args) -> int:
    cmd_run(args)
    return 0


def _add_arguments(p) -> None:
    p.add_argument("--stage", choices=("train", "validation", "test", "conditional", "test_exploratory"),
                   default="train", help="conditional, test_exploratory: protocols/ahto_policy_base.json")
    p.add_argument("--workers", type=int, default=2)


COMMAND = Command(__doc__.split("\n")[0], run=_run, results=lambda args: build(record_reads=not args.check),
                  add_arguments=_add_arguments)


def main(argv=None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
