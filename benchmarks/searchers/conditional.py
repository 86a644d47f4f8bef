"""Conditional (branched) search spaces: does AHTOSampler see inside the branches? (issues 37, 65)

Problem (a define-by-run Optuna objective, two objectives minimised)::

    kind = suggest_categorical("kind", ["a", "b"]);  x = suggest_float("x", 0, 1)
    kind a: g = (ya - 0.3)^2 + (za - 0.7)^2       ya, za = suggest_float(.., 0, 1)
    kind b: g = 0.2 + (yb - 0.5)^2                yb = suggest_float(.., 0, 1)
    f = (1 + g) (cos(x pi / 2), sin(x pi / 2))    (DTLZ2's shape; Deb et al. 2005)

The true front is branch a at ya = 0.3, za = 0.7 (g = 0): a sampler that models only the params
every trial shares (kind, x) draws ya, za at random and rarely gets g near 0. Hypervolume with
reference (1.1, 1.1), normalised by the analytic maximum 1.1^2 - pi / 4.

Samplers, 40 trials, 6 startup trials for every model-based one: ``ahto`` (``AHTOSampler`` at
its defaults: branch params as conditions inferred from the trials), ``ahto_indicators``
(``model_branches="indicators"``: the union of params with "active" indicator columns, the
behaviour issue 37 measured), ``ahto_intersection`` (``model_branches=False``), ``gp`` (Optuna's
``GPSampler``), ``tpe`` (``TPESampler(multivariate=True, group=True)``, Optuna's answer to
branches), ``random``; ``ahto_base`` (``policy="none"``, AHTO without its policy) is run on request
(``--samplers ahto_base``) for ``benchmarks/ahto_policy/protocols/ahto_policy_base.json``. Protocol: ``benchmarks/searchers/protocols/conditional_v2.json``
(committed before its runs; validation seeds 0-9, test seeds 10-29). Rows:
``benchmarks/searchers/runs/conditional_v2_runs.jsonl`` (one per sampler and seed, resumable;
issue 37's ``conditional_runs.jsonl``, protocol ``conditional.json``, stays as it was).
``python -m benchmarks.searchers.searchers analyze`` reads the test seeds for
``ahto_hv_ratio_vs_tpe_group_conditional_at_40`` and ``ahto_hv_ratio_vs_gp_conditional_at_40``
(median HV of ahto over that of tpe / gp at 40) and ``ahto_minus_tpe_hv_conditional_at_40``
(mean paired difference over seeds, bootstrap interval), which it writes into
``searchers.json``: this runner only measures.

    python -m benchmarks.searchers.conditional run --seeds 0-9 --workers 2     # validation
    python -m benchmarks.searchers.conditional run --seeds 10-29 --workers 2   # the test read
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from benchmarks.evidence.cli import Command
from benchmarks.evidence.frontier import hv2_min
from benchmarks.evidence.provenance import git_commit
from benchmarks.evidence.runlog import RunLog

RUNS = Path(__file__).resolve().parent / "runs" / "conditional_v2_runs.jsonl"
PROTOCOL = Path(__file__).resolve().parent / "protocols" / "conditional_v2.json"
SAMPLERS = ("ahto", "ahto_indicators", "ahto_intersection", "gp", "tpe", "random")
VALIDATION_SEEDS = tuple(range(10))
TEST_SEEDS = tuple(range(10, 30))
TRIALS = 40
STARTUP = 6
REF = (1.1, 1.1)
MAX_HV = REF[0] * REF[1] - math.pi / 4


def objective(trial):
    kind = trial.suggest_categorical("kind", ["a", "b"])
    x = trial.suggest_float("x", 0.0, 1.0)
    if kind == "a":
        g = (trial.suggest_float("ya", 0.0, 1.0) - 0.3) ** 2 + (trial.suggest_float("za", 0.0, 1.0) - 0.7) ** 2
    else:
        g = 0.2 + (trial.suggest_float("yb", 0.0, 1.0) - 0.5) ** 2
    return (1 + g) * math.cos(x * math.pi / 2), (1 + g) * math.sin(x * math.pi / 2)


def sampler(name: str, seed: int):
    import optuna

    from archsearch.search import AHTOSampler

    if name == "ahto":
        return AHTOSampler(seed=seed, n_startup_trials=STARTUP)
    if name == "ahto_base":  # the policy off (benchmarks/ahto_policy/protocols/ahto_policy_base.json)
        return AHTOSampler(seed=seed, n_startup_trials=STARTUP, policy="none")
    if name == "ahto_indicators":
        return AHTOSampler(seed=seed, n_startup_trials=STARTUP, model_branches="indicators")
    if name == "ahto_intersection":
        return AHTOSampler(seed=seed, n_startup_trials=STARTUP, model_branches=False)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=STARTUP, warn_independent_sampling=False)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP, multivariate=True, group=True,
                                          warn_independent_sampling=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}")


def hv_curve(values: list[tuple[float, float]]) -> list[float]:
    """Normalised HV after each trial (both objectives minimised, reference REF)."""
    out, pts = [], []
    for v in values:
        pts.append(v)
        out.append(hv2_min(pts, REF) / MAX_HV)
    return out


def _run(job: tuple) -> dict:
    import optuna
    import torch

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name, seed = job
    t0 = time.time()
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler(name, seed))
    study.optimize(objective, n_trials=TRIALS)
    vals = [tuple(t.values) for t in study.trials]
    return {"sampler": name, "seed": seed, "curve": hv_curve(vals), "seconds": time.time() - t0,
            "branch_a": sum(t.params["kind"] == "a" for t in study.trials)}


def read_runs(path: Path = RUNS) -> list[dict]:
    if not Path(path).exists():
        return []
    out = {}
    for line in Path(path).read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        out[(r["sampler"], r["seed"])] = r
    return list(out.values())


def summary(runs: list[dict], seeds=TEST_SEEDS) -> dict:
    """Median normalised HV at 10/20/40 per sampler over the ``seeds`` every sampler has,
    ``ahto_hv_ratio_vs_tpe_group_conditional_at_40``, ``ahto_hv_ratio_vs_gp_conditional_at_40``
    and ``ahto_minus_tpe_hv_conditional_at_40`` (mean paired difference over seeds, its 95%
    bootstrap interval over seeds in ``_ci``; Wilcoxon p in ``_wilcoxon_p``)."""
    import statistics

    import numpy as np

    from benchmarks.evidence.stats import bootstrap_ci, bootstrap_indices, wilcoxon

    keys = ("ahto_hv_ratio_vs_tpe_group_conditional_at_40", "ahto_hv_ratio_vs_gp_conditional_at_40",
            "ahto_minus_tpe_hv_conditional_at_40", "ahto_minus_tpe_hv_conditional_at_40_ci",
            "ahto_minus_tpe_hv_conditional_at_40_wilcoxon_p")
    wanted = set(seeds)
    by = {s: {r["seed"]: r for r in runs if r["sampler"] == s and r["seed"] in wanted} for s in SAMPLERS}
    by = {s: v for s, v in by.items() if v}
    out = {k: None for k in keys}
    common = sorted(set.intersection(*(set(v) for v in by.values()))) if by else []
    if not common:
        return {**out, "table": {}, "seeds": [], "branch_a_median": {}}
    table = {s: {str(b): statistics.median(v[k]["curve"][b - 1] for k in common) for b in (10, 20, 40)}
             for s, v in by.items()}
    if "ahto" in table and "tpe" in table:
        out[keys[0]] = table["ahto"]["40"] / table["tpe"]["40"]
        d = np.array([by["ahto"][k]["curve"][39] - by["tpe"][k]["curve"][39] for k in common])
        out[keys[2]] = float(d.mean())
        out[keys[3]] = bootstrap_ci(d[bootstrap_indices(len(d))].mean(1))
        out[keys[4]] = wilcoxon(d)
    if "ahto" in table and "gp" in table:
        out[keys[1]] = table["ahto"]["40"] / table["gp"]["40"]
    return {**out, "table": table, "seeds": common,
            "branch_a_median": {s: statistics.median(v[k]["branch_a"] for k in common) for s, v in by.items()}}


def cmd_run(args) -> None:
    from multiprocessing import get_context

    done = {(r["sampler"], r["seed"]) for r in read_runs(Path(args.out))}
    jobs = [(s, seed) for seed in args.seeds for s in args.samplers if (s, seed) not in done]
    commit = git_commit()
    print(f"{len(jobs)} runs -> {args.out}", flush=True)
    t0 = time.time()
    with get_context("spawn").Pool(args.workers) as pool:
        for k, r in enumerate(pool.imap_unordered(_run, jobs), 1):
            r["commit"] = commit
            RunLog(args.out).append(r)
            print(f"[{k}/{len(jobs)}] {r['sampler']} seed={r['seed']} hv@10/20/40="
                  f"{r['curve'][9]:.3f}/{r['curve'][19]:.3f}/{r['curve'][39]:.3f} branch a {r['branch_a']}/40 "
                  f"{r['seconds']:.0f}s (elapsed {time.time() - t0:.0f}s)", flush=True)
    print(json.dumps(summary(read_runs(Path(args.out)), seeds=args.seeds), indent=1))


def _add_arguments(p) -> None:
    p.add_argument("--samplers", nargs="+", default=list(SAMPLERS))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default=str(RUNS), help="the run log")


COMMAND = Command(__doc__.split("\n")[0], run=cmd_run, add_arguments=_add_arguments, seeds="0-9")


def main(argv=None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
