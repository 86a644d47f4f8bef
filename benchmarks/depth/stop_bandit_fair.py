"""Claim (issue 63, deliverable 2): the per-exit {stop, continue} LinUCB bandit
(``dht_stop_rule: bandit``) at an exploration scale chosen on validation plays both arms and
comes within 0.3 points of the least-squares rule at 0.5x FLOPs.

Protocol ``benchmarks/depth/protocols/stop_bandit_fair.json`` (committed before any run it
governs). On the stored exits of the recipe's multi-exit models (the same as
``stop_bandit.py``: 3 seeds, rotten_tomatoes_sentences and election_tweets):

* **selection** (validation only): for each alpha of :data:`ALPHAS`,
  ``stop_policies.cross_fit_score`` averaged over seeds and datasets; the highest is chosen (a
  tie keeps the smaller alpha) and becomes ``DHTSettings.dht_alpha``'s default.
* **plays**: per alpha, the bandit learnt on all validation rows at the price calibrated to
  0.5x FLOPs; its plays of stop and continue per exit while learning
  (``BanditStopping.plays``), and ``bandit_continue_share_exit1``.
* **test**, read once after the choice: the chosen alpha minus the least-squares rule
  (``tuned_trajectory_match``) at 0.5x, mean over seeds with a paired bootstrap 95% interval;
  on the model trained with the bandit (``stop_bandit.py``'s ``trainbandit`` models), the bandit
  at the chosen alpha relearnt from the stored window of training rows.

Run: ``python -m benchmarks.depth.stop_bandit_fair analyze`` (minutes on 2 cores; writes
``benchmarks/depth/results/stop_bandit_fair.json``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.depth import dht_seeded as ds
from benchmarks.depth import stop_bandit as sb
from benchmarks.depth import stop_policies as sp
from benchmarks.evidence.cli import Command
from benchmarks.evidence.ledger import Read
from benchmarks.evidence.provenance import git_commit, provenance
from benchmarks.evidence.results import build_result

HERE = Path(__file__).resolve().parent
RESULT = HERE / "results" / "stop_bandit_fair.json"
PROTOCOL = HERE / "protocols" / "stop_bandit_fair.json"
#: exploration scales: today's 0.3, 1, Li et al.'s theory scale for rewards in [0, 1] at
#: delta 0.05 (1 + sqrt(ln(2 / 0.05) / 2) = 2.36, rounded), 5
ALPHAS = (0.3, 1.0, 2.4, 5.0)
TARGETS = {"bandit_minus_least_squares_pts_at_0.5": ">= -0.3", "bandit_continue_share_exit1": ">= 0.2"}


def policy(alpha: float) -> str:
    """The replay's name of the bandit at ``alpha`` (``stop_policies.policy_exits``)."""
    return f"bandit{alpha:g}_trajectory_match"


def plays_at_budget(alpha: float, val: dict, budget: float = 0.5) -> np.ndarray:
    """``(K - 1, 2)`` plays of stop and continue per exit of the bandit at ``alpha`` learnt on
    all of ``val`` at the price calibrated to ``budget``."""
    keep: dict = {}
    sp.policy_exits(policy(alpha), val, val, budget, keep=keep)
    return np.asarray(keep["stop"].plays, dtype=float)


def analyze(dumps: dict[str, Path], result: Path = RESULT, draws: int = 2000, seeds=ds.SEEDS,
            record_reads: bool = True) -> dict:
    """Select alpha on validation, count plays, then read test once; ``result``'s content."""
    t0 = time.perf_counter()
    recipe = ds.chosen_recipe()
    names = [policy(a) for a in ALPHAS]
    scores = {a: [] for a in ALPHAS}
    per_dataset, plays = {}, {}
    for name, out in dumps.items():
        got = [sb.tables(out, s, recipe) for s in seeds]
        per_dataset[name] = got
        for a in ALPHAS:
            scores[a] += [sp.cross_fit_score(policy(a), val, s) for s, (val, _) in zip(seeds, got)]
            plays[(name, a)] = [plays_at_budget(a, val) for val, _ in got]
            share = np.mean([p[0, 1] / p[0].sum() for p in plays[(name, a)]])
            print(f"{name} alpha {a:g}: validation score {np.mean(scores[a][-len(seeds):]):.4f}, "
                  f"continue share at exit 1 {share:.3f}", flush=True)
    score = {a: float(np.mean(v)) for a, v in scores.items()}
    chosen = max(ALPHAS, key=lambda a: (score[a], -a))
    print(f"chosen on validation: alpha {chosen:g}", flush=True)
    summary = {"chosen_alpha": chosen, **{f"val_score_bandit{a:g}": score[a] for a in ALPHAS}}
    for name, got in per_dataset.items():  # test: read once, after the choice
        test = [t for _, t in got]
        exits = {p: [[sp.policy_exits(p, v, t, b) for b in ds.BUDGETS] for v, t in got]
                 for p in [*names, sb.DEFAULT]}
        sec = {f"test_acc_{p}_at_0.5": float(np.mean(
            [sp._curves_at_main(t, e, np.arange(len(t["correct"]))[None], 0.5)[0] for t, e in zip(test, exits[p])]))
            for p in exits}
        key = "bandit_minus_least_squares_pts_at_0.5"
        sec[key], sec[f"{key}_ci"] = sb.paired(test, exits, policy(chosen), sb.DEFAULT, 0.5, draws)
        sec["bandit_continue_share_exit1"] = float(np.mean([p[0, 1] / p[0].sum() for p in plays[(name, chosen)]]))
        sec["plays_stop_continue_per_exit"] = {
            f"{a:g}": np.mean(plays[(name, a)], 0).round(1).tolist() for a in ALPHAS}
        print(f"{name} {key}: {sec[key]:+.2f} [{sec[key + '_ci'][0]:+.2f}, {sec[key + '_ci'][1]:+.2f}]; "
              f"continue share at exit 1 {sec['bandit_continue_share_exit1']:.3f}", flush=True)
        summary[name] = sec
    for name, out in dumps.items():  # the model trained with the bandit deciding
        if not all((out / f"dht-{recipe}-{sb.TRAINED}_seed{s}.stopping.pt").exists() for s in seeds):
            continue
        key = "trained_bandit_minus_least_squares_pts_at_0.5"
        got = [sb.trained_exits(out, s, recipe, {key: ("bandit_window", sb.DEFAULT)}, f"bandit{chosen:g}")
               for s in seeds]
        test = [t for t, _ in got]
        exits = {p: [e[p] for _, e in got] for p in got[0][1]}
        sec = {}
        sec[key], sec[f"{key}_ci"] = sb.paired(test, exits, "bandit_window", sb.DEFAULT, 0.5, draws)
        print(f"trained {name} {key}: {sec[key]:+.2f} [{sec[key + '_ci'][0]:+.2f}, {sec[key + '_ci'][1]:+.2f}]",
              flush=True)
        summary[f"trained_{name}"] = sec
    prov = provenance(commits=[git_commit()], seeds=list(seeds), selection_split="validation", recipe=recipe,
                      draws=draws, wall_s=time.perf_counter() - t0, budgets=list(ds.BUDGETS), alphas=list(ALPHAS))
    sections = [name for name, sec in summary.items() if isinstance(sec, dict)]
    targets = {f"{name}.{k}": t for name in sections if not name.startswith("trained_") for k, t in TARGETS.items()}
    return build_result(summary, prov, name=Path(result).name, protocol=PROTOCOL, targets=targets,
                        record_reads=record_reads,
                        reads=[Read(ds.test_set(name.removeprefix("trained_")), PROTOCOL, name) for name in sections])


def _options(ap) -> None:
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--draws", type=int, default=2000)


COMMAND = Command(__doc__.split("\n\n")[0], add_arguments=_options,
                  results=lambda args: {args.out: analyze({n: d["dumps"] for n, d in ds.CLASSIC.items()}, args.out,
                                                          args.draws, record_reads=not args.check)})


def main(argv: list[str] | None = None) -> int:
    """``analyze`` (the default) or ``check``."""
    return COMMAND.main(argv, default="analyze")


if __name__ == "__main__":
    sys.exit(main())
