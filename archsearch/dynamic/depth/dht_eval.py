"""DHT at inference (:mod:`archsearch.dynamic.depth.dht`): calibration to the FLOPs budget, greedy
prediction, and the evaluation's depth statistics.

A mixin of :class:`~archsearch.dynamic.depth.dht.DHTGating`. Before each evaluation the inference price
is calibrated by bisection on validation rows (label-free) so that the greedy policy's FLOPs
fraction lands on ``flops_budget`` (:meth:`DHTInference.calibrate`); prediction then routes
each sample once (LinUCB) or exit by exit through :func:`archsearch.dynamic.depth.exits.run_cascade`
(``dht_routing: cascade``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from archsearch.dynamic.budget import calibrate_price
from archsearch.dynamic.depth.cascade_graphs import graphs_of, model_signature as _model_signature
from archsearch.dynamic.depth.exits import run_cascade


class DHTInference:
    """Calibration, prediction and evaluation statistics of DHT (a mixin)."""

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
                    used += cnt[a] * (self._flops(T, self.depths[a], counts) + self._context_flops(T))
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
        if self.stopping is not None:
            self.calibration_window = held_out
        return self.eval_price, self.calibrated_fraction

    def predict(self, x, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy gated inference at the calibrated price: ``(logits, flops)``; ``logits``
        ``B x C`` (or ``B x T x V``), ``flops`` float ``(B,)`` FLOPs executed per sample (its
        fixed blocks, its gated blocks with its heads, the output head)."""
        return self.predict_exits(x, mask)[:2]

    def exit_depths(self) -> list[int] | None:
        """The cascade's exit depths; ``None`` unless :meth:`predict` runs the cascade."""
        return list(self.depths) if self._cascading() else None

    def predict_exits(self, x, mask) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`predict` and each row's exit depth (``B`` int64 blocks)."""
        with torch.no_grad():
            if self._cascading():
                out, arms, _ = self._run_cascade(*self._trunk(x, mask, 0))  # arms: (B,) on the model's device
                T, price = x.shape[1], self._price(True)
                heads = [self._heads_for(a, True, T, price)[1] for a in range(len(self.depths))]  # cached
                key = ("flops_table", T, price, str(arms.device))
                if key not in self._greedy_cache:  # (K,) FLOPs per exit, on the device once
                    self._greedy_cache[key] = torch.tensor(
                        [float(self._flops(T, d, c)) for d, c in zip(self.depths, heads)],
                        dtype=torch.float64).to(arms.device)
                table = self._greedy_cache[key]
                # counted on the device, folded into the statistics by metrics(): no host sync here
                self._pending_counts.append((torch.bincount(arms, minlength=len(self.depths)), heads))
                if len(self._pending_counts) >= self.PENDING_FOLD:  # a server never calls metrics()
                    self._fold_pending_counts()
                dkey = ("depths", str(arms.device))
                if dkey not in self._greedy_cache:
                    self._greedy_cache[dkey] = torch.tensor(self.depths, dtype=torch.long).to(arms.device)
                return out, table[arms], self._greedy_cache[dkey][arms]
            h, pad = self._trunk(x, mask, self.force_depth)
            groups = self._plan(h, pad, greedy=True)
            B, T = x.shape
            out = None
            flops = torch.empty(B, dtype=torch.float64)
            depth = torch.empty(B, dtype=torch.long)
            for g in groups:
                lg = self._run_group(h, pad, g)
                if len(groups) == 1:
                    out = lg
                else:
                    if out is None:
                        out = lg.new_empty((B,) + tuple(lg.shape[1:]))
                    out[g["idx"]] = lg
                n = B if g["idx"] is None else len(g["idx"])
                f = self._group_flops(T, g)
                if g["idx"] is None:
                    flops.fill_(float(f))
                    depth.fill_(int(g["depth"]))
                else:
                    flops[g["idx"].cpu()] = float(f)
                    depth[g["idx"].cpu()] = int(g["depth"])
                if g["arm"] is not None:
                    self._eval_counts[g["arm"]] += n
                elif g["depth"] in self.depths:
                    self._eval_counts[self.depths.index(g["depth"])] += n
                self._eval_heads[0] += n * sum(g["counts"])
                self._eval_heads[1] += n * len(g["counts"])
        return out, flops, depth

    def explore_exits(self, x, mask) -> tuple[torch.Tensor, np.ndarray, np.ndarray, torch.Tensor]:
        """Every row to the last exit, with every exit read on the way (the rows an online stop
        rule explores, :mod:`archsearch.dynamic.depth.online`): ``(logits, contexts, classes,
        flops)`` -- ``B x C`` logits of the last exit, ``B x K x dim`` float64 stop contexts
        (:meth:`_stop_context` at each exit), ``B x K`` each exit's class, ``B`` float64 FLOPs
        executed per row (the deepest path's, with the greedy heads).

        Raises:
            ValueError: a gating that does not run the cascade (:meth:`exit_depths` is ``None``).
        """
        if not self._cascading():
            raise ValueError("explore_exits needs dht_routing: cascade, trained")
        with torch.no_grad():
            h, pad = self._trunk(x, mask, 0)
            T, price = x.shape[1], self._price(True)
            heads = self._heads_for(len(self.depths) - 1, True, T, price)[0]
            h = self.model.run_layers(h, pad, 0, self.n_fixed)
            exits, hid = self._run_exits(h, pad, self.depths[-1], list(heads), hidden=True)
            X = self._exit_contexts(exits, hid, pad)  # (B, K, dim)
            classes = torch.stack([exits[d].argmax(-1) for d in self.depths], 1).cpu().numpy()  # (B, K)
            counts = self._heads_for(len(self.depths) - 1, True, T, price)[1]
            f = float(self._flops(T, self.depths[-1], counts))
        return exits[self.depths[-1]], X, classes, torch.full((x.shape[0],), f, dtype=torch.float64)

    def stop_costs(self, T: int) -> np.ndarray:
        """The ``K`` exits' costs in the stop rule's units (FLOPs fractions at length ``T``)."""
        return self._depth_costs(T)

    def _cascading(self) -> bool:
        """Greedy inference runs the cascade: ``dht_routing: cascade``, trained, not forced."""
        return self.stopping is not None and self.force_depth is None and self.updates > 0

    def _run_cascade(self, h, pad):
        """Greedy exit-by-exit inference (``dht_routing: cascade``) from the embeddings
        (``B x T x d``; the fixed blocks run in the cascade's first segment), through
        :func:`~archsearch.dynamic.depth.exits.run_cascade`: at each exit the stopping policy at the
        inference price decides, from the exit's context (:meth:`_stop_context`), who stops; the
        others run the next block with the greedy heads. On a GPU the segments run as CUDA graph
        replays where measured faster (:class:`~archsearch.dynamic.depth.cascade_graphs.SegmentGraphs`,
        with ``dht_stop_context: trajectory``, whose context is computed on the device, and every
        head computed: a head subset indexes weights with a host list).

        Returns:
            ``(logits, arms, heads)``: ``B x C`` logits of each sample's exit, ``B`` depth-arm
            indices (int64 tensor on the model's device), and the heads of every gated block (``heads_per_layer`` of
            the deepest allowed path).
        """
        price = self._price(True)
        T = h.shape[1]
        heads = self._heads_for(len(self.depths) - 1, True, T, price)[0]
        costs_ = self._depth_costs(T)

        on_device = self.stop_context == "trajectory"  # the exit context reads a CPU projection

        def stop_rule(k, hk, pk, logits, prev):
            X, state = self._stop_context(hk, pk, logits, prev, on_device=on_device)
            stop = self.stopping.stop(k, X, costs_, price)
            return (stop if on_device else torch.from_numpy(stop)), state

        graphs, key = None, None
        H = self.model.config.n_heads
        if on_device and h.is_cuda and all(hs is None or len(hs) == H for hs in heads):  # subsets index on the host
            graphs = graphs_of(self)
            st = self.stopping
            key = (("dht", float(price), float(st.offset), np.asarray(st.cut).tobytes(),
                    np.asarray(st.theta).tobytes(), _model_signature(self.model)), None)
        out, exit_index = run_cascade(self.model, h, pad, self.depths, 0, stop_rule,
                                      heads=[None] * self.n_fixed + list(heads), graphs=graphs, key=key)
        return out, exit_index, heads

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
            if self._cascading():
                _, arms, heads = self._run_cascade(*self._trunk(x, mask, 0))
                arms = arms.cpu().numpy()
                return [(self.depths[a], np.flatnonzero(arms == a).tolist(),
                         list(heads[:self.depths[a] - self.n_fixed])) for a in np.unique(arms)]
            groups = self._plan(*self._trunk(x, mask, self.force_depth), greedy=True)
        B = x.shape[0]
        return [(g["depth"], list(range(B)) if g["idx"] is None else g["idx"].tolist(), list(g["heads"]))
                for g in groups]

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
        self._fold_pending_counts()
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

    #: cascade batches whose device-side exit counts are kept before they are read to the host
    #: (one synchronisation per this many batches; bounds the list where metrics() never runs)
    PENDING_FOLD = 256

    def _fold_pending_counts(self) -> None:
        """Add the cascade's device-side exit counts to the evaluation counters (one host copy
        per batch held) and empty the list."""
        for cnt, heads in self._pending_counts:
            cnt = cnt.cpu().numpy()
            self._eval_counts += cnt
            self._eval_heads[0] += float(sum(n * sum(c) for n, c in zip(cnt, heads)))
            self._eval_heads[1] += float(sum(n * len(c) for n, c in zip(cnt, heads)))
        self._pending_counts = []

    def _reset_eval_counters(self) -> None:
        self._eval_counts = np.zeros(len(self.depths))  # samples per depth arm
        self._eval_heads = [0.0, 0.0]  # summed heads over executed gated blocks, block count
        self._pending_counts: list = []  # (per-exit counts tensor, head counts per exit) per cascade batch
