"""archsearch's static classifier as a Hugging Face ``transformers`` model, in one file.

``archsearch export`` copies this file into the directory of a **static** trial (no per-sample
gating) as ``modeling_archsearch.py`` and points ``config.json``'s ``auto_map`` at it, so that::

    from transformers import AutoModelForSequenceClassification
    model = AutoModelForSequenceClassification.from_pretrained(DIR, trust_remote_code=True)
    logits = model(input_ids=ids, attention_mask=mask).logits    # B x C

loads the trial's ``model.safetensors`` and gives the logits archsearch's
:class:`archsearch.models.transformer.Transformer` gives, **without archsearch installed**:
this file imports only torch and transformers (``tests/test_export.py`` runs it in a Python
that cannot import archsearch). ``trust_remote_code=True`` runs this file from the directory:
read it first, as for any model with custom code.

The architecture is archsearch's, not BERT's (so no ``BertForSequenceClassification``): token +
learned position embeddings (+ one token-type row and a LayerNorm for checkpoints fine-tuned
from BERT-style encoders), ``n_layers`` blocks with separate Q/K/V/O projections, pre-LN
(``x + f(LN(x))``, a final LayerNorm) or post-LN (``LN(x + f(x))``, BERT), GELU (exact or tanh)
or ReLU feed-forward, then the **mean over real tokens** and one ``Linear(d, C)``. Inputs are
right-padded ids (``attention_mask`` 1 = real token), as archsearch's tokenization writes them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput


class ArchsearchConfig(PretrainedConfig):
    """The shape of archsearch's Transformer (its ``TransformerConfig`` fields)."""

    model_type = "archsearch-transformer"

    def __init__(self, vocab_size: int = 1000, max_len: int = 64, n_layers: int = 2, d_model: int = 64,
                 n_heads: int = 2, d_ffn: int = 256, n_classes: int = 2, pad_id: int = 0,
                 layer_norm_eps: float = 1e-5, norm_position: str = "pre", embedding_norm: bool = False,
                 type_vocab_size: int = 0, activation: str = "gelu", **kwargs):
        kwargs.setdefault("num_labels", n_classes)
        super().__init__(pad_token_id=pad_id, **kwargs)
        self.vocab_size, self.max_len, self.n_layers = vocab_size, max_len, n_layers
        self.d_model, self.n_heads, self.d_ffn, self.n_classes = d_model, n_heads, d_ffn, n_classes
        self.pad_id, self.layer_norm_eps, self.norm_position = pad_id, layer_norm_eps, norm_position
        self.embedding_norm, self.type_vocab_size, self.activation = embedding_norm, type_vocab_size, activation


class _Attention(nn.Module):
    def __init__(self, c: ArchsearchConfig):
        super().__init__()
        self.n_heads, self.d_head = c.n_heads, c.d_model // c.n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(c.d_model, c.d_model) for _ in range(4))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = (p(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, dh)
        return self.o(y.transpose(1, 2).reshape(B, T, d))  # (B, T, d)


class _FeedForward(nn.Module):
    def __init__(self, c: ArchsearchConfig):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c.d_model, c.d_ffn), nn.Linear(c.d_ffn, c.d_model)
        self.activation = c.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h = (F.gelu(h) if self.activation == "gelu" else
             F.gelu(h, approximate="tanh") if self.activation == "gelu_tanh" else F.relu(h))
        return self.fc2(h)


class _Block(nn.Module):
    def __init__(self, c: ArchsearchConfig):
        super().__init__()
        self.post = c.norm_position == "post"
        self.ln1 = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.ln2 = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.attn, self.ffn = _Attention(c), _FeedForward(c)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.post:
            x = self.ln1(x + self.attn(x, mask))
            return self.ln2(x + self.ffn(x))
        x = x + self.attn(self.ln1(x), mask)
        return x + self.ffn(self.ln2(x))


class ArchsearchForSequenceClassification(PreTrainedModel):
    """Logits ``B x C`` of right-padded ``input_ids`` ``B x T`` (``T <= max_len``)."""

    config_class = ArchsearchConfig
    base_model_prefix = ""
    _no_split_modules = ["_Block"]

    def __init__(self, config: ArchsearchConfig):
        super().__init__(config)
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = nn.Embedding(c.max_len, c.d_model)
        if c.type_vocab_size:
            self.type_emb = nn.Embedding(c.type_vocab_size, c.d_model)
        if c.embedding_norm:
            self.emb_ln = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.n_layers))
        self.ln_f = nn.Identity() if c.norm_position == "post" else nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.head = nn.Linear(c.d_model, c.n_classes)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:  # only for weights missing from a checkpoint
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **kwargs) -> SequenceClassifierOutput:
        B, T = input_ids.shape
        pad = (input_ids != self.config.pad_id) if attention_mask is None else attention_mask.bool()  # (B, T)
        x = self.tok_emb(input_ids) + self.pos_emb(torch.arange(T, device=input_ids.device))  # (B, T, d)
        if self.config.type_vocab_size:
            x = x + self.type_emb.weight[0]
        if self.config.embedding_norm:
            x = self.emb_ln(x)
        keys = pad | ~pad.any(dim=1, keepdim=True)  # a row of only padding attends to everything
        mask = keys[:, None, None, :]  # (B, 1, 1, T)
        for block in self.blocks:
            x = block(x, mask)
        x = self.ln_f(x)
        m = pad.to(x.dtype).unsqueeze(-1)  # (B, T, 1)
        logits = self.head((x * m).sum(1) / m.sum(1).clamp(min=1.0))  # (B, C)
        loss = None if labels is None else F.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)
