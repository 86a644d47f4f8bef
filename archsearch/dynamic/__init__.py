"""The inner loop: how much of a trial's architecture budget each input actually uses.

A *gating strategy* (``gating:`` in the search space) decides per sample or per batch which
layers, heads or tokens are computed; a *tying controller* (``tying:``) decides which layers
share weights during training. The trainable (:mod:`archsearch.tune.trainable`) talks to both
only through the small interfaces in :mod:`archsearch.dynamic.base`, and they see the trainable
only through its :class:`~archsearch.dynamic.base.TrialContext`, so each strategy lives in its
own module and is registered here by name (imported lazily).

Layout: this package is the shared core -- the registry (here), :mod:`~archsearch.dynamic.base`
(the interfaces and the static defaults), :mod:`~archsearch.dynamic.settings` (the base of every
``Settings``), :mod:`~archsearch.dynamic.known_costs`, :mod:`~archsearch.dynamic.budget` (FLOPs
prices and calibration) and :mod:`~archsearch.dynamic.bandits` -- and the strategies live in one
subpackage per family, each with a torch-free ``settings`` module: :mod:`archsearch.dynamic.depth`
(dynamic depth and early exit: ``dht``, ``depth_predictor``, ``confidence_exit``, ``cascade``),
:mod:`archsearch.dynamic.length` (``length_drop``) and :mod:`archsearch.dynamic.tying` (every
``tying:`` but ``none``). Families import the core, never each other.
"""

from __future__ import annotations

import importlib

#: ``gating:`` value -> "module:Class" implementing :class:`archsearch.dynamic.base.GatingStrategy`.
GATING = {
    "static": "archsearch.dynamic.base:StaticGating",
    "dht": "archsearch.dynamic.depth.dht:DHTGating",
    "depth_predictor": "archsearch.dynamic.depth.predictor:DepthPredictorGating",
    "length_drop": "archsearch.dynamic.length.drop:LengthDropGating",
    "confidence_exit": "archsearch.dynamic.depth.confidence_exit:ConfidenceExitGating",
    "cascade": "archsearch.dynamic.depth.cascade:CascadeGating",
}

#: ``tying:`` value -> "module:Class" implementing :class:`archsearch.dynamic.base.TyingController`.
TYING = {
    "none": "archsearch.dynamic.base:NoTying",
    "rl": "archsearch.dynamic.tying.rl:RLTying",
    "paper": "archsearch.dynamic.tying.rl:PaperTying",
    "all": "archsearch.dynamic.tying.controllers:AllTying",
    "every_k": "archsearch.dynamic.tying.controllers:EveryKTying",
    "switch": "archsearch.dynamic.tying.controllers:SwitchTying",
    "merge": "archsearch.dynamic.tying.controllers:MergeTying",
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
    """The markdown tables of every registered strategy's settings, gatings first (what docs/usage.md
    and docs/design.md show between their ``settings-tables`` markers)."""
    from archsearch.dynamic.settings import settings_table

    parts = []
    for kind, table in (("gating", GATING), ("tying", TYING)):
        for name in table:
            cls = strategy_class(kind, name)
            if cls.Settings.model_fields:
                parts.append(settings_table(f"{kind}: {name}", cls.Settings))
    return "\n".join(parts)
