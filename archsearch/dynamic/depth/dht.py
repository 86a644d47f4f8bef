"""DHT: per-sample layer and head gating under a FLOPs budget (``gating: dht``).

Source: Sample-based Dynamic Hierarchical Transformer (arXiv 2312.03038, §3: context, LinUCB
depth, UCB head counts, Thompson-sampled heads), with the budget and training of issue 14
(docs/design.md, DHT section). The knobs and their measured defaults are
:class:`~archsearch.dynamic.depth.settings.DHTSettings`.
Per training batch:

1. Every sample runs the embeddings and the first ``n_fixed`` blocks (all heads) as one batch.
2. All exits are trained: the batch runs the deepest allowed path (all heads) and every exit
   ``min_layers..max_layers`` is read (:func:`~archsearch.dynamic.depth.exits.all_exit_loss`: CE of
   the deepest exit + ``(CE_k + KD_k) / 2`` of each shallower exit, in-place distillation with
   the sandwich rule; Yu & Huang 2019 §3.2-3.3, Kim & Cho 2021 §2.2).
3. Warm-up, then take-over: the full model trains alone until the running accuracy of the
   deepest exit (progressive validation, EMA 0.9) has not improved by 1 point for
   ``max(warm-up, 10)`` steps, after at least the warm-up (``dht_warmup_steps``).
4. Routing, after the take-over. ``dht_routing: once``: a
   :class:`~archsearch.dynamic.bandits.LinUCB` over the allowed depths picks ``argmax_a (q_a(x) +
   bonus_a(x) - lambda c_a)`` from the context after block ``n_fixed`` (a fixed random ``d x 16``
   projection of the pooled state, L2-normalised, the exit's max probability and entropy, 1).
   ``dht_routing: cascade`` (the default): a stop / continue decision at every exit
   (:class:`~archsearch.dynamic.depth.stopping.LinearStopping`, least-squares backward induction,
   Longstaff & Schwartz 2001; or, with ``dht_stop_rule: bandit``, per-exit {stop, continue}
   LinUCB bandits learnt from the arms they play,
   :class:`~archsearch.dynamic.depth.stop_bandit.BanditStopping`), run by
   :func:`~archsearch.dynamic.depth.exits.run_cascade`. Per gated
   block a :class:`~archsearch.dynamic.bandits.UCB1` picks the head count and a
   :class:`~archsearch.dynamic.bandits.CombinatorialTS` which heads (off by default: ``min_heads``
   = all heads measured best). With probability ``dht_epsilon`` a sample takes a random depth.
   Groups of samples with the same path run as one batch through exactly their blocks and heads;
   each routed exit is one more sandwich member of the loss.
5. Rewards per sample: every exit up to the one reached, quality ``exp(-CE)`` (``dht_reward:
   prob``) or ``-CE / running mean`` (``ce``), charged ``lambda * FLOPs fraction`` at selection.
6. The price ``lambda`` follows dual ascent toward ``flops_budget`` every step
   (:class:`~archsearch.dynamic.budget.DualPrice`); before each evaluation it is re-calibrated on
   validation rows, label-free, so that greedy inference meets the budget
   (:meth:`~archsearch.dynamic.depth.dht_eval.DHTInference.calibrate`).

The paths (FLOPs, contexts, choices, groups) are :mod:`archsearch.dynamic.depth.dht_paths`; inference,
calibration and statistics are :mod:`archsearch.dynamic.depth.dht_eval`.

Shapes: ``x`` ``B x T`` ids, ``mask`` ``B x T`` bool, ``y`` ``B`` labels (or ``B x T`` for lm).
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import torch

from archsearch.dynamic.bandits import UCB1, CombinatorialTS, LinUCB
from archsearch.dynamic.base import GatingStrategy, LossFn, TrialContext, planned_steps
from archsearch.dynamic.budget import DualPrice
from archsearch.dynamic.depth.dht_eval import DHTInference
from archsearch.dynamic.depth.dht_paths import CONTEXT_DIM, DHTPaths
from archsearch.dynamic.depth.exits import (all_exit_loss, distill, exit_terms, load_teacher,
                                            per_sample_ce_of_exits, teacher_logits)
from archsearch.dynamic.depth.settings import DHTSettings
from archsearch.dynamic.depth.stop_bandit import BanditStopping
from archsearch.dynamic.depth.stopping import TRAJECTORY_DIM, LinearStopping


class DHTGating(DHTPaths, DHTInference, GatingStrategy):
    """Per-sample depth and per-group head gating by bandits under a FLOPs budget (see the module
    docstring; knobs: :class:`DHTSettings`).

    Args:
        model: the trial's :class:`~archsearch.models.transformer.Transformer`.
        cfg: trial config (:class:`DHTSettings` keys among others).
        settings: budget; ``seed`` seeds the projection, the Thompson sampler and the
            exploration floor.
        loop: the :class:`~archsearch.dynamic.base.TrialContext` (optional; its validation
            batches feed the calibration, its step count the default warm-up).

    Attributes:
        force_depth: set to an int to run every sample at that depth (tests; bandits are not
            updated while forced). ``None`` = bandit choices.
        force_heads: with ``force_depth``: one head-index list (or ``None`` = all) per gated
            block ``n_fixed..force_depth-1``.
        price: the :class:`~archsearch.dynamic.budget.DualPrice` used in training.
        eval_price: the price inference uses (set by :meth:`calibrate`; ``None`` = training's).
        takeover_step: step at which the bandit took over routing (``None`` = warming up).
        bandit_seconds: wall seconds of bandit bookkeeping in training (no forward/backward).

    Raises:
        ValueError: a value :class:`DHTSettings` refuses (names the key), ``n_fixed`` over
            ``n_layers`` or ``min_heads`` over ``n_heads``.
    """

    Settings = DHTSettings

    def __init__(self, model, cfg: dict[str, Any], settings: dict[str, Any], loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        s, conf = self.s, model.config
        L, H = conf.n_layers, conf.n_heads
        if s.n_fixed > L:
            raise ValueError(f"n_fixed must be in [0, n_layers={L}], got {s.n_fixed}")
        if s.min_heads is not None and s.min_heads > H:
            raise ValueError(f"min_heads must be in [1, n_heads={H}], got {s.min_heads}")
        self.n_fixed = s.n_fixed
        self.depths = self.allowed_depths(s, L)  # LinUCB arms
        if s.exit_heads:
            model.add_exit_heads(self.depths)  # an own classifier per exit (classification)
        self.exit_loss, self.min_heads, self.lam = s.exit_loss, s.min_heads or H, s.dht_lambda
        self.warmup = (s.dht_warmup_steps if s.dht_warmup_steps is not None
                       else max(1, round(0.1 * planned_steps(loop))) if loop is not None else 100)
        self.flops_budget = s.flops_budget
        # (an explicit cascade for task: lm is refused by DHTSettings, which sees the task)
        self.routing = s.dht_routing or ("once" if conf.task == "lm" else "cascade")
        self.stop_fit, self.stop_rule, self.stop_quality = s.dht_stop_fit, s.dht_stop_rule, s.dht_stop_quality
        self.stop_context, self.reward, self.epsilon = s.dht_stop_context, s.dht_reward, s.dht_epsilon
        self.exits_from, self.routed_forward = s.dht_exits_from_step, s.dht_routed_forward
        self.teacher = load_teacher(s.distill_teacher, cfg.get("init_from"), loop)  # KD from a fine-tuned model
        self.warmup_max = 10 * self.warmup if s.dht_warmup_max_steps is None else s.dht_warmup_max_steps
        self.patience = max(self.warmup, 10)
        self.calibration_rows = s.dht_calibration_rows
        self.price = DualPrice(self.flops_budget, lr=s.dht_price_lr, init=self.lam)
        self.eval_price: float | None = None
        #: (Xs, agreement, costs) of the rows the stop rule was last calibrated on (``N x K x d``,
        #: ``N x K``, ``N x K``), kept for an online adapter (:mod:`archsearch.runtime`)
        self.calibration_window: tuple | None = None
        self.n_gated = self.depths[-1] - self.n_fixed  # blocks that can be head-gated (up to the deepest exit)
        seed = int(settings.get("seed", 0))
        gen = torch.Generator().manual_seed(seed + 7919)
        self.proj = torch.randn(conf.d_model, CONTEXT_DIM, generator=gen)  # (d, 16) fixed
        self.exit_context = s.dht_exit_context or self.routing == "cascade"
        self.context_dim = CONTEXT_DIM + 1 + (2 if self.exit_context else 0)
        self.lin = LinUCB(len(self.depths), self.context_dim, alpha=s.dht_alpha, decay=s.dht_decay)
        #: ``dht_routing: cascade``: the per-exit stop / continue policy (``None`` = route once)
        trajectory = self.stop_context == "trajectory"
        dim, score_col = (TRAJECTORY_DIM, 0) if trajectory else (self.context_dim, CONTEXT_DIM)
        self.stopping = (None if self.routing != "cascade" else
                         BanditStopping(len(self.depths), dim, alpha=s.dht_stop_alpha, seed=seed, score_col=score_col)
                         if self.stop_rule == "bandit" else
                         LinearStopping(len(self.depths), dim, rule=self.stop_rule, score_col=score_col,
                                        refit_every=s.dht_stop_refit_every))
        rows = max(self.n_gated, 1)
        self.ucb = UCB1(H - self.min_heads + 1, n_rows=rows, c=s.dht_ucb_c, decay=s.dht_decay)
        self.ts = CombinatorialTS(H, n_rows=rows, seed=seed, decay=s.dht_decay)
        self.rng = np.random.default_rng(seed + 104729)  # exploration floor
        self.ema = s.dht_ema
        self.loss_mean: float | None = None  # running mean CE of the deepest exit (nats)
        self.head_baseline = np.full(rows, np.nan)  # running loss increase of pruned heads per block
        self.acc_ema: float | None = None  # smoothed pre-step accuracy of the deepest exit
        self.acc_best, self.acc_best_step = -np.inf, 0
        self.takeover_step: int | None = None
        self.train_fraction: float | None = None  # running FLOPs fraction of the routed paths
        self.calibrated_fraction: float | None = None
        self.steps = self.updates = 0
        self.bandit_seconds = 0.0
        self.force_depth: int | None = None
        self.force_heads: list | None = None
        self._pending: dict[str, Any] | None = None
        self._flops_cache: dict[tuple, int] = {}
        self._greedy_cache: dict[tuple, tuple] = {}
        self._train_counts = np.zeros(len(self.depths))
        self._reset_eval_counters()

    @property
    def warming_up(self) -> bool:
        """True until the bandit takes over routing (see the module docstring, step 7)."""
        return self.takeover_step is None

    def training_loss(self, x, mask, y, loss_fn: LossFn) -> torch.Tensor:
        """Scalar training loss of one batch: all exits of the deepest path (CE of the deepest
        exit, ``(CE + KD) / 2`` of each shallower exit, averaged) and, after the take-over,
        ``(CE + KD) / 2`` of each sample's routed exit (weighted by group size). Records
        per-sample exit losses for :meth:`after_step`. With ``force_depth``: ``loss_fn`` of that
        path only (with ``distill_teacher``: ``(CE + KD) / 2`` toward the teacher). With
        ``distill_teacher``, every KD term targets the teacher's logits, the deepest exit's too."""
        self._pending = None
        if self.force_depth is not None:
            h, pad = self._trunk(x, mask, self.force_depth)
            logits = self._run_group(h, pad, self._plan(h, pad, greedy=False)[0])
            target = teacher_logits(self.teacher, x, mask)  # (B, C) or None
            if target is None:
                return loss_fn(logits, y)
            return (loss_fn(logits, y) + distill(logits, target)) / 2
        h, pad = self._trunk(x, mask)
        B, T = x.shape[0], x.shape[1]
        deep = self.depths[-1]
        exits, hid = self._run_exits(h, pad, deep, [None] * (deep - self.n_fixed), hidden=True)  # {depth: logits}
        external = teacher_logits(self.teacher, x, mask)  # (B, C) or None
        teacher = exits[deep] if external is None else external
        listed = [exits[d] for d in self.depths]
        # every exit's per-sample loss and KD in one pass (K x B each; None for LM logits)
        terms = exit_terms(listed, y, loss_fn, teacher=external)
        deep_loss, shallow_loss = all_exit_loss(listed, y, loss_fn, self.exit_loss, teacher=external, terms=terms)
        # two stages (``dht_exits_from_step``): the deepest exit alone first; BERxiT's
        # alternating schedule (``dht_exit_schedule``): the deepest exit alone on odd steps
        joint = self.steps >= self.exits_from and not (self.s.dht_exit_schedule == "alternating" and self.steps % 2)
        total = deep_loss + shallow_loss if joint else deep_loss
        with torch.no_grad():
            full_ce = per_sample_ce_of_exits(listed, y)  # (B, K)
            acc = (exits[deep].argmax(-1) == y).double().mean()  # () on the device
        t0 = time.perf_counter()
        # contexts: after block n_fixed (route once), or at every exit of the deepest path (cascade)
        X = self._context(h, pad) if self.stopping is None else self._exit_contexts(exits, hid, pad, to_host=False)
        # one host synchronisation for the step's per-sample values (contexts, CEs, accuracy)
        parts = [full_ce.double().reshape(-1), acc.reshape(1)] + ([X.reshape(-1)] if torch.is_tensor(X) else [])
        host = torch.cat(parts).cpu().numpy()
        full_np, acc = host[:B * len(self.depths)].reshape(B, -1), float(host[B * len(self.depths)])
        if torch.is_tensor(X):
            X = host[B * len(self.depths) + 1:].reshape(X.shape)  # (B, K, dim)
        if self.warming_up:  # the price follows the paths the bandit would choose (not run)
            arms = self._select_depths(X, T, False, self.price.price)
            self._pending = dict(X=X, arms=None, groups=[], full_ce=full_np, T=T, acc=acc,
                                 fraction=float(self._depth_costs(T)[arms].mean()))
            self.bandit_seconds += time.perf_counter() - t0
            return total
        groups = self._plan(h, pad, greedy=False, X=X)
        self.bandit_seconds += time.perf_counter() - t0
        ce = np.full((B, len(self.depths)), np.nan)  # per-sample CE at each exit reached
        H = self.model.config.n_heads
        routed = 0.0
        shared_rows = []  # rows whose routed exit is one the deepest path already read
        for g in groups:
            idx = g["idx"]
            n = g["n"] = B if idx is None else len(idx)
            rows = np.arange(B) if idx is None else g["rows"]
            k = self.depths.index(g["depth"]) + 1
            if self.routed_forward == "shared" and all(c == H for c in g["counts"]):
                ce[rows, :k] = full_np[rows, :k]  # the same logits as the deepest path's: its per-sample CEs
                if terms is not None:  # its loss: read from the stacked terms below
                    shared_rows.append(rows)
                    continue
                ex = {d: lg if idx is None else lg.index_select(0, idx) for d, lg in exits.items() if d <= g["depth"]}
            else:
                hg = h if idx is None else h[idx]
                pg = pad if (idx is None or pad is None) else pad[idx]
                ex = self._run_exits(hg, pg, g["depth"], g["heads"])
                with torch.no_grad():
                    cols = [self.depths.index(d) for d in ex]
                    ce[np.ix_(rows, cols)] = per_sample_ce_of_exits(list(ex.values()), y if idx is None else y[idx]).cpu().numpy()
            last = ex[g["depth"]]
            yg = y if idx is None else y[idx]
            tg = teacher if idx is None else teacher[idx]
            routed = routed + (loss_fn(last, yg) + distill(last, tg)) / 2 * (n / B)
        if shared_rows:  # (loss + KD) / 2 of each such row's routed exit, weighted 1 / B
            rows = np.concatenate(shared_rows)
            arms = self._pending["arms"]  # (B,) depth-arm per row, from _plan
            per = (terms[0] + terms[1]) / 2  # (K, B)
            at = torch.from_numpy(np.stack([arms[rows], rows])).to(per.device)  # (2, n)
            routed = routed + per[at[0], at[1]].sum() / B
        self._pending.update(T=T, ce=ce, full_ce=full_np, acc=acc)
        return total + routed if joint else total  # an alternating schedule's odd step: the deepest exit only

    def _update_warmup_tracker(self, acc: float) -> None:
        self.acc_ema = acc if self.acc_ema is None else 0.9 * self.acc_ema + 0.1 * acc
        if self.acc_ema > self.acc_best + 0.01:
            self.acc_best, self.acc_best_step = self.acc_ema, self.steps
        start = self.exits_from  # the warm-up counts from the step the shallower exits join
        if self.warming_up and self.steps >= start + self.warmup and (
                self.steps - self.acc_best_step >= self.patience or self.steps >= start + self.warmup_max):
            self.takeover_step = self.steps

    def after_step(self, loss: float) -> None:
        """Bandit and price updates from the last :meth:`training_loss` (``loss``: the batch's
        training loss, nats; unused: the rewards are per sample)."""
        self.steps += 1
        p, self._pending = self._pending, None
        if p is None:
            return
        t0 = time.perf_counter()
        T, full_ce = p["T"], p["full_ce"]  # full_ce: (B, K) CE of every exit on the deepest path
        deep_mean = float(full_ce[:, -1].mean())
        norm = self.loss_mean if self.loss_mean else max(deep_mean, 1e-6)
        self.loss_mean = deep_mean if self.loss_mean is None else self.ema * self.loss_mean + (1 - self.ema) * deep_mean
        B, K = full_ce.shape
        if p["arms"] is None:  # warm-up: every exit of every sample
            rows, arms, q = np.repeat(np.arange(B), K), np.tile(np.arange(K), B), self._quality(full_ce.reshape(-1), norm)
            fraction = p["fraction"]
        else:
            ce = p["ce"]  # (B, K), NaN beyond each sample's exit
            rows, arms = np.nonzero(~np.isnan(ce))
            q = self._quality(ce[rows, arms], norm)
            self._update_heads(p, ce, full_ce, norm)
            full = self._full_flops(T)
            fraction = sum(self._group_flops(T, g) * g["n"] for g in p["groups"]) / (full * B)
            np.add.at(self._train_counts, p["arms"], 1)
        if self.stopping is not None:  # every exit of every sample (the deepest path ran)
            self.stopping.update(p["X"], self._quality(full_ce, norm), self._depth_costs(T), self.price.price)
        else:
            self.lin.update(p["X"][rows], arms, q)
        self.price.update(fraction)
        self.train_fraction = fraction if self.train_fraction is None else \
            self.ema * self.train_fraction + (1 - self.ema) * fraction
        self.updates += 1
        self._greedy_cache.clear()
        self._update_warmup_tracker(p["acc"])
        self.bandit_seconds += time.perf_counter() - t0

    def state_dict(self) -> dict[str, Any]:
        """Bandits, price, projection and running statistics (tensors, numbers, strings, dicts)."""
        return {"lin": self.lin.state_dict(), "ucb": self.ucb.state_dict(), "ts": self.ts.state_dict(),
                "proj": self.proj.clone(), "loss_mean": self.loss_mean,
                "head_baseline": torch.from_numpy(self.head_baseline.copy()), "steps": self.steps,
                "updates": self.updates, "bandit_seconds": self.bandit_seconds,
                "train_counts": torch.from_numpy(self._train_counts.copy()),
                "price": self.price.state_dict(),
                "eval_price": -1.0 if self.eval_price is None else self.eval_price,
                "takeover_step": -1 if self.takeover_step is None else self.takeover_step,
                "acc": [-1.0 if self.acc_ema is None else self.acc_ema, float(self.acc_best), self.acc_best_step],
                "train_fraction": -1.0 if self.train_fraction is None else self.train_fraction,
                "rng": json.dumps(self.rng.bit_generator.state),
                **({"stopping": self.stopping.state_dict()} if self.stopping is not None else {}),
                **({} if self.calibration_window is None else {"calibration_window": [
                    torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)) for a in self.calibration_window]})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (checkpoints written before issue 14 load too: the price
        then starts at ``dht_lambda`` and the bandit is taken to have taken over)."""
        if not state:
            return
        self.lin.load_state_dict(state["lin"])
        self.ucb.load_state_dict(state["ucb"])
        self.ts.load_state_dict(state["ts"])
        self.proj = state["proj"].clone()
        self.loss_mean = state["loss_mean"]
        self.steps, self.updates = int(state["steps"]), int(state["updates"])
        self.bandit_seconds = float(state["bandit_seconds"])
        self._train_counts = state["train_counts"].numpy().copy()
        if "price" in state:
            self.head_baseline = state["head_baseline"].numpy().copy()
            self.price.load_state_dict(state["price"])
            ep = float(state["eval_price"])
            self.eval_price = None if ep < 0 else ep
            ts = int(state["takeover_step"])
            self.takeover_step = None if ts < 0 else ts
            a, best, best_step = state["acc"]
            self.acc_ema = None if a < 0 else float(a)
            self.acc_best, self.acc_best_step = float(best), int(best_step)
            tf = float(state["train_fraction"])
            self.train_fraction = None if tf < 0 else tf
            self.rng.bit_generator.state = json.loads(state["rng"])
        elif self.updates:
            self.takeover_step = self.steps
        if self.stopping is not None and "stopping" in state:
            self.stopping.load_state_dict(state["stopping"])
        if "calibration_window" in state:
            self.calibration_window = tuple(t.numpy().astype(np.float64) for t in state["calibration_window"])
        self._greedy_cache.clear()
