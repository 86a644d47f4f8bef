"""How an exported early-exit model runs a batch: a regime per (rows, length), chosen by timing.

Per-sample early exit saves FLOPs, but whether it saves *time* depends on the device and the
batch: on a CPU the cascade's gathers cost little and half the FLOPs is about half the wall
time; on a GPU a small batch is launch-bound, so the full model (replayed as one CUDA graph)
can take less time than a cascade that stops half its rows (``benchmarks/gpu``: DHT at 0.5x
FLOPs ran 1.9x the graphed full model's time at batch 32 on an H200). :class:`Runtime` makes
the choice where the model runs, by measurement, per *regime* -- rows rounded up to a power of
two, length (after trimming padding) rounded up to a power of two -- among
:data:`REGIMES`:

``cascade``
    the gating's own per-sample inference (:meth:`~archsearch.dynamic.base.GatingStrategy.predict_exits`:
    each row leaves at its own exit; on CUDA its segments run as CUDA graph replays where
    measured faster and it picks its own executor, :mod:`archsearch.dynamic.depth.cascade_graphs`).
``static``
    every row through the first ``d`` blocks and exit ``d``: ``d`` the deepest exit whose FLOPs
    at that length are at most the trial's FLOPs budget times the full model's (a static cut at
    the same or lower executed FLOPs; absent when no exit is that cheap). Exit ``d`` is the
    gating's :meth:`~archsearch.dynamic.base.GatingStrategy.exit_model`: the trial's model, or
    for a cascade of complete models (``gating: cascade``) its own cut of ``d`` blocks.
``full``
    every row through every block and the deepest exit (the full model; on CUDA a CUDA graph
    replay where measured faster).

The first :attr:`Runtime.trial_batches` (3) batches of a regime run under every candidate
(the first batch once untimed first: caches, graph captures), each :attr:`Runtime.repeats` (2)
times timed (device synchronised), and return the cascade's outputs; a candidate's time is its
best time per batch, averaged over those batches (at batch 1 a row that exits early says little
about the next). The rule (:func:`choose_regime`): the cascade, which keeps the trial's predictions at its budget,
unless it was measured slower than the full model; then the static cut if it was measured no
slower than the full model, else the full model. So a regime never runs a candidate measured
slower than the full model, and its predictions change only where the cascade would cost time.
:meth:`Runtime.report` lists each regime's times and choice.

Every row reports the FLOPs it **executed** (:mod:`archsearch.models.costs`' analytic count):
its own path under the gathered cascade; under the cascade's whole-batch executors on CUDA
(rows that stopped ride along), the deepest path of the batch (``whole``) or the full model's
(``whole_async``); the cut's or the full model's under ``static`` and ``full``.

``adapt="bandit"`` (DHT's cascade only) keeps the stop rule learning on the unlabeled traffic
it serves (:class:`archsearch.dynamic.depth.online.OnlineStopping`): every batch runs the cascade
(no regime choice: the budget is the point), a seeded share of rows runs to the last exit with
every exit read (the bandit's feedback; their FLOPs count as executed), and after the batch the
rule's offset takes one dual step toward the budget and the explored rows join its window
(refits every 64 of them). ``adapt="dual"``: the dual step alone (no exploration, no refit).
:meth:`Runtime.state_dict` holds the adapter's state. Measured (``benchmarks/depth/shift.py``):
both hold the budget under a shift the frozen rule misses; the bandit loses about a point at equal
FLOPs, the dual step about 0.3 on one domain and nothing on the other (exploratory): the default
stays ``none``.

Gatings without per-sample exits (static, LengthDrop, tied models:
:meth:`~archsearch.dynamic.base.GatingStrategy.exit_depths` is ``None``) have one regime,
``cascade`` (their own inference), and are not timed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

#: The ways :class:`Runtime` can run a batch (module docstring).
REGIMES = ("cascade", "static", "full")
#: What ``regime=`` accepts: a regime, or ``"auto"`` (chosen by timing).
REGIME_CHOICES = ("auto",) + REGIMES
#: What ``adapt=`` accepts (module docstring).
ADAPT_CHOICES = ("none", "dual", "bandit")


def bucket(n: int) -> int:
    """``n`` rounded up to a power of two (1 for ``n <= 1``): the rows or length of a regime."""
    return 1 << max(int(n) - 1, 0).bit_length()


def choose_regime(seconds: dict[str, float]) -> str:
    """The regime to run, from each candidate's best measured time (module docstring).

    Args:
        seconds: ``{regime: seconds}`` for ``"cascade"`` and ``"full"`` and, where a static cut
            exists, ``"static"``.

    Returns:
        ``"cascade"`` when it was no slower than ``"full"``; else ``"static"`` when present and no
        slower than ``"full"``; else ``"full"``. The chosen time is never above ``"full"``'s.

    Raises:
        ValueError: ``"cascade"`` or ``"full"`` missing.
    """
    if "cascade" not in seconds or "full" not in seconds:
        raise ValueError(f"choose_regime needs 'cascade' and 'full' timings, got {sorted(seconds)}")
    full = seconds["full"]
    if seconds["cascade"] <= full:
        return "cascade"
    if "static" in seconds and seconds["static"] <= full:
        return "static"
    return "full"


@dataclass
class Batch:
    """What :meth:`Runtime.run` returns for ``B`` rows: ``logits`` ``B x C`` float32, ``flops``
    ``B`` float64 FLOPs executed per row, ``depth`` ``B`` int64 blocks run before the row's
    output head, ``regime`` the regime that ran (:data:`REGIMES`)."""

    logits: Any
    flops: Any
    depth: Any
    regime: str


class Runtime:
    """Runs an exported model's batches, choosing the regime per (rows, length) by timing
    (module docstring).

    Args:
        model: the :class:`~archsearch.models.transformer.Transformer` (eval mode).
        gating: its trial's gating strategy, with its exported state.
        flops_budget: the trial's FLOPs budget (fraction of the full model's FLOPs) that a
            static cut must not exceed; ``None``: no static cut.
        repeats: timed runs of each candidate per measured batch (the best counts; default 2).
        trial_batches: batches of a regime measured before its choice (default 3: one row's
            exit, at batch 1, says little about the next row's).
        adapt: ``"none"``, ``"dual"`` or ``"bandit"`` (module docstring).
        seed: the exploration draws' seed (``adapt="bandit"``).

    Raises:
        ValueError: an unknown ``adapt``; ``"bandit"`` for a gating other than a trained DHT
            cascade, or without a FLOPs budget.

    Attributes:
        chosen: ``{(rows, length): regime}`` decided so far.
        seconds: ``{(rows, length): {regime: best seconds}}`` measured so far.
    """

    def __init__(self, model, gating, *, flops_budget: float | None = None, repeats: int = 2,
                 trial_batches: int = 3, adapt: str = "none", seed: int = 0):
        self.model, self.gating = model, gating
        self.flops_budget = None if flops_budget is None else float(flops_budget)
        self.repeats, self.trial_batches = int(repeats), max(1, int(trial_batches))
        self._trials: dict[tuple[int, int], dict[str, Any]] = {}  # regimes still being measured
        depths = gating.exit_depths() if model.config.task == "classification" else None
        self.depths: list[int] | None = None if depths is None else [int(d) for d in depths]
        self.chosen: dict[tuple[int, int], str] = {}
        self.seconds: dict[tuple[int, int], dict[str, float]] = {}
        self._graphs: dict = {}  # SegmentGraphs of the static and full regimes per exit model (CUDA only)
        if adapt not in ADAPT_CHOICES:
            raise ValueError(f"adapt: expected one of {ADAPT_CHOICES}, got {adapt!r}")
        self.adapt, self.adapter = adapt, None
        if adapt != "none":
            self.adapter = self._make_adapter(seed, learn=adapt == "bandit")

    def _make_adapter(self, seed: int, learn: bool = True):
        """The :class:`~archsearch.dynamic.depth.online.OnlineStopping` around the gating's own
        stop rule (decisions read its offset), its sensitivity measured on the rule's window
        (the calibration rows it was fitted on)."""
        from archsearch.dynamic.depth.online import OnlineStopping, offset_sensitivity

        g = self.gating
        rule = getattr(g, "stopping", None)
        if not hasattr(g, "explore_exits") or rule is None or getattr(g, "eval_price", None) is None \
                or not self.dynamic:
            raise ValueError(f"adapt {self.adapt!r} needs a DHT cascade with a calibrated stop rule "
                             f"(gating {type(g).__name__})")
        if self.flops_budget is None:
            raise ValueError(f"adapt {self.adapt!r} needs the trial's flops_budget")
        rows = getattr(g, "calibration_window", None)
        if rows is None:
            raise ValueError(f"adapt {self.adapt!r} needs the rows the stop rule was calibrated on, which "
                             "this export predates: export the trial again")
        Xs, q, c = rows
        price = float(g.eval_price)
        sens = offset_sensitivity(rule, Xs, c, price)
        if learn:  # refits start from the calibration rows (the training rows' qualities are another scale)
            rule.Xs, rule.q, rule.c = Xs[-rule.window:], q[-rule.window:], c[-rule.window:]
        return OnlineStopping(rule, price=price, budget=self.flops_budget, sensitivity=sens, seed=seed,
                              explore=0.05 if learn else 0.0, refit=learn)

    def _run_adapted(self, x, mask) -> Batch:
        """One batch under ``adapt="dual"`` or ``"bandit"`` (module docstring)."""
        import numpy as np
        import torch

        with self.adapter.lock:  # one batch's decisions and its update together (threads)
            return self._run_adapted_locked(x, mask)

    def _run_adapted_locked(self, x, mask) -> Batch:
        import numpy as np
        import torch

        g, ad = self.gating, self.adapter
        B, T, K = int(x.shape[0]), int(x.shape[1]), len(self.depths)
        explored = ad.explore_mask(B)
        e_idx, r_idx = np.flatnonzero(explored), np.flatnonzero(~explored)
        logits = flops = depth = None
        Xs, classes = None, np.zeros((B, K), dtype=np.int64)
        for idx, explore in ((r_idx, False), (e_idx, True)):
            if not len(idx):
                continue
            sel = torch.as_tensor(idx, device=x.device)
            xs, ms = x.index_select(0, sel), None if mask is None else mask.index_select(0, sel)
            if explore:
                lg, X, cls, f = g.explore_exits(xs, ms)
                d = torch.full((len(idx),), self.depths[-1], dtype=torch.long)
                if Xs is None:
                    Xs = np.zeros((B,) + X.shape[1:])
                Xs[idx], classes[idx] = X, cls
            else:
                lg, f, d = g.predict_exits(xs, ms)
            if logits is None:
                logits = lg.new_empty((B,) + tuple(lg.shape[1:]))
                flops, depth = torch.empty(B, dtype=torch.float64), torch.empty(B, dtype=torch.long)
            logits[sel] = lg
            flops[torch.as_tensor(idx)] = torch.as_tensor(f, dtype=torch.float64).cpu()
            depth[torch.as_tensor(idx)] = torch.as_tensor(d).cpu().long()
        exits = np.searchsorted(np.asarray(self.depths), depth.numpy())
        costs = np.broadcast_to(g.stop_costs(T), (B, K))
        ad.observe(exits, costs, explored, Xs, classes)
        return Batch(logits, flops, depth, "cascade")

    def state_dict(self) -> dict[str, Any]:
        """What a restart needs: the adapter's state (``{}`` without ``adapt``)."""
        return {} if self.adapter is None else {"adapter": self.adapter.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (ignored without an adapter)."""
        if self.adapter is not None and state.get("adapter"):
            self.adapter.load_state_dict(state["adapter"])

    @property
    def dynamic(self) -> bool:
        """Whether there is a choice to make (a gating with per-sample exits)."""
        return self.depths is not None and len(self.depths) > 1

    # ------------------------------------------------------------------ the regimes
    def static_depth(self, T: int) -> int | None:
        """The static cut's depth at length ``T``: the deepest exit (below the last) whose FLOPs
        are at most :attr:`flops_budget` times the full model's; ``None`` when none is."""
        from archsearch.models import costs

        if not self.dynamic or self.flops_budget is None:
            return None
        full = costs.flops_per_sample(self.model.config, T)
        ok = [d for d in self.depths[:-1]
              if costs.flops_per_sample(self.model.config, T, n_layers=d) <= self.flops_budget * full + 1e-9]
        return max(ok) if ok else None

    def candidates(self, T: int) -> list[str]:
        """The regimes to time at length ``T``: the cascade, the static cut (when there is one)
        and the full model; only the cascade for a gating without exits."""
        if not self.dynamic:
            return ["cascade"]
        return ["cascade"] + (["static"] if self.static_depth(T) is not None else []) + ["full"]

    def run_regime(self, regime: str, x, mask) -> Batch:
        """Run one batch (``B x T`` ids, ``B x T`` bool mask) under ``regime``.

        Raises:
            ValueError: an unknown regime, or ``static`` where no static cut exists.
        """
        import torch

        from archsearch.models import costs

        B, T = int(x.shape[0]), int(x.shape[1])
        if regime == "cascade":
            logits, flops, depth = self.gating.predict_exits(x, mask)
            flops = self._executed(torch.as_tensor(flops, dtype=torch.float64), x)
            return Batch(logits, flops, torch.as_tensor(depth), "cascade")
        if regime == "static":
            d = self.static_depth(T)
            if d is None:
                raise ValueError("no static cut within the FLOPs budget for this model")
        elif regime == "full":
            d = int(self.model.config.n_layers)
        else:
            raise ValueError(f"regime: expected one of {REGIMES}, got {regime!r}")
        logits = self._cut(x, mask, d)
        f = float(costs.flops_per_sample(self.model.config, T, n_layers=d))
        return Batch(logits, torch.full((B,), f, dtype=torch.float64),
                     torch.full((B,), d, dtype=torch.long), regime)

    def _cut(self, x, mask, d: int):
        """Logits of every row after the first ``d`` blocks (exit ``d``'s head) of the gating's
        :meth:`~archsearch.dynamic.base.GatingStrategy.exit_model`: on CUDA through
        :func:`~archsearch.dynamic.depth.exits.run_cascade` with one exit, so the segment runs
        as a CUDA graph replay where measured faster; elsewhere one eager forward."""
        m = self.gating.exit_model(d)
        if not x.is_cuda:
            return m(x, mask, n_layers=d)
        from archsearch.dynamic.depth.cascade_graphs import SegmentGraphs, model_signature
        from archsearch.dynamic.depth.exits import run_cascade

        # one set of graphs per model: a cascade's cut and its full model have different
        # signatures, and one shared set would drop the other's graphs at every switch
        graphs = self._graphs.setdefault(id(m), SegmentGraphs())
        pad = m.padding_mask(x, mask)
        logits, _ = run_cascade(m, m.embed(x), pad, [d], 0, stop_rule=None, graphs=graphs,
                                key=(("runtime_cut", model_signature(m)), d))
        return logits

    def _executed(self, flops, x):
        """The cascade's per-row FLOPs as executed: its own path under the gathered cascade;
        on CUDA, under the whole-batch executors its gating chose for this shape, the batch's
        deepest path (``whole``) or the full model's (``whole_async``)."""
        import torch

        from archsearch.models import costs

        graphs = self.gating.__dict__.get("_segment_graphs") if x.is_cuda else None
        executor = None if graphs is None else graphs.executors.get((int(x.shape[0]), int(x.shape[1])))
        if executor == "whole" and len(flops):
            return torch.full_like(flops, float(flops.max()))
        if executor == "whole_async" and len(flops):
            full = float(costs.flops_per_sample(self.model.config, int(x.shape[1])))
            return torch.full_like(flops, max(full, float(flops.max())))
        return flops

    # ------------------------------------------------------------------ choosing
    def regime_of(self, rows: int, length: int) -> tuple[int, int]:
        """The regime key of a batch: ``(bucket(rows), bucket(length))``."""
        return bucket(rows), bucket(length)

    def time_regime(self, regime: str, x, mask) -> tuple[float, Batch]:
        """One run of ``regime`` on the batch, timed (device synchronised before and after):
        ``(seconds, output)``. Tests replace it to inject timings."""
        import torch

        cuda = x.is_cuda
        if cuda:
            torch.cuda.synchronize(x.device)
        t0 = time.perf_counter()
        out = self.run_regime(regime, x, mask)
        if cuda:
            torch.cuda.synchronize(x.device)
        return time.perf_counter() - t0, out

    def _settle(self, regime: str, x, mask) -> None:
        """Untimed runs before timing ``regime``: one; for the cascade on CUDA, until its
        segment graphs have chosen an executor for this shape (at most 24 runs)."""
        self.run_regime(regime, x, mask)
        graphs = self.gating.__dict__.get("_segment_graphs") if (regime == "cascade" and x.is_cuda) else None
        for _ in range(24):
            if graphs is None or not graphs.choosing:
                break
            self.run_regime(regime, x, mask)

    def run(self, x, mask, regime: str = "auto") -> Batch:
        """Run one batch: ``regime`` ``"auto"`` (the regime's measured choice; the first
        :attr:`trial_batches` batches of a regime run under every candidate, timed, and return
        the cascade's outputs; module docstring) or one of :data:`REGIMES`.

        Args:
            x: ``B x T`` int64 token ids (trimmed of all-padding columns); mask: ``B x T`` bool.

        Raises:
            ValueError: an unknown ``regime``; ``static`` where no static cut exists;
                ``static`` or ``full`` for a gating without exits.
        """
        if regime not in REGIME_CHOICES:
            raise ValueError(f"regime: expected one of {REGIME_CHOICES}, got {regime!r}")
        if self.adapter is not None:  # adapting: the cascade, whatever the timings
            if regime not in ("auto", "cascade"):
                raise ValueError(f"regime {regime!r}: adapt {self.adapt!r} runs the cascade (regime auto or cascade)")
            return self._run_adapted(x, mask)
        if regime != "auto":
            if regime != "cascade" and not self.dynamic:
                raise ValueError(f"regime {regime!r}: this model's gating has no early exits; use 'cascade' or 'auto'")
            return self.run_regime(regime, x, mask)
        if not self.dynamic:
            return self.run_regime("cascade", x, mask)
        key = self.regime_of(x.shape[0], x.shape[1])
        if key in self.chosen:
            chosen = self.chosen[key]
            if chosen == "static" and self.static_depth(int(x.shape[1])) is None:
                chosen = "full"  # a length of the bucket where no exit is within the budget
            return self.run_regime(chosen, x, mask)
        trial = self._trials.setdefault(key, {"batches": 0, "seconds": {}, "counts": {}})
        outs = {}
        for c in self.candidates(int(x.shape[1])):
            if trial["batches"] == 0:
                self._settle(c, x, mask)
            best = float("inf")
            for _ in range(max(1, self.repeats)):
                sec, outs[c] = self.time_regime(c, x, mask)
                best = min(best, sec)
            trial["seconds"][c] = trial["seconds"].get(c, 0.0) + best
            trial["counts"][c] = trial["counts"].get(c, 0) + 1
        trial["batches"] += 1
        if trial["batches"] >= self.trial_batches:
            del self._trials[key]
            self.seconds[key] = {c: v / trial["counts"][c] for c, v in trial["seconds"].items()}
            self.chosen[key] = choose_regime(self.seconds[key])
        return outs["cascade"]  # while measuring: the trial's own predictions

    def report(self) -> list[dict[str, Any]]:
        """One row per regime met: ``rows`` and ``length`` (the regime's buckets), ``regime``
        chosen, ``ms`` per candidate (best of :attr:`repeats` per batch, mean over the
        :attr:`trial_batches` batches), ``ratio_vs_full`` (chosen / full
        time; 1.0 for a gating without exits)."""
        rows = []
        for (b, t), choice in sorted(self.chosen.items()):
            sec = self.seconds.get((b, t), {})
            full = sec.get("full")
            rows.append({"rows": b, "length": t, "regime": choice,
                         "ms": {k: round(v * 1e3, 3) for k, v in sec.items()},
                         "ratio_vs_full": round(sec[choice] / full, 4) if full else 1.0})
        return rows

    def reset(self) -> None:
        """Forget every choice (e.g. after moving the model to another device)."""
        self.chosen.clear()
        self.seconds.clear()
        self._trials.clear()
        self._graphs = {}

