"""Claim: dynamic layer tying (``tying: rl``, Hay & Wolf, ICLR 2024) trains a character LM with far
fewer trainable parameters than the untied model at about the same validation perplexity, and its
learnt map is at least as good as the best fixed map with no more trainable parameters.

Protocol (issue 16, deliverable 4):

* Data and model: the bundled ``shakespeare`` character stream (4.47 M training, 267 k validation
  characters); a causal pre-LN transformer with 8 layers, d_model 64, 4 heads, d_ffn 256 (~0.40 M
  parameters), context 64, batch 32, dropout 0, AdamW lr 2e-3 (100 warm-up steps, linear decay to
  0), ``STEPS`` = 4000 steps (8.2 M training tokens, ~1.8 passes, ~20 tokens per parameter) for
  every variant. The size is chosen so the untied model's validation loss flattens: the summary
  reports ``untied_val_loss_final`` (nats/token) and ``converged`` = the untied loss improved by
  less than 1% over the last 10% of the steps, for every seed. If ``converged`` is false, the
  comparison is not at convergence and says so.
* Variants (each seed trains all of them from the same initialisation and batch order):
  ``none`` (untied); ``all`` (ALBERT: one set of block weights); ``every_2``/``every_4``
  (consecutive groups of k blocks share, Takase & Kiyono 2021); ``rl`` (the agent: a round every
  8 batches decides every block, epsilon 1 -> 0.05 over the first 40% of the run, then the map is
  frozen); ``rl_fixed``: the control, the final map of the ``rl`` run of the same seed trained as
  a fixed map from step 0 (what the map is worth without the exploration churn); ``rl_cap2``:
  the agent with a budget of trainable parameters, ``tying_max_distinct: 2`` (at most 2 of the 8
  blocks own weights: every_4's parameters; actions beyond it are never taken), and its control
  ``rl_cap2_fixed``. Added after the first ``rl`` run (seed 0) kept 6 distinct blocks (0.76x the
  parameters): its reward has no parameter term, so it unties whatever trains faster. Seeds 0, 1, 2.
* Matched trainable parameters: ``rl_minus_best_fixed_perplexity`` is, per seed, the agent's
  perplexity minus the best perplexity among the fixed variants (all, every_2, every_4 and its
  own control) whose final trainable parameters are at most the agent's (the control always
  qualifies: the same map), averaged over seeds. Negative = the agent beats every fixed map of
  its size or smaller. The summary keys describe ``PRIMARY`` = ``rl_cap2``; ``extra`` gives the
  unbudgeted ``rl``'s ratios and gap beside them.
* Learning curves: validation loss on the first ``EVAL_BLOCKS`` = 1024 validation blocks (65,536
  characters, the same for all variants) every 5% of the steps (``CURVE_POINTS`` = 20), with the
  mean training loss of the chunk, trainable parameters and distinct layers at that point.
* Memory: ``state_peak_mb``: the largest bytes of the model's own training state (distinct
  trainable Parameters + their gradients + AdamW state) seen after any step (it changes while the
  agent re-ties); ``state_final_mb`` at the end; beside them the process's peak RSS during
  training (``peak_rss_mb``, Linux ``VmHWM`` reset after imports, data and a warm-up on a tiny
  model) and ``rss_increment_mb`` (that peak minus the RSS before the model was built).
* Each (variant, seed) runs in a FRESH subprocess with one thread; ``--jobs`` of them at once
  (default 1). Resumable: one JSON line per finished run in ``benchmarks/data/tying_runs.jsonl``
  (with its git commit and the setup it ran); rows of another setup are ignored, finished runs are
  not redone. When every run is present, ``benchmarks/results/tying.json`` is written through
  ``benchmarks/common.py`` with ``summary`` keys exactly ``tying_params_ratio`` (rl / none
  trainable parameters), ``tying_perplexity_ratio`` (rl / none perplexity),
  ``rl_minus_best_fixed_perplexity``, ``untied_val_loss_final``, ``converged``, and
  ``provenance``.

Duration (estimate; the full run has not been made): forward + backward cost ~6 FLOPs per
parameter per token plus attention, ~2.8 MFLOP per token, ~5.7 GFLOP per step of 2048 tokens.
The smoke run (20 steps per variant, one thread each, another benchmark on the 2 cores, load
~2.2) measured 0.08-0.2 s per step, typically 0.09-0.12 s (~50 GFLOP/s). At 0.10-0.15 s: 4000
steps = 7-10 min per run, plus 21 evaluations of 65,536 characters (~1.5 s each, ~0.5 min) and
~7 s start-up: ~8-11 min per run, 18 runs one at a time (``--jobs 1``) ~2.5-3.3 h; ``--jobs 2`` on
an otherwise idle 2-core machine ~1.3-1.7 h (no faster than ``--jobs 1`` while another benchmark
occupies a core). Resume after an interruption by running the same command again.

Run: ``nice -n 10 python benchmarks/tying.py --jobs 1`` (full protocol; ``--jobs 2`` when the
machine is otherwise idle; writes
``benchmarks/data/tying_runs.jsonl`` and ``benchmarks/results/tying.json``). Smoke:
``python benchmarks/tying.py --steps 20 --seeds 0 --eval-blocks 32 --data /tmp/t.jsonl --out /tmp/t.json``.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import git_commit, provenance, write_result  # benchmarks/common.py (sibling module)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "tying.json"
RUNS = HERE / "data" / "tying_runs.jsonl"
#: variant -> config entries; ``rl_fixed`` is ``none`` with the rl run's map applied at step 0
VARIANTS = {
    "none": {"tying": "none"},
    "all": {"tying": "all"},
    "every_2": {"tying": "every_k", "tying_k": 2},
    "every_4": {"tying": "every_k", "tying_k": 4},
    "rl": {"tying": "rl"},
    "rl_fixed": {"tying": "none"},
    "rl_cap2": {"tying": "rl", "tying_max_distinct": 2},
    "rl_cap2_fixed": {"tying": "none"},
}
#: control variant -> the agent run whose final map it trains fixed from step 0
CONTROLS = {"rl_fixed": "rl", "rl_cap2_fixed": "rl_cap2"}
#: the agent the summary keys describe: at most 2 of the 8 blocks with weights of their own,
#: the parameter budget of every_4 (chosen before its runs: the unbudgeted agent's reward has no
#: parameter term, so it keeps most blocks untied)
PRIMARY = "rl_cap2"


def fixed_variants(agent: str) -> tuple[str, ...]:
    """The fixed maps an agent is compared with: the hand-made ones and its own control."""
    return ("all", "every_2", "every_4", next(c for c, a in CONTROLS.items() if a == agent))
MODEL = {"n_layers": 8, "d_model": 64, "n_heads": 4, "d_ffn_mult": 4, "dropout": 0.0, "lr": 2e-3,
         "weight_decay": 0.01, "warmup_steps": 100}
CONTEXT = 64
BATCH = 32
STEPS = 4000
CURVE_POINTS = 20
EVAL_BLOCKS = 1024
SEEDS = (0, 1, 2)
#: the untied model's validation loss may improve by less than this (relative) over the last 10% of steps
CONVERGED_REL = 0.01
#: issue 16's targets (summary key -> bound); ``tying_perplexity_ratio`` counts only when ``converged``
TARGETS = {"tying_params_ratio": "<= 0.35", "tying_perplexity_ratio": "<= 1.03",
           "rl_minus_best_fixed_perplexity": "<= 0"}


def setup(steps: int, eval_blocks: int = EVAL_BLOCKS) -> dict:
    """What a run depends on; rows of another setup are not reused."""
    from archsearch.dynamic.tying_settings import RLTyingSettings

    rl = RLTyingSettings()  # the defaults the rl runs use
    return {"dataset": "shakespeare (char)", "model": MODEL, "context": CONTEXT, "batch_size": BATCH,
            "steps": steps, "curve_points": CURVE_POINTS, "eval_blocks": eval_blocks,
            "tying_every": rl.tying_every, "tying_explore_frac": rl.tying_explore_frac}


# ---------------------------------------------------------------------------- one run (child)

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


def state_bytes(loop) -> int:
    """Bytes of the distinct trainable Parameters, their gradients and the optimizer's state."""
    import torch

    params = loop.trainable_parameters()
    n = sum(t.numel() * t.element_size() for p in params for t in (p, p.grad) if t is not None)
    n += sum(t.numel() * t.element_size() for st in loop.opt.state.values()
             for t in st.values() if torch.is_tensor(t) and t.dim() > 0)
    return n


def child(variant: str, seed: int, steps: int, fixed_map: list[int] | None,
          eval_blocks: int = EVAL_BLOCKS) -> dict:
    """Train one (variant, seed) in this fresh process; returns its row."""
    import torch

    torch.set_num_threads(1)
    from archsearch.data import prepare
    from archsearch.dynamic.tying_maps import apply_tying_map, tying_map
    from archsearch.tune.trainable import TrialLoop

    if steps % CURVE_POINTS:
        raise ValueError(f"--steps must be a multiple of {CURVE_POINTS}, got {steps}")
    t_start = time.perf_counter()
    data = prepare("shakespeare", max_len=CONTEXT)
    # one-time library initialisation costs ~200 MB RSS whatever the model: pay it first
    warm = TrialLoop({**MODEL, "n_layers": 1, "d_model": 32, "n_heads": 2}, data,
                     {"epochs": 1, "steps_per_epoch": 2, "batch_size": 2, "seed": seed})
    warm.train_epoch()
    del warm
    gc.collect()
    reset = _reset_peak_rss()
    rss_before = _status_kb("VmRSS")
    settings = {"epochs": CURVE_POINTS, "steps_per_epoch": steps // CURVE_POINTS, "batch_size": BATCH,
                "seed": seed, "eval_blocks": eval_blocks, "latency_batch_size": 32}
    loop = TrialLoop({**MODEL, **VARIANTS[variant]}, data, settings)
    if variant in CONTROLS:
        if fixed_map is None:
            raise ValueError(f"{variant} needs the {CONTROLS[variant]} run's map")
        apply_tying_map(loop.model, fixed_map)
        loop.rebuild_optimizer()  # no state yet: a fresh optimizer over the tied parameters

    peak_state = [0]
    inner = loop.tying.after_step

    def after_step(step: int, loss: float) -> None:  # measure before the controller re-ties
        peak_state[0] = max(peak_state[0], state_bytes(loop))
        inner(step, loss)

    loop.tying.after_step = after_step
    curve, peak_kb = [], 0
    for _ in range(CURVE_POINTS):
        train_loss = loop.train_epoch()
        peak_kb = max(peak_kb, _status_kb("VmHWM"))  # before evaluation allocates anything
        m = loop.evaluate()
        s = tying_map(loop.model)
        curve.append({"step": loop.step, "val_loss": m["val_loss"], "train_loss": train_loss,
                      "params_trainable": m["params_trainable"],
                      "n_distinct_layers": sum(1 for i, j in enumerate(s) if i == j),
                      "train_seconds": round(loop.train_seconds, 2)})
    final_map = tying_map(loop.model)
    row = {
        "variant": variant, "seed": seed, "steps": steps,
        "val_loss": m["val_loss"], "perplexity": m["perplexity"], "train_loss": curve[-1]["train_loss"],
        "params_trainable": m["params_trainable"], "params_total": m["params_total"],
        "state_peak_mb": peak_state[0] / 2**20, "state_final_mb": state_bytes(loop) / 2**20,
        "peak_rss_mb": peak_kb / 1024, "rss_before_model_mb": rss_before / 1024,
        "rss_increment_mb": (peak_kb - rss_before) / 1024, "peak_rss_reset": reset,
        "train_seconds": loop.train_seconds, "process_seconds": time.perf_counter() - t_start,
        "tying_map": final_map, "n_distinct_layers": curve[-1]["n_distinct_layers"], "curve": curve,
    }
    if VARIANTS[variant]["tying"] == "rl":
        rl = loop.tying
        row.update(rl_epsilon_end=rl.agent.epsilon, rl_decisions=rl.decisions, rl_rounds=rl.rounds,
                   rl_frozen=rl.frozen, rl_explore_rounds=rl.explore_rounds)
    if variant in CONTROLS:
        row["fixed_map"] = list(fixed_map)
    return row


# ---------------------------------------------------------------------------- driver

def read_rows(path: Path, want: dict) -> dict[tuple[str, int], dict]:
    """Finished runs of this setup in ``path``, keyed by (variant, seed); the last line wins."""
    rows, other = {}, 0
    if path.exists():
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("setup") != want:
                other += 1
                continue
            rows[(r["variant"], int(r["seed"]))] = r
    if other:
        print(f"{path.name}: ignoring {other} row(s) of another setup")
    return rows


def run_child(variant: str, seed: int, steps: int, fixed_map: list[int] | None, eval_blocks: int) -> dict:
    cmd = [sys.executable, __file__, "--child", variant, str(seed), "--steps", str(steps),
           "--eval-blocks", str(eval_blocks)]
    if fixed_map is not None:
        cmd += ["--map", ",".join(map(str, fixed_map))]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if res.returncode != 0:
        raise RuntimeError(f"{variant} seed {seed} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def summarize(rows: dict, seeds: list[int]) -> tuple[dict, dict, dict]:
    """``(summary, per-variant aggregates, extra)`` from complete rows."""
    agg = {}
    for v in VARIANTS:
        rs = [rows[(v, s)] for s in seeds]
        agg[v] = {
            "perplexity": statistics.fmean(r["perplexity"] for r in rs),
            "perplexity_per_seed": [r["perplexity"] for r in rs],
            "val_loss": statistics.fmean(r["val_loss"] for r in rs),
            "params_trainable": statistics.fmean(r["params_trainable"] for r in rs),
            "state_peak_mb": statistics.fmean(r["state_peak_mb"] for r in rs),
            "state_final_mb": statistics.fmean(r["state_final_mb"] for r in rs),
            "peak_rss_mb": statistics.fmean(r["peak_rss_mb"] for r in rs),
            "rss_increment_mb": statistics.fmean(r["rss_increment_mb"] for r in rs),
            "train_seconds_median": statistics.median(r["train_seconds"] for r in rs),
            "tying_maps": [r["tying_map"] for r in rs],
            "n_distinct_layers": [r["n_distinct_layers"] for r in rs],
        }
    base = agg["none"]

    def gaps_of(agent: str) -> tuple[list[float], list[str]]:
        gaps, best_names = [], []
        for s in seeds:
            rl = rows[(agent, s)]
            ok = [v for v in fixed_variants(agent) if rows[(v, s)]["params_trainable"] <= rl["params_trainable"]]
            best = min(ok, key=lambda v: rows[(v, s)]["perplexity"])
            gaps.append(rl["perplexity"] - rows[(best, s)]["perplexity"])
            best_names.append(best)
        return gaps, best_names

    gaps, best_names = gaps_of(PRIMARY)
    conv = []
    for s in seeds:
        c = rows[("none", s)]["curve"]
        at90 = c[int(round(0.9 * len(c))) - 1]["val_loss"]
        conv.append((at90 - c[-1]["val_loss"]) / at90)
    summary = {
        "tying_params_ratio": agg[PRIMARY]["params_trainable"] / base["params_trainable"],
        "tying_perplexity_ratio": agg[PRIMARY]["perplexity"] / base["perplexity"],
        "rl_minus_best_fixed_perplexity": statistics.fmean(gaps),
        "untied_val_loss_final": base["val_loss"],
        "converged": all(g < CONVERGED_REL for g in conv),
    }
    extra = {
        "params_ratio": {v: agg[v]["params_trainable"] / base["params_trainable"] for v in VARIANTS},
        "perplexity_ratio": {v: agg[v]["perplexity"] / base["perplexity"] for v in VARIANTS},
        "state_peak_ratio": {v: agg[v]["state_peak_mb"] / base["state_peak_mb"] for v in VARIANTS},
        "peak_rss_ratio": {v: agg[v]["peak_rss_mb"] / base["peak_rss_mb"] for v in VARIANTS},
        "summary_agent": PRIMARY,
        "rl_fixed_perplexity_ratio": agg["rl_fixed"]["perplexity"] / base["perplexity"],
        "rl_minus_best_fixed_per_seed": gaps, "best_fixed_per_seed": best_names,
        "untied_last_10pct_improvement_per_seed": conv,
        "rl_maps_distinct_over_seeds": len({tuple(m) for m in agg[PRIMARY]["tying_maps"]}),
        # the agent without a parameter budget, reported beside the summary's
        "unbudgeted_rl_params_ratio": agg["rl"]["params_trainable"] / base["params_trainable"],
        "unbudgeted_rl_perplexity_ratio": agg["rl"]["perplexity"] / base["perplexity"],
        "unbudgeted_rl_minus_best_fixed_perplexity": statistics.fmean(gaps_of("rl")[0]),
    }
    return summary, agg, extra


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("--map", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=STEPS, help=f"multiple of {CURVE_POINTS}")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--eval-blocks", type=int, default=EVAL_BLOCKS, help="validation blocks (smoke runs: fewer)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (one thread each)")
    ap.add_argument("--data", type=Path, default=RUNS, help="resumable run rows (JSON lines)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.child:
        fixed = [int(v) for v in args.map.split(",")] if args.map else None
        print(json.dumps(child(args.child[0], int(args.child[1]), args.steps, fixed, args.eval_blocks)))
        return
    if args.steps % CURVE_POINTS:
        ap.error(f"--steps must be a multiple of {CURVE_POINTS}")

    want = setup(args.steps, args.eval_blocks)
    rows = read_rows(args.data, want)
    t0 = time.perf_counter()

    def one(variant: str, seed: int) -> None:
        fixed = rows[(CONTROLS[variant], seed)]["tying_map"] if variant in CONTROLS else None
        r = run_child(variant, seed, args.steps, fixed, args.eval_blocks)
        r.update(setup=want, commit=git_commit(), load_after=round(os.getloadavg()[0], 2))
        args.data.parent.mkdir(parents=True, exist_ok=True)
        with open(args.data, "a") as f:
            f.write(json.dumps(r) + "\n")
        rows[(variant, seed)] = r
        print(f"  {variant:13s} seed {seed}: ppl {r['perplexity']:.4f}  params {r['params_trainable']:,}  "
              f"state peak {r['state_peak_mb']:.2f} MB  rss {r['peak_rss_mb']:.0f} MB  "
              f"train {r['train_seconds']:.0f} s  map {r['tying_map']}", flush=True)

    # phase 1: every variant but the controls, the order rotated per seed; phase 2: the controls
    names = [v for v in VARIANTS if v not in CONTROLS]
    todo1 = [(v, s) for k, s in enumerate(args.seeds)
             for v in names[k % len(names):] + names[:k % len(names)] if (v, s) not in rows]
    todo2 = [(c, s) for c in CONTROLS for s in args.seeds if (c, s) not in rows]
    for todo in (todo1, todo2):
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for fut in [pool.submit(one, v, s) for v, s in todo]:
                fut.result()

    summary, agg, extra = summarize(rows, list(args.seeds))
    print(f"\n{'variant':13s} {'perplexity':>10s} {'params':>9s} {'state peak MB':>13s} "
          f"{'peak RSS MB':>11s} {'train s (med)':>13s}  distinct layers")
    for v, a in agg.items():
        print(f"{v:13s} {a['perplexity']:10.4f} {a['params_trainable']:9,.0f} {a['state_peak_mb']:13.2f} "
              f"{a['peak_rss_mb']:11.1f} {a['train_seconds_median']:13.1f}  {a['n_distinct_layers']}")
    met = {f"{k} {t}": (summary[k] <= float(t.split()[1])) and (k != "tying_perplexity_ratio" or summary["converged"])
           for k, t in TARGETS.items()}
    print("\nsummary:", json.dumps(summary), "\ntargets met:", json.dumps(met))
    used = [rows[(v, s)] for v in VARIANTS for s in args.seeds]
    wall = sum(r["process_seconds"] for r in used)
    write_result(
        args.out, summary,
        provenance(commits=[r["commit"] for r in used], seeds=list(args.seeds), wall_s=wall,
                   threads_per_run=1, jobs=args.jobs, protocol=__doc__),
        claim="rl layer tying: far fewer trainable parameters than untied at about the same perplexity, "
              "and no worse than the best fixed map of its size",
        targets=TARGETS, targets_met=met, setup=want, variants=agg, extra=extra,
        runs=[{k: v for k, v in r.items() if k != "setup"} for r in used],
        driver_seconds=time.perf_counter() - t0)
    print(f"wrote {args.out}  (sum of run wall times {wall:.0f} s)")


if __name__ == "__main__":
    main()
