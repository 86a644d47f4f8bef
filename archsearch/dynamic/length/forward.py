"""Length-Adaptive Transformer: the forward pass with per-layer token dropping, the significance
score, drop-and-restore and the FLOPs of a length configuration (pure functions of a model;
the training and search strategy is :mod:`archsearch.dynamic.length.drop`).

Source: Kim & Cho, "Length-Adaptive Transformer: Train Once with Length Drop, Use Anytime with
Search", ACL 2021, arXiv 2010.07003 (sec. 3: LengthDrop, drop-and-restore; the significance score
is PoWER-BERT's, Goyal et al. 2020). Our specification: the Length-Adaptive section of
docs/design.md.

**Length configuration.** See :mod:`archsearch.dynamic.length.config`: one length per block
in tokens of a full ``max_len`` sequence, scaled to each sequence's real length.

**Padding (classification).** Samples of a batch keep different counts; the batch runs at
``K_i = max_s k_i(s)`` slots per layer, the slots of a sample beyond its ``k_i(s)`` are padding
(masked out of attention keys and pooling). The FLOPs returned per sample are the FLOPs the batch
*executed*, ``(T, K_1, ..., K_L)``, divided evenly over its samples: the same convention as the
static model (``flops_per_sample`` of the padded length the model runs on). Batches with little
padding (e.g. sorted by length) make executed FLOPs approach the real-token FLOPs.

**Which tokens stay (encoder).** As in the paper's code, block ``i`` computes its self-attention
over the ``K_{i-1}`` current tokens with an explicit ``softmax(Q K^T / sqrt(dh)) V`` (the block's
own ``ln1``/``q``/``k``/``v`` modules and weights), scores each token by the attention it
*receives* (probabilities summed over heads and real queries), keeps the top ``k_i`` per sample,
and computes the O projection, the residual and the FFN only for the kept tokens (gathered into a
shorter tensor: really removed, not masked). ``A V`` is computed for all current queries (one
matmul, counted as such) and gathered before the O projection. Blocks that drop nothing run the
model's own :class:`~archsearch.models.transformer.Block`. ``rule="prefix"``
(``length_drop_rule: prefix``) keeps the first tokens instead of the most attended ones. Any
token may be dropped, the first (``[CLS]`` of a BERT checkpoint) too: the paper's code always
keeps it (``always_keep_cls_token``), which matters for a model that pools ``[CLS]``; ours pools
the mean of the kept tokens (below). The significance score's sum over heads and queries is not
counted in :func:`length_config_flops` (``~2 H K^2`` per dropping block: 0.16% of the FLOPs
``torch.utils.flop_counter`` counts for a tiny test model).

**Which tokens stay (causal LM).** Content-based top-k selection would let future tokens decide
which past tokens survive (a query at position ``t' > t`` adds to token ``t``'s score, and the set
that survives is visible to predictions before ``t'``): a leak of the future into perplexity. The
LM therefore keeps an evenly spaced subset of the current positions (always the last one), a rule
that depends on positions only; kept tokens stay in position order, so the model's block runs
them with plain causal attention. Dropping happens before a block: block ``i`` runs on ``k_i``
tokens.

**Classification pools the kept tokens.** The classifier's final LayerNorm and mean pooling read
only the tokens still kept after the last block (per sample, its real kept slots): a dropped
token's earlier state never enters the pooled vector. The kept tokens are gathered into a
shorter ``B x K_L x d`` tensor (no masks over full-length tensors), so the FLOPs saved are
compute really not done.

**Drop-and-restore** (token-level outputs: the LM always; the classifier only with
``restore=True``). A dropped token's vector skips the remaining blocks and is written back at its
position after the last block (the last state it had), so the final LayerNorm and the head see
every position: the LM predicts every next token.

Shapes: ``B`` batch, ``T`` padded length, ``K`` current slots, ``d`` d_model, ``H`` heads,
``dh`` head width, ``C`` classes, ``V`` vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import get_args

import torch
import torch.nn.functional as F

from archsearch.dynamic.length.config import MIN_TOKENS, check_length_config, scale_counts
from archsearch.dynamic.length.settings import DropRule
from archsearch.models.transformer import Block, Transformer, TransformerConfig

#: The values of :data:`~archsearch.dynamic.length.settings.DropRule`.
DROP_RULES: tuple[str, ...] = get_args(DropRule)


# ---------------------------------------------------------------------------------- FLOPs


def length_config_flops(config: TransformerConfig, lengths: Sequence[int],
                        layers: Sequence[bool] | None = None) -> int:
    """Analytic forward FLOPs of one sample run with executed lengths ``lengths``.

    Counts the same matrix multiplies as :func:`archsearch.models.costs.flops_per_sample`
    (multiply-add = 2 FLOPs) and equals it when every length is ``T``.

    Args:
        config: the model's config.
        lengths: ``[l_0, l_1, ..., l_L]``: ``l_0`` the input length ``T``, ``l_i`` the tokens
            leaving block ``i``. Encoder block ``i`` (``a = l_{i-1}``, ``b = l_i``): Q/K/V
            ``3 * 2*a*d*d``, scores ``2*a*a*d``, ``A V`` ``2*a*a*d`` (all queries), O
            ``2*b*d*d``, FFN ``4*b*d*d_ffn``. Causal LM block ``i`` runs entirely on ``l_i`` tokens; its head
            projects all ``l_0`` restored positions (``2*l_0*d*V``).
        layers: per block, whether it ran (LayerDrop); ``None`` = all ran.

    Returns:
        FLOPs per sample (int).

    Raises:
        ValueError: wrong number of lengths or layers.
    """
    L, d, f = config.n_layers, config.d_model, config.d_ffn
    if len(lengths) != L + 1:
        raise ValueError(f"need {L + 1} lengths (input + one per block), got {len(lengths)}")
    ran = [True] * L if layers is None else list(layers)
    if len(ran) != L:
        raise ValueError(f"layers has {len(ran)} entries, expected {L}")
    total = 0
    for i in range(1, L + 1):
        if not ran[i - 1]:
            continue
        a, b = int(lengths[i - 1]), int(lengths[i])
        if config.task == "lm":
            a = b  # the LM drops before the block
        total += 3 * 2 * a * d * d + 2 * a * a * d + 2 * a * a * d + 2 * b * d * d + 4 * b * d * f
    T = int(lengths[0])
    if config.task == "classification":
        total += 2 * d * config.n_classes
    else:
        total += 2 * T * d * config.vocab_size
    return total


# ---------------------------------------------------------------------------------- forward


def significance(block: Block, x: torch.Tensor, key_mask: torch.Tensor | None,
                 query_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-attention of ``block`` with explicit probabilities, and the attention each token
    receives.

    Args:
        block: a model block (its ``ln1``, ``attn.q/k/v`` and attention dropout are used).
        x: ``B x K x d`` block input.
        key_mask: ``B x K`` bool, keys that may be attended (``None`` = all).
        query_mask: ``B x K`` bool, queries whose attention counts (``None`` = all).

    Returns:
        ``y`` ``B x K x d``: attention output of every query before the O projection
        (``softmax(Q K^T / sqrt(dh)) V``, heads concatenated), and ``score`` ``B x K``: the
        attention probabilities summed over heads and queries (Kim & Cho 2021, sec. 3.1,
        significance score, after PoWER-BERT).
    """
    attn = block.attn
    B, K, d = x.shape
    xn = x if block.post_norm else block.ln1(x)  # (B, K, d): the attention's input, as in Block
    q = attn._project(attn.q, xn, slice(None))  # (B, H, K, dh)
    k = attn._project(attn.k, xn, slice(None))  # (B, H, K, dh)
    v = attn._project(attn.v, xn, slice(None))  # (B, H, K, dh)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(attn.d_head))  # (B, H, K, K)
    if key_mask is not None:
        att = att.masked_fill(~key_mask[:, None, None, :], float("-inf"))  # (B, H, K, K)
    probs = F.softmax(att, dim=-1)  # (B, H, K, K)
    if query_mask is None:
        score = probs.sum(dim=(1, 2))  # (B, K)
    else:
        score = torch.einsum("bhqk,bq->bk", probs, query_mask.to(probs.dtype))  # (B, K)
    y = attn.attn_dropout(probs) @ v  # (B, H, K, dh)
    return y.transpose(1, 2).reshape(B, K, d), score  # (B, K, d), (B, K)


def _drop_block(block: Block, h: torch.Tensor, cur: torch.Tensor | None, keep: list[int],
                rule: DropRule = "significance") -> tuple[torch.Tensor, torch.Tensor]:
    """Run encoder block ``block`` keeping ``keep[s]`` tokens of sample ``s``.

    Args:
        h: ``B x K x d`` current token vectors; cur: ``B x K`` bool, real current tokens
        (``None``: all are real); keep: tokens each sample keeps (``<=`` its real count);
        rule: ``"significance"`` keeps the most attended tokens (Kim & Cho 2021, sec. 3.1),
        ``"prefix"`` the first ones in the current order (position order when every earlier
        drop was a prefix one: truncation inside the network, after the block's attention
        has read every current token).

    Returns:
        ``(h_out, order)``: ``B x K' x d`` vectors of the kept slots (``K' = max(keep)``) and
        ``B x K'`` slot -> current index (the first ``keep[s]`` slots of sample ``s`` are its
        kept real tokens).
    """
    B, K, d = h.shape
    Kn = max(keep)
    keys = None if cur is None else cur | ~cur.any(dim=1, keepdim=True)  # (B, K) no fully masked row
    y, score = significance(block, h, keys, cur)  # (B, K, d), (B, K)
    if rule == "prefix":  # earlier slots win
        score = -torch.arange(K, dtype=score.dtype, device=h.device).expand(B, K)  # (B, K)
    if cur is not None:
        score = score.masked_fill(~cur, float("-inf"))  # (B, K) padding never wins
    order = score.topk(Kn, dim=1).indices  # (B, K')
    flat = (order + torch.arange(0, B * K, K, device=h.device)[:, None]).reshape(-1)  # (B*K',)
    # gathers as index_select on flattened rows (much faster than gather with an expanded index)
    y = block.attn.resid_dropout(block.attn.o(y.reshape(B * K, d).index_select(0, flat)))  # (B*K', d)
    x = (h.reshape(B * K, d).index_select(0, flat) + y).view(B, Kn, d)  # (B, K', d)
    if block.post_norm:  # BERT: LN1(x + MHA(x)), then LN2(x + FFN(x)), as Block.forward
        x = block.ln1(x)  # (B, K', d)
        return block.ln2(x + block.ffn(x)), order
    x = x + block.ffn(block.ln2(x))  # (B, K', d)
    return x, order


def length_drop_forward(
    model: Transformer,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    length_config: Sequence[int] | None,
    *,
    layers: Sequence[bool] | None = None,
    min_tokens: int = MIN_TOKENS,
    restore: bool | None = None,
    rule: DropRule = "significance",
) -> tuple[torch.Tensor, list[int]]:
    """Forward pass with per-layer token dropping (kept tokens gathered, never masked).

    Classification pools over the tokens kept after the last block only (the paper's
    drop-and-restore is for token-level outputs: a dropped token's pre-drop state would otherwise
    enter the pooled vector); with ``restore=True`` dropped tokens are written back at their
    positions with their last state before the final LayerNorm and pooling (the old behaviour,
    kept for token-level use). The LM always restores (it predicts every position).

    Args:
        model: a :class:`Transformer` (its modules and weights are used as they are).
        input_ids: ``B x T`` token ids.
        attention_mask: ``B x T`` bool (True = real token) or ``None`` (see
            ``Transformer.padding_mask``).
        length_config: ``L`` lengths in tokens of an ``n = max_len`` sequence (see
            :mod:`archsearch.dynamic.length.config`), or ``None`` for full length.
        layers: per block, whether it runs (LayerDrop); ``None`` = all.
        min_tokens: at least this many tokens (or all real ones, if fewer) stay.
        restore: classification only: ``False``/``None`` (default) mean-pool the kept tokens of
            the last block; ``True`` drop-and-restore every position before pooling.
        rule: classification only: which tokens a block keeps, ``"significance"`` (default)
            or ``"prefix"`` (see :func:`_drop_block`; config key ``length_drop_rule``).

    Returns:
        ``(logits, lengths)``: ``B x C`` or ``B x T x V`` logits, and the executed slot counts
        ``[T, K_1, ..., K_L]`` (a skipped block repeats the previous count).

    Raises:
        ValueError: invalid length config, ``layers`` length or ``rule``.
    """
    if rule not in DROP_RULES:
        raise ValueError(f"length_drop_rule must be one of {DROP_RULES}, got {rule!r}")
    cfg = model.config
    L, n = cfg.n_layers, cfg.max_len
    lengths_cfg = (n,) * L if length_config is None else check_length_config(length_config, L, n, min_tokens)
    ran = [True] * L if layers is None else [bool(v) for v in layers]
    if len(ran) != L:
        raise ValueError(f"layers has {len(ran)} entries, expected {L}")
    pad_mask = model.padding_mask(input_ids, attention_mask)  # (B, T) or None
    h = model.embed(input_ids)  # (B, T, d)
    B, T, d = h.shape
    dev = h.device
    executed = [T]
    if cfg.task == "lm":
        restored = h  # (B, T, d) last state of every position
        cur_pos = torch.arange(T, device=dev)  # (K,) shared by the batch (no per-sample lengths)
        for i in range(L):
            K = cur_pos.shape[0]
            k = int(scale_counts(lengths_cfg[i], torch.tensor([T]), n, min_tokens)[0])
            if not ran[i]:
                executed.append(K)
                continue
            if k < K:
                restored = restored.index_copy(1, cur_pos, h)  # (B, T, d) save before dropping
                sel = (torch.arange(1, k + 1, device=dev) * K) // k - 1  # (k,) evenly spaced, last kept
                cur_pos = cur_pos[sel]  # (k,)
                h = h[:, sel]  # (B, k, d)
            mask = None if pad_mask is None else model._attn_mask(pad_mask[:, cur_pos], h.shape[1])
            h = model.blocks[i](h, mask)  # (B, k, d)
            executed.append(h.shape[1])
        restored = restored.index_copy(1, cur_pos, h)  # (B, T, d)
        return model.head_logits(restored, pad_mask), executed

    # per-sample kept counts of every layer, computed once (python ints: no per-layer syncs)
    real_t = (pad_mask.sum(dim=1) if pad_mask is not None
              else torch.full((B,), T, dtype=torch.long, device=dev))  # (B,)
    real = real_t.tolist()
    lens = torch.tensor(lengths_cfg, dtype=torch.long)[:, None]  # (L, 1)
    counts = scale_counts(lens, torch.tensor(real, dtype=torch.long)[None, :], n, min_tokens).tolist()
    cur = pad_mask if pad_mask is not None and min(real) < T else None  # (B, K) real slots, None = all
    count = real  # current real count per sample
    idx = None  # (B, K) slot -> position; slots without a real token -> sink column T
    restored = None  # (B, T+1, d) last state of every position (+ sink), restore=True only
    dropped = False
    for i in range(L):
        if not ran[i]:
            executed.append(h.shape[1])
            continue
        keep = [min(c, k) for c, k in zip(counts[i], count)]
        if keep == count:  # nothing dropped here: the model's own block
            mask = None if cur is None else (cur | ~cur.any(dim=1, keepdim=True))[:, None, None, :]
            h = model.blocks[i](h, mask)  # (B, K, d)
        else:
            if not restore:
                pass  # pooling over kept tokens: no bookkeeping of dropped states
            elif restored is None:  # first drop: the current states are the positions' states
                restored = F.pad(h, (0, 0, 0, 1 + T - h.shape[1]))  # (B, T+1, d)
                pos = torch.arange(T, device=dev).expand(B, T)  # (B, T)
                idx = pos if cur is None else torch.where(cur, pos, T)  # (B, K)
            elif torch.is_grad_enabled():
                restored = restored.scatter(1, idx[:, :, None].expand(-1, -1, d), h)  # (B, T+1, d)
            else:  # inference: no autograd history to protect, write in place
                restored.scatter_(1, idx[:, :, None].expand(-1, -1, d), h)  # (B, T+1, d)
            h, order = _drop_block(model.blocks[i], h, cur, keep, rule)  # (B, K', d)
            if restore:
                idx = idx.gather(1, order)  # (B, K')
            Kn = h.shape[1]
            if min(keep) < Kn:  # slots beyond a sample's count hold no real token
                cur = torch.arange(Kn, device=dev)[None, :] < torch.tensor(keep, device=dev)[:, None]
                if restore:
                    idx = torch.where(cur, idx, T)  # (B, K')
            else:
                cur = None
            count = keep
            dropped = True
        executed.append(h.shape[1])
    if restored is not None:  # drop-and-restore: every position gets its last state back
        h = restored.scatter(1, idx[:, :, None].expand(-1, -1, d), h)[:, :T]  # (B, T, d)
        return model.head_logits(h, pad_mask), executed
    # pooling over the tokens kept after the last block (cur: their real slots; None = all)
    return model.head_logits(h, cur if dropped else pad_mask), executed
