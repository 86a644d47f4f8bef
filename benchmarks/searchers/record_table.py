"""Record a replay table: train configurations of a search space for real, one JSON line each.

The table feeds ``benchmarks/searchers/searchers.py`` (syne-tune's simulator idea: searchers are compared
on recorded results instead of retraining). Configurations come from a scrambled Sobol sequence
over the space's unit cube (``SearchSpace.decode``), so the table covers the space evenly and
is reproducible. Each line holds the config, the per-epoch history (every docs/design.md metric) and
the budget it was trained with. The script is resumable: it skips configurations whose index is
already in the output file, so it can run in pieces (kill it any time; rerun to continue).

Usage::

    nice -n 10 python -m benchmarks.searchers.record_table run --resume     # 160 Sobol configs, 4 epochs each (the default budget)

Writes ``benchmarks/searchers/runs/replay_table.jsonl``.

Runs single-threaded (``torch.set_num_threads(1)``): this machine's 2 cores are shared.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from benchmarks.evidence.cli import Command
from benchmarks.evidence.provenance import ROOT, git_commit
from benchmarks.evidence.runlog import RunLog

DEFAULT_OUT = Path(__file__).resolve().parent / "runs" / "replay_table.jsonl"
#: what every row of one table must share (a resumed run with other settings is refused)
SETTINGS = ("space", "epochs", "batch_size", "max_train_samples", "seed")


def table_configs(space, n: int, seed: int = 0) -> list[dict]:
    """``n`` configurations from a scrambled Sobol sequence over ``space``'s unit cube."""
    import torch

    dims = len(space.dims())
    engine = torch.quasirandom.SobolEngine(dims, scramble=True, seed=seed)
    xs = engine.draw(n).double().tolist()
    return [space.decode(x) for x in xs]


def _add_arguments(ap) -> None:
    ap.add_argument("--space", default=str(ROOT / "search_spaces" / "default.yaml"))
    ap.add_argument("--n", type=int, default=160, help="configurations in the table")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--max-train-samples", type=int, default=None, help="default: the whole split")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--resume", action="store_true", help="continue an existing table (else refuse to "
                    "append to one)")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard", default="0/1", help="I/K: record only indices i with i %% K == I "
                    "(K processes can share the table file; each line is one append)")


def record(args) -> int:
    """Record the table (resumable)."""

    import torch

    torch.set_num_threads(1)
    from archsearch.space import load_space
    from archsearch.data import prepare_for_space
    from archsearch.tune.runner import trial_settings
    from archsearch.tune.trainable import run_trial

    space = load_space(args.space)
    space = space.model_copy(update={
        "dataset": space.dataset.model_copy(update={"max_train_samples": args.max_train_samples}),
        "budget": space.budget.model_copy(update={"epochs": args.epochs, "batch_size": args.batch_size})})
    data = prepare_for_space(space)
    settings = trial_settings(space, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    settings_row = {"space": space.name, "epochs": args.epochs, "batch_size": args.batch_size,
                    "max_train_samples": args.max_train_samples, "seed": args.seed}
    done = set()
    if out.exists() and out.stat().st_size:
        if not args.resume:
            raise SystemExit(f"{out} exists: pass --resume to continue it, or --out for a new table")
        for n, line in enumerate(out.read_text().splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            other = {k: row.get(k) for k in SETTINGS}
            if other != settings_row:
                raise SystemExit(f"{out}:{n}: recorded with {other}, not {settings_row}")
            done.add(row["index"])
    commit = git_commit()
    configs = table_configs(space, args.n, args.seed)
    shard, n_shards = (int(v) for v in args.shard.split("/"))
    for i, cfg in enumerate(configs):
        if i in done or i % n_shards != shard:
            continue
        t0 = time.time()
        rec = {"index": i, "config": cfg, **settings_row, "source": "sobol", "commit": commit,
               "load_before": round(os.getloadavg()[0], 2)}
        try:
            hist = run_trial(cfg, data, settings)
            rec.update(status="TERMINATED", history=hist, metrics=hist[-1], error=None)
        except FloatingPointError as e:  # a diverged trial is a real outcome: keep it
            rec.update(status="ERROR", history=[], metrics={}, error=str(e))
        rec["wall_seconds"] = time.time() - t0
        RunLog(out).append(rec)
        m = rec["metrics"]
        print(f"[{i}] {cfg} acc={m.get('accuracy')} flops={m.get('flops_per_sample')} "
              f"{rec['wall_seconds']:.1f}s", file=sys.stderr, flush=True)


COMMAND = Command(__doc__.splitlines()[0], run=record, add_arguments=_add_arguments)


def main(argv=None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
