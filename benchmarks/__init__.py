"""archsearch's evidence: one package, one folder per question, one library.

Layout (``benchmarks/README.md`` maps each question to its claim, command, protocol, result and
test)::

    benchmarks/evidence/   the library: provenance, results, run logs, protocols and the
                           test-read ledger, targets, statistics, frontiers, tables, the CLI
    benchmarks/testbeds/   shared test beds: LCBench surrogate, synthetic problems, text data,
                           MiniLM recipes, stored exit tables, timing
    benchmarks/<question>/ one question each (searchers, schedulers, ahto_policy, depth, length,
                           tying, gpu, product): its runners, ``protocols/``, ``results/`` and
                           ``runs/`` side by side

A question imports :mod:`benchmarks.evidence` and :mod:`benchmarks.testbeds`, never another
question. Run from the repository root: ``python -m benchmarks.<question>.<runner> run|analyze|check``.
"""
