"""Claim checked (issue 67, deliver 3 in part and 4): does layer tying still beat the untied model
once the untied model is regularised, and what does tying save of the memory a training run
actually holds?

Protocol (committed before its runs: ``benchmarks/tying/protocols/tying_regularised.json``): the
data, model and schedule of :mod:`benchmarks.tying.tying` (125,000 Shakespeare training
characters, 8 x d64 pre-LN char LM, 3,000 steps, validation every 100 steps); two maps, ``none``
(untied) and ``every_4`` (consecutive groups of 4 blocks share Parameters, 0.27x the trainable
parameters), each at dropout 0, 0.1 and 0.2; seeds 0, 1, 2. For each map the dropout with the
lowest mean best validation perplexity is chosen (validation only), then:

* ``tied_minus_untied_regularised_best_val_ppl``: every_4 minus none at their chosen dropouts
  (mean over seeds), with a paired bootstrap interval over the 1,024 validation blocks (each
  run stores every block's loss at its checkpoint of lowest validation loss);
  ``tied_minus_untied_regularised_test_ppl`` the same on the test plays at that checkpoint;
  ``tied_minus_untied_unregularised_best_val_ppl`` the dropout-0 comparison of ``tying.json``.
* ``tying_state_memory_ratio``: parameters, gradients and optimizer state (``tying.json``'s
  ``tying_memory_ratio`` until issue 67, now ``tying_state_memory_ratio``); ``tying_peak_memory_ratio``: that plus the bytes the step's
  forward saved for backward (``torch.autograd.graph.saved_tensors_hooks``; parameter storages
  counted once, in the state), the largest over steps. Both every_4 / none at the chosen dropouts.

Addendum 1 (written before its runs): ``tying: merge`` (:class:`~archsearch.dynamic.tying.controllers.MergeTying`)
and the ``every_2`` map at the dropout chosen for ``none``;
``merge_minus_best_fixed_best_val_ppl``: merge's best validation perplexity after its merging
started minus the best fixed map (none, every_2, every_4 at the same dropout) with at most its
final parameters, with a paired bootstrap interval over the validation blocks.

Run: ``nice -n 10 python -m benchmarks.tying.tying_regularised run --jobs 2`` (18 runs, ~1 h on
2 cores; resumable: one JSON line per finished run in ``runs/tying_regularised_runs.jsonl``);
``analyze`` rewrites ``results/tying_regularised.json`` from the rows, ``check`` compares.
Smoke: ``run --steps 60 --seeds 0 --eval-blocks 16 --data /tmp/r.jsonl --out /tmp/r.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks.evidence.cli import Command
from benchmarks.evidence.ledger import Read
from benchmarks.evidence.provenance import ROOT, git_commit, provenance
from benchmarks.evidence.results import build_result, write_json
from benchmarks.evidence.runlog import RunLog
from benchmarks.evidence.stats import bootstrap_ci, paired_bootstrap_stat
from benchmarks.tying.tying import (BATCH, CONTEXT, CURVE_POINTS, EVAL_BLOCKS, HOLDOUT_BLOCKS, MODEL, SEEDS, STEPS,
                                    TEST_SET, TRAIN_CHARS, measured_state_bytes, read_rows)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "tying_regularised.json"
RUNS = HERE / "runs" / "tying_regularised_runs.jsonl"
PROTOCOL = HERE / "protocols" / "tying_regularised.json"
CLAIM = ("a tied char LM (every_4, 0.27x the parameters) is at least as good on validation as the "
         "untied one when both get their dropout chosen on validation; memory counts saved activations")
MAPS = {"none": {"tying": "none"}, "every_4": {"tying": "every_k", "tying_k": 4}}
#: addendum 1 (written before its runs): tying: merge and the every_2 map at the dropout chosen
#: for none; merge reads its held-out loss on validation-play blocks HOLDOUT_BLOCKS
ADDENDUM_MAPS = {"every_2": {"tying": "every_k", "tying_k": 2}, "merge": {"tying": "merge", "tying_split": "holdout",
                                                                         "tying_tentative": False}}
#: addendum 2 (written before its runs): tying: merge's second design, tentative merges (tying_tentative)
ADDENDUM2_MAPS = {"merge_tentative": {"tying": "merge", "tying_split": "holdout", "tying_tentative": True}}
MERGING = ("merge", "merge_tentative")
DROPOUTS = (0.0, 0.1, 0.2)
TARGETS = {"tied_minus_untied_regularised_best_val_ppl": "<= 0", "merge_minus_best_fixed_best_val_ppl": "<= 0",
           "merge_tentative_minus_best_fixed_best_val_ppl": "<= 0"}


def variant_name(tying_map: str, dropout: float) -> str:
    return f"{tying_map}@{dropout:g}"


VARIANTS = [variant_name(m, d) for m in MAPS for d in DROPOUTS]


def addendum_variants(untied_dropout: float) -> list[str]:
    """Addendum 1's variants: every_2 and merge at ``untied_dropout``."""
    return [variant_name(m, float(untied_dropout)) for m in ADDENDUM_MAPS]


def addendum2_variants(untied_dropout: float) -> list[str]:
    """Addendum 2's variant: merge_tentative at ``untied_dropout``."""
    return [variant_name(m, float(untied_dropout)) for m in ADDENDUM2_MAPS]


def setup(steps: int, eval_blocks: int = EVAL_BLOCKS) -> dict:
    """What a run depends on; rows of another setup are not reused."""
    return {"dataset": "shakespeare (char)", "train_chars": TRAIN_CHARS, "model": MODEL, "context": CONTEXT,
            "batch_size": BATCH, "steps": steps, "curve_points": CURVE_POINTS, "eval_blocks": eval_blocks,
            "maps": MAPS, "dropouts": list(DROPOUTS), "memory": "state + saved tensors"}


# ---------------------------------------------------------------------------- one run (child)

def block_losses(loop, split: str) -> list[float]:
    """Mean loss (nats per character) of each evaluation block of ``split``, in order."""
    import torch

    out: list[float] = []
    loop.model.eval()
    with torch.inference_mode():
        for x, mask, y in loop.eval_batches(split):
            logits, _ = loop.gating.predict(x.to(loop.device), None if mask is None else mask.to(loop.device))
            per_token = loop.task_loss(logits.float(), y.to(loop.device), reduction="none").view(y.shape)
            out += [round(float(v), 6) for v in per_token.mean(1)]
    return out


class SavedBytes:
    """Bytes of the distinct storages autograd saves for backward between two :meth:`take` calls
    (a context manager around training), storages in ``exclude`` (the parameters') left out."""

    def __init__(self, exclude):
        import torch

        self.exclude = exclude
        self.cur: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t):
        st = t.untyped_storage()
        if st.data_ptr() not in self.exclude():
            self.cur[st.data_ptr()] = st.nbytes()
        return t

    def take(self) -> int:
        n, self.cur = sum(self.cur.values()), {}
        return n

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)


def child(variant: str, seed: int, steps: int, eval_blocks: int = EVAL_BLOCKS) -> dict:
    """Train one (map@dropout, seed) in this fresh process; returns its row."""
    import torch

    torch.set_num_threads(1)
    from archsearch.data import prepare
    from archsearch.dynamic.tying.maps import tying_map as current_map
    from archsearch.tune.trainable import TrialLoop

    tying_map, dropout = variant.split("@")
    t_start = time.perf_counter()
    data = prepare("shakespeare", max_len=CONTEXT)
    a, b = HOLDOUT_BLOCKS  # (read by tying: merge only)
    data = dataclasses.replace(data, data={**data.data, "train": data.train[:TRAIN_CHARS],
                                           "holdout": data.validation[a * CONTEXT:b * CONTEXT + 1]})
    settings = {"epochs": CURVE_POINTS, "steps_per_epoch": steps // CURVE_POINTS, "batch_size": BATCH,
                "seed": seed, "eval_blocks": eval_blocks, "latency_batch_size": 32}
    loop = TrialLoop({**MODEL, **{**MAPS, **ADDENDUM_MAPS, **ADDENDUM2_MAPS}[tying_map], "dropout": float(dropout)},
                     data, settings)

    def param_ptrs() -> set[int]:
        return {p.untyped_storage().data_ptr() for p in loop.model.parameters()}

    ptrs = [param_ptrs()]
    saved = SavedBytes(lambda: ptrs[0])
    peak = {"state": 0, "saved": 0, "total": 0}
    inner = loop.tying.after_step

    def after_step(step: int, loss: float) -> None:
        state, act = measured_state_bytes(loop.model, loop.opt), saved.take()
        peak.update(state=max(peak["state"], state), saved=max(peak["saved"], act),
                    total=max(peak["total"], state + act))
        inner(step, loss)
        ptrs[0] = param_ptrs()

    loop.tying.after_step = after_step
    merging = tying_map in MERGING
    curve, best, test, blocks = [], math.inf, {}, {}
    phase_best = {False: (math.inf, {}), True: (math.inf, {})}  # merge: before / after merging started
    for _ in range(CURVE_POINTS):
        with saved:
            train_loss = loop.train_epoch()
        m = loop.evaluate()
        curve.append({"step": loop.step, "val_loss": m["val_loss"], "train_loss": train_loss,
                      "params_trainable": m["params_trainable"]})
        if m["val_loss"] < best:  # a new validation minimum: the test plays (and blocks) here
            best, test = m["val_loss"], loop.evaluate("test")
            if not merging:
                blocks = {"val": block_losses(loop, "validation"), "test": block_losses(loop, "test")}
        if merging:  # merge is scored after its merging started (the untied phase is not its own)
            started = loop.tying.merge_start is not None and loop.tying.merge_start < loop.step
            if m["val_loss"] < phase_best[started][0]:
                phase_best[started] = (m["val_loss"], {"val": block_losses(loop, "validation"),
                                                       "test": block_losses(loop, "test"),
                                                       "params_trainable": m["params_trainable"]})
    best_i = min(range(len(curve)), key=lambda k: curve[k]["val_loss"])
    extra = {}
    if merging:
        started = loop.tying.merge_start is not None and phase_best[True][1]
        loss, blocks = phase_best[bool(started)]
        params_at_best = blocks.pop("params_trainable")
        extra = {"merge_start": loop.tying.merge_start, "merges": loop.tying.merges,
                 **({"params_at_best_after_merge_start": params_at_best} if tying_map == "merge_tentative" else {}),
                 **({"reverts": loop.tying.reverts} if tying_map == "merge_tentative" else {}),
                 "tying_map": current_map(loop.model), "best_val_ppl_after_merge_start": math.exp(loss)}
    return {**extra,
        "variant": variant, "seed": seed, "steps": steps, "dropout": float(dropout), "map": tying_map,
        "best_val_ppl": math.exp(best), "best_step": curve[best_i]["step"],
        "final_val_ppl": math.exp(curve[-1]["val_loss"]), "test_ppl_at_best_val": test["perplexity"],
        "params_trainable": m["params_trainable"],
        "state_peak_mb": peak["state"] / 2**20, "saved_peak_mb": peak["saved"] / 2**20,
        "peak_mb": peak["total"] / 2**20,
        "train_seconds": loop.train_seconds, "process_seconds": time.perf_counter() - t_start,
        "curve": curve, "val_block_loss": blocks["val"], "test_block_loss": blocks["test"],
    }


def run_child(variant: str, seed: int, steps: int, eval_blocks: int) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.tying.tying_regularised", "--child", variant, str(seed),
           "--steps", str(steps), "--eval-blocks", str(eval_blocks)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if res.returncode != 0:
        raise RuntimeError(f"{variant} seed {seed} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- analysis

def choose_dropout(rows: dict, tying_map: str, seeds: list[int]) -> float:
    """The protocol's rule: the dropout with the lowest mean best_val_ppl (ties: the smaller)."""
    return min(DROPOUTS, key=lambda d: (statistics.fmean(rows[(variant_name(tying_map, d), s)]["best_val_ppl"]
                                                         for s in seeds), d))


def ppl_gap(rows: dict, a: str, b: str, seeds: list[int], key: str) -> tuple[float, list[float]]:
    """Mean over seeds of exp(mean block loss) of ``a`` minus ``b`` on the blocks of ``key``
    (``val_block_loss`` | ``test_block_loss``), at the observed blocks and its paired 95%
    bootstrap interval over blocks (the same draws for both variants and every seed)."""
    la = np.array([rows[(a, s)][key] for s in seeds])  # (seeds, blocks)
    lb = np.array([rows[(b, s)][key] for s in seeds])

    def stat(idx):  # (k, n) -> (k,)
        return (np.exp(la[:, idx].mean(-1)) - np.exp(lb[:, idx].mean(-1))).mean(0)

    point, boot = paired_bootstrap_stat(stat, la.shape[1])
    return float(point[0]), [round(v, 4) for v in bootstrap_ci(boot)]


def merge_gap(rows: dict, seeds: list[int], dropout: float, name: str = "merge") -> tuple[float, list[float], list[str]]:
    """Addendum 1's score at ``dropout`` (addendum 2's with ``name="merge_tentative"``): per seed
    the merging variant's best validation perplexity after its merging started minus the lowest
    best_val_ppl among the fixed maps at that dropout with at most its final trainable
    parameters; the mean over seeds, its paired bootstrap interval over the validation blocks,
    and each seed's fixed map."""
    m = variant_name(name, dropout)
    # addendum 1: merge's final parameters; addendum 2: the parameters at its scored point
    size = "params_at_best_after_merge_start" if name == "merge_tentative" else "params_trainable"
    picks = []
    for sd in seeds:
        ok = [variant_name(f, dropout) for f in ("none", "every_2", "every_4")
              if rows[(variant_name(f, dropout), sd)]["params_trainable"] <= rows[(m, sd)][size]]
        picks.append(min(ok, key=lambda v: rows[(v, sd)]["best_val_ppl"]))
    point = statistics.fmean(rows[(m, sd)]["best_val_ppl_after_merge_start"] - rows[(f, sd)]["best_val_ppl"]
                             for sd, f in zip(seeds, picks))
    la = np.array([rows[(m, sd)]["val_block_loss"] for sd in seeds])
    lb = np.array([rows[(f, sd)]["val_block_loss"] for sd, f in zip(seeds, picks)])
    _, boot = paired_bootstrap_stat(lambda idx: (np.exp(la[:, idx].mean(-1)) - np.exp(lb[:, idx].mean(-1))).mean(0),
                                    la.shape[1])
    return point, [round(v, 4) for v in bootstrap_ci(boot)], picks


def summarize(rows: dict, seeds: list[int]) -> tuple[dict, dict]:
    """``(summary, per-variant aggregates)`` from complete rows (the protocol's rules; addendum
    1's keys once all its rows are there)."""
    du = choose_dropout(rows, "none", seeds)
    extra_variants = [v for v in addendum_variants(du) + addendum2_variants(du) if all((v, sd) in rows for sd in seeds)]
    agg = {}
    for v in VARIANTS + extra_variants:
        rs = [rows[(v, s)] for s in seeds]
        agg[v] = {k: statistics.fmean(r[k] for r in rs)
                  for k in ("best_val_ppl", "final_val_ppl", "test_ppl_at_best_val", "params_trainable",
                            "state_peak_mb", "saved_peak_mb", "peak_mb", "best_step")}
        agg[v].update({f"{k}_per_seed": [r[k] for r in rs] for k in ("best_val_ppl", "test_ppl_at_best_val")})
    dt = choose_dropout(rows, "every_4", seeds)
    untied, tied = variant_name("none", du), variant_name("every_4", dt)
    val, val_ci = ppl_gap(rows, tied, untied, seeds, "val_block_loss")
    test, test_ci = ppl_gap(rows, tied, untied, seeds, "test_block_loss")
    raw, raw_ci = ppl_gap(rows, variant_name("every_4", 0.0), variant_name("none", 0.0), seeds, "val_block_loss")
    summary = {
        "tied_minus_untied_regularised_best_val_ppl": val,
        "tied_minus_untied_regularised_best_val_ppl_ci": val_ci,
        "tied_minus_untied_regularised_test_ppl": test,
        "tied_minus_untied_regularised_test_ppl_ci": test_ci,
        "tied_minus_untied_unregularised_best_val_ppl": raw,
        "tied_minus_untied_unregularised_best_val_ppl_ci": raw_ci,
        "untied_dropout": du, "tied_dropout": dt,
        "tying_params_ratio": agg[tied]["params_trainable"] / agg[untied]["params_trainable"],
        "tying_state_memory_ratio": agg[tied]["state_peak_mb"] / agg[untied]["state_peak_mb"],
        "tying_peak_memory_ratio": agg[tied]["peak_mb"] / agg[untied]["peak_mb"],
    }
    for name, needed in (("merge", addendum_variants(du)), ("merge_tentative", addendum_variants(du) + addendum2_variants(du))):
        if not set(needed) <= set(extra_variants):
            continue
        gap, ci, picks = merge_gap(rows, seeds, du, name)
        size = "params_at_best_after_merge_start" if name == "merge_tentative" else "params_trainable"
        merge = variant_name(name, du)
        summary.update({
            f"{name}_minus_best_fixed_best_val_ppl": gap, f"{name}_minus_best_fixed_best_val_ppl_ci": ci,
            f"{name}_params_ratio": statistics.fmean(rows[(merge, sd)][size] for sd in seeds) / agg[untied]["params_trainable"],
        })
        if name == "merge_tentative":
            summary.update(merge_tentative_merges_kept=statistics.fmean(len(rows[(merge, sd)]["merges"]) for sd in seeds),
                           merge_tentative_reverts=statistics.fmean(len(rows[(merge, sd)]["reverts"]) for sd in seeds))
            # addendum 2's decision rule: the second design against the first, paired over validation blocks
            d, d_ci = ppl_gap(rows, merge, variant_name("merge", du), seeds, "val_block_loss")
            summary.update(merge_tentative_minus_merge_best_val_ppl=d, merge_tentative_minus_merge_best_val_ppl_ci=d_ci)
        agg[merge].update(best_val_ppl_after_merge_start_per_seed=[rows[(merge, sd)]["best_val_ppl_after_merge_start"]
                                                                   for sd in seeds],
                          merge_start_per_seed=[rows[(merge, sd)]["merge_start"] for sd in seeds],
                          tying_maps=[rows[(merge, sd)]["tying_map"] for sd in seeds], best_fixed_per_seed=picks)
    return summary, agg


def build(rows: dict, seeds: list[int], want: dict, name: str, *, record_reads: bool = True,
          jobs: int | None = None, driver_seconds: float | None = None) -> dict:
    """The result of complete rows in the one schema (summary, targets, protocol, its read of the
    test plays, provenance; then the per-variant aggregates and the runs without block losses)."""
    summary, agg = summarize(rows, seeds)
    used = [rows[(v, s)] for v in agg for s in seeds]
    prov = provenance(commits=[r["commit"] for r in used], seeds=list(seeds),
                      wall_s=sum(r["process_seconds"] for r in used), threads_per_run=1,
                      **({"jobs": jobs} if jobs is not None else {}),
                      **({"driver_seconds": driver_seconds} if driver_seconds is not None else {}))
    drop = ("setup", "val_block_loss", "test_block_loss")
    return build_result(summary, prov, name=name, targets=TARGETS, protocol=PROTOCOL,
                        reads=[Read(TEST_SET, PROTOCOL)], record_reads=record_reads, claim=CLAIM, setup=want,
                        variants=agg, runs=[{k: v for k, v in r.items() if k not in drop} for r in used])


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--steps", type=int, default=STEPS, help=f"multiple of {CURVE_POINTS}")
    ap.add_argument("--eval-blocks", type=int, default=EVAL_BLOCKS, help="validation blocks (smoke runs: fewer)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (one thread each)")
    ap.add_argument("--data", type=Path, default=RUNS, help="resumable run rows (JSON lines)")
    ap.add_argument("--out", type=Path, default=RESULTS)


def results(args: argparse.Namespace) -> dict[Path, dict]:
    """``tying_regularised.json`` from the committed rows of its setup (every run must be there)."""
    want = setup(args.steps, args.eval_blocks)
    rows = read_rows(args.data, want)
    missing = [(v, s) for s in args.seeds for v in VARIANTS if (v, s) not in rows]
    if missing:
        raise ValueError(f"{args.data}: no row for {missing[:4]}{'...' if len(missing) > 4 else ''}: run first")
    return {args.out: build(rows, list(args.seeds), want, Path(args.out).name, record_reads=not args.check)}


def run(args: argparse.Namespace) -> int:
    """Train every (variant, seed) not yet in the rows file, each in a fresh process, then write the result."""
    if args.steps % CURVE_POINTS:
        raise ValueError(f"--steps must be a multiple of {CURVE_POINTS}")
    want = setup(args.steps, args.eval_blocks)
    rows = read_rows(args.data, want)
    t0 = time.perf_counter()

    def one(variant: str, seed: int) -> None:
        r = run_child(variant, seed, args.steps, args.eval_blocks)
        r.update(setup=want, commit=git_commit(), load_after=round(os.getloadavg()[0], 2))
        RunLog(args.data).append(r)
        rows[(variant, seed)] = r
        print(f"  {variant:12s} seed {seed}: best val ppl {r['best_val_ppl']:.3f} (step {r['best_step']})  "
              f"test@best {r['test_ppl_at_best_val']:.3f}  state {r['state_peak_mb']:.2f} MB  "
              f"saved {r['saved_peak_mb']:.2f} MB  train {r['train_seconds']:.0f} s", flush=True)

    for phase in (0, 1, 2):  # the protocol's variants; then addendum 1's and 2's (they need the untied dropout)
        du = choose_dropout(rows, "none", list(args.seeds)) if phase else None
        names = VARIANTS if phase == 0 else addendum_variants(du) if phase == 1 else addendum2_variants(du)
        todo = [(v, s) for s in args.seeds for v in names if (v, s) not in rows]
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for fut in [pool.submit(one, v, s) for v, s in todo]:
                fut.result()
    result = build(rows, list(args.seeds), want, Path(args.out).name, jobs=args.jobs,
                   driver_seconds=time.perf_counter() - t0,
                   record_reads=Path(args.out).resolve() == RESULTS)  # a smoke run's read is not the protocol's
    print(f"\n{'variant':12s} {'best val ppl':>12s} {'test@best':>9s} {'params':>9s} {'state MB':>8s} {'peak MB':>8s}")
    for v, a in result["variants"].items():
        print(f"{v:12s} {a['best_val_ppl']:12.3f} {a['test_ppl_at_best_val']:9.3f} {a['params_trainable']:9,.0f} "
              f"{a['state_peak_mb']:8.2f} {a['peak_mb']:8.2f}")
    print("\nsummary:", json.dumps(result["summary"]),
          "\ntargets met:", json.dumps({k: t["met"] for k, t in result["targets"].items()}))
    write_json(args.out, result)
    return 0


COMMAND = Command("Layer tying against a regularised untied model, memory with saved activations (issue 67)",
                  run=run, results=results, add_arguments=add_arguments, seeds=f"{SEEDS[0]}-{SEEDS[-1]}")


def child_main(argv: list[str]) -> int:
    """One (variant, seed) run in this fresh process (``--child VARIANT SEED``): its row on stdout."""
    ap = argparse.ArgumentParser(description="one run of benchmarks.tying.tying_regularised (started by run)")
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "SEED"), required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--eval-blocks", type=int, default=EVAL_BLOCKS)
    args = ap.parse_args(argv)
    print(json.dumps(child(args.child[0], int(args.child[1]), args.steps, args.eval_blocks)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``run | analyze | check`` (:class:`benchmarks.evidence.cli.Command`); ``--child`` is one run."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "--child":
        return child_main(argv)
    return COMMAND.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
