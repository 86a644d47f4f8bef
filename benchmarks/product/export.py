"""Export, load, predict and serve the trials of a real search (issue 62): fidelity, speed, disk.

Protocol (``benchmarks/product/protocols/export.json``, committed before the run):

* Input: a finished run of the default search (``bash scripts/run.sh search``:
  ``search_spaces/minilm_budget.yaml`` with AHTO, MiniLM-L6 fine-tuned on Rotten Tomatoes
  sentences), given as ``--run``. Every successful trial is exported with the product's own
  :func:`archsearch.export.export_trial` (timed: ``export_s`` is the mean per trial, data from
  the cache), then loaded with :func:`archsearch.export.load`.
* Fidelity, per trial: the loaded model's logits on the validation split (the run's tokenized
  ids, 256-row batches as the trial evaluated) against the trial's own loop restored from its
  checkpoint (:class:`archsearch.tune.trainable.TrialLoop`): ``export_roundtrip_max_abs_logit_diff``
  (max over trials and rows); and the loaded model's accuracy on the validation **texts**
  (through the exported tokenizer) minus the trial's recorded accuracy:
  ``export_accuracy_minus_recorded`` (the largest absolute difference, signed).
* Predict: ``model.predict`` over the validation texts at batch size 1, 32 and 128 on
  ``--threads`` (2) torch threads, best of 3 passes: ``predict_rows_per_s_b{1,32,128}``, for the
  best trial by validation accuracy.
* Serve: the best trial on real Ray Serve (:func:`archsearch.serve.serve_model`, 127.0.0.1, one
  replica, ``max_batch_size`` 32) under a bounded local load: 1,000 requests of one validation
  text each, 16 client threads over loopback, after 32 warm-up requests. Two designs
  (:data:`SERVE_DESIGNS`, protocol addendum 1): the replica on 2 CPUs with a 5 ms batch wait (the
  first run's only design, 0.113x predict b32), and on 1 CPU (a core left to the HTTP proxy and
  the clients) with a 50 ms wait (fuller batches); the one with more rows/s is reported and
  becomes ``archsearch serve``'s default. ``serve_p50_ms`` / ``serve_p99_ms`` (client-side latency), ``serve_errors`` (non-200
  answers or a label different from ``model.predict``'s), ``serve_rows_per_s`` (requests / wall),
  ``serve_vs_predict_b32`` = serve_rows_per_s / predict_rows_per_s_b32.
* Disk: ``run_disk_mb_keep_weights_all`` (the run directory as given: a search with
  ``budget.keep_weights: all``, protocol addendum 3), ``export_dir_mb`` (the best trial's
  export); ``run_disk_mb_default_search``: a copy of the run after
  :func:`archsearch.tune.weights.keep_weights` with the default policy (``pareto``: what the
  default search ends with).

* HF: each static trial's export loaded by plain transformers
  (``AutoModelForSequenceClassification``, ``trust_remote_code``) in a Python that cannot import
  archsearch, on the first 256 validation texts: ``hf_static_max_abs_logit_diff`` (max over
  static trials; ``null`` when the run has none).

* ONNX (protocol addendum 2): each static, untied trial exported again with ``--format onnx``
  (:func:`archsearch.export.export_trial`, ``format="onnx"``), its ``model.onnx`` run by
  onnxruntime (``CPUExecutionProvider``) on the first 256 validation texts (ids from the exported
  tokenizer, padded to ``max_len``) against :func:`archsearch.export.load`'s ``predict_ids``
  (``regime="cascade"``): ``onnx_static_max_abs_logit_diff`` (max over those trials; ``null``
  when the run has none). A file the export's own check refuses (> 1e-4) is measured all the
  same (written unchecked) and the row keeps the refusal (``onnx_export_error``).

* Runtime (protocol addendum 3): the best trial's :class:`archsearch.runtime.Runtime`
  (``regime="auto"``: per rows and length, the cascade, a static cut within the FLOPs budget or
  the full model, chosen by timing) against the full model in the same runtime
  (``regime="full"``) over the first ``--runtime-rows`` (512) validation texts at batch 1, 8, 32
  and 128, after one untimed ``auto`` pass: best of 3 alternating passes each,
  ``runtime_wall_ratio_cpu_b{1,32}``, ``runtime_wall_ratio_cpu_max`` (over the four) and
  ``runtime_never_slower_than_full`` (every ratio <= 1.02); per batch size the executed FLOPs
  fraction and the rows each regime ran (``runtime_cpu``), and the regime table
  (``runtime_regimes_cpu``).

Targets (issue 62): roundtrip and HF diffs <= 1e-5; ONNX diff <= 1e-4; accuracy difference == 0; serve_errors == 0;
serve_vs_predict_b32 >= 0.8; runtime_wall_ratio_cpu_b1 <= 0.75, _b32 <= 0.8, _max <= 1.02.
Without a GPU the ``runtime_wall_ratio_gpu_*`` keys are not measured.

    python -m benchmarks.product.export run --run runs/minilm_budget [--threads 2] [--out PATH]
    python -m benchmarks.product.export analyze|check   # restate the stored result (no measuring)

The result is ``benchmarks/product/results/export.json``; ``analyze`` and ``check`` cannot
measure again (a real search, Ray Serve): they pass the stored numbers through the same builder
(:func:`build`) as ``run`` (:mod:`benchmarks.product.stored`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.evidence.cli import Command
from benchmarks.evidence.provenance import ROOT, provenance
from benchmarks.evidence.results import build_result, write_json
from benchmarks.evidence.stats import quantile
from benchmarks.product.stored import restate

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "export.json"
PROTOCOL = HERE / "protocols" / "export.json"
#: Issue 62's targets.
TARGETS = {"export_roundtrip_max_abs_logit_diff": "<= 1e-5", "export_accuracy_minus_recorded": "== 0",
           "hf_static_max_abs_logit_diff": "<= 1e-5", "onnx_static_max_abs_logit_diff": "<= 1e-4",
           "serve_errors": "== 0", "serve_vs_predict_b32": ">= 0.8",
           "runtime_wall_ratio_cpu_b1": "<= 0.75", "runtime_wall_ratio_cpu_b32": "<= 0.8",
           "runtime_wall_ratio_cpu_max": "<= 1.02"}  # runtime_never_slower_than_full: this bound


def dir_mb(path: Path) -> float:
    from archsearch.tune.weights import dir_bytes

    return dir_bytes(path) / 2**20


def fidelity(run_dir: Path, rec: dict, exported: Path) -> dict:
    import torch

    from archsearch.data import prepare_for_space
    from archsearch.data import load as load_dataset
    from archsearch.export import load, trial_checkpoint
    from archsearch.runs import RunDir
    from archsearch.tune.runner import trial_settings
    from archsearch.tune.trainable import TrialLoop

    run = RunDir.open(run_dir)
    space = run.load_space()
    data = prepare_for_space(space)
    loop = TrialLoop(rec["config"], data, {**trial_settings(space, 1), "device": "cpu"})
    loop.load(str(trial_checkpoint(run, rec["trial_id"])))
    loop.model.eval()
    model = load(exported)
    val = data["validation"]
    with torch.inference_mode():
        want = torch.cat([loop.gating.predict(x, m)[0].float() for x, m, _ in loop.eval_batches("validation")])
    got = model.predict_ids(val.input_ids, val.attention_mask, batch_size=256, regime="cascade").logits
    texts = load_dataset(space.dataset.name)["validation"]
    preds = model.predict(list(texts["text"]), batch_size=256, regime="cascade")
    acc = sum(p.label == y for p, y in zip(preds, texts["label"])) / len(preds)
    return {"trial_id": rec["trial_id"], "gating": model.meta["gating"],
            "max_abs_logit_diff": float((got - want).abs().max()),
            "accuracy": acc, "recorded_accuracy": rec["metrics"]["accuracy"],
            "accuracy_minus_recorded": acc - rec["metrics"]["accuracy"]}


#: plain transformers in a Python that cannot import archsearch (a finder refuses it): argv
#: DIR IDS.pt LOGITS.pt; prints whether archsearch got loaded and the labels (tests/test_export.py
#: runs it too)
HF_SCRIPT = r"""
import json, sys
class NoArchsearch:
    def find_spec(self, name, path=None, target=None):
        if name == "archsearch" or name.startswith("archsearch."):
            raise ImportError("archsearch is not installed here")
sys.meta_path.insert(0, NoArchsearch())
import torch
from transformers import AutoModelForSequenceClassification
model = AutoModelForSequenceClassification.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
ids = torch.load(sys.argv[2], weights_only=True)
with torch.no_grad():
    torch.save(model(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"]).logits, sys.argv[3])
print(json.dumps({"archsearch_loaded": any(m.startswith("archsearch") for m in sys.modules),
                  "labels": model.config.id2label}))
"""


def hf_static_diff(exported: Path, work: Path) -> float:
    """Max |logit difference| on the first 256 validation texts between archsearch.load and
    plain transformers (AutoModelForSequenceClassification, remote code, no archsearch)."""
    import subprocess

    import torch

    from archsearch.data import load as load_dataset
    from archsearch.export import load

    model = load(exported)
    texts = list(load_dataset("rotten_tomatoes_sentences")["validation"]["text"])[:256]
    ids, mask = model.encode(texts)
    torch.save({"input_ids": ids, "attention_mask": mask}, work / "ids.pt")
    (work / "hf.py").write_text(HF_SCRIPT)
    subprocess.run([sys.executable, str(work / "hf.py"), str(exported), str(work / "ids.pt"),
                    str(work / "hf_logits.pt")], check=True, cwd=work)
    with torch.no_grad():
        want = model.model(ids, mask)
    return float((torch.load(work / "hf_logits.pt", weights_only=True) - want).abs().max())


def onnx_static_diff(run_dir: Path, rec: dict, work: Path) -> dict:
    """``{"onnx_static_max_abs_logit_diff": d}`` for a trial ``--format onnx`` exports (``{}``
    for one it refuses: a tied trial): ``d`` the max |logit difference| on the first 256
    validation texts between onnxruntime on its ``model.onnx`` and archsearch.load's logits
    (protocol addendum 2); with ``onnx_export_error`` when the export's own check refused it."""
    from archsearch.data import load as load_dataset
    from archsearch.export import export_trial, load
    from archsearch.export_onnx import ONNX_FILE, OnnxExportError, onnx_logits, refusal, write_onnx
    from archsearch.models.config import trial_config
    from archsearch.runs import RunDir

    space = RunDir.open(run_dir).load_space()
    if refusal(trial_config(rec["config"], space.fixed), space.task) is not None:
        return {}
    out, row = work / f"{rec['trial_id']}-onnx", {}
    try:
        export_trial(run_dir, rec["trial_id"], out, format="onnx")
        onnx_file = out / ONNX_FILE
    except OnnxExportError as e:  # measured all the same: the file written without the check
        row["onnx_export_error"] = e.one_line()
        export_trial(run_dir, rec["trial_id"], out)
        onnx_file = work / f"{rec['trial_id']}-unchecked.onnx"
        write_onnx(load(out).model, onnx_file, atol=float("inf"))
    model = load(out)
    texts = list(load_dataset(space.dataset.name)["validation"]["text"])[:256]
    ids, mask = model.encode(texts)
    want = model.predict_ids(ids, mask, batch_size=256, regime="cascade").logits
    row["onnx_static_max_abs_logit_diff"] = float((onnx_logits(onnx_file, ids, mask) - want).abs().max())
    shutil.rmtree(out, ignore_errors=True)
    onnx_file.unlink(missing_ok=True)
    return row


def predict_speed(exported: Path, texts: list[str], batch_size: int) -> float:
    from archsearch.export import load

    model = load(exported)
    model.predict(texts[:batch_size], batch_size=batch_size)  # warm-up
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        model.predict(texts, batch_size=batch_size)
        best = max(best, len(texts) / (time.perf_counter() - t0))
    return best


#: batch sizes of the runtime comparison (protocol addendum 3)
RUNTIME_BATCHES = (1, 8, 32, 128)


def runtime_ratios(exported: Path, texts: list[str], batch_sizes=RUNTIME_BATCHES, passes: int = 3) -> dict:
    """The runtime (``regime="auto"``) against the full model in the same runtime
    (``regime="full"``) over ``texts`` at each batch size: one untimed ``auto`` pass first (every
    regime met is timed and chosen there), then ``passes`` timed passes of each, alternating;
    the ratio of the best passes. Also the regimes chosen and the executed FLOPs fraction."""
    from archsearch.export import load
    from archsearch.models import costs
    from archsearch.models.config import trim_padding

    model = load(exported)
    out = {}
    for b in batch_sizes:
        model.predict(texts, batch_size=b)  # untimed: the runtime chooses each regime it meets
        best = {"auto": float("inf"), "full": float("inf")}
        for _ in range(passes):
            for regime in ("auto", "full"):
                t0 = time.perf_counter()
                preds = model.predict(texts, batch_size=b, regime=regime)
                best[regime] = min(best[regime], time.perf_counter() - t0)
                if regime == "auto":
                    auto_preds = preds
        ids, mask = model.encode(texts)
        full_flops = sum(costs.flops_per_sample(model.model.config, trim_padding(ids[i:i + b], mask[i:i + b])[0].shape[1])
                         * len(ids[i:i + b]) for i in range(0, len(ids), b))
        regimes = {}
        for p in auto_preds:
            regimes[p.regime] = regimes.get(p.regime, 0) + 1
        out[f"b{b}"] = {"wall_ratio": round(best["auto"] / best["full"], 4),
                        "auto_rows_per_s": round(len(texts) / best["auto"], 2),
                        "full_rows_per_s": round(len(texts) / best["full"], 2),
                        "executed_flops_fraction": round(sum(p.flops for p in auto_preds) / full_flops, 4),
                        "rows_by_regime": regimes}
    out["regimes"] = model.runtime.report()
    return out


#: the serve designs measured (protocol addendum 1): (replica CPUs, @serve.batch wait in s)
SERVE_DESIGNS = {"replica_2cpu_wait5ms": (2, 0.005), "replica_1cpu_wait50ms": (1, 0.05)}


def serve_load(exported: Path, texts: list[str], cpus: int, wait_s: float, n_requests: int = 1000,
               concurrency: int = 16) -> dict:
    import socket
    import urllib.request

    import ray
    from ray import serve

    from archsearch.export import load
    from archsearch.serve import serve_model

    want = {t: p.label for t, p in zip(texts, load(exported).predict(texts, batch_size=128))}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from archsearch.tune.ray_session import init_ray

    init_ray(None, num_cpus=3, dashboard=False)
    url = serve_model(exported, port=port, blocking=False, num_cpus=cpus, max_batch_size=32,
                      batch_wait_timeout_s=wait_s)

    def post(text: str) -> tuple[float, bool]:
        body = json.dumps({"texts": [text]}).encode()
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                ok = r.status == 200 and json.load(r)["predictions"][0]["label"] == want[text]
        except Exception:
            ok = False
        return (time.perf_counter() - t0) * 1e3, ok

    try:
        for t in texts[:32]:
            post(t)
        latencies, errors, lock = [], 0, threading.Lock()
        jobs = iter([texts[i % len(texts)] for i in range(n_requests)])

        def client():
            nonlocal errors
            while True:
                with lock:
                    text = next(jobs, None)
                if text is None:
                    return
                ms, ok = post(text)
                with lock:
                    latencies.append(ms)
                    errors += not ok

        t0 = time.perf_counter()
        workers = [threading.Thread(target=client) for _ in range(concurrency)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wall = time.perf_counter() - t0
    finally:
        serve.shutdown()
        ray.shutdown()
    return {"serve_p50_ms": round(quantile(latencies, 0.5), 2),
            "serve_p99_ms": round(quantile(latencies, 0.99), 2),
            "serve_errors": int(errors), "serve_rows_per_s": round(n_requests / wall, 2),
            "serve_requests": n_requests, "serve_concurrency": concurrency}


def build(summary: dict[str, Any], prov: dict[str, Any], *, record_reads: bool = True,
          **rest: Any) -> dict[str, Any]:
    """The result in the one schema: the targets evaluated, the protocol hashed; ``rest``: the
    per-trial rows (``trials``). Reads no test split (validation texts only)."""
    return build_result(summary, prov, name="export.json", targets=TARGETS, protocol=PROTOCOL,
                        record_reads=record_reads, **rest)


def run(args: argparse.Namespace) -> int:
    """Measure (see the module docstring) and write the result to ``args.out``."""
    if args.run is None:
        raise ValueError("run needs --run RUN_DIR (a finished run of the default search)")
    import torch

    from archsearch.data import load as load_dataset
    from archsearch.export import export_trial
    from archsearch.runs import FINISHED, RunDir

    torch.set_num_threads(args.threads)
    t_start = time.time()
    run = RunDir.open(args.run)
    recs = [r for r in run.read_trials() if r["status"] in FINISHED and r.get("metrics", {}).get("accuracy") is not None]
    work = Path(tempfile.mkdtemp(prefix="export-bench-"))
    rows, export_s = [], []
    for rec in recs:
        out = work / rec["trial_id"]
        t0 = time.perf_counter()
        export_trial(args.run, rec["trial_id"], out)
        export_s.append(time.perf_counter() - t0)
        rows.append({**fidelity(args.run, rec, out), "export_s": round(export_s[-1], 2),
                     "export_dir_mb": round(dir_mb(out), 1)})
        if rows[-1]["gating"] == "static":
            rows[-1]["hf_static_max_abs_logit_diff"] = hf_static_diff(out, work)
            rows[-1].update(onnx_static_diff(args.run, rec, work))
        print(json.dumps(rows[-1]), flush=True)
    best = max(rows, key=lambda r: r["recorded_accuracy"])
    best_dir = work / best["trial_id"]
    texts = list(load_dataset(run.load_space().dataset.name)["validation"]["text"])
    speeds = {f"predict_rows_per_s_b{b}": round(predict_speed(best_dir, texts, b), 2) for b in (1, 32, 128)}
    print(json.dumps(speeds), flush=True)
    runtime = runtime_ratios(best_dir, texts[:args.runtime_rows])
    print(json.dumps(runtime), flush=True)
    ratios = [runtime[f"b{b}"]["wall_ratio"] for b in RUNTIME_BATCHES]
    runtime_keys = {"runtime_wall_ratio_cpu_b1": runtime["b1"]["wall_ratio"],
                    "runtime_wall_ratio_cpu_b32": runtime["b32"]["wall_ratio"],
                    "runtime_never_slower_than_full": all(r <= 1.02 for r in ratios),
                    "runtime_wall_ratio_cpu_max": max(ratios),
                    "runtime_cpu": {k: v for k, v in runtime.items() if k != "regimes"},
                    "runtime_regimes_cpu": runtime["regimes"]}
    designs = {}
    for name, (cpus, wait_s) in SERVE_DESIGNS.items():
        designs[name] = serve_load(best_dir, texts, cpus, wait_s)
        print(name, json.dumps(designs[name]), flush=True)
    chosen = max(designs, key=lambda k: designs[k]["serve_rows_per_s"])  # the rule: most rows/s
    served = {**designs[chosen], "serve_design": chosen,
              "serve_designs": {k: {m: v[m] for m in ("serve_p50_ms", "serve_p99_ms", "serve_errors",
                                                      "serve_rows_per_s")} for k, v in designs.items()}}
    from archsearch.report import report_run
    from archsearch.tune.weights import keep_weights

    copy = work / "run-copy"
    shutil.copytree(args.run, copy)
    _, pareto = report_run(copy, work / "reports")
    kept = keep_weights(RunDir.open(copy), "pareto", pareto)
    worst_acc = max((r["accuracy_minus_recorded"] for r in rows), key=abs)
    summary = {
        "trials_exported": len(rows),
        "export_gatings_ok": sorted({r["gating"] for r in rows if r["max_abs_logit_diff"] <= 1e-5
                                     and r["accuracy_minus_recorded"] == 0}),
        "export_gatings": sorted({r["gating"] for r in rows}),
        "export_all_gatings_ok": all(r["max_abs_logit_diff"] <= 1e-5 and r["accuracy_minus_recorded"] == 0
                                     for r in rows),
        "export_roundtrip_max_abs_logit_diff": max(r["max_abs_logit_diff"] for r in rows),
        "export_accuracy_minus_recorded": worst_acc,
        "hf_static_max_abs_logit_diff": max((r["hf_static_max_abs_logit_diff"] for r in rows
                                             if "hf_static_max_abs_logit_diff" in r), default=None),
        "onnx_static_max_abs_logit_diff": max((r["onnx_static_max_abs_logit_diff"] for r in rows
                                               if "onnx_static_max_abs_logit_diff" in r), default=None),
        "export_s": round(sum(export_s) / len(export_s), 2),
        "export_dir_mb": best["export_dir_mb"],
        "run_disk_mb_keep_weights_all": round(dir_mb(args.run), 1),
        "run_disk_mb_default_search": kept["run_mb"], "keep_weights_kept_trials": len(kept["kept"]),
        **speeds, **runtime_keys, **served,
        "serve_vs_predict_b32": round(served["serve_rows_per_s"] / speeds["predict_rows_per_s_b32"], 3),
        "best_trial": best["trial_id"], "best_gating": best["gating"],
    }
    result = build(summary, provenance(seeds=None, wall_s=time.time() - t_start, run=str(args.run)),
                   trials=rows)
    write_json(args.out, result)
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"summary": summary, "targets": result["targets"]}, indent=1))
    return 0


def results(args: argparse.Namespace) -> dict[Path, dict[str, Any]]:
    """The stored result restated through :func:`build` (nothing measured)."""
    return {OUT: restate(OUT, build, record_reads=not args.check)}


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", type=Path, default=None, help="run: a finished run of the default search")
    p.add_argument("--threads", type=int, default=2, help="run: torch threads for predict")
    p.add_argument("--runtime-rows", type=int, default=512,
                   help="run: validation texts of the runtime comparison (the first N)")
    p.add_argument("--out", type=Path, default=OUT, help="run: where the result goes")


COMMAND = Command(__doc__.splitlines()[0], run=run, results=results, add_arguments=_arguments)


def main(argv: list[str] | None = None) -> int:
    return COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
