"""Claim (issue 64): under a domain shift with no labels, DHT's stop rule adapted online
(:class:`archsearch.dynamic.depth.online.OnlineStopping`, ``adapt: bandit``) keeps the FLOPs
budget the frozen rule breaks, at no accuracy cost at equal FLOPs.

Protocol: ``benchmarks/depth/protocols/shift.json`` (committed before any run). In short:

* ``run`` (about 6 minutes per seed on 2 cores): trains, per seed, the multi-exit MiniLM-L6 of
  :mod:`benchmarks.depth.stop_policies` (its ``MODEL_CFG``: DHT cascade at 0.5x, 1 epoch of
  rotten_tomatoes_sentences) through the trainable's loop, and stores every exit's class
  probabilities, labels and padded lengths on the rt validation and test splits and on
  ``../shared/data/sentiment_shift/{amazon,nyt}.csv`` (256-row batches in file order) in
  ``benchmarks/depth/runs/shift_exits/seed{N}.npz``, with the commit, command, machine and the
  model's cascade predict time per row at batch 32 (rt test, 2 threads) in ``seed{N}.json``; after
  the dumps, the bandit adapter's own time per row on the rt test stream
  (``adapter_update_ms_per_row``). A seed already dumped is not re-run; seeds dumped apart pool
  in ``analyze``.
* ``analyze`` (a minute): per seed, every rule of the protocol is fitted and calibrated on the rt
  validation rows (the offline refit and the oracle on the target's calibration half) to each
  budget, then played on each stream -- amazon, nyt and, in-domain, rt test -- in one fixed
  order, 32 rows a batch (the online rules learn on the way; labels never reach them: they get
  contexts, exit classes and costs only); everything is scored on the stream's second half.

``summary``: one section per stream (``amazon``, ``nyt``, ``in_domain``) with, per rule, its
scored-half accuracy at 0.5x FLOPs (interpolated over the budgets, mean over seeds) and its
executed fraction at budget 0.5; ``bandit_budget_abs_error`` (and ``frozen_``, ...), gains in
points with paired bootstrap intervals (``_ci``), the accuracy over time (first 500 rows vs the
rest), what the bandit learned; and ``bandit_update_overhead``.

    python -m benchmarks.depth.shift run --seeds 0-2      # dumps (resumable per seed)
    python -m benchmarks.depth.shift analyze|check [--design bandit|dual]   # default: both designs
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.depth.stop_policies import (K, MODEL_CFG, _curves_at_main, bootstrap_gain, exit_costs,
                                            exit_probs, split_outputs, split_tables, trajectory)
from benchmarks.evidence.cli import Command
from benchmarks.evidence.ledger import Read
from benchmarks.evidence.provenance import ROOT, git_commit, machine, provenance
from benchmarks.evidence.results import build_result
from benchmarks.testbeds import minilm

HERE = Path(__file__).resolve().parent
DUMPS = HERE / "runs" / "shift_exits"
RESULT = HERE / "results" / "shift.json"
PROTOCOL = HERE / "protocols" / "shift.json"
SHIFT_DATA = ROOT.parent / "shared" / "data" / "sentiment_shift"
DOMAINS = ("amazon", "nyt")
#: the streams: section name -> (stored split, test set of the ledger)
STREAMS = {"amazon": ("amazon", "sentiment_shift:amazon"), "nyt": ("nyt", "sentiment_shift:nyt"),
           "in_domain": ("test", "rt_sentences:test")}
BUDGETS = (0.4, 0.45, 0.5, 0.55, 0.6)
MAIN = 0.5
BATCH = 32
STATIC_EXIT = 2  # exit index of depth 3: 0.5x FLOPs at any length
RULES = ("frozen", "bandit", "confidence", "confidence_online", "static", "refit", "oracle")
ONLINE = ("bandit", "confidence_online", "dual")
#: the rules fitted on the source rows: name -> (family, refit: None = frozen, else online with
#: or without refits from explored rows)
SOURCE_RULES = {"frozen": ("default", None), "bandit": ("default", True), "dual": ("default", False),
                "confidence": ("confidence", None), "confidence_online": ("confidence", False)}
#: the designs measured: name -> (protocol, result, the adaptive rule; its rules are RULES plus it)
DESIGNS = {"bandit": (PROTOCOL, RESULT, "bandit"),
           "dual": (HERE / "protocols" / "shift_dual.json", HERE / "results" / "shift_dual.json", "dual")}


# ------------------------------------------------------------------------------------- dump
def _encode_csv(path: Path, tokenizer, max_len: int):
    """``(ids, mask, labels)`` of a ``text,label`` CSV (labels pos = 1, neg = 0)."""
    import pandas as pd

    from archsearch.data.prepare import pad_encoded

    df = pd.read_csv(path)
    ids, mask = pad_encoded(tokenizer, tokenizer.encode_batch(list(df["text"].astype(str))), max_len)
    y = np.array([{"pos": 1, "neg": 0}[v] for v in df["label"]])
    return ids, mask, y


def domain_outputs(model, tokenizer, max_len: int, batch: int = 256) -> dict[str, np.ndarray]:
    """Every exit's probabilities, labels and padded lengths on each shift domain, file order."""
    import torch

    from archsearch.models.config import trim_padding

    out = {}
    with torch.inference_mode():
        for name in DOMAINS:
            ids, mask, y = _encode_csv(SHIFT_DATA / f"{name}.csv", tokenizer, max_len)
            P, T = [], []
            for i in range(0, len(ids), batch):
                x, m = trim_padding(ids[i:i + batch], mask[i:i + batch])
                P.append(exit_probs(model, x, m).numpy())
                T += [x.shape[1]] * len(x)
            out.update({f"{name}_p": np.concatenate(P), f"{name}_y": y, f"{name}_T": np.array(T)})
    return out


def predict_ms_per_row(loop, batch: int = BATCH) -> float:
    """The trained gating's cascade predict time per row at ``batch`` rows (rt test, best of 3)."""
    import torch

    from archsearch.models.config import trim_padding

    test = loop.data["test"]
    loop.model.eval()
    best = float("inf")
    with torch.inference_mode():
        for _ in range(3):
            t0 = time.perf_counter()
            for i in range(0, len(test.input_ids), batch):
                x, m = trim_padding(test.input_ids[i:i + batch], test.attention_mask[i:i + batch])
                loop.gating.predict(x, m)
            best = min(best, time.perf_counter() - t0)
    return 1e3 * best / len(test.input_ids)


def adapter_ms_per_row(npz: Path, seed: int, passes: int = 3) -> float:
    """The bandit adapter's own time per row (ms; its exploration draws and updates, CPU) on
    the rt test stream at budget 0.5, batches of :data:`BATCH`, best of ``passes``."""
    d = np.load(npz)
    val, test = split_tables(d, "validation", exit_costs()), split_tables(d, "test", exit_costs())
    rule, price = fit_default_rule(val, MAIN)
    order = stream_order(len(test["y"]))
    return 1e3 * min(stream_online(rule, price, MAIN, val, test, order, trajectory, refit=True, seed=seed,
                                   timed=True)[2] for _ in range(passes))


def time_adapters(out: Path, threads: int) -> None:
    """Add ``adapter_update_ms_per_row`` to every dumped seed's json that lacks it (run after the
    dumps, alone on the machine)."""
    import torch

    torch.set_num_threads(threads)
    for meta_file in sorted(out.glob("seed*.json")):
        meta = json.loads(meta_file.read_text())
        if "adapter_update_ms_per_row" in meta:
            continue
        meta["adapter_update_ms_per_row"] = round(adapter_ms_per_row(out / f"seed{meta['seed']}.npz", int(meta["seed"])), 5)
        meta_file.write_text(json.dumps(meta, indent=1) + "\n")
        print(f"seed {meta['seed']}: adapter {meta['adapter_update_ms_per_row']} ms per row", flush=True)


def dump(seeds: list[int], out: Path, threads: int) -> None:
    import torch

    from archsearch.data.tokenizer import load_tokenizer
    from archsearch.tune.trainable import TrialLoop

    if not SHIFT_DATA.is_dir():
        raise ValueError(f"{SHIFT_DATA}: the sentiment shift sets are not here (../shared/data)")
    torch.set_num_threads(threads)
    protocol = {"max_len": 48, "lr": 5e-05, "batch_size": 32, "epochs": 1, "train_samples": None}
    ckpt, data = minilm.load_data(protocol)
    tokenizer = load_tokenizer("pretrained", ckpt)
    steps = math.ceil(len(data.train) / protocol["batch_size"])
    out.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        if (out / f"seed{seed}.npz").exists():
            print(f"seed {seed}: already dumped", flush=True)
            continue
        t0 = time.perf_counter()
        cfg = {"init_from": ckpt, "warmup_steps": max(1, steps // 10), **MODEL_CFG}
        loop = TrialLoop(cfg, data, {"epochs": 1, "batch_size": protocol["batch_size"], "seed": seed})
        while loop.epoch < 1:
            loop.train_epoch()
        loop.model.eval()
        loop.gating.before_evaluate("validation")  # the calibrated cascade the timing runs
        arrays = {**split_outputs(loop, exit_probs), **domain_outputs(loop.model, tokenizer, protocol["max_len"])}
        np.savez_compressed(out / f"seed{seed}.npz", **arrays)
        meta = {"seed": seed, "commit": git_commit(), "command": " ".join(["python", *sys.argv]),
                "machine": machine(), "model_cfg": MODEL_CFG, "protocol": protocol, "threads": threads,
                "predict_ms_per_row_b32": round(predict_ms_per_row(loop), 4),
                "wall_s": round(time.perf_counter() - t0, 1)}
        (out / f"seed{seed}.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"seed {seed}: dumped in {meta['wall_s']} s", flush=True)


# ---------------------------------------------------------------------------------- rules
def _conf_contexts(t: dict) -> np.ndarray:
    """``N x K x 2`` contexts of a confidence rule: (max probability, 1)."""
    return np.stack([t["maxp"], np.ones_like(t["maxp"])], -1)


def fit_default_rule(t: dict, budget: float, quality: str = "match"):
    """DHT's default stop rule (tuned, trajectory context) fitted and calibrated on rows ``t``
    to ``budget`` as :meth:`DHTGating.calibrate` does: ``(rule, price)``; the rule's window
    holds ``t``'s rows. ``quality``: ``match`` (label-free) or ``correct`` (labels: the oracle)."""
    from archsearch.dynamic.budget import calibrate_price
    from archsearch.dynamic.depth.online import executed_fraction
    from archsearch.dynamic.depth.stopping import LinearStopping

    X, q = trajectory(t), t[quality]
    rule = LinearStopping(K, X.shape[-1], rule="tuned", score_col=0, window=2048)

    def fraction(price):
        rule.fit(price, data=(X, q, t["cost"]))
        return executed_fraction(rule.route(X, t["cost"], price), t["cost"])

    price, _ = calibrate_price(fraction, budget)
    frac = fraction(price)
    if abs(frac - budget) > 0.005:
        rule.calibrate_offset(lambda: executed_fraction(rule.route(X, t["cost"], price), t["cost"]), budget, frac)
    rule._remember(X[-2048:], q[-2048:], t["cost"][-2048:])
    return rule, price


def fit_confidence(t: dict, budget: float):
    """One max-probability threshold for every exit (``gating: confidence_exit``) calibrated on
    ``t`` to ``budget``, as a confidence-rule :class:`LinearStopping` (``price`` 0)."""
    from archsearch.dynamic.budget import calibrate_monotone
    from archsearch.dynamic.depth.online import executed_fraction
    from archsearch.dynamic.depth.stopping import LinearStopping

    X = _conf_contexts(t)
    rule = LinearStopping(K, 2, rule="confidence", score_col=0)
    rule.price = 0.0

    def at(thr):
        rule.cut[:] = thr
        return executed_fraction(rule.route(X, t["cost"], 0.0), t["cost"])

    thr, _ = calibrate_monotone(at, budget, 0.0, 1.0, iters=40, decreasing=False)
    rule.cut[:] = thr
    return rule, 0.0


def stream_online(rule, price: float, budget: float, calib: dict, stream: dict, order: np.ndarray,
                  contexts, refit: bool, seed: int, timed: bool = False) -> tuple:
    """Play ``stream``'s rows in ``order``, ``BATCH`` at a time, through an
    :class:`OnlineStopping` around a copy of ``rule`` (sensitivity measured on ``calib``, the
    source rows). The adapter gets contexts, exit classes and costs, never labels. Returns
    the exits per row (in the stream table's row order) and what it learned; ``timed``: also
    the adapter's own seconds per row (its draws and updates, not the rule's decisions)."""
    from archsearch.dynamic.depth.online import OnlineStopping, offset_sensitivity

    rule = copy.deepcopy(rule)
    g = offset_sensitivity(rule, contexts(calib), calib["cost"], price)
    ad = OnlineStopping(rule, price=price, budget=budget, sensitivity=g, refit=refit,
                        explore=0.05 if refit else 0.0, seed=seed)
    X, cls, cost = contexts(stream)[order], stream["cls"][order], stream["cost"][order]
    exits, seconds = np.empty(len(order), dtype=int), 0.0
    for i in range(0, len(order), BATCH):
        sl = slice(i, i + BATCH)
        t0 = time.perf_counter()
        explored = ad.explore_mask(len(X[sl]))
        route_t = time.perf_counter()
        exits[sl] = ad.route(X[sl], cost[sl], explored)
        route_t = time.perf_counter() - route_t
        ad.observe(exits[sl], cost[sl], explored, X[sl], cls[sl])
        seconds += time.perf_counter() - t0 - route_t  # the adapter's own work: draws and updates
    out = np.empty_like(exits)
    out[order] = exits
    learned = {"offset": float(ad.rule.offset), "refits": ad.refits, "explored_share": ad.explored / max(ad.rows, 1),
               "stream_fraction": ad.fraction}
    return (out, learned, seconds / max(ad.rows, 1)) if timed else (out, learned)


def stream_order(n: int) -> np.ndarray:
    """The fixed stream order of a domain's ``n`` rows (the same for every seed)."""
    return np.random.default_rng(64).permutation(n)


def rule_exits(name: str, val: dict, tgt: dict, order: np.ndarray, budget: float, seed: int,
               fits: dict | None = None):
    """Exits per row of ``tgt`` (its table order) under rule ``name`` at ``budget``, and what an
    online rule learned (``None`` for the others). ``fits``: a cache of the source fits (keyed
    by ``seed``, kind and budget; the online rules adapt copies)."""
    if name in SOURCE_RULES:
        family, refit = SOURCE_RULES[name]
        fit, contexts = {"default": (fit_default_rule, trajectory), "confidence": (fit_confidence, _conf_contexts)}[family]
        fits = {} if fits is None else fits
        key = (seed, family, budget)
        if key not in fits:
            fits[key] = fit(val, budget)
        rule, price = fits[key]
        if refit is None:  # frozen
            return rule.route(contexts(tgt), tgt["cost"], price), None
        return stream_online(rule, price, budget, val, tgt, order, contexts, refit=refit, seed=seed)
    if name == "static":
        return np.full(len(tgt["y"]), STATIC_EXIT), None
    if name in ("refit", "oracle"):
        calib = {k: v[order[:len(order) // 2]] for k, v in tgt.items()}  # the stream's first half
        rule, price = fit_default_rule(calib, budget, quality="match" if name == "refit" else "correct")
        return rule.route(trajectory(tgt), tgt["cost"], price), None
    raise ValueError(f"unknown rule {name!r}")


# ---------------------------------------------------------------------------------- analyze
def _fraction(t: dict, exits: np.ndarray, rows: np.ndarray) -> float:
    r = np.asarray(rows)
    return float(t["cost"][r, exits[r]].sum() / t["cost"][r, -1].sum())


def _accuracy(t: dict, exits: np.ndarray, rows: np.ndarray) -> float:
    r = np.asarray(rows)
    return float(t["correct"][r, exits[r]].mean())


def analyze(dumps: Path, out: Path | None = None, record_reads: bool = True, design: str = "bandit") -> dict:
    """``out``'s content (default: the design's result) from the exits stored in ``dumps``, for
    ``design`` (:data:`DESIGNS`; raises ValueError when there are no dumps or no such design)."""
    if design not in DESIGNS:
        raise ValueError(f"design: one of {sorted(DESIGNS)}, got {design!r}")
    protocol_file, default_out, adaptive = DESIGNS[design]
    out = default_out if out is None else out
    rules = RULES if adaptive in RULES else RULES + (adaptive,)
    t0 = time.perf_counter()
    metas = [json.loads(f.read_text()) for f in sorted(dumps.glob("seed*.json"))]
    if not metas:
        raise ValueError(f"no dumps in {dumps}: run `python -m benchmarks.depth.shift run` first")
    cost_of = exit_costs()
    summary: dict = {}
    details: dict = {}
    fits = {}
    for section, (split, _) in STREAMS.items():
        per_rule = {r: {"curves": [], "at_0.5": [], "frac_0.5": [], "stream_frac_0.5": [], "early": [], "late": [],
                        "learned": [], "hist": np.zeros(K, int)} for r in rules}
        tables = []
        for meta in metas:
            seed = int(meta["seed"])
            d = np.load(dumps / f"seed{seed}.npz")
            val, tgt = split_tables(d, "validation", cost_of), split_tables(d, split, cost_of)
            order = stream_order(len(tgt["y"]))
            scored = order[len(order) // 2:]
            sc = {k: v[scored] for k, v in tgt.items()}
            tables.append(sc)
            for r in rules:
                by_budget = []
                for b in BUDGETS:
                    exits, learned = rule_exits(r, val, tgt, order, b, seed, fits)
                    by_budget.append(exits[scored])
                    if b == MAIN:
                        pr = per_rule[r]
                        pr["frac_0.5"].append(_fraction(tgt, exits, scored))
                        pr["stream_frac_0.5"].append(_fraction(tgt, exits, order))
                        pr["early"].append((_accuracy(tgt, exits, order[:500]), _fraction(tgt, exits, order[:500])))
                        pr["late"].append((_accuracy(tgt, exits, order[500:]), _fraction(tgt, exits, order[500:])))
                        pr["hist"] += np.bincount(exits[scored], minlength=K)
                        if learned is not None:
                            pr["learned"].append(learned)
                per_rule[r]["curves"].append((sc, by_budget))
                acc = float(_curves_at_main(sc, by_budget, np.arange(len(sc["y"]))[None])[0])
                per_rule[r]["at_0.5"].append(acc)
        sec: dict = {}
        for r in rules:
            pr = per_rule[r]
            sec[f"{r}_acc_at_0.5"] = float(np.mean(pr["at_0.5"]))
            sec[f"{r}_flops_fraction_at_budget_0.5"] = float(np.mean(pr["frac_0.5"]))
            sec[f"{r}_budget_abs_error"] = float(abs(np.mean(pr["frac_0.5"]) - MAIN))
            sec[f"{r}_budget_abs_error_stream"] = float(abs(np.mean(pr["stream_frac_0.5"]) - MAIN))
        for a, b in (("bandit", "frozen"), ("bandit", "confidence_online"), ("bandit", "confidence"),
                     ("refit", "frozen"), ("oracle", "frozen"), ("confidence_online", "confidence"),
                     ("bandit", "static"), ("frozen", "static")) + (() if adaptive == "bandit" else (
                         (adaptive, "frozen"), (adaptive, "confidence_online"), (adaptive, "confidence"),
                         (adaptive, "static"))):
            key = f"{a}_gain_over_{b}_pts_at_0.5"
            sec[key] = 100 * (sec[f"{a}_acc_at_0.5"] - sec[f"{b}_acc_at_0.5"])
            sec[key + "_ci"] = bootstrap_gain(per_rule[a]["curves"], per_rule[b]["curves"])
        head, low = sec["refit_gain_over_frozen_pts_at_0.5"], sec["refit_gain_over_frozen_pts_at_0.5_ci"][0]
        sec["bandit_share_of_refit_headroom"] = (sec["bandit_gain_over_frozen_pts_at_0.5"] / head
                                                 if head >= 1.0 and low > 0 else None)
        if section == "in_domain":
            sec["bandit_minus_frozen_pts_at_0.5"] = sec["bandit_gain_over_frozen_pts_at_0.5"]
            sec["bandit_minus_frozen_pts_at_0.5_ci"] = sec["bandit_gain_over_frozen_pts_at_0.5_ci"]
            sec[f"{adaptive}_minus_frozen_pts_at_0.5"] = sec[f"{adaptive}_gain_over_frozen_pts_at_0.5"]
            sec[f"{adaptive}_minus_frozen_pts_at_0.5_ci"] = sec[f"{adaptive}_gain_over_frozen_pts_at_0.5_ci"]
        sec["over_stream"] = {r: {"first_500": {"accuracy": float(np.mean([e[0] for e in per_rule[r]["early"]])),
                                                "flops_fraction": float(np.mean([e[1] for e in per_rule[r]["early"]]))},
                                  "rest": {"accuracy": float(np.mean([e[0] for e in per_rule[r]["late"]])),
                                           "flops_fraction": float(np.mean([e[1] for e in per_rule[r]["late"]]))}}
                              for r in dict.fromkeys(("frozen", "bandit", "confidence_online", adaptive))}
        sec["learned"] = {r: {"per_seed": per_rule[r]["learned"]} for r in ONLINE if r in rules}
        sec["exit_share_at_budget_0.5"] = {r: (per_rule[r]["hist"] / max(per_rule[r]["hist"].sum(), 1)).round(4).tolist()
                                           for r in dict.fromkeys(("frozen", "bandit", "refit", "oracle", adaptive))}
        sec["scored_rows"] = len(tables[0]["y"])
        summary[section] = sec
        details[section] = {r: {"acc_at_0.5_per_seed": per_rule[r]["at_0.5"],
                                "flops_fraction_at_budget_0.5_per_seed": per_rule[r]["frac_0.5"]} for r in rules}
        print(f"{section}: " + ", ".join(f"{r} {100 * sec[f'{r}_acc_at_0.5']:.2f}@{sec[f'{r}_flops_fraction_at_budget_0.5']:.3f}"
                                         for r in rules), flush=True)
    predict_ms = float(np.mean([m["predict_ms_per_row_b32"] for m in metas]))
    summary["bandit_update_ms_per_row"] = float(np.mean([m["adapter_update_ms_per_row"] for m in metas]))
    summary["predict_ms_per_row_b32"] = predict_ms
    summary["bandit_update_overhead"] = summary["bandit_update_ms_per_row"] / predict_ms
    prov = provenance(commits=[m["commit"] for m in metas] + [git_commit()], seeds=[m["seed"] for m in metas],
                      wall_s=time.perf_counter() - t0, budgets=list(BUDGETS),
                      dumps={str(m["seed"]): {k: m[k] for k in ("commit", "command", "wall_s", "predict_ms_per_row_b32",
                                                          "adapter_update_ms_per_row")}
                             for m in metas})
    protocol = json.loads(protocol_file.read_text())
    reads = [Read(test_set, protocol_file, section) for section, (_, test_set) in STREAMS.items()]
    return build_result(summary, prov, name=Path(out).name, protocol=protocol_file, targets=protocol["targets"],
                        reads=reads, record_reads=record_reads, per_seed=details)


#: the rules the stream figure draws (their executed FLOPs and accuracy along the stream)
FIGURE_RULES = ("frozen", "dual", "bandit", "confidence_online")
FIGURE = ROOT / "docs" / "shift_stream.png"


def stream_figure(dumps: Path, path: Path = FIGURE, window: int = 300) -> Path:
    """Issue 64's accuracy-over-the-stream plot: per target domain (columns) the executed FLOPs
    fraction (executed over full FLOPs summed over the window, as :func:`analyze` counts it) and
    the accuracy (rows) of each rule of :data:`FIGURE_RULES` at budget 0.5, trailing over ``window`` rows of the stream (in its fixed order, the whole stream: the
    calibration half first), mean over the stored seeds; written as a PNG (matplotlib, Agg).
    Same fits and streams as :func:`analyze` (labels only score).

    Raises:
        ValueError: no dumps in ``dumps``, or a stream shorter than ``window``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted(int(json.loads(f.read_text())["seed"]) for f in dumps.glob("seed*.json"))
    if not seeds:
        raise ValueError(f"no dumps in {dumps}: run `python -m benchmarks.depth.shift run` first")
    cost_of, fits = exit_costs(), {}
    fig, axes = plt.subplots(2, len(DOMAINS), figsize=(5.5 * len(DOMAINS), 6), sharex="col")
    kernel = np.ones(window) / window
    for j, dom in enumerate(DOMAINS):
        curves: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {r: [] for r in FIGURE_RULES}
        for seed in seeds:
            d = np.load(dumps / f"seed{seed}.npz")
            val, tgt = split_tables(d, "validation", cost_of), split_tables(d, STREAMS[dom][0], cost_of)
            order = stream_order(len(tgt["y"]))
            if len(order) < window:
                raise ValueError(f"{dom}: {len(order)} rows, fewer than the window of {window}")
            for r in FIGURE_RULES:
                exits = rule_exits(r, val, tgt, order, MAIN, seed, fits)[0][order]
                rows = np.arange(len(order))
                executed = np.convolve(tgt["cost"][order][rows, exits], kernel, "valid")
                full = np.convolve(tgt["cost"][order][:, -1], kernel, "valid")
                correct = tgt["correct"][order][rows, exits].astype(float)
                curves[r].append((executed / full, np.convolve(correct, kernel, "valid")))
        for r in FIGURE_RULES:
            x = np.arange(window, window + len(curves[r][0][0]))
            for i in range(2):
                axes[i, j].plot(x, np.mean([c[i] for c in curves[r]], axis=0), label=r, lw=1.2)
        axes[0, j].axhline(MAIN, color="k", ls=":", lw=0.8)
        axes[0, j].set_title(f"{dom} ({len(seeds)} seeds, trailing mean of {window} rows)")
        axes[1, j].set_xlabel("rows served")
    axes[0, 0].set_ylabel("executed FLOPs fraction (budget 0.5)")
    axes[1, 0].set_ylabel("accuracy")
    axes[0, -1].legend(loc="best", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return path


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dumps", type=Path, default=DUMPS, help="directory of the exits' dumps (default %(default)s)")
    ap.add_argument("--out", type=Path, default=None, help="where the result goes (default: the design's)")
    ap.add_argument("--design", choices=sorted(DESIGNS), default=None,
                    help="analyze/check one design: bandit (protocols/shift.json) or dual "
                         "(protocols/shift_dual.json); default both")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--figure", action="store_true",
                    help=f"analyze: also draw the accuracy and executed FLOPs along each stream ({FIGURE.relative_to(ROOT)})")


def _run(args) -> int:
    dump(args.seeds, args.dumps, args.threads)
    time_adapters(args.dumps, args.threads)
    return 0


def results(args) -> dict[Path, dict]:
    """Each design's result (``analyze``); ``--figure`` with ``analyze`` also draws
    :func:`stream_figure`."""
    out = {(args.out or DESIGNS[d][1]): analyze(args.dumps, args.out, record_reads=not args.check, design=d)
           for d in ([args.design] if args.design else list(DESIGNS))}
    if getattr(args, "figure", False) and not args.check:
        print(f"wrote {stream_figure(args.dumps)}")
    return out


COMMAND = Command(__doc__.split("\n")[0], run=_run, add_arguments=_options, seeds="0-2", results=results)


def main(argv: list[str] | None = None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
