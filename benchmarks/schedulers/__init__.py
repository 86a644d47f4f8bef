"""Question: does the learned AHTO stop policy (``scheduler: ahto``) reach the same front with less
training than ASHA, Hyperband, the median rule or no early stopping? (issue 38)

Claims and where they are answered:

* on the YAHPO LCBench test tasks (test set ``lcbench:scheduler_tasks``), simulated searches:
  ahto/asha time to 95% of the best-known HV <= 0.85 with Wilcoxon p < 0.05, HV at equal
  time >= 1.0 -- ``schedulers.py``: protocol v1 (``protocols/schedulers.json`` ->
  ``results/schedulers_v1.json``), v2 (``protocols/schedulers_v2.json`` ->
  ``results/schedulers_v2.json``), v3 (``protocols/schedulers_v3.json`` -> ``results/schedulers_v3.json``);
  v2 and v3 were written after v1's test read: exploratory;
* the same question without hindsight (issue 66, protocol v4): costs seen only once observed,
  seed noise on the curves, a per-task target fixed from reference searches, the one-epoch
  rule beside the library schedulers, PGPE cross-validated over all 34 tasks (3 folds) --
  ``no_hindsight.py`` (``protocols/schedulers_v4.json`` -> ``results/schedulers.json``;
  test set ``lcbench:scheduler_cv``);
* a real search with ``scheduler: ahto`` beside ``scheduler: asha`` -- ``scheduler_search.py``
  (``results/scheduler_search.json``: 12 trials each; ``results/scheduler_search_v2.json``:
  issue 66's time-budgeted searches, 3 repeats, ``protocols/scheduler_search_v2.json``;
  measured only, real searches).

Commands (from the repository root)::

    python -m benchmarks.schedulers.schedulers run --stage train|horizon|validate|ship|test
    python -m benchmarks.schedulers.schedulers analyze [--protocol v1|v2|v3]   # all three without --protocol
    python -m benchmarks.schedulers.schedulers check
    python -m benchmarks.schedulers.no_hindsight run --stage reference|train|test; analyze; check
    python -m benchmarks.schedulers.scheduler_search run [--work DIR] [--time-budget 300 --repeats 3]

Run logs and trained variants: ``runs/`` (``scheduler_runs*.jsonl``, ``scheduler_validation*.json``,
``scheduler_horizon*``, ``scheduler_policies/``).
"""
