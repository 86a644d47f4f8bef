"""Fault benchmark whose checks can fail: six faults, each in its own 16-trial search.

Claim: whatever goes wrong in a search (the driver killed, a worker node lost, a trial that
raises, returns NaN, is OOM-killed, or restarts from a truncated checkpoint), no trial is lost
and none is recorded twice; failed trials are recorded with their reason.

Each fault runs in its own real search (``archsearch search`` through the CLI, random searcher,
seed 0, 16 trials of >= 60 s, 2 at a time on this 2-core machine):

  a  driver_killed      the driver is SIGKILLed at 3 random moments, each followed by
                        ``archsearch resume``; the last resume runs to the end
  b  node_killed        a 2-worker-node Ray cluster on this host; one node is removed while
                        both run a trial, and a new node joins (as an autoscaler would add one)
  c  trial_raises       n_heads choices include 3, which does not divide d_model: ValueError
  d  trial_nan          lr choices include 1e6: the loss becomes NaN, FloatingPointError
  e  trial_oom_killed   a running trial's worker process is moved into a memory cgroup
                        (cgroup v1) limited to 16 MB of new memory: a training epoch charges
                        ~38 MB there (measured), so the kernel's OOM killer kills the worker
  f  truncated_checkpoint  a running trial's last checkpoint is cut in half, then its worker is
                        SIGKILLed, so Tune restores it from the truncated file

For each run the JSON gives the fault's time and the trials running then (proof it fired
mid-trial: each had finished >= 1 epoch and not all), and, counted from the run directory
(``trials/*.json``) and the Optuna storage (``optuna.db``): trials expected, completed,
failed-with-reason, lost (expected - recorded, never negative; a record still RUNNING counts as
lost), duplicated (two records or two Optuna trials for one Tune trial id, or two completed
records of one config). ``broken_resume_caught``: the same count on a copy of run (a) from which
one trial was removed (a resume that skipped a trial) must report it lost.

    python -m benchmarks.product.faults run [--only a,b,...]   # resumable: finished runs are kept
    python -m benchmarks.product.faults analyze|check         # table + results/faults.json

Run alone on the machine (timings and the OOM limit assume nothing else heavy runs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from typing import Any

import yaml

from benchmarks.evidence.cli import Command
from benchmarks.evidence.provenance import ROOT, git_commit, provenance
from benchmarks.evidence.results import build_result, write_json
from benchmarks.evidence.runlog import RunLog, read_jsonl

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs" / "fault_runs.jsonl"
OUT = HERE / "results" / "faults.json"
WORK = Path(os.environ.get("FAULTS_WORK", "/tmp/archsearch-faults"))
TRIALS = 16
SEED = 0
FAULTS = {"a": "driver_killed", "b": "node_killed", "c": "trial_raises", "d": "trial_nan",
          "e": "trial_oom_killed", "f": "truncated_checkpoint"}
#: Issue 18's targets (benchmarks/summarize.py stated them for this result before it carried them).
TARGETS = {"lost_trials": "== 0", "duplicated_trials": "== 0"}
CGROUP = Path("/sys/fs/cgroup/memory/archsearch-faults")
OOM_LIMIT = 16 * 2**20  # new charges only: memory the worker held before stays outside


def space_spec(fault: str, epochs: int) -> dict:
    """The run's space: real data, 2-layer d=64 encoders whose trials last >= 60 s."""
    spec = yaml.safe_load((ROOT / "search_spaces" / "default.yaml").read_text())
    spec["name"] = f"faults-{fault}"
    spec["budget"] = {"trials": TRIALS, "max_concurrent": 2, "epochs": epochs, "batch_size": 32,
                      "scheduler": "none", "cpus_per_trial": 1, "max_failures": 1}
    spec.pop("constraints", None)
    spec["params"] = {"n_layers": {"type": "int", "low": 2, "high": 2},
                      "d_model": {"type": "categorical", "choices": [64]},
                      "n_heads": {"type": "categorical", "choices": [4]},
                      "lr": {"type": "float", "low": 5.0e-4, "high": 3.0e-3, "log": True}}
    spec["fixed"] = {"weight_decay": 0.01}
    if fault == "trial_raises":
        spec["params"]["n_heads"]["choices"] = [2, 4, 8, 3]  # 3 does not divide d_model 64
    if fault == "trial_nan":
        spec["params"]["lr"] = {"type": "categorical", "choices": [1.0e-3, 2.0e-3, 3.0e-3, 1.0e6]}
        # a continuous param keeps every sampled config distinct, so that two completed records
        # of one config still mean a trial recorded twice (not two draws of the same choice)
        spec["params"]["dropout"] = {"type": "float", "low": 0.05, "high": 0.2}
    return spec


# ---------------------------------------------------------------------- counting
def count(run_dir: Path, expected: int = TRIALS) -> dict:
    """Trials expected / completed / failed (with and without a reason) / lost / duplicated,
    from the run directory's records and its Optuna study."""
    import optuna

    from archsearch.runs import ERROR, FINISHED, RunDir

    run = RunDir(run_dir)
    recs = run.read_trials()
    ids = [r["trial_id"] for r in recs]
    done = [r for r in recs if r["status"] in FINISHED]
    failed = [r for r in recs if r["status"] == ERROR]
    with_reason = [r for r in failed if (r.get("error") or "").strip()]
    recorded = len(done) + len(failed)  # RUNNING at the end is not a recorded result
    configs = [json.dumps(r["config"], sort_keys=True) for r in done]
    study_trials = []
    if run.optuna_db.is_file():
        storage = optuna.storages.RDBStorage(run.optuna_url)
        try:
            study_trials = optuna.load_study(study_name=run.name, storage=storage).get_trials(deepcopy=False)
        except KeyError:
            study_trials = []
    optuna_ids = [t.user_attrs.get("trial_id") for t in study_trials]
    dup = (len(ids) - len(set(ids))) + (len(configs) - len(set(configs))) \
        + (len(optuna_ids) - len(set(optuna_ids)))
    return {"expected": expected, "recorded": recorded, "completed": len(done),
            "failed_with_reason": len(with_reason), "failed_without_reason": len(failed) - len(with_reason),
            "lost": max(0, expected - recorded), "duplicated": dup,
            "optuna_trials": len(study_trials),
            "optuna_missing": max(0, recorded - len(set(optuna_ids) & set(ids))),
            "errors": sorted({r["error"][:400] for r in with_reason})}


def broken_resume(run_dir: Path, dest: Path, expected: int = TRIALS) -> dict:
    """The count on a copy of ``run_dir`` with one trial removed from the records and the
    Optuna study: what a resume that skipped a trial leaves."""
    import optuna

    from archsearch.runs import RunDir

    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("tune"))
    run = RunDir(dest)
    victim = run.read_trials()[0]["trial_id"]
    run.trial_file(victim).unlink()
    storage = optuna.storages.RDBStorage(run.optuna_url)
    study = optuna.load_study(study_name=run_dir.name, storage=storage)
    # the copied study keeps the original name; drop the victim's Optuna trial as well
    keep = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("trial_id") != victim]
    optuna.delete_study(study_name=run_dir.name, storage=storage)
    new = optuna.create_study(study_name=run.name, storage=storage, directions=study.directions)
    new.add_trials(keep)
    return count(dest, expected)


# ---------------------------------------------------------------------- running trials
def running(run_dir: Path, epochs: int) -> list[dict]:
    """Trials mid-way: RUNNING, >= 1 epoch reported, not all."""
    from archsearch.runs import RUNNING, RunDir

    if not (run_dir / "trials").is_dir():
        return []
    return [r for r in RunDir(run_dir).read_trials()
            if r["status"] == RUNNING and 1 <= len(r["history"]) < epochs]


def wait_for(pred, timeout: float, proc=None, poll: float = 0.5):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the search exited (code {proc.returncode}) before the fault fired")
        time.sleep(poll)
    raise TimeoutError("the fault's moment never came")


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "archsearch.cli", *map(str, args)]


def flags(work: Path) -> list[str]:
    return ["--reports", str(work / "reports"), "--no-progress", "--no-ray-dashboard"]


def start(work: Path, fault: str, epochs: int, log) -> tuple[subprocess.Popen, Path]:
    space = work / f"{fault}.yaml"
    space.write_text(yaml.safe_dump(space_spec(fault, epochs)))
    proc = subprocess.Popen(cli("search", space, "--searcher", "random", "--name", fault,
                                "--storage", work / "runs", *flags(work)),
                            cwd=work, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    return proc, work / "runs" / fault


def event(run_dir: Path, epochs: int, what: str, t0: float, **extra) -> dict:
    mid = running(run_dir, epochs)
    return {"what": what, "t_s": round(time.time() - t0, 1),
            "running": [{"trial_id": r["trial_id"], "epochs_done": len(r["history"]), "pid": r.get("pid")}
                        for r in mid], **extra}


def run_driver_killed(work: Path, epochs: int, rng: random.Random, log) -> tuple[Path, list, int]:
    proc, run_dir = start(work, "driver_killed", epochs, log)
    t0, events = time.time(), []
    for k in range(3):
        delay = rng.uniform(20, 150)  # a random moment of this session...
        time.sleep(delay)             # ...then the first instant a trial is mid-way
        wait_for(lambda: running(run_dir, epochs), 900, proc)
        ev = event(run_dir, epochs, f"driver SIGKILL {k + 1}", t0, after_s=round(delay, 1))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        events.append(ev)
        time.sleep(2)
        proc = subprocess.Popen(cli("resume", run_dir, *flags(work)), cwd=work,
                                start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    return run_dir, events, proc.wait()


NODE_DRIVER = r"""
import json, sys, threading, time
from pathlib import Path
from ray.cluster_utils import Cluster
from archsearch.space import load_space
from archsearch.tune.ray_session import init_ray
from archsearch.tune.runner import run_search
from benchmarks.product import faults as F  # PYTHONPATH: the checkout (run_node_killed sets it)

work, epochs = Path(sys.argv[1]), int(sys.argv[2])
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
cluster.wait_for_nodes()
init_ray(cluster.address)
space = load_space(work / "node_killed.yaml")
out = {}
def go():
    out["res"] = run_search(space, searcher="random", name="node_killed", storage=work / "runs",
                            reports=work / "reports", progress=False, address=cluster.address)
t0 = time.time()
th = threading.Thread(target=go, daemon=True)
th.start()
run_dir = work / "runs" / "node_killed"
time.sleep(float(sys.argv[3]))
F.wait_for(lambda: len(F.running(run_dir, epochs)) >= 2, 900)
ev = F.event(run_dir, epochs, "worker node removed", t0, node_ip=nodes[0].node_ip_address)
cluster.remove_node(nodes[0], allow_graceful=False)
cluster.add_node(num_cpus=1)
th.join()
(work / "node_event.json").write_text(json.dumps(ev))
import os, ray
ray.shutdown(); cluster.shutdown(); os._exit(0)
"""


def run_node_killed(work: Path, epochs: int, rng: random.Random, log):
    (work / "node_killed.yaml").write_text(yaml.safe_dump(space_spec("node_killed", epochs)))
    script = work / "node_driver.py"
    script.write_text(NODE_DRIVER)
    argv = [sys.executable, script, work, epochs, round(rng.uniform(20, 150), 1)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}  # the driver imports benchmarks.product
    rc = subprocess.run(list(map(str, argv)), cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    ev = json.loads((work / "node_event.json").read_text()) if (work / "node_event.json").exists() else None
    return work / "runs" / "node_killed", [ev] if ev else [], rc


def run_plain(work: Path, fault: str, epochs: int, log):
    """c, d: the fault is in the sampled configs; proof is the recorded reasons."""
    proc, run_dir = start(work, fault, epochs, log)
    return run_dir, [], proc.wait()


def _oom(pid: int) -> None:
    CGROUP.mkdir(exist_ok=True)
    (CGROUP / "memory.limit_in_bytes").write_text(str(OOM_LIMIT))
    (CGROUP / "cgroup.procs").write_text(str(pid))


def _truncate_and_kill(run_dir: Path, trial: dict) -> str:
    ckpts = sorted((run_dir / "tune").glob(f"*{trial['trial_id']}*/checkpoint_*/state.pt"))
    if not ckpts:
        raise RuntimeError(f"no checkpoint of {trial['trial_id']} under {run_dir / 'tune'}")
    path = ckpts[-1]
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    os.kill(int(trial["pid"]), signal.SIGKILL)
    return f"{path.relative_to(run_dir)} cut from {size} to {size // 2} bytes"


def run_worker_fault(work: Path, fault: str, epochs: int, rng: random.Random, log):
    """e, f: pick a random moment, then act on one mid-way trial's worker process."""
    proc, run_dir = start(work, fault, epochs, log)
    t0 = time.time()
    time.sleep(rng.uniform(20, 150))
    mid = wait_for(lambda: [r for r in running(run_dir, epochs) if r.get("pid")], 900, proc)
    victim = mid[0]
    ev = event(run_dir, epochs, fault, t0, victim=victim["trial_id"], victim_pid=victim["pid"])
    if fault == "trial_oom_killed":
        _oom(int(victim["pid"]))
        # proof: the kernel's OOM killer, not us, ended the process
        wait_for(lambda: not os.path.exists(f"/proc/{victim['pid']}"), 300, proc)
        ev["oom_kills_in_cgroup"] = int(dict(line.split() for line in (
            CGROUP / "memory.oom_control").read_text().splitlines()).get("oom_kill", 0))
    else:
        ev["checkpoint"] = _truncate_and_kill(run_dir, victim)
    rc = proc.wait()
    if fault == "trial_oom_killed":
        for pid in (CGROUP / "cgroup.procs").read_text().split():
            Path("/sys/fs/cgroup/memory/cgroup.procs").write_text(pid)
        CGROUP.rmdir()
    return run_dir, [ev], rc


def fired(fault: str, events: list, counts: dict) -> bool:
    """Whether the fault happened as intended, judged from the events and the records."""
    if fault in ("trial_raises", "trial_nan"):
        key = "divisible" if fault == "trial_raises" else "FloatingPointError"
        return any(key in e for e in counts["errors"])
    need = 3 if fault == "driver_killed" else 1
    ok = len(events) == need and all(ev["running"] for ev in events)
    if fault == "trial_oom_killed":
        ok = ok and events[0].get("oom_kills_in_cgroup", 0) >= 1
    if fault == "truncated_checkpoint":
        ok = ok and any(e.startswith("RuntimeError: checkpoint unreadable") for e in counts["errors"])
    return ok


def cmd_run(args) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    done = {r["fault"] for r in read_jsonl(RUNS)}
    for key in args.only.split(","):
        fault = FAULTS[key]
        if fault in done:
            print(f"{fault}: already measured (delete its line in {RUNS.name} to redo)")
            continue
        work = WORK / fault
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        rng = random.Random(f"{SEED}-{fault}")
        t0 = time.time()
        with open(work / "driver.log", "w") as log:
            if fault == "driver_killed":
                run_dir, events, rc = run_driver_killed(work, args.epochs, rng, log)
            elif fault == "node_killed":
                run_dir, events, rc = run_node_killed(work, args.epochs, rng, log)
            elif fault in ("trial_raises", "trial_nan"):
                run_dir, events, rc = run_plain(work, fault, args.epochs, log)
            else:
                run_dir, events, rc = run_worker_fault(work, fault, args.epochs, rng, log)
        counts = count(run_dir)
        row = {"fault": fault, "exit_code": rc, "events": events, **counts,
               "fired": fired(fault, events, counts), "wall_s": round(time.time() - t0, 1),
               "trial_seconds": _trial_seconds(run_dir), "commit": git_commit(), "epochs": args.epochs}
        if fault == "driver_killed":
            row["broken_resume"] = broken_resume(run_dir, WORK / "broken_resume")
        RunLog(RUNS).append(row)
        print(f"{fault}: {json.dumps({k: row[k] for k in ('fired', 'completed', 'failed_with_reason', 'lost', 'duplicated', 'wall_s')})}")
    write_json(OUT, build(args, record_reads=True))
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


def _trial_seconds(run_dir: Path) -> list[float]:
    from archsearch.runs import RunDir

    return [round(r["metrics"]["time_total_s"], 1) for r in RunDir(run_dir).read_trials()
            if r["status"] == "TERMINATED" and r["metrics"].get("time_total_s")]


def build(args: argparse.Namespace | None = None, *, record_reads: bool = True) -> dict[str, Any]:
    """The result from the run log (prints the table): the one builder of ``run`` and
    ``analyze``. Reads no test split (a fault run has none)."""
    import statistics

    rows = read_jsonl(RUNS)
    if not rows:
        raise ValueError(f"{RUNS.relative_to(ROOT)}: no fault runs yet (run first)")
    rows.sort(key=lambda r: list(FAULTS.values()).index(r["fault"]))
    print(f"{'fault':22s} {'fired':>5s} {'exp':>4s} {'done':>5s} {'failed+reason':>13s} {'lost':>5s} "
          f"{'dup':>4s} {'wall s':>7s}  fault moment (s) / trials running then")
    for r in rows:
        when = "; ".join(f"{e['t_s']}: {','.join(x['trial_id'] for x in e['running'])}" for e in r["events"])
        print(f"{r['fault']:22s} {str(r['fired']):>5s} {r['expected']:4d} {r['completed']:5d} "
              f"{r['failed_with_reason']:13d} {r['lost']:5d} {r['duplicated']:4d} {r['wall_s']:7.0f}  {when}")
    broken = next((r["broken_resume"] for r in rows if "broken_resume" in r), None)
    secs = [s for r in rows for s in r["trial_seconds"]]
    summary = {"lost_trials": sum(r["lost"] for r in rows),
               "duplicated_trials": sum(r["duplicated"] for r in rows),
               "faults_fired": sum(bool(r["fired"]) for r in rows),
               "fault_runs": len(rows),
               "broken_resume_caught": bool(broken and broken["lost"] == 1),
               "mean_trial_s": round(statistics.mean(secs), 1) if secs else None,
               "min_trial_s": min(secs) if secs else None}
    print(f"broken resume (one trial removed from run a): lost={broken and broken['lost']}")
    print(json.dumps(summary))
    prov = provenance(commits=[r["commit"] for r in rows],
                      command="python -m benchmarks.product.faults run; python -m benchmarks.product.faults analyze",
                      seeds={"searcher": SEED, "fault_moments": [f"random.Random('{SEED}-<fault>')"]},
                      wall_s=sum(r["wall_s"] for r in rows))
    return build_result(summary, prov, name="faults.json", targets=TARGETS, record_reads=record_reads,
                        runs=rows, method=__doc__)


def results(args: argparse.Namespace) -> dict[Path, dict[str, Any]]:
    """``{results/faults.json: the result}`` from the committed run log."""
    return {OUT: build(args, record_reads=not args.check)}


def _run_arguments(p: argparse.ArgumentParser) -> None:
    if p.prog.split()[-1] == "run":
        p.add_argument("--only", default="a,b,c,d,e,f", help="faults to run (a-f)")
        p.add_argument("--epochs", type=int, default=6)


COMMAND = Command(__doc__.splitlines()[0], run=cmd_run, results=results, add_arguments=_run_arguments)


def main(argv: list[str] | None = None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
