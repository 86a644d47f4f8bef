"""Wall-clock harness: inference paths timed interleaved against a full-depth forward.

Every function takes what it times as arguments (callables ``fn(x, mask)`` and a prepared test
split with ``input_ids`` / ``attention_mask``), so any question can time its own paths:

* :func:`timing_batches`: the rows timed (``b32``: the first ``n32`` rows in batches of 32,
  ``b1``: the first ``n1`` rows one by one), trimmed of common padding;
* :func:`time_pass`: one pass of ``fn`` over batches under ``torch.inference_mode``;
* :func:`wall_ratios`: each path's median pass time over the full forward's, interleaved over
  ``rounds`` (the order reversed every other round) after a warm-up, and the ratio paired
  within each round.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable


def time_pass(fn: Callable, batches, rounds_times: list) -> None:
    """Time one pass of ``fn(x, mask)`` over ``batches``; append the seconds to ``rounds_times``."""
    import torch

    t0 = time.perf_counter()
    with torch.inference_mode():
        for x, m in batches:
            fn(x, m)
    rounds_times.append(time.perf_counter() - t0)


def timing_batches(test, n32: int = 128, n1: int = 16) -> dict[str, list]:
    """``{"b32": the first n32 rows of ``test`` in batches of 32, "b1": the first n1 one by
    one}``, each batch ``(x, mask)`` trimmed of common padding."""
    from archsearch.models.config import trim_padding

    n32 = min(n32, len(test))
    b32 = [trim_padding(test.input_ids[i:i + 32], test.attention_mask[i:i + 32]) for i in range(0, n32, 32)]
    b1 = [trim_padding(test.input_ids[i:i + 1], test.attention_mask[i:i + 1]) for i in range(min(n1, len(test)))]
    return {"b32": b32, "b1": b1}


def wall_ratios(paths: dict[str, Callable], full: Callable, test, rounds: int,
                batches: dict[str, list] | None = None) -> dict:
    """Median pass time of each of ``paths`` over ``full``'s, interleaved, on ``batches``
    (default :func:`timing_batches` of ``test``): ``{path}:wall_ratio_{tag}``,
    ``full_ms_per_sample_{tag}``, and ``{path}:round_ratios_{tag}`` (one pass of the path over
    the full model's pass of the same round, adjacent in time, so that a drift of the machine's
    speed between rounds cancels)."""
    named = {"full": full, **paths}
    res = {}
    for tag, bs in (batches or timing_batches(test)).items():
        times = {k: [] for k in named}
        for fn in named.values():  # warm-up
            time_pass(fn, bs[:1], [])
        for r in range(rounds):
            order = list(named.items()) if r % 2 == 0 else list(named.items())[::-1]
            for k, fn in order:
                time_pass(fn, bs, times[k])
        med = {k: statistics.median(v) for k, v in times.items()}
        for k in paths:
            res[f"{k}:wall_ratio_{tag}"] = med[k] / med["full"]
            res[f"{k}:round_ratios_{tag}"] = [a / b for a, b in zip(times[k], times["full"])]
        res[f"full_ms_per_sample_{tag}"] = 1000 * med["full"] / sum(x.shape[0] for x, _ in bs)
    return res
