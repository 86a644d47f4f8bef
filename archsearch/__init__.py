"""archsearch: search transformer architectures that are accurate and cheap.

Heavy libraries (torch, Ray, BoTorch) are imported lazily inside the modules that need them,
so ``archsearch --help`` stays fast.
"""

__version__ = "0.1.0"
