"""Question: can AHTO's acquisition policy be meta-trained on LCBench training tasks so that it
beats plain qLogNEHVI on held-out tasks? (issue 37)

``ahto_policy.py`` collects episodes on the 20 training tasks of the test bed's split
(``benchmarks/testbeds/data/lcbench_split.json``), trains the policy, and ships the variant the
protocol's validation rule chooses (``protocols/ahto_policy.json``; ``protocols/ahto_effort.json``:
design 3, the acquisition optimiser's effort) as ``archsearch/search/ahto_policy.json``. The
test read of the shipped policy is the searchers question's (``searchers.json``, test set
``lcbench:test_tasks``). Commands::

    python -m benchmarks.ahto_policy.ahto_policy run --stage collect --seeds 0-1
    python -m benchmarks.ahto_policy.ahto_policy run --stage train --out FILE [--temperature T --l2 L]
    python -m benchmarks.ahto_policy.ahto_policy run --stage ship --variants LABEL=FILE ...

``episodes.py`` (issue 65 item 3, ``protocols/ahto_policy_episodes.json``): design 2, a linear
policy trained on whole episodes by evolution strategies, compared on the validation tasks with
the base, qLogNEHVI and the shipped policy; ``protocols/ahto_policy_base.json`` (written after
that read): the base on the branched problem, and the episode policy on the test tasks
(exploratory). Result ``results/ahto_policy_episodes.json``; weights ``weights/ahto_policy_es.json``.
"""
