"""Issue 65's controls and transfer base on LCBench, under ``protocols/transfer.json``.

``run --stage validation|test`` runs the protocol's variants (resumable; one JSON line per
(problem, variant, seed) in ``runs/transfer_runs.jsonl``, ``--workers`` processes);
``analyze`` scores them with the protocol's frozen normaliser, applies its selection rule on
validation and, once test rows exist, writes ``results/transfer.json`` (issue 65's keys).

Usage::

    python -m benchmarks.searchers.transfer run --stage validation
    python -m benchmarks.searchers.transfer analyze
    python -m benchmarks.searchers.transfer run --stage test
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks.evidence.cli import Command
from benchmarks.evidence.provenance import provenance
from benchmarks.evidence.stats import wilcoxon
from benchmarks.testbeds import lcbench as L

HERE = Path(__file__).resolve().parent
PROTOCOL = HERE / "protocols" / "transfer.json"
RUNS = HERE / "runs" / "transfer_runs.jsonl"
OLD_RUNS = HERE / "runs" / "lcbench_runs.jsonl"
OUT = HERE / "results" / "transfer.json"
#: the test stage's variants besides the chosen ones (rows from the older run log)
OLD_BASELINES = ("gp", "transfer", "qnehvi", "tpe", "random", "nsga2", "ahto")
#: issue 65's targets on these keys (the protocol's)
TARGETS = {
    "ahto_regret_ratio_vs_gp_at_20": {"target": "<= 0.7", "with": ["ahto_wilcoxon_p_vs_gp_at_20"]},
    "ahto_wilcoxon_p_vs_gp_at_20": "< 0.05",
    "ahto_regret_ratio_vs_transfer_gp_at_20": {"target": "<= 0.9", "with": ["ahto_wilcoxon_p_vs_transfer_gp_at_20"]},
    "ahto_wilcoxon_p_vs_transfer_gp_at_20": "< 0.05",
    "ahto_no_history_regret_ratio_vs_gp_at_20": "<= 1.05",
    "ahto_unrelated_history_regret_ratio_vs_gp_at_20": "<= 1.05",
}


def protocol() -> dict:
    return json.loads(PROTOCOL.read_text())


def _seeds(spec: str) -> list[int]:
    a, b = spec.split("-")
    return list(range(int(a), int(b) + 1))


def _job(job: tuple) -> dict:
    """:func:`lcbench.search_job` with this protocol's initial design."""
    return L.search_job(job, n_init=protocol()["initial_design"])


def stage_variants(stage: str, chosen: dict | None = None) -> dict[str, dict]:
    """The variants a stage runs: every variant on validation; on test the chosen ones."""
    P = protocol()
    if stage == "validation":
        return P["variants"]
    if chosen is None:
        raise SystemExit("test stage: run analyze after the validation stage first (no choice yet)")
    names = [chosen["history"], chosen["history"] + "_unrelated" if "copula" in chosen["history"] else None,
             chosen["no_history"], "transfer_gp"]
    return {n: P["variants"][n] for n in names if n and n not in OLD_BASELINES}


def cmd_run(args) -> None:
    P = protocol()
    chosen = choose(score(L.read_runs(RUNS), "validation")) if args.stage == "test" else None
    variants = stage_variants(args.stage, chosen)
    tasks = L.tasks_of(args.stage)
    seeds = args.seeds_list or _seeds(P["validation"]["seeds"] if args.stage == "validation" else "0-19")
    done = L.done_runs(RUNS, P["budget"])
    jobs = [(t, label, v["searcher"], v["kwargs"], s, P["budget"])
            for s in seeds for t in tasks for label, v in variants.items()
            if (f"lcbench_{t}", label, s) not in done]
    L.run_searches(_job, jobs, RUNS, args.workers, args.stage)


def score(runs: list[dict], stage: str, seeds: list[int] | None = None) -> dict:
    """Per task and variant: per seed log10 regret at 10 and 20 against the frozen normaliser."""
    norm = protocol()["frozen_normaliser"]["hv"]
    out: dict = {}
    for t in L.tasks_of(stage):
        for r in runs:
            if r["problem"] != f"lcbench_{t}" or (seeds is not None and r["seed"] not in seeds):
                continue
            row = out.setdefault(t, {}).setdefault(r["searcher"], {})
            row[r["seed"]] = {b: L.log_regret(r["hv"][b - 1], norm[t]) for b in (10, 20) if len(r["hv"]) >= b}
    return out


def table(S: dict, budget: int = 20) -> dict:
    """``{variant: {"per_task": {task: median over seeds}, "mean": mean over tasks, "seeds": n}}``
    over the tasks every listed variant has; medians over the seeds common to all variants."""
    variants = sorted({v for t in S.values() for v in t})
    out = {}
    for v in variants:
        per = {}
        for t, rows in S.items():
            if v not in rows:
                continue
            per[t] = statistics.median(x[budget] for x in rows[v].values() if budget in x)
        if per:
            out[v] = {"per_task": per, "mean": statistics.mean(per.values()),
                      "seeds": min(len(S[t][v]) for t in per), "tasks": len(per)}
    return out


def choose(S: dict) -> dict:
    """The protocol's selection rule on the validation scores ``S`` (:func:`score`)."""
    T = table(S)
    need = [v for v in protocol()["variants"]]
    missing = [v for v in need if v not in T or T[v]["tasks"] < 4]
    if missing:
        return {"complete": False, "missing": missing, "scores": {v: T[v]["mean"] for v in T}}
    no_hist = "grade" if T["grade"]["mean"] < T["qnehvi"]["mean"] else "qnehvi"
    base = T[no_hist]["mean"]
    ok = [v for v in ("copula", "copula_design") if T[f"{v}_unrelated"]["mean"] <= base + 0.05]
    if ok:
        hist, passed = min(ok, key=lambda v: T[v]["mean"]), True
    else:
        hist, passed = min(("copula", "copula_design"), key=lambda v: T[f"{v}_unrelated"]["mean"]), False
    return {"complete": True, "no_history": no_hist, "history": hist, "unrelated_check_passed": passed,
            "scores": {v: T[v]["mean"] for v in T}}


def compare(S: dict, a: str, b: str, budget: int = 20) -> dict:
    """``a`` vs ``b`` over the tasks both have: median over tasks of the ratio of (linear)
    median regrets, Wilcoxon signed-rank p over tasks of the median log10 regrets, tasks worse."""
    Ta, Tb = table(S, budget).get(a), table(S, budget).get(b)
    if not Ta or not Tb:
        return {"ratio": None, "p": None, "worse": None, "tasks": 0}
    ts = [t for t in Ta["per_task"] if t in Tb["per_task"]]
    x, y = [Ta["per_task"][t] for t in ts], [Tb["per_task"][t] for t in ts]
    return {"ratio": statistics.median(10 ** (u - v) for u, v in zip(x, y)), "p": wilcoxon(x, y),
            "worse": sum(u > v for u, v in zip(x, y)), "tasks": len(ts)}


def build(record_reads: bool = True) -> dict[Path, dict]:
    """The validation choice (printed) and, once test rows exist, ``{OUT: result}``."""
    from benchmarks.evidence.ledger import Read
    from benchmarks.evidence.results import build_result

    t0 = time.time()
    runs = L.read_runs(RUNS)
    choice = choose(score(runs, "validation"))
    print("validation (mean over tasks of median log10 regret at 20, seeds 0-9):")
    for v, s in sorted(choice["scores"].items(), key=lambda kv: kv[1]):
        print(f"  {v:26s} {s:7.3f}")
    print(json.dumps({k: v for k, v in choice.items() if k != "scores"}))
    test_runs = [r for r in runs if r["problem"].split("_")[-1] in L.tasks_of("test")]
    if not choice["complete"] or not test_runs:
        return {}
    old = [r for r in L.read_runs(OLD_RUNS) if r["searcher"] in OLD_BASELINES]
    # the seeds every test-stage variant has on every test task (a stage stopped part-way is
    # read on its complete seeds; every searcher, old rows included, on those same seeds)
    tasks = L.tasks_of("test")
    new_variants = sorted({r["searcher"] for r in test_runs})
    seeds = [k for k in range(20) if all(any(r["seed"] == k and r["searcher"] == v and r["problem"] == f"lcbench_{t}"
                                             for r in test_runs) for v in new_variants for t in tasks)]
    if not seeds:
        return {}
    S = score(test_runs + old, "test", seeds)
    hist, unrel, nohist = choice["history"], choice["history"] + "_unrelated", choice["no_history"]
    summary: dict = {}
    for key, a, base in (("ahto_regret_ratio_vs_gp_at_20", hist, "gp"),
                         ("ahto_regret_ratio_vs_transfer_gp_at_20", hist, "transfer_gp"),
                         ("ahto_regret_ratio_vs_transfer_at_20", hist, "transfer"),
                         ("ahto_no_history_regret_ratio_vs_gp_at_20", nohist, "gp"),
                         ("ahto_unrelated_history_regret_ratio_vs_gp_at_20", unrel, "gp"),
                         ("transfer_gp_regret_ratio_vs_gp_at_20", "transfer_gp", "gp")):
        c = compare(S, a, base)
        summary[key] = c["ratio"]
        summary[key.replace("regret_ratio", "wilcoxon_p")] = c["p"]
        summary[key.replace("regret_ratio", "tasks_worse")] = c["worse"]
    summary["history_variant"], summary["no_history_variant"] = hist, nohist
    T20 = table(S, 20)
    per_budget = {str(b): {v: {"mean_log10_regret": t["mean"], "seeds": t["seeds"], "tasks": t["tasks"]}
                           for v, t in table(S, b).items()} for b in (10, 20)}
    summary["test_seeds"] = len(seeds)
    prov = provenance(seeds=seeds, wall_s=time.time() - t0)
    return {OUT: build_result(summary, prov, name=OUT.name, protocol=PROTOCOL, targets=TARGETS,
                              reads=[Read("lcbench:test_tasks", PROTOCOL)], record_reads=record_reads,
                              choice=choice, test_table=per_budget,
                              per_task_test={v: t["per_task"] for v, t in T20.items()})}


def _run(args) -> int:
    cmd_run(args)
    return 0


def _results(args) -> dict[Path, dict]:
    return build(record_reads=not args.check)


def _add_arguments(p) -> None:
    p.add_argument("--stage", choices=("validation", "test"), default="validation")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seeds-list", type=lambda s: _seeds(s) if "-" in s else [int(s)], default=None,
                   help="override the stage's seeds (e.g. 0-4): a partial run that later runs complete")


COMMAND = Command(__doc__.split("\n")[0], run=_run, results=_results, add_arguments=_add_arguments)


def main(argv=None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
