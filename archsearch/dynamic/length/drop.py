"""Length-Adaptive Transformer: the ``gating: length_drop`` strategy (LengthDrop training,
inference at a selected length configuration, evolutionary search of sub-networks).

Source: Kim & Cho, "Length-Adaptive Transformer: Train Once with Length Drop, Use Anytime with
Search", ACL 2021, arXiv 2010.07003 (sec. 3: LengthDrop, LayerDrop, sandwich rule with in-place
distillation; sec. 4: evolutionary search, see :mod:`archsearch.dynamic.length.evolution`). Our
specification: the Length-Adaptive section of docs/design.md. The forward pass that drops tokens
(which tokens stay, padding, drop-and-restore, FLOPs) is :mod:`archsearch.dynamic.length.forward`;
length configurations are :mod:`archsearch.dynamic.length.config`.

**Training** (:class:`LengthDropGating`): per minibatch the sandwich rule: the full model
(cross-entropy), the smallest sub-model (every ``l_{i+1} = ceil((1 - p) l_i)``) and
``n_sandwich`` (2) random sub-models (LengthDrop, ``l_{i+1} ~ U{ceil((1 - p) l_i), l_i}``,
``l_0 = n``, plus LayerDrop: each block skipped with probability ``layer_drop_p``); each
sub-model is distilled in place, KL(full model's detached softmax || sub-model's); the sum of the
``n_sandwich + 2`` losses is divided by ``n_sandwich + 2``. Three differences from the paper's
code (github.com/clovaai/length-adaptive-transformer, ``trainer.py`` at 8c35cb3): there,
``sample_layer_configuration`` reads ``layer_dropout_prob`` before ``layer_dropout``, so with
``--layer_dropout_prob 0.2`` LayerDrop also hits the full and the smallest model's passes; and its
distillation term is ``KLDivLoss(log_softmax(full), softmax(sub))``, i.e. KL(sub || full) with
the gradient through the sub-model's probabilities. We keep the sandwich's ends whole and
KL(full || sub), as Yu & Huang define the sandwich rule and in-place distillation ("Universally
Slimmable Networks", sec. 3.2-3.3); neither of the code's variants is measured here. Third, the
code samples a random sub-model's lengths knowing which blocks LayerDrop skips (a skipped block
keeps its input length); ours samples them first, so a skipped block's drop is made by the next
block that runs (it can then keep fewer than ``1 - p`` of its input: lengths ``(13, 9, 6, 4)``
with the 2nd and 4th blocks skipped run blocks 1 and 3 on 16 and 13 tokens and pool 6), and the
drops of skipped last blocks are not made. Unmeasured; changing it would change the training of
the reported runs (``benchmarks/length/length_adaptive.py``).

Shapes: ``B`` batch, ``T`` padded length, ``C`` classes, ``V`` vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from archsearch.dynamic.base import GatingStrategy, TrialContext
from archsearch.dynamic.length.config import (
    check_length_config,
    sample_length_config,
    smallest_length_config,
)
from archsearch.dynamic.length.evolution import EvolutionarySearch
from archsearch.dynamic.length.forward import length_config_flops, length_drop_forward
from archsearch.dynamic.length.settings import LengthDropSettings
from archsearch.models import costs
from archsearch.models.config import trim_padding


def distill_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """In-place distillation: ``KL(softmax(teacher) || softmax(student))`` averaged over samples
    (classification, ``B x C``) or tokens (LM, ``B x T x V``); ``teacher`` is detached."""
    s = F.log_softmax(student.reshape(-1, student.shape[-1]), dim=-1)  # (N, C)
    t = F.log_softmax(teacher.detach().reshape(-1, teacher.shape[-1]), dim=-1)  # (N, C)
    return F.kl_div(s, t, reduction="batchmean", log_target=True)


def validation_subset(loop: TrialContext, limit: int, seed: int = 0, batch_size: int = 256) -> list[tuple]:
    """A fixed validation subset as evaluation batches ``[(x, mask, y), ...]`` on ``loop.device``.

    Classification: ``limit`` samples drawn at random (seeded; validation files are often sorted
    by label), in batches of ``batch_size`` trimmed by
    :func:`~archsearch.models.config.trim_padding` like the trainable's evaluation batches. LM:
    the first ``limit`` blocks of ``loop.eval_batches()``.
    """
    dev = loop.device
    if loop.data.task == "lm":
        out, seen = [], 0
        for x, mask, y in loop.eval_batches("validation", batch_size=batch_size):
            take = min(len(x), limit - seen)
            out.append((x[:take].to(dev), None, y[:take].to(dev)))
            seen += take
            if seen >= limit:
                break
        return out
    split = loop.data["validation"]
    g = torch.Generator().manual_seed(seed)
    rows = torch.randperm(len(split), generator=g)[:limit]
    out = []
    for i in range(0, len(rows), batch_size):
        j = rows[i:i + batch_size]
        ids, mask = trim_padding(split.input_ids[j], split.attention_mask[j])  # (b, T')
        out.append((ids.to(dev), mask.to(dev), split.labels[j].to(dev)))
    return out


class LengthDropGating(GatingStrategy):
    """``gating: length_drop``: LengthDrop + LayerDrop training with the sandwich rule, inference
    at a selected length configuration, evolutionary search of sub-networks after training
    (Kim & Cho 2021, arXiv 2010.07003).

    Knobs: :class:`~archsearch.dynamic.length.settings.LengthDropSettings` (:attr:`s`). The
    search never goes below the smallest trained sub-model
    (:func:`~archsearch.dynamic.length.config.smallest_length_config` of ``length_drop_p``).
    ``settings["evolution_store"]`` (budget, not config): optional JSON path that makes the
    search resumable.

    Attributes:
        length_config: the configuration :meth:`predict` runs (``None`` = full length).

    Raises:
        ValueError: a knob :class:`LengthDropSettings` refuses (the message names the key).
    """

    Settings = LengthDropSettings
    s: LengthDropSettings
    #: Random sub-models per sandwich (the paper's and its code's ``--num_sandwich 2``).
    n_sandwich = 2

    def __init__(self, model, cfg, settings, loop: TrialContext | None = None):
        super().__init__(model, cfg, settings, loop)
        self.gen = torch.Generator().manual_seed(int(settings.get("seed", 0)) + 7919)
        self.length_config: tuple[int, ...] | None = None
        self.last_curve: list[dict[str, Any]] = []
        self.search: EvolutionarySearch | None = None  # the last finalize()'s search

    # -- training ---------------------------------------------------------------------------

    def _layer_drop(self) -> list[bool]:
        L = self.model.config.n_layers
        keep = (torch.rand(L, generator=self.gen) >= self.s.layer_drop_p).tolist()
        return [bool(v) for v in keep]

    def training_loss(self, x, mask, y, loss_fn):
        """Sandwich rule: full model (task loss) + smallest + ``n_sandwich`` random sub-models
        (KL to the full model's detached logits), summed and divided by ``n_sandwich + 2``."""
        cfg, p, rule = self.model.config, self.s.length_drop_p, self.s.length_drop_rule
        full = self.model(x, mask)  # (B, C) or (B, T, V)
        loss = loss_fn(full, y)
        subs = [(smallest_length_config(cfg.n_layers, cfg.max_len, p), None)]
        for _ in range(self.n_sandwich):
            subs.append((sample_length_config(cfg.n_layers, cfg.max_len, p, generator=self.gen),
                         self._layer_drop()))
        for length_config, layers in subs:
            logits, _ = length_drop_forward(self.model, x, mask, length_config, layers=layers, rule=rule)
            loss = loss + distill_loss(logits, full)
        return loss / (self.n_sandwich + 2)

    # -- inference --------------------------------------------------------------------------

    def set_length_config(self, length_config: Sequence[int] | None) -> None:
        """Select the configuration :meth:`predict` runs (``None`` = full length).

        Raises:
            ValueError: invalid configuration.
        """
        cfg = self.model.config
        self.length_config = (None if length_config is None
                              else check_length_config(length_config, cfg.n_layers, cfg.max_len))

    def predict(self, x, mask):
        """``(logits, flops)`` at :attr:`length_config`; ``flops`` ``(B,)``: FLOPs the batch
        executed, per sample (see :mod:`archsearch.dynamic.length.forward` for padding)."""
        if self.length_config is None:
            logits = self.model(x, mask)
            f = costs.flops_per_sample(self.model.config, x.shape[1])
        else:
            logits, lengths = length_drop_forward(self.model, x, mask, self.length_config,
                                                  rule=self.s.length_drop_rule)
            f = length_config_flops(self.model.config, lengths)
        return logits, torch.full((x.shape[0],), float(f), dtype=torch.float64)

    # -- search -----------------------------------------------------------------------------

    def evaluate_config(self, batches, length_config) -> tuple[float, float]:
        """``(metric, flops_per_sample)`` of ``length_config`` on ``batches``
        (``[(x, mask, y), ...]``): accuracy (classification) or perplexity (LM)."""
        self.model.eval()
        lm = self.model.config.task == "lm"
        total, count, flops, n = 0.0, 0, 0.0, 0
        with torch.inference_mode():
            for x, mask, y in batches:
                logits, lengths = length_drop_forward(self.model, x, mask, length_config,
                                                      rule=self.s.length_drop_rule)
                if lm:
                    total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                   reduction="sum"))
                    count += y.numel()
                else:
                    total += float((logits.argmax(-1) == y).sum())
                    count += len(y)
                flops += length_config_flops(self.model.config, lengths) * x.shape[0]
                n += x.shape[0]
        metric = math.exp(min(total / max(count, 1), 50.0)) if lm else total / max(count, 1)
        return metric, flops / max(n, 1)

    def finalize(self) -> dict[str, Any]:
        """Evolutionary search of length configurations on a fixed validation subset
        (``evolution_val_samples``), then its Pareto set measured again on the whole validation
        split, the batches every trial's metrics come from: the subset's figures are selected
        on it (the best of hundreds of configurations on one sample: optimistic) and measured on
        other batches than a trial's, so the report could not set them beside trials.

        Returns:
            ``{"anytime_curve": [{"flops_per_sample", "accuracy" | "perplexity", "latency_ms",
            "length_config"}, ...]}``: the search's Pareto set with the whole split's FLOPs per
            sample and metric, the points it dominates there dropped, sorted by FLOPs (the
            report makes each a sub-trial: its keys other than metrics are its settings);
            with ``length_budgets``, ``"budget_configs": {fraction: {"length_config", "metric",
            "flops_per_sample", "search_metric", "search_flops_per_sample"} | None}``: the best
            configuration under ``fraction`` x the full model's FLOPs, chosen on the subset,
            measured on the whole split.
        """
        if self.loop is None:
            return {}
        cfg, s = self.model.config, self.s
        lm = cfg.task == "lm"
        batches = validation_subset(self.loop, s.evolution_val_samples, seed=int(self.settings.get("seed", 0)))
        search = EvolutionarySearch(
            lambda c: self.evaluate_config(batches, c),
            n_layers=cfg.n_layers, n=cfg.max_len, mode="min" if lm else "max",
            floor=smallest_length_config(cfg.n_layers, cfg.max_len, s.length_drop_p),
            flops_fn=lambda g: float(length_config_flops(cfg, [cfg.max_len, *g])),
            iterations=s.evolution_iterations, mutations=s.evolution_mutations,
            crossovers=s.evolution_crossovers,
            store_path=self.settings.get("evolution_store"),
            seed=int(self.settings.get("seed", 0)),
        )
        front = search.run()
        dev = self.loop.device
        whole = [(x.to(dev), None if m is None else m.to(dev), y.to(dev))
                 for x, m, y in self.loop.eval_batches("validation")]
        measured: dict[tuple, tuple[float, float]] = {}

        def on_whole(config) -> tuple[float, float]:  # (metric, flops_per_sample) on the split
            key = tuple(config)
            if key not in measured:
                measured[key] = self.evaluate_config(whole, key)
            return measured[key]

        name = "perplexity" if lm else "accuracy"
        sign = -1.0 if lm else 1.0  # better = higher sign * metric
        points = [(point, *on_whole(point["length_config"])) for point in front]
        kept = [(p, m, f) for p, m, f in points
                if not any(f2 <= f and sign * m2 >= sign * m and (f2, m2) != (f, m) for _, m2, f2 in points)]
        saved = self.length_config
        curve = []
        try:
            for point, metric, flops in sorted(kept, key=lambda t: t[2]):
                self.length_config = tuple(point["length_config"])
                curve.append({"flops_per_sample": flops, name: metric, "latency_ms": self.loop.latency_ms(),
                              "length_config": list(point["length_config"])})
        finally:
            self.length_config = saved
        self.last_curve = curve
        self.search = search
        out: dict[str, Any] = {"anytime_curve": curve}
        if s.length_budgets:
            full = search.evaluated.get((cfg.max_len,) * cfg.n_layers)
            if full is not None:
                best = search.best_per_budget(list(s.length_budgets), full["flops_per_sample"])
                out["budget_configs"] = {}
                for q, e in best.items():
                    if e is not None:
                        metric, flops = on_whole(e["length_config"])
                        e = {"length_config": e["length_config"], "metric": metric, "flops_per_sample": flops,
                             "search_metric": e["metric"], "search_flops_per_sample": e["flops_per_sample"]}
                    out["budget_configs"][str(q)] = e
        return out

    def set_operating_point(self, config: dict[str, Any]) -> None:
        """Run at a point of :meth:`finalize`'s anytime curve: ``config`` is
        ``{"length_config": [...]}`` (the point's settings); :meth:`predict` then runs that
        length configuration (:meth:`set_length_config`).

        Raises:
            ValueError: a key other than ``length_config``, none, or an invalid configuration.
        """
        if not isinstance(config, dict) or set(config) != {"length_config"}:
            keys = sorted(config) if isinstance(config, dict) else type(config).__name__
            raise ValueError(f"a length_drop operating point is {{'length_config': [...]}}, got {keys}")
        try:
            self.set_length_config(config["length_config"])
        except TypeError:  # not a list of numbers
            raise ValueError(f"length_config {config['length_config']!r} is not a list of lengths") from None

    def metrics(self) -> dict[str, Any]:
        return {} if self.length_config is None else {"length_config": list(self.length_config)}

    def state_dict(self) -> dict[str, Any]:
        return {"length_config": None if self.length_config is None else list(self.length_config),
                "gen": self.gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "length_config" in state:
            self.set_length_config(state["length_config"])
        if "gen" in state:
            self.gen.set_state(state["gen"])
