"""Claim (issue 36, deliverable 5): a per-exit {stop, continue} contextual bandit
(``dht_stop_rule: bandit``, :class:`archsearch.dynamic.depth.stop_bandit.BanditStopping`) against the
full-information least-squares stop policy that decides in ``gating: dht`` today.

Protocol ``benchmarks/depth/protocols/stop_bandit.json`` (committed before any run it governs). On the
stored exits of the recipe's multi-exit models (``dht_seeded.py``: 3 seeds, 2 datasets), every
policy of :data:`POLICIES` is fitted -- the bandit *learnt*, seeing only the arms it plays -- and
calibrated on validation rows, as ``dht_stop_fit: validation`` does:

* **selection** (validation only): ``stop_policies.cross_fit_score`` (fit on one half of the
  validation rows, play the other, both ways; accuracy at 0.5x FLOPs), averaged over seeds and
  datasets; the best of :data:`CANDIDATES` is chosen (a tie keeps today's).
* **test**, read once per row after the choice: accuracy at 0.5x and 0.33x per policy; the keys
  of :data:`PAIRS`, each a mean over seeds with a paired bootstrap 95% interval (test rows
  resampled within each seed, the same rows for both policies).

**Learnt during training** (``protocols/stop_bandit_training.json``): ``run`` trains the recipe's
model with ``dht_stop_rule: bandit, dht_stop_fit: train`` (:data:`TRAINED`: the bandit routes
the training rows and learns from the arms it plays; at calibration it is relearnt, with
exploration, from the gating's window of training rows and played greedily), stores its exits
and its stop policy's window, and ``analyze`` replays that calibration on the stored window and
compares it with the default rule on the same model's exits (section ``trained_{dataset}``).

Run: ``python -m benchmarks.depth.stop_bandit [analyze]`` (a few minutes; writes
``benchmarks/depth/results/stop_bandit.json``); ``python -m benchmarks.depth.stop_bandit run --dataset
election_tweets`` trains (about 7 minutes a seed there on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.depth import dht_seeded as ds  # the stored models and their budgets
from benchmarks.depth import stop_policies as sp  # the stop rules' offline replay
from benchmarks.evidence.cli import Command
from benchmarks.evidence.ledger import Read
from benchmarks.evidence.provenance import git_commit, provenance
from benchmarks.evidence.results import build_result
from benchmarks.testbeds import minilm

HERE = Path(__file__).resolve().parent
RESULT = HERE / "results" / "stop_bandit.json"
PROTOCOL = HERE / "protocols" / "stop_bandit.json"
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


#: the model trained with the bandit deciding during training: ``dht-{recipe}-{TRAINED}_seed{s}``
TRAINED = "trainbandit"
TRAINED_CFG = {"dht_stop_rule": "bandit", "dht_stop_fit": "train"}
TRAINED_PROTOCOL = PROTOCOL.with_name("stop_bandit_training.json")
#: summary key: (policy, minus policy) at 0.5x on the trained model (``*_window``: fitted on
#: the window of training rows the gating kept, as ``dht_stop_fit: train`` calibrates)
TRAINED_PAIRS = {"trained_bandit_minus_tuned_pts_at_0.5": ("bandit_window", DEFAULT),
                 "trained_bandit_minus_tuned_window_pts_at_0.5": ("bandit_window", "tuned_window")}


def tables(out: Path, seed: int, recipe: str | None, tag: str = "") -> tuple[dict, dict]:
    """``(validation, test)`` tables of the stored multi-exit model of ``seed``."""
    d = np.load(out / f"{'dht' if recipe is None else f'dht-{recipe}'}{tag}_seed{seed}.npz")
    cost_of = sp.exit_costs(ds.TRAIN["max_len"])
    return sp.split_tables(d, "validation", cost_of), sp.split_tables(d, "test", cost_of)


def paired(test: list[dict], exits: dict[str, list], a: str, b: str, x: float, draws: int) -> tuple[float, list[float]]:
    """Mean over seeds of ``a - b`` at ``x`` FLOPs (points) and its paired bootstrap 95% interval
    (``stop_policies.bootstrap_gain``).

    Args:
        test: per seed the test table; ``exits``: per policy, per seed, the test exits per budget."""
    point = np.mean([sp._curves_at_main(t, exits[a][s], np.arange(len(t["correct"]))[None], x)[0]
                     - sp._curves_at_main(t, exits[b][s], np.arange(len(t["correct"]))[None], x)[0]
                     for s, t in enumerate(test)])
    return 100 * float(point), sp.bootstrap_gain(list(zip(test, exits[a])), list(zip(test, exits[b])), draws, x=x)


def analyze(dumps: dict[str, Path], result: Path = RESULT, draws: int = 2000, seeds=ds.SEEDS,
            record_reads: bool = True) -> dict:
    """Select on validation, then read test once per row; ``result``'s content."""
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
    summary.update(analyze_trained(dumps, draws, seeds))
    prov = provenance(commits=[git_commit()], seeds=list(seeds), selection_split="validation", recipe=recipe,
                      draws=draws, wall_s=time.perf_counter() - t0, budgets=list(ds.BUDGETS))
    sections = {name: TRAINED_PROTOCOL if name.startswith("trained_") else PROTOCOL
                for name, sec in summary.items() if isinstance(sec, dict)}
    return build_result(summary, prov, name=Path(result).name, protocol=sections, record_reads=record_reads,
                        reads=[Read(ds.test_set(name.removeprefix("trained_")), p, name) for name, p in sections.items()])


def trained_exits(out: Path, seed: int, recipe: str, pairs: dict = TRAINED_PAIRS,
                  bandit: str = "bandit") -> tuple[dict, dict[str, list]]:
    """The trained model's test table and, per policy of ``pairs`` (default
    :data:`TRAINED_PAIRS`), its test exits per budget of ``dht_seeded.BUDGETS`` (``*_window``:
    fitted on the stored window of training rows, calibrated on validation; else fitted and
    calibrated on validation); ``bandit``: the replay's rule for ``bandit_window`` (``"bandit"``:
    alpha 0.3, ``"bandit5"``: alpha 5)."""
    import torch

    name = f"dht-{recipe}-{TRAINED}_seed{seed}"
    val, test = tables(out, seed, recipe, f"-{TRAINED}")
    state = torch.load(out / f"{name}.stopping.pt", weights_only=True)
    window = (state["Xs"].numpy().astype(float), state["q"].numpy(), state["c"].numpy())
    policies = {p for pair in pairs.values() for p in pair}
    exits = {}
    for p in sorted(policies):
        rule = p.removesuffix("_window").replace("bandit", bandit)
        fit_on = window if p.endswith("_window") else None
        full = f"{rule}_trajectory_match" if fit_on is not None else p
        exits[p] = [sp.policy_exits(full, val, test, b, fit_on=fit_on) for b in ds.BUDGETS]
    return test, exits


def analyze_trained(dumps: dict[str, Path], draws: int = 2000, seeds=ds.SEEDS) -> dict:
    """Sections ``trained_{dataset}`` for the datasets whose every seed's trained model is stored."""
    recipe = ds.chosen_recipe()
    out_sections = {}
    for name, out in dumps.items():
        if not all((out / f"dht-{recipe}-{TRAINED}_seed{s}.stopping.pt").exists() for s in seeds):
            continue
        got = [trained_exits(out, s, recipe) for s in seeds]
        test = [t for t, _ in got]
        exits = {p: [e[p] for _, e in got] for p in got[0][1]}
        sec = {f"test_acc_{p}_at_0.5": float(np.mean([sp._curves_at_main(t, e, np.arange(len(t["correct"]))[None])[0]
                                                      for t, e in zip(test, exits[p])])) for p in exits}
        for key, (a, b) in TRAINED_PAIRS.items():
            sec[key], sec[f"{key}_ci"] = paired(test, exits, a, b, 0.5, draws)
            print(f"trained {name} {key}: {sec[key]:+.2f} [{sec[key + '_ci'][0]:+.2f}, {sec[key + '_ci'][1]:+.2f}]",
                  flush=True)
        meta = [json.loads((out / f"dht-{recipe}-{TRAINED}_seed{s}.json").read_text()) for s in seeds]
        sec["train_wall_s"] = [m["wall_s"] for m in meta]
        sec["models_commit"] = sorted({m["commit"] for m in meta})
        out_sections[f"trained_{name}"] = sec
    return out_sections


def run(dataset: str, threads: int, seeds=ds.SEEDS) -> None:
    """Train (resumably) the recipe's model with :data:`TRAINED_CFG` on ``dataset``, per seed."""
    recipe = ds.chosen_recipe()
    out = ds.DATASETS[dataset]["dumps"]
    ckpt, data = minilm.load_data({**ds.TRAIN, "dataset": "rotten_tomatoes_sentences" if dataset == "rt"
                               else str(ds.tweets_dir())})
    for s in seeds:
        name = f"dht-{recipe}-{TRAINED}_seed{s}"
        if (out / f"{name}.stopping.pt").exists():
            print(f"{name}: already stored", flush=True)
            continue
        ds.train_and_store(name, ckpt, data, out, threads, extra_cfg=TRAINED_CFG)


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dataset", choices=tuple(ds.CLASSIC), default="election_tweets", help="run: the dataset")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--draws", type=int, default=2000)


def _run(args) -> int:
    run(args.dataset, args.threads)
    return 0


COMMAND = Command(__doc__.split("\n\n")[0], run=_run, add_arguments=_options,
                  results=lambda args: {args.out: analyze({n: d["dumps"] for n, d in ds.CLASSIC.items()}, args.out,
                                                          args.draws, record_reads=not args.check)})


def main(argv: list[str] | None = None) -> int:
    """``run``, ``analyze`` (the default) or ``check``."""
    return COMMAND.main(argv, default="analyze")


if __name__ == "__main__":
    sys.exit(main())
