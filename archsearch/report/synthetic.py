"""Deterministic synthetic trial records shaped like the runner's, for tests, demos and the
report benchmark. Nothing here is trained: numbers follow simple formulas plus seeded noise,
loosely calibrated to docs/design.md's from-scratch encoders (accuracy 0.70-0.80 on
rotten_tomatoes, 48 tokens).

Record shape (the runner's contract, see :func:`archsearch.report.write_report`):
``{"trial_id", "status", "config", "metrics", "history", "error"}``.
"""

from __future__ import annotations

import math
import random
from typing import Any

SEQ_LEN = 48
VOCAB = 8000
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "archsearch/tune/trainable.py", line 88, in train\n'
    "    loss.backward()\n"
    "RuntimeError: {msg}"
)


def _cost(cfg: dict[str, Any]) -> tuple[float, int, int]:
    """(FLOPs per sample, params_total, params_trainable) of a pre-LN encoder classifier."""
    d, L, ffn = cfg["d_model"], cfg["n_layers"], cfg["d_model"] * cfg["ffn_mult"]
    per_layer_params = 4 * d * d + 2 * d * ffn
    matmul_flops = 2 * SEQ_LEN * per_layer_params + 2 * 2 * SEQ_LEN * SEQ_LEN * d
    used_fraction = 0.7 if cfg["dynamic"] in ("dht", "depth") else (
        0.8 if cfg["dynamic"] == "lengthdrop" else 1.0)
    flops = L * matmul_flops * used_fraction + 2 * d * 2
    params_total = VOCAB * d + SEQ_LEN * d + L * per_layer_params + 2 * d
    distinct_layers = 1 if cfg["tie_layers"] else L
    params_trainable = params_total - (L - distinct_layers) * per_layer_params
    return float(flops), int(params_total), int(params_trainable)


def anytime_curve(rng: random.Random, flops: float, acc: float, latency_ms: float,
                  n_layers: int, points: int = 8) -> list[dict[str, Any]]:
    """A Length-Adaptive-style anytime curve (``finalize()`` of ``length_drop``): ``points``
    length configurations from ~30% to 100% of the full FLOPs, accuracy dropping as tokens
    are dropped; each point ``{"flops_per_sample", "accuracy", "latency_ms",
    "length_config"}``, sorted by FLOPs."""
    curve = []
    for k in range(points):
        q = 0.3 + 0.7 * k / max(1, points - 1)  # kept fraction of the full FLOPs
        lengths = [max(2, round(SEQ_LEN * q ** ((i + 1) / n_layers))) for i in range(n_layers)]
        curve.append({
            "flops_per_sample": flops * q,
            "accuracy": acc - 0.06 * (1 - q) ** 1.5 + rng.gauss(0, 0.002),
            "latency_ms": latency_ms * (0.35 + 0.65 * q),
            "length_config": lengths,
        })
    return curve


def synthetic_trials(n: int, *, seed: int = 0, epochs: int = 5,
                     p_error: float = 0.04, p_nan: float = 0.02,
                     p_stopped: float = 0.25, dynamic: bool = False) -> list[dict[str, Any]]:
    """``n`` trial records in run order with ``epochs``-epoch histories.

    Mix: about ``p_error`` ERROR trials (traceback, partial history), ``p_nan`` TERMINATED
    trials whose loss diverged (NaN accuracy/val_loss), ``p_stopped`` STOPPED by ASHA after
    1 or 2 epochs; the rest TERMINATED. With ``dynamic``, successful ``lengthdrop`` trials
    (about a quarter) carry an 8-point ``anytime_curve`` and ``tie_layers`` trials a
    ``tying_map`` in their final metrics, as the dynamic strategies report them.
    Deterministic for a given ``seed``.
    """
    rng = random.Random(seed)
    records = []
    for k in range(n):
        cfg = {
            "n_layers": rng.randint(1, 6),
            "d_model": rng.choice([64, 128, 192, 256]),
            "n_heads": rng.choice([2, 4, 8]),
            "ffn_mult": rng.choice([2, 4]),
            "lr": round(10 ** rng.uniform(-4, -2.5), 6),
            "dynamic": rng.choice(["none", "dht", "depth", "lengthdrop"]),
            "tie_layers": rng.random() < 0.3,
        }
        flops, p_total, p_train = _cost(cfg)
        lr_penalty = 0.04 * abs(math.log10(cfg["lr"]) + 3.0)
        final_acc = (0.66 + 0.13 * (1 - math.exp(-flops / 6e6)) - lr_penalty
                     - (0.01 if cfg["dynamic"] != "none" else 0.0) + rng.gauss(0, 0.01))
        sec_per_epoch = 2.0 + flops / 6e5
        roll = rng.random()
        if roll < p_error:
            status, n_ep = "ERROR", rng.randint(0, epochs - 1)
        elif roll < p_error + p_nan:
            status, n_ep = "TERMINATED", epochs
        elif roll < p_error + p_nan + p_stopped:
            status, n_ep = "STOPPED", rng.choice([1, 2])
        else:
            status, n_ep = "TERMINATED", epochs
        diverged = p_error <= roll < p_error + p_nan
        history = []
        for ep in range(1, n_ep + 1):
            progress = 1 - 0.5 ** ep
            acc = 0.5 + (final_acc - 0.5) * progress / (1 - 0.5 ** epochs)
            loss = 0.69 - 1.1 * (acc - 0.5) + rng.gauss(0, 0.005)
            if diverged and ep >= 3:
                acc, loss = math.nan, math.nan
            history.append({
                "epoch": ep, "accuracy": acc, "val_loss": loss, "flops_per_sample": flops,
                "train_seconds": sec_per_epoch * ep,
            })
        if status == "ERROR":
            metrics = dict(history[-1]) if history else {}
            error = TRACEBACK.format(msg=rng.choice([
                "DataLoader worker (pid 4242) exited unexpectedly",
                "shape mismatch: n_heads must divide d_model",
                "Function 'LogSoftmaxBackward0' returned nan values in its 0th output.",
            ]))
        else:
            last = history[-1]
            metrics = {
                "accuracy": last["accuracy"],
                "val_loss": last["val_loss"],
                "flops_per_sample": flops,
                "params_total": p_total,
                "params_trainable": p_train,
                "latency_ms": 0.05 + flops / 2e8 + abs(rng.gauss(0, 0.01)),
                "train_seconds": last["train_seconds"],
            }
            error = None
            if dynamic and cfg["dynamic"] == "lengthdrop" and math.isfinite(last["accuracy"]):
                metrics["anytime_curve"] = anytime_curve(rng, flops, last["accuracy"],
                                                         metrics["latency_ms"], cfg["n_layers"])
            if dynamic and cfg["tie_layers"]:
                metrics["tying_map"] = [0] * cfg["n_layers"]
        metrics.pop("epoch", None)
        records.append({
            "trial_id": f"trial_{k:05d}",
            "status": status,
            "config": cfg,
            "metrics": metrics,
            "history": history,
            "error": error,
        })
    return records


def write_run_dir(run_dir, trials: list[dict[str, Any]], *, space_yaml: str, name: str,
                  searcher: str = "random", wall_seconds: float | None = None):
    """Write ``trials`` as a run directory the runner would leave (``run.json``,
    ``space.yaml``, ``trials/ID.json``, through :class:`archsearch.runs.RunDir`), so
    ``archsearch report`` / ``compare`` can read it.

    Args:
        run_dir: directory to create (parents too).
        trials: records (e.g. from :func:`synthetic_trials`); a ``started`` key keeps their
            order when read back, and is added when missing. Written as the runner writes
            them: non-finite metric values become ``null``.
        space_yaml: the search-space YAML text (its objectives and constraints are used).
        name, searcher, wall_seconds: go to ``run.json`` (:class:`archsearch.runs.RunSpec`;
            seed 0, one CPU and no GPU per trial, started at Unix time 1.7e9).

    Returns:
        The run directory as a :class:`pathlib.Path`.
    """
    from archsearch.runs import RunDir, RunSpec, atomic_write

    run = RunDir(run_dir)
    run.trials_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(run.space_file, space_yaml)
    run.write_spec(RunSpec(name=name, searcher=searcher, seed=0, trials=len(trials),
                           cpus_per_trial=1.0, gpus_per_trial=0.0,
                           space_file=str(run.space_file), started=1.7e9,
                           wall_seconds=wall_seconds))
    for k, rec in enumerate(trials):
        run.write_trial({"started": 1.7e9 + k, **rec})
    return run.path
