"""The product, end to end: does archsearch survive faults and bad input, scale, report, export
and serve, and does a real search beat the baseline?

Claims and the commands that answer them (run from the repository root)::

    faults         no trial lost or recorded twice under six faults (driver, node, raise, NaN,
                   OOM kill, truncated checkpoint)
                   python -m benchmarks.product.faults run [--only a,b,...] | analyze | check
    scaling        Tune costs < 5% of a search's wall; a second node nearly doubles trials/hour;
                   a 500-trial search keeps driver memory bounded and gets its report
                   python -m benchmarks.product.scaling run [--only ...] | analyze | check
    fuzz           bad input to the pre-launch path never hangs, never shows a traceback
                   python -m benchmarks.product.fuzz run [--spaces 2400 ...] | analyze | check
    report         a 1,000-trial page <= 1.5 MB; a 10,000-trial report in <= 15 s
                   python -m benchmarks.product.report run [--repeats 3] | analyze | check
    export         export/load/predict/serve: identical logits, accuracy, serve speed, disk
                   python -m benchmarks.product.export run --run RUN_DIR | analyze | check
                   (protocol: protocols/export.json)
    baselines      TF-IDF + logistic regression on rotten_tomatoes_sentences, chosen on
                   validation, test read once (protocols/baselines.json; ledger rt_sentences:test)
                   python -m benchmarks.product.baselines run | analyze | check
    minilm_search  a real MiniLM search beats the TF-IDF baseline's validation accuracy within
                   15 minutes on 2 cores
                   python -m benchmarks.product.minilm_search run [--searcher ahto] | analyze | check

``faults`` and ``scaling`` rebuild their results from their run logs (``runs/``). The others
measure with Ray, a real search, the fuzz campaign or a dataset: their ``analyze`` and ``check``
restate the stored result through the runner's own builder (:mod:`benchmarks.product.stored`)
and never change a number.
"""
