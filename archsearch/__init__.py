"""archsearch: search transformer architectures that are accurate and cheap.

Heavy libraries (torch, Ray, BoTorch) are imported lazily inside the modules that need them,
so ``archsearch --help`` stays fast. ``archsearch.load(DIR)`` loads a model written by
``archsearch export`` (:func:`archsearch.export.load`).
"""

__version__ = "0.1.0"

__all__ = ["load"]


def __getattr__(name: str):
    if name == "load":  # imported on first use: torch is not loaded by ``import archsearch``
        from archsearch.export import load

        return load
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
