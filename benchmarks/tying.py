"""Claim: dynamic layer tying (``tying: rl``, Hay & Wolf, ICLR 2024) trains a character LM with far
fewer trainable parameters and less training memory than the untied model, at about the same
validation perplexity; ALBERT-style ``tying: all`` is the fixed-sharing baseline.

Setup (CPU-sized; 2 shared cores): the bundled ``shakespeare`` character stream, a causal pre-LN
transformer with 8 layers, d_model 128, 4 heads, d_ffn 512, context 64, batch 16, dropout 0,
AdamW lr 1e-3 (50 warm-up steps, linear decay), the same number of training steps for every
variant, seeds 0, 1, 2. Each (variant, seed) trains through :class:`archsearch.tune.trainable.TrialLoop`
in a FRESH subprocess with one thread; the runs are interleaved (the variant order rotates with the
seed) so machine load hits all variants alike.

Reported per variant (mean over seeds unless said otherwise):

* ``perplexity``: exp(validation cross-entropy) on the first ``EVAL_BLOCKS`` x 64 validation characters;
* ``params_trainable``: distinct trainable parameters at the end (shared tensors once);
* ``peak_rss_mb``: peak resident memory of the process during training (MB; Linux ``VmHWM``
  reset with ``/proc/self/clear_refs`` after imports and data loading, read right after the last
  step, so evaluation is excluded); ``rss_increment_mb`` = that peak minus the RSS just before the
  model was built (model, gradients, optimizer state, activations, allocator slack), after a
  warm-up on a tiny model has paid the one-time library initialisation (~200 MB here);
* ``state_mb``: bytes of the distinct trainable tensors, their gradients and the AdamW state at
  the end of training (what tying shares; activations are not shared);
* ``train_seconds``: wall time of the training steps (median over seeds; noisy on a shared machine).

``summary`` (rl / untied, all / untied): ``params_ratio``, ``perplexity_ratio``,
``peak_memory_ratio`` (whole-process peak RSS), ``all_perplexity_ratio``.

Run: ``nice -n 10 python benchmarks/tying.py`` (about 25 minutes at load ~7 on the 2 shared cores;
the committed run took 38 minutes at load average 12-17); ``--steps`` / ``--seeds``
for a quick smoke run (``--out`` another file).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import provenance, write_result  # benchmarks/common.py (sibling module)

RESULTS = Path(__file__).resolve().parent / "results" / "tying.json"
VARIANTS = ("none", "rl", "all")
MODEL = {"n_layers": 8, "d_model": 128, "n_heads": 4, "d_ffn_mult": 4, "dropout": 0.0, "lr": 1e-3,
         "weight_decay": 0.01, "warmup_steps": 50}
CONTEXT = 64
BATCH = 16
STEPS = 300
EVAL_BLOCKS = 512
SEEDS = (0, 1, 2)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM) of this process; False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child(variant: str, seed: int, steps: int) -> dict:
    """Train one variant in this (fresh) process; returns its measurements."""
    import torch

    torch.set_num_threads(1)
    from archsearch.data import prepare
    from archsearch.tune.trainable import TrialLoop

    t_start = time.perf_counter()
    data = prepare("shakespeare", max_len=CONTEXT)
    # warm-up: one-time library initialisation (lazy imports, kernels, autograd, optimizer) costs
    # ~200 MB RSS whatever the model; pay it on a tiny model before measuring
    warm = TrialLoop({**MODEL, "n_layers": 1, "d_model": 32, "n_heads": 2}, data,
                     {"epochs": 1, "steps_per_epoch": 2, "batch_size": 2, "seed": seed})
    warm.train_epoch()
    del warm
    gc.collect()
    reset = _reset_peak_rss()
    rss_before = _status_kb("VmRSS")
    settings = {"epochs": 1, "steps_per_epoch": steps, "batch_size": BATCH, "seed": seed,
                "eval_blocks": EVAL_BLOCKS, "latency_batch_size": 32}
    loop = TrialLoop({**MODEL, "tying": variant}, data, settings)
    train_loss = loop.train_epoch()
    peak_kb = _status_kb("VmHWM")
    params = loop.trainable_parameters()
    state_bytes = sum(t.numel() * t.element_size() for p in params for t in (p, p.grad) if t is not None)
    state_bytes += sum(t.numel() * t.element_size() for st in loop.opt.state.values()
                       for t in st.values() if torch.is_tensor(t))
    m = loop.evaluate()
    out = {
        "variant": variant, "seed": seed, "steps": steps,
        "perplexity": m["perplexity"], "val_loss": m["val_loss"], "train_loss": train_loss,
        "params_trainable": m["params_trainable"], "params_total": m["params_total"],
        "peak_rss_mb": peak_kb / 1024, "rss_before_model_mb": rss_before / 1024,
        "rss_increment_mb": (peak_kb - rss_before) / 1024, "peak_rss_reset": reset,
        "state_mb": state_bytes / 2**20,
        "train_seconds": m["train_seconds"], "process_seconds": time.perf_counter() - t_start,
        "tying_map": m.get("tying_map", list(range(MODEL["n_layers"]))),
        "n_distinct_layers": m.get("n_distinct_layers", MODEL["n_layers"]),
    }
    if variant == "rl":
        out["rl_epsilon_end"] = loop.tying.agent.epsilon
        out["rl_decisions"] = loop.tying.decisions
    return out


def _mean(xs):
    return float(statistics.fmean(xs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.steps)))
        return

    runs = []
    t0 = time.perf_counter()
    for k, seed in enumerate(args.seeds):
        order = VARIANTS[k % 3:] + VARIANTS[:k % 3]  # rotate so no variant always runs first
        for variant in order:
            res = subprocess.run([sys.executable, __file__, "--child", variant, str(seed),
                                  "--steps", str(args.steps)], capture_output=True, text=True,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"})
            if res.returncode != 0:
                raise RuntimeError(f"{variant} seed {seed} failed:\n{res.stderr[-3000:]}")
            r = json.loads(res.stdout.strip().splitlines()[-1])
            runs.append(r)
            print(f"  {variant:5s} seed {seed}: ppl {r['perplexity']:.3f}  params {r['params_trainable']:,}  "
                  f"peak {r['peak_rss_mb']:.0f} MB  train {r['train_seconds']:.0f} s  "
                  f"map {r['tying_map']}", flush=True)

    agg = {}
    for v in VARIANTS:
        rs = [r for r in runs if r["variant"] == v]
        agg[v] = {
            "perplexity": _mean([r["perplexity"] for r in rs]),
            "perplexity_per_seed": [r["perplexity"] for r in rs],
            "params_trainable": _mean([r["params_trainable"] for r in rs]),
            "peak_rss_mb": _mean([r["peak_rss_mb"] for r in rs]),
            "rss_increment_mb": _mean([r["rss_increment_mb"] for r in rs]),
            "state_mb": _mean([r["state_mb"] for r in rs]),
            "train_seconds_median": float(statistics.median(r["train_seconds"] for r in rs)),
            "n_distinct_layers": [r["n_distinct_layers"] for r in rs],
            "tying_maps": [r["tying_map"] for r in rs],
        }
    base, rl, al = agg["none"], agg["rl"], agg["all"]
    summary = {
        "params_ratio": rl["params_trainable"] / base["params_trainable"],
        "perplexity_ratio": rl["perplexity"] / base["perplexity"],
        "peak_memory_ratio": rl["peak_rss_mb"] / base["peak_rss_mb"],
        "all_perplexity_ratio": al["perplexity"] / base["perplexity"],
    }
    extra = {
        "all_params_ratio": al["params_trainable"] / base["params_trainable"],
        "all_peak_memory_ratio": al["peak_rss_mb"] / base["peak_rss_mb"],
        "rl_rss_increment_ratio": rl["rss_increment_mb"] / base["rss_increment_mb"],
        "all_rss_increment_ratio": al["rss_increment_mb"] / base["rss_increment_mb"],
        "rl_state_ratio": rl["state_mb"] / base["state_mb"],
        "rl_train_time_ratio": rl["train_seconds_median"] / base["train_seconds_median"],
        "all_train_time_ratio": al["train_seconds_median"] / base["train_seconds_median"],
        "rl_perplexity_ratio_per_seed": [a / b for a, b in zip(rl["perplexity_per_seed"],
                                                               base["perplexity_per_seed"], strict=True)],
    }
    targets = {"params_ratio <= 0.35": summary["params_ratio"] <= 0.35,
               "perplexity_ratio <= 1.03": summary["perplexity_ratio"] <= 1.03}

    print(f"\n{'variant':8s} {'perplexity':>11s} {'params_trainable':>17s} {'peak RSS MB':>12s} "
          f"{'RSS incr MB':>12s} {'state MB':>9s} {'train s (med)':>14s}  distinct layers")
    for v in VARIANTS:
        a = agg[v]
        print(f"{v:8s} {a['perplexity']:11.3f} {a['params_trainable']:17,.0f} {a['peak_rss_mb']:12.1f} "
              f"{a['rss_increment_mb']:12.1f} {a['state_mb']:9.1f} {a['train_seconds_median']:14.1f}  "
              f"{a['n_distinct_layers']}")
    print("\nsummary:", json.dumps({k: round(v, 4) for k, v in summary.items()}))
    print("extra:  ", json.dumps({k: (round(v, 4) if isinstance(v, float) else [round(x, 4) for x in v])
                                 for k, v in extra.items()}))
    print("targets:", targets)

    out = {
        "claim": "rl layer tying: params_ratio <= 0.35 with perplexity_ratio <= 1.03 vs the untied model",
        "setup": {"dataset": "shakespeare (char)", "model": MODEL, "context": CONTEXT, "batch_size": BATCH,
                  "steps": args.steps, "seeds": list(args.seeds), "eval_blocks": EVAL_BLOCKS,
                  "eval_tokens": EVAL_BLOCKS * CONTEXT, "tying_every": 4,
                  "aggregation": "mean over seeds; train time median over seeds",
                  "peak_memory": "VmHWM during training, reset after imports + data loading"},
        "variants": agg,
        "extra": extra,
        "targets_met": targets,
        "runs": runs,
        "wall_seconds": time.perf_counter() - t0,
    }
    write_result(args.out, summary, provenance(seeds=list(args.seeds), wall_s=out["wall_seconds"],
                                               threads_per_run=1), **out)
    print(f"wrote {args.out}  ({out['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
