"""Question: do archsearch's searchers (AHTO, qNEHVI, the Optuna baselines) find good fronts
fast, on an honest benchmark? (issues 15 and 37)

Claims and where they are answered:

* AHTO's hypervolume over the best baseline on the replay table and the synthetic problems at
  20/40 trials; trials to 95% of the best HV; AHTO's ask time (``suggest_s_*``) -- issue 15;
* on the held-out LCBench test tasks (test set ``lcbench:test_tasks``), AHTO's regret ratio and
  Wilcoxon p against qNEHVI, TPE and GP at 20 trials; AHTO over qNEHVI on the synthetic
  problems; AHTO over GP on a conditional space -- issue 37 (exploratory: see the ledger).

Commands (from the repository root)::

    python -m benchmarks.searchers.record_table run --resume      # runs/replay_table.jsonl (trains 160 configs)
    python -m benchmarks.searchers.searchers run [--suggest-time]  # runs/searcher_runs_v2.jsonl, suggest_times_v2.json
    python -m benchmarks.searchers.lcbench run                     # runs/lcbench_runs.jsonl
    python -m benchmarks.searchers.lcbench run --check-yahpo PY    # results/lcbench_check.json
    python -m benchmarks.searchers.conditional run                 # runs/conditional_runs.jsonl
    python -m benchmarks.searchers.searchers analyze | check       # results/searchers.json (+ searchers.png)

Protocols: ``protocols/searchers.json`` (issue 15's benchmark as first stated),
``protocols/lcbench_test.json`` (the LCBench test read), ``protocols/conditional.json``; the
task split is the test bed's ``benchmarks/testbeds/data/lcbench_split.json``.
"""
