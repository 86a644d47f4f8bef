"""Length: does a length-adaptive transformer (LengthDrop, Kim & Cho arXiv 2010.07003) keep its
accuracy on long inputs at a fraction of the FLOPs?

Claims (issue 16; targets in :data:`benchmarks.length.length_adaptive.TARGETS`): a
length-adaptive MiniLM-L6 on 20 Newsgroups (128 tokens) loses at most 0.5 / 1.0 accuracy points
at 0.5x / 0.35x FLOPs against the equal-steps fine-tuned model, beats truncating the inputs to the
same FLOPs by at least 2 points at 0.5x, and its FLOPs savings are wall-clock savings (wall /
FLOPs ratio <= 1.3). Every result reads the 20 Newsgroups test documents (``20newsgroups:test``).

    python -m benchmarks.length.length_adaptive analyze   # every result from runs/ (no training)
    python -m benchmarks.length.length_adaptive check     # regenerate in memory, compare
    python -m benchmarks.length.length_adaptive run --ld-steps 600 --ld-from full --seeds 0-1 \\
        --result benchmarks/length/results/length_adaptive_2ep_cpu.json   # the recipe at 2 epochs, CPU
    python -m benchmarks.length.length_adaptive run --ld-steps 600 --seeds 0-1 \\
        --result benchmarks/length/results/length_adaptive_from_short.json
    bash benchmarks/length/length_adaptive_device.sh      # results/length_adaptive.json: issue 39's 5 epochs, GPU

Protocols: ``protocols/length_adaptive.json`` (the 2-epoch results), ``protocols/length_adaptive_5ep.json``
(issue 39), ``protocols/length_adaptive_v3.json`` (issue 67: the whole test set, seeded budgets
0.55x/0.5x/0.35x, the LengthDrop-steps curve; ``V3=1 bash benchmarks/length/length_adaptive_device.sh``). Rows: ``runs/length_adaptive_runs.jsonl``.
"""
