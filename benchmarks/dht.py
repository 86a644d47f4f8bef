"""DHT on MiniLM-L6 (issues 14, 36): this name runs ``benchmarks/dht_seeded.py``, which writes
``benchmarks/results/dht.json`` (and ``depth_predictor.json``): 3 seeds of DHT's model and of
every static cut on two datasets, choices on validation rows only, paired bootstrap intervals
(see its docstring for the protocol, the duration and the command lines).

The single-seed development protocol that settled today's defaults is
``benchmarks/dynamic_depth.py`` (its summaries: ``benchmarks/data/dynamic_depth_legacy/``).

Usage: ``nice -n 10 python benchmarks/dht.py [run|select|analyze|wall] [options of dht_seeded.py]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dht_seeded import main  # noqa: E402  benchmarks/dht_seeded.py

if __name__ == "__main__":
    sys.exit(main())
