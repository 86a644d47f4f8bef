"""From a trial of a finished search to a model directory a user can load and run.

:func:`export_trial` writes one trial of a run (``archsearch export``) as a self-contained
directory, weights only (no optimizer state), readable without the run or its data cache::

    DIR/
      config.json         the model's TransformerConfig, the task, the class names
      model.safetensors   the weights (tied blocks stored once per name; re-tied on load)
      modeling_archsearch.py  a static trial only: the model as a transformers class
                          (archsearch/models/hf_modeling.py; config.json's auto_map names it)
      gating.safetensors  the tensors of the gating's calibrated state (absent when it has none)
      model.onnx          ``format="onnx"`` (``--format onnx``), a static, untied classifier only:
                          the model as ONNX, checked with onnxruntime (:mod:`archsearch.export_onnx`)
      tokenizer/          the tokenizer: tokenizer.json (trained BPE/WordPiece/char) or the
                          pretrained checkpoint's tokenizer files
      archsearch.json     format version; the trial's full config, gating and tying names and
                          state (thresholds, price, stop rule, exit heads, tying map), the
                          recorded metrics, the run, trial id, commit; a sha256 of every file

:func:`load` reads it back (checking every file against its sha256) as an
:class:`ExportedModel` whose :meth:`ExportedModel.predict` runs the trial's own gating: a
dynamic gating (DHT, the confidence exit, the depth predictor, LengthDrop) runs its per-sample
inference and reports the FLOPs it executed per row (:mod:`archsearch.models.costs`'s analytic
count at the batch's trimmed length, as the trial's ``flops_per_sample``).

The exported model scores the trial's validation split to its recorded accuracy
(``tests/test_export.py``): the checkpoint is the one written after the trial's last
evaluation, which holds the gating's calibrated state.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from archsearch.errors import UserError
from archsearch.runs import export_dirname  # noqa: F401 (archsearch.export's name for it)

#: archsearch.json's ``format``; :func:`load` refuses a newer one
FORMAT = 1
#: what :func:`export_trial` can write (``--format``): ``onnx`` is ``safetensors`` plus ``model.onnx``
FORMATS = ("safetensors", "onnx")
_TENSOR, _ARRAY = "__tensor__", "__ndarray__"


# ---------------------------------------------------------------------- state <-> files
def pack_state(state: Any, prefix: str, tensors: dict) -> Any:
    """A nested state (dicts, lists, tensors, NumPy arrays, numbers, strings) as JSON-able data;
    each tensor or array goes to ``tensors`` under a path-like name and is replaced by a marker."""
    import numpy as np
    import torch

    if isinstance(state, torch.Tensor):
        tensors[prefix] = state.detach().cpu().contiguous().clone()
        return {_TENSOR: prefix}
    if isinstance(state, np.ndarray):
        tensors[prefix] = torch.from_numpy(np.ascontiguousarray(state).copy())
        return {_ARRAY: prefix}
    if isinstance(state, dict):
        return {str(k): pack_state(v, f"{prefix}/{k}", tensors) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [pack_state(v, f"{prefix}/{i}", tensors) for i, v in enumerate(state)]
    if isinstance(state, np.generic):
        return state.item()
    return state


def unpack_state(packed: Any, tensors: dict) -> Any:
    """Inverse of :func:`pack_state`."""
    if isinstance(packed, dict):
        if set(packed) == {_TENSOR}:
            return tensors[packed[_TENSOR]]
        if set(packed) == {_ARRAY}:
            return tensors[packed[_ARRAY]].numpy().copy()
        return {k: unpack_state(v, tensors) for k, v in packed.items()}
    if isinstance(packed, list):
        return [unpack_state(v, tensors) for v in packed]
    return packed


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


# ---------------------------------------------------------------------- choosing trials
def trial_checkpoint(run, trial_id: str) -> Path | None:
    """The newest checkpoint directory of ``trial_id`` under the run's ``tune/`` (Tune keeps
    one per trial, written after its last evaluation), or ``None``."""
    from archsearch.tune.weights import checkpoints

    found = [d for d in checkpoints(run, trial_id) if (d / "state.pt").is_file()]
    return found[-1] if found else None


def split_subtrial(trial_id: str) -> tuple[str, int | None]:
    """``(ID, k)`` for a sub-trial id ``ID#k`` (point ``k`` of trial ``ID``'s anytime curve, as
    the report names it), ``(ID, None)`` for a trial id.

    Raises:
        UserError: ``#`` not followed by a point number (field ``--trial``).
    """
    base, hash_, k = str(trial_id).partition("#")
    if not hash_:
        return base, None
    try:
        return base, int(k)
    except ValueError:
        raise UserError(f"{trial_id!r} is not a trial id ID or a sub-trial id ID#k (k a point number)",
                        field="--trial") from None


def subtrial(rec: dict, trial_id: str, run_dir: str | Path | None = None) -> dict[str, Any]:
    """What sub-trial ``trial_id`` (``ID#k``) of the trial record ``rec`` exports: ``subtrial``
    (``k``), ``operating_point`` (point ``k`` of ``rec``'s ``metrics["anytime_curve"]`` without
    its metrics: its other keys plus the entries of its ``"config"`` dict, what the report's
    sub-trial adds to its trial's config) and ``metrics`` (the point's, plus the trained model's
    :data:`archsearch.metrics.PER_MODEL` metrics from the trial, as the report's sub-trial).

    Raises:
        UserError: ``rec`` has no anytime curve, or no point ``k`` (field ``--trial``).
    """
    from archsearch.metrics import METRICS, PER_MODEL, is_number

    base, k = split_subtrial(trial_id)
    metrics = rec.get("metrics") or {}
    curve = metrics.get("anytime_curve")
    where = None if run_dir is None else str(run_dir)
    if not isinstance(curve, list) or not curve:
        raise UserError(f"no sub-trial {trial_id!r}: trial {base} has no anytime curve",
                        file=where, field="--trial")
    if k is None or not 0 <= k < len(curve) or not isinstance(curve[k], dict):
        raise UserError(f"no sub-trial {trial_id!r}: trial {base}'s anytime curve has {len(curve)} "
                        f"point(s), {base}#0 to {base}#{len(curve) - 1}", file=where, field="--trial")
    point = curve[k]
    setting = {key: v for key, v in point.items() if key not in METRICS and key != "config"}
    if isinstance(point.get("config"), dict):
        setting.update(point["config"])
    own = {key: v for key, v in point.items() if key in METRICS and is_number(v)}
    own.update({m: metrics[m] for m in sorted(PER_MODEL) if m not in own and m in metrics})
    return {"subtrial": k, "operating_point": setting, "metrics": own}


def select_trials(run_dir: str | Path, *, trial: str | None = None, best: str | None = None,
                  pareto: bool = False) -> list[str]:
    """Trial ids of a run: ``trial`` itself (a trial ``ID``, or a sub-trial ``ID#k``: point
    ``k`` of its anytime curve), the best successful trial of metric ``best`` (its objective's
    mode, else the metric's), or the trials and sub-trials on the Pareto front (as the report
    lists them: :func:`export_trial` writes a sub-trial at its own operating point).

    Raises:
        UserError: not exactly one of the three; an unknown trial, sub-trial or metric; no
            successful trial.
    """
    from archsearch.report.data import build_report_data
    from archsearch.report.inputs import load_run

    if sum(x is not None and x is not False for x in (trial, best, pareto)) != 1:
        raise UserError("give exactly one of --trial ID, --best METRIC, --pareto", field="--trial")
    run = load_run(run_dir)
    ids = [r["trial_id"] for r in run.trials]
    if trial is not None:
        base, k = split_subtrial(trial)
        if base not in ids:
            known = ", ".join(ids[:8]) + (" ..." if len(ids) > 8 else "")
            raise UserError(f"no trial {trial!r} in this run (its trials: {known or 'none'})",
                            file=str(run_dir), field="--trial")
        if k is None:
            return [base]
        subtrial(run.trials[ids.index(base)], trial, run_dir)  # a point it has
        return [f"{base}#{k}"]
    try:
        data = build_report_data(run.trials, run.objectives, run.constraints, run.run_info)
    except ValueError as e:
        raise UserError(f"bad trial records: {e}", file=str(run_dir)) from None
    ok = [r for r in data.trials if not r.failed]
    if not ok:
        raise UserError("no trial of this run succeeded: nothing to export", file=str(run_dir))
    if pareto:
        return list(dict.fromkeys(r.trial_id for r in data.rows if r.pareto))
    from archsearch.metrics import METRICS

    mode = next((o.mode for o in data.objectives if o.metric == best), None)
    if mode is None:
        known = METRICS.get(best)
        if known is None or all(best not in r.metrics for r in ok):
            raise UserError(f"no trial reports metric {best!r} (objectives: "
                            f"{', '.join(o.metric for o in data.objectives)})",
                            file=str(run_dir), field="--best")
        mode = known.mode
    scored = [r for r in ok if isinstance(r.metrics.get(best), (int, float))]
    if not scored:
        raise UserError(f"no successful trial reports {best!r}", file=str(run_dir), field="--best")
    pick = (max if mode == "max" else min)(scored, key=lambda r: r.metrics[best])
    return [pick.trial_id]


# ---------------------------------------------------------------------- export
def _refuse_format(fmt: str, cfg: dict, task: str, trial_id: str | None, file: str | None) -> None:
    """Raises: UserError (field ``--format``): ``fmt`` is not in :data:`FORMATS`, or is ``onnx``
    for a trial :func:`archsearch.export_onnx.refusal` refuses (the message names it and why)."""
    if fmt not in FORMATS:
        raise UserError(f"{fmt!r} is not one of {', '.join(FORMATS)}", field="--format")
    if fmt == "onnx":
        from archsearch.export_onnx import refusal

        why = refusal(cfg, task)
        if why is not None:
            raise UserError(f"trial {trial_id or '(unnamed)'}: {why}", file=file, field="--format")


def check_format(run_dir: str | Path, trial_ids: Sequence[str], format: str) -> None:
    """Check, before anything is written, that every trial of ``trial_ids`` (e.g. a Pareto front;
    ``ID#k`` is trial ``ID``) can be exported in ``format``; an unknown id is left to
    :func:`export_trial`.

    Raises:
        UserError: see :func:`export_trial` (field ``--format``).
    """
    from archsearch.models.config import trial_config
    from archsearch.runs import RunDir

    if format != "onnx":  # safetensors fits every trial; an unknown name is refused here
        _refuse_format(format, {}, "", None, None)
        return
    run = RunDir.open(run_dir)
    space = run.load_space()
    recs = {r["trial_id"]: r for r in run.read_trials()}
    for tid in trial_ids:
        rec = recs.get(str(tid).split("#")[0])
        if rec is not None:
            _refuse_format(format, trial_config(rec.get("config") or {}, space.fixed), space.task,
                           str(tid), str(run_dir))


def export_trial(run_dir: str | Path, trial_id: str, out: str | Path, *, format: str = "safetensors") -> Path:
    """Write trial ``trial_id`` of the run at ``run_dir`` to the new directory ``out`` (layout:
    module docstring). Nothing is left at ``out`` when it fails.

    A sub-trial ``ID#k`` (point ``k`` of trial ``ID``'s anytime curve) is trial ``ID``'s weights
    at the point's operating point (:func:`subtrial`; the gating's
    :meth:`~archsearch.dynamic.base.GatingStrategy.set_operating_point`): ``archsearch.json``
    records ``subtrial`` (``k``), ``operating_point`` and the point's ``metrics``, and
    :func:`load` runs the gating there.

    ``format="onnx"`` writes the same directory plus ``model.onnx``
    (:func:`archsearch.export_onnx.write_onnx`), for a static, untied classifier only.

    Returns:
        ``out``.

    Raises:
        UserError: ``out`` exists; the trial is unknown, failed, or has no checkpoint, or the
            sub-trial's point is not there or not one its gating can run (field ``--trial``);
            the checkpoint is unreadable; ``format`` is not one of :data:`FORMATS`, or is
            ``"onnx"`` for a dynamic gating, a tied model or a language model (field
            ``--format``, checked before the checkpoint is read).
        archsearch.export_onnx.OnnxExportError: the ONNX exporter failed, or onnxruntime's
            logits differ from PyTorch's by more than 1e-4 (exit code 1).
    """
    from archsearch.runs import FINISHED, RunDir
    from archsearch.tune.runner import trial_settings
    from archsearch.tune.trainable import TrialLoop

    out = Path(out)
    if out.exists():
        raise UserError("already exists: export writes a new directory", file=str(out), field="--out")
    run = RunDir.open(run_dir)
    recs = {r["trial_id"]: r for r in run.read_trials()}
    trial_id, k = split_subtrial(trial_id)
    rec = recs.get(trial_id)
    if rec is None:
        raise UserError(f"no trial {trial_id!r} in this run", file=str(run_dir), field="--trial")
    check_format(run_dir, [trial_id], format)
    if rec["status"] not in FINISHED:
        why = rec.get("error") or "it has not finished"
        raise UserError(f"trial {trial_id} is {rec['status']} ({' '.join(str(why).split())[:120]}): "
                        "no trained model to export", file=str(run_dir), field="--trial")
    point = None if k is None else subtrial(rec, f"{trial_id}#{k}", run_dir)
    ckpt = trial_checkpoint(run, trial_id)
    if ckpt is None:
        raise UserError(f"trial {trial_id} has no checkpoint under {run.tune_dir}: budget.keep_weights "
                        "kept none for it (by default only the Pareto front's and each objective's best "
                        "trial keep their weights), or the run was copied without tune/",
                        file=str(run_dir), field="--trial")
    space = run.load_space()
    from archsearch.data import prepare_for_space

    data = prepare_for_space(space)
    settings = {**trial_settings(space, 1), "device": "cpu"}
    loop = TrialLoop(rec["config"], data, settings)
    try:
        loop.load(str(ckpt))
    except RuntimeError as e:
        raise UserError(str(e), file=str(ckpt / "state.pt"), field="--trial") from None
    if point is not None:  # the sub-trial's operating point; its state is exported with it
        try:
            loop.gating.set_operating_point(point["operating_point"])
        except ValueError as e:
            raise UserError(f"sub-trial {trial_id}#{k}: {e}", file=str(run_dir), field="--trial") from None
        rec = {**rec, **point, "trial_id": f"{trial_id}#{k}"}
    return export_loop(loop, out, record=rec, run_dir=run_dir, seed=int(space.seed), format=format)


def export_loop(loop, out: str | Path, *, record: dict | None = None, run_dir: str | Path | None = None,
                seed: int = 0, format: str = "safetensors") -> Path:
    """Write the model of a trial's :class:`~archsearch.tune.trainable.TrialLoop` (trained or
    loaded from its checkpoint) to the new directory ``out`` (layout: module docstring),
    atomically: a ``.NAME.partial`` directory renamed into place.

    Args:
        loop: the trial's loop (its ``cfg``, ``data``, ``model``, ``gating``, ``tying``).
        record: the trial's record (``trial_id``, ``status``, ``metrics``), when it has one.
        run_dir: the run it came from, when it has one.
        seed: the run's seed (the gating's generators at load).
        format: ``"safetensors"`` or ``"onnx"`` (:func:`export_trial`).

    Raises:
        UserError: ``out`` exists; ``format`` (:func:`export_trial`).
        archsearch.export_onnx.OnnxExportError: see :func:`export_trial`; nothing is written.
    """
    out = Path(out)
    if out.exists():
        raise UserError("already exists: export writes a new directory", file=str(out), field="--out")
    _refuse_format(format, loop.cfg, loop.data.task, (record or {}).get("trial_id"),
                   None if run_dir is None else str(run_dir))
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        _write(tmp, loop, record or {}, run_dir=run_dir, seed=seed, format=format, dest=out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write(out: Path, loop, rec: dict, *, run_dir, seed: int, format: str = "safetensors",
           dest: Path | None = None) -> None:
    from safetensors.torch import save_file

    cfg, data = loop.cfg, loop.data
    model_cfg = asdict(loop.model.config)
    hf = {}
    if str(cfg["gating"]) == "static" and data.task == "classification":
        # a transformers model too (remote code: archsearch/models/hf_modeling.py, which imports
        # no archsearch): AutoModelForSequenceClassification.from_pretrained(DIR, trust_remote_code=True)
        shutil.copyfile(Path(__file__).parent / "models" / "hf_modeling.py", out / "modeling_archsearch.py")
        names = data.label_names or [str(i) for i in range(model_cfg["n_classes"])]
        hf = {"architectures": ["ArchsearchForSequenceClassification"],
              "auto_map": {"AutoConfig": "modeling_archsearch.ArchsearchConfig",
                           "AutoModelForSequenceClassification":
                               "modeling_archsearch.ArchsearchForSequenceClassification"},
              "id2label": {str(i): n for i, n in enumerate(names)},
              "label2id": {n: i for i, n in enumerate(names)}}
    (out / "config.json").write_text(json.dumps(
        {"model_type": "archsearch-transformer", "archsearch_format": FORMAT, **model_cfg,
         "label_names": data.label_names, **hf}, indent=2) + "\n")
    weights = {k: v.detach().cpu().contiguous().clone() for k, v in loop.model.state_dict().items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    gating_tensors: dict = {}
    gating_state = pack_state(loop.gating.state_dict(), "gating", gating_tensors)
    tying_tensors: dict = {}
    tying_state = pack_state(loop.tying.state_dict(), "tying", tying_tensors)
    if gating_tensors or tying_tensors:
        save_file({**gating_tensors, **tying_tensors}, str(out / "gating.safetensors"))
    tok_dir = out / "tokenizer"
    tok_dir.mkdir()
    kind = data.tokenizer if data.tokenizer in ("bpe", "wordpiece", "char") else "pretrained"
    if kind == "pretrained":
        data.load_tokenizer().tok.save_pretrained(str(tok_dir))
    else:
        shutil.copyfile(data.tokenizer_file, tok_dir / "tokenizer.json")
    onnx = {}
    if format == "onnx":  # model.onnx, checked against the model (export_onnx), then hashed below
        from archsearch.export_onnx import ONNX_FILE, OPSET, write_onnx

        diff = write_onnx(loop.model, out / ONNX_FILE, shown=(dest or out) / ONNX_FILE)
        onnx = {"onnx": {"file": ONNX_FILE, "opset": OPSET, "check_max_abs_logit_diff": diff}}
    files = sorted(p for p in out.rglob("*") if p.is_file())
    meta = {
        "format": FORMAT, "task": data.task, "max_len": data.max_len, "tokenizer": kind,
        "label_names": data.label_names, "seed": seed,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.items()},
        "gating": str(cfg["gating"]), "tying": str(cfg["tying"]),
        "gating_state": gating_state, "tying_state": tying_state,
        "metrics": rec.get("metrics") or {}, "status": rec.get("status"),
        "run": None if run_dir is None else str(Path(run_dir).resolve()),
        "trial_id": rec.get("trial_id"), "commit": _commit(),
        **{k: rec[k] for k in ("subtrial", "operating_point") if k in rec},  # a sub-trial ID#k
        **onnx,
        "sha256": {str(p.relative_to(out)): _sha256(p) for p in files},
    }
    (out / "archsearch.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")


# ---------------------------------------------------------------------- load and predict
@dataclass
class Prediction:
    """One row of :meth:`ExportedModel.predict`: ``label`` (class index), ``label_name``,
    ``probabilities`` (one per class, softmax of the logits), ``flops`` (FLOPs executed for
    this row: the analytic count of what ran, at its batch's trimmed length), ``exit_depth``
    (blocks run before the row's output head) and ``regime`` (how its batch ran:
    :data:`archsearch.runtime.REGIMES`)."""

    label: int
    label_name: str | None
    probabilities: list[float]
    flops: float
    exit_depth: int
    regime: str


class Outputs(NamedTuple):
    """:meth:`ExportedModel.predict_ids`' result for ``N`` rows (CPU tensors): ``logits``
    ``N x C`` float32, ``flops`` ``N`` float64 executed FLOPs, ``depth`` ``N`` int64 exit depths
    (blocks), ``regime`` one :data:`archsearch.runtime.REGIMES` name per row."""

    logits: Any
    flops: Any
    depth: Any
    regime: list[str]


class ExportedModel:
    """A model written by :func:`export_trial`, with its gating and tokenizer (use :func:`load`).

    Attributes:
        model: the :class:`~archsearch.models.transformer.Transformer` (eval mode).
        gating, tying: the trial's strategies with their exported state.
        runtime: the :class:`archsearch.runtime.Runtime` that runs its batches (which regime ran
            what: ``runtime.report()``).
        meta: ``archsearch.json``.
    """

    def __init__(self, directory: Path, model, gating, tying, tokenizer, meta: dict, *, adapt: str = "none"):
        from archsearch.runtime import Runtime

        self.directory, self.model, self.gating, self.tying = directory, model, gating, tying
        self.tokenizer, self.meta = tokenizer, meta
        self.max_len = int(meta["max_len"])
        self.label_names = meta.get("label_names")
        self.runtime = Runtime(model, gating, flops_budget=getattr(gating.s, "flops_budget", None),
                               adapt=adapt, seed=int(meta.get("seed", 0)))

    def save_state(self, path: str | Path) -> None:
        """Write the runtime's state (what ``adapt="bandit"`` learned) to ``path`` atomically
        (``torch.save``; :meth:`load_state` reads it back)."""
        import os
        import tempfile

        import torch

        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        os.close(fd)
        torch.save(self.runtime.state_dict(), tmp)
        os.replace(tmp, path)

    def load_state(self, path: str | Path) -> bool:
        """Restore a state :meth:`save_state` wrote (``torch.load(weights_only=True)``); ``False``
        when ``path`` does not exist.

        Raises:
            UserError: the file is unreadable or does not fit this model (names it).
        """
        import torch

        path = Path(path)
        if not path.is_file():
            return False
        try:
            self.runtime.load_state_dict(torch.load(path, weights_only=True))
        except Exception as e:  # a truncated file, another model's state
            raise UserError(f"runtime state unreadable or not this model's ({e.__class__.__name__})",
                            file=str(path)) from None
        return True

    @property
    def device(self):
        return next(self.model.parameters()).device

    def to(self, device) -> "ExportedModel":
        """Move the model and the gating's modules to ``device`` (the runtime's regime choices,
        timed on the old device, are forgotten); returns self."""
        old = self.device
        self.model.to(device)
        for m in self.gating.extra_modules():
            m.to(device)
        if self.device != old:
            self.runtime.reset()
        return self

    def encode(self, texts: Sequence[str]):
        """``texts`` as inputs: ``(input_ids, attention_mask)``, ``N x max_len`` (int64, bool),
        encoded as the trial's data was (:func:`archsearch.data.prepare.pad_encoded`)."""
        from archsearch.data.prepare import pad_encoded

        return pad_encoded(self.tokenizer, self.tokenizer.encode_batch(list(texts)), self.max_len)

    def predict_ids(self, input_ids, attention_mask, *, batch_size: int = 256,
                    regime: str = "auto") -> Outputs:
        """Logits, executed FLOPs, exit depths and regimes of encoded inputs, ``batch_size``
        rows at a time (each batch trimmed of its all-padding columns, as the trial was
        evaluated).

        Args:
            input_ids, attention_mask: ``N x T`` int64 ids and bool mask (:meth:`encode`).
            batch_size: rows per forward pass.
            regime: ``"auto"`` (the :class:`~archsearch.runtime.Runtime` chooses per rows and
                length by timing), or ``"cascade"`` (the trial's own inference: the predictions
                its recorded metrics were measured with), ``"static"`` or ``"full"``.

        Raises:
            ValueError: an unknown ``regime``, or one this model cannot run.
        """
        import torch

        from archsearch.models.config import trim_padding

        dev = self.device
        logits, flops, depth, regimes = [], [], [], []
        self.model.eval()
        with torch.inference_mode():
            for i in range(0, len(input_ids), batch_size):
                x, m = trim_padding(input_ids[i:i + batch_size], attention_mask[i:i + batch_size])
                out = self.runtime.run(x.to(dev), m.to(dev), regime=regime)
                logits.append(out.logits.float().cpu())
                flops.append(torch.as_tensor(out.flops, dtype=torch.float64).cpu())
                depth.append(torch.as_tensor(out.depth, dtype=torch.long).cpu())
                regimes += [out.regime] * int(x.shape[0])
        if not logits:
            return Outputs(torch.empty(0, len(self.label_names or [])), torch.empty(0, dtype=torch.float64),
                           torch.empty(0, dtype=torch.long), [])
        return Outputs(torch.cat(logits), torch.cat(flops), torch.cat(depth), regimes)

    def predict(self, texts: Sequence[str], *, batch_size: int = 64, device: str | None = None,
                regime: str = "auto") -> list[Prediction]:
        """Classify ``texts``: one :class:`Prediction` per text, in order.

        Args:
            texts: the strings to classify.
            batch_size: rows per forward pass (a dynamic gating decides per row within it).
            device: ``"cpu"``, ``"cuda"``, ...; default: where the model is.
            regime: see :meth:`predict_ids`.

        Raises:
            TypeError: ``texts`` is a single string or holds a non-string.
            ValueError: see :meth:`predict_ids`.
        """
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a sequence of strings")
        if device is not None:
            self.to(device)
        ids, mask = self.encode(texts)
        out = self.predict_ids(ids, mask, batch_size=batch_size, regime=regime)
        probs = out.logits.softmax(-1)
        names = self.label_names
        return [Prediction(label=int(p.argmax()), label_name=names[int(p.argmax())] if names else None,
                           probabilities=[float(v) for v in p], flops=float(f), exit_depth=int(d), regime=r)
                for p, f, d, r in zip(probs, out.flops, out.depth, out.regime)]


def load(directory: str | Path, *, device: str = "cpu", adapt: str = "none") -> ExportedModel:
    """Load a directory written by :func:`export_trial` (``archsearch.load``).

    Args:
        directory: the export.
        device: where the model runs.
        adapt: ``"none"``, ``"dual"`` or ``"bandit"``: the stop rule keeps following the FLOPs
            budget on the traffic (:mod:`archsearch.runtime`; a DHT cascade only).

    Raises:
        UserError: not an export directory; a file missing, truncated or not matching its
            sha256 in ``archsearch.json``; an ``archsearch.json`` of a newer format; ``adapt``
            unknown or not possible for this model (field ``adapt``).
    """
    import torch
    from safetensors.torch import load_file

    from archsearch.data.tokenizer import load_tokenizer
    from archsearch.dynamic import gating_class, tying_class
    from archsearch.models.transformer import Transformer, TransformerConfig

    d = Path(directory)
    meta_file = d / "archsearch.json"
    if not meta_file.is_file():
        raise UserError("not an exported model (no archsearch.json)", file=str(d))
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"unreadable ({e.__class__.__name__}: {e})", file=str(meta_file)) from None
    fmt = meta.get("format") if isinstance(meta, dict) else None
    if not isinstance(fmt, int):
        raise UserError("no format number: not written by archsearch export", file=str(meta_file),
                        field="format")
    if fmt > FORMAT:
        raise UserError(f"format {fmt} is newer than this archsearch reads ({FORMAT}): upgrade "
                        "archsearch", file=str(meta_file), field="format")
    for name, digest in meta.get("sha256", {}).items():
        path = d / name
        if not path.is_file():
            raise UserError("missing (listed in archsearch.json)", file=str(path))
        if _sha256(path) != digest:
            raise UserError("does not match its sha256 in archsearch.json (truncated or changed)",
                            file=str(path))
    cfg_raw = json.loads((d / "config.json").read_text())
    fields = TransformerConfig.__dataclass_fields__
    # on the device before re-tying: frozen aliases view the memory they are made on, and a later
    # Module.to would give them memory of their own (an untied model on a GPU)
    model = Transformer(TransformerConfig(**{k: v for k, v in cfg_raw.items() if k in fields})).to(torch.device(device))
    cfg = dict(meta["config"])
    cfg.pop("distill_teacher", None)  # training-time only: the teacher is not exported
    settings = {"seed": int(meta.get("seed", 0)), "device": device}
    gating = gating_class(meta["gating"])(model, cfg, settings, loop=None)
    tying = tying_class(meta["tying"])(model, cfg, settings, loop=None)
    extra = load_file(str(d / "gating.safetensors")) if (d / "gating.safetensors").is_file() else {}
    tying.load_state_dict(unpack_state(meta["tying_state"], extra))  # re-ties before the weights
    model.load_state_dict(load_file(str(d / "model.safetensors")))
    gating.load_state_dict(unpack_state(meta["gating_state"], extra))
    if meta.get("operating_point") is not None:  # a sub-trial ID#k: its point of the anytime curve
        try:
            gating.set_operating_point(meta["operating_point"])
        except ValueError as e:
            raise UserError(str(e), file=str(meta_file), field="operating_point") from None
    tok_dir = d / "tokenizer"
    kind = meta["tokenizer"]
    tokenizer = load_tokenizer(kind, tok_dir if kind == "pretrained" else tok_dir / "tokenizer.json")
    try:
        out = ExportedModel(d, model.eval(), gating, tying, tokenizer, meta, adapt=adapt)
    except ValueError as e:  # an adapt this model cannot run
        raise UserError(str(e), file=str(d), field="adapt") from None
    return out.to(torch.device(device))


def read_texts(path: str | Path, text_column: str | None = None) -> list[str]:
    """The texts of a file to classify, in row order: ``.csv``, ``.tsv``, ``.jsonl``/``.json``
    (records) or ``.parquet``; the column ``text_column``, else the first of
    :data:`archsearch.data.standardise.TEXT_CANDIDATES` (any case), else the only string column.

    Raises:
        UserError: missing or unreadable file, unknown format, no such column (the message lists
            the file's columns), an empty or non-string text (field ``--text-column``).
    """
    import pandas as pd

    from archsearch.data.standardise import TEXT_CANDIDATES

    p = Path(path)
    if not p.is_file():
        raise UserError("no such file", file=str(p))
    readers = {".csv": lambda: pd.read_csv(p, keep_default_na=False),
               ".tsv": lambda: pd.read_csv(p, sep="\t", keep_default_na=False),
               ".jsonl": lambda: pd.read_json(p, lines=True), ".parquet": lambda: pd.read_parquet(p),
               ".json": lambda: pd.read_json(p, lines=p.read_text()[:1] != "[")}
    if p.suffix.lower() not in readers:
        raise UserError(f"unknown format {p.suffix!r} (use .csv, .tsv, .jsonl, .json or .parquet)",
                        file=str(p))
    try:
        df = readers[p.suffix.lower()]()
    except Exception as e:  # pandas raises many kinds for a malformed file
        raise UserError(f"unreadable ({e.__class__.__name__}: {' '.join(str(e).split())[:200]})",
                        file=str(p)) from None
    cols = [str(c) for c in df.columns]
    if text_column is not None:
        col = text_column if text_column in cols else None
    else:
        lower = {c.lower(): c for c in cols}
        col = next((lower[c] for c in TEXT_CANDIDATES if c in lower), None)
        if col is None:
            strings = [c for c in cols if df[c].map(lambda v: isinstance(v, str)).all()]
            col = strings[0] if len(strings) == 1 else None
    if col is None:
        raise UserError(f"no text column {text_column or ''} (columns: {', '.join(cols) or 'none'}); "
                        "name it with --text-column", file=str(p), field="--text-column")
    texts = df[col].tolist()
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()), None)
    if bad is not None:
        raise UserError(f"row {bad + 1}: column {col!r} is empty or not text", file=str(p),
                        field="--text-column")
    return texts


def predict_file(model_dir: str | Path, data: str | Path, out: str | Path, *,
                 text_column: str | None = None, batch_size: int = 64, device: str = "cpu",
                 regime: str = "auto", adapt: str = "none", state: str | Path | None = None) -> dict[str, Any]:
    """``archsearch predict``: classify every row of ``data`` with the model at ``model_dir``
    and write ``out`` (CSV: ``row, label, label_name, p_<class>..., flops, exit_depth, regime``;
    written only when every row was predicted).

    Returns:
        ``rows``, ``seconds``, ``rows_per_s``, ``mean_flops`` (executed FLOPs per row),
        ``mean_flops_fraction`` (executed / the full model's at the same lengths),
        ``exit_histogram`` (``{depth: rows}``), ``regimes`` (``{regime: rows}``),
        ``runtime`` (:meth:`archsearch.runtime.Runtime.report`), ``label_counts``,
        ``flops_budget`` (the trial's, or ``None``) and, with ``adapt="bandit"``,
        ``explored_share`` when adapting; ``state`` (a file) is read before and written after then.

    Raises:
        UserError: see :func:`load` and :func:`read_texts`.
        ValueError: see :meth:`ExportedModel.predict_ids` (``regime``).
    """
    import time
    from collections import Counter

    import pandas as pd
    from rich.progress import Progress

    from archsearch.models import costs
    from archsearch.models.config import trim_padding
    from archsearch.runs import atomic_write

    texts = read_texts(data, text_column)
    model = load(model_dir, device=device, adapt=adapt)
    if state is not None and adapt != "none":
        model.load_state(state)
    names = model.label_names or [str(i) for i in range(model.model.config.n_classes)]
    rows, executed, full = [], 0.0, 0.0
    t0 = time.perf_counter()
    with Progress(transient=True) as bar:
        task = bar.add_task("predict", total=len(texts))
        for i in range(0, len(texts), batch_size):
            ids, mask = model.encode(texts[i:i + batch_size])
            res = model.predict_ids(ids, mask, batch_size=batch_size, regime=regime)
            t = trim_padding(ids, mask)[0].shape[1]
            full += costs.flops_per_sample(model.model.config, t) * len(ids)
            executed += float(res.flops.sum())
            for p, f, d, r in zip(res.logits.softmax(-1), res.flops, res.depth, res.regime):
                k = int(p.argmax())
                rows.append({"row": len(rows), "label": k, "label_name": names[k],
                             **{f"p_{n}": float(v) for n, v in zip(names, p)}, "flops": float(f),
                             "exit_depth": int(d), "regime": r})
            bar.advance(task, len(ids))
    seconds = time.perf_counter() - t0
    atomic_write(out, pd.DataFrame(rows).to_csv(index=False))
    if state is not None and adapt != "none":
        model.save_state(state)
    ad = model.runtime.adapter
    counts = pd.Series([r["label_name"] for r in rows]).value_counts()
    return {"rows": len(rows), "seconds": seconds, "rows_per_s": len(rows) / max(seconds, 1e-9),
            "mean_flops": executed / max(len(rows), 1), "mean_flops_fraction": executed / max(full, 1e-9),
            "exit_histogram": dict(sorted(Counter(r["exit_depth"] for r in rows).items())),
            "regimes": dict(Counter(r["regime"] for r in rows)), "runtime": model.runtime.report(),
            "label_counts": {str(k): int(v) for k, v in counts.items()},
            "flops_budget": model.runtime.flops_budget,
            **({} if ad is None else {"explored_share": ad.explored / max(ad.rows, 1)})}
