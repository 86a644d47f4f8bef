"""``archsearch export --format onnx``: a static trial's model as ``model.onnx``, checked with
onnxruntime before it is kept.

What it writes: one ONNX file (weights inside it, no external data) holding the trial's
:class:`~archsearch.models.transformer.Transformer` forward pass in eval mode (dropout off), from
token ids to class logits: the embeddings, every block, the final LayerNorm, the mean over real
tokens and the classification head. The tokenizer, the config and the safetensors weights stay
beside it in the export directory (:mod:`archsearch.export`), whose ``archsearch.json`` lists
the file's sha256, so :func:`archsearch.export.load` refuses a changed ``model.onnx``.

The graph::

    inputs   input_ids       int64  B x T   token ids, right-padded (T <= the model's max_len)
             attention_mask  int64  B x T   1 = real token, 0 = padding
    output   logits          float32 B x C

``B`` (``batch``) and ``T`` (``seq``) are dynamic axes: one file serves any batch size and any
length up to ``max_len``. ONNX opset :data:`OPSET` (ai.onnx), exported with ``torch.onnx.export``'s
dynamo exporter (``torch.export`` + onnxscript), which translates the attention's boolean key
mask and ``scaled_dot_product_attention`` exactly.

The check: after writing, onnxruntime (``CPUExecutionProvider``) runs the file on
:data:`CHECK_SHAPES` (batch sizes 1 to 8, lengths 1 to ``max_len``; random ids, random
right-padding, one row of only padding) and its logits are compared with the PyTorch model's on
the same inputs; a largest absolute difference above :data:`ATOL` raises
:class:`OnnxExportError` and the file is removed.

Only static trials are exported (:func:`refusal`): a dynamic gating (DHT, the depth predictor,
the confidence exit, LengthDrop) decides per row at run time which blocks or tokens run, which
one fixed graph does not; a tied trial is refused too, and so is a language model (the graph's
output is a classifier's logits).

torch, onnx and onnxruntime are imported inside the functions: the CLI imports this module's
callers without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from archsearch.errors import UserError

#: the file :func:`write_onnx` writes in an export directory
ONNX_FILE = "model.onnx"
#: the ONNX opset (ai.onnx domain) of the graph
OPSET = 18
#: the largest |logit difference| between onnxruntime and PyTorch the check accepts
ATOL = 1e-4
#: ``(batch, length)`` pairs the check runs; a length above the model's ``max_len`` is cut to it
CHECK_SHAPES = ((1, 1), (1, 512), (3, 7), (8, 512), (5, 2))
#: the names of the graph's inputs and output
INPUT_NAMES, OUTPUT_NAME = ("input_ids", "attention_mask"), "logits"


class OnnxExportError(UserError):
    """The ONNX exporter failed, or onnxruntime's logits differ from PyTorch's by more than
    :data:`ATOL`: not a mistake in the user's input, so exit code 1 (one line, as every
    :class:`~archsearch.errors.UserError`)."""

    exit_code = 1


def refusal(cfg: Mapping[str, Any], task: str) -> str | None:
    """Why a trial cannot be exported as ONNX, or ``None`` when it can (torch-free).

    Args:
        cfg: the trial's config (its ``gating`` and ``tying``; missing: ``static``, ``none``).
        task: the run's task (``classification`` or ``lm``).
    """
    gating, tying = str(cfg.get("gating") or "static"), str(cfg.get("tying") or "none")
    only = "--format onnx exports static trials only (gating static, tying none, classification)"
    if gating != "static":
        return (f"its gating {gating!r} decides per input at run time what runs, which one fixed "
                f"ONNX graph cannot; {only}")
    if tying != "none":
        return f"its tying is {tying!r} (blocks share weights); {only}"
    if task != "classification":
        return f"its task is {task!r}; {only}"
    return None


def check_inputs(vocab_size: int, max_len: int, pad_id: int = 0, shapes=CHECK_SHAPES, seed: int = 0):
    """The check's inputs: for each ``(batch, length)`` of ``shapes`` (length cut to
    ``max_len``), ``(input_ids, attention_mask)`` int64 ``batch x length`` tensors: random ids
    in ``[0, vocab_size)``, each row right-padded to a random number of real tokens (``pad_id``
    under mask 0), the last row of a batch of 3 or more only padding."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for b, t in shapes:
        t = max(1, min(int(t), int(max_len)))
        ids = torch.randint(0, vocab_size, (b, t), generator=g)
        real = torch.randint(1, t + 1, (b,), generator=g)
        real[0] = t  # one row without padding
        if b >= 3:
            real[-1] = 0  # one row of only padding
        mask = (torch.arange(t)[None, :] < real[:, None]).long()
        out.append((ids.masked_fill(mask == 0, pad_id), mask))
    return out


def _session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def onnx_logits(path: str | Path, input_ids, attention_mask, *, session=None):
    """onnxruntime's logits of ``model.onnx`` at ``path`` (``CPUExecutionProvider``).

    Args:
        input_ids: ``B x T`` token ids (tensor or array; cast to int64).
        attention_mask: ``B x T``, nonzero / ``True`` = real token (cast to int64).
        session: an ``onnxruntime.InferenceSession`` of ``path`` to reuse.

    Returns:
        ``B x C`` float32 ``torch.Tensor``.
    """
    import numpy as np
    import torch

    sess = session or _session(Path(path))
    feed = {INPUT_NAMES[0]: np.asarray(torch.as_tensor(input_ids).long().cpu().numpy(), dtype=np.int64),
            INPUT_NAMES[1]: np.asarray(torch.as_tensor(attention_mask).long().cpu().numpy(), dtype=np.int64)}
    return torch.from_numpy(sess.run([OUTPUT_NAME], feed)[0])


def write_onnx(model, path: str | Path, *, atol: float = ATOL, shown: str | Path | None = None) -> float:
    """Write ``model`` (a classification :class:`~archsearch.models.transformer.Transformer`,
    on any device; a CPU float32 copy in eval mode is exported, ``model`` is not changed) to
    ``path`` as ONNX (module docstring: inputs ``input_ids`` / ``attention_mask`` int64
    ``B x T``, output ``logits`` float32 ``B x C``, dynamic ``B`` and ``T``, opset
    :data:`OPSET`), and check it with onnxruntime on :func:`check_inputs` against the PyTorch
    model. The file appears at ``path`` only when the check passes; ``shown`` is the file the
    errors name (default ``path``; export writes into a partial directory first).

    Returns:
        the largest |logit difference| the check measured.

    Raises:
        ValueError: ``model`` is not a classifier (an LM's logits are ``B x T x V``) or has
            exit heads (a dynamic gating's).
        OnnxExportError: the exporter failed, or the difference is above ``atol``.
    """
    import copy
    import logging
    import warnings

    import torch

    if model.config.task != "classification" or getattr(model, "exit_heads", None):
        raise ValueError("write_onnx exports a static classifier (no exit heads)")
    path = Path(path)
    shown = str(shown or path)
    tmp = path.with_name(f".{path.name}.partial")
    net = copy.deepcopy(model).cpu().float().eval()
    cfg = net.config
    example = check_inputs(cfg.vocab_size, cfg.max_len, cfg.pad_id, shapes=((2, min(8, cfg.max_len)),))[0]
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    seq = torch.export.Dim("seq", min=1, max=int(cfg.max_len))
    dims = {name: {0: batch, 1: seq} for name in INPUT_NAMES}
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    try:
        try:
            quiet.setLevel(logging.ERROR)  # "torchvision is not installed" and progress lines
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                torch.onnx.export(net, example, str(tmp), input_names=list(INPUT_NAMES),
                                  output_names=[OUTPUT_NAME], dynamic_shapes=dims, opset_version=OPSET,
                                  dynamo=True, external_data=False, verbose=False)
        except Exception as e:  # the exporter raises many kinds
            raise OnnxExportError(f"the ONNX exporter failed ({e.__class__.__name__}: "
                                  f"{' '.join(str(e).split())[:300]})", file=shown) from None
        finally:
            quiet.setLevel(level)
        diff = check_onnx(tmp, net, atol=atol, name=shown)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return diff


def check_onnx(path: str | Path, model, *, atol: float = ATOL, name: str | Path | None = None) -> float:
    """Run the ONNX file at ``path`` with onnxruntime on :func:`check_inputs` and compare its
    logits (``B x C``) with ``model``'s (the PyTorch :class:`~archsearch.models.transformer.Transformer`,
    run on the CPU in eval mode).

    Returns:
        the largest |logit difference|.

    Raises:
        OnnxExportError: onnxruntime cannot load or run the file, or the difference is above
            ``atol`` (the message names the batch size and length); ``name`` is the file the
            message names (default ``path``).
    """
    import torch

    cfg = model.config
    shown = str(name or path)
    try:
        sess = _session(Path(path))
    except Exception as e:  # onnxruntime's own exception types
        raise OnnxExportError(f"onnxruntime cannot load it ({' '.join(str(e).split())[:300]})",
                              file=shown) from None
    worst = 0.0
    for ids, mask in check_inputs(cfg.vocab_size, cfg.max_len, cfg.pad_id):
        with torch.no_grad():
            want = model(ids, mask).float()
        try:
            got = onnx_logits(path, ids, mask, session=sess)
        except Exception as e:
            raise OnnxExportError(f"onnxruntime failed on a {tuple(ids.shape)} batch "
                                  f"({' '.join(str(e).split())[:300]})", file=shown) from None
        if got.shape != want.shape:
            raise OnnxExportError(f"onnxruntime's logits are {tuple(got.shape)}, PyTorch's "
                                  f"{tuple(want.shape)}", file=shown)
        diff = float((got - want).abs().max())
        if not diff <= atol:  # NaN fails too
            raise OnnxExportError(f"onnxruntime's logits differ from PyTorch's by {diff:.3g} (> {atol:g}) "
                                  f"at batch {ids.shape[0]}, length {ids.shape[1]}: not written", file=shown)
        worst = max(worst, diff)
    return worst
