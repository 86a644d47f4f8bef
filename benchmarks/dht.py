"""DHT on MiniLM-L6 (issue 14): this name runs ``benchmarks/dynamic_depth.py``, which measures DHT,
the depth predictor, static cuts and a confidence exit in one resumable protocol and writes
``benchmarks/results/dht.json`` and ``benchmarks/results/depth_predictor.json`` (see its
docstring for the protocol, the duration and the command lines).

The earlier from-scratch + 150-step MiniLM protocol of this script is in git history (before
issue 14 deliverable 5).

Usage: ``nice -n 10 python benchmarks/dht.py [run|summarize] [options of dynamic_depth.py]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynamic_depth import main  # noqa: E402  benchmarks/dynamic_depth.py

if __name__ == "__main__":
    main()
