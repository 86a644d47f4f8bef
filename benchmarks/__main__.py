"""Every stored result regenerated from its committed run logs and compared, in one command::

    python -m benchmarks check [QUESTION ...]   exit 1 when any stored result differs (provenance aside)
    python -m benchmarks list                   the runners that write results

Each runner's own ``check`` (``python -m benchmarks.<question>.<runner> check``) does the work;
results that need training, Ray or a GPU are restated from their stored numbers by their
runner (see each question's docstring). ``benchmarks/README.md`` maps questions to claims.
"""

from __future__ import annotations

import importlib
import sys

#: The runners whose ``check`` regenerates results, by question (the order a newcomer reads them).
RUNNERS = {
    "searchers": ["searchers", "transfer", "gp_history", "acqf_retry"],
    "ahto_policy": ["episodes"],
    "schedulers": ["schedulers", "no_hindsight"],
    # dynamic_depth's stored files are development records, each regenerated with the arguments
    # its provenance records (tests/test_depth_benchmark.py), not by a bare ``check``
    "depth": ["dht_seeded", "stop_policies", "stop_bandit", "stop_bandit_fair", "shift", "head_gating"],
    "length": ["length_adaptive"],
    "tying": ["tying", "tying_regularised", "headroom"],
    "gpu": ["gpu", "train_ops"],
    "product": ["baselines", "export", "faults", "fuzz", "minilm_search", "report", "scaling"],
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("check", "list"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    asked = argv[1:] or list(RUNNERS)
    unknown = [q for q in asked if q not in RUNNERS]
    if unknown:
        print(f"error: unknown question(s) {unknown}; known: {', '.join(RUNNERS)}", file=sys.stderr)
        return 2
    if argv[0] == "list":
        for q in asked:
            for r in RUNNERS[q]:
                print(f"python -m benchmarks.{q}.{r} run|analyze|check")
        return 0
    failed = []
    for q in asked:
        for r in RUNNERS[q]:
            print(f"== benchmarks.{q}.{r}", flush=True)
            if importlib.import_module(f"benchmarks.{q}.{r}").main(["check"]) != 0:
                failed.append(f"{q}.{r}")
    print("all stored results regenerate identically" if not failed else f"differ: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
