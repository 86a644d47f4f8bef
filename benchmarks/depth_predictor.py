"""Claim: adaptive depth (structure predictor + RevPC + per-sample early exit, ``gating:
depth_predictor``) makes inference faster at (almost) the accuracy of the static model, and gamma
trades speed for accuracy (seed: Li, Li and Wang, "From Static to Dynamic": ALBERT-base 1.68x
faster at a GLUE average of 85.3 vs 84.4).

Setup: rotten_tomatoes_sentences (BPE 8000, max 48 tokens), from-scratch pre-LN encoders trained
with the real trainable (:func:`archsearch.tune.trainable.run_trial`): ``static`` and
``depth_predictor`` with gamma in {0.1, 0.5, 0.9}, 3 seeds each (same seed = same init and data
order), plus a reference row: a static model only ``min_layers`` (= the shallowest exit) deep,
to show what the adaptive model's savings are worth against simply training a shallower model. The MiniLM fine-tune of the issue is skipped: it needs the checkpoint loader
(``init_from``) that is not in the tree yet.

Measured per seed after training, all models in eval mode under ``torch.inference_mode``:

* ``accuracy`` (validation, the trainable's metric) and ``test_accuracy``;
* ``flops_per_sample`` executed (the trainable's metric: the cost model at each sample's exit
  depth + the predictor) and the ratio static / adaptive;
* inference speedup = static time / adaptive time, both through their strategy's ``predict``:
  batch 32 over the whole validation split (each batch trimmed to its longest row, as evaluation
  does), batch 1 over the first ``B1_SAMPLES`` validation rows. Static and adaptive passes are
  interleaved (``REPEATS`` rounds) and the median pass time is used, because the machine is shared
  with other jobs and wall-clock is noisy.

Summary (over seeds: accuracy drop = mean static accuracy - mean adaptive accuracy, in points;
speedups = mean of the per-seed ratios): ``best_speedup_within_0.5pt`` = the largest batch-32
speedup over the gammas whose accuracy drop is <= 0.5 points (``null`` when none is), and
``gamma_curve``. Also writes ``benchmarks/results/depth_predictor.png`` (speedup and accuracy vs
gamma).

Run: ``nice -n 10 python benchmarks/depth_predictor.py`` (about 30-40 minutes on the shared 2-core
machine; ``--quick`` is a short smoke run that writes only /tmp/depth_predictor_quick.png).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from archsearch.data import prepare
from archsearch.dynamic.base import GatingStrategy
from archsearch.tune.trainable import run_trial
from common import provenance, write_result  # benchmarks/common.py (sibling module)

RESULTS = Path(__file__).resolve().parent / "results"
GAMMAS = [0.1, 0.5, 0.9]
SEEDS = [0, 1, 2]
THREADS = 1  # training and timing; the machine's 2 cores are shared with other jobs
MODEL = {"n_layers": 4, "d_model": 64, "n_heads": 2, "d_ffn_mult": 4, "dropout": 0.1,
         "lr": 1e-3, "weight_decay": 0.01, "warmup_steps": 50, "min_layers": 1}
EPOCHS = 2
BATCH = 64
REPEATS = 5
B1_SAMPLES = 128


def trimmed_batches(split, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive ``(ids, mask)`` batches, each cut to its longest row (as evaluation runs)."""
    from archsearch.models.config import trim_padding

    return [trim_padding(split.input_ids[i:i + batch_size], split.attention_mask[i:i + batch_size])
            for i in range(0, len(split), batch_size)]


def pass_seconds(gating: GatingStrategy, batches) -> float:
    """Wall time of one inference pass of ``gating.predict`` over ``batches``."""
    t0 = time.perf_counter()
    for ids, mask in batches:
        gating.predict(ids, mask)
    return time.perf_counter() - t0


def interleaved_speedups(static: GatingStrategy, others: dict, batches,
                         repeats: int) -> tuple[dict, dict[str, float]]:
    """Median pass time of each strategy, passes interleaved round by round; returns the
    speedups ``static / other`` per key of ``others`` (a gamma, or ``"L1"``) and the median
    times (s) keyed ``"static"`` and ``"gamma=<key>"``."""
    named = {"static": static, **{f"gamma={g}": a for g, a in others.items()}}
    for g in named.values():
        g.model.eval()
    times: dict[str, list[float]] = {k: [] for k in named}
    with torch.inference_mode():
        for g in named.values():  # warm-up
            pass_seconds(g, batches[:2])
        for _ in range(repeats):
            for k, g in named.items():
                times[k].append(pass_seconds(g, batches))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {g: med["static"] / med[f"gamma={g}"] for g in others}, med


def accuracy_on(gating: GatingStrategy, split, batch_size: int = 256) -> float:
    gating.model.eval()
    correct = 0
    with torch.inference_mode():
        for i, (ids, mask) in enumerate(trimmed_batches(split, batch_size)):
            y = split.labels[i * batch_size:(i + 1) * batch_size]
            correct += int((gating.predict(ids, mask)[0].argmax(-1) == y).sum())
    return correct / len(split)


def train(data, gating: str, gamma: float | None, seed: int, model: dict, epochs: int, batch: int):
    """One trial through the real trainable; returns (final metrics, the TrialLoop)."""
    fixed = {**model, "gating": gating}
    if gamma is not None:
        fixed["gamma"] = gamma
    keep = {}
    t0 = time.perf_counter()

    def on_epoch(m, loop):
        keep["loop"] = loop
        print(f"  {gating} gamma={gamma} seed={seed} epoch {m['epoch']}: acc {m['accuracy']:.4f} "
              f"({time.perf_counter() - t0:.0f}s)", flush=True)

    history = run_trial({}, data, {"epochs": epochs, "batch_size": batch, "seed": seed, "fixed": fixed},
                        on_epoch=on_epoch)
    final = dict(history[-1])
    final["wall_seconds"] = time.perf_counter() - t0
    return final, keep["loop"]


def plot(curve: list[dict], static_acc: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = [c["gamma"] for c in curve]
    fig, ax1 = plt.subplots(figsize=(5.5, 4.0))
    ax1.plot(g, [c["speedup"] for c in curve], "o-", color="tab:blue", label="speedup (batch 32)")
    ax1.plot(g, [c["speedup_b1"] for c in curve], "s--", color="tab:cyan", label="speedup (batch 1)")
    ax1.plot(g, [c["flops_ratio"] for c in curve], "^:", color="tab:gray", label="FLOPs ratio")
    ax1.axhline(1.0, color="k", lw=0.5)
    ax1.set_xlabel("gamma (expected-depth penalty)")
    ax1.set_ylabel("static / adaptive")
    ax2 = ax1.twinx()
    ax2.plot(g, [100 * c["accuracy"] for c in curve], "D-", color="tab:red", label="accuracy (adaptive)")
    ax2.axhline(100 * static_acc, color="tab:red", ls="--", lw=1, label="accuracy (static)")
    ax2.set_ylabel("validation accuracy (%)")
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax2.set_ylim(100 * static_acc - 2.0, 100 * static_acc + 2.0)  # +-2 points: seed noise is ~1 point
    ax1.set_ylim(0, max(4.5, max(c["flops_ratio"] for c in curve) + 0.5))
    ax1.set_title("Adaptive depth on rotten_tomatoes_sentences (mean of seeds)", fontsize=9)
    fig.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower center", ncol=3)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny smoke run; writes nothing")
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    data = prepare("rotten_tomatoes_sentences", vocab_size=8000, max_len=48)
    model, epochs, seeds, repeats, b1 = MODEL, EPOCHS, SEEDS, REPEATS, B1_SAMPLES
    if args.quick:
        import dataclasses

        tr = data.train
        n = 512
        data = dataclasses.replace(data, data={**data.data, "train": dataclasses.replace(
            tr, input_ids=tr.input_ids[:n], attention_mask=tr.attention_mask[:n], labels=tr.labels[:n])})
        model = {**MODEL, "d_model": 32}
        epochs, seeds, repeats, b1 = 1, [0], 2, 16
    val, test = data.validation, data.test
    b32 = trimmed_batches(val, 32)
    b1_batches = trimmed_batches(val, 1)[:b1]
    runs: list[dict] = []
    t_start = time.perf_counter()
    for seed in seeds:
        static_m, static_loop = train(data, "static", None, seed, model, epochs, BATCH)
        # reference: a static model as shallow as the adaptive one's shallowest exit
        shallow_m, shallow_loop = train(data, "static", None, seed, {**model, "n_layers": model["min_layers"]},
                                        epochs, BATCH)
        loops, rows = {}, {}
        for gamma in GAMMAS:
            m, loop = train(data, "depth_predictor", gamma, seed, model, epochs, BATCH)
            loops[gamma], rows[gamma] = loop, m
            print(f"seed {seed} gamma {gamma}: acc {m['accuracy']:.4f} (static {static_m['accuracy']:.4f}) "
                  f"hist {m['depth_histogram']} {m['wall_seconds']:.0f}s", flush=True)
        timed = {**{g: l.gating for g, l in loops.items()}, "L1": shallow_loop.gating}
        sp32, med32 = interleaved_speedups(static_loop.gating, timed, b32, repeats)
        sp1, med1 = interleaved_speedups(static_loop.gating, timed, b1_batches, repeats)
        static_test = accuracy_on(static_loop.gating, test)
        runs.append({"seed": seed, "gating": "static", "gamma": None, "accuracy": static_m["accuracy"],
                     "test_accuracy": static_test, "flops_per_sample": static_m["flops_per_sample"],
                     "time_b32_s": med32["static"], "time_b1_s": med1["static"],
                     "train_seconds": static_m["train_seconds"]})
        runs.append({"seed": seed, "gating": "static", "gamma": None, "n_layers": model["min_layers"],
                     "accuracy": shallow_m["accuracy"], "test_accuracy": accuracy_on(shallow_loop.gating, test),
                     "flops_per_sample": shallow_m["flops_per_sample"],
                     "flops_ratio": static_m["flops_per_sample"] / shallow_m["flops_per_sample"],
                     "speedup_b32": sp32["L1"], "speedup_b1": sp1["L1"],
                     "time_b32_s": med32["gamma=L1"], "time_b1_s": med1["gamma=L1"],
                     "train_seconds": shallow_m["train_seconds"]})
        for gamma in GAMMAS:
            m = rows[gamma]
            runs.append({
                "seed": seed, "gating": "depth_predictor", "gamma": gamma, "accuracy": m["accuracy"],
                "test_accuracy": accuracy_on(loops[gamma].gating, test),
                "flops_per_sample": m["flops_per_sample"],
                "flops_ratio": static_m["flops_per_sample"] / m["flops_per_sample"],
                "speedup_b32": sp32[gamma], "speedup_b1": sp1[gamma],
                "time_b32_s": med32[f"gamma={gamma}"], "time_b1_s": med1[f"gamma={gamma}"],
                "depth_histogram": m["depth_histogram"], "expected_depth": m["expected_depth"],
                "mean_exit_depth": m["mean_exit_depth"], "train_seconds": m["train_seconds"]})
        print(f"seed {seed}: speedup b32 {sp32} b1 {sp1}  ({time.perf_counter() - t_start:.0f}s so far)",
              flush=True)

    def mean(xs):
        return sum(xs) / len(xs)

    static_runs = [r for r in runs if r["gating"] == "static" and "n_layers" not in r]
    shallow_runs = [r for r in runs if r["gating"] == "static" and "n_layers" in r]
    static_acc = mean([r["accuracy"] for r in static_runs])
    static_test = mean([r["test_accuracy"] for r in static_runs])
    table, curve = [], []
    table.append({"config": "static", "accuracy": static_acc, "test_accuracy": static_test,
                  "acc_drop_pts": 0.0, "flops_per_sample": mean([r["flops_per_sample"] for r in static_runs]),
                  "flops_ratio": 1.0, "speedup_b32": 1.0, "speedup_b1": 1.0, "mean_exit_depth": model["n_layers"]})
    shallow_acc = mean([r["accuracy"] for r in shallow_runs])
    table.append({"config": f"static n_layers={model['min_layers']}", "accuracy": shallow_acc,
                  "test_accuracy": mean([r["test_accuracy"] for r in shallow_runs]),
                  "acc_drop_pts": 100 * (static_acc - shallow_acc),
                  "flops_per_sample": mean([r["flops_per_sample"] for r in shallow_runs]),
                  "flops_ratio": mean([r["flops_ratio"] for r in shallow_runs]),
                  "speedup_b32": mean([r["speedup_b32"] for r in shallow_runs]),
                  "speedup_b1": mean([r["speedup_b1"] for r in shallow_runs]),
                  "mean_exit_depth": model["min_layers"]})
    for gamma in GAMMAS:
        rs = [r for r in runs if r["gamma"] == gamma]
        acc = mean([r["accuracy"] for r in rs])
        row = {"config": f"depth_predictor gamma={gamma}", "accuracy": acc,
               "test_accuracy": mean([r["test_accuracy"] for r in rs]),
               "acc_drop_pts": 100 * (static_acc - acc),
               "flops_per_sample": mean([r["flops_per_sample"] for r in rs]),
               "flops_ratio": mean([r["flops_ratio"] for r in rs]),
               "speedup_b32": mean([r["speedup_b32"] for r in rs]),
               "speedup_b1": mean([r["speedup_b1"] for r in rs]),
               "mean_exit_depth": mean([r["mean_exit_depth"] for r in rs])}
        table.append(row)
        curve.append({"gamma": gamma, "speedup": row["speedup_b32"], "acc_drop_pts": row["acc_drop_pts"],
                      "speedup_b1": row["speedup_b1"], "flops_ratio": row["flops_ratio"], "accuracy": acc})
    ok = [c["speedup"] for c in curve if c["acc_drop_pts"] <= 0.5]
    summary = {"best_speedup_within_0.5pt": max(ok) if ok else None,
               "gamma_curve": [{"gamma": c["gamma"], "speedup": c["speedup"], "acc_drop_pts": c["acc_drop_pts"]}
                               for c in curve]}

    hdr = (f"{'config':<26} {'val acc':>8} {'test acc':>8} {'drop pts':>8} {'MFLOPs':>8} {'FLOPs x':>7} "
           f"{'b32 x':>6} {'b1 x':>6} {'exit d':>6}")
    print(hdr)
    for r in table:
        print(f"{r['config']:<26} {r['accuracy']:>8.4f} {r['test_accuracy']:>8.4f} {r['acc_drop_pts']:>8.2f} "
              f"{r['flops_per_sample'] / 1e6:>8.2f} {r['flops_ratio']:>7.2f} {r['speedup_b32']:>6.2f} "
              f"{r['speedup_b1']:>6.2f} {r['mean_exit_depth']:>6.2f}")
    print("summary:", json.dumps(summary))
    if args.quick:
        plot(curve, static_acc, Path("/tmp/depth_predictor_quick.png"))
        return
    out = {
        "benchmark": "depth_predictor",
        "dataset": "rotten_tomatoes_sentences (bpe 8000, max_len 48)",
        "model": model, "epochs": EPOCHS, "batch_size": BATCH, "seeds": SEEDS, "gammas": GAMMAS,
        "threads": THREADS, "timing": {"repeats": REPEATS, "batch_32": "whole validation split",
                                       "batch_1": f"first {B1_SAMPLES} validation rows",
                                       "statistic": "median of interleaved passes"},
        "skipped": "MiniLM fine-tune: needs the checkpoint loader (init_from), not in the tree yet",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "table": table, "runs": runs,
    }
    write_result(RESULTS / "depth_predictor.json", summary,
                 provenance(seeds=SEEDS, wall_s=time.perf_counter() - t_start), **out)
    plot(curve, static_acc, RESULTS / "depth_predictor.png")
    print(f"wrote {RESULTS / 'depth_predictor.json'} and depth_predictor.png")


if __name__ == "__main__":
    main()
