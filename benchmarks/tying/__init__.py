"""Tying: does layer tying regularise an over-parameterised character LM, and does a tying agent
find a map at least as good as the best fixed one?

Claims (issue 39, ``protocols/tying.json``; targets in :data:`benchmarks.tying.tying.TARGETS`):
on 125,000 Shakespeare training characters a tied model (``every_4``, at most half the trainable
parameters) reaches a validation perplexity at least as good as the untied model's, with about
half its measured training-state memory (<= 0.6x); a tying agent (``rl`` or ``paper``) finds a
map at least as good as the best fixed map of its size. Test perplexities at the best validation
checkpoint read the held-out test plays (``shakespeare:test``).

    python -m benchmarks.tying.tying analyze          # results/tying.json from runs/tying_runs.jsonl
    python -m benchmarks.tying.tying check            # regenerate in memory, compare
    python -m benchmarks.tying.tying run --jobs 2     # train what is missing (~1.3 h per 24 runs)
"""
