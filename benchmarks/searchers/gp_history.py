"""Issue 65, deliverable 4 for the default searcher: Optuna's GPSampler warm-started from a
user's history, under ``protocols/gp_history.json``.

``--history`` gives ``gp`` (the CLI default) its 6 start configs from the Gaussian-copula prior
fitted on earlier searches (:class:`archsearch.search.baselines.OptunaSearcher`'s ``history``:
``CopulaPrior.design(method="setcover")``) instead of 6 random ones. ``run --stage validation``
runs the protocol's two variants on the 4 validation tasks (seeds 0-9) beside
:mod:`benchmarks.searchers.transfer`'s stored rows; ``analyze`` writes ``results/gp_history.json``
once validation is complete: the validation scores and the protocol's choice (which condition
failed, if one did) and, once the test stage has all its rows (seeds 0-19 on the 10 test tasks,
resumable across sessions: a partial stage is not read), the test keys.

Usage::

    python -m benchmarks.searchers.gp_history run --stage validation
    python -m benchmarks.searchers.gp_history analyze
    python -m benchmarks.searchers.gp_history run --stage test      # only if the choice passed
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from benchmarks.evidence.cli import Command
from benchmarks.evidence.provenance import provenance
from benchmarks.searchers import transfer as T
from benchmarks.testbeds import lcbench as L

HERE = Path(__file__).resolve().parent
PROTOCOL = HERE / "protocols" / "gp_history.json"
RUNS = HERE / "runs" / "gp_history_runs.jsonl"
OUT = HERE / "results" / "gp_history.json"
VALIDATION_SEEDS = list(range(10))
#: the test stage's seeds; its rows are read only when every one is stored on every test task
TEST_SEEDS = list(range(20))
#: the stored rows compared with, per stage: variant -> run log (transfer.json's validation rows;
#: on test, gp's rows from lcbench_runs.jsonl as transfer.json reads them)
STORED = {"validation": {"gp": T.RUNS, "transfer_gp": T.RUNS, "copula": T.RUNS},
          "test": {"gp": T.OLD_RUNS, "transfer_gp": T.RUNS}}
TARGETS = {
    "gp_history_regret_ratio_vs_gp_at_20": {"target": "<= 0.8", "with": ["gp_history_wilcoxon_p_vs_gp_at_20"]},
    "gp_history_wilcoxon_p_vs_gp_at_20": "< 0.05",
    "gp_history_unrelated_regret_ratio_vs_gp_at_20": "<= 1.05",
}


def protocol() -> dict:
    return json.loads(PROTOCOL.read_text())


def rows(stage: str) -> list[dict]:
    """This protocol's runs and the stage's stored rows of :data:`STORED` (by variant)."""
    own = L.read_runs(RUNS) if RUNS.exists() else []
    stored = [r for v, path in STORED[stage].items() for r in L.read_runs(path) if r["searcher"] == v]
    return own + stored


def choose(S: dict) -> dict:
    """The protocol's selection rule on validation scores ``S`` (:func:`transfer.score`)."""
    Tab = T.table(S)
    need = ["gp", *protocol()["variants"]]
    missing = [v for v in need if v not in Tab or Tab[v]["tasks"] < 4 or Tab[v]["seeds"] < len(VALIDATION_SEEDS)]
    scores = {v: t["mean"] for v, t in Tab.items()}
    if missing:
        return {"complete": False, "missing": missing, "scores": scores}
    better = scores["gp_history"] <= scores["gp"] - 0.1
    safe = scores["gp_history_unrelated"] <= scores["gp"] + 0.05
    return {"complete": True, "passed": better and safe, "related_at_least_0.1_better": better,
            "unrelated_within_0.05": safe, "scores": scores}


def cmd_run(args) -> None:
    P, budget = protocol(), T.protocol()["budget"]
    if args.stage == "test":
        choice = choose(T.score(rows("validation"), "validation", VALIDATION_SEEDS))
        if not choice.get("passed"):
            raise SystemExit(f"{PROTOCOL.name}: the validation choice did not pass "
                             f"({json.dumps({k: v for k, v in choice.items() if k != 'scores'})}): no test stage")
    seeds = args.seeds_list or T._seeds("0-9" if args.stage == "validation" else "0-19")
    done = L.done_runs(RUNS, budget)
    jobs = [(t, label, v["searcher"], v["kwargs"], s, budget)
            for s in seeds for t in L.tasks_of(args.stage) for label, v in P["variants"].items()
            if (f"lcbench_{t}", label, s) not in done]
    L.run_searches(T._job, jobs, RUNS, args.workers, args.stage)


def build(record_reads: bool = True) -> dict[Path, dict]:
    """The validation choice (printed) and, once test rows exist, ``{OUT: result}``."""
    from benchmarks.evidence.ledger import Read
    from benchmarks.evidence.results import build_result

    t0 = time.time()
    choice = choose(T.score(rows("validation"), "validation", VALIDATION_SEEDS))
    print("validation (mean over tasks of median log10 regret at 20, seeds 0-9):")
    for v, s in sorted(choice["scores"].items(), key=lambda kv: kv[1]):
        print(f"  {v:26s} {s:7.3f}")
    print(json.dumps({k: v for k, v in choice.items() if k != "scores"}))
    if not choice["complete"]:
        return {}
    summary: dict = {f"validation_{k}": v for k, v in choice.items() if k != "complete"}
    tasks = L.tasks_of("test")
    runs = rows("test")
    own = [r for r in runs if r["searcher"] in protocol()["variants"] and r["problem"].split("_")[-1] in tasks]
    seeds = [k for k in range(20) if all(any(r["seed"] == k and r["searcher"] == v and r["problem"] == f"lcbench_{t}"
                                             for r in own) for v in protocol()["variants"] for t in tasks)]
    if seeds != TEST_SEEDS:  # the test is read once, complete: until then validation only
        prov = provenance(seeds=VALIDATION_SEEDS, wall_s=time.time() - t0, selection_split="validation")
        return {OUT: build_result(summary, prov, name=OUT.name, protocol=PROTOCOL, record_reads=record_reads)}
    S = T.score(runs, "test", seeds)
    for key, a, base in (("gp_history_regret_ratio_vs_gp_at_20", "gp_history", "gp"),
                         ("gp_history_regret_ratio_vs_transfer_gp_at_20", "gp_history", "transfer_gp"),
                         ("gp_history_unrelated_regret_ratio_vs_gp_at_20", "gp_history_unrelated", "gp")):
        c = T.compare(S, a, base)
        summary[key] = c["ratio"]
        summary[key.replace("regret_ratio", "wilcoxon_p")] = c["p"]
        summary[key.replace("regret_ratio", "tasks_worse")] = c["worse"]
    summary["test_seeds"] = len(seeds)
    per_budget = {str(b): {v: {"mean_log10_regret": t["mean"], "seeds": t["seeds"], "tasks": t["tasks"]}
                           for v, t in T.table(S, b).items()} for b in (10, 20)}
    prov = provenance(seeds=seeds, wall_s=time.time() - t0)
    return {OUT: build_result(summary, prov, name=OUT.name, protocol=PROTOCOL, targets=TARGETS,
                              reads=[Read("lcbench:test_tasks", PROTOCOL)], record_reads=record_reads,
                              choice=choice, test_table=per_budget)}


def _run(args) -> int:
    cmd_run(args)
    return 0


COMMAND = Command(__doc__.split("\n")[0], run=_run, results=lambda args: build(record_reads=not args.check),
                  add_arguments=T._add_arguments)


def main(argv=None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
