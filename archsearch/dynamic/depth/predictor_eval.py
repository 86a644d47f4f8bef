"""``gating: depth_predictor`` at inference (:mod:`archsearch.dynamic.depth.predictor`): the exit
rule, calibration of the exit threshold to the FLOPs budget, per-sample early-exit prediction and
the evaluation's depth statistics.

A mixin of :class:`~archsearch.dynamic.depth.predictor.DepthPredictorGating` (as
:mod:`archsearch.dynamic.depth.dht_eval` is DHT's). Each sample runs block ``n_fixed + k`` while
``P(depth >= n_fixed + k) >= threshold`` (RevPC, :func:`~archsearch.dynamic.depth.predictor_model.revpc`);
under a ``flops_budget`` the threshold is calibrated on validation rows before each evaluation
(:meth:`DepthPredictorInference.calibrate`, bisection); the batch then runs as one cascade
(:func:`~archsearch.dynamic.depth.exits.run_cascade`).
"""

from __future__ import annotations

from typing import Any

import torch

from archsearch.dynamic.budget import calibrate_monotone
from archsearch.dynamic.depth.cascade_graphs import graphs_of, model_signature
from archsearch.dynamic.depth.exits import run_cascade
from archsearch.dynamic.depth.predictor_model import DepthHistogram, revpc
from archsearch.models import costs
from archsearch.models.config import trim_padding


class DepthPredictorInference:
    """Exit rule, calibration, prediction and evaluation statistics of the depth predictor (a
    mixin: the attributes it reads are :class:`~archsearch.dynamic.depth.predictor.DepthPredictorGating`'s)."""

    def exit_index(self, depth_logits: torch.Tensor, threshold: float | None = None) -> torch.Tensor:
        """``B x D`` depth logits -> ``B`` exit indices into ``depths``: the number of blocks
        after the fixed group with ``P(depth >= block) >= threshold`` (RevPC; 0.5 = the median
        of the predicted depth distribution)."""
        thr = self.threshold if threshold is None else threshold
        p = revpc(depth_logits.softmax(-1))  # (B, D), non-increasing
        return (p[:, 1:] >= thr).sum(-1)  # (B,)

    def before_evaluate(self, split_name: str = "validation") -> None:
        """Start an evaluation pass over ``split_name``: forget the depth counts
        (:meth:`reset_stats`, so :meth:`metrics` describes this pass only) and, under a
        ``flops_budget`` and with a ``loop``, calibrate the exit threshold on (up to
        ``depth_calibration_rows``) validation rows (:meth:`calibrate`)."""
        self.reset_stats()
        if self.loop is None or self.flops_budget is None:
            return
        self.calibrate(self.calibration_batches(self.calibration_rows))

    @torch.no_grad()
    def calibrate(self, batches, budget: float | None = None) -> tuple[float, float]:
        """Set :attr:`threshold` so that inference on ``batches`` runs ``budget`` of the full
        model's FLOPs (sum of executed FLOPs incl. the predictor / sum of full-model FLOPs), by
        bisection on the threshold in ``(0, 1]`` (the fraction is non-increasing in it; a step
        function, so the result is the closest reachable point).

        Args:
            batches: iterable of ``(x, mask)`` or ``(x, mask, y)``: ``B x T`` ids and bool masks.
            budget: target fraction in (0, 1]; default ``flops_budget``.

        Returns:
            ``(threshold, fraction)``.

        Raises:
            ValueError: no budget given and no ``flops_budget`` configured.
        """
        budget = self.flops_budget if budget is None else float(budget)
        if budget is None:
            raise ValueError("calibrate needs a budget (flops_budget is not set)")
        was = self.model.training
        self.model.eval()
        dev = self.depths.device
        cached = []  # (p (b, D-1), used FLOPs per depth (D,), full FLOPs (scalar), b)
        try:
            for b in batches:
                x, m = b[0].to(dev), None if b[1] is None else b[1].to(dev)
                _, _, dl = self._front(x, m)
                T = x.shape[1]
                full = float(costs.flops_per_sample(self.model.config, T))
                cached.append((revpc(dl.softmax(-1))[:, 1:].cpu(), self._depth_flops(T), full, x.shape[0]))
        finally:
            self.model.train(was)
            self.predictor.train(was)

        def fraction(thr: float) -> float:
            used = tot = 0.0
            for p, fl, full, n in cached:
                used += float(fl[(p >= thr).sum(-1)].sum())
                tot += n * full
            return used / max(tot, 1.0)

        thr, frac = calibrate_monotone(fraction, budget, 1e-6, 1.0, iters=40)
        self.threshold, self.calibrated_fraction = float(thr), float(frac)
        return self.threshold, self.calibrated_fraction

    @torch.no_grad()
    def predict_depths(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The exit depth (blocks, ``n_fixed .. n_layers``) the predictor picks for each sample:
        ``B`` int64 (:meth:`exit_index` at :attr:`threshold`)."""
        _, _, depth_logits = self._front(x, mask)
        return self.n_fixed + self.exit_index(depth_logits)  # (B,)

    def predict(self, x, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`predict_exits` without the depths."""
        return self.predict_exits(x, mask)[:2]

    def exit_depths(self) -> list[int]:
        return list(range(self.n_fixed, self.n_layers + 1))

    @torch.no_grad()
    def predict_exits(self, x, mask) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Inference with per-sample early exit.

        Each sample exits at depth ``n_fixed + k``, ``k`` = :meth:`exit_index` (the median of
        its predicted depth distribution, or the calibrated threshold). The batch runs as one
        cascade (:func:`~archsearch.dynamic.depth.exits.run_cascade`) over the depths its samples exit
        at: the rows still running go through each block together, and each row leaves at its
        own depth through that exit's head; nothing is computed for a row after it leaves.

        Args:
            x: ``B x T`` token ids; mask: ``B x T`` bool or ``None``.

        Returns:
            ``(logits, flops, depth)``: ``B x C`` logits in the input order, ``B`` float64 FLOPs
            executed per sample (``costs.flops_per_sample(config, T, n_layers=depth)`` plus the
            predictor's own), and ``B`` int64 exit depths (blocks).
        """
        h, pad_mask, depth_logits = self._front(x, mask)
        k_idx = self.exit_index(depth_logits)  # (B,) index into depths
        self.hist.add(k_idx, self.expected_depth(depth_logits.softmax(-1)))
        depths = list(range(self.n_fixed, self.n_layers + 1))  # every allowed exit, in blocks

        def stop(k, hk, pk, logits, state):  # the rows whose predicted exit is this one
            return state[0] == k, state

        graphs = key = None
        if x.is_cuda:  # graphs exist on CUDA only: no key to build elsewhere
            graphs = graphs_of(self)
            key = (("depth_predictor", model_signature(self.model)), None)
        logits, _ = run_cascade(self.model, h, pad_mask, depths, self.n_fixed, stop, state=(k_idx,),
                                graphs=graphs, key=key)
        return logits, self._depth_flops(x.shape[1], k_idx.device)[k_idx], self.n_fixed + k_idx  # (B, C), (B,), (B,)

    # ------------------------------------------------------------------ reporting
    def reset_stats(self) -> None:
        """Forget the depth counts accumulated by :meth:`predict`."""
        self.hist.reset()

    def depth_stats(self, split=None, batch_size: int = 256) -> dict[str, Any]:
        """Predicted-depth statistics (:meth:`~archsearch.dynamic.depth.predictor_model.DepthHistogram.stats`:
        ``depth_histogram``, ``expected_depth``, ``mean_exit_depth``).

        Args:
            split: a :class:`~archsearch.data.ClassificationSplit` to run the predictor on
                (embedding, fixed blocks and predictor only, eval mode; consecutive batches
                trimmed by :func:`~archsearch.models.config.trim_padding`), or ``None`` for
                the counts accumulated by :meth:`predict` since :meth:`reset_stats`.
            batch_size: rows per forward when ``split`` is given.
        """
        if split is None:
            return self.hist.stats()
        hist, was_training, dev = DepthHistogram(self.depths.tolist()), self.model.training, self.depths.device
        self.model.eval()
        try:
            with torch.inference_mode():
                for i in range(0, len(split), batch_size):
                    ids, m = trim_padding(split.input_ids[i:i + batch_size], split.attention_mask[i:i + batch_size])
                    _, _, dl = self._front(ids.to(dev), m.to(dev))  # (b, D)
                    hist.add(self.exit_index(dl), self.expected_depth(dl.softmax(-1)))
        finally:
            self.model.train(was_training)
            self.predictor.train(was_training)
        return hist.stats()

    def metrics(self) -> dict[str, Any]:
        """Per-epoch results: the depth histogram of the samples just evaluated
        (``depth_histogram``, ``expected_depth``, ``mean_exit_depth``; see :meth:`depth_stats`),
        the last training batch's ``train_expected_depth``, ``depth_gamma`` (the current price
        of depth), ``exit_threshold`` and, after a calibration, ``depth_calibrated_flops_fraction``
        (FLOPs fraction on the calibration rows).

        The histogram counts the exits :meth:`predict` took since :meth:`before_evaluate` (or
        :meth:`reset_stats`): in ``TrialLoop.evaluate(split_name)`` exactly the samples of
        ``split_name`` (the test split in a test evaluation), read before the latency timing
        (which also runs :meth:`predict`). (It used to be recomputed on the validation split,
        whatever split had been evaluated.)
        """
        out = self.depth_stats()
        out["train_expected_depth"] = self._last_train["expected_depth"]
        out["depth_gamma"] = float(self.gamma)
        out["exit_threshold"] = float(self.threshold)
        if self.calibrated_fraction is not None:
            out["depth_calibrated_flops_fraction"] = float(self.calibrated_fraction)
        return out
