"""Question: per-sample depth on MiniLM-L6 -- does DHT (or the depth predictor, or a learnt stop
rule, or head gating) beat the static cut a user would try first, at the same FLOPs?

Claims, their results (``results/``) and the commands that regenerate them from the stored
models (``runs/``); ``run`` retrains (hours on CPU), ``analyze`` rewrites, ``check`` compares:

* ``dht.json``: DHT's gain over static cuts and over the confidence exit at 0.5x / 0.33x FLOPs,
  3 seeds x 2 datasets (rt sentences, election tweets), paired bootstrap intervals; the chosen
  recipe's sections; the CPU wall-clock (``cpu_wall``). ``dht_recipe.json``: the recipe chosen on
  validation. ``depth_predictor.json``: the depth predictor at its defaults against the static
  curve. All three: ``python -m benchmarks.depth.dht_seeded analyze|check`` (``dht`` and
  ``depth_predictor`` are thin runners of the same command); protocols ``dht_seeded*.json``,
  ``dht_recipe*.json``, ``dht_wall_cpu.json``, ``depth_predictor_seeded.json``.
* ``stop_policies.json``: which stop policy the cascade should fit (``python -m
  benchmarks.depth.stop_policies analyze|check``; protocol ``stop_policies.json``).
* ``stop_bandit.json``: a contextual-bandit stop rule against the least-squares one (``python -m
  benchmarks.depth.stop_bandit analyze|check``, a few minutes; protocols ``stop_bandit*.json``).
* ``head_gating.json``: DHT's head gating on long inputs (20 Newsgroups) against depth only
  (``python -m benchmarks.depth.head_gating analyze|check``; protocol ``head_gating.json``).
* ``runs/dynamic_depth_legacy/``: the single-seed development records where the defaults were
  settled, partly on test (``python -m benchmarks.depth.dynamic_depth analyze`` with the flags in
  their provenance): a record, not a claim.

Every result that scores a test split carries the ledger's verdict (``ledger``, ``exploratory``):
rt's recipe and stop rule were picked partly on rt test before these protocols were written.
"""
