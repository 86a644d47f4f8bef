"""Transformer model and its cost model.

Public names are re-exported lazily (PEP 562 ``__getattr__``) so that importing
``archsearch.models`` does not import torch until a name is used.

* :mod:`archsearch.models.transformer`: ``TransformerConfig``, ``Transformer``,
  ``MultiHeadAttention``, ``FeedForward``, ``Block``.
* :mod:`archsearch.models.costs`: ``params_total``, ``params_trainable``, ``flops_per_sample``,
  ``count_flops_torch``, ``latency_ms``, ``exit_head_params``, ``static_costs_fn``.
* :mod:`archsearch.models.config`: ``DEFAULTS``, ``trial_config``, ``model_config``,
  ``trim_padding``, ``eval_lengths`` (no torch import until a function runs).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TransformerConfig": "transformer",
    "Transformer": "transformer",
    "MultiHeadAttention": "transformer",
    "FeedForward": "transformer",
    "Block": "transformer",
    "params_total": "costs",
    "params_trainable": "costs",
    "flops_per_sample": "costs",
    "count_flops_torch": "costs",
    "latency_ms": "costs",
    "exit_head_params": "costs",
    "static_costs_fn": "costs",
    "DEFAULTS": "config",
    "trial_config": "config",
    "model_config": "config",
    "trim_padding": "config",
    "eval_lengths": "config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
