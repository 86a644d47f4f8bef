"""DHT on MiniLM-L6 (issues 14, 36): a thin runner of :mod:`benchmarks.depth.dht_seeded`, which
writes ``benchmarks/depth/results/dht.json`` -- and, from the same stored models, ``dht_recipe.json``
and ``depth_predictor.json``: 3 seeds of DHT's model and of every static cut on two datasets,
choices on validation rows (see its docstring for the protocol and the ledger for what was
chosen on test before it).

The single-seed development protocol that settled today's defaults is
:mod:`benchmarks.depth.dynamic_depth` (its records: ``benchmarks/depth/runs/dynamic_depth_legacy/``).

Usage: ``python -m benchmarks.depth.dht run|analyze|check [options]`` = ``python -m
benchmarks.depth.dht_seeded ...``.
"""

from __future__ import annotations

import sys

from benchmarks.depth.dht_seeded import main

if __name__ == "__main__":
    sys.exit(main())
