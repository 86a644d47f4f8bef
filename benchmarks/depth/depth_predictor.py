"""The depth predictor on MiniLM-L6 (issues 14, 36 deliverable 6): a thin runner of
:mod:`benchmarks.depth.dht_seeded`, whose ``run --dp`` trains the depth predictor at its
defaults (3 seeds, two datasets) and whose ``analyze`` writes
``benchmarks/depth/results/depth_predictor.json`` (beside ``dht.json`` and ``dht_recipe.json``)
against the same 3-seed static cuts as DHT, with paired bootstrap intervals (protocol:
``benchmarks/depth/protocols/depth_predictor_seeded.json``).

Usage: ``python -m benchmarks.depth.depth_predictor run --dp|analyze|check [options]`` =
``python -m benchmarks.depth.dht_seeded ...``.
"""

from __future__ import annotations

import sys

from benchmarks.depth.dht_seeded import main

if __name__ == "__main__":
    sys.exit(main())
