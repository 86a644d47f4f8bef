"""The Ray Tune trainable: build the model a trial's config asks for, train it, evaluate it each
epoch and report the docs/design.md metrics with a checkpoint.

``train_trial(config, data=..., settings=...)`` is a Tune *function trainable*; the runner
binds ``data`` (the run's :class:`archsearch.data.PreparedData`, tokenized once and shared
through Ray's object store) and ``settings`` (the budget and fixed values) with
``tune.with_parameters``. :func:`run_trial` is the same loop without Ray (tests, benchmarks).

Reported each epoch (names and units from docs/design.md): ``accuracy`` (classification),
``val_loss`` (nats/token or nats/sample), ``perplexity`` (LM), ``flops_per_sample`` (FLOPs),
``params_total``, ``params_trainable`` (counts), ``latency_ms`` (ms per sample at
``latency_batch_size``), ``train_seconds`` (s, cumulative), plus ``epoch``.

A trial whose loss becomes NaN or infinite raises :class:`FloatingPointError`; Tune records
the trial as failed with that message and the search goes on. It is not trained again:
``budget.max_failures`` retries a trial from its last checkpoint, and the retry would replay the
same random streams to the same NaN, so the first failure leaves :data:`DIVERGED` in the trial's
directory of the run's Tune storage and a retry that finds it fails at once with the same
message.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import tempfile
import time
from typing import Any, Callable

from archsearch.dynamic import gating_class, tying_class
from archsearch.dynamic.base import PredictModule
from archsearch.models.config import EVAL_BATCH_SIZE, model_config, trial_config, trim_padding


def _lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.05, 1.0 - (step - warmup) / max(1, total - warmup))
    return f


def resolve_precision(precision: str, device) -> str:
    """The precision a trial runs at: ``fp32``, ``bf16`` or ``fp16`` as asked, and ``auto`` =
    ``bf16`` on a CUDA device that supports it (``torch.cuda.is_bf16_supported``), else
    ``fp32`` (a CPU's autocast gains little and costs accuracy). FLOPs are counted the same at
    every precision.

    Raises:
        ValueError: an unknown precision, or ``fp16`` / ``bf16`` asked where the device cannot
            run it (fp16 on a CPU; bf16 on a GPU without support).
    """
    import torch

    if precision not in ("fp32", "bf16", "fp16", "auto"):
        raise ValueError(f"precision must be fp32, bf16, fp16 or auto, got {precision!r}")
    cuda = torch.device(device).type == "cuda"
    bf16_ok = cuda and torch.cuda.is_bf16_supported()
    if precision == "auto":
        return "bf16" if bf16_ok else "fp32"
    if precision == "fp16" and not cuda:
        raise ValueError("precision fp16 needs a CUDA device (use bf16 or fp32 on a CPU)")
    if precision == "bf16" and cuda and not bf16_ok:
        raise ValueError(f"precision bf16: {torch.cuda.get_device_name(device)} does not support bfloat16")
    return precision


class TrialLoop:
    """Training state of one trial: model, optimizer, LR schedule, RNG and progress.

    Implements :class:`archsearch.dynamic.base.TrialContext`, the part of the loop the inner-loop
    strategies may use (``data``, ``device``, ``settings``, ``cfg``, ``step``, ``epoch``,
    ``train_seconds``, ``opt``, :meth:`eval_batches`, :meth:`trainable_parameters`,
    :meth:`rebuild_optimizer`, :meth:`latency_ms`).

    Args:
        cfg: the trial config (searched params; merged over ``settings["fixed"]`` and the
            defaults by :func:`archsearch.models.config.trial_config`).
        data: :class:`archsearch.data.PreparedData`.
        settings: budget values: ``epochs``, ``batch_size``, ``steps_per_epoch`` (LM),
            ``eval_blocks`` (LM), ``latency_batch_size``, ``seed``, ``threads``, ``fixed``,
            ``device`` (default: ``cuda`` when available, else ``cpu``), ``precision``
            (``fp32``, the default as ``budget.precision``'s / ``bf16`` / ``fp16`` / ``auto``,
            :func:`resolve_precision`).

    Attributes:
        mcfg: the model's :class:`~archsearch.models.transformer.TransformerConfig`.
        precision: the precision that runs (``fp32``, ``bf16`` or ``fp16``; recorded per epoch).
        opt, sched: the AdamW optimizer and its LR schedule (``opt`` is ``None`` while the
            strategies are built, before the first :meth:`rebuild_optimizer`).
    """

    def __init__(self, cfg: dict[str, Any], data, settings: dict[str, Any]):
        import torch

        from archsearch.models.transformer import Transformer

        self.cfg = trial_config(cfg, settings.get("fixed"))
        self.data, self.settings = data, settings
        self.device = torch.device(settings.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.precision = resolve_precision(str(settings.get("precision") or "fp32"), self.device)
        seed = int(settings.get("seed", 0))
        torch.manual_seed(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.mcfg = model_config(self.cfg, data)
        if self.cfg.get("init_from"):  # a pretrained encoder (directory or Hub id): its weights too
            from archsearch.models.pretrained import transformer_for_data

            # n_layers (if the trial has it): the checkpoint's first blocks, as self.mcfg says
            self.model = transformer_for_data(str(self.cfg["init_from"]), data,
                                              dropout=float(self.cfg["dropout"]),
                                              n_layers=self.cfg.get("n_layers")).to(self.device)
        else:
            self.model = Transformer(self.mcfg).to(self.device)
        self.batch_size = int(self.cfg.get("batch_size") or settings.get("batch_size", 64))
        self.step = 0
        self.epoch = 0
        #: batches of the current epoch already trained (0 between epochs); with the data-order
        #: generator's state at the epoch's start, what resumes an epoch where it was saved
        self.epoch_step = 0
        self._epoch_gen_state = None
        self._epoch_loss = (0.0, 0)  #: (loss sum, batches) of the epoch under way
        self.train_seconds = 0.0
        self.opt = self.sched = None
        self.gating = gating_class(str(self.cfg["gating"]))(self.model, self.cfg, settings, loop=self)
        self.tying = tying_class(str(self.cfg["tying"]))(self.model, self.cfg, settings, loop=self)
        self.rebuild_optimizer()
        #: fp16 needs loss scaling (Micikevicius et al. 2018, "Mixed Precision Training", §3.2);
        #: disabled (a pass-through) for fp32 and bf16
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.history: list[dict[str, float]] = []

    def trainable_parameters(self) -> list:
        """Distinct trainable parameters of the model and the gating strategy's modules
        (a Parameter shared by tied layers appears once)."""
        seen, out = set(), []
        mods = [self.model, *self.gating.extra_modules()]
        for m in mods:
            for p in m.parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def rebuild_optimizer(self) -> None:
        """A fresh AdamW over :meth:`trainable_parameters` with the LR schedule at the current
        step; the gating strategy's ``extra_modules`` get their own param group at its
        ``extra_lr`` when it sets one (same schedule) (used at start and when a tying controller changes the parameter set but does not
        carry the optimizer state over itself)."""
        import torch

        params = self.trainable_parameters()
        extra_lr = getattr(self.gating, "extra_lr", None)  # e.g. a fresh depth predictor's own lr
        if extra_lr is not None:
            extra = {id(p) for m in self.gating.extra_modules() for p in m.parameters()}
            params = [g for g in ({"params": [p for p in params if id(p) not in extra]},
                                  {"params": [p for p in params if id(p) in extra], "lr": float(extra_lr)})
                      if g["params"]]
        self.opt = torch.optim.AdamW(params, lr=float(self.cfg["lr"]),
                                     weight_decay=float(self.cfg["weight_decay"]))
        total = self.steps_per_epoch() * int(self.settings["epochs"])
        lam = _lr_lambda(int(self.cfg["warmup_steps"]), total)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lam)
        if self.step:  # continue the schedule where it was
            self.sched.last_epoch = self.step
            for g in self.opt.param_groups:
                g["lr"] = g["initial_lr"] * lam(self.step)

    # ------------------------------------------------------------------ data
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch: ``settings["steps_per_epoch"]`` (LM, default 200) or
        ``ceil(train rows / batch_size)`` (classification)."""
        if self.data.task == "lm":
            return int(self.settings.get("steps_per_epoch") or 200)
        n = len(self.data.train)
        return math.ceil(n / self.batch_size)

    def train_batches(self):
        """One epoch of training batches ``(x, mask, y)`` from the loop's RNG: LM ``B x T``
        random windows (``mask`` None, ``y`` the next tokens ``B x T``); classification a
        shuffled pass, each batch trimmed by :func:`~archsearch.models.config.trim_padding`
        (``B x T'``, ``y`` ``B`` labels). CPU tensors."""
        import torch

        if self.data.task == "lm":
            stream = self.data.train  # (n_tokens,)
            T = self.mcfg.max_len
            for _ in range(self.steps_per_epoch()):
                start = torch.randint(0, len(stream) - T - 1, (self.batch_size,), generator=self.gen)
                idx = start[:, None] + torch.arange(T + 1)
                chunk = stream[idx]  # (B, T+1)
                yield chunk[:, :-1], None, chunk[:, 1:]
        else:
            split = self.data.train
            perm = torch.randperm(len(split), generator=self.gen)
            for i in range(0, len(perm), self.batch_size):
                j = perm[i:i + self.batch_size]
                ids, mask = trim_padding(split.input_ids[j], split.attention_mask[j])  # (B, T')
                yield ids, mask, split.labels[j]

    def eval_batches(self, split_name: str = "validation", batch_size: int = EVAL_BATCH_SIZE):
        """The evaluation batches ``(x, mask, y)`` of a split, in order (CPU tensors).

        Classification: consecutive rows, ``x`` ``B x T'`` ids and ``mask`` ``B x T'`` bool
        trimmed by :func:`~archsearch.models.config.trim_padding`, ``y`` ``B`` labels (the
        batches :func:`~archsearch.models.config.eval_lengths` describes). LM: consecutive
        non-overlapping blocks (at most ``settings["eval_blocks"]``, default 256), ``x`` ``B x T``
        with ``T = max_len``, ``mask`` None, ``y`` ``B x T`` next tokens.
        """
        import torch

        if self.data.task == "lm":
            stream = self.data[split_name]  # (n_tokens,)
            T = self.mcfg.max_len
            n_blocks = min((len(stream) - 1) // T, int(self.settings.get("eval_blocks", 256)))
            for i in range(0, n_blocks, batch_size):
                rows = [stream[b * T:(b + 1) * T + 1] for b in range(i, min(i + batch_size, n_blocks))]
                chunk = torch.stack(rows)  # (B, T+1)
                yield chunk[:, :-1], None, chunk[:, 1:]
        else:
            split = self.data[split_name]
            for i in range(0, len(split), batch_size):
                ids, mask = trim_padding(split.input_ids[i:i + batch_size],
                                         split.attention_mask[i:i + batch_size])  # (B, T')
                yield ids, mask, split.labels[i:i + batch_size]

    # ------------------------------------------------------------------ loop
    def task_loss(self, logits, y, reduction: str = "mean"):
        """Mean training cross-entropy (nats): LM over tokens (``B x T x V`` logits, ``B x T``
        targets), classification over samples (``B x C``, ``B``; with ``label_smoothing``).
        ``reduction="none"``: one loss per sample (classification) or token (LM), whose mean
        is the default's (the exits' losses in one call:
        :func:`archsearch.dynamic.depth.exits.exit_terms`)."""
        import torch.nn.functional as F

        if self.data.task == "lm":
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction=reduction)
        return F.cross_entropy(logits, y, label_smoothing=float(self.cfg["label_smoothing"]), reduction=reduction)

    def train_epoch(self, after_step: Callable[[], None] | None = None) -> float:
        """One epoch of training; returns the mean training loss (nats) of the batches this
        call trained.

        An epoch saved part-way (:meth:`save` after ``epoch_step`` batches, e.g. from
        ``after_step``) and restored with :meth:`load` continues with its next batch: the batch
        order is drawn again from the data-order generator's state at the epoch's start, and the
        other random streams (LengthDrop's sampler, dropout's global RNG) are restored, so the
        resumed epoch ends with the same weights as an uninterrupted one (float-for-float on the
        same device and thread count).

        Args:
            after_step: called after each optimizer step (``step`` and ``epoch_step`` updated),
                e.g. to checkpoint a long epoch.

        Returns:
            the epoch's mean training loss (nats per batch; with a resumed epoch, over all its
            batches, those trained before the save included).

        Raises:
            FloatingPointError: the loss or (without fp16's gradient scaler, which skips such
                steps itself) the gradient norm became NaN or infinite.
        """
        import itertools

        import torch

        self.model.train()
        if self.epoch_step:  # resuming inside an epoch: the same batch order, its first batches done
            self.gen.set_state(self._epoch_gen_state)
            total, n = self._epoch_loss  # the loss summed over the batches trained before the save
        else:
            self._epoch_gen_state = self.gen.get_state()
            total, n = 0.0, 0
        t0 = time.perf_counter()
        for step, (x, mask, y) in enumerate(itertools.islice(self.train_batches(), self.epoch_step, None),
                                            self.epoch_step):
            x, y = x.to(self.device), y.to(self.device)
            mask = None if mask is None else mask.to(self.device)
            with self.autocast():
                loss = self.gating.training_loss(x, mask, y, self.task_loss)
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"training loss is {loss.item()} at epoch {self.epoch + 1}, step {step} "
                    f"(lr={self.cfg['lr']:.3g})")
            self.opt.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.opt)
            norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), 1.0)
            self.scaler.step(self.opt)
            self.scaler.update()
            self.sched.step()
            self.step += 1
            self.epoch_step = step + 1
            # one host read for both (a GPU synchronises once per step, as with the loss alone)
            loss_value, norm_value = torch.stack([loss.detach().float(), norm.float()]).tolist()
            if not self.scaler.is_enabled() and not math.isfinite(norm_value):
                # a finite loss with an infinite gradient: clipping made it NaN and the step wrote
                # it into the weights; the trial fails here, not with made-up metrics later
                raise FloatingPointError(
                    f"gradient norm is {norm_value} at epoch {self.epoch + 1}, step {step} "
                    f"(lr={self.cfg['lr']:.3g})")
            self.gating.after_step(loss_value)
            self.tying.after_step(self.step, loss_value)
            total += loss_value
            n += 1
            self._epoch_loss = (total, n)
            t1 = time.perf_counter()
            self.train_seconds += t1 - t0
            t0 = t1
            if after_step is not None:
                after_step()
        self.epoch_step = 0
        self.epoch += 1
        return total / max(n, 1)

    def run_epoch(self) -> dict[str, Any]:
        """Train one epoch, evaluate, and append the epoch's results to ``history``: the
        :meth:`evaluate` metrics plus ``train_loss`` (nats), and after the last epoch the
        gating strategy's :meth:`~archsearch.dynamic.base.GatingStrategy.finalize` entries.

        Raises:
            FloatingPointError: as :meth:`train_epoch`.
        """
        train_loss = self.train_epoch()
        metrics = {**self.evaluate(), "train_loss": train_loss}
        if self.epoch == int(self.settings["epochs"]):
            metrics.update(self.gating.finalize())
        self.history.append(metrics)
        return metrics

    def evaluate(self, split_name: str = "validation") -> dict[str, float]:
        """Metrics of the current model on ``split_name`` (docs/design.md names and units; the
        gating strategy's entries, e.g. depth histograms, describe the same pass; ``latency_ms``
        is timed afterwards on a validation batch and is not counted in them).

        Raises:
            FloatingPointError: the loss on ``split_name`` is NaN or infinite (diverged weights:
                their accuracy would be an argmax over NaN logits)."""
        import torch

        from archsearch.models import costs

        self.model.eval()
        with self.autocast():
            self.gating.before_evaluate(split_name)  # e.g. budget calibration on validation data
        loss_sum, correct, count, flops_sum, n_samples = 0.0, 0, 0, 0.0, 0
        with torch.inference_mode(), self.autocast():
            for x, mask, y in self.eval_batches(split_name):
                x, y = x.to(self.device), y.to(self.device)
                mask = None if mask is None else mask.to(self.device)
                logits, flops = self.gating.predict(x, mask)  # (B, ...), (B,) FLOPs executed
                logits = logits.float()
                if self.data.task == "lm":
                    loss_sum += float(self.task_loss(logits, y)) * y.numel()
                    count += y.numel()
                else:
                    loss_sum += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
                    correct += int((logits.argmax(-1) == y).sum())
                    count += len(y)
                flops_sum += float(flops.sum())
                n_samples += x.shape[0]
        val_loss = loss_sum / max(count, 1)
        if not math.isfinite(val_loss):  # diverged weights: no metric of them means anything
            raise FloatingPointError(f"{split_name} loss is {val_loss} after epoch {self.epoch} "
                                     f"(the weights diverged; lr={self.cfg['lr']:.3g})")
        metrics: dict[str, float] = {"val_loss": val_loss}
        if self.data.task == "lm":
            metrics["perplexity"] = math.exp(min(val_loss, 50.0))
        else:
            metrics["accuracy"] = correct / max(count, 1)
        metrics["flops_per_sample"] = flops_sum / max(n_samples, 1)
        metrics["params_total"] = costs.params_total(self.model)
        metrics["params_trainable"] = costs.params_trainable(self.model)
        # the strategy's statistics (e.g. depth histograms) cover this pass over split_name:
        # read them before the latency timing runs predict on more (validation) batches
        gating_metrics = self.gating.metrics()
        metrics["latency_ms"] = self.latency_ms()
        metrics["train_seconds"] = self.train_seconds
        metrics["epoch"] = self.epoch
        metrics["device"] = costs.device_name(self.device)
        metrics["precision"] = self.precision
        metrics.update(gating_metrics)
        metrics.update(self.tying.metrics())
        return metrics

    def latency_ms(self) -> float:
        """Median forward time per sample (ms) on a validation batch of ``latency_batch_size``."""
        from archsearch.models import costs

        bs = int(self.settings.get("latency_batch_size", 32))
        x, mask, _ = next(iter(self.eval_batches("validation", batch_size=bs)))
        with self.autocast():
            return float(costs.latency_ms(PredictModule(self.gating), x.to(self.device),
                                          None if mask is None else mask.to(self.device),
                                          batch_size=bs, repeats=5, warmup=1))

    def autocast(self):
        """The mixed-precision context of :attr:`precision` (``torch.autocast`` on the loop's
        device; a no-op for fp32)."""
        import torch

        if self.precision == "fp32":
            return torch.autocast(self.device.type, enabled=False)
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: str, *, weights_only: bool = False) -> None:
        """Write model, optimizer, scheduler, random states and progress (an epoch's batches
        done, when saved inside one) to ``directory``; ``weights_only``: the model, gating and
        tying state only (:data:`archsearch.tune.weights.WEIGHTS_KEYS`: what export and
        evaluation read, a third of the size with AdamW), for a trial that will not train on."""
        import torch

        state = {"model": self.model.state_dict(), "gating": self.gating.state_dict(),
                 "tying": self.tying.state_dict()}
        if not weights_only:
            state.update({"opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
                          "gen": self.gen.get_state(), "scaler": self.scaler.state_dict(),
                          "rng": torch.get_rng_state()})
            if self.device.type == "cuda":
                state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
            if self.epoch_step:  # saved inside an epoch: where its batch order came from
                state["epoch_gen"] = self._epoch_gen_state
        torch.save(state, os.path.join(directory, "state.pt"))
        with open(os.path.join(directory, "progress.json"), "w") as f:
            progress = {"epoch": self.epoch, "step": self.step, "epoch_step": self.epoch_step,
                        "train_seconds": self.train_seconds, "history": self.history}
            if self.epoch_step:
                progress["epoch_loss"] = list(self._epoch_loss)
            json.dump(progress, f)

    def load(self, directory: str) -> None:
        """Restore what :meth:`save` wrote (``torch.load(weights_only=True)``), or a weights-only
        checkpoint (``model``, ``gating``, ``tying``: :mod:`archsearch.tune.weights`).

        Raises:
            RuntimeError: the checkpoint is truncated or corrupt (names the file); the trial
                fails with that reason rather than silently starting over.
        """
        import torch

        path = os.path.join(directory, "state.pt")
        try:
            # onto the CPU first: RNG states must stay CPU ByteTensors (a GPU checkpoint restored
            # on a GPU or a CPU); load_state_dict then copies weights and optimizer state to
            # where the parameters live
            state = torch.load(path, map_location="cpu", weights_only=True)
            with open(os.path.join(directory, "progress.json")) as f:
                progress = json.load(f)
        except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as e:
            raise RuntimeError(f"checkpoint unreadable (truncated or corrupt): {path} "
                               f"({e.__class__.__name__}: {str(e).splitlines()[0][:120]})") from None
        self.step = progress.get("step", 0)
        self.tying.load_state_dict(state.get("tying", {}))  # re-creates the sharing first
        self.model.load_state_dict(state["model"])
        self.gating.load_state_dict(state.get("gating", {}))
        self.rebuild_optimizer()  # the parameter set may differ from a fresh model's
        # a weights-only checkpoint (budget.keep_weights, after the search: archsearch.tune.weights)
        # has no optimizer, schedule or generator: it predicts (export), it does not train on
        if "opt" in state:
            self.opt.load_state_dict(state["opt"])
            self.sched.load_state_dict(state["sched"])
        if "gen" in state:
            self.gen.set_state(state["gen"])
        if "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        if "rng" in state:
            torch.set_rng_state(state["rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.epoch_step = progress.get("epoch_step", 0)
        self._epoch_gen_state = state.get("epoch_gen")
        loss_sum, batches = progress.get("epoch_loss", (0.0, 0))  # older saves: not kept
        self._epoch_loss = (float(loss_sum), int(batches))
        self.epoch = progress["epoch"]
        self.train_seconds = progress["train_seconds"]
        self.history = progress["history"]


def run_trial(cfg: dict[str, Any], data, settings: dict[str, Any],
              on_epoch: Callable[[dict[str, float], "TrialLoop"], None] | None = None) -> list[dict]:
    """Train one config for ``settings["epochs"]`` epochs without Ray; returns the history."""
    loop = TrialLoop(cfg, data, settings)
    while loop.epoch < int(settings["epochs"]):
        metrics = loop.run_epoch()
        if on_epoch:
            on_epoch(metrics, loop)
    return loop.history


#: The file a diverged trial leaves in its directory of the run's Tune storage
#: (``{"error", "epoch"}``).
DIVERGED = "diverged.json"


class _DivergedMarker:
    """``TRIAL/diverged.json`` in the run's Tune storage (``StorageContext.trial_fs_path`` on
    its filesystem: the run directory, or the cluster's shared storage), so a retry on another
    node finds it too; the trial's local directory is not stable across retries (Ray moves it
    between ``driver_artifacts`` and ``working_dirs``)."""

    def __init__(self):
        from ray import tune

        storage = tune.get_context().get_storage()  # raises outside a Tune trial
        self.fs, self.path = storage.storage_filesystem, f"{storage.trial_fs_path}/{DIVERGED}"

    def read(self) -> dict | None:
        """The marker, or ``None`` when there is none or it cannot be read (the trial then
        trains, as without a marker)."""
        import pyarrow.fs

        try:
            if self.fs.get_file_info(self.path).type != pyarrow.fs.FileType.File:
                return None
            with self.fs.open_input_stream(self.path) as f:
                got = json.loads(f.read().decode())
            return got if isinstance(got, dict) and isinstance(got.get("error"), str) else None
        except Exception:  # unreadable (pyarrow raises OSError, ValueError...): train
            return None

    def write(self, error: str, epoch: int) -> None:
        """Write the marker whole (a temporary file, then a rename); a storage that refuses
        it is warned about, never raised from (the trial's own error must stay the one
        reported)."""
        import warnings

        body, tmp = json.dumps({"error": error, "epoch": epoch}).encode(), f"{self.path}.tmp"
        try:
            self.fs.create_dir(self.path.rsplit("/", 1)[0], recursive=True)
            try:
                with self.fs.open_output_stream(tmp) as f:
                    f.write(body)
                self.fs.move(tmp, self.path)
            except Exception:  # a storage without rename (pyarrow: NotImplementedError): direct
                with self.fs.open_output_stream(self.path) as f:
                    f.write(body)
        except Exception as e:  # never instead of the trial's own error
            warnings.warn(f"could not write {self.path} ({e}): a retry of this diverged trial "
                          "will train again to the same NaN", stacklevel=2)
        try:
            self.fs.delete_file(tmp)
        except Exception:  # moved, or never written
            pass


def _diverged_marker() -> _DivergedMarker | None:
    try:
        return _DivergedMarker()
    except Exception:  # not inside a Tune trial, or a Ray without this storage API: no marker
        return None


def train_trial(config: dict[str, Any], data=None, settings: dict[str, Any] | None = None) -> None:
    """Ray Tune function trainable (bind ``data`` and ``settings`` with ``tune.with_parameters``).

    Resumes from ``tune.get_checkpoint()`` when Tune restarts the trial. On a worker Ray gave a
    GPU (``budget.gpus_per_trial``, fractions included: 0.25 packs four trials on one GPU), Ray
    sets ``CUDA_VISIBLE_DEVICES`` to it and the loop trains on ``cuda`` there; each epoch's
    results record ``ray_gpu_ids`` (what Ray assigned) beside ``device``.
    """
    import ray
    import torch
    from ray import tune

    settings = settings or {}
    marker = _diverged_marker()
    diverged = marker.read() if marker is not None else None
    if diverged is not None:  # Tune retried a diverged trial: it would reach the same NaN again
        raise FloatingPointError(f"{diverged['error']} (not trained again: a retry replays the "
                                 "same random streams to the same NaN)")
    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    threads = int(settings.get("threads", 1))
    torch.set_num_threads(max(1, threads))
    loop = TrialLoop(config, data, settings)
    ckpt = tune.get_checkpoint()
    restored_from = None
    if ckpt is not None:  # Tune retried or resumed the trial: continue where it stopped
        with ckpt.as_directory() as d:
            loop.load(d)
        restored_from = loop.epoch
    while loop.epoch < int(settings["epochs"]):
        try:
            metrics = loop.run_epoch()
        except FloatingPointError as e:
            if marker is not None:
                marker.write(str(e), loop.epoch)
            raise
        metrics["ray_gpu_ids"] = gpu_ids
        if restored_from is not None:
            metrics["restored_from_epoch"] = restored_from
        with tempfile.TemporaryDirectory() as d:
            # the last epoch's checkpoint can no longer resume anything: weights only (issue 62)
            loop.save(d, weights_only=loop.epoch >= int(settings["epochs"]))
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
