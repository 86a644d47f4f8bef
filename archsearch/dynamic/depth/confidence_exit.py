"""Confidence-threshold early exit (``gating: confidence_exit``): DeeBERT, the baseline every
dynamic-depth row is judged against.

Source: Xin, Tang, Lee, Yu and Lin, "DeeBERT: Dynamic Early Exiting for Accelerating BERT
Inference", ACL 2020, §3: an off-ramp (classifier) after every layer; at inference a sample
leaves at the first off-ramp whose prediction is confident enough (DeeBERT thresholds the
entropy; we threshold the max softmax probability, the same ordering for two classes).

* Exits: one per depth ``min_layers .. n_layers`` (blocks run before the exit), each with its
  own classifier (``exit_heads``, :meth:`Transformer.add_exit_heads`; the deepest keeps the
  model's head).
* Training: every exit jointly, :func:`~archsearch.dynamic.depth.exits.all_exit_loss` (the deepest
  exit's CE plus each shallower exit's ``(CE + KD) / 2``, combined by ``exit_loss``). DeeBERT
  trains in two stages (backbone and last classifier, then the frozen backbone's off-ramps,
  §3.2); joint training with in-place distillation is the variant measured best here
  (the development runs, ``benchmarks/depth/runs/dynamic_depth_legacy/dht.json``: ``--exit-heads
  --exit-loss sum``).
* Inference (:meth:`ConfidenceExitGating.predict`): :func:`~archsearch.dynamic.depth.exits.run_cascade`
  with the rule "max probability >= threshold"; the rows that stop leave the batch, the others
  run the next block as one batch (nothing is computed for a row after its exit).
* Budget: with ``flops_budget`` the threshold is calibrated before each evaluation
  (:meth:`ConfidenceExitGating.before_evaluate`) on up to ``confidence_calibration_rows``
  validation rows, without their labels, so that the executed FLOPs fraction (sum of
  ``flops_per_sample(config, T, n_layers=exit depth)`` / sum of the full model's) lands on the
  budget (:func:`~archsearch.dynamic.budget.calibrate_monotone`; the fraction is a
  non-decreasing step function of the threshold). Without a budget: ``exit_threshold``.

FLOPs count the blocks a row runs and one classifier; the exit heads read before a row's own
exit (``2 d C`` FLOPs each) are left out, as DHT leaves them out. Classification only.

Shapes: ``x`` ``B x T`` ids, ``mask`` ``B x T`` bool (True = real token), logits ``B x C``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from archsearch.dynamic.base import GatingStrategy, LossFn, TrialContext
from archsearch.dynamic.depth.cascade_graphs import graphs_of, model_signature
from archsearch.dynamic.depth.exits import all_exit_loss, calibrate_threshold, read_exits, run_cascade
from archsearch.dynamic.depth.settings import ConfidenceExitSettings
from archsearch.models import costs

#: Above every max probability, also once rounded to float32 / bfloat16 (as a comparison with a
#: tensor of that dtype rounds it): at this threshold no row leaves before the last exit.
NEVER = 1.0 + 2.0 ** -6


class ThresholdExits(GatingStrategy):
    """What the confidence exit and ``gating: cascade`` share: a max-probability threshold
    calibrated to ``flops_budget`` on validation rows, the rows per exit that inference counts,
    their metrics and the state saved with a trial. A subclass sets :attr:`depths`,
    :attr:`threshold`, :attr:`calibrated_fraction` and ``_counts`` (``K`` int64 on the model's
    device) and gives :meth:`_confidences`.
    """

    depths: list[int]
    threshold: float
    calibrated_fraction: float | None

    def _confidences(self, x, mask, device) -> tuple[torch.Tensor, torch.Tensor, float]:
        """``(b x K max probabilities, K FLOPs per sample of leaving at each exit, the full
        model's FLOPs per sample)`` of one calibration batch."""
        raise NotImplementedError

    @torch.no_grad()
    def calibrate(self, batches, budget: float | None = None) -> tuple[float, float]:
        """Set :attr:`threshold` so that :meth:`predict` on ``batches`` runs ``budget`` of the
        full model's FLOPs: every exit's max probability is read once per row (eval mode,
        :meth:`_confidences`), the exit each threshold gives is
        :func:`~archsearch.dynamic.depth.exits.first_stop` of that table, and the threshold in
        ``[0, NEVER]`` is bisected (:func:`~archsearch.dynamic.depth.exits.calibrate_threshold`:
        the closest reachable step, moved to the middle of its step so that float noise between
        these batches and inference's smaller ones flips no row). A budget below the cheapest
        exit lands on that exit's fraction.

        Args:
            batches: iterable of ``(x, mask)`` or ``(x, mask, y)`` (``y`` is never read).
            budget: the target fraction in (0, 1]; default ``flops_budget``.

        Returns:
            ``(threshold, fraction)``.

        Raises:
            ValueError: no budget given and no ``flops_budget`` configured; no batch.
        """
        budget = self.s.flops_budget if budget is None else float(budget)
        if budget is None:
            raise ValueError("calibrate needs a budget (flops_budget is not set)")
        dev = next(self.model.parameters()).device
        was = self.model.training
        self.model.eval()  # a cascade's cuts too: they are the model's submodules
        maxp, fl, full = [], [], 0.0
        try:
            for b in batches:
                x, m = b[0].to(dev), None if b[1] is None else b[1].to(dev)
                p, per, f = self._confidences(x, m, dev)
                maxp.append(p)  # (b, K)
                fl.append(per.expand(x.shape[0], -1))  # (b, K)
                full += f * x.shape[0]
        finally:
            self.model.train(was)
        if not maxp:
            raise ValueError("calibrate needs at least one batch")
        P, F = torch.cat(maxp), torch.cat(fl)  # (N, K)
        self.threshold, self.calibrated_fraction = calibrate_threshold(P, F, full, budget, NEVER)
        return self.threshold, self.calibrated_fraction

    # ------------------------------------------------------------------ reporting, state
    def metrics(self) -> dict[str, Any]:
        """The rows :meth:`predict` ran since :meth:`before_evaluate` (in ``TrialLoop.evaluate``
        exactly the split just evaluated, read before the latency timing): ``exit_depth_hist``
        (fraction of rows per exit depth, keys are depths as strings), ``exit_eval_samples``
        (their number), ``exit_mean_depth`` (blocks); ``exit_threshold`` and
        ``exit_calibrated_flops_fraction`` (-1 = no calibration). The counts reset."""
        c = self._counts.tolist()
        n = sum(c)
        out = {"exit_depth_hist": {str(d): k / max(n, 1) for d, k in zip(self.depths, c)},
               "exit_eval_samples": n,
               "exit_mean_depth": sum(d * k for d, k in zip(self.depths, c)) / n if n else float("nan"),
               "exit_threshold": float(self.threshold),
               "exit_calibrated_flops_fraction": -1.0 if self.calibrated_fraction is None
               else float(self.calibrated_fraction)}
        self._reset_counts()
        return out

    def _reset_counts(self) -> None:
        # a new tensor, not zero_(): predict may have made it under torch.inference_mode
        self._counts = torch.zeros_like(self._counts, device=self._counts.device)

    def state_dict(self) -> dict[str, Any]:
        """The threshold, the calibrated fraction (-1 = none) and the exit counts (numbers and a
        CPU tensor: ``torch.load(weights_only=True)``)."""
        return {"threshold": float(self.threshold),
                "calibrated_fraction": -1.0 if self.calibrated_fraction is None else float(self.calibrated_fraction),
                "counts": self._counts.cpu().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.threshold = float(state["threshold"])
        f = float(state["calibrated_fraction"])
        self.calibrated_fraction = None if f < 0 else f
        self._counts = state["counts"].to(self._counts.device, torch.long).clone()


class ConfidenceExitGating(ThresholdExits):
    """DeeBERT's confidence-threshold early exit (module docstring).

    Args:
        model: a classification :class:`~archsearch.models.transformer.Transformer`.
        cfg: the trial config (:class:`ConfidenceExitSettings` keys).
        settings: the trial budget (unused).
        loop: the :class:`~archsearch.dynamic.base.TrialContext` whose validation rows
            calibrate the threshold, or ``None`` (then :meth:`calibrate` by hand).

    Raises:
        ValueError: an LM model, ``min_layers`` above ``n_layers``, or a value the settings
            refuse (names the key).

    Attributes:
        depths: the exit depths ``min_layers .. n_layers`` (blocks).
        threshold: the max-probability threshold inference uses (``exit_threshold``, or the
            calibrated one).
        calibrated_fraction: FLOPs fraction on the calibration rows at :attr:`threshold`
            (``None`` before a calibration).
    """

    Settings = ConfidenceExitSettings

    @classmethod
    def exit_head_depths(cls, s: ConfidenceExitSettings, model_config) -> list[int]:
        """Every exit ``min_layers .. n_layers`` with ``exit_heads``, as :meth:`__init__`
        builds them on a model without them."""
        return list(range(s.min_layers, int(model_config.n_layers) + 1)) if s.exit_heads else []

    def __init__(self, model: nn.Module, cfg: dict[str, Any], settings: dict[str, Any],
                 loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        conf = model.config
        if conf.task != "classification":
            raise ValueError(f"gating 'confidence_exit' needs a classification model, got task {conf.task!r}")
        if self.s.min_layers > conf.n_layers:
            raise ValueError(f"min_layers: {self.s.min_layers} > n_layers={conf.n_layers}")
        self.depths = list(range(self.s.min_layers, conf.n_layers + 1))
        have = getattr(model, "exit_heads", None) or {}
        if self.s.exit_heads and any(str(d) not in have for d in self.depths if d < conf.n_layers):
            model.add_exit_heads(self.depths)
        self.threshold = float(self.s.exit_threshold)
        self.calibrated_fraction: float | None = None
        self._flops: dict[tuple, tuple[torch.Tensor, float]] = {}
        self._counts = torch.zeros(len(self.depths), dtype=torch.long,
                                   device=next(model.parameters()).device)  # rows per exit

    # ------------------------------------------------------------------ training
    def exit_logits(self, x: torch.Tensor, mask: torch.Tensor | None) -> list[torch.Tensor]:
        """One forward through every block, read at every exit: ``K`` tensors ``B x C``,
        shallowest first (``x``: ``B x T`` ids, ``mask``: ``B x T`` bool or ``None``)."""
        m = self.model
        pad = m.padding_mask(x, mask)  # (B, T)
        h, done, hs = m.embed(x), 0, []  # (B, T, d)
        for d in self.depths:
            h, done = m.run_layers(h, pad, done, d), d
            hs.append(h)
        return read_exits(m, hs, pad, list(self.depths))  # K x (B, C), the heads in one call

    def training_loss(self, x, mask, y, loss_fn: LossFn) -> torch.Tensor:
        """Every exit trained jointly: ``deep + shallow`` of
        :func:`~archsearch.dynamic.depth.exits.all_exit_loss` (scalar, nats)."""
        deep, shallow = all_exit_loss(self.exit_logits(x, mask), y, loss_fn, self.s.exit_loss)
        return deep + shallow

    # ------------------------------------------------------------------ inference
    def exit_flops(self, T: int, device: torch.device) -> tuple[torch.Tensor, float]:
        """``(K float64 FLOPs per sample of leaving at each exit, FLOPs of the full model)`` at
        length ``T`` (:func:`archsearch.models.costs.flops_per_sample`), the first on ``device``."""
        key = (int(T), str(device))
        if key not in self._flops:
            c = self.model.config
            per = [float(costs.flops_per_sample(c, T, n_layers=d)) for d in self.depths]
            self._flops[key] = (torch.tensor(per, dtype=torch.float64, device=device),
                                float(costs.flops_per_sample(c, T)))
        return self._flops[key]

    def stop_rule(self, threshold: float | None = None):
        """The :data:`~archsearch.dynamic.depth.exits.StopRule` "max probability >= threshold" (default
        :attr:`threshold`) for :func:`~archsearch.dynamic.depth.exits.run_cascade`."""
        thr = self.threshold if threshold is None else float(threshold)

        def rule(k, h, pad, logits, state):
            return logits.softmax(-1).amax(-1) >= thr, None  # (b,) on the logits' device

        return rule

    def predict(self, x, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """Early exit through :func:`~archsearch.dynamic.depth.exits.run_cascade` at :attr:`threshold`.

        Returns:
            ``(logits, flops)``: ``B x C`` logits of each row's exit, and ``B`` float64 FLOPs
            executed per row (:meth:`exit_flops` of its exit), both on ``x``'s device.
        """
        return self.predict_exits(x, mask)[:2]

    def exit_depths(self) -> list[int]:
        return list(self.depths)

    @torch.no_grad()
    def predict_exits(self, x, mask) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`predict` and each row's exit depth (``B`` int64 blocks, on ``x``'s device)."""
        m = self.model
        pad = m.padding_mask(x, mask)
        graphs = key = None
        if x.is_cuda:  # graphs exist on CUDA only: no key to build elsewhere
            graphs = graphs_of(self)
            key = (("confidence_exit", float(self.threshold), model_signature(m)), None)
        logits, idx = run_cascade(m, m.embed(x), pad, self.depths, 0, self.stop_rule(), graphs=graphs, key=key)
        per, _ = self.exit_flops(x.shape[1], x.device)
        self._counts = self._counts.to(idx.device) + torch.bincount(idx, minlength=len(self.depths))
        depth = torch.as_tensor(self.depths, dtype=torch.long).to(idx.device)[idx]  # (B,) blocks
        return logits, per[idx], depth

    def before_evaluate(self, split_name: str = "validation") -> None:
        """Forget the exit counts (so :meth:`metrics` describes this pass only) and, with a
        ``flops_budget`` and a ``loop``, calibrate the threshold on the first
        ``confidence_calibration_rows`` validation rows (:meth:`calibrate`; labels unread)."""
        self._reset_counts()
        if self.loop is not None and self.s.flops_budget is not None:
            self.calibrate(self.calibration_batches(self.s.confidence_calibration_rows))

    def _confidences(self, x, mask, device) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Every exit's max probability on one calibration batch (``b x K``, one forward through
        every block), the FLOPs of leaving at each exit and the full model's (:meth:`exit_flops`)."""
        maxp = torch.stack([e.softmax(-1).amax(-1) for e in self.exit_logits(x, mask)], 1)  # (b, K)
        per, full = self.exit_flops(x.shape[1], device)
        return maxp, per, full
