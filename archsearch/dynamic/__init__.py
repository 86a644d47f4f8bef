"""The inner loop: how much of a trial's architecture budget each input actually uses.

A *gating strategy* (``gating:`` in the search space) decides per sample or per batch which
layers, heads or tokens are computed; a *tying controller* (``tying:``) decides which layers
share weights during training. The trainable (:mod:`archsearch.tune.trainable`) talks to both
only through the small interfaces in :mod:`archsearch.dynamic.base`, and they see the trainable
only through its :class:`~archsearch.dynamic.base.TrialContext`, so each strategy lives in its
own module and is registered here by name (imported lazily).
"""

from __future__ import annotations

import importlib

#: ``gating:`` value -> "module:Class" implementing :class:`archsearch.dynamic.base.GatingStrategy`.
GATING = {
    "static": "archsearch.dynamic.base:StaticGating",
    "dht": "archsearch.dynamic.dht:DHTGating",
    "depth_predictor": "archsearch.dynamic.depth_predictor:DepthPredictorGating",
    "length_drop": "archsearch.dynamic.length_drop:LengthDropGating",
    "confidence_exit": "archsearch.dynamic.confidence_exit:ConfidenceExitGating",
}

#: ``tying:`` value -> "module:Class" implementing :class:`archsearch.dynamic.base.TyingController`.
TYING = {
    "none": "archsearch.dynamic.base:NoTying",
    "rl": "archsearch.dynamic.tying:RLTying",
    "paper": "archsearch.dynamic.tying:PaperTying",
    "all": "archsearch.dynamic.tying:AllTying",
    "every_k": "archsearch.dynamic.tying:EveryKTying",
    "switch": "archsearch.dynamic.tying:SwitchTying",
}


def _resolve(table: dict[str, str], kind: str, name: str):
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(table)}")
    module, cls = table[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{kind} {name!r} is not available in this version ({e})") from None


def gating_class(name: str):
    """The :class:`~archsearch.dynamic.base.GatingStrategy` subclass for ``gating: name``."""
    return _resolve(GATING, "gating", name)


def tying_class(name: str):
    """The :class:`~archsearch.dynamic.base.TyingController` subclass for ``tying: name``."""
    return _resolve(TYING, "tying", name)


def strategy_class(kind: str, name: str):
    """``gating_class(name)`` for ``kind="gating"``, ``tying_class(name)`` for ``"tying"``."""
    return gating_class(name) if kind == "gating" else tying_class(name)


def settings_owners() -> dict[str, list[tuple[str, str]]]:
    """Every trial-config key a strategy declares in its ``Settings`` -> the ``(kind, name)``
    of the strategies that declare it (``kind`` is ``"gating"`` or ``"tying"``): the keys a
    search space may set beside the model and optimiser keys (imports every strategy)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for kind, table in (("gating", GATING), ("tying", TYING)):
        for name in table:
            for key in strategy_class(kind, name).Settings.model_fields:
                out.setdefault(key, []).append((kind, name))
    return out


def settings_tables() -> str:
    """The markdown tables of every registered strategy's settings, gatings first (what README.md
    and docs/design.md show between their ``settings-tables`` markers)."""
    from archsearch.dynamic.settings import settings_table

    parts = []
    for kind, table in (("gating", GATING), ("tying", TYING)):
        for name in table:
            cls = strategy_class(kind, name)
            if cls.Settings.model_fields:
                parts.append(settings_table(f"{kind}: {name}", cls.Settings))
    return "\n".join(parts)
