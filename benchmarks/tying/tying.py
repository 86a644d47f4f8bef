"""Claim: layer tying regularises an over-parameterised character LM: in a data-limited regime a
tied model reaches a validation perplexity at least as good as the untied model's with at most half
its trainable parameters and ~half its measured training-state memory, and a tying agent (ours,
``tying: rl``, or Hay & Wolf's, ``tying: paper``) finds a map at least as good as the best fixed
map of its size.

Protocol (issue 39, committed before the runs: ``benchmarks/tying/protocols/tying.json``):

* Data: the bundled ``shakespeare`` character stream cut to its first ``TRAIN_CHARS`` = 125,000
  training characters (a pre-run of the untied model on 250,000 had no usable validation minimum;
  on 125,000 it has one at step 1,200 of 3,000); validation: the first ``EVAL_BLOCKS`` = 1,024
  blocks of the held-out validation plays; test: the held-out test plays, reported at the
  checkpoint of lowest validation loss (``test_ppl_at_best_val``: evaluated at each new validation
  minimum, the last one kept, so nothing is chosen on it).
* Model: a causal pre-LN transformer, 8 layers, d_model 64, 4 heads, d_ffn 256 (~0.41 M
  parameters, ~3 per training character), context 64, batch 32, dropout 0, AdamW lr 2e-3 (100
  warm-up steps, linear decay to 0), ``STEPS`` = 3,000 (~49 passes over the data).
* Curves: validation loss every 100 steps (``CURVE_POINTS`` = 30); ``best_val_ppl`` = exp of the
  curve's minimum, ``final_val_ppl`` = exp of its last point.
* Variants (each seed trains all from the same initialisation and batch order): ``none``,
  ``all`` (ALBERT), ``every_2``/``every_4`` (consecutive groups share, Takase & Kiyono 2021),
  ``rl`` (our agent, defaults), ``paper`` (Hay & Wolf's agent as their code runs it: frozen
  aliases, one block every 4 batches, reward -exp(CE)), and ``rl_fixed``/``paper_fixed``: each
  agent's final map (same seed) trained fixed from step 0, shared Parameters for ``rl``, frozen
  aliases for ``paper``. Seeds 0, 1, 2.
* Addenda (2026-11-28, each committed before its runs): ``switch_every_2``/``switch_every_4``, a
  hindsight bound (untied until the same seed's untied validation minimum, then the fixed map:
  ``extra.hindsight_switch_minus_fixed_*``), and ``switch`` (``tying: switch`` at its defaults,
  its held-out loss on validation blocks ``HOLDOUT_BLOCKS``, disjoint from the reported ones:
  ``extra.switch_minus_best_fixed_*``, scored on the minimum after its switch as the agents are).
* Memory (measured): after every optimizer step (before the next ``zero_grad``) the bytes of the
  distinct storages actually allocated for the model's parameters (trainable and frozen), their
  gradients and the optimizer's state tensors; ``state_peak_mb`` is the largest over the run.
  Frozen aliases hold no memory of their own, no gradient and no optimizer state; shared
  Parameters are one storage.
* Summary (``benchmarks/tying/results/tying.json``, keys exactly): ``tied_minus_untied_best_val_ppl``
  (mean over seeds of every_4 - none; every_4 fixed in the protocol: the fixed map with the most
  parameters at a ratio <= 0.5), ``tying_params_ratio`` and ``tying_state_memory_ratio`` (every_4 /
  none), ``rl_minus_best_fixed_best_val_ppl`` (per agent and seed: its best_val_ppl minus the
  lowest among all, every_2, every_4 and its own control whose trainable parameters are at most
  the agent's; mean over seeds; the better of the two agents, both in ``extra``), ``converged``
  (for every seed the untied validation curve has its minimum at or before 75% of the steps and
  ends at least 1% above it: it overfits); the result's ``targets`` (:data:`TARGETS`), its read of
  the test plays (test set ``shakespeare:test`` of the ledger) and ``provenance``.
* Each (variant, seed) runs in a FRESH subprocess with one thread, ``--jobs`` of them at once.
  Resumable: one JSON line per finished run in ``benchmarks/tying/runs/tying_runs.jsonl`` (with its git
  commit and setup); rows of another setup (issue 16's 4,000-step runs on the full stream are
  there too) are ignored, finished runs are not redone.

Duration: ~0.1 s per step at one thread, 3,000 steps + 30 evaluations: ~6-7 min per run, 24
runs at ``--jobs 2`` ~1.3 h on an otherwise idle 2-core machine.

Run: ``nice -n 10 python -m benchmarks.tying.tying run --jobs 2`` (``analyze``: rewrite
``tying.json`` from the committed rows; ``check``: regenerate it in memory and compare). Smoke:
``python -m benchmarks.tying.tying run --steps 60 --seeds 0 --eval-blocks 16 --data /tmp/t.jsonl --out /tmp/t.json``.
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

from benchmarks.evidence.cli import Command
from benchmarks.evidence.ledger import Read
from benchmarks.evidence.provenance import ROOT, git_commit, provenance
from benchmarks.evidence.results import build_result, write_json
from benchmarks.evidence.runlog import RunLog, read_jsonl

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "tying.json"
RUNS = HERE / "runs" / "tying_runs.jsonl"
PROTOCOL = HERE / "protocols" / "tying.json"
#: the test split the result reads (the ledger's name): the held-out test plays
TEST_SET = "shakespeare:test"
CLAIM = ("layer tying regularises an over-parameterised char LM in a data-limited regime: a tied "
         "model at <= 0.5x the parameters is at least as good as the untied one on validation, "
         "and an agent's map at least as good as the best fixed map of its size")
#: variant -> config entries; a ``*_fixed`` control is ``none`` with its agent's final map at step 0
VARIANTS = {
    "none": {"tying": "none"},
    "all": {"tying": "all"},
    "every_2": {"tying": "every_k", "tying_k": 2},
    "every_4": {"tying": "every_k", "tying_k": 4},
    "rl": {"tying": "rl"},
    "paper": {"tying": "paper"},
    "rl_fixed": {"tying": "none"},
    "paper_fixed": {"tying": "none"},
    "switch_every_2": {"tying": "none"},
    "switch_every_4": {"tying": "none"},
    "switch": {"tying": "switch", "tying_split": "holdout"},
}
#: control -> (the agent run whose final map it trains fixed from step 0, frozen aliases?)
CONTROLS = {"rl_fixed": ("rl", False), "paper_fixed": ("paper", True)}
AGENTS = ("rl", "paper")
#: hindsight bound (protocol addendum "hindsight", 2026-11-28): untied until the step of the same
#: seed's untied validation minimum, then this fixed map (shared Parameters, Adam state kept) to
#: the end -- the best a dynamic map could do by one well-timed switch, with the timing read off
#: the validation curve, so a bound on what an agent can gain here, not a method
HINDSIGHT = {"switch_every_2": [0, 0, 2, 2, 4, 4, 6, 6], "switch_every_4": [0, 0, 0, 0, 4, 4, 4, 4]}
#: ``tying: switch`` at its defaults (protocol addendum "switch"): its held-out split ("holdout")
#: is validation-play blocks HOLDOUT_BLOCKS, disjoint from the EVAL_BLOCKS reported
HOLDOUT_BLOCKS = (1024, 1536)
#: the tied model of tied_minus_untied_best_val_ppl, fixed in the protocol before the runs
TIED = "every_4"
MODEL = {"n_layers": 8, "d_model": 64, "n_heads": 4, "d_ffn_mult": 4, "dropout": 0.0, "lr": 2e-3,
         "weight_decay": 0.01, "warmup_steps": 100}
TRAIN_CHARS = 125_000
CONTEXT = 64
BATCH = 32
STEPS = 3000
CURVE_POINTS = 30
EVAL_BLOCKS = 1024
SEEDS = (0, 1, 2)
#: converged: the untied minimum lies at or before this fraction of the steps ...
MIN_BY = 0.75
#: ... and the final validation loss is at least this much (relative) above it
OVERFIT_REL = 0.01
#: the protocol's targets; "<= 0 at tying_params_ratio <= 0.5" is a joint rule
TARGETS = {"tied_minus_untied_best_val_ppl": {"target": "<= 0", "with": ["tying_params_ratio"]},
           "tying_params_ratio": "<= 0.5", "rl_minus_best_fixed_best_val_ppl": "<= 0", "tying_state_memory_ratio": "<= 0.6"}


def fixed_variants(agent: str) -> tuple[str, ...]:
    """The fixed maps an agent is compared with: the hand-made ones and its own control."""
    return ("all", "every_2", "every_4", next(c for c, (a, _) in CONTROLS.items() if a == agent))


def setup(steps: int, eval_blocks: int = EVAL_BLOCKS) -> dict:
    """What a run depends on; rows of another setup are not reused."""
    from archsearch.dynamic.tying.settings import PaperTyingSettings, RLTyingSettings

    return {"dataset": "shakespeare (char)", "train_chars": TRAIN_CHARS, "model": MODEL, "context": CONTEXT,
            "batch_size": BATCH, "steps": steps, "curve_points": CURVE_POINTS, "eval_blocks": eval_blocks,
            "rl": RLTyingSettings().model_dump(), "paper": PaperTyingSettings().model_dump()}


# ---------------------------------------------------------------------------- one run (child)

def measured_state_bytes(model, opt) -> int:
    """Bytes of the distinct storages now allocated for ``model``'s parameters (trainable or
    frozen), their gradients and ``opt``'s state tensors (each storage once, by address)."""
    import torch

    seen: dict[int, int] = {}
    tensors = [t for p in model.parameters() for t in (p, p.grad) if t is not None]
    tensors += [t for st in opt.state.values() for t in st.values() if torch.is_tensor(t)]
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def child(variant: str, seed: int, steps: int, fixed_map: list[int] | None,
          eval_blocks: int = EVAL_BLOCKS, switch_step: int | None = None) -> dict:
    """Train one (variant, seed) in this fresh process; returns its row. A :data:`HINDSIGHT`
    variant trains untied and applies ``fixed_map`` once ``switch_step`` steps are done."""
    import torch

    torch.set_num_threads(1)
    from archsearch.data import prepare
    from archsearch.dynamic.tying.maps import apply_tying_map, sync_optimizer, tying_map
    from archsearch.tune.trainable import TrialLoop

    if steps % CURVE_POINTS:
        raise ValueError(f"--steps must be a multiple of {CURVE_POINTS}, got {steps}")
    t_start = time.perf_counter()
    data = prepare("shakespeare", max_len=CONTEXT)
    a, b = HOLDOUT_BLOCKS  # (read by tying: switch only)
    data = dataclasses.replace(data, data={**data.data, "train": data.train[:TRAIN_CHARS],
                                           "holdout": data.validation[a * CONTEXT:b * CONTEXT + 1]})
    settings = {"epochs": CURVE_POINTS, "steps_per_epoch": steps // CURVE_POINTS, "batch_size": BATCH,
                "seed": seed, "eval_blocks": eval_blocks, "latency_batch_size": 32}
    loop = TrialLoop({**MODEL, **VARIANTS[variant]}, data, settings)
    if variant in CONTROLS:
        if fixed_map is None:
            raise ValueError(f"{variant} needs the {CONTROLS[variant][0]} run's map")
        apply_tying_map(loop.model, fixed_map, frozen=CONTROLS[variant][1])
        loop.rebuild_optimizer()  # no state yet: a fresh optimizer over the tied parameters
    if variant in HINDSIGHT and (fixed_map is None or switch_step is None or switch_step % (steps // CURVE_POINTS)):
        raise ValueError(f"{variant} needs a map and a switch step at a curve point, got {fixed_map}, {switch_step}")

    peak = [0]
    inner = loop.tying.after_step

    def after_step(step: int, loss: float) -> None:  # measure before the controller re-ties
        peak[0] = max(peak[0], measured_state_bytes(loop.model, loop.opt))
        inner(step, loss)

    loop.tying.after_step = after_step
    curve, best, test = [], math.inf, {}
    for _ in range(CURVE_POINTS):
        if variant in HINDSIGHT and loop.step == switch_step:  # tie: each block takes its source's weights
            apply_tying_map(loop.model, fixed_map, frozen=False)
            sync_optimizer(loop)
        train_loss = loop.train_epoch()
        m = loop.evaluate()
        s = tying_map(loop.model)
        curve.append({"step": loop.step, "val_loss": m["val_loss"], "train_loss": train_loss,
                      "params_trainable": m["params_trainable"],
                      "n_distinct_layers": sum(1 for i, j in enumerate(s) if i == j)})
        if m["val_loss"] < best:  # a new validation minimum: the test plays at this checkpoint
            best, test = m["val_loss"], loop.evaluate("test")  # (only the last one is reported)
    final_map, final = tying_map(loop.model), m
    best_i = min(range(len(curve)), key=lambda k: curve[k]["val_loss"])
    row = {
        "variant": variant, "seed": seed, "steps": steps,
        "best_val_ppl": math.exp(best), "best_step": curve[best_i]["step"],
        "final_val_ppl": math.exp(final["val_loss"]), "test_ppl_at_best_val": test["perplexity"],
        "train_loss": curve[-1]["train_loss"],
        "params_trainable": final["params_trainable"], "params_total": final["params_total"],
        "state_peak_mb": peak[0] / 2**20,
        "state_final_mb": measured_state_bytes(loop.model, loop.opt) / 2**20,
        "train_seconds": loop.train_seconds, "process_seconds": time.perf_counter() - t_start,
        "tying_map": final_map, "n_distinct_layers": curve[-1]["n_distinct_layers"], "curve": curve,
    }
    if variant == "rl":
        row.update(rl_decisions=loop.tying.decisions, rl_frozen=loop.tying.frozen)
    if variant == "paper":
        row.update(paper_decisions=loop.tying.decisions, paper_epsilon_end=loop.tying.agent.epsilon)
    if variant in CONTROLS or variant in HINDSIGHT:
        row["fixed_map"] = list(fixed_map)
    if variant == "switch":
        switch_step = loop.tying.switch_step
    if variant in HINDSIGHT or variant == "switch":  # the tied model's own minimum (before the switch
        row["switch_step"] = switch_step              # the curve is the untied run's)
        row["best_val_ppl_after_switch"] = math.exp(min(
            [p["val_loss"] for p in curve if switch_step is not None and p["step"] > switch_step], default=math.inf))
    return row


# ---------------------------------------------------------------------------- driver

def read_rows(path: Path, want: dict) -> dict[tuple[str, int], dict]:
    """Finished runs of this setup in ``path``, keyed by (variant, seed); the last line wins."""
    rows, other = {}, 0
    for r in read_jsonl(path):
        if r.get("setup") != want:
            other += 1
            continue
        rows[(r["variant"], int(r["seed"]))] = r
    if other:
        print(f"{path.name}: ignoring {other} row(s) of another setup")
    return rows


def run_child(variant: str, seed: int, steps: int, fixed_map: list[int] | None, eval_blocks: int,
              switch_step: int | None = None) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.tying.tying", "--child", variant, str(seed), "--steps", str(steps),
           "--eval-blocks", str(eval_blocks)]
    if fixed_map is not None:
        cmd += ["--map", ",".join(map(str, fixed_map))]
    if switch_step is not None:
        cmd += ["--switch-step", str(switch_step)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if res.returncode != 0:
        raise RuntimeError(f"{variant} seed {seed} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def summarize(rows: dict, seeds: list[int]) -> tuple[dict, dict, dict]:
    """``(summary, per-variant aggregates, extra)`` from complete rows (the protocol's rules)."""
    agg = {}
    addenda = (*HINDSIGHT, "switch")  # optional: summarised where every seed has its row
    for v in [v for v in VARIANTS if v not in addenda or all((v, s) in rows for s in seeds)]:
        rs = [rows[(v, s)] for s in seeds]
        agg[v] = {k: statistics.fmean(r[k] for r in rs)
                  for k in ("best_val_ppl", "final_val_ppl", "test_ppl_at_best_val", "params_trainable",
                            "state_peak_mb", "best_step")}
        agg[v].update({f"{k}_per_seed": [r[k] for r in rs]
                       for k in ("best_val_ppl", "final_val_ppl", "test_ppl_at_best_val", "best_step")},
                      train_seconds_median=statistics.median(r["train_seconds"] for r in rs),
                      tying_maps=[r["tying_map"] for r in rs], n_distinct_layers=[r["n_distinct_layers"] for r in rs])
    base = agg["none"]

    def gaps_of(variant: str, fixed=None, score: str = "best_val_ppl") -> tuple[list[float], list[str]]:
        """Per seed: ``variant``'s ``score`` minus the lowest best_val_ppl among ``fixed`` (default:
        an agent's :func:`fixed_variants`) with at most its trainable parameters; and that map."""
        gaps, names = [], []
        for s in seeds:
            a = rows[(variant, s)]
            ok = [v for v in (fixed or fixed_variants(variant)) if rows[(v, s)]["params_trainable"] <= a["params_trainable"]]
            best = min(ok, key=lambda v: rows[(v, s)]["best_val_ppl"])
            gaps.append(a[score] - rows[(best, s)]["best_val_ppl"])
            names.append(best)
        return gaps, names

    agent_gap = {a: gaps_of(a) for a in AGENTS}
    better = min(AGENTS, key=lambda a: statistics.fmean(agent_gap[a][0]))
    overfit = []
    for s in seeds:
        c = [p["val_loss"] for p in rows[("none", s)]["curve"]]
        k = min(range(len(c)), key=c.__getitem__)
        overfit.append({"min_at_frac": (k + 1) / len(c), "final_over_min": c[-1] / c[k] - 1})
    tied = [rows[(TIED, s)]["best_val_ppl"] - rows[("none", s)]["best_val_ppl"] for s in seeds]
    summary = {
        "tied_minus_untied_best_val_ppl": statistics.fmean(tied),
        "tying_params_ratio": agg[TIED]["params_trainable"] / base["params_trainable"],
        # the protocol's tying_memory_ratio, renamed in issue 67: parameters, gradients and optimizer
        # state only (saved activations: benchmarks/tying/tying_regularised.py's tying_peak_memory_ratio)
        "tying_state_memory_ratio": agg[TIED]["state_peak_mb"] / base["state_peak_mb"],
        "rl_minus_best_fixed_best_val_ppl": statistics.fmean(agent_gap[better][0]),
        "converged": all(o["min_at_frac"] <= MIN_BY and o["final_over_min"] >= OVERFIT_REL for o in overfit),
    }
    extra = {
        "tied_variant": TIED, "tied_minus_untied_per_seed": tied,
        "better_agent": better,
        "agent_minus_best_fixed": {a: statistics.fmean(agent_gap[a][0]) for a in AGENTS},
        "agent_minus_best_fixed_per_seed": {a: agent_gap[a][0] for a in AGENTS},
        "agent_best_fixed_per_seed": {a: agent_gap[a][1] for a in AGENTS},
        "minus_untied_best_val_ppl": {v: agg[v]["best_val_ppl"] - base["best_val_ppl"] for v in agg},
        "params_ratio": {v: agg[v]["params_trainable"] / base["params_trainable"] for v in agg},
        "memory_ratio": {v: agg[v]["state_peak_mb"] / base["state_peak_mb"] for v in agg},
        "untied_overfit_per_seed": overfit,
    }
    if all((v, s) in rows for v in HINDSIGHT for s in seeds):
        fixed_of = {v: v.removeprefix("switch_") for v in HINDSIGHT}
        per = {v: [rows[(v, s)]["best_val_ppl_after_switch"] - rows[(fixed_of[v], s)]["best_val_ppl"] for s in seeds]
               for v in HINDSIGHT}
        extra["hindsight_switch_minus_fixed_best_val_ppl"] = {fixed_of[v]: statistics.fmean(x) for v, x in per.items()}
        extra["hindsight_switch_minus_fixed_per_seed"] = {fixed_of[v]: x for v, x in per.items()}
        extra["hindsight_switch_steps"] = [rows[("switch_every_2", s)]["switch_step"] for s in seeds]
    if all(("switch", s) in rows for s in seeds):  # tying: switch, scored as the agents, after its switch
        gaps, names = gaps_of("switch", ("all", "every_2", "every_4"), "best_val_ppl_after_switch")
        extra["switch_minus_best_fixed_best_val_ppl"] = statistics.fmean(gaps)
        extra["switch_minus_best_fixed_per_seed"] = gaps
        extra["switch_best_fixed_per_seed"] = names
        extra["switch_steps"] = [rows[("switch", s)]["switch_step"] for s in seeds]
        extra["switch_minus_every_4_test_ppl_at_best_val"] = statistics.fmean(
            rows[("switch", s)]["test_ppl_at_best_val"] - rows[("every_4", s)]["test_ppl_at_best_val"] for s in seeds)
    return summary, agg, extra


def build(rows: dict, seeds: list[int], want: dict, name: str, *, record_reads: bool = True, jobs: int | None = None,
          driver_seconds: float | None = None) -> dict:
    """The result of complete rows in the one schema: summary, targets, the protocol and its read of
    the test plays, provenance, then the claim, setup, per-variant aggregates, ``extra`` and the runs."""
    summary, agg, extra = summarize(rows, seeds)
    used = [rows[(v, s)] for v in agg for s in seeds]
    prov = provenance(commits=[r["commit"] for r in used], seeds=list(seeds),
                      wall_s=sum(r["process_seconds"] for r in used), threads_per_run=1,
                      **({"jobs": jobs} if jobs is not None else {}),
                      **({"driver_seconds": driver_seconds} if driver_seconds is not None else {}))
    return build_result(summary, prov, name=name, targets=TARGETS, protocol=PROTOCOL,
                        reads=[Read(TEST_SET, PROTOCOL)], record_reads=record_reads, claim=CLAIM, setup=want,
                        variants=agg, extra=extra, runs=[{k: v for k, v in r.items() if k != "setup"} for r in used])


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--steps", type=int, default=STEPS, help=f"multiple of {CURVE_POINTS}")
    ap.add_argument("--eval-blocks", type=int, default=EVAL_BLOCKS, help="validation blocks (smoke runs: fewer)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (one thread each)")
    ap.add_argument("--data", type=Path, default=RUNS, help="resumable run rows (JSON lines)")
    ap.add_argument("--out", type=Path, default=RESULTS)


def results(args: argparse.Namespace) -> dict[Path, dict]:
    """``tying.json`` from the committed rows of its setup (every (variant, seed) must be there)."""
    want = setup(args.steps, args.eval_blocks)
    rows = read_rows(args.data, want)
    missing = [(v, s) for s in args.seeds for v in VARIANTS if v not in (*HINDSIGHT, "switch") and (v, s) not in rows]
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
        fixed = rows[(CONTROLS[variant][0], seed)]["tying_map"] if variant in CONTROLS else HINDSIGHT.get(variant)
        switch = rows[("none", seed)]["best_step"] if variant in HINDSIGHT else None
        r = run_child(variant, seed, args.steps, fixed, args.eval_blocks, switch)
        r.update(setup=want, commit=git_commit(), load_after=round(os.getloadavg()[0], 2))
        RunLog(args.data).append(r)
        rows[(variant, seed)] = r
        print(f"  {variant:12s} seed {seed}: best val ppl {r['best_val_ppl']:.3f} (step {r['best_step']})  "
              f"final {r['final_val_ppl']:.3f}  test@best {r['test_ppl_at_best_val']:.3f}  "
              f"params {r['params_trainable']:,}  state peak {r['state_peak_mb']:.2f} MB  "
              f"train {r['train_seconds']:.0f} s  map {r['tying_map']}", flush=True)

    # phase 1: every variant but the controls and the hindsight switches, the agents first;
    # phase 2: those (they read the agents' maps and the untied runs' minima)
    names = ["rl", "paper"] + [v for v in VARIANTS if v not in CONTROLS and v not in AGENTS and v not in HINDSIGHT
                               and v != "switch"]
    todo1 = [(v, s) for s in args.seeds for v in names if (v, s) not in rows]
    todo2 = [(c, s) for s in args.seeds for c in [*CONTROLS, *HINDSIGHT, "switch"] if (c, s) not in rows]
    for todo in (todo1, todo2):
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for fut in [pool.submit(one, v, s) for v, s in todo]:
                fut.result()

    result = build(rows, list(args.seeds), want, Path(args.out).name, jobs=args.jobs,
                   driver_seconds=time.perf_counter() - t0)
    agg = result["variants"]
    print(f"\n{'variant':12s} {'best val ppl':>12s} {'final':>7s} {'test@best':>9s} {'params':>9s} "
          f"{'state MB':>8s} {'best step':>9s}  distinct layers")
    for v, a in agg.items():
        print(f"{v:12s} {a['best_val_ppl']:12.3f} {a['final_val_ppl']:7.3f} {a['test_ppl_at_best_val']:9.3f} "
              f"{a['params_trainable']:9,.0f} {a['state_peak_mb']:8.2f} {a['best_step']:9.0f}  {a['n_distinct_layers']}")
    print("\nsummary:", json.dumps(result["summary"]),
          "\ntargets met:", json.dumps({k: t["met"] for k, t in result["targets"].items()}))
    write_json(args.out, result)
    print(f"wrote {args.out}  (sum of run wall times {result['provenance']['wall_s']:.0f} s)")
    return 0


COMMAND = Command("Layer tying on a data-limited character LM (issue 39): tied vs untied, agents vs fixed maps",
                  run=run, results=results, add_arguments=add_arguments, seeds=f"{SEEDS[0]}-{SEEDS[-1]}")


def child_main(argv: list[str]) -> int:
    """One (variant, seed) run in this fresh process (``--child VARIANT SEED``): its row on stdout."""
    ap = argparse.ArgumentParser(description="one run of benchmarks.tying.tying (started by run)")
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "SEED"), required=True)
    ap.add_argument("--map")
    ap.add_argument("--switch-step", type=int)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--eval-blocks", type=int, default=EVAL_BLOCKS)
    args = ap.parse_args(argv)
    fixed = [int(v) for v in args.map.split(",")] if args.map else None
    print(json.dumps(child(args.child[0], int(args.child[1]), args.steps, fixed, args.eval_blocks, args.switch_step)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``run | analyze | check`` (:class:`benchmarks.evidence.cli.Command`); ``--child`` is one run."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "--child":
        return child_main(argv)
    return COMMAND.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
