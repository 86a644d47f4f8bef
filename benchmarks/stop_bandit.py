"""Claim (issue 36, deliverable 5): a per-exit {stop, continue} contextual bandit
(``dht_stop_rule: bandit``, :class:`archsearch.dynamic.stop_bandit.BanditStopping`) against the
full-information least-squares stop policy that decides in ``gating: dht`` today.

Protocol ``benchmarks/protocols/stop_bandit.json`` (committed before any run it governs). On the
stored exits of the recipe's multi-exit models (``dht_seeded.py``: 3 seeds, 2 datasets), every
policy of :data:`POLICIES` is fitted -- the bandit *learnt*, seeing only the arms it plays -- and
calibrated on validation rows, as ``dht_stop_fit: validation`` does:

* **selection** (validation only): ``stop_policies.cross_fit_score`` (fit on one half of the
  validation rows, play the other, both ways; accuracy at 0.5x FLOPs), averaged over seeds and
  datasets; the best of :data:`CANDIDATES` is chosen (a tie keeps today's).
* **test**, read once per row after the choice: accuracy at 0.5x and 0.33x per policy; the keys
  of :data:`PAIRS`, each a mean over seeds with a paired bootstrap 95% interval (test rows
  resampled within each seed, the same rows for both policies).

Run: ``python benchmarks/stop_bandit.py`` (a few minutes; writes
``benchmarks/results/stop_bandit.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, git_commit, provenance, write_result  # noqa: E402

import dht_seeded as ds  # noqa: E402  the stored models and their budgets
import stop_policies as sp  # noqa: E402  the stop rules' offline replay

RESULT = ROOT / "benchmarks" / "results" / "stop_bandit.json"
PROTOCOL = ROOT / "benchmarks" / "protocols" / "stop_bandit.json"
DEFAULT = "tuned_trajectory_match"
BANDIT = "bandit_trajectory_match"
CANDIDATES = (DEFAULT, "regression_trajectory_match", BANDIT)
#: the candidates, then two exploration ablations (alpha 0 and 1), not candidates
POLICIES = (*CANDIDATES, "bandit0_trajectory_match", "bandit1_trajectory_match")
#: summary key: (policy, minus policy, FLOPs fraction)
PAIRS = {"bandit_minus_tuned_pts_at_0.5": (BANDIT, DEFAULT, 0.5),
         "bandit_minus_tuned_pts_at_0.33": (BANDIT, DEFAULT, 1 / 3),
         "bandit_minus_regression_pts_at_0.5": (BANDIT, "regression_trajectory_match", 0.5),
         "bandit_minus_bandit0_pts_at_0.5": (BANDIT, "bandit0_trajectory_match", 0.5)}


def tables(out: Path, seed: int, recipe: str | None) -> tuple[dict, dict]:
    """``(validation, test)`` tables of the stored multi-exit model of ``seed``."""
    d = np.load(out / f"{'dht' if recipe is None else f'dht-{recipe}'}_seed{seed}.npz")
    cost_of = sp.exit_costs(ds.TRAIN["max_len"])
    return sp.split_tables(d, "validation", cost_of), sp.split_tables(d, "test", cost_of)


def paired(test: list[dict], exits: dict[str, list], a: str, b: str, x: float, draws: int) -> tuple[float, list[float]]:
    """Mean over seeds of ``a - b`` at ``x`` FLOPs (points) and its paired bootstrap 95% interval.

    Args:
        test: per seed the test table; ``exits``: per policy, per seed, the test exits per budget."""
    rng = np.random.default_rng(0)
    point, boot = 0.0, np.zeros(draws)
    for s, t in enumerate(test):
        n = len(t["correct"])
        for idx, acc in ((np.arange(n)[None], None), (rng.integers(0, n, (draws, n)), boot)):
            g = sp._curves_at_main(t, exits[a][s], idx, x) - sp._curves_at_main(t, exits[b][s], idx, x)
            if acc is None:
                point += float(g[0]) / len(test)
            else:
                boot += g / len(test)
    return 100 * point, [float(np.percentile(100 * boot, 2.5)), float(np.percentile(100 * boot, 97.5))]


def analyze(dumps: dict[str, Path], result: Path, draws: int = 2000, seeds=ds.SEEDS) -> int:
    """Select on validation, then read test once per row; write ``result``."""
    t0 = time.perf_counter()
    recipe = ds.chosen_recipe()
    val_scores = {p: [] for p in POLICIES}  # over (dataset, seed)
    per_dataset = {}
    for name, out in dumps.items():
        got = [tables(out, s, recipe) for s in seeds]
        for p in POLICIES:
            for s, (val, _) in zip(seeds, got):
                val_scores[p].append(sp.cross_fit_score(p, val, s))
            print(f"{name} {p}: validation score {np.mean(val_scores[p][-len(seeds):]):.4f}", flush=True)
        per_dataset[name] = got
    score = {p: float(np.mean(v)) for p, v in val_scores.items()}
    chosen = max(CANDIDATES, key=lambda p: (score[p], p == DEFAULT))
    print(f"chosen on validation: {chosen}", flush=True)
    summary = {"chosen": chosen, "chosen_rule": chosen.split("_")[0],
               **{f"val_score_{p}": score[p] for p in POLICIES}}
    pairs = {**PAIRS, "chosen_minus_tuned_pts_at_0.5": (chosen, DEFAULT, 0.5)}
    for name, got in per_dataset.items():  # test: read once, after the choice
        test = [t for _, t in got]
        exits = {p: [[sp.policy_exits(p, v, t, b) for b in ds.BUDGETS] for v, t in got] for p in POLICIES}
        sec = {}
        for p in POLICIES:
            for x, tag in ((0.5, "0.5"), (1 / 3, "0.33")):
                sec[f"test_acc_{p}_at_{tag}"] = float(np.mean(
                    [sp._curves_at_main(t, e, np.arange(len(t["correct"]))[None], x)[0] for t, e in zip(test, exits[p])]))
        for key, (a, b, x) in pairs.items():
            sec[key], sec[f"{key}_ci"] = paired(test, exits, a, b, x, draws)
            print(f"{name} {key}: {sec[key]:+.2f} [{sec[key + '_ci'][0]:+.2f}, {sec[key + '_ci'][1]:+.2f}]", flush=True)
        summary[name] = sec
    prov = provenance(commits=[git_commit()], seeds=list(seeds), selection_split="validation",
                      protocol=json.loads(PROTOCOL.read_text()), recipe=recipe, draws=draws,
                      wall_s=time.perf_counter() - t0, budgets=list(ds.BUDGETS))
    write_result(result, summary, prov)
    print(f"wrote {result}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--draws", type=int, default=2000)
    args = ap.parse_args(argv)
    return analyze({n: d["dumps"] for n, d in ds.DATASETS.items()}, args.out, args.draws)


if __name__ == "__main__":
    sys.exit(main())
