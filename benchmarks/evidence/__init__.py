"""The evidence library: everything a benchmark does after (and around) its measurements.

* :mod:`~benchmarks.evidence.provenance`: the commit, machine, command, seeds and wall time.
* :mod:`~benchmarks.evidence.results`: the one result schema (``summary``, ``targets``,
  ``protocol``, ``ledger``, ``provenance``), written atomically; comparing a regenerated result.
* :mod:`~benchmarks.evidence.runlog`: a resumable JSON-lines run log.
* :mod:`~benchmarks.evidence.protocol`: a protocol's path and sha256, as results record them.
* :mod:`~benchmarks.evidence.ledger`: the test-read ledger that marks results ``exploratory``.
* :mod:`~benchmarks.evidence.targets`: ``"<= 0.5"``-style targets, joint rules, evaluation.
* :mod:`~benchmarks.evidence.stats`: paired and grouped bootstrap, Wilcoxon signed-rank,
  interpolation at a FLOPs fraction.
* :mod:`~benchmarks.evidence.frontier`: 2-objective hypervolume on :mod:`archsearch.pareto`.
* :mod:`~benchmarks.evidence.tables`: console tables.
* :mod:`~benchmarks.evidence.cli`: the one command-line shape (``run | analyze | check``,
  ``--seeds 0-2,5``).

Standard library and NumPy at import; SciPy, torch and archsearch are imported where used.
Import the modules (``from benchmarks.evidence import stats``): the package re-exports nothing.
"""
