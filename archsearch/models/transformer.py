"""One readable transformer (pre-LN; post-LN for BERT-style checkpoints): config, attention
with real head gating, block, heads.

Everything the search varies is in :class:`TransformerConfig`; :class:`Transformer` builds
either a sequence classifier (mean pooling over non-pad tokens) or a causal language model
(output projection tied to the token embedding).

Two features exist for the dynamic inner loop (``archsearch/dynamic``) and are therefore real
compute savings, not masks:

* **Early exit**: ``forward(..., n_layers=k)`` runs only the first ``k`` blocks; the final
  LayerNorm (pre-LN only; post-LN blocks end in their own) and the output head read the hidden
  state after block ``k``.
* **Head gating**: ``heads_per_layer`` / ``MultiHeadAttention.forward(..., heads=...)`` compute
  only the selected heads by *slicing* the rows of the Q/K/V weights and the columns of the O
  weight. Unselected heads cost nothing, and ``scaled_dot_product_attention`` still runs
  (multiplying attention probabilities by a zero mask would force slow eager attention and save
  no time; see transformers' ``modeling_bert.py`` head_mask).

Shapes: ``B`` batch, ``T`` sequence length, ``d`` = d_model, ``H`` heads computed,
``dh`` = d_model // n_heads, ``V`` vocabulary size, ``C`` classes.

Sources: nanoGPT ``model.py`` (layout, init, weight tying); Xiong et al. 2020, "On Layer
Normalization in the Transformer Architecture" (pre-LN); Devlin et al. 2019 / transformers'
``modeling_bert.py`` (post-LN, ``norm_position="post"``, used by ``init_from`` checkpoints).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Task = Literal["classification", "lm"]
AttentionImpl = Literal["sdpa", "math"]

_TASKS = ("classification", "lm")
_POOLINGS = ("mean",)
_ATTENTION_IMPLS = ("sdpa", "math")
_ACTIVATIONS = ("gelu", "gelu_tanh", "relu")


@dataclass
class TransformerConfig:
    """Everything that defines a :class:`Transformer`.

    Args:
        vocab_size: number of token ids (``V``).
        max_len: longest sequence the position embedding covers (tokens).
        n_layers: number of transformer blocks.
        d_model: hidden width ``d``.
        n_heads: attention heads per block; must divide ``d_model``.
        d_ffn: hidden width of the feed-forward network.
        dropout: dropout probability (embeddings, attention probabilities, residual branches).
        task: ``"classification"`` (logits ``B x C``) or ``"lm"`` (causal LM, logits ``B x T x V``).
        n_classes: number of classes ``C`` (classification only; at least 2).
        pad_id: padding token id; for classification, when no ``attention_mask`` is passed,
            tokens equal to ``pad_id`` are masked out of attention and pooling.
        layer_norm_eps: epsilon of every LayerNorm.
        pooling: how the classifier reduces ``T`` tokens to one vector; only ``"mean"`` (mean
            over non-pad tokens).
        attention_impl: ``"sdpa"`` (``torch.nn.functional.scaled_dot_product_attention``) or
            ``"math"`` (explicit matmul + softmax; same result, slower, but visible to
            ``FlopCounterMode``, which counts 0 FLOPs for SDPA on CPU).
        norm_position: ``"pre"`` (default: ``x + f(LN(x))``, final LayerNorm before the head)
            or ``"post"`` (BERT: ``LN(x + f(x))``, no final LayerNorm).
        embedding_norm: LayerNorm on the embeddings (BERT); default off.
        type_vocab_size: number of token-type embeddings (BERT segment ids; 0 = none). Only
            type 0 is used: single-segment inputs.
        activation: the feed-forward nonlinearity: ``"gelu"`` (default, exact erf GELU,
            transformers' ``"gelu"``), ``"gelu_tanh"`` (tanh approximation, transformers'
            ``"gelu_new"`` / ``"gelu_pytorch_tanh"``) or ``"relu"``.

    Raises:
        ValueError: on any invalid value (non-positive sizes, ``d_model % n_heads != 0``,
            dropout outside [0, 1), unknown task / pooling / attention_impl / activation,
            ``pad_id`` outside the vocabulary, ``n_classes < 2`` for classification).
    """

    vocab_size: int
    max_len: int
    n_layers: int
    d_model: int
    n_heads: int
    d_ffn: int
    dropout: float = 0.1
    task: Task = "classification"
    n_classes: int = 2
    pad_id: int = 0
    layer_norm_eps: float = 1e-5
    pooling: Literal["mean"] = "mean"
    attention_impl: AttentionImpl = "sdpa"
    norm_position: Literal["pre", "post"] = "pre"
    embedding_norm: bool = False
    type_vocab_size: int = 0
    activation: Literal["gelu", "gelu_tanh", "relu"] = "gelu"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "n_layers", "d_model", "n_heads", "d_ffn", "n_classes", "pad_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
        for name in ("vocab_size", "max_len", "n_layers", "d_model", "n_heads", "d_ffn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.task not in _TASKS:
            raise ValueError(f"task must be one of {_TASKS}, got {self.task!r}")
        if self.task == "classification" and self.n_classes < 2:
            raise ValueError(f"n_classes must be >= 2 for classification, got {self.n_classes}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"pad_id must be in [0, vocab_size={self.vocab_size}), got {self.pad_id}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        if self.pooling not in _POOLINGS:
            raise ValueError(f"pooling must be one of {_POOLINGS}, got {self.pooling!r}")
        if self.norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', got {self.norm_position!r}")
        if isinstance(self.type_vocab_size, bool) or not isinstance(self.type_vocab_size, int) \
                or self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be an int >= 0, got {self.type_vocab_size!r}")
        if self.attention_impl not in _ATTENTION_IMPLS:
            raise ValueError(
                f"attention_impl must be one of {_ATTENTION_IMPLS}, got {self.attention_impl!r}"
            )
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {self.activation!r}")

    @property
    def d_head(self) -> int:
        """Width of one attention head, ``d_model // n_heads``."""
        return self.d_model // self.n_heads


def _head_selector(heads: Sequence[int] | None, n_heads: int) -> slice | list[int]:
    """Turn a head selection into an index over the head axis.

    Returns a ``slice`` when the heads are consecutive and increasing (weights are then views,
    nothing is copied), else a list of head indices (weights are gathered).

    Raises:
        ValueError: a head index outside ``[0, n_heads)`` or repeated.
    """
    if heads is None:
        return slice(0, n_heads)
    heads = [int(h) for h in heads]
    if len(set(heads)) != len(heads):
        raise ValueError(f"heads must not repeat, got {heads}")
    for h in heads:
        if not 0 <= h < n_heads:
            raise ValueError(f"head index {h} out of range [0, {n_heads})")
    if heads and heads == list(range(heads[0], heads[0] + len(heads))):
        return slice(heads[0], heads[0] + len(heads))
    return heads


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with separate Q/K/V/O projections and head slicing.

    ``attention_impl`` is read from the config at construction and may be changed on the
    instance afterwards (``costs.count_flops_torch`` switches it to ``"math"`` temporarily).
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        d = config.d_model
        self.n_heads = config.n_heads
        self.d_head = config.d_head
        self.causal = config.task == "lm"
        self.attention_impl: AttentionImpl = config.attention_impl
        self.dropout_p = float(config.dropout)
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.attn_dropout = nn.Dropout(config.dropout)  # math path only; SDPA has dropout_p
        self.resid_dropout = nn.Dropout(config.dropout)

    def _project(self, lin: nn.Linear, x: torch.Tensor, sel: slice | list[int]) -> torch.Tensor:
        """Apply only the rows of ``lin`` that belong to the selected heads.

        ``x``: ``B x T x d`` -> ``B x H x T x dh``.
        """
        B, T, _ = x.shape
        w = lin.weight.view(self.n_heads, self.d_head, -1)[sel]  # (H, dh, d)
        b = lin.bias.view(self.n_heads, self.d_head)[sel]  # (H, dh)
        H = w.shape[0]
        y = F.linear(x, w.reshape(H * self.d_head, -1), b.reshape(H * self.d_head))  # (B, T, H*dh)
        return y.view(B, T, H, self.d_head).transpose(1, 2)  # (B, H, T, dh)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        heads: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Self-attention over ``x``, computing only the selected heads.

        Args:
            x: ``B x T x d`` input (already layer-normalised by the block).
            attn_mask: boolean mask broadcastable to ``B x H x T x T``, ``True`` = may attend,
                or ``None``. When ``None`` and the model is a causal LM, causal masking is
                applied (``is_causal``); when given, it must already contain causality.
            heads: indices of the heads to compute (``None`` = all). Unselected heads are not
                computed: their Q/K/V weight rows and O weight columns are sliced away. The
                result equals the full layer with the unselected heads' outputs zeroed before
                the O projection. An empty selection returns the O bias.

        Returns:
            ``B x T x d`` tensor.

        Raises:
            ValueError: a head index out of range or repeated.
        """
        B, T, d = x.shape
        sel = _head_selector(heads, self.n_heads)
        if isinstance(sel, list) and not sel:
            return self.resid_dropout(self.o.bias.expand(B, T, d).clone())  # (B, T, d)
        q = self._project(self.q, x, sel)  # (B, H, T, dh)
        k = self._project(self.k, x, sel)  # (B, H, T, dh)
        v = self._project(self.v, x, sel)  # (B, H, T, dh)
        H = q.shape[1]
        is_causal = self.causal and attn_mask is None
        if self.attention_impl == "sdpa":
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                dropout_p=self.dropout_p if self.training else 0.0,
            )  # (B, H, T, dh)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d_head))  # (B, H, T, T)
            if is_causal:
                attn_mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # (T, T)
            if attn_mask is not None:
                att = att.masked_fill(~attn_mask, float("-inf"))  # (B, H, T, T)
            att = self.attn_dropout(F.softmax(att, dim=-1))  # (B, H, T, T)
            y = att @ v  # (B, H, T, dh)
        y = y.transpose(1, 2).reshape(B, T, H * self.d_head)  # (B, T, H*dh)
        w_o = self.o.weight.view(d, self.n_heads, self.d_head)[:, sel]  # (d, H, dh)
        y = F.linear(y, w_o.reshape(d, H * self.d_head), self.o.bias)  # (B, T, d)
        return self.resid_dropout(y)


class FeedForward(nn.Module):
    """Position-wise MLP: Linear(d, d_ffn) -> GELU (``config.activation``) -> Linear(d_ffn, d)
    -> dropout."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.d_ffn)
        self.fc2 = nn.Linear(config.d_ffn, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.activation = config.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``B x T x d`` -> ``B x T x d``."""
        h = self.fc1(x)  # (B, T, d_ffn)
        if self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "gelu_tanh":
            h = F.gelu(h, approximate="tanh")
        else:
            h = F.relu(h)
        return self.dropout(self.fc2(h))  # (B, T, d)


class Block(nn.Module):
    """Pre-LN transformer block: ``x + MHA(LN(x))``, then ``x + FFN(LN(x))``.

    With ``norm_position="post"`` (BERT): ``LN1(x + MHA(x))``, then ``LN2(x + FFN(x))``.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.post_norm = config.norm_position == "post"
        self.ln1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.attn = MultiHeadAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        heads: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """``B x T x d`` -> ``B x T x d``; ``mask`` and ``heads`` as in :class:`MultiHeadAttention`."""
        if self.post_norm:
            x = self.ln1(x + self.attn(x, mask, heads))  # (B, T, d)
            return self.ln2(x + self.ffn(x))  # (B, T, d)
        x = x + self.attn(self.ln1(x), mask, heads)  # (B, T, d)
        x = x + self.ffn(self.ln2(x))  # (B, T, d)
        return x


class Transformer(nn.Module):
    """Transformer encoder classifier or causal language model (pre-LN, or post-LN with
    ``norm_position="post"``).

    Layout: token + learned position embeddings -> dropout -> ``n_layers`` blocks -> final
    LayerNorm (an identity for post-LN) -> output head. Classification: mean over non-pad
    tokens -> Linear(d, C).
    LM: Linear(d, V, bias=False) whose weight *is* the token embedding (tied).

    The forward pass is also available in pieces for the dynamic inner loop:
    ``padding_mask`` -> ``embed`` -> ``run_layers`` (any ``[start, stop)`` range, any head
    subsets) -> ``head_logits``; ``forward`` is exactly that composition.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_len, config.d_model)
        self.emb_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        if config.norm_position == "post":
            self.ln_f = nn.Identity()  # post-LN blocks already end in a LayerNorm
        if config.type_vocab_size:
            self.type_emb = nn.Embedding(config.type_vocab_size, config.d_model)
        if config.embedding_norm:
            self.emb_ln = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        if config.task == "classification":
            self.head = nn.Linear(config.d_model, config.n_classes)
        else:
            self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        # GPT-2 / nanoGPT: scale residual output projections by 1/sqrt(2 * n_layers).
        std_resid = 0.02 / math.sqrt(2 * config.n_layers)
        for block in self.blocks:
            nn.init.normal_(block.attn.o.weight, mean=0.0, std=std_resid)
            nn.init.normal_(block.ffn.fc2.weight, mean=0.0, std=std_resid)
        if config.task == "lm":
            self.head.weight = self.tok_emb.weight  # weight tying (after init: one Parameter)
        self.exit_heads: nn.ModuleDict | None = None  # per-exit classifiers: add_exit_heads

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # -- pieces of the forward pass ------------------------------------------------------------

    def padding_mask(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Boolean ``B x T`` mask of real (non-pad) tokens, or ``None`` for "no padding".

        Args:
            input_ids: ``B x T`` token ids.
            attention_mask: ``B x T``, nonzero / ``True`` = real token. When ``None``:
                classification derives it from ``input_ids != pad_id``; the LM uses no padding
                mask (causal attention already keeps right-padding away from earlier tokens;
                ignore pad targets in the loss).

        Raises:
            ValueError: ``attention_mask`` shape differs from ``input_ids``.
        """
        if attention_mask is None:
            if self.config.task == "classification":
                return input_ids != self.config.pad_id  # (B, T)
            return None
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                f"{tuple(input_ids.shape)}"
            )
        return attention_mask.bool()  # (B, T)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token + position embeddings (+ dropout): ``B x T`` ids -> ``B x T x d``. Positions
        count from column 0, so sequences must be right-padded (as :mod:`archsearch.data` pads
        them); a left-padded row would get shifted positions.

        Raises:
            ValueError: ``input_ids`` not 2-D, or ``T > max_len``.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be B x T, got shape {tuple(input_ids.shape)}")
        T = input_ids.shape[1]
        if T > self.config.max_len:
            raise ValueError(f"sequence length {T} exceeds max_len {self.config.max_len}")
        pos = torch.arange(T, device=input_ids.device)  # (T,): right padding assumed (as the data pads)
        x = self.tok_emb(input_ids) + self.pos_emb(pos)  # (B, T, d)
        if self.config.type_vocab_size:
            x = x + self.type_emb.weight[0]  # (B, T, d): single segment, token type 0
        if self.config.embedding_norm:
            x = self.emb_ln(x)  # (B, T, d)
        return self.emb_dropout(x)

    def _attn_mask(self, pad_mask: torch.Tensor | None, T: int) -> torch.Tensor | None:
        """Boolean attention mask for the blocks from a ``B x T`` padding mask.

        Encoder: key-padding mask ``B x 1 x 1 x T``; a sequence with no real token attends to
        everything (its pooled output is then the head bias) so no row is fully masked (NaN).
        LM: ``None`` (pure causal, handled by ``is_causal``) or causal AND key padding,
        ``B x 1 x T x T``, with the diagonal always allowed so no row is fully masked.
        """
        if pad_mask is None:
            return None
        if self.config.task == "classification":
            keys = pad_mask | ~pad_mask.any(dim=1, keepdim=True)  # (B, T)
            return keys[:, None, None, :]  # (B, 1, 1, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=pad_mask.device).tril()  # (T, T)
        eye = torch.eye(T, dtype=torch.bool, device=pad_mask.device)  # (T, T)
        return (causal & pad_mask[:, None, None, :]) | eye  # (B, 1, T, T)

    def run_layers(
        self,
        x: torch.Tensor,
        pad_mask: torch.Tensor | None,
        start: int = 0,
        stop: int | None = None,
        heads_per_layer: Sequence[Sequence[int] | None] | None = None,
    ) -> torch.Tensor:
        """Run blocks ``start .. stop-1`` on hidden states ``x``.

        Args:
            x: ``B x T x d`` hidden states (output of ``embed`` or of an earlier ``run_layers``).
            pad_mask: ``B x T`` boolean from :meth:`padding_mask`, or ``None``.
            start: first block to run (0-based).
            stop: one past the last block to run; ``None`` = ``n_layers``.
            heads_per_layer: one entry per block run (``stop - start`` entries), each a sequence
                of head indices to compute or ``None`` for all heads; ``None`` = all heads
                everywhere.

        Returns:
            ``B x T x d`` hidden states after block ``stop - 1``.

        Raises:
            ValueError: bad ``start``/``stop``, wrong ``heads_per_layer`` length, bad head index.
        """
        n = self.config.n_layers
        stop = n if stop is None else stop
        if not 0 <= start <= stop <= n:
            raise ValueError(f"need 0 <= start <= stop <= n_layers={n}, got start={start}, stop={stop}")
        if heads_per_layer is not None and len(heads_per_layer) != stop - start:
            raise ValueError(
                f"heads_per_layer has {len(heads_per_layer)} entries, expected one per executed "
                f"layer ({stop - start})"
            )
        mask = self._attn_mask(pad_mask, x.shape[1])
        for i in range(start, stop):
            heads = None if heads_per_layer is None else heads_per_layer[i - start]
            x = self.blocks[i](x, mask, heads)  # (B, T, d)
        return x

    def pool(self, x: torch.Tensor, pad_mask: torch.Tensor | None) -> torch.Tensor:
        """Mean over real tokens: ``B x T x d`` -> ``B x d`` (a sequence of only pads -> 0);
        also ``K x B x T x d`` -> ``K x B x d`` (K exits' states, one ``B x T`` mask)."""
        if pad_mask is None:
            return x.mean(dim=-2)  # (B, d)
        m = pad_mask.to(x.dtype).unsqueeze(-1)  # (B, T, 1)
        return (x * m).sum(dim=-2) / m.sum(dim=-2).clamp(min=1.0)  # (B, d)

    def add_exit_heads(self, depths: Iterable[int]) -> None:
        """Give each classification exit its own output head: an internal classifier per exit
        (PABEE, Zhou et al. 2020, "BERT Loses Patience", section 3; DeeBERT's off-ramps, Xin et
        al. 2020), one ``Linear(d, C)`` for every depth in ``depths`` below ``n_layers``,
        initialised like :attr:`head`; the deepest exit keeps :attr:`head`. A head shared by
        all exits has to read pooled states of every depth with one linear map (measured on
        MiniLM-L6 / Rotten Tomatoes: exit 1 at 0.61 test accuracy against 0.72 for a 1-layer
        static cut). :meth:`head_logits` with ``depth`` reads them. No-op for LM (the tied
        vocabulary head stays shared; an untied ``V x d`` head per exit would outweigh the model).

        Raises:
            ValueError: a depth outside ``[0, n_layers]``.
        """
        if self.config.task != "classification":
            return
        heads = {}
        for k in sorted({int(d) for d in depths}):
            if not 0 <= k <= self.config.n_layers:
                raise ValueError(f"exit depth {k} outside [0, n_layers={self.config.n_layers}]")
            if k < self.config.n_layers:
                lin = nn.Linear(self.config.d_model, self.config.n_classes)
                self._init_weights(lin)
                heads[str(k)] = lin.to(self.head.weight.device)
        self.exit_heads = nn.ModuleDict(heads)

    def _exit_head(self, depth: int | None) -> nn.Module:
        """The output head of the exit after ``depth`` blocks: its own (:meth:`add_exit_heads`)
        when there is one, else :attr:`head` (also for ``depth=None``)."""
        if depth is not None and self.exit_heads is not None and str(int(depth)) in self.exit_heads:
            return self.exit_heads[str(int(depth))]
        return self.head

    def head_logits(self, x: torch.Tensor, pad_mask: torch.Tensor | None,
                    depth: int | None = None) -> torch.Tensor:
        """Final LayerNorm (identity for post-LN) + output head on hidden states ``x``
        (``B x T x d``) after ``depth`` blocks: that exit's own head when :meth:`add_exit_heads`
        made one, else :attr:`head` (``depth=None``: :attr:`head`).

        Returns:
            classification: ``B x C`` float32 logits (under autocast too); LM: ``B x T x V``
            logits.
        """
        head = self._exit_head(depth)
        x = self.ln_f(x)  # (B, T, d)
        if self.config.task == "classification":
            pooled = self.pool(x, pad_mask)  # (B, d)
            # float32 even under autocast: bf16 logits take so few values that the exits'
            # confidences tie across rows and a calibrated FLOPs budget lands a step away (on
            # an H100, confidence_exit's 0.5 landed at 0.43); a B x d x C product costs nothing
            with torch.autocast(pooled.device.type, enabled=False):
                return head(pooled.float())  # (B, C)
        return head(x)  # (B, T, V)

    def exits_logits(self, hs: Sequence[torch.Tensor], pad_mask: torch.Tensor | None,
                     depths: Sequence[int]) -> torch.Tensor:
        """Classification logits of ``K`` exits at once: :meth:`head_logits` of each hidden
        state ``hs[k]`` (``B x T x d``, after ``depths[k]`` blocks) with its exit's head, as one
        stacked LayerNorm, pooling and batched matrix product (a few kernels instead of a dozen
        per exit: on a GPU's launch-bound training steps the exits cost launches; issue 35).
        The same values as :meth:`head_logits` up to float rounding.

        Returns:
            ``K x B x C`` float32 logits.

        Raises:
            ValueError: an LM (its exits read the tied vocabulary head per token: use
                :meth:`head_logits`) or ``len(hs) != len(depths)``.
        """
        if self.config.task != "classification" or len(hs) != len(depths):
            raise ValueError("exits_logits: classification only, one depth per hidden state")
        heads = [self._exit_head(d) for d in depths]
        pooled = self.pool(self.ln_f(torch.stack(list(hs))), pad_mask)  # (K, B, d)
        with torch.autocast(pooled.device.type, enabled=False):  # float32, as head_logits
            w = torch.stack([h.weight for h in heads]).float()  # (K, C, d)
            b = torch.stack([h.bias for h in heads]).float()  # (K, C)
            return torch.baddbmm(b.unsqueeze(1), pooled.float(), w.transpose(1, 2))  # (K, B, C)

    # -- the whole thing -----------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        n_layers: int | None = None,
        heads_per_layer: Sequence[Sequence[int] | None] | None = None,
    ) -> torch.Tensor:
        """Logits for a batch, optionally with early exit and head subsets.

        Args:
            input_ids: ``B x T`` int64 token ids, ``T <= max_len``.
            attention_mask: ``B x T``, nonzero = real token (see :meth:`padding_mask` for the
                default).
            n_layers: run only the first ``n_layers`` blocks (early exit, ``0..config.n_layers``);
                the head reads the hidden state after that block. ``None`` = all blocks.
            heads_per_layer: one entry per executed block: head indices to compute, or ``None``
                for all heads.

        Returns:
            classification: ``B x C`` logits; LM: ``B x T x V`` logits (position ``t`` predicts
            token ``t + 1``).

        Raises:
            ValueError: bad shapes, ``T > max_len``, ``n_layers`` out of range, bad heads.
        """
        pad_mask = self.padding_mask(input_ids, attention_mask)  # (B, T) or None
        x = self.embed(input_ids)  # (B, T, d)
        x = self.run_layers(x, pad_mask, 0, n_layers, heads_per_layer)  # (B, T, d)
        return self.head_logits(x, pad_mask, depth=n_layers)  # (B, C) or (B, T, V)
