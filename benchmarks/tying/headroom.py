"""Is there headroom for a dynamic tying map? (issue 67 item 3), under
``protocols/tying_headroom.json``: the hindsight single-switch bound of :mod:`benchmarks.tying.tying`
(untied until the untied run's validation minimum, then a fixed map, Adam state kept) against the
best fixed map, in regimes other than ``tying.json``'s, one seed each (a pilot).

Each run is :func:`benchmarks.tying.tying.child` in a fresh process with the regime's training
characters and model fields in place of the module's (``--child REGIME VARIANT SEED``); the
switch runs wait for their regime's untied run, whose minimum sets the switch step.

Usage::

    nice -n 10 python -m benchmarks.tying.headroom run --jobs 2   # resumable, ~25 min on 2 cores
    python -m benchmarks.tying.headroom analyze | check
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.evidence.cli import Command
from benchmarks.evidence.ledger import Read
from benchmarks.evidence.protocol import relpath
from benchmarks.evidence.provenance import ROOT, git_commit, provenance
from benchmarks.evidence.results import build_result
from benchmarks.evidence.runlog import RunLog, read_jsonl
from benchmarks.tying import tying as T

HERE = Path(__file__).resolve().parent
PROTOCOL = HERE / "protocols" / "tying_headroom.json"
RUNS = HERE / "runs" / "tying_headroom_runs.jsonl"
OUT = HERE / "results" / "tying_headroom.json"
FIXED = ("none", "every_2", "every_4")
SWITCHES = ("switch_every_2", "switch_every_4")


def protocol() -> dict:
    return json.loads(PROTOCOL.read_text())


def child_main(argv: list[str]) -> int:
    """``--child REGIME VARIANT SEED [--map M] [--switch-step S]``: one run, its row on stdout."""
    regime, variant, seed = argv[1], argv[2], int(argv[3])
    opts = dict(zip(argv[4::2], argv[5::2]))
    r = protocol()["regimes"][regime]
    T.MODEL = {**T.MODEL, **r["model"]}  # child() reads these module globals
    T.TRAIN_CHARS = int(r["train_chars"])
    fixed = [int(v) for v in opts["--map"].split(",")] if "--map" in opts else None
    step = int(opts["--switch-step"]) if "--switch-step" in opts else None
    row = T.child(variant, seed, int(r["steps"]), fixed, T.EVAL_BLOCKS, step)
    print(json.dumps({**row, "regime": regime}))
    return 0


def _one(regime: str, variant: str, seed: int, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.tying.headroom", "--child", regime, variant, str(seed), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if res.returncode != 0:
        raise RuntimeError(f"{regime} {variant} seed {seed} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _run(args) -> int:
    P, log, commit = protocol(), RunLog(RUNS), git_commit()
    seed = P["seeds"][0]

    def done() -> dict:
        return {(r["regime"], r["variant"]): r for r in read_jsonl(RUNS)}

    def go(jobs):
        with ThreadPoolExecutor(args.jobs) as ex:
            for row in ex.map(lambda j: _one(*j), jobs):
                log.append({**row, "commit": commit})
                print(f"{row['regime']} {row['variant']}: best val ppl {row['best_val_ppl']:.3f} "
                      f"({row['train_seconds']:.0f} s)", flush=True)

    have = done()
    go([(g, v, seed, []) for g in P["regimes"] for v in FIXED if (g, v) not in have])
    have = done()
    go([(g, v, seed, ["--map", ",".join(map(str, T.HINDSIGHT[v])), "--switch-step", str(have[(g, "none")]["best_step"])])
        for g in P["regimes"] for v in SWITCHES  # no switch after the last step: not measured
        if (g, v) not in have and have[(g, "none")]["best_step"] < have[(g, "none")]["steps"]])
    return 0


def summarize(rows: dict) -> dict:
    s = {}
    for g in protocol()["regimes"]:
        if not all((g, v) in rows for v in FIXED):
            continue
        if rows[(g, "none")]["best_step"] >= rows[(g, "none")]["steps"]:  # the protocol: not measured
            s[g] = {"hindsight_switch_gain_ppl": None, "why": "the untied minimum is the last step: no switch"}
            continue
        if not all((g, v) in rows for v in SWITCHES):
            continue
        best = min(FIXED, key=lambda v: rows[(g, v)]["best_val_ppl"])
        sw = {v: rows[(g, v)]["best_val_ppl_after_switch"] for v in SWITCHES}
        s[g] = {"hindsight_switch_gain_ppl": round(min(sw.values()) - rows[(g, best)]["best_val_ppl"], 4),
                "best_fixed": best, "headroom": min(sw.values()) - rows[(g, best)]["best_val_ppl"] <= -0.3,
                **{f"{v}_best_val_ppl": round(rows[(g, v)]["best_val_ppl"], 4) for v in FIXED},
                **{f"{v}_best_val_ppl_after_switch": round(x, 4) for v, x in sw.items()},
                "untied_best_step": rows[(g, "none")]["best_step"],
                "steps": rows[(g, "none")]["steps"]}
    return s


def results(args) -> dict[Path, dict]:
    t0 = time.time()
    raw = read_jsonl(RUNS)
    rows = {(r["regime"], r["variant"]): r for r in raw}
    s = summarize(rows)
    prov = provenance(commits=sorted({r["commit"] for r in raw}), seeds=protocol()["seeds"],
                      wall_s=round(sum(r["process_seconds"] for r in raw) + time.time() - t0, 1),
                      protocol=relpath(PROTOCOL), runs=len(raw))
    tg = {f"{g}.hindsight_switch_gain_ppl": "<= -0.3" for g in s if s[g]["hindsight_switch_gain_ppl"] is not None}
    result = build_result(s, prov, name=OUT.name, targets=tg, protocol=PROTOCOL, record_reads=not args.check,
                          reads=[Read(T.TEST_SET, PROTOCOL)])  # the child's test perplexities (unused)
    if not args.check:
        print(json.dumps(s, indent=1))
    return {OUT: result}


def _add_arguments(p) -> None:
    p.add_argument("--jobs", type=int, default=2, help="runs at once (one thread each)")


COMMAND = Command(__doc__.split("\n")[0], run=_run, add_arguments=_add_arguments, results=results)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "--child":
        return child_main(argv)
    return COMMAND.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
