"""DHT: per-sample layer and head gating by contextual bandits (``gating: dht``).

Source: Sample-based Dynamic Hierarchical Transformer (arXiv 2312.03038); our specification is
the DHT section of docs/design.md. Per batch:

1. Every sample runs the embeddings and the first ``n_fixed`` blocks (all heads) as one batch.
2. Context: the mean-pooled hidden state there, times a fixed random ``d x 16`` projection
   (seeded), L2-normalised, plus a constant 1 -> a 17-dim vector per sample.
3. Depth: a :class:`~archsearch.dynamic.bandits.LinUCB` (arms = allowed depths
   ``min_layers..max_layers``) picks ``L*`` per sample.
4. Queueing: samples with the same ``L*`` form one group. For each group and each gated block
   ``n_fixed..L*-1``, a :class:`~archsearch.dynamic.bandits.UCB1` (one row per block, arms =
   head counts ``min_heads..n_heads``) picks how many heads, and a
   :class:`~archsearch.dynamic.bandits.CombinatorialTS` (a Beta posterior per head) picks which.
   The group then runs as ONE real batch through exactly its blocks with only its heads
   (``Transformer.run_layers(heads_per_layer=...)`` slices the Q/K/V/O weights: unselected heads
   and blocks are not computed). The shared output head reads the hidden state after ``L*``.
5. Reward of a group (the real batch its arms ran in):
   ``r = -(group loss / running mean of the batch loss) - dht_lambda * FLOPs fraction``
   (FLOPs of the group's path / FLOPs of the full model at the same length). Every arm the group
   used gets that reward: the LinUCB arm of each of its samples, the UCB1 head-count arm of each
   of its blocks; each selected head's Beta gets a success when ``r`` beats the running baseline
   of rewards at that depth.

The first ``dht_warmup_steps`` training steps run the full model (no bandit choices). Inference
uses greedy choices (LinUCB mean, best UCB1 mean, highest posterior means; no exploration) with
the same grouping. Before any bandit update, inference runs the deepest allowed depth with all
heads.

Config keys (trial config, docs/design.md MODEL_KEYS): ``dht_lambda`` (default 0.5), ``n_fixed``
(1), ``min_layers`` (``n_fixed``), ``max_layers`` (``n_layers``), ``min_heads`` (1),
``dht_warmup_steps`` (100). Depth limits are clamped into ``[n_fixed, n_layers]`` (a searched
``max_layers`` may exceed a searched ``n_layers``), and ``min_layers`` to at most ``max_layers``.

Shapes: ``x`` ``B x T`` ids, ``mask`` ``B x T`` bool, ``y`` ``B`` labels (or ``B x T`` for lm).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from archsearch.dynamic.bandits import UCB1, CombinatorialTS, LinUCB
from archsearch.dynamic.base import GatingStrategy, LossFn, TrialContext
from archsearch.models import costs

CONTEXT_DIM = 16


class DHTGating(GatingStrategy):
    """Per-sample depth and per-group head gating by bandits (see the module docstring).

    Args:
        model: the trial's :class:`~archsearch.models.transformer.Transformer`.
        cfg: trial config (keys in the module docstring).
        settings: budget; ``seed`` seeds the projection and the Thompson sampler.
        loop: the :class:`~archsearch.dynamic.base.TrialContext` (optional; its ``train_seconds``
            gives the overhead percentage in :meth:`metrics`).
        alpha: LinUCB exploration scale.
        ucb_c: UCB1 exploration scale (rewards are O(1)).
        decay: forgetting factor of all bandits per update (the model keeps training, so
            rewards drift).
        ema: smoothing of the running loss mean and reward baselines.

    Attributes:
        force_depth: set to an int to run every sample at that depth (tests; bandits are not
            updated while forced). ``None`` = bandit choices.
        force_heads: with ``force_depth``: one head-index list (or ``None`` = all) per gated
            block ``n_fixed..force_depth-1``.
        bandit_seconds: wall seconds spent in bandit bookkeeping during training (context,
            selection, grouping plan, updates); the model's forward/backward is not included.

    Raises:
        ValueError: ``n_fixed`` outside ``[0, n_layers]``, ``min_heads`` outside
            ``[1, n_heads]``, negative ``dht_lambda`` or ``dht_warmup_steps``.
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
        self.min_heads = int(cfg.get("min_heads") or 1)
        if not 1 <= self.min_heads <= H:
            raise ValueError(f"min_heads must be in [1, n_heads={H}], got {self.min_heads}")
        self.lam = float(cfg.get("dht_lambda", 0.5))
        self.warmup = int(cfg.get("dht_warmup_steps", 100))
        if self.lam < 0 or self.warmup < 0:
            raise ValueError(f"dht_lambda and dht_warmup_steps must be >= 0, got {self.lam}, {self.warmup}")
        self.n_gated = hi - self.n_fixed  # blocks that can be head-gated
        seed = int(settings.get("seed", 0))
        gen = torch.Generator().manual_seed(seed + 7919)
        self.proj = torch.randn(conf.d_model, CONTEXT_DIM, generator=gen)  # (d, 16) fixed
        self.lin = LinUCB(len(self.depths), CONTEXT_DIM + 1, alpha=alpha, decay=decay)
        rows = max(self.n_gated, 1)
        self.ucb = UCB1(H - self.min_heads + 1, n_rows=rows, c=ucb_c, decay=decay)
        self.ts = CombinatorialTS(H, n_rows=rows, seed=seed, decay=decay)
        self.ema = float(ema)
        self.loss_mean: float | None = None
        self.baseline = np.full(len(self.depths), np.nan)  # running reward per depth arm
        self.steps = 0
        self.updates = 0
        self.bandit_seconds = 0.0
        self.force_depth: int | None = None
        self.force_heads: list | None = None
        self._pending: dict[str, Any] | None = None
        self._flops_cache: dict[tuple, int] = {}
        self._greedy_cache: dict[int, tuple] = {}
        self._train_counts = np.zeros(len(self.depths))
        self._eval_counts = np.zeros(len(self.depths))
        self._eval_heads = [0.0, 0.0]  # summed heads over executed gated blocks, block count

    # ------------------------------------------------------------------ helpers
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

    def _context(self, h: torch.Tensor, pad: torch.Tensor | None) -> np.ndarray:
        """``B x T x d`` hidden states -> ``B x 17`` float64 contexts (projection + bias)."""
        with torch.no_grad():
            z = self.model.pool(h.detach(), pad) @ self.proj  # (B, 16)
            z = F.normalize(z, dim=-1)  # (B, 16)
        X = np.ones((z.shape[0], CONTEXT_DIM + 1))
        X[:, :CONTEXT_DIM] = z.numpy()
        return X

    def _heads_for(self, depth_arm: int, greedy: bool) -> tuple[list, tuple[int, ...], np.ndarray, np.ndarray]:
        """Head choice for a group at ``depths[depth_arm]``: (heads_per_layer for run_layers,
        head counts per gated block, UCB arms, TS masks)."""
        n = self.depths[depth_arm] - self.n_fixed
        if n <= 0:
            return [], (), np.zeros(0, int), np.zeros((0, self.ts.n_arms), bool)
        if greedy and depth_arm in self._greedy_cache:
            return self._greedy_cache[depth_arm]
        rows = np.arange(n)
        arms = self.ucb.select(rows, greedy=greedy)  # (n,)
        k = arms + self.min_heads
        masks = self.ts.select(rows, k, greedy=greedy)  # (n, H)
        H = self.ts.n_arms
        heads = [None if kk == H else np.flatnonzero(m).tolist() for kk, m in zip(k, masks)]
        out = (heads, tuple(int(v) for v in k), arms, masks)
        if greedy:
            self._greedy_cache[depth_arm] = out
        return out

    def _plan(self, h, pad, greedy: bool) -> list[dict[str, Any]]:
        """Groups of one batch: each a dict with ``arm``, ``depth``, ``idx`` (LongTensor or
        ``None`` = the whole batch), ``heads``, ``counts``, ``ucb_arms``, ``masks``."""
        B = h.shape[0]
        if self.force_depth is not None:
            heads = self.force_heads or [None] * (self.force_depth - min(self.n_fixed, self.force_depth))
            H = self.model.config.n_heads
            counts = tuple(H if hs is None else len(hs) for hs in heads)
            return [dict(arm=None, depth=self.force_depth, idx=None, heads=list(heads), counts=counts)]
        if greedy and self.updates == 0 or (not greedy and self.steps < self.warmup):
            depth = self.depths[-1]
            n = depth - self.n_fixed
            return [dict(arm=None, depth=depth, idx=None, heads=[None] * n,
                         counts=(self.model.config.n_heads,) * n)]
        X = self._context(h, pad)  # (B, 17)
        arms = self.lin.select(X, greedy=greedy)  # (B,)
        groups = []
        uniq = np.unique(arms)
        for a in uniq:
            idx = None if len(uniq) == 1 else torch.from_numpy(np.flatnonzero(arms == a))
            heads, counts, ucb_arms, masks = self._heads_for(int(a), greedy)
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
        return self.model.head_logits(hg, pg)  # (b, C) or (b, T, V)

    def _trunk(self, x, mask, depth_cap: int | None = None):
        m = self.model
        pad = m.padding_mask(x, mask)  # (B, T)
        h = m.embed(x)  # (B, T, d)
        stop = self.n_fixed if depth_cap is None else min(self.n_fixed, depth_cap)
        return m.run_layers(h, pad, 0, stop), pad  # (B, T, d)

    # ------------------------------------------------------------------ training
    def training_loss(self, x, mask, y, loss_fn: LossFn) -> torch.Tensor:
        """Mean training loss of the batch over all groups (each group's mean loss weighted by
        its size). Records the groups' losses for :meth:`after_step`."""
        self._pending = None
        h, pad = self._trunk(x, mask, self.force_depth)
        t0 = time.perf_counter()
        groups = self._plan(h, pad, greedy=False)
        self.bandit_seconds += time.perf_counter() - t0
        B = x.shape[0]
        total = 0.0
        for g in groups:
            idx = g["idx"]
            yg = y if idx is None else y[idx]
            lg = loss_fn(self._run_group(h, pad, g), yg)
            n = B if idx is None else len(idx)
            total = total + lg * (n / B)
            g["loss"] = lg.detach()
            g["n"] = n
        if self._pending is not None:
            self._pending["T"] = x.shape[1]
        return total

    def after_step(self, loss: float) -> None:
        """Bandit updates from the last :meth:`training_loss` (``loss``: the batch's mean loss,
        nats)."""
        self.steps += 1
        t0 = time.perf_counter()
        prev = self.loss_mean
        self.loss_mean = loss if prev is None else self.ema * prev + (1 - self.ema) * loss
        p, self._pending = self._pending, None
        if p is not None and prev is not None and prev > 0:
            groups, T = p["groups"], p["T"]
            full = self._full_flops(T)
            r = np.array([-(float(g["loss"]) / prev) - self.lam * self._flops(T, g["depth"], g["counts"]) / full
                          for g in groups])  # (G,)
            group_of = np.searchsorted(np.array([g["arm"] for g in groups]), p["arms"])  # (B,)
            self.lin.update(p["X"], p["arms"], r[group_of])
            rows, ucb_arms, masks, succ, rew = [], [], [], [], []
            for gi, g in enumerate(groups):
                n = len(g["counts"])
                if n:
                    base = self.baseline[g["arm"]]
                    rows.append(np.arange(n))
                    ucb_arms.append(g["ucb_arms"])
                    masks.append(g["masks"])
                    rew.append(np.full(n, r[gi]))
                    succ.append(np.full(n, np.isnan(base) or r[gi] > base))
            if rows:
                rows_a = np.concatenate(rows)
                self.ucb.update(rows_a, np.concatenate(ucb_arms), np.concatenate(rew))
                self.ts.update(rows_a, np.concatenate(masks), np.concatenate(succ))
            for gi, g in enumerate(groups):
                b = self.baseline[g["arm"]]
                self.baseline[g["arm"]] = r[gi] if np.isnan(b) else self.ema * b + (1 - self.ema) * r[gi]
            np.add.at(self._train_counts, p["arms"], 1)
            self.updates += 1
            self._greedy_cache.clear()
        self.bandit_seconds += time.perf_counter() - t0

    # ------------------------------------------------------------------ inference
    def predict(self, x, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy gated inference: ``(logits, flops)``; ``logits`` ``B x C`` (or ``B x T x V``),
        ``flops`` float ``(B,)`` FLOPs executed per sample (its fixed blocks, its gated blocks
        with its heads, the output head)."""
        with torch.no_grad():
            h, pad = self._trunk(x, mask, self.force_depth)
            groups = self._plan(h, pad, greedy=True)
            B, T = x.shape
            out = None
            flops = torch.empty(B)
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
                    flops[g["idx"]] = float(f)
                if g["arm"] is not None:
                    self._eval_counts[g["arm"]] += n
                elif g["depth"] in self.depths:
                    self._eval_counts[self.depths.index(g["depth"])] += n
                self._eval_heads[0] += n * sum(g["counts"])
                self._eval_heads[1] += n * len(g["counts"])
        return out, flops

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
            groups = self._plan(h, pad, greedy=True)
        B = x.shape[0]
        return [(g["depth"], list(range(B)) if g["idx"] is None else g["idx"].tolist(), list(g["heads"]))
                for g in groups]

    # ------------------------------------------------------------------ reporting, state
    def metrics(self) -> dict[str, Any]:
        """``dht_depth_hist`` (fraction of evaluated samples per depth, keys are depths as
        strings), ``dht_mean_depth``, ``dht_mean_heads`` (mean heads computed per executed gated
        block), ``dht_train_depth_hist`` (training choices after warm-up), ``dht_bandit_seconds``
        and ``dht_bandit_overhead_pct`` (of the trial's training time). Evaluation counters reset
        on each call."""
        ev = self._eval_counts
        tot = max(ev.sum(), 1)
        tr = self._train_counts
        out = {
            "dht_depth_hist": {str(d): float(c / tot) for d, c in zip(self.depths, ev)},
            "dht_mean_depth": float(np.dot(self.depths, ev) / tot),
            "dht_mean_heads": float(self._eval_heads[0] / max(self._eval_heads[1], 1)),
            "dht_train_depth_hist": {str(d): float(c / max(tr.sum(), 1)) for d, c in zip(self.depths, tr)},
            "dht_bandit_seconds": float(self.bandit_seconds),
        }
        train_s = self.loop.train_seconds if self.loop is not None else 0.0
        if train_s:
            out["dht_bandit_overhead_pct"] = 100.0 * self.bandit_seconds / train_s
        self._eval_counts = np.zeros(len(self.depths))
        self._eval_heads = [0.0, 0.0]
        return out

    def state_dict(self) -> dict[str, Any]:
        """Bandits, projection and running statistics (tensors, numbers, strings, dicts)."""
        return {"lin": self.lin.state_dict(), "ucb": self.ucb.state_dict(), "ts": self.ts.state_dict(),
                "proj": self.proj.clone(), "loss_mean": self.loss_mean,
                "baseline": torch.from_numpy(self.baseline.copy()), "steps": self.steps,
                "updates": self.updates, "bandit_seconds": self.bandit_seconds,
                "train_counts": torch.from_numpy(self._train_counts.copy())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.lin.load_state_dict(state["lin"])
        self.ucb.load_state_dict(state["ucb"])
        self.ts.load_state_dict(state["ts"])
        self.proj = state["proj"].clone()
        self.loss_mean = state["loss_mean"]
        self.baseline = state["baseline"].numpy().copy()
        self.steps, self.updates = int(state["steps"]), int(state["updates"])
        self.bandit_seconds = float(state["bandit_seconds"])
        self._train_counts = state["train_counts"].numpy().copy()
        self._greedy_cache.clear()
