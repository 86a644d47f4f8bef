"""Claim (issue 14): which stop policy a cascade of exits should fit on validation rows, read
offline on the exits of real multi-exit models -- why DHT's learnt cascade stopped only at exits
1 and 4, and whether a learnt rule can match DeeBERT's one shared confidence threshold.

Protocol:

* ``dump`` (about 5 minutes per seed on 2 cores): trains, per seed, the multi-exit MiniLM-L6 of
  the ``dynamic_depth.py`` row "dht@0.5, cascade, confidence rule, no head gating" (stop 26:
  ``--exit-heads --exit-loss sum --dht-exit-context --dht-reward prob --dht-min-heads 12
  --dht-routing cascade --dht-stop-fit validation --dht-stop-rule confidence``; 1 epoch of
  rotten_tomatoes_sentences, lr 5e-5, batch 32) through the trainable's own loop, and stores
  every exit's class probabilities on the validation (1,056) and test (1,058) rows, the labels
  and each row's padded length in ``benchmarks/depth/runs/cascade_exits/seed{N}.npz``, with the
  commit, command and machine in ``seed{N}.json``. A seed already dumped is not re-run.
* ``analyze`` (seconds): per seed and per policy, the policy is fitted on the validation rows
  and calibrated there by bisection (on the price, for the fitted policies, then on one offset
  added to every exit's threshold when the price alone misses by more than 0.005, as
  :meth:`DHTGating.calibrate` does; on the threshold, for the shared one) to each budget in
  ``BUDGETS``; it is then played on the test rows.
  FLOPs are the analytic FLOPs of the blocks each row runs at its padded length
  (:func:`archsearch.models.costs.flops_per_sample`), as a fraction of the full model's. A
  policy's number at 0.5x is its test accuracy interpolated at 0.5 test FLOPs on its own
  accuracy-vs-FLOPs curve over the budgets (so that policies are compared at equal FLOPs), and
  also its test accuracy at the validation budget 0.5 itself (``at_budget``).
* Policies (the fitted ones are :class:`archsearch.dynamic.depth.stopping.LinearStopping`, fitted by
  backward induction at a price, exactly as DHT's calibration fits them):

  - ``shared_threshold``: a row stops at the first exit whose max probability reaches one
    threshold (DeeBERT, Xin et al. 2020, §2) -- the rule of ``gating: confidence_exit``
    (:class:`archsearch.dynamic.depth.confidence_exit.ConfidenceExitGating`) and the ``confidence``
    baseline of dynamic_depth.py. Every policy's exits come from
    :func:`archsearch.dynamic.depth.exits.first_stop` (the offline twin of the cascade);
  - ``confidence_prob``: a threshold per exit on the max probability (``dht_stop_rule:
    confidence``), an exit's quality = its probability of the deepest exit's class (what DHT
    fitted before stop 27, ``dht_stop_quality: prob``);
  - ``confidence_match``: the same, quality = 1 if the exit's class is the deepest exit's
    (``dht_stop_quality: match``);
  - ``confidence_labels``: the same, quality = 1 if the exit is right (uses validation labels;
    an upper reference for label-free fitting);
  - ``tuned_trajectory_match``: ``dht_stop_rule: tuned`` on the trajectory context (max
    probability, entropy / log C, class equals the previous exit's, equals the previous two,
    previous max probability, 1: ``dht_stop_context: trajectory``), quality ``match``.

* Selection (issue 36; ``benchmarks/depth/protocols/stop_policies.json``): on validation only. Per
  seed the validation rows are split in two halves; each policy is fitted and calibrated on one
  half and played on the other, both ways (:func:`cross_fit_score`); ``val_acc_at_0.5x`` is the
  mean over folds and seeds, and the highest is ``selected_on_validation`` (a tie goes to
  ``shared_threshold``). Before issue 36 the policies were ranked by test accuracy.
* Intervals: each gain over ``shared_threshold`` gets a paired bootstrap 95% interval
  (:func:`bootstrap_gain`: the test rows resampled once per draw, the same rows for both
  policies and every seed: the seeds share one test set).

``summary`` (``benchmarks/depth/results/stop_policies.json``): per policy, the cross-fitted validation
accuracy at 0.5x (``val_acc_at_0.5x``), the test accuracy at 0.5x FLOPs (mean over seeds,
``test_acc_at_0.5x``, and ``std``) and the gain over ``shared_threshold`` in points (mean over
seeds) with its ``_ci``; ``selected_on_validation`` and its gain with ``_ci``; ``per_seed``: each seed's accuracy at 0.5x,
the test accuracy and FLOPs at the validation budget 0.5, and the test depth histogram there
(summed over seeds); ``curves``: every policy's test (FLOPs, accuracy) points per seed.

Run: ``python -m benchmarks.depth.stop_policies dump --seeds 0 1 2`` then ``python
benchmarks/depth/stop_policies.py analyze``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.evidence import stats
from benchmarks.evidence.cli import Command
from benchmarks.evidence.ledger import Read
from benchmarks.evidence.provenance import git_commit, machine, provenance
from benchmarks.evidence.results import build_result
from benchmarks.testbeds import minilm

HERE = Path(__file__).resolve().parent
DUMPS = HERE / "runs" / "cascade_exits"
RESULT = HERE / "results" / "stop_policies.json"
#: the selection rule (issue 36), and the method as this docstring stated it before (its prose)
PROTOCOL = HERE / "protocols" / "stop_policies.json"
METHOD = HERE / "protocols" / "stop_policies_method.json"
TEST_SET = "rt_sentences:test"
BUDGETS = (0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65)
MAIN = 0.5
K = 6  # exits of MiniLM-L6
POLICIES = ("shared_threshold", "confidence_prob", "confidence_match", "confidence_labels",
            "tuned_trajectory_match")
#: the dynamic_depth.py protocol of the dumped model (its dht@0.5 row of stop 26)
MODEL_CFG = {"lr": 5e-05, "dropout": 0.1, "weight_decay": 0.01, "exit_heads": True, "exit_loss": "sum",
             "dht_exit_context": True, "min_heads": 12, "dht_reward": "prob", "dht_routing": "cascade",
             "dht_stop_fit": "validation", "dht_stop_rule": "confidence", "gating": "dht",
             "flops_budget": MAIN, "dht_warmup_steps": 50,
             "dht_routed_forward": "separate"}  # how these runs trained (the default since gpu.json: shared)


# ------------------------------------------------------------------------------------- dump
def exit_probs(model, x, mask):
    """``B x K x C`` class probabilities of every exit of ``model`` (a multi-exit MiniLM)."""
    import torch

    return torch.stack([e.softmax(-1) for e in minilm.layer_exits(model, x, mask)], 1)


def split_outputs(loop, probs) -> dict[str, np.ndarray]:
    """A trained trial loop's outputs on its validation and test rows, in their batch order:
    ``{split}_p`` (``probs(model, x, mask)`` per batch, concatenated), the labels ``{split}_y``
    and each row's padded length ``{split}_T``, for ``np.savez``."""
    import torch

    model = loop.model
    model.eval()
    arrays = {}
    with torch.inference_mode():
        for split in ("validation", "test"):
            P, Y, T = [], [], []
            for x, mask, y in loop.eval_batches(split):
                P.append(probs(model, x, mask).numpy())
                Y.append(y.numpy())
                T += [x.shape[1]] * len(y)
            arrays.update({f"{split}_p": np.concatenate(P), f"{split}_y": np.concatenate(Y),
                           f"{split}_T": np.array(T)})
    return arrays


def dump(seeds: list[int], out: Path, threads: int) -> None:
    import torch

    from archsearch.tune.trainable import TrialLoop

    torch.set_num_threads(threads)
    protocol = {"max_len": 48, "lr": 5e-05, "batch_size": 32, "epochs": 1, "train_samples": None}
    ckpt, data = minilm.load_data(protocol)
    steps = math.ceil(len(data.train) / protocol["batch_size"])
    out.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        if (out / f"seed{seed}.npz").exists():
            print(f"seed {seed}: already dumped", flush=True)
            continue
        t0 = time.perf_counter()
        cfg = {"init_from": ckpt, "warmup_steps": max(1, steps // 10), **MODEL_CFG}
        loop = TrialLoop(cfg, data, {"epochs": 1, "batch_size": protocol["batch_size"], "seed": seed})
        while loop.epoch < 1:
            loop.train_epoch()
        cascade = loop.evaluate("test")["accuracy"]
        np.savez_compressed(out / f"seed{seed}.npz", **split_outputs(loop, exit_probs))
        meta = {"seed": seed, "commit": git_commit(), "command": " ".join(["python", *sys.argv]),
                "machine": machine(), "model_cfg": MODEL_CFG, "protocol": protocol,
                "cascade_test_accuracy": cascade, "wall_s": round(time.perf_counter() - t0, 1)}
        (out / f"seed{seed}.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"seed {seed}: dumped in {meta['wall_s']} s (cascade test accuracy {cascade:.4f})", flush=True)


# ---------------------------------------------------------------------------------- analyze
def split_tables(d, split: str, cost_of) -> dict[str, np.ndarray]:
    """Per row of ``split``: its label ``y``, exits' max probability, entropy, class, qualities
    and FLOPs costs."""
    p, y, T = d[f"{split}_p"].astype(np.float64), d[f"{split}_y"], d[f"{split}_T"]  # (N, K, C), (N,), (N,)
    cls = p.argmax(-1)  # (N, K)
    rows = np.arange(len(y))
    return {"p": p, "maxp": p.max(-1), "ent": -(p * np.log(np.clip(p, 1e-12, None))).sum(-1) / math.log(p.shape[-1]),
            "y": y, "cls": cls, "correct": (cls == y[:, None]).astype(float),
            "match": (cls == cls[:, -1:]).astype(float),
            "prob": p[rows, :, cls[:, -1]],  # (N, K): each exit's probability of the deepest exit's class
            "cost": np.stack([cost_of(int(t)) for t in T])}  # (N, K) FLOPs fractions


def trajectory(t: dict) -> np.ndarray:
    """``N x K x 6`` trajectory contexts, exit by exit as ``DHTGating._stop_context`` builds
    them (:func:`archsearch.dynamic.depth.stopping.trajectory_context`)."""
    from archsearch.dynamic.depth.stopping import trajectory_context

    out, prev = [], None
    for k in range(t["p"].shape[1]):
        X, prev = trajectory_context(t["p"][:, k], prev)
        out.append(X)
    return np.stack(out, 1)


def play(t: dict, exits: np.ndarray) -> tuple[float, float, np.ndarray]:
    """(accuracy, FLOPs fraction, depth histogram) of rows stopping at ``exits`` (``N`` ints)."""
    rows = np.arange(len(exits))
    return (float(t["correct"][rows, exits].mean()), float(t["cost"][rows, exits].sum() / t["cost"][:, -1].sum()),
            np.bincount(exits, minlength=K))


def policy_exits(name: str, val: dict, test: dict, budget: float, fit_on: tuple | None = None,
                 keep: dict | None = None) -> np.ndarray:
    """Test exits of policy ``name`` fitted and calibrated on ``val`` to ``budget``; with
    ``fit_on`` = ``(Xs, q, c)`` (``N x K x d``, ``N x K``, ``N x K``; e.g. a trained gating's
    window of training rows) fitted on those rows instead and calibrated on ``val``, as
    ``dht_stop_fit: train`` does. ``keep``: a dict that receives the fitted stop policy
    (``"stop"``; a bandit's ``plays`` are those of its fit at the calibrated price)."""
    from archsearch.dynamic.budget import calibrate_monotone, calibrate_price
    from archsearch.dynamic.depth.exits import first_stop
    from archsearch.dynamic.depth.stopping import LinearStopping

    if name == "shared_threshold":  # ConfidenceExitGating's rule, replayed on the stored exits
        def first(t, thr):
            return first_stop(t["maxp"] >= thr)

        thr, _ = calibrate_monotone(lambda c: play(val, first(val, c))[1], budget, 0.0, 1.0, iters=40,
                                    decreasing=False)
        return first(test, thr)
    rule, quality = name.split("_")[0], name.split("_")[-1]
    if "trajectory" in name:
        Xv, Xt = trajectory(val), trajectory(test)
    else:  # (max probability, 1): the confidence rule reads column 0
        Xv, Xt = (np.stack([t["maxp"], np.ones_like(t["maxp"])], -1) for t in (val, test))
    q = {"prob": val["prob"], "match": val["match"], "labels": val["correct"]}[quality]
    if rule.startswith("bandit"):  # "bandit" (alpha 0.3 = dht_alpha, as stop_bandit.json ran) or "bandit{alpha}"
        from archsearch.dynamic.depth.dht import DHTSettings
        from archsearch.dynamic.depth.stop_bandit import BanditStopping

        alpha = float(rule.removeprefix("bandit") or DHTSettings.model_fields["dht_alpha"].default)
        stop = BanditStopping(K, Xv.shape[-1], alpha=alpha, score_col=0, window=len(q))
    else:
        stop = LinearStopping(K, Xv.shape[-1], rule=rule, score_col=0, window=len(q))

    def fraction(price):
        stop.fit(price, data=fit_on or (Xv, q, val["cost"]))
        return play(val, stop.route(Xv, val["cost"], price))[1]

    price, frac = calibrate_price(fraction, budget)
    frac = fraction(price)  # the policy of the calibrated price, fitted
    if abs(frac - budget) > 0.005:  # as DHTGating.calibrate: one offset on every threshold
        stop.calibrate_offset(lambda: play(val, stop.route(Xv, val["cost"], price))[1], budget, frac)
    if keep is not None:
        keep["stop"] = stop
    return stop.route(Xt, test["cost"], price)


def _rows(t: dict, idx: np.ndarray) -> dict:
    """The table ``t`` restricted to rows ``idx``."""
    return {k: v[idx] for k, v in t.items()}


def _acc_at_main(t: dict, exits_per_budget: list[np.ndarray]) -> float:
    """Accuracy interpolated at ``MAIN`` FLOPs on the curve of ``exits_per_budget`` (all rows)."""
    return float(_curves_at_main(t, exits_per_budget, np.arange(len(t["correct"]))[None])[0])


def cross_fit_score(name: str, val: dict, seed: int) -> float:
    """Validation score of policy ``name`` (the selection rule, benchmarks/depth/protocols/
    stop_policies.json): fitted and calibrated on one half of the validation rows at every
    budget, played on the other half, both ways; accuracy at ``MAIN`` FLOPs, mean of the folds."""
    perm = np.random.default_rng(seed).permutation(len(val["correct"]))
    halves = perm[: len(perm) // 2], perm[len(perm) // 2:]
    scores = []
    for fit, held in (halves, halves[::-1]):
        a, b = _rows(val, fit), _rows(val, held)
        scores.append(_acc_at_main(b, [policy_exits(name, a, b, q) for q in BUDGETS]))
    return float(np.mean(scores))


def _curves_at_main(t: dict, exits_per_budget: list[np.ndarray], idx: np.ndarray, x: float = MAIN) -> np.ndarray:
    """``(D,)`` accuracies at ``x`` FLOPs (default ``MAIN``), one per row resample ``idx[d]``
    (``D x N``), each interpolated on its own accuracy-vs-FLOPs curve over the budgets."""
    rows = np.arange(len(t["correct"]))
    full = t["cost"][:, -1][idx].sum(1)  # (D,)
    acc = np.stack([t["correct"][rows, ex][idx].mean(1) for ex in exits_per_budget], 1)  # (D, B)
    frac = np.stack([t["cost"][rows, ex][idx].sum(1) / full for ex in exits_per_budget], 1)  # (D, B)
    order = np.argsort(frac, 1, kind="stable")
    acc, frac = np.take_along_axis(acc, order, 1), np.take_along_axis(frac, order, 1)
    return np.array([np.interp(x, f, a) for f, a in zip(frac, acc)])


def bootstrap_gain(chosen: list, base: list, draws: int = 2000, seed: int = 0, x: float = MAIN) -> list[float]:
    """Paired bootstrap 95% interval (points) of the mean over seeds of chosen - base at ``x``
    FLOPs (default ``MAIN``): the test rows resampled with replacement once per draw and applied
    to both policies of every seed (the seeds share one test set: rows drawn per seed would
    treat their test sets as independent and narrow the interval).

    Args:
        chosen, base: per seed ``(test table, exits per budget)`` of the two policies.

    Raises:
        ValueError: the seeds' test tables differ in rows."""
    gains = np.zeros(draws)
    y0 = chosen[0][0]["y"]
    if any(not np.array_equal(t["y"], y0) for t, _ in chosen):
        raise ValueError("the seeds' test tables differ in rows: one shared test set expected")
    n = len(y0)
    idx = stats.bootstrap_indices(n, draws, seed)
    for (t, ex_c), (_, ex_b) in zip(chosen, base, strict=True):
        gains += _curves_at_main(t, ex_c, idx, x) - _curves_at_main(t, ex_b, idx, x)
    out = 100 * gains / len(chosen)
    return stats.bootstrap_ci(out)


def exit_costs(max_len: int = 48):
    """``cost_of(T)``: the ``K`` exits' analytic FLOPs as fractions of MiniLM-L6's full depth at
    padded length ``T`` (:func:`benchmarks.testbeds.minilm.exit_costs`), cached per ``T``."""
    return minilm.exit_costs(max_len, K)


def analyze(dumps: Path, out: Path = RESULT, record_reads: bool = True) -> dict:
    """``out``'s content from the exits stored in ``dumps`` (raises ValueError when there are none)."""
    t0 = time.perf_counter()
    metas = [json.loads(f.read_text()) for f in sorted(dumps.glob("seed*.json"))]
    if not metas:
        raise ValueError(f"no dumps in {dumps}: run `python -m benchmarks.depth.stop_policies run` first")
    cost_of = exit_costs()
    per = {p: {"at_0.5": [], "at_budget": [], "flops_at_budget": [], "hist": np.zeros(K, int), "val": []}
           for p in POLICIES}
    curves = {p: {} for p in POLICIES}
    test_exits: dict[str, list] = {p: [] for p in POLICIES}  # per seed: (test table, exits per budget)
    for meta in metas:
        d = np.load(dumps / f"seed{meta['seed']}.npz")
        val, test = split_tables(d, "validation", cost_of), split_tables(d, "test", cost_of)
        for p in POLICIES:
            per[p]["val"].append(cross_fit_score(p, val, int(meta["seed"])))
            pts, by_budget = [], []
            for b in BUDGETS:
                exits = policy_exits(p, val, test, b)
                by_budget.append(exits)
                acc, frac, hist = play(test, exits)
                pts.append((frac, acc))
                if b == MAIN:
                    per[p]["at_budget"].append(acc)
                    per[p]["flops_at_budget"].append(frac)
                    per[p]["hist"] += hist
            test_exits[p].append((test, by_budget))
            pts.sort()
            per[p]["at_0.5"].append(_acc_at_main(test, by_budget))
            curves[p][str(meta["seed"])] = [{"flops_ratio": f, "test_accuracy": a} for f, a in pts]
    base = np.array(per["shared_threshold"]["at_0.5"])
    summary, details = {}, {}
    print(f"{'policy':24s} {'acc@0.5x (per seed)':>30s} {'mean':>7s} {'gain pts':>8s}  hist at budget 0.5")
    for p in POLICIES:
        a = np.array(per[p]["at_0.5"])
        summary[p] = {"val_acc_at_0.5x": float(np.mean(per[p]["val"])),
                      "test_acc_at_0.5x": float(a.mean()), "std": float(a.std(ddof=1)) if len(a) > 1 else None,
                      "gain_over_shared_threshold_pts": float(100 * (a - base).mean())}
        details[p] = {"test_acc_at_0.5x_per_seed": a.tolist(),
                      "test_acc_at_val_budget_0.5": per[p]["at_budget"],
                      "test_flops_at_val_budget_0.5": per[p]["flops_at_budget"],
                      "depth_hist_at_val_budget_0.5": per[p]["hist"].tolist()}
        print(f"{p:24s} {' '.join(f'{x:.4f}' for x in a):>30s} {a.mean():7.4f} {100 * (a - base).mean():8.2f}  "
              f"{per[p]['hist'].tolist()}")
    for p in POLICIES[1:]:  # every policy's gain with its interval, the same paired bootstrap
        summary[p]["gain_over_shared_threshold_pts_ci"] = bootstrap_gain(test_exits[p], test_exits["shared_threshold"])
    # the selection: validation only (a tie goes to the simpler shared threshold, listed first)
    chosen = max(POLICIES, key=lambda p: (summary[p]["val_acc_at_0.5x"], p == "shared_threshold"))
    summary["selected_on_validation"] = chosen
    summary["selected_gain_over_shared_threshold_pts"] = summary[chosen]["gain_over_shared_threshold_pts"]
    summary["selected_gain_over_shared_threshold_pts_ci"] = summary[chosen].get(
        "gain_over_shared_threshold_pts_ci", [0.0, 0.0])
    print(f"selected on validation: {chosen}; its test gain {summary['selected_gain_over_shared_threshold_pts']:+.2f} "
          f"pts, 95% CI {summary['selected_gain_over_shared_threshold_pts_ci']}")
    prov = provenance(commits=[m["commit"] for m in metas] + [git_commit()], seeds=[m["seed"] for m in metas],
                      selection_split="validation",
                      wall_s=time.perf_counter() - t0, dumps={str(m["seed"]): {k: m[k] for k in (
                          "commit", "command", "wall_s", "cascade_test_accuracy")} for m in metas},
                      budgets=list(BUDGETS))
    return build_result(summary, prov, name=Path(out).name, protocol={"selection": PROTOCOL, "method": METHOD},
                        reads=[Read(TEST_SET, PROTOCOL)], record_reads=record_reads, per_seed=details, curves=curves)


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dumps", type=Path, default=DUMPS, help="directory of the exits' dumps (default %(default)s)")
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--threads", type=int, default=2)


def _run(args) -> int:
    """``run`` (was ``dump``): train and store the seeds' exits."""
    dump(args.seeds, args.dumps, args.threads)
    return 0


COMMAND = Command(__doc__.split("\n")[0], run=_run, add_arguments=_options, seeds="0-2",
                  results=lambda args: {args.out: analyze(args.dumps, args.out, record_reads=not args.check)})


def main(argv: list[str] | None = None) -> int:
    """``run`` (``dump``: its old name), ``analyze`` or ``check``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "dump":
        argv[0] = "run"
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
