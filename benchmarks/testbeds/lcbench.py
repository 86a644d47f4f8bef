"""LCBench through the YAHPO Gym surrogate: the shared test bed of the searchers, AHTO-policy and
scheduler questions.

LCBench (Zimmer, Lindauer, Hutter 2021) trained MLPs on 34 OpenML tasks over 7
hyperparameters and recorded learning curves; YAHPO Gym (Pfisterer et al., AutoML Conf 2022)
fits one surrogate (ONNX) that predicts, for a task, a configuration and an epoch 1..52,
``val_accuracy`` (percent), ``time`` (seconds of training up to that epoch) and four more
targets. One evaluation takes microseconds, so a whole search (and a policy's meta-training)
can be simulated on 2 cores.

The surrogate is vendored in ``benchmarks/testbeds/data/yahpo_lcbench/`` (Apache-2.0, see its
PROVENANCE.md) and read with ``onnxruntime`` directly: ``yahpo-gym==1.0.2`` pins numpy < 2 and
cannot live in this environment. The input layout is yahpo-gym's
``BenchmarkSet._config_to_xs``: ``x_cat`` = the task's integer code from ``encoding.json``
(int32, ``n x 1``), ``x_cont`` = ``epoch, batch_size, learning_rate, momentum, weight_decay,
num_layers, max_units, max_dropout`` (float32, ``n x 8``, yahpo's ``cont_names`` order, raw
values). :func:`check_yahpo` compares this reader with yahpo-gym itself (run in a throwaway
virtual environment); ``python -m benchmarks.searchers.lcbench run --check-yahpo PYTHON`` writes
``benchmarks/searchers/results/lcbench_check.json``.

The task split (``benchmarks/testbeds/data/lcbench_split.json``, committed before any run: 20
meta-training, 4 validation, 10 test tasks) is read by every question on this test bed
(:func:`load_split`); its test tasks are the test set ``lcbench:test_tasks`` of the ledger.

The problems (:class:`LCBenchProblem`): on one task, maximise ``val_accuracy`` and minimise
``time`` at epoch 52 (two objectives), or maximise ``val_accuracy`` alone. The searchers are
given no reference point (a user would not know one). Scores use a fixed reference point and
best-known front per task (:func:`task_reference`): the worst ``val_accuracy`` and the worst
``time`` of a 32,768-point scrambled Sobol sample of the space (seed 0), and the hypervolume of
that sample's front; :func:`summarize_lcbench` divides by the larger of that and the best any
run found.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.evidence.frontier import hv2 as _hv2
from benchmarks.evidence.provenance import ROOT
from benchmarks.evidence.stats import wilcoxon

#: the vendored surrogate (model.onnx, config_space.json, encoding.json)
DATA = ROOT / "benchmarks" / "testbeds" / "data" / "yahpo_lcbench"
#: the committed task split (20 train / 4 validation / 10 test)
SPLIT = ROOT / "benchmarks" / "testbeds" / "data" / "lcbench_split.json"
#: yahpo-gym's ``cont_names`` for lcbench (the column order of ``x_cont``)
CONT = ("epoch", "batch_size", "learning_rate", "momentum", "weight_decay", "num_layers",
        "max_units", "max_dropout")
#: yahpo-gym's ``y_names`` for lcbench (the column order of the output)
TARGETS = ("time", "val_accuracy", "val_cross_entropy", "val_balanced_accuracy",
           "test_cross_entropy", "test_balanced_accuracy")
PARAMS = CONT[1:]
EPOCHS = 52
REFERENCE_SAMPLE_LOG2 = 15  # 32,768 points
#: the budgets (trials) searches on LCBench are read at
LC_BUDGETS = (10, 20, 40)
#: the initial design of every model-based searcher and TPE/GP's startup
N_INIT = 6
#: every searcher :func:`build_searcher` builds
LC_SEARCHERS = ("random", "tpe", "nsga2", "gp", "qnehvi", "transfer", "transfer_gp", "ahto")
REGRET_FLOOR = 1e-4
#: the label of ``ahto`` rows whose asks a (removed, per-run) policy decided (:func:`read_runs`)
POLICY = "ahto_policy"


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
    """The surrogate of :data:`DATA`, loaded once per process."""
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


def hv2(Y, ref) -> float:
    """Hypervolume of ``Y`` (n, 2), both objectives maximised, above ``ref``
    (:func:`benchmarks.evidence.frontier.hv2`)."""
    return _hv2(Y, ref)


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
    """One LCBench task behind the searchers' problem interface (``name, space, cost_fn, ref,
    max_hv, evaluate, objectives, feasible``; ``benchmarks.searchers.searchers.run_one``).

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


def load_split(path: Path | str = SPLIT) -> dict:
    """The committed task split: ``{"train": [...], "validation": [...], "test": [...]}``."""
    return json.loads(Path(path).read_text())["split"]


def make_split(seed: int = 0) -> dict:
    """20 meta-training, 4 validation, 10 test task ids: a seeded shuffle of the 34 tasks."""
    tasks = list(surrogate().tasks)
    rng = np.random.default_rng(seed)
    order = [tasks[i] for i in rng.permutation(len(tasks))]
    return {"train": order[:20], "validation": order[20:24], "test": order[24:]}


def tasks_of(spec: str, split_path: Path | str = SPLIT) -> list[str]:
    """Task ids of ``spec``: ``train|validation|test|TASK_ID``, comma-separated."""
    split = load_split(split_path)
    out: list[str] = []
    for part in spec.split(","):
        out += split[part] if part in split else [part]
    return out


@functools.lru_cache(maxsize=None)
def transfer_design(n: int = N_INIT, split_path: str = str(SPLIT)) -> tuple:
    """The non-RL transfer baseline's initial design: ``n`` configs of the 32,768-point Sobol
    pool chosen greedily to maximise the mean over the *training* tasks of ``split_path`` of the
    normalised hypervolume of the chosen set (a greedy set cover of the training tasks' fronts;
    in the spirit of Wistuba et al. 2015, "Learning hyperparameter optimization
    initializations"). Candidates: the union of the training tasks' Pareto-front configs in the
    pool. Returns the configs as sorted-key JSON strings."""
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


#: past searches per history task (:func:`history`): evaluated configs of a scrambled Sobol sample
HISTORY_ROWS = 512


@functools.lru_cache(maxsize=None)
def history(kind: str, rows: int = HISTORY_ROWS, split_path: str = str(SPLIT)) -> tuple:
    """Earlier searches a transfer searcher is given, as ``{"config", "metrics"}`` row lists:

    * ``"train"``: one per *training* task of ``split_path``, ``rows`` configs of a scrambled
      Sobol sample (seeded by the task) with their surrogate ``val_accuracy`` and ``time``;
    * ``"unrelated"``: 20 tasks of another family on the same configs: each metric a random
      smooth function of the unit-cube encoding (5 Gaussian bumps of width 0.3 at random
      centres and weights, seeded per task; ``time`` is ``exp`` of one, so positive), which no
      LCBench task follows.
    """
    from scipy.stats import qmc

    s = surrogate()
    space = search_space()
    out = []
    if kind == "train":
        for t in load_split(Path(split_path))["train"]:
            U = qmc.Sobol(d=len(PARAMS), scramble=True, seed=int(t)).random(rows)
            cfgs = s.decode(U)
            y = s.predict(t, cfgs)
            out.append([{"config": c, "metrics": {"val_accuracy": float(a), "time": float(b)}}
                        for c, a, b in zip(cfgs, y["val_accuracy"], y["time"])])
    elif kind == "unrelated":
        for k in range(20):
            rng = np.random.default_rng(1000 + k)
            U = qmc.Sobol(d=len(PARAMS), scramble=True, seed=1000 + k).random(rows)
            cfgs = s.decode(U)
            X = np.array([space.encode(c) for c in cfgs])

            def bumps():
                C, w = rng.random((5, X.shape[1])), rng.normal(size=5)
                return (w * np.exp(-((X[:, None, :] - C[None]) ** 2).sum(-1) / (2 * 0.3 ** 2))).sum(-1)

            acc, tim = 80 + 10 * bumps(), np.exp(4 + bumps())
            out.append([{"config": c, "metrics": {"val_accuracy": float(a), "time": float(b)}}
                        for c, a, b in zip(cfgs, acc, tim)])
    else:
        raise ValueError(f"unknown history {kind!r}: train or unrelated")
    return tuple(tuple(t) for t in out)


def build_searcher(name: str, problem: LCBenchProblem, seed: int, n_init: int = N_INIT, **kwargs):
    """The searcher ``name`` of :data:`LC_SEARCHERS` for ``problem``, through
    ``archsearch.search.make`` (the CLI's construction path) with an initial design of
    ``n_init``; ``transfer`` is ``qnehvi`` whose initial design is :func:`transfer_design`,
    ``transfer_gp`` Optuna's ``GPSampler`` with the same configs enqueued first. A ``history``
    keyword (``"train"`` or ``"unrelated"``) is replaced by :func:`history`'s searches."""
    from archsearch.search import make

    if isinstance(kwargs.get("history"), str):
        kwargs["history"] = [list(t) for t in history(kwargs["history"])]
    if name in ("random", "nsga2"):
        return make(name, problem.space, seed=seed, **kwargs)
    if name in ("tpe", "gp"):
        return make(name, problem.space, seed=seed, n_startup_trials=n_init, **kwargs)
    if name == "transfer_gp":
        return make("gp", problem.space, seed=seed, n_startup_trials=n_init,
                    initial_configs=[json.loads(c) for c in transfer_design(n_init)], **kwargs)
    if name == "transfer":
        return make("qnehvi", problem.space, seed=seed, n_init=n_init,
                    initial_configs=[json.loads(c) for c in transfer_design(n_init)], **kwargs)
    return make(name, problem.space, seed=seed, n_init=n_init, **kwargs)


def read_runs(path: Path | str) -> list[dict]:
    """The search runs of a run log (one JSON line per run of the searchers' ``run_one``), one
    per (problem, searcher, seed): the longest (first on ties). ``ahto`` rows whose asks a
    policy decided are relabelled :data:`POLICY`. A line cut short by a kill is skipped."""
    best: dict[tuple, dict] = {}
    if not Path(path).exists():
        return []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError:  # a line cut short by a kill: that run is redone
            print(f"{path}: skipping a malformed line", file=sys.stderr)
            continue
        if r["searcher"] == "ahto" and "policy" in (r.get("decided_by") or []):
            r["searcher"] = POLICY  # AHTO with the policy it had until the ablation removed it
        k = (r["problem"], r["searcher"], r["seed"])
        if k not in best or len(r["curve"]) > len(best[k]["curve"]):
            best[k] = r
    return list(best.values())


def done_runs(path: Path | str, budget: int) -> set[tuple[str, str, int]]:
    """``(problem, searcher, seed)`` of the runs of ``path`` that reached ``budget`` trials."""
    return {(r["problem"], r["searcher"], r["seed"]) for r in read_runs(path) if len(r["curve"]) >= budget}


def search_job(job: tuple, n_init: int = N_INIT) -> dict:
    """One LCBench search for :func:`run_searches`: ``job`` = ``(task, label, searcher, kwargs,
    seed, budget)``, 2 objectives, the searcher built by :func:`build_searcher`; the run's row
    (``benchmarks.testbeds.search_loop.run_one``) with its task, seconds, kwargs and the
    searcher's ``prior_weight`` (None without history)."""
    import time

    import torch

    from benchmarks.testbeds.search_loop import run_one

    torch.set_num_threads(1)
    task, label, searcher, kwargs, seed, budget = job
    problem = LCBenchProblem(task, 2, budget)
    t0 = time.time()
    core = build_searcher(searcher, problem, seed, n_init=n_init, **kwargs)
    r = run_one(problem, label, seed, budget=budget, core=core)
    r.update(task=task, objectives=2, seconds=time.time() - t0, kwargs=kwargs,
             prior_weight=getattr(core, "prior_weight", None))
    return r


def run_searches(job, jobs: list[tuple], runs: Path | str, workers: int, stage: str) -> None:
    """``job(j) -> run row`` over ``jobs`` in ``workers`` spawned processes; each row is appended
    to the run log ``runs`` with the commit as it finishes (resumable: callers leave out the
    :func:`done_runs`), with one progress line per run."""
    import time
    from multiprocessing import get_context

    from benchmarks.evidence.provenance import git_commit
    from benchmarks.evidence.runlog import RunLog

    print(f"{stage}: {len(jobs)} runs to do -> {runs}", flush=True)
    commit, start = git_commit(), time.time()
    with get_context("spawn").Pool(workers) as pool:
        for k, r in enumerate(pool.imap_unordered(job, jobs), 1):
            r["commit"] = commit
            RunLog(runs).append(r)
            print(f"[{k}/{len(jobs)}] {r['problem']} {r['searcher']} seed={r['seed']} "
                  f"hv@{len(r['curve'])}={r['curve'][-1]:.4f} {r['seconds']:.1f}s (elapsed {time.time() - start:.0f}s)",
                  flush=True)


def log_regret(hv: float, best: float, floor: float = REGRET_FLOOR) -> float:
    """``log10`` of the normalised hypervolume regret ``1 - hv / best``, floored at ``floor``."""
    return math.log10(max(1.0 - hv / best, floor))


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
    """``a`` vs ``b`` at ``budget`` over the tasks of ``table`` (:func:`summarize_lcbench`):
    median over tasks of the ratio of (linear) median regrets, the Wilcoxon signed-rank p over
    tasks of the log10 regrets (:func:`benchmarks.evidence.stats.wilcoxon`), and the number of
    tasks where ``a``'s median regret is worse."""
    pairs = [(v[a][str(budget)], v[b][str(budget)]) for v in table.values()
             if str(budget) in v.get(a, {}) and str(budget) in v.get(b, {})]
    if not pairs:
        return {"ratio": None, "p": None, "worse": None, "tasks": 0}
    ratios = [10 ** (x - y) for x, y in pairs]
    x, y = zip(*pairs)
    return {"ratio": float(statistics.median(ratios)), "p": wilcoxon(x, y), "worse": sum(u > v for u, v in pairs),
            "tasks": len(pairs)}


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


def check_yahpo(python: str, n: int = 300, seed: int = 0, data: Path = DATA) -> dict:
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
        folder = Path(tmp) / "data"
        (folder / "lcbench").mkdir(parents=True)
        for f in Path(data).iterdir():
            (folder / "lcbench" / f.name).symlink_to(f)
        ins, outs = Path(tmp) / "in.json", Path(tmp) / "out.json"
        ins.write_text(json.dumps([{k: v for k, v in r.items()} for r in rows]))
        script = Path(tmp) / "run.py"
        script.write_text(_YAHPO_SCRIPT)
        env = dict(os.environ, PYTHONPATH="")
        subprocess.run([python, str(script), str(folder), str(ins), str(outs)], check=True, env=env)
        theirs = {r["i"]: r for r in json.loads(outs.read_text())}
    diffs = {}
    for name in TARGETS:
        mine = np.concatenate([s.predict(r["OpenML_task_id"], [r], r["epoch"])[name] for r in rows])
        ref = np.array([theirs[r["i"]][name] for r in rows])
        diffs[name] = {"max_abs_diff": float(np.abs(mine - ref).max()),
                       "max_rel_diff": float((np.abs(mine - ref) / np.maximum(np.abs(ref), 1e-12)).max()),
                       "range": [float(ref.min()), float(ref.max())]}
    return diffs
