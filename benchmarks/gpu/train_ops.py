"""Claim: the per-sample gatings' training steps dispatch few more operators than the static
model's, so that on a GPU's launch-bound shapes they train nearly as fast (issue 35:
``dht_train_time_ratio`` <= 1.3 in ``gpu.json``).

Protocol: ``benchmarks/gpu/protocols/train_ops.json`` (committed before the runs). On a GPU at batch
32 and length <= 48 a MiniLM-L6 training step is launch-bound: its time is the host's time to
queue kernels, so the operators a step dispatches are what its time tracks there (the first
H200's measured training-time ratio, 1.387, against 1.373 counted here with the same code). This
script counts them on the CPU with a ``TorchDispatchMode`` (forward, backward, clipping, AdamW with
``foreach=True`` as on a GPU, the strategy's bookkeeping), per optimizer step over the third
epoch, for a 6-layer, 12-head model (MiniLM-L6's depth and heads; the operator graph does not
depend on the width), and the host reads (``item``/``cpu``/``numpy``/``tolist``/``bool``/``float``/
``int`` of a tensor: a device synchronisation each on a GPU) inside the strategy's
``training_loss`` and ``after_step``.

Rows (one per commit and gating) are appended to ``benchmarks/gpu/runs/train_ops_runs.jsonl``;
``summary`` (the newest commit's): ``<gating>_train_ops_ratio``, ``<gating>_host_reads_per_step``,
``static_ops_per_step``. ``run --regression-check``: exit 1 when the newest commit's
``dht_train_ops_ratio`` is above the previous commit's (a regression check that can fail).

Run: ``python -m benchmarks.gpu.train_ops run`` (counts this commit when its rows are not there
yet: about 3 minutes, 1 thread); ``analyze`` rewrites ``train_ops.json`` from the committed rows,
``check`` compares.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

from benchmarks.evidence.cli import Command
from benchmarks.evidence.protocol import relpath
from benchmarks.evidence.provenance import git_commit, provenance
from benchmarks.evidence.results import build_result, write_json
from benchmarks.evidence.runlog import RunLog, read_jsonl

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "train_ops.json"
RUNS = HERE / "runs" / "train_ops_runs.jsonl"
PROTOCOL = HERE / "protocols" / "train_ops.json"
GATINGS = ("static", "dht", "depth_predictor", "confidence_exit")
ARCH = {"n_layers": 6, "d_model": 48, "n_heads": 12, "d_ffn": 96}
HOST_READS = ("item", "cpu", "numpy", "tolist", "__bool__", "__float__", "__int__")


def count_row(gating: str, data, epochs_before: int = 2) -> dict:
    """Operators per optimizer step (mean over one epoch after ``epochs_before``) and host reads
    per step inside the strategy's ``training_loss`` / ``after_step``, for one gating."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from archsearch.tune.trainable import TrialLoop

    inside = [False]

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    class Reads(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if inside[0] and getattr(func, "__name__", "") in HOST_READS:
                self.n += 1
            return func(*args, **(kwargs or {}))

    cfg = {**ARCH, "lr": 1e-3, "dropout": 0.1, "weight_decay": 0.01, "warmup_steps": 10, "gating": gating}
    if gating != "static":
        cfg["flops_budget"] = 0.5
    loop = TrialLoop(cfg, data, {"epochs": epochs_before + 1, "batch_size": 32, "seed": 0, "device": "cpu"})
    for _ in range(epochs_before):
        loop.train_epoch()
    for group in loop.opt.param_groups:  # as AdamW runs on a GPU (torch's default there)
        group["foreach"] = True
    g = loop.gating
    for name in ("training_loss", "after_step"):
        f = getattr(g, name)

        def wrapped(*a, f=f, **k):
            inside[0] = True
            try:
                return f(*a, **k)
            finally:
                inside[0] = False
        setattr(g, name, wrapped)
    ops, reads, s0 = Ops(), Reads(), loop.step
    with reads, ops:
        loop.train_epoch()
    steps = loop.step - s0
    return {"gating": gating, "steps": steps, "ops_per_step": sum(ops.n.values()) / steps,
            "host_reads_per_step": reads.n / steps,
            "top_ops": {k: round(v / steps, 1) for k, v in ops.n.most_common(12)}}


def summarize(rows: list[dict]) -> dict:
    """Summary of one commit's rows (one per gating)."""
    by = {r["gating"]: r for r in rows}
    base = by["static"]["ops_per_step"]
    out = {"static_ops_per_step": round(base, 1)}
    for gname, r in by.items():
        if gname != "static":
            out[f"{gname}_train_ops_ratio"] = round(r["ops_per_step"] / base, 4)
        out[f"{gname}_host_reads_per_step"] = round(r["host_reads_per_step"], 2)
    return out


def build(rows: list[dict], runs: Path, name: str, wall_s: float | None = None) -> dict:
    """The result: the newest commit's summary, each commit's (``by_commit``), the protocol."""
    commits = list(dict.fromkeys(r["commit"] for r in rows))  # in run order
    by_commit = {c: summarize([r for r in rows if r["commit"] == c]) for c in commits}
    return build_result(by_commit[commits[-1]], provenance(commits=commits[-1], seeds=[0], wall_s=wall_s),
                        name=name, protocol=PROTOCOL, by_commit=by_commit, runs_file=relpath(runs))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--regression-check", action="store_true",
                    help="run: exit 1 if the newest commit's dht_train_ops_ratio is above the previous commit's")
    ap.add_argument("--runs", type=Path, default=RUNS)
    ap.add_argument("--result", type=Path, default=RESULTS)


def results(args: argparse.Namespace) -> dict[Path, dict]:
    """``train_ops.json`` from the committed rows (no counting)."""
    rows = read_jsonl(args.runs)
    if not rows:
        raise ValueError(f"{args.runs}: no rows: run first")
    return {args.result: build(rows, args.runs, args.result.name)}


def run(args: argparse.Namespace) -> int:
    """Count this commit's rows when they are not there yet, then write the result."""
    import torch

    from archsearch.data import prepare

    torch.set_num_threads(1)
    commit = git_commit()
    rows = read_jsonl(args.runs)
    t0 = time.perf_counter()
    if not any(r["commit"] == commit for r in rows):
        data = prepare("rotten_tomatoes_sentences", max_len=48, tokenizer="bpe", vocab_size=2000)
        for gating in GATINGS:
            row = {"commit": commit, **count_row(gating, data)}
            print(json.dumps(row), flush=True)
            rows.append(row)
            RunLog(args.runs).append(row)
    result = build(rows, args.runs, args.result.name, wall_s=time.perf_counter() - t0)
    summary, by_commit = result["summary"], result["by_commit"]
    for k, v in summary.items():
        print(f"{k:40s} {v}")
    write_json(args.result, result)
    commits = list(by_commit)
    if args.regression_check and len(commits) > 1:
        before, now = by_commit[commits[-2]]["dht_train_ops_ratio"], summary["dht_train_ops_ratio"]
        if now > before:
            print(f"check failed: dht_train_ops_ratio {now} > {before} (commit {commits[-2][:7]})", file=sys.stderr)
            return 1
    return 0


COMMAND = Command("Operators per training step of each gating against the static model (issue 35)",
                  run=run, results=results, add_arguments=add_arguments)


def main(argv: list[str] | None = None) -> int:
    """``run | analyze | check`` (:class:`benchmarks.evidence.cli.Command`)."""
    return COMMAND.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
