"""LCBench through the YAHPO Gym surrogate: a real, discriminative benchmark for searchers.

LCBench (Zimmer, Lindauer, Hutter 2021) trained MLPs on 34 OpenML tasks over 7
hyperparameters and recorded learning curves; YAHPO Gym (Pfisterer et al., AutoML Conf 2022)
fits one surrogate (ONNX) that predicts, for a task, a configuration and an epoch 1..52,
``val_accuracy`` (percent), ``time`` (seconds of training up to that epoch) and four more
targets. One evaluation takes microseconds, so a whole search (and a policy's meta-training)
can be simulated on 2 cores.

The surrogate is vendored in ``benchmarks/data/yahpo_lcbench/`` (Apache-2.0, see its
PROVENANCE.md) and read with ``onnxruntime`` directly: ``yahpo-gym==1.0.2`` pins numpy < 2 and
cannot live in this environment. The input layout is yahpo-gym's
``BenchmarkSet._config_to_xs``: ``x_cat`` = the task's integer code from ``encoding.json``
(int32, ``n x 1``), ``x_cont`` = ``epoch, batch_size, learning_rate, momentum, weight_decay,
num_layers, max_units, max_dropout`` (float32, ``n x 8``, yahpo's ``cont_names`` order, raw
values). ``check-yahpo`` compares this reader with yahpo-gym itself (run in a throwaway
virtual environment) on a few hundred configurations and writes
``benchmarks/results/lcbench_check.json``.

The problems (:class:`LCBenchProblem`): on one task, maximise ``val_accuracy`` and minimise
``time`` at epoch 52 (two objectives), or maximise ``val_accuracy`` alone. The searchers are
given no reference point (a user would not know one). Scores use a fixed reference point and
best-known front per task (:func:`task_reference`): the worst ``val_accuracy`` and the worst
``time`` of a 32,768-point scrambled Sobol sample of the space (seed 0), and the hypervolume of
that sample's front; ``searchers.py`` divides by the larger of that and the best any run found.

Usage::

    python benchmarks/lcbench.py check-yahpo --python /tmp/yahpo_venv/bin/python
    python benchmarks/lcbench.py tasks          # the committed split, task by task
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # searchers.py, common.py
from searchers import hv2_min, read_runs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "yahpo_lcbench"
PROTOCOL = ROOT / "benchmarks" / "protocols" / "lcbench_split.json"
CHECK_OUT = ROOT / "benchmarks" / "results" / "lcbench_check.json"
#: yahpo-gym's ``cont_names`` for lcbench (the column order of ``x_cont``)
CONT = ("epoch", "batch_size", "learning_rate", "momentum", "weight_decay", "num_layers",
        "max_units", "max_dropout")
#: yahpo-gym's ``y_names`` for lcbench (the column order of the output)
TARGETS = ("time", "val_accuracy", "val_cross_entropy", "val_balanced_accuracy",
           "test_cross_entropy", "test_balanced_accuracy")
PARAMS = CONT[1:]
EPOCHS = 52
REFERENCE_SAMPLE_LOG2 = 15  # 32,768 points


class Surrogate:
    """The YAHPO LCBench ONNX surrogate.

    Args:
        data: folder with ``model.onnx``, ``config_space.json``, ``encoding.json``.

    Attributes:
        tasks: the 34 OpenML task ids (strings), in ``config_space.json`` order.
        params: name -> ``(low, high, log, is_int)`` of the 7 hyperparameters.

    Raises:
        FileNotFoundError: ``data`` lacks one of the files.
    """

    def __init__(self, data: Path = DATA):
        import onnxruntime as rt

        data = Path(data)
        for f in ("model.onnx", "config_space.json", "encoding.json"):
            if not (data / f).is_file():
                raise FileNotFoundError(f"{data / f}: missing (the YAHPO LCBench surrogate)")
        opts = rt.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self.session = rt.InferenceSession(str(data / "model.onnx"), sess_options=opts,
                                           providers=["CPUExecutionProvider"])
        self.encoding = json.loads((data / "encoding.json").read_text())["OpenML_task_id"]
        cs = json.loads((data / "config_space.json").read_text())["hyperparameters"]
        by_name = {h["name"]: h for h in cs}
        self.tasks = list(by_name["OpenML_task_id"]["choices"])
        self.params = {k: (float(by_name[k]["lower"]), float(by_name[k]["upper"]), bool(by_name[k]["log"]),
                           by_name[k]["type"] == "uniform_int") for k in PARAMS}

    def predict(self, task: str, configs: list[dict], epoch: int | np.ndarray = EPOCHS) -> dict[str, np.ndarray]:
        """The surrogate's targets for ``configs`` on ``task``.

        Args:
            task: an OpenML task id of :attr:`tasks`.
            configs: n dicts with the 7 hyperparameters (raw values).
            epoch: 1..52, one for all or ``(n,)``.

        Returns:
            target name -> ``(n,)`` float64 array (``val_accuracy`` in percent, ``time`` in seconds).

        Raises:
            KeyError: unknown task or a missing hyperparameter.
        """
        n = len(configs)
        x_cont = np.empty((n, len(CONT)), dtype=np.float32)
        x_cont[:, 0] = epoch
        for j, k in enumerate(PARAMS, start=1):
            x_cont[:, j] = [c[k] for c in configs]
        x_cat = np.full((n, 1), self.encoding[str(task)], dtype=np.int32)
        out = self.session.run(None, {"x_cat": x_cat, "x_cont": x_cont})[0].astype(np.float64)
        return {name: out[:, i] for i, name in enumerate(TARGETS)}

    def decode(self, U: np.ndarray) -> list[dict]:
        """Unit-cube rows ``(n, 7)`` (PARAMS order) -> configs (log scale where the space says;
        integers rounded), as :meth:`archsearch.space.SearchSpace.decode` does."""
        out = []
        for u in np.atleast_2d(U):
            c = {}
            for x, (k, (lo, hi, log, is_int)) in zip(u, self.params.items()):
                v = math.exp(math.log(lo) + x * (math.log(hi) - math.log(lo))) if log else lo + x * (hi - lo)
                c[k] = int(min(max(round(v), lo), hi)) if is_int else float(min(max(v, lo), hi))
            out.append(c)
        return out


@functools.lru_cache(maxsize=1)
def surrogate() -> Surrogate:
    return Surrogate()


def search_space(objectives: int = 2, trials: int = 40, name: str = "lcbench"):
    """The archsearch ``SearchSpace`` of LCBench's 7 hyperparameters (ranges of its
    ``config_space.json``); objectives ``val_accuracy`` (max) and, with ``objectives=2``,
    ``time`` (min), no reference point; budget ``trials``. Built with ``model_construct``: the
    metric names are LCBench's, not archsearch's METRICS."""
    from archsearch.space import Budget, FloatParam, IntParam, Objective, SearchSpace

    params = {}
    for k, (lo, hi, log, is_int) in surrogate().params.items():
        params[k] = (IntParam(type="int", low=int(lo), high=int(hi), log=log) if is_int
                     else FloatParam(type="float", low=lo, high=hi, log=log))
    objs = [Objective.model_construct(metric="val_accuracy", mode="max", ref=None)]
    if objectives == 2:
        objs.append(Objective.model_construct(metric="time", mode="min", ref=None))
    return SearchSpace.model_construct(name=name, task="classification", params=params, objectives=objs,
                                       constraints={}, budget=Budget(trials=trials), fixed={}, seed=0,
                                       source=None)


def hv2(Y: np.ndarray, ref) -> float:
    """Hypervolume of ``Y`` (n, 2), both objectives maximised, above ``ref``: the sweep of
    ``searchers.hv2_min`` on the negated points."""
    Y = np.asarray(Y, dtype=np.float64).reshape(-1, 2)
    return hv2_min((-Y).tolist(), [-ref[0], -ref[1]])


@functools.lru_cache(maxsize=None)
def task_reference(task: str, objectives: int = 2) -> dict:
    """The fixed scoring frame of ``task``: reference point (maximisation form) and the
    hypervolume (or best ``val_accuracy`` for one objective) of a 32,768-point Sobol sample."""
    from scipy.stats import qmc

    s = surrogate()
    U = qmc.Sobol(d=len(PARAMS), scramble=True, seed=0).random_base2(REFERENCE_SAMPLE_LOG2)
    y = s.predict(task, s.decode(U))
    Y = np.stack([y["val_accuracy"], -y["time"]], -1)
    if objectives == 1:
        return {"ref": [float(Y[:, 0].min())], "best": float(Y[:, 0].max())}
    ref = [float(Y[:, 0].min()), float(Y[:, 1].min())]
    return {"ref": ref, "best": hv2(Y, ref)}


class LCBenchProblem:
    """One LCBench task behind ``benchmarks/searchers.py``'s problem interface
    (``name, space, cost_fn, ref, max_hv, evaluate, objectives, feasible``).

    Args:
        task: OpenML task id.
        objectives: 2 (``val_accuracy`` max, ``time`` min) or 1 (``val_accuracy``).
        trials: the space's budget (the searchers' horizon).
    """

    table = None
    cost_fn = None

    def __init__(self, task: str, objectives: int = 2, trials: int = 40):
        self.task, self.n_obj = str(task), int(objectives)
        self.name = f"lcbench{'' if objectives == 2 else '1'}_{task}"
        self.space = search_space(objectives, trials, self.name)
        ref = task_reference(self.task, self.n_obj)
        self.ref, self.max_hv = ref["ref"], ref["best"]
        self.max_hv_method = f"Sobol sample of {2 ** REFERENCE_SAMPLE_LOG2} configs (seed 0)"

    def evaluate(self, config):
        y = surrogate().predict(self.task, [config])
        metrics = {"val_accuracy": float(y["val_accuracy"][0]), "time": float(y["time"][0])}
        return dict(config), metrics, False

    def objectives(self, metrics):
        if self.n_obj == 1:
            return [metrics["val_accuracy"]]
        return [metrics["val_accuracy"], -metrics["time"]]

    def feasible(self, metrics):
        return True

    def score(self, ys: list[list[float]]) -> float:
        """HV (or best accuracy minus the reference, one objective) of maximisation-form ``ys``."""
        if not ys:
            return 0.0
        if self.n_obj == 1:
            return max(0.0, max(y[0] for y in ys) - self.ref[0])
        return hv2(np.array(ys), self.ref)


def load_split(path: Path = PROTOCOL) -> dict:
    """The committed task split: ``{"train": [...], "validation": [...], "test": [...]}``."""
    return json.loads(Path(path).read_text())["split"]


def make_split(seed: int = 0) -> dict:
    """20 meta-training, 4 validation, 10 test task ids: a seeded shuffle of the 34 tasks."""
    tasks = list(surrogate().tasks)
    rng = np.random.default_rng(seed)
    order = [tasks[i] for i in rng.permutation(len(tasks))]
    return {"train": order[:20], "validation": order[20:24], "test": order[24:]}


# ---------------------------------------------------------------------- searchers and runs
RUNS = ROOT / "benchmarks" / "data" / "lcbench_runs.jsonl"
LC_BUDGETS = (10, 20, 40)
N_INIT = 6  # the protocol's initial design for every model-based searcher and TPE/GP's startup
LC_SEARCHERS = ("random", "tpe", "nsga2", "gp", "qnehvi", "transfer", "ahto")
REGRET_FLOOR = 1e-4


@functools.lru_cache(maxsize=None)
def transfer_design(n: int = N_INIT, split_path: str = str(PROTOCOL)) -> tuple:
    """The non-RL transfer baseline's initial design: ``n`` configs of the 32,768-point Sobol
    pool chosen greedily to maximise the mean over the *training* tasks of the normalised
    hypervolume of the chosen set (a greedy set cover of the training tasks' fronts; in the
    spirit of Wistuba et al. 2015, "Learning hyperparameter optimization initializations").
    Candidates: the union of the training tasks' Pareto-front configs in the pool."""
    from scipy.stats import qmc

    s = surrogate()
    train = load_split(Path(split_path))["train"]
    U = qmc.Sobol(d=len(PARAMS), scramble=True, seed=0).random_base2(REFERENCE_SAMPLE_LOG2)
    cfgs = s.decode(U)
    Ys, cand = {}, set()
    for t in train:
        y = s.predict(t, cfgs)
        Y = np.stack([y["val_accuracy"], -y["time"]], -1)
        Ys[t] = Y
        order = np.argsort(-Y[:, 0], kind="stable")
        best = -np.inf
        for i in order:  # the pool's front on this task
            if Y[i, 1] > best:
                cand.add(int(i))
                best = Y[i, 1]
    cand = sorted(cand)
    chosen: list[int] = []
    for _ in range(n):
        def gain(i):
            return np.mean([hv2(Ys[t][chosen + [i]], task_reference(t)["ref"]) / task_reference(t)["best"]
                            for t in train])
        chosen.append(max((i for i in cand if i not in chosen), key=gain))
    return tuple(json.dumps(cfgs[i], sort_keys=True) for i in chosen)


def build_searcher(name: str, problem: "LCBenchProblem", seed: int, **kwargs):
    """The searcher ``name`` of :data:`LC_SEARCHERS` for ``problem``, through
    ``archsearch.search.make`` (the CLI's construction path) with the protocol's initial design
    of :data:`N_INIT`; ``transfer`` is ``qnehvi`` whose initial design is :func:`transfer_design`."""
    from archsearch.search import make

    if name in ("random", "nsga2"):
        return make(name, problem.space, seed=seed, **kwargs)
    if name in ("tpe", "gp"):
        return make(name, problem.space, seed=seed, n_startup_trials=N_INIT, **kwargs)
    if name == "transfer":
        return make("qnehvi", problem.space, seed=seed, n_init=N_INIT,
                    initial_configs=[json.loads(c) for c in transfer_design()], **kwargs)
    return make(name, problem.space, seed=seed, n_init=N_INIT, **kwargs)


def _run_job(job: tuple) -> dict:
    import torch

    torch.set_num_threads(1)
    from searchers import run_one

    task, n_obj, name, seed, budget, label, kwargs = job
    problem = LCBenchProblem(task, n_obj, budget)
    t0 = time.time()
    r = run_one(problem, label, seed, budget=budget, core=build_searcher(name, problem, seed, **kwargs))
    r.update(task=task, objectives=n_obj, seconds=time.time() - t0, kwargs=kwargs)
    return r


def _tasks(spec: str) -> list[str]:
    split = load_split()
    out = []
    for part in spec.split(","):
        out += split[part] if part in split else [part]
    return out


def cmd_run(args) -> None:
    """Resumable: one JSON line per (problem, searcher label, seed); ``--workers`` processes."""
    from multiprocessing import get_context

    from common import git_commit, parse_seeds

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["problem"], r["searcher"], r["seed"]) for r in read_runs(out) if len(r["curve"]) >= args.budget}
    kwargs = json.loads(args.kwargs) if args.kwargs else {}
    jobs = []
    for seed in parse_seeds(args.seeds):
        for task in _tasks(args.tasks):
            for name in args.searchers:
                label = args.label or name
                pname = f"lcbench{'' if args.objectives == 2 else '1'}_{task}"
                if (pname, label, seed) not in done:
                    jobs.append((task, args.objectives, name, seed, args.budget, label, kwargs))
    commit = git_commit()
    print(f"{len(jobs)} runs to do ({len(done)} done) -> {out}", flush=True)
    start = time.time()
    ctx = get_context("spawn")
    with ctx.Pool(args.workers) as pool:
        for k, r in enumerate(pool.imap_unordered(_run_job, jobs), 1):
            r["commit"] = commit
            with open(out, "a") as f:
                f.write(json.dumps(r) + "\n")
            at = "/".join(f"{r['curve'][b - 1]:.3f}" for b in LC_BUDGETS if b <= len(r["curve"]))
            print(f"[{k}/{len(jobs)}] {r['problem']} {r['searcher']} seed={r['seed']} hv={at} "
                  f"{r['seconds']:.1f}s (elapsed {time.time() - start:.0f}s)", flush=True)


def log_regret(hv: float, best: float) -> float:
    """``log10`` of the normalised hypervolume regret ``1 - hv / best``, floored at 1e-4."""
    return math.log10(max(1.0 - hv / best, REGRET_FLOOR))


def summarize_lcbench(runs: list[dict], tasks: list[str], searchers: list[str], budgets=LC_BUDGETS,
                      objectives: int = 2, seeds: list[int] | None = None) -> dict:
    """Per task x searcher x budget: median over seeds of log10 regret (the seeds every searcher
    has on that task); the normaliser is the larger of the Sobol reference and the best any run
    found. Returns ``{"table": ..., "seeds": ..., "normaliser": ...}``."""
    prefix = "lcbench" if objectives == 2 else "lcbench1"
    table, seeds_used, norm = {}, {}, {}
    for t in tasks:
        p = f"{prefix}_{t}"
        rs = [r for r in runs if r["problem"] == p]
        by = {s: {r["seed"]: r for r in rs if r["searcher"] == s} for s in searchers}
        if not rs or any(not v for v in by.values()):
            continue
        common = sorted(set.intersection(*(set(v) for v in by.values())))
        if seeds is not None:
            common = [k for k in common if k in seeds]
        best = max(max(rs[0]["max_hv"], max(max(r["hv"]) for r in rs)), 1e-12)
        norm[t] = {"sobol": rs[0]["max_hv"], "used": best}
        seeds_used[t] = common
        table[t] = {s: {str(b): statistics.median(log_regret(by[s][k]["hv"][b - 1], best) for k in common)
                        for b in budgets if all(len(by[s][k]["hv"]) >= b for k in common)}
                    for s in searchers}
    return {"table": table, "seeds": seeds_used, "normaliser": norm}


def compare(table: dict, a: str, b: str, budget: int) -> dict:
    """``a`` vs ``b`` at ``budget`` over the tasks of ``table``: median over tasks of the ratio of
    (linear) median regrets, two-sided Wilcoxon signed-rank p over tasks (log10 regrets), and the
    number of tasks where ``a``'s median regret is worse."""
    from scipy.stats import wilcoxon

    pairs = [(v[a][str(budget)], v[b][str(budget)]) for v in table.values()
             if str(budget) in v.get(a, {}) and str(budget) in v.get(b, {})]
    if not pairs:
        return {"ratio": None, "p": None, "worse": None, "tasks": 0}
    ratios = [10 ** (x - y) for x, y in pairs]
    d = [x - y for x, y in pairs if x != y]
    p = float(wilcoxon(d).pvalue) if len(d) >= 5 else None
    return {"ratio": float(statistics.median(ratios)), "p": p, "worse": sum(x > y for x, y in pairs),
            "tasks": len(pairs)}


def cmd_summarize(args) -> None:
    runs = read_runs(Path(args.runs))
    tasks = _tasks(args.tasks)
    s = summarize_lcbench(runs, tasks, args.searchers, objectives=args.objectives)
    hdr = "task     " + "".join(f"{x:>20s}" for x in args.searchers)
    print(f"median log10 HV regret at {'/'.join(map(str, LC_BUDGETS))} trials (seeds per task: "
          f"{sorted({len(v) for v in s['seeds'].values()})})")
    print(hdr)
    for t, row in s["table"].items():
        cells = ["/".join(f"{row[x].get(str(b), float('nan')):.2f}" for b in LC_BUDGETS) for x in args.searchers]
        print(f"{t:8s} " + "".join(f"{c:>20s}" for c in cells))
    ref = args.searchers[-1]
    for other in args.searchers[:-1]:
        c = compare(s["table"], ref, other, 20)
        print(f"{ref} vs {other} at 20: ratio {c['ratio']}, p {c['p']}, worse on {c['worse']}/{c['tasks']}")


# ---------------------------------------------------------------------- check against yahpo-gym
_YAHPO_SCRIPT = """
import json, sys
from yahpo_gym import local_config, BenchmarkSet
local_config.init_config()
local_config.set_data_path(sys.argv[1])
rows = json.load(open(sys.argv[2]))
out = []
for task in sorted({r["OpenML_task_id"] for r in rows}):
    bench = BenchmarkSet("lcbench", instance=task)
    mine = [r for r in rows if r["OpenML_task_id"] == task]
    res = bench.objective_function([dict(r) for r in mine])
    out += [{"i": r["i"], **{k: float(v) for k, v in y.items()}} for r, y in zip(mine, res)]
json.dump(out, open(sys.argv[3], "w"))
"""


def check_yahpo(python: str, n: int = 300, seed: int = 0) -> dict:
    """Compare :class:`Surrogate` with yahpo-gym's ``BenchmarkSet.objective_function`` on ``n``
    random (task, config, epoch) rows, yahpo-gym run by ``python`` (a throwaway environment).
    Returns the max absolute and relative differences per target."""
    s = surrogate()
    rng = np.random.default_rng(seed)
    U = rng.random((n, len(PARAMS)))
    cfgs = s.decode(U)
    tasks = [s.tasks[i] for i in rng.integers(0, len(s.tasks), n)]
    epochs = rng.integers(1, EPOCHS + 1, n)
    rows = [{"i": i, "OpenML_task_id": t, "epoch": int(e), **c} for i, (t, e, c) in enumerate(zip(tasks, epochs, cfgs))]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        (data / "lcbench").mkdir(parents=True)
        for f in DATA.iterdir():
            (data / "lcbench" / f.name).symlink_to(f)
        ins, outs = Path(tmp) / "in.json", Path(tmp) / "out.json"
        ins.write_text(json.dumps([{k: v for k, v in r.items()} for r in rows]))
        script = Path(tmp) / "run.py"
        script.write_text(_YAHPO_SCRIPT)
        env = dict(os.environ, PYTHONPATH="")
        subprocess.run([python, str(script), str(data), str(ins), str(outs)], check=True, env=env)
        theirs = {r["i"]: r for r in json.loads(outs.read_text())}
    diffs = {}
    for name in TARGETS:
        mine = np.concatenate([s.predict(r["OpenML_task_id"], [r], r["epoch"])[name] for r in rows])
        ref = np.array([theirs[r["i"]][name] for r in rows])
        diffs[name] = {"max_abs_diff": float(np.abs(mine - ref).max()),
                       "max_rel_diff": float((np.abs(mine - ref) / np.maximum(np.abs(ref), 1e-12)).max()),
                       "range": [float(ref.min()), float(ref.max())]}
    return diffs


def cmd_check_yahpo(args) -> None:
    t0 = time.time()
    diffs = check_yahpo(args.python, args.n, args.seed)
    ver = subprocess.run([args.python, "-c", "import yahpo_gym, onnxruntime; print(yahpo_gym.__version__ if hasattr(yahpo_gym, '__version__') else '1.0.2', onnxruntime.__version__)"],
                         capture_output=True, text=True).stdout.split()
    # float32 network, batches of different sizes: agreement = within float32 rounding of the
    # target's scale (1e-5 of its largest magnitude), for every target
    worst = max(d["max_abs_diff"] / max(abs(d["range"][0]), abs(d["range"][1])) for d in diffs.values())
    out = {"summary": {"rows": args.n, "max_abs_diff_over_scale": worst, "agrees": worst < 1e-5,
                       "per_target": diffs},
           "provenance": _provenance(args, t0, {"yahpo_side": ver})}
    CHECK_OUT.parent.mkdir(parents=True, exist_ok=True)
    CHECK_OUT.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["summary"], indent=2))


def _provenance(args, t0: float, extra: dict | None = None) -> dict:
    """The shared provenance (:func:`common.provenance`: ``git_commit``, ``command``,
    ``machine``, ``wall_s``), plus this side's onnxruntime version."""
    from common import provenance
    import onnxruntime

    return provenance(seeds=[args.seed], wall_s=time.time() - t0,
                      onnxruntime=onnxruntime.__version__, **(extra or {}))


def cmd_tasks(args) -> None:
    split = load_split()
    for part, tasks in split.items():
        for t in tasks:
            ref = task_reference(t)
            print(f"{part:10s} {t:>7s}  ref acc {ref['ref'][0]:6.2f}  ref time {-ref['ref'][1]:9.1f}  HV {ref['best']:.1f}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check-yahpo", help="compare with yahpo-gym (a throwaway environment's python)")
    c.add_argument("--python", required=True)
    c.add_argument("--n", type=int, default=300)
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(fn=cmd_check_yahpo)
    t = sub.add_parser("tasks", help="print the committed split")
    t.set_defaults(fn=cmd_tasks)
    r = sub.add_parser("run", help="searches on LCBench tasks (resumable)")
    r.add_argument("--tasks", default="test", help="train|validation|test|TASK_ID, comma-separated")
    r.add_argument("--searchers", nargs="+", default=list(LC_SEARCHERS[:-1]))
    r.add_argument("--seeds", default="0-4")
    r.add_argument("--budget", type=int, default=40)
    r.add_argument("--objectives", type=int, default=2, choices=(1, 2))
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--label", default=None, help="record the runs under this searcher name (a variant)")
    r.add_argument("--kwargs", default=None, help="JSON keyword arguments for the searcher")
    r.add_argument("--out", default=str(RUNS))
    r.set_defaults(fn=cmd_run)
    m = sub.add_parser("summarize", help="print the regret table (searchers.py summarize writes the JSON)")
    m.add_argument("--runs", default=str(RUNS))
    m.add_argument("--tasks", default="test")
    m.add_argument("--searchers", nargs="+", default=list(LC_SEARCHERS[:-1]))
    m.add_argument("--objectives", type=int, default=2)
    m.set_defaults(fn=cmd_summarize)
    args = p.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
