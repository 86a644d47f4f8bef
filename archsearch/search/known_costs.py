"""Known costs of a trial config without training: a cost function for the searchers.

:func:`transformer_cost_fn` returns ``cost_fn(config) -> {"flops_per_sample", "params_total",
"params_trainable"}`` computed by the model's own cost model (:mod:`archsearch.models.costs`)
for the static model the trainable builds (:func:`archsearch.tune.trainable.model_config`):

* ``flops_per_sample`` averaged over the validation split exactly as the trainable measures
  it: validation batches of 256 trimmed to their longest sequence (so it matches the reported
  metric for static models; gated models execute fewer FLOPs than this upper bound).
* ``params_*`` by building the model on the ``meta`` device (no memory, no init cost); tying
  controllers start from their initial sharing, so ``params_trainable`` is that of the untied
  model unless the config ties layers.

The searcher core receives the function; it never imports data itself.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping


def _eval_lengths(data, batch_size: int = 256) -> list[tuple[int, int]]:
    """``(T, n)`` per validation batch: trimmed length and samples (classification), or the
    full ``max_len`` for language modelling."""
    if data.task == "lm":
        return [(int(data.max_len), 1)]
    mask = data["validation"].attention_mask  # (N, T) bool
    out = []
    for i in range(0, mask.shape[0], batch_size):
        m = mask[i:i + batch_size]
        cols = m.any(0).nonzero()
        T = int(cols.max()) + 1 if len(cols) else 1
        out.append((T, int(m.shape[0])))
    return out


def transformer_cost_fn(data, fixed: Mapping[str, Any] | None = None) -> Callable[[Mapping[str, Any]], dict]:
    """Cost function for configs of a space trained on ``data`` (:class:`PreparedData`).

    Args:
        data: the run's prepared data (vocab size, max length, validation masks).
        fixed: the space's ``fixed`` values (merged under each config, as the trainable does).

    Returns:
        ``cost_fn(config) -> dict`` (FLOPs per sample, parameter counts), cached per config.
    """
    import torch

    from archsearch.models import costs
    from archsearch.models.transformer import Transformer
    from archsearch.tune.trainable import DEFAULTS, model_config

    from types import SimpleNamespace

    lengths = _eval_lengths(data)
    # only the scalars model_config needs: the function stays small when pickled (Ray)
    data = SimpleNamespace(vocab_size=int(data.vocab_size), max_len=int(data.max_len),
                           pad_id=int(data.pad_id), task=data.task,
                           n_classes=int(getattr(data, "n_classes", 0) or 0))
    total = sum(n for _, n in lengths)
    fixed = dict(fixed or {})
    cache: dict[tuple, dict] = {}

    def cost_fn(config: Mapping[str, Any]) -> dict:
        cfg = {**DEFAULTS, **fixed, **{k: v for k, v in config.items() if v is not None}}
        mcfg = model_config(cfg, data)
        key = (mcfg.n_layers, mcfg.d_model, mcfg.n_heads, mcfg.d_ffn, cfg.get("tying"))
        hit = cache.get(key)
        if hit is None:
            flops = sum(n * costs.flops_per_sample(mcfg, T) for T, n in lengths) / total
            with torch.device("meta"):
                model = Transformer(mcfg)
            hit = {"flops_per_sample": float(flops), "params_total": float(costs.params_total(model)),
                   "params_trainable": float(costs.params_trainable(model))}
            cache[key] = hit
        return dict(hit)

    return cost_fn
