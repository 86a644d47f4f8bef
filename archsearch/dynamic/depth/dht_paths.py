"""DHT's paths (:mod:`archsearch.dynamic.depth.dht`): what one routing decision costs and runs.

A mixin of :class:`~archsearch.dynamic.depth.dht.DHTGating` holding the per-path machinery of
Sample-based Dynamic Hierarchical Transformer (arXiv 2312.03038, §3): the FLOPs of a path
(``n_fixed`` full blocks + gated blocks with their head counts), the bandits' contexts (a fixed
random projection of the pooled hidden state, plus the exit's confidence), the head choice per
gated block (UCB1 counts, Thompson-sampled subsets), the depth choice (LinUCB, or the cascade's
stop policy), grouping a batch by chosen path and running each group as one batch, and the
bandit rewards of the head choices. It reads the attributes :class:`DHTGating.__init__` sets
(``model``, ``depths``, ``n_fixed``, ``min_heads``, the bandits, ``proj``...).

Shapes: ``h`` ``B x T x d`` hidden states, ``pad`` ``B x T`` bool or ``None``, contexts
``B x dim`` float64 (``B x K x dim`` for the cascade's per-exit contexts).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from archsearch.dynamic.depth.exits import read_exits
from archsearch.dynamic.depth.stopping import trajectory_context, trajectory_contexts
from archsearch.models import costs

#: Columns of the random projection of the pooled hidden state in a DHT context.
CONTEXT_DIM = 16


class DHTPaths:
    """Costs, contexts, choices and runs of DHT's paths (a mixin; see the module docstring)."""

    @staticmethod
    def allowed_depths(s, n_layers: int) -> list[int]:
        """The exits (blocks) a sample may take, ``lo .. hi``: ``max_layers`` (or ``n_layers``)
        clamped into ``[max(n_fixed, 1), n_layers]``, ``min_layers`` (or ``n_fixed``) clamped
        into ``[n_fixed, hi]``."""
        hi = min(max(s.max_layers or n_layers, s.n_fixed, 1), n_layers)
        lo = min(max(s.min_layers or s.n_fixed, s.n_fixed), hi)
        return list(range(lo, hi + 1))

    @classmethod
    def exit_head_depths(cls, s, model_config) -> list[int]:
        """Every allowed exit with ``exit_heads`` (as :meth:`__init__` builds them)."""
        return cls.allowed_depths(s, model_config.n_layers) if s.exit_heads else []

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

    def _context_flops(self, T: int) -> int:
        """FLOPs per sample of the head :meth:`_context` runs at block ``n_fixed`` before it
        routes: a language model's vocabulary head (``2 T d V``, more than a block) when routed
        once with ``dht_exit_context``; ``0`` otherwise (a cascade reads the exits it runs
        anyway; a classifier's context head, ``2 d C``, under 0.01% of a block, stays
        uncounted). Part of every routed sample's FLOPs (:meth:`_group_flops`), of the arm
        costs and of the calibrated fraction, so the budget holds on executed FLOPs."""
        conf = self.model.config
        if conf.task != "lm" or not self.exit_context or self.stopping is not None:
            return 0
        key = (T, "context")
        if key not in self._flops_cache:
            self._flops_cache[key] = costs.flops_per_sample(conf, T, n_layers=0)  # the head alone
        return self._flops_cache[key]

    def _group_flops(self, T: int, g: dict) -> int:
        """FLOPs per sample of a :meth:`_plan` group: its path, plus the context head when the
        group was routed (not a forced depth, not the untrained full path)."""
        return self._flops(T, g["depth"], g["counts"]) + (self._context_flops(T) if g.get("routed") else 0)

    def _full_flops(self, T: int) -> int:
        key = (T, "full")
        if key not in self._flops_cache:
            self._flops_cache[key] = costs.flops_per_sample(self.model.config, T)
        return self._flops_cache[key]

    def _depth_costs(self, T: int) -> np.ndarray:
        """``K`` FLOPs fractions of the depth arms (all heads) at length ``T``."""
        H = self.model.config.n_heads
        full = self._full_flops(T)
        ctx = self._context_flops(T)
        return np.array([(self._flops(T, d, (H,) * (d - min(self.n_fixed, d))) + ctx) / full for d in self.depths])

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
        ``None`` = the whole batch), ``rows`` (``idx`` as a numpy array, or ``None``), ``heads``,
        ``counts``, ``ucb_arms``, ``masks``. ``X``: the
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
            rows = None if len(uniq) == 1 else np.flatnonzero(arms == a)  # (n,) on the host too
            idx = None if rows is None else torch.from_numpy(rows).to(h.device)
            heads, counts, ucb_arms, masks = self._heads_for(int(a), greedy, T, price)
            groups.append(dict(arm=int(a), depth=self.depths[a], idx=idx, rows=rows, heads=heads, counts=counts,
                               ucb_arms=ucb_arms, masks=masks, routed=True))
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
        hid = {}
        if self.n_fixed in self.depths and self.n_fixed <= depth:
            hid[self.n_fixed] = h
        for i in range(self.n_fixed, depth):
            h = self.model.run_layers(h, pad, i, i + 1, heads_per_layer=[heads[i - self.n_fixed]])
            if i + 1 in self.depths:
                hid[i + 1] = h  # (b, T, d)
        out = dict(zip(hid, read_exits(self.model, list(hid.values()), pad, list(hid))))  # (b, C) / (b, T, V)
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

    def _stop_context(self, h, pad, logits: torch.Tensor, prev: tuple | None, on_device: bool = False):
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
            With ``on_device`` (``trajectory`` only) tensors on ``logits``' device, no host
            synchronisation (inference's cascade); numpy arrays otherwise.
        """
        if self.stop_context == "exit":
            return self._context(h, pad, logits), None
        with torch.no_grad():
            probs = logits.detach().double().softmax(-1)  # (b, C)
        return trajectory_context(probs if on_device else probs.cpu().numpy(), prev)

    def _exit_contexts(self, exits: dict, hid: dict, pad, to_host: bool = True):
        """``B x K x dim`` contexts of every exit (the cascade's inputs, :meth:`_stop_context`)
        from :meth:`_run_exits`: a float64 numpy array, or with ``to_host=False`` and
        ``dht_stop_context: trajectory`` a tensor on the exits' device (the caller copies it to
        the host with its other per-step values, in one synchronisation)."""
        on_device = self.stop_context == "trajectory"  # computed on the device, one host copy
        if on_device and exits[self.depths[0]].dim() == 2:  # classification: every exit at once
            with torch.no_grad():
                probs = torch.stack([exits[d] for d in self.depths]).detach().double().softmax(-1)  # (K, B, C)
                X = trajectory_contexts(probs)  # (B, K, dim)
            return X.cpu().numpy() if to_host else X
        out, prev = [], None
        for d in self.depths:
            X, prev = self._stop_context(hid[d], pad, exits[d], prev, on_device=on_device)
            out.append(X)
        if not on_device:
            return np.stack(out, 1)
        X = torch.stack(out, 1)
        return X.cpu().numpy() if to_host else X

    def _trunk(self, x, mask, depth_cap: int | None = None):
        m = self.model
        pad = m.padding_mask(x, mask)  # (B, T)
        h = m.embed(x)  # (B, T, d)
        stop = self.n_fixed if depth_cap is None else min(self.n_fixed, depth_cap)
        return m.run_layers(h, pad, 0, stop), pad  # (B, T, d)

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
            idx = np.arange(ce.shape[0]) if g["idx"] is None else g["rows"]
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
