"""DHT: per-sample layer and head gating by contextual bandits under a FLOPs budget (``gating: dht``).

Sources: Sample-based Dynamic Hierarchical Transformer (arXiv 2312.03038, §3: context, LinUCB
depth, UCB head counts, Thompson-sampled heads, queueing); the budget and training fixes of
issue 14 (docs/design.md, DHT section). Per training batch:

1. Every sample runs the embeddings and the first ``n_fixed`` blocks (all heads) as one batch.
2. Context: the mean-pooled hidden state there, times a fixed random ``d x 16`` projection
   (seeded), L2-normalised, plus a constant 1 -> a 17-dim vector per sample. With
   ``dht_exit_context: true`` two more features: the max softmax probability and the normalised
   entropy of the exit at ``n_fixed`` (the signal of a confidence-threshold exit, DeeBERT, Xin
   et al. 2020, §3; read from the exit head there, whose FLOPs, ``2 d C``, are not counted).
3. All exits are trained: the batch runs the deepest allowed path (all heads) and the shared
   output head reads every allowed depth ``min_layers..max_layers`` (one classifier per exit,
   shared weights, or one per exit with ``exit_heads: true``). Loss
   (:func:`~archsearch.dynamic.exits.all_exit_loss`): ``CE(deepest) + mean_k (CE_k + KD_k) / 2``
   over the shallower exits (``exit_loss: sum``: summed instead of averaged; ``equal``: ``CE_k + KD_k`` summed),
   ``KD_k = KL(softmax(deepest, detached) || softmax(exit k))`` -- in-place distillation with the
   sandwich rule (deepest + shallowest + every exit in between; Yu & Huang 2019, "Universally
   Slimmable Networks", §3.2-3.3; Kim & Cho 2021, "Length-Adaptive Transformer", §2.2). After
   the take-over, the routed path (step 4) is one more sandwich member: ``+ (CE + KD) / 2`` of
   each sample's own exit on its own heads.
4. Routing (after the take-over): a :class:`~archsearch.dynamic.bandits.LinUCB` (arms = allowed
   depths) picks ``L* = argmax_a (q_a(x) + bonus_a(x) - lambda * c_a)`` per sample, ``c_a`` =
   FLOPs fraction of depth ``a`` (all heads) of the full model at the batch length; with
   probability ``epsilon`` (0.05) a sample takes a uniformly random depth instead (exploration
   floor: rewards drift while the model trains). Samples with the same ``L*`` form one group;
   per gated block ``n_fixed..L*-1`` a :class:`~archsearch.dynamic.bandits.UCB1` (one row per
   block, arms = head counts ``min_heads..n_heads``) picks ``argmax_k (q_k + bonus_k - lambda *
   h_k)`` with ``h_k`` the FLOPs fraction of ``k`` heads of one block, and a
   :class:`~archsearch.dynamic.bandits.CombinatorialTS` picks which heads. The group runs as ONE
   real batch through exactly its blocks with only its heads (``Transformer.run_layers(
   heads_per_layer=...)`` slices Q/K/V/O: unselected heads and blocks are not computed).
5. Rewards are per sample. Running to ``L*`` yields every exit ``<= L*`` on the way, so sample
   ``i`` updates every depth arm ``a <= L*_i`` (full information up to ``L*``) with the quality
   ``q_ia = -CE_i(exit a) / running mean of the deepest exit's CE`` (``dht_reward: prob``:
   ``q_ia = exp(-CE_i(exit a))``, the probability exit ``a`` gives the true class); its reward is
   ``q_ia - lambda * c_a`` and the price part, known exactly, is applied at selection (so a
   changing ``lambda`` never leaves stale rewards in the bandit). During the warm-up the deepest
   path gives every exit of every sample, so the depth bandit learns from step 1.
   Head counts get their own signal: ``q = -(CE_i(routed exit) - CE_i(same depth, all heads)) /
   norm`` averaged over the group (the loss the pruned heads cost), charged ``lambda * h_k`` at
   selection; each chosen head's Beta gets a success when that loss increase beats the
   block's running baseline.
6. The price: with ``flops_budget`` (fraction of the full model's FLOPs, e.g. 0.25..1) the
   price follows dual ascent every step, ``lambda <- max(0, lambda + eta * (FLOPs fraction -
   flops_budget))`` (:class:`~archsearch.dynamic.budget.DualPrice`, ``eta = dht_price_lr``),
   with the batch's FLOPs fraction of the routed paths (during the warm-up: of the paths the
   bandit would choose). ``dht_lambda`` is only the initial price (and the fixed price when no
   ``flops_budget`` is given, the old behaviour).
7. Take-over: the full model trains alone (all exits, step 3) until its running accuracy stops
   improving -- a proxy for "warm-up has reached the full model's validation accuracy (within 1
   point)" that is available inside the training loop: the accuracy of the deepest exit on each
   training batch *before* the step on it (progressive validation, Blum, Kalai & Langford 1999),
   smoothed (EMA 0.9), has not set a new best by more than 1 point for ``patience =
   max(dht_warmup_steps, 10)`` steps, and at least ``dht_warmup_steps`` steps have run. Fallback
   cap: ``dht_warmup_max_steps`` (default ``10 * dht_warmup_steps``).

Routing exit by exit (``dht_routing: cascade``; default ``once`` = steps 2 and 4 above): at every
exit ``k`` a stop / continue decision from the context *there* (the projection of the pooled
hidden state at exit ``k``, exit ``k``'s max probability and normalised entropy, a 1: 19 dims),
:class:`~archsearch.dynamic.stopping.LinearStopping` at the price: stop iff ``s_k(x) - lambda *
c_k > v_k(x) - lambda * w_k(x)``, with ``s_k`` the predicted quality of stopping and ``v_k`` /
``w_k`` the predicted quality / FLOPs fraction of the exit reached by continuing. It is fitted by
backward induction (least-squares Monte Carlo, Longstaff & Schwartz 2001) on every exit of the
last 2048 samples of the all-exits pass (step 3; full information, all heads), at the training
price after each batch and at each tried price during calibration; the exploration floor still
sends ``epsilon`` of the routed training samples to a random depth. Head counts keep their own
bandits (step 4), read per gated block. Inference then runs exit by exit (:meth:`_run_cascade`):
the samples still running read their exit, the ones that stop leave the batch and the rest run
the next block as one batch.

Inference: greedy choices (LinUCB mean, best UCB1 mean, highest posterior means; no exploration)
at the *calibrated* price, with the same grouping. :meth:`DHTGating.before_evaluate` (the
trainable calls it before every evaluation) calibrates the price by bisection on up to
``dht_calibration_rows`` (2048) validation samples so that the greedy policy's FLOPs fraction
(sum of executed FLOPs / sum of full-model FLOPs) lands on ``flops_budget`` (within the
resolution of the discrete exits; :meth:`DHTGating.calibrate`). Before any bandit update,
inference runs the deepest allowed depth with all heads.

Config keys (trial config, docs/design.md MODEL_KEYS): ``flops_budget`` (None = no budget),
``dht_lambda`` (initial / fixed price, default 0.5), ``n_fixed`` (1), ``min_layers``
(``n_fixed``), ``max_layers`` (``n_layers``), ``min_heads`` (1), ``dht_warmup_steps`` (100),
``dht_reward`` (``ce``), ``dht_exit_context`` (false), ``dht_routing`` (``once``),
``dht_stop_fit`` (``train``; ``validation``: the cascade's calibration refits the stopping policy
on the calibration rows, quality = agreement with the deepest exit, no labels), ``dht_stop_rule``
(``regression``; ``tuned``: each exit's threshold on the predicted advantage is chosen on the
fitting rows by direct search; ``confidence``: a threshold per exit on the exit's own max
probability, fitted the same way; :class:`~archsearch.dynamic.stopping.LinearStopping`),
``dht_stop_quality`` (``prob``; with ``dht_stop_fit: validation``, the quality an exit scores on
a calibration row: ``prob`` = its probability of the deepest exit's class, ``match`` = 1 if its
class is the deepest exit's, else 0), ``dht_stop_context`` (``exit``: the cascade decides at
an exit from the projection of the pooled state there, the exit's max probability and entropy;
``trajectory``: from the exit's max probability and entropy, whether its class equals the last
one or two exits', and the previous exit's max probability; :meth:`DHTGating._stop_context`).
Programmatic (``settings["fixed"]``): ``dht_price_lr`` (0.05), ``dht_epsilon`` (0.05),
``dht_warmup_max_steps``, ``dht_calibration_rows`` (2048), ``dht_exits_from_step`` (0: the
shallower exits join the loss from this training step on, and the warm-up counts from there;
before it only the deepest exit trains -- DeeBERT's two stages, Xin et al. 2020 §3.2, without
freezing the backbone in the second), ``distill_teacher`` (a fine-tuned full model's
``state.pt``: every exit, the deepest included, distils toward it instead of toward the deepest
exit; :func:`~archsearch.dynamic.exits.load_teacher`). Depth limits are clamped into
``[n_fixed, n_layers]`` (a searched ``max_layers`` may exceed a searched ``n_layers``), and
``min_layers`` to at most ``max_layers``.

Shapes: ``x`` ``B x T`` ids, ``mask`` ``B x T`` bool, ``y`` ``B`` labels (or ``B x T`` for lm).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from archsearch.dynamic.bandits import UCB1, CombinatorialTS, LinUCB
from archsearch.dynamic.base import GatingStrategy, LossFn, TrialContext
from archsearch.dynamic.budget import DualPrice, calibrate_price
from archsearch.dynamic.exits import all_exit_loss, distill, load_teacher, per_sample_ce, teacher_logits
from archsearch.dynamic.stopping import TRAJECTORY_DIM, LinearStopping, trajectory_context
from archsearch.models import costs
from archsearch.space import KEY_CHOICES

CONTEXT_DIM = 16

class DHTGating(GatingStrategy):
    """Per-sample depth and per-group head gating by bandits under a FLOPs budget (see the module
    docstring).

    Args:
        model: the trial's :class:`~archsearch.models.transformer.Transformer`.
        cfg: trial config (keys in the module docstring).
        settings: budget; ``seed`` seeds the projection, the Thompson sampler and the
            exploration floor.
        loop: the :class:`~archsearch.dynamic.base.TrialContext` (optional; its
            ``eval_batches`` feed the budget calibration, its ``train_seconds`` the overhead
            percentage in :meth:`metrics`).
        alpha: LinUCB exploration scale.
        ucb_c: UCB1 exploration scale (rewards are O(1)).
        decay: forgetting factor of all bandits per update (the model keeps training, so
            rewards drift).
        ema: smoothing of the running loss mean and reward baselines.

    Attributes:
        force_depth: set to an int to run every sample at that depth (tests, static cuts;
            bandits are not updated while forced). ``None`` = bandit choices.
        force_heads: with ``force_depth``: one head-index list (or ``None`` = all) per gated
            block ``n_fixed..force_depth-1``.
        price: the :class:`~archsearch.dynamic.budget.DualPrice` of a FLOPs fraction used in
            training (``price.price`` = lambda).
        eval_price: the price inference uses (set by :meth:`calibrate`; ``None`` = the training
            price).
        takeover_step: training step at which the bandit took over routing (``None`` = still
            warming up).
        bandit_seconds: wall seconds spent in bandit bookkeeping during training (context,
            selection, grouping plan, updates); the model's forward/backward is not included.

    Raises:
        ValueError: ``n_fixed`` outside ``[0, n_layers]``, ``min_heads`` outside
            ``[1, n_heads]``, negative ``dht_lambda`` or ``dht_warmup_steps``,
            ``flops_budget`` outside ``(0, 1]``, ``dht_epsilon`` outside ``[0, 1]``, ``exit_loss``
            not in :data:`~archsearch.dynamic.exits.EXIT_LOSSES`, ``dht_reward`` not ``ce`` / ``prob``,
            ``dht_routing`` not ``once`` / ``cascade`` (or ``cascade`` for ``task: lm``),
            ``dht_stop_fit`` / ``dht_stop_rule`` / ``dht_stop_quality`` / ``dht_stop_context``
            not one of their :data:`~archsearch.space.KEY_CHOICES`.
    """

    def __init__(self, model, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None, *,
                 alpha: float = 0.3, ucb_c: float = 0.3, decay: float = 0.99, ema: float = 0.95):
        super().__init__(model, cfg, settings, loop)
        conf = model.config
        L, H = conf.n_layers, conf.n_heads
        self.n_fixed = int(cfg.get("n_fixed", 1))
        if not 0 <= self.n_fixed <= L:
            raise ValueError(f"n_fixed must be in [0, n_layers={L}], got {self.n_fixed}")
        hi = int(cfg.get("max_layers") or L)
        hi = min(max(hi, self.n_fixed, 1), L)
        lo = int(cfg.get("min_layers") or self.n_fixed)
        lo = min(max(lo, self.n_fixed), hi)
        self.depths = list(range(lo, hi + 1))  # LinUCB arms
        if bool(cfg.get("exit_heads", False)):
            model.add_exit_heads(self.depths)  # an own classifier per exit (classification)
        self.exit_loss = str(cfg.get("exit_loss") or "mean")
        self.min_heads = int(cfg.get("min_heads") or 1)
        if not 1 <= self.min_heads <= H:
            raise ValueError(f"min_heads must be in [1, n_heads={H}], got {self.min_heads}")
        lam = cfg.get("dht_lambda")
        self.lam = 0.5 if lam is None else float(lam)
        self.warmup = int(cfg.get("dht_warmup_steps", 100))
        if self.lam < 0 or self.warmup < 0:
            raise ValueError(f"dht_lambda and dht_warmup_steps must be >= 0, got {self.lam}, {self.warmup}")
        budget = cfg.get("flops_budget")
        self.flops_budget = None if budget is None else float(budget)
        if self.flops_budget is not None and not 0 < self.flops_budget <= 1:
            raise ValueError(f"flops_budget must be in (0, 1], got {self.flops_budget}")
        self.routing = str(cfg.get("dht_routing") or "once")
        if self.routing not in KEY_CHOICES["dht_routing"]:
            raise ValueError(f"dht_routing must be 'once' or 'cascade', got {self.routing!r}")
        self.stop_fit = str(cfg.get("dht_stop_fit") or "train")
        if self.stop_fit not in KEY_CHOICES["dht_stop_fit"]:
            raise ValueError(f"dht_stop_fit must be 'train' or 'validation', got {self.stop_fit!r}")
        self.stop_rule = str(cfg.get("dht_stop_rule") or "regression")
        if self.stop_rule not in KEY_CHOICES["dht_stop_rule"]:
            raise ValueError(f"dht_stop_rule must be one of {list(KEY_CHOICES['dht_stop_rule'])}, "
                             f"got {self.stop_rule!r}")
        self.stop_quality = str(cfg.get("dht_stop_quality") or "prob")
        if self.stop_quality not in KEY_CHOICES["dht_stop_quality"]:
            raise ValueError(f"dht_stop_quality must be one of {list(KEY_CHOICES['dht_stop_quality'])}, "
                             f"got {self.stop_quality!r}")
        self.stop_context = str(cfg.get("dht_stop_context") or "exit")
        if self.stop_context not in KEY_CHOICES["dht_stop_context"]:
            raise ValueError(f"dht_stop_context must be one of {list(KEY_CHOICES['dht_stop_context'])}, "
                             f"got {self.stop_context!r}")
        if self.routing == "cascade" and conf.task == "lm":  # an LM's exit head costs more than a block
            raise ValueError("dht_routing: cascade is for classification (task: lm reads a vocabulary-sized "
                             "exit head at every exit)")
        self.reward = str(cfg.get("dht_reward") or "ce")
        if self.reward not in KEY_CHOICES["dht_reward"]:
            raise ValueError(f"dht_reward must be 'ce' or 'prob', got {self.reward!r}")
        self.epsilon = float(cfg.get("dht_epsilon", 0.05))
        if not 0 <= self.epsilon <= 1:
            raise ValueError(f"dht_epsilon must be in [0, 1], got {self.epsilon}")
        self.exits_from = int(cfg.get("dht_exits_from_step") or 0)
        if self.exits_from < 0:
            raise ValueError(f"dht_exits_from_step must be >= 0, got {self.exits_from}")
        self.teacher = load_teacher(cfg, loop)  # ``distill_teacher``: KD from a fine-tuned model
        self.warmup_max = int(cfg.get("dht_warmup_max_steps") or 10 * self.warmup)
        self.patience = max(self.warmup, 10)
        self.calibration_rows = int(cfg.get("dht_calibration_rows") or 2048)
        self.price = DualPrice(self.flops_budget, lr=float(cfg.get("dht_price_lr") or 0.05), init=self.lam)
        self.eval_price: float | None = None
        self.n_gated = hi - self.n_fixed  # blocks that can be head-gated
        seed = int(settings.get("seed", 0))
        gen = torch.Generator().manual_seed(seed + 7919)
        self.proj = torch.randn(conf.d_model, CONTEXT_DIM, generator=gen)  # (d, 16) fixed
        self.exit_context = bool(cfg.get("dht_exit_context", False)) or self.routing == "cascade"
        self.context_dim = CONTEXT_DIM + 1 + (2 if self.exit_context else 0)
        self.lin = LinUCB(len(self.depths), self.context_dim, alpha=alpha, decay=decay)
        #: ``dht_routing: cascade``: the per-exit stop / continue policy (``None`` = route once)
        trajectory = self.stop_context == "trajectory"
        self.stopping = (LinearStopping(len(self.depths), TRAJECTORY_DIM if trajectory else self.context_dim,
                                        rule=self.stop_rule, score_col=0 if trajectory else CONTEXT_DIM)
                         if self.routing == "cascade" else None)
        rows = max(self.n_gated, 1)
        self.ucb = UCB1(H - self.min_heads + 1, n_rows=rows, c=ucb_c, decay=decay)
        self.ts = CombinatorialTS(H, n_rows=rows, seed=seed, decay=decay)
        self.rng = np.random.default_rng(seed + 104729)  # exploration floor
        self.ema = float(ema)
        self.loss_mean: float | None = None  # running mean CE of the deepest exit (nats)
        self.head_baseline = np.full(rows, np.nan)  # running loss increase of pruned heads per block
        self.acc_ema: float | None = None  # smoothed pre-step accuracy of the deepest exit
        self.acc_best = -np.inf
        self.acc_best_step = 0
        self.takeover_step: int | None = None
        self.train_fraction: float | None = None  # running FLOPs fraction of the routed paths
        self.calibrated_fraction: float | None = None
        self.steps = 0
        self.updates = 0
        self.bandit_seconds = 0.0
        self.force_depth: int | None = None
        self.force_heads: list | None = None
        self._pending: dict[str, Any] | None = None
        self._flops_cache: dict[tuple, int] = {}
        self._greedy_cache: dict[tuple, tuple] = {}
        self._train_counts = np.zeros(len(self.depths))
        self._reset_eval_counters()

    # ------------------------------------------------------------------ helpers
    @property
    def warming_up(self) -> bool:
        """True until the bandit takes over routing (see the module docstring, step 7)."""
        return self.takeover_step is None

    def _flops(self, T: int, depth: int, counts: tuple[int, ...]) -> int:
        """FLOPs per sample of one path: ``n_fixed`` full blocks + gated blocks with ``counts``."""
        key = (T, depth, counts)
        f = self._flops_cache.get(key)
        if f is None:
            conf = self.model.config
            heads = [conf.n_heads] * min(self.n_fixed, depth) + list(counts)
            f = costs.flops_per_sample(conf, T, n_layers=depth, heads_per_layer=heads)
            self._flops_cache[key] = f
        return f

    def _full_flops(self, T: int) -> int:
        key = (T, "full")
        if key not in self._flops_cache:
            self._flops_cache[key] = costs.flops_per_sample(self.model.config, T)
        return self._flops_cache[key]

    def _depth_costs(self, T: int) -> np.ndarray:
        """``K`` FLOPs fractions of the depth arms (all heads) at length ``T``."""
        H = self.model.config.n_heads
        full = self._full_flops(T)
        return np.array([self._flops(T, d, (H,) * (d - min(self.n_fixed, d))) / full for d in self.depths])

    def _head_costs(self, T: int) -> np.ndarray:
        """FLOPs fractions (of the full model at length ``T``) of the attention heads of one block,
        per head-count arm ``min_heads..n_heads``."""
        key = (T, "heads")
        if key not in self._flops_cache:
            conf = self.model.config
            base = costs.flops_per_sample(conf, T, n_layers=1, heads_per_layer=[0])
            self._flops_cache[key] = np.array([
                (costs.flops_per_sample(conf, T, n_layers=1, heads_per_layer=[k]) - base) / self._full_flops(T)
                for k in range(self.min_heads, conf.n_heads + 1)])
        return self._flops_cache[key]

    def _context(self, h: torch.Tensor, pad: torch.Tensor | None,
                 exit_logits: torch.Tensor | None = None) -> np.ndarray:
        """``B x T x d`` hidden states after block ``n_fixed`` -> ``B x 17`` float64 contexts
        (projection + bias), or ``B x 19`` with ``dht_exit_context``: plus the max softmax
        probability and the entropy / log(C) of the exit at ``n_fixed`` (mean over tokens for an
        LM), the confidence signal of DeeBERT-style early exit given to the bandit. With
        ``exit_logits`` (``B x C`` or ``B x T x V``), ``h`` may be any exit's hidden states and
        the confidence features are those logits' (the cascade's context at that exit)."""
        with torch.no_grad():
            hd = h.detach()
            z = self.model.pool(hd, pad).float().cpu() @ self.proj  # (B, 16)
            z = F.normalize(z, dim=-1)  # (B, 16)
            X = np.ones((z.shape[0], self.context_dim))
            X[:, :CONTEXT_DIM] = z.numpy()
            if self.exit_context:
                lg = self.model.head_logits(hd, pad, depth=self.n_fixed) if exit_logits is None else exit_logits
                logp = lg.detach().float().log_softmax(-1)  # (B, C) / (B, T, V)
                maxp = logp.max(-1).values.exp()  # (B,) or (B, T)
                ent = -(logp.exp() * logp).sum(-1) / math.log(logp.shape[-1])  # (B,) or (B, T), in [0, 1]
                if maxp.dim() == 2:
                    maxp, ent = maxp.mean(1), ent.mean(1)
                X[:, CONTEXT_DIM] = maxp.cpu().numpy()
                X[:, CONTEXT_DIM + 1] = ent.cpu().numpy()
        return X

    def _heads_for(self, depth_arm: int, greedy: bool, T: int, price: float):
        """Head choice for a group at ``depths[depth_arm]``: (heads_per_layer for run_layers,
        head counts per gated block, UCB arms, TS masks); head counts are charged
        ``price * head FLOPs fraction``."""
        n = self.depths[depth_arm] - self.n_fixed
        if n <= 0:
            return [], (), np.zeros(0, int), np.zeros((0, self.ts.n_arms), bool)
        key = (depth_arm, T, price)
        if greedy and key in self._greedy_cache:
            return self._greedy_cache[key]
        rows = np.arange(n)
        arms = self.ucb.select(rows, greedy=greedy, offset=-price * self._head_costs(T))  # (n,)
        k = arms + self.min_heads
        masks = self.ts.select(rows, k, greedy=greedy)  # (n, H)
        H = self.ts.n_arms
        heads = [None if kk == H else np.flatnonzero(m).tolist() for kk, m in zip(k, masks)]
        out = (heads, tuple(int(v) for v in k), arms, masks)
        if greedy:
            self._greedy_cache[key] = out
        return out

    def _select_depths(self, X: np.ndarray, T: int, greedy: bool, price: float) -> np.ndarray:
        """``B`` depth-arm indices: ``argmax (q + bonus - price * c)`` for contexts ``X`` (``B x
        dim``), or with ``dht_routing: cascade`` the first exit the stopping policy stops at for
        per-exit contexts ``X`` (``B x K x dim``); plus the exploration floor when not greedy."""
        if self.stopping is not None:
            arms = self.stopping.route(X, self._depth_costs(T), price)  # (B,)
        else:
            arms = self.lin.select(X, greedy=greedy, offset=-price * self._depth_costs(T))  # (B,)
        if not greedy and self.epsilon > 0:
            explore = self.rng.random(len(arms)) < self.epsilon
            arms = np.where(explore, self.rng.integers(0, len(self.depths), len(arms)), arms)
        return arms

    def _full_group(self) -> dict[str, Any]:
        depth = self.depths[-1]
        n = depth - self.n_fixed
        return dict(arm=None, depth=depth, idx=None, heads=[None] * n, counts=(self.model.config.n_heads,) * n)

    def _price(self, greedy: bool) -> float:
        if greedy and self.eval_price is not None:
            return self.eval_price
        return self.price.price

    def _plan(self, h, pad, greedy: bool, price: float | None = None, X: np.ndarray | None = None) -> list[dict[str, Any]]:
        """Groups of one batch: each a dict with ``arm``, ``depth``, ``idx`` (LongTensor or
        ``None`` = the whole batch), ``heads``, ``counts``, ``ucb_arms``, ``masks``. ``X``: the
        contexts when already computed (the cascade's per-exit contexts, ``B x K x dim``)."""
        if self.force_depth is not None:
            heads = self.force_heads or [None] * (self.force_depth - min(self.n_fixed, self.force_depth))
            H = self.model.config.n_heads
            counts = tuple(H if hs is None else len(hs) for hs in heads)
            return [dict(arm=None, depth=self.force_depth, idx=None, heads=list(heads), counts=counts)]
        if greedy and self.updates == 0:
            return [self._full_group()]
        price = self._price(greedy) if price is None else price
        T = h.shape[1]
        X = self._context(h, pad) if X is None else X  # (B, 17) or (B, 19); cascade (B, K, 19)
        arms = self._select_depths(X, T, greedy, price)  # (B,)
        groups = []
        uniq = np.unique(arms)
        for a in uniq:
            idx = None if len(uniq) == 1 else torch.from_numpy(np.flatnonzero(arms == a)).to(h.device)
            heads, counts, ucb_arms, masks = self._heads_for(int(a), greedy, T, price)
            groups.append(dict(arm=int(a), depth=self.depths[a], idx=idx, heads=heads, counts=counts,
                               ucb_arms=ucb_arms, masks=masks))
        if not greedy:
            self._pending = dict(X=X, arms=arms, groups=groups)
        return groups

    def _run_group(self, h, pad, g):
        """Hidden states of a group after its own blocks -> logits (the shared output head)."""
        idx = g["idx"]
        hg = h if idx is None else h[idx]  # (b, T, d)
        pg = pad if (idx is None or pad is None) else pad[idx]  # (b, T)
        hg = self.model.run_layers(hg, pg, min(self.n_fixed, g["depth"]), g["depth"],
                                   heads_per_layer=g["heads"])  # (b, T, d)
        return self.model.head_logits(hg, pg, depth=g["depth"])  # (b, C) or (b, T, V)

    def _run_exits(self, h, pad, depth: int, heads: list, hidden: bool = False):
        """Run blocks ``n_fixed..depth-1`` (``heads``: one entry per block) on ``h`` and read the
        shared output head at every allowed depth on the way: ``{depth: logits}``; with
        ``hidden``, also ``{depth: b x T x d hidden states}`` there."""
        out, hid = {}, {}
        if self.n_fixed in self.depths and self.n_fixed <= depth:
            out[self.n_fixed], hid[self.n_fixed] = self.model.head_logits(h, pad, depth=self.n_fixed), h
        for i in range(self.n_fixed, depth):
            h = self.model.run_layers(h, pad, i, i + 1, heads_per_layer=[heads[i - self.n_fixed]])
            if i + 1 in self.depths:
                out[i + 1], hid[i + 1] = self.model.head_logits(h, pad, depth=i + 1), h  # (b, C) or (b, T, V)
        return (out, hid) if hidden else out

    def _agreement(self, exits: dict) -> np.ndarray:
        """``B x K`` label-free qualities of every exit for fitting on held-out rows (the
        agreement target of PABEE / BERxiT-style exits): with ``dht_stop_quality: match``, 1 where
        the exit's class is the deepest exit's, else 0 (what accuracy counts); with ``prob``,
        the exit's probability of the deepest exit's class (a soft score that also rewards
        confidence: it favours stopping only at exits that are sure, which the budget then
        pushes to the shallowest ones)."""
        with torch.no_grad():
            top = exits[self.depths[-1]].argmax(-1, keepdim=True)  # (B, 1)
            if self.stop_quality == "match":
                return torch.stack([(exits[d].argmax(-1, keepdim=True) == top)[:, 0] for d in self.depths],
                                   1).double().cpu().numpy()  # (B, K)
            return torch.stack([exits[d].float().softmax(-1).gather(-1, top)[:, 0] for d in self.depths],
                               1).cpu().numpy()  # (B, K)

    def _stop_context(self, h, pad, logits: torch.Tensor, prev: tuple | None):
        """The cascade's context at one exit and the state the next exit reads.

        Args:
            h: ``b x T x d`` hidden states at the exit; ``pad``: ``b x T`` bool or ``None``.
            logits: ``b x C`` the exit's logits.
            prev: the state returned at the previous exit (``None`` at the first).

        Returns:
            ``(X, state)``: ``X`` ``b x dim`` float64 -- with ``dht_stop_context: exit`` the
            :meth:`_context` there (projection of the pooled state, max probability, entropy,
            1); with ``trajectory`` the :data:`TRAJECTORY_DIM` columns of
            :func:`~archsearch.dynamic.bandits.trajectory_context` (max probability, entropy /
            log C, agreement with the previous exit and the one before, the previous exit's max
            probability, 1); ``state`` = ``(class, agrees, max probability)``, ``b`` arrays each
            (index them with the rows that go on; ``None`` with ``exit``, which reads no history).
        """
        if self.stop_context == "exit":
            return self._context(h, pad, logits), None
        with torch.no_grad():
            probs = logits.detach().double().softmax(-1).cpu().numpy()  # (b, C)
        return trajectory_context(probs, prev)

    def _exit_contexts(self, exits: dict, hid: dict, pad) -> np.ndarray:
        """``B x K x dim`` contexts of every exit (the cascade's inputs, :meth:`_stop_context`)
        from :meth:`_run_exits`."""
        out, prev = [], None
        for d in self.depths:
            X, prev = self._stop_context(hid[d], pad, exits[d], prev)
            out.append(X)
        return np.stack(out, 1)

    def _trunk(self, x, mask, depth_cap: int | None = None):
        m = self.model
        pad = m.padding_mask(x, mask)  # (B, T)
        h = m.embed(x)  # (B, T, d)
        stop = self.n_fixed if depth_cap is None else min(self.n_fixed, depth_cap)
        return m.run_layers(h, pad, 0, stop), pad  # (B, T, d)

    # ------------------------------------------------------------------ training
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
        deep_loss, shallow_loss = all_exit_loss([exits[d] for d in self.depths], y, loss_fn, self.exit_loss,
                                                teacher=external)
        # two stages (``dht_exits_from_step``): the deepest exit alone first
        total = deep_loss + shallow_loss if self.steps >= self.exits_from else deep_loss
        with torch.no_grad():
            full_ce = torch.stack([per_sample_ce(exits[d], y) for d in self.depths], 1)  # (B, K)
            correct = (exits[deep].argmax(-1) == y).float()
            acc = float(correct.mean())
        t0 = time.perf_counter()
        # contexts: after block n_fixed (route once), or at every exit of the deepest path (cascade)
        X = self._context(h, pad) if self.stopping is None else self._exit_contexts(exits, hid, pad)
        if self.warming_up:  # the price follows the paths the bandit would choose (not run)
            arms = self._select_depths(X, T, False, self.price.price)
            self._pending = dict(X=X, arms=None, groups=[], full_ce=full_ce.cpu().numpy(), T=T, acc=acc,
                                 fraction=float(self._depth_costs(T)[arms].mean()))
            self.bandit_seconds += time.perf_counter() - t0
            return total
        groups = self._plan(h, pad, greedy=False, X=X)
        self.bandit_seconds += time.perf_counter() - t0
        ce = np.full((B, len(self.depths)), np.nan)  # per-sample CE at each exit reached
        routed = 0.0
        for g in groups:
            idx = g["idx"]
            hg = h if idx is None else h[idx]
            pg = pad if (idx is None or pad is None) else pad[idx]
            yg = y if idx is None else y[idx]
            ex = self._run_exits(hg, pg, g["depth"], g["heads"])
            last = ex[g["depth"]]
            tg = teacher if idx is None else teacher[idx]
            n = B if idx is None else len(idx)
            routed = routed + (loss_fn(last, yg) + distill(last, tg)) / 2 * (n / B)
            rows = np.arange(B) if idx is None else idx.cpu().numpy()
            with torch.no_grad():
                for d, lg in ex.items():
                    ce[rows, self.depths.index(d)] = per_sample_ce(lg, yg).cpu().numpy()
            g["n"] = n
        self._pending.update(T=T, ce=ce, full_ce=full_ce.cpu().numpy(), acc=acc)
        return total + routed

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
            fraction = sum(self._flops(T, g["depth"], g["counts"]) * g["n"] for g in p["groups"]) / (full * B)
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

    def _quality(self, ce: np.ndarray, norm: float) -> np.ndarray:
        """Per-sample quality of an exit from its cross-entropy ``ce`` (nats): ``-ce / norm``
        (``dht_reward: ce``) or ``exp(-ce)``, the probability the exit gives the true class
        (``dht_reward: prob``; a geometric mean over tokens for an LM): bounded in [0, 1] and
        aligned with accuracy, where the CE of a confidently wrong sample dominates the mean."""
        return np.exp(-ce) if self.reward == "prob" else -ce / norm

    def _update_heads(self, p, ce, full_ce, norm) -> None:
        """Head-count (UCB1) and head-subset (TS) updates: per group, the loss increase of its
        pruned heads over all heads at the same exit."""
        rows, ucb_arms, masks, q, succ = [], [], [], [], []
        for g in p["groups"]:
            n = len(g["counts"])
            if not n:
                continue
            idx = np.arange(ce.shape[0]) if g["idx"] is None else g["idx"].cpu().numpy()
            k = self.depths.index(g["depth"])
            delta = float(np.mean(ce[idx, k] - full_ce[idx, k])) / norm  # >= 0 typically
            r = np.arange(n)
            base = self.head_baseline[r]
            rows.append(r)
            ucb_arms.append(g["ucb_arms"])
            masks.append(g["masks"])
            q.append(np.full(n, -delta))
            succ.append(np.isnan(base) | (delta <= base))
            self.head_baseline[r] = np.where(np.isnan(base), delta, self.ema * base + (1 - self.ema) * delta)
        if rows:
            rows_a = np.concatenate(rows)
            self.ucb.update(rows_a, np.concatenate(ucb_arms), np.concatenate(q))
            self.ts.update(rows_a, np.concatenate(masks), np.concatenate(succ))

    # ------------------------------------------------------------------ budget calibration
    def before_evaluate(self, split_name: str = "validation") -> None:
        """Start an evaluation pass over ``split_name``: forget the evaluation counters (so
        :meth:`metrics` describes this pass only) and calibrate the inference price on the
        validation split (with a ``loop``, a ``flops_budget`` and a trained bandit; see
        :meth:`calibrate`)."""
        self._reset_eval_counters()
        if self.loop is None or self.flops_budget is None or self.updates == 0 or self.force_depth is not None:
            return
        self.calibrate(self.calibration_batches(self.calibration_rows))

    @torch.no_grad()
    def calibrate(self, batches, budget: float | None = None) -> tuple[float, float]:
        """Set :attr:`eval_price` so that greedy inference on ``batches`` runs ``budget`` of the
        full model's FLOPs (sum of executed FLOPs / sum of full-model FLOPs), by bisection on
        the price (the fraction is non-increasing in it; a step function, so the result is the
        closest reachable point). With ``dht_routing: cascade`` every tried price refits the
        stopping policy at that price (:meth:`LinearStopping.fit`), which stays fitted at the
        calibrated one (then, if that misses the budget by more than 0.005, one offset on all
        its thresholds is bisected, :meth:`LinearStopping.calibrate_offset`); the exits' contexts are read on the greedy heads' path (re-read once
        if the calibrated price picks other heads). With ``dht_stop_fit: validation`` those
        fits use ``batches`` themselves, no labels: an exit's quality is its probability of
        the deepest exit's class (training qualities are biased: the deeper exits fit the
        training rows better than they generalise).

        Args:
            batches: iterable of ``(x, mask)`` or ``(x, mask, y)``: ``B x T`` ids, ``B x T`` bool
                (or ``None``) -- validation data.
            budget: target fraction in (0, 1]; default ``flops_budget``.

        Returns:
            ``(price, fraction)``: the calibrated price and the FLOPs fraction it gives.

        Raises:
            ValueError: no budget given and no ``flops_budget`` configured.
        """
        budget = self.flops_budget if budget is None else float(budget)
        if budget is None:
            raise ValueError("calibrate needs a budget (flops_budget is not set)")
        dev = next(self.model.parameters()).device
        batches = [(b[0].to(dev), None if b[1] is None else b[1].to(dev)) for b in batches]
        K, deep = len(self.depths), self.depths[-1]

        def greedy_heads(price: float) -> dict:
            return {x.shape[1]: self._heads_for(K - 1, True, x.shape[1], price)[0] for x, _ in batches}

        def contexts(heads: dict) -> list:
            """(X, T) per batch: the context after block n_fixed (route once), or every exit's
            context on the path of the greedy heads (cascade)."""
            was = self.model.training
            self.model.eval()
            try:
                out = []
                for x, mask in batches:
                    h, pad = self._trunk(x, mask)
                    if self.stopping is None:
                        out.append((self._context(h, pad), x.shape[1]))
                    else:
                        exits, hid = self._run_exits(h, pad, deep, heads[x.shape[1]], hidden=True)
                        out.append((self._exit_contexts(exits, hid, pad), x.shape[1], self._agreement(exits)))
                return out
            finally:
                self.model.train(was)

        def refit(price: float) -> None:  # the stopping policy of that price
            if self.stop_fit == "validation":
                self.stopping.fit(price, data=held_out)
            else:
                self.stopping.fit(price)

        def fraction(price: float, fit: bool = True) -> float:
            if self.stopping is not None and fit:
                refit(price)
            used = full = 0.0
            for X, T, *_ in ctx:
                arms = self._select_depths(X, T, True, price)
                cnt = np.bincount(arms, minlength=len(self.depths))
                for a in np.flatnonzero(cnt):
                    counts = self._heads_for(int(a), True, T, price)[1]
                    used += cnt[a] * self._flops(T, self.depths[a], counts)
                full += len(X) * self._full_flops(T)
            return used / max(full, 1.0)

        # cascade: the contexts depend on the heads, which depend on the price: the first round
        # reads them on the heads of the training price, a second one (only if the calibrated
        # price picks other heads) on the heads of the price found
        heads = greedy_heads(self.price.price) if self.stopping is not None else {}
        for _ in range(2):
            ctx = contexts(heads)
            if self.stopping is not None:  # (Xs, agreement, costs) of the calibration rows
                held_out = (np.concatenate([c[0] for c in ctx]), np.concatenate([c[2] for c in ctx]),
                            np.concatenate([np.broadcast_to(self._depth_costs(c[1]), c[2].shape) for c in ctx]))
            price, frac = calibrate_price(fraction, budget)
            if self.stopping is None or greedy_heads(price) == heads:
                break
            heads = greedy_heads(price)
        if self.stopping is not None:
            refit(price)
            if abs(frac - budget) > 0.005:
                frac = self.stopping.calibrate_offset(lambda: fraction(price, fit=False), budget, frac)
        self._greedy_cache.clear()
        self.eval_price, self.calibrated_fraction = float(price), float(frac)
        return self.eval_price, self.calibrated_fraction

    # ------------------------------------------------------------------ inference
    def predict(self, x, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy gated inference at the calibrated price: ``(logits, flops)``; ``logits``
        ``B x C`` (or ``B x T x V``), ``flops`` float ``(B,)`` FLOPs executed per sample (its
        fixed blocks, its gated blocks with its heads, the output head)."""
        with torch.no_grad():
            h, pad = self._trunk(x, mask, self.force_depth)
            if self._cascading():
                out, arms, _ = self._run_cascade(h, pad)
                T = x.shape[1]
                flops = torch.empty(x.shape[0], dtype=torch.float64)
                for a in np.unique(arms):
                    counts = self._heads_for(int(a), True, T, self._price(True))[1]
                    n = int((arms == a).sum())
                    flops[torch.from_numpy(np.flatnonzero(arms == a))] = float(self._flops(T, self.depths[a], counts))
                    self._eval_counts[a] += n
                    self._eval_heads[0] += n * sum(counts)
                    self._eval_heads[1] += n * len(counts)
                return out, flops
            groups = self._plan(h, pad, greedy=True)
            B, T = x.shape
            out = None
            flops = torch.empty(B, dtype=torch.float64)
            for g in groups:
                lg = self._run_group(h, pad, g)
                if len(groups) == 1:
                    out = lg
                else:
                    if out is None:
                        out = lg.new_empty((B,) + tuple(lg.shape[1:]))
                    out[g["idx"]] = lg
                n = B if g["idx"] is None else len(g["idx"])
                f = self._flops(T, g["depth"], g["counts"])
                if g["idx"] is None:
                    flops.fill_(float(f))
                else:
                    flops[g["idx"].cpu()] = float(f)
                if g["arm"] is not None:
                    self._eval_counts[g["arm"]] += n
                elif g["depth"] in self.depths:
                    self._eval_counts[self.depths.index(g["depth"])] += n
                self._eval_heads[0] += n * sum(g["counts"])
                self._eval_heads[1] += n * len(g["counts"])
        return out, flops

    def _cascading(self) -> bool:
        """Greedy inference runs the cascade: ``dht_routing: cascade``, trained, not forced."""
        return self.stopping is not None and self.force_depth is None and self.updates > 0

    def _run_cascade(self, h, pad):
        """Greedy exit-by-exit inference (``dht_routing: cascade``) from the hidden states after
        block ``n_fixed`` (``B x T x d``): at each exit the samples still running read their
        exit, and the stopping policy at the inference price decides who stops; the others run
        the next block (with the greedy heads of that block), as one batch.

        Returns:
            ``(logits, arms, heads)``: ``B x C`` (or ``B x T x V``) logits of each sample's exit,
            ``B`` depth-arm indices (int array), and the heads of every gated block
            (``heads_per_layer`` of the deepest allowed path).
        """
        price = self._price(True)
        B, T = h.shape[0], h.shape[1]
        K = len(self.depths)
        heads = self._heads_for(K - 1, True, T, price)[0]
        costs_ = self._depth_costs(T)
        lo = self.depths[0]
        if lo > self.n_fixed:
            h = self.model.run_layers(h, pad, self.n_fixed, lo, heads_per_layer=heads[:lo - self.n_fixed])
        active = torch.arange(B)
        arms = np.full(B, K - 1)
        out, prev = None, None
        for k, d in enumerate(self.depths):
            lg = self.model.head_logits(h, pad, depth=d)  # (b, C)
            if out is None:
                out = lg.new_empty((B,) + tuple(lg.shape[1:]))
            X, prev = self._stop_context(h, pad, lg, prev)
            stop = self.stopping.stop(k, X, costs_, price)  # (b,)
            st = torch.from_numpy(np.flatnonzero(stop))
            out[active[st]] = lg[st]
            arms[active[st].numpy()] = k
            if stop.all():
                break
            keep = torch.from_numpy(np.flatnonzero(~stop))
            if len(st):
                active, h = active[keep], h[keep]
                pad = None if pad is None else pad[keep]
                prev = None if prev is None else tuple(a[keep.numpy()] for a in prev)
            h = self.model.run_layers(h, pad, d, d + 1, heads_per_layer=[heads[d - self.n_fixed]])
        return out, arms, heads

    def plan(self, x, mask) -> list[tuple[int, list[int], list]]:
        """The greedy inference choices for a batch, as :meth:`predict` would run them.

        Args:
            x: ``B x T`` token ids; ``mask``: ``B x T`` bool or ``None``.

        Returns:
            One ``(depth, sample_indices, heads_per_layer)`` per group; ``heads_per_layer`` has
            one entry per gated block ``n_fixed..depth-1`` (head indices or ``None`` = all),
            as ``Transformer.run_layers`` takes it.
        """
        with torch.no_grad():
            h, pad = self._trunk(x, mask, self.force_depth)
            if self._cascading():
                _, arms, heads = self._run_cascade(h, pad)
                return [(self.depths[a], np.flatnonzero(arms == a).tolist(),
                         list(heads[:self.depths[a] - self.n_fixed])) for a in np.unique(arms)]
            groups = self._plan(h, pad, greedy=True)
        B = x.shape[0]
        return [(g["depth"], list(range(B)) if g["idx"] is None else g["idx"].tolist(), list(g["heads"]))
                for g in groups]

    # ------------------------------------------------------------------ reporting, state
    def metrics(self) -> dict[str, Any]:
        """``dht_depth_hist`` (fraction of evaluated samples per depth, keys are depths as
        strings), ``dht_mean_depth``, ``dht_mean_heads`` (mean heads computed per executed gated
        block), ``dht_train_depth_hist`` (training choices after the take-over),
        ``dht_price`` (training price lambda, per unit of FLOPs fraction), ``dht_eval_price``
        (the calibrated inference price, -1 = none), ``dht_train_flops_fraction`` (running FLOPs
        fraction of the routed training paths), ``dht_calibrated_flops_fraction`` (FLOPs
        fraction on the calibration rows at ``dht_eval_price``, -1 = none),
        ``dht_takeover_step`` (-1 = still warming up), ``dht_bandit_seconds`` and
        ``dht_bandit_overhead_pct`` (of the trial's training time).

        The evaluation entries (``dht_depth_hist``, ``dht_mean_depth``, ``dht_mean_heads``, and
        ``dht_eval_samples``, the number of samples they cover) count the samples
        :meth:`predict` ran since :meth:`before_evaluate` (or the last call): in
        ``TrialLoop.evaluate`` exactly the split just evaluated, read before the latency timing
        (which also runs :meth:`predict`). The counters reset on each call."""
        ev = self._eval_counts
        tot = max(ev.sum(), 1)
        tr = self._train_counts
        out = {
            "dht_depth_hist": {str(d): float(c / tot) for d, c in zip(self.depths, ev)},
            "dht_eval_samples": int(ev.sum()),
            "dht_mean_depth": float(np.dot(self.depths, ev) / tot),
            "dht_mean_heads": float(self._eval_heads[0] / max(self._eval_heads[1], 1)),
            "dht_train_depth_hist": {str(d): float(c / max(tr.sum(), 1)) for d, c in zip(self.depths, tr)},
            "dht_price": float(self.price.price),
            "dht_eval_price": -1.0 if self.eval_price is None else float(self.eval_price),
            "dht_train_flops_fraction": -1.0 if self.train_fraction is None else float(self.train_fraction),
            "dht_calibrated_flops_fraction": -1.0 if self.calibrated_fraction is None else float(self.calibrated_fraction),
            "dht_takeover_step": -1 if self.takeover_step is None else int(self.takeover_step),
            "dht_bandit_seconds": float(self.bandit_seconds),
        }
        train_s = self.loop.train_seconds if self.loop is not None else 0.0
        if train_s:
            out["dht_bandit_overhead_pct"] = 100.0 * self.bandit_seconds / train_s
        self._reset_eval_counters()
        return out

    def _reset_eval_counters(self) -> None:
        self._eval_counts = np.zeros(len(self.depths))  # samples per depth arm
        self._eval_heads = [0.0, 0.0]  # summed heads over executed gated blocks, block count

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
                **({"stopping": self.stopping.state_dict()} if self.stopping is not None else {})}

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
        self._greedy_cache.clear()
