"""Claim: the cost model is right, and fewer FLOPs (smaller, shallower or head-gated models) means
less wall-clock time on this machine.

For a few from-scratch classifier configs (T = 48 tokens, vocab 8000, 2 threads) prints and saves
to ``benchmarks/gpu/results/model_speed.json``:

* ``params_total`` and ``params_trainable`` (count),
* ``flops_per_sample`` (analytic, FLOPs) and ``flops_torch`` (FlopCounterMode, math attention),
* ``latency_ms`` at batch 32 and batch 1 (median forward ms per sample, SDPA attention),
* ``train_step_ms``: median time of one AdamW step (forward + backward + update) on a 64 x 48
  batch (ms per step, not per sample).

The last rows run the d=128 L=4 model gated: early exit after 2 layers, and 2 of 4 heads in
every layer (heads sliced, not masked), to show that counted savings are real time savings.

``summary`` (:func:`summarize`): ``flops_max_rel_error`` (analytic vs FlopCounterMode, over all
rows) and, for each gated variant, its FLOPs and batch-32 latency as ratios to the ungated
d=128 L=4 model (``exit_at_2_*``, ``heads_2_of_4_*``); ``provenance`` via
:mod:`benchmarks.evidence.provenance`. A measurement of this machine: there is nothing to
``analyze`` offline (the stored result keeps its numbers).

Run: ``python -m benchmarks.gpu.model_speed run`` (about 20 s).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from archsearch.models.costs import (
    count_flops_torch,
    flops_per_sample,
    latency_ms,
    params_total,
    params_trainable,
)
from archsearch.models.transformer import Transformer, TransformerConfig
from benchmarks.evidence.cli import Command
from benchmarks.evidence.provenance import provenance
from benchmarks.evidence.results import write_result

SEQ_LEN = 48
VOCAB = 8000
THREADS = 2
TRAIN_BATCH = 64
RESULTS = Path(__file__).resolve().parent / "results" / "model_speed.json"

# name, d_model, n_layers, forward kwargs (gating)
CONFIGS = [
    ("d=64 L=2", 64, 2, {}),
    ("d=128 L=2", 128, 2, {}),
    ("d=128 L=4", 128, 4, {}),
    ("d=128 L=4 exit@2", 128, 4, {"n_layers": 2}),
    ("d=128 L=4 heads 2/4", 128, 4, {"heads_per_layer": [[0, 1]] * 4}),
]


def make_config(d_model: int, n_layers: int) -> TransformerConfig:
    """Classifier with d_head = 32 and d_ffn = 4 * d_model."""
    return TransformerConfig(
        vocab_size=VOCAB, max_len=SEQ_LEN, n_layers=n_layers, d_model=d_model,
        n_heads=d_model // 32, d_ffn=4 * d_model, dropout=0.1, task="classification", n_classes=2,
    )


def train_step_ms(model: Transformer, ids: torch.Tensor, labels: torch.Tensor, forward_kwargs: dict,
                  repeats: int = 10, warmup: int = 2) -> float:
    """Median wall-clock ms of one AdamW step (forward, backward, update) on the whole batch."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(ids, **forward_kwargs), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000.0


def heads_counts(config: TransformerConfig, forward_kwargs: dict) -> list[int] | None:
    heads = forward_kwargs.get("heads_per_layer")
    return None if heads is None else [config.n_heads if h is None else len(h) for h in heads]


def summarize(rows: list[dict]) -> dict:
    """The claim in numbers: how far the analytic FLOPs are from FlopCounterMode's, and what the
    two gated variants of ``d=128 L=4`` cost in FLOPs and in latency at batch 32 (ratios to the
    ungated model; a latency ratio near its FLOPs ratio means counted savings are time savings)."""
    by = {r["config"]: r for r in rows}
    full = by["d=128 L=4"]
    out = {"flops_max_rel_error": max(abs(r["flops_per_sample"] - r["flops_torch"]) / r["flops_torch"]
                                      for r in rows)}
    for key, name in (("exit_at_2", "d=128 L=4 exit@2"), ("heads_2_of_4", "d=128 L=4 heads 2/4")):
        out[f"{key}_flops_ratio"] = by[name]["flops_per_sample"] / full["flops_per_sample"]
        out[f"{key}_latency_ratio_b32"] = by[name]["latency_ms_b32"] / full["latency_ms_b32"]
    return out


def run(args: argparse.Namespace | None = None) -> int:
    """Measure every config of :data:`CONFIGS` and write :data:`RESULTS`."""
    started = time.perf_counter()
    torch.set_num_threads(THREADS)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (TRAIN_BATCH, SEQ_LEN), generator=g)  # (64, 48), no padding
    labels = torch.randint(0, 2, (TRAIN_BATCH,), generator=g)  # (64,)
    rows = []
    for name, d_model, n_layers, kwargs in CONFIGS:
        torch.manual_seed(0)
        config = make_config(d_model, n_layers)
        model = Transformer(config)
        flops = flops_per_sample(config, SEQ_LEN, n_layers=kwargs.get("n_layers"),
                                 heads_per_layer=heads_counts(config, kwargs))
        flops_torch = count_flops_torch(model, ids[:4], **kwargs)
        rows.append({
            "config": name,
            "d_model": d_model,
            "n_layers": n_layers,
            "n_heads": config.n_heads,
            "d_ffn": config.d_ffn,
            "forward_kwargs": kwargs,
            "params_total": params_total(model),
            "params_trainable": params_trainable(model),
            "flops_per_sample": flops,
            "flops_torch": flops_torch,
            "latency_ms_b32": latency_ms(model, ids, batch_size=32, repeats=30, warmup=5, forward_kwargs=kwargs),
            "latency_ms_b1": latency_ms(model, ids, batch_size=1, repeats=100, warmup=10, forward_kwargs=kwargs),
            "train_step_ms": train_step_ms(model, ids, labels, kwargs),
        })

    header = (f"{'config':<20} {'params':>9} {'MFLOP/sample':>12} {'FlopCounter':>11} "
              f"{'ms/sample@32':>12} {'ms/sample@1':>11} {'train step ms':>13}")
    print(f"seq_len={SEQ_LEN} vocab={VOCAB} threads={THREADS} torch={torch.__version__} "
          f"train batch={TRAIN_BATCH}x{SEQ_LEN}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['config']:<20} {r['params_total']:>9,} {r['flops_per_sample'] / 1e6:>12.2f} "
              f"{r['flops_torch'] / 1e6:>11.2f} {r['latency_ms_b32']:>12.3f} {r['latency_ms_b1']:>11.3f} "
              f"{r['train_step_ms']:>13.1f}")

    summary = summarize(rows)
    print("summary:", summary)
    write_result(
        RESULTS, summary, provenance(seeds=0, wall_s=time.perf_counter() - started),
        benchmark="model_speed", seq_len=SEQ_LEN, vocab_size=VOCAB, threads=THREADS,
        train_batch=[TRAIN_BATCH, SEQ_LEN], latency_batch_sizes=[32, 1],
        units={
            "flops_per_sample": "FLOPs (multiply-add = 2)", "latency_ms_b32": "ms per sample",
            "latency_ms_b1": "ms per sample", "train_step_ms": "ms per step of 64 samples",
        },
        time=time.strftime("%Y-%m-%dT%H:%M:%S%z"), rows=rows,
    )
    print(f"wrote {RESULTS}")
    return 0


COMMAND = Command("Cost model vs FlopCounterMode, and FLOPs vs wall-clock on this machine", run=run)


def main(argv: list[str] | None = None) -> int:
    """``run`` (:class:`benchmarks.evidence.cli.Command`; a measurement: no ``analyze``)."""
    return COMMAND.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
