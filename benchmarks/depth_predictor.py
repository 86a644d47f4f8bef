"""The depth predictor on MiniLM-L6 (issues 14, 36 deliverable 6): this name runs
``benchmarks/dht_seeded.py``, whose ``run --dp`` trains the depth predictor at its defaults
(3 seeds, two datasets) and whose ``analyze`` writes ``benchmarks/results/depth_predictor.json``
against the same 3-seed static cuts as DHT, with paired bootstrap intervals (protocol:
``benchmarks/protocols/depth_predictor_seeded.json``).

Usage: ``nice -n 10 python benchmarks/depth_predictor.py [run --dp|analyze] [options of dht_seeded.py]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dht_seeded import main  # noqa: E402  benchmarks/dht_seeded.py

if __name__ == "__main__":
    sys.exit(main())
