"""The search loop every searcher benchmark runs: ask, evaluate, tell, and the hypervolume after
each trial (``benchmarks.searchers.searchers``, ``benchmarks.ahto_policy.episodes``)."""

from __future__ import annotations

import time


def run_one(problem, searcher: str, seed: int, budget: int = 80, core=None) -> dict:
    """One search of ``budget`` trials; returns the run's JSON line (without commit/seconds).

    Args:
        problem: ``benchmarks.searchers.searchers``' ``Replay`` or ``Synthetic``, an
            :class:`benchmarks.testbeds.lcbench.LCBenchProblem`, or anything with ``name``, ``space``,
            ``cost_fn``, ``ref``, ``max_hv``, ``evaluate``, ``objectives``, ``feasible`` (and
            ``table`` + ``nearest`` for a replay table).
        searcher: a name for :func:`archsearch.search.make`.
        core: a searcher object to use instead of ``make(searcher, ...)`` (tests: a broken one).
    """
    import torch

    from archsearch.pareto import hypervolume
    from archsearch.search import make

    # the same call as the CLI's (archsearch.tune.searchers.build_core)
    s = core if core is not None else make(searcher, problem.space, seed=seed, cost_fn=problem.cost_fn)
    table = getattr(problem, "table", None)
    restricted = table is not None and bool(getattr(s, "supports_restriction", False))
    if restricted:
        s.restrict_configurations(table)
    ys, hv, secs, cpu, sources, decided, changed, rows = [], [], [], [], [], [], [], []
    offtable = repeats = failed = 0
    for _ in range(budget):
        t0, c0 = time.perf_counter(), time.process_time()
        tid, cfg = s.ask()
        secs.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        extra = (getattr(s, "pending", {}).get(tid) or {}).get("extra") or {}
        sources.append(extra.get("source"))
        decided.append(extra.get("decided_by"))
        changed.append(extra.get("policy_changed"))
        if table is not None:
            i, dist = problem.nearest(cfg)
            offtable += dist > 1e-9
            repeats += i in rows
            rows.append(i)
        ran, metrics, err = problem.evaluate(cfg)
        if err:
            failed += 1
            s.tell(tid, None, error=True, config=ran)
        else:
            s.tell(tid, metrics, config=ran)
            if problem.feasible(metrics):
                ys.append(problem.objectives(metrics))
        hv.append(hypervolume(ys, ["max"] * len(problem.ref), problem.ref) if ys else 0.0)
    return {"problem": problem.name, "searcher": searcher, "seed": seed, "budget": budget,
            "curve": [v / problem.max_hv for v in hv], "hv": hv, "max_hv": problem.max_hv,
            "max_hv_method": getattr(problem, "max_hv_method", None),
            "restricted": restricted, "asks": budget, "offtable": int(offtable), "repeats": int(repeats),
            "failed": failed, "rows": rows if table is not None else None,
            "n_table": len(table) if table is not None else None,
            "sources": sources, "decided_by": decided, "policy_changed": changed,
            "ask_seconds": secs, "ask_cpu_seconds": cpu, "torch_threads": torch.get_num_threads()}
