"""The evidence library: everything a benchmark does after (and around) its measurements.

* :mod:`~benchmarks.evidence.provenance`: the commit, machine, command, seeds and wall time.
* :mod:`~benchmarks.evidence.results`: the one result schema (``summary``, ``targets``,
  ``protocol``, ``ledger``, ``provenance``), written atomically; comparing a regenerated result.
* :mod:`~benchmarks.evidence.runlog`: a resumable JSON-lines run log.
* :mod:`~benchmarks.evidence.protocol`: loading a protocol and its sha256.
* :mod:`~benchmarks.evidence.ledger`: the test-read ledger that marks results ``exploratory``.
* :mod:`~benchmarks.evidence.targets`: ``"<= 0.5"``-style targets, joint rules, evaluation.
* :mod:`~benchmarks.evidence.stats`: paired and grouped bootstrap, Wilcoxon signed-rank,
  interpolation at a FLOPs fraction.
* :mod:`~benchmarks.evidence.frontier`: 2-objective hypervolume on :mod:`archsearch.pareto`.
* :mod:`~benchmarks.evidence.tables`: console tables.
* :mod:`~benchmarks.evidence.cli`: the one command-line shape (``run | analyze | check``,
  ``--seeds 0-2,5``).

Standard library and NumPy at import; SciPy, torch and archsearch are imported where used.
"""

from benchmarks.evidence.provenance import ROOT, git_commit, machine, provenance
from benchmarks.evidence.results import compare_results, read_result, write_result
from benchmarks.evidence.runlog import RunLog, read_jsonl
from benchmarks.evidence.seeds import parse_seeds

__all__ = ["ROOT", "RunLog", "compare_results", "git_commit", "machine", "parse_seeds",
           "provenance", "read_jsonl", "read_result", "write_result"]
