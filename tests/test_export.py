"""``archsearch export`` / ``archsearch.load`` / ``archsearch predict`` on a real search's trials
(the session's ``tiny_run``), and the bad input each refuses: one line, exit code 2, nothing
written. The round trip of every gating and of tied models is in tests/test_gating_contract.py."""

import json
import shutil

import pytest

from conftest import run_cli


def _best(tiny_run):
    from archsearch.runs import read_trials

    ok = [r for r in read_trials(tiny_run.run_dir) if r["status"] in ("TERMINATED", "STOPPED")]
    return max(ok, key=lambda r: r["metrics"]["accuracy"])


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "best"
    proc = run_cli("export", tiny_run.run_dir, "--best", "accuracy", "--out", out)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.ray
def test_the_best_trial_exported_scores_its_recorded_validation_accuracy(tiny_run, exported):
    """From text, through the exported tokenizer, weights and gating: the validation split's
    sentences are classified to exactly the accuracy the trial recorded."""
    import archsearch
    from archsearch.data import load as load_dataset

    best = _best(tiny_run)
    meta = json.loads((exported / "archsearch.json").read_text())
    assert meta["trial_id"] == best["trial_id"] and meta["metrics"]["accuracy"] == best["metrics"]["accuracy"]
    files = {p.relative_to(exported).as_posix() for p in exported.rglob("*") if p.is_file()}
    assert set(meta["sha256"]) == files - {"archsearch.json"}
    assert {"config.json", "model.safetensors", "tokenizer/tokenizer.json"} <= files
    val = load_dataset("rotten_tomatoes_sentences")["validation"]
    model = archsearch.load(exported)
    preds = model.predict(list(val["text"]), batch_size=256, regime="cascade")
    accuracy = sum(p.label == y for p, y in zip(preds, val["label"])) / len(preds)
    assert accuracy == pytest.approx(best["metrics"]["accuracy"], abs=1e-12)
    assert all(p.flops > 0 and abs(sum(p.probabilities) - 1) < 1e-5 for p in preds)


@pytest.mark.ray
def test_predict_writes_one_row_per_text(exported, tmp_path):
    import pandas as pd

    import archsearch

    texts = ["a gorgeous, witty, seductive movie", "the plot is a mess and the acting is worse",
             "it is a film"]
    pd.DataFrame({"id": [1, 2, 3], "Review": texts}).to_csv(tmp_path / "in.csv", index=False)
    proc = run_cli("predict", exported, tmp_path / "in.csv", "--out", tmp_path / "preds.csv",
                   "--regime", "cascade")
    assert proc.returncode == 0, proc.stderr
    assert "rows/s" in proc.stdout and "executed FLOPs" in proc.stdout and "exit depth" in proc.stdout
    got = pd.read_csv(tmp_path / "preds.csv")
    want = archsearch.load(exported).predict(texts, regime="cascade")
    assert got["label"].tolist() == [p.label for p in want] and len(got) == 3
    assert {"p_negative", "p_positive", "flops", "label_name", "exit_depth", "regime"} <= set(got.columns)
    assert got["exit_depth"].tolist() == [p.exit_depth for p in want]


@pytest.mark.ray
def test_bad_export_and_predict_input_is_one_line_exit_2_and_writes_nothing(tiny_run, exported, tmp_path):
    def refused(*args, says):
        proc = run_cli(*args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], (proc.returncode, proc.stderr)

    run = tiny_run.run_dir
    refused("export", run, "--trial", "nope", "--out", tmp_path / "a", says="--trial: no trial 'nope'")
    refused("export", run, "--best", "accuracy", "--out", exported, says="--out: already exists")
    refused("export", run, "--out", tmp_path / "a", says="give exactly one of")
    refused("export", run, "--best", "perplexity", "--out", tmp_path / "a", says="--best")
    bare = tmp_path / "bare-run"  # a run copied without tune/: its trials have no weights
    shutil.copytree(run, bare, ignore=shutil.ignore_patterns("tune"))
    refused("export", bare, "--best", "accuracy", "--out", tmp_path / "a", says="has no checkpoint")
    assert not (tmp_path / "a").exists()

    damaged = tmp_path / "damaged"
    shutil.copytree(exported, damaged)
    blob = (damaged / "model.safetensors").read_bytes()
    (damaged / "model.safetensors").write_bytes(blob[: len(blob) // 2])  # truncated
    (tmp_path / "in.csv").write_text("text\nfine film\n")
    refused("predict", damaged, tmp_path / "in.csv", "--out", tmp_path / "p.csv",
            says="model.safetensors: does not match its sha256")
    newer = tmp_path / "newer"
    shutil.copytree(exported, newer)
    meta = json.loads((newer / "archsearch.json").read_text())
    (newer / "archsearch.json").write_text(json.dumps({**meta, "format": 99}))
    refused("predict", newer, tmp_path / "in.csv", "--out", tmp_path / "p.csv", says="format: format 99 is newer")
    (tmp_path / "notext.csv").write_text("id,score\n1,2\n")
    refused("predict", exported, tmp_path / "notext.csv", "--out", tmp_path / "p.csv",
            says="--text-column: no text column")
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.ray
def test_ray_serve_answers_real_http_requests(exported, ray_session):
    """``archsearch serve``'s application on real Ray Serve: one request answers as the loaded
    model predicts, 24 concurrent ones (batched together) all answer in order, and bad requests
    get HTTP 400 / 405 with a JSON error."""
    import json
    import urllib.error
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from ray import serve

    import archsearch
    from archsearch.serve import serve_model
    from conftest import free_port

    def post(body, method="POST"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data if method == "POST" else None, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    texts = ["a gorgeous, witty, seductive movie", "the plot is a mess", "it is a film",
             "one of the year's best", "tedious and overlong", "i laughed, i cried"]
    url = serve_model(exported, port=free_port(), blocking=False, num_cpus=0.5, regime="cascade")
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/predict")
        status, got = post({"texts": texts})
        want = archsearch.load(exported).predict(texts, regime="cascade")
        assert status == 200 and [p["label"] for p in got["predictions"]] == [p.label for p in want]
        for g, w in zip(got["predictions"], want):
            assert g["probabilities"] == pytest.approx(w.probabilities, abs=1e-5) and g["flops"] > 0
        with ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(lambda i: post({"texts": [texts[i % 6]] * (1 + i % 3)}), range(24)))
        for i, (status, body) in enumerate(answers):
            assert status == 200 and len(body["predictions"]) == 1 + i % 3
            assert {p["label"] for p in body["predictions"]} == {want[i % 6].label}
        assert post(b"not json")[0] == 400
        status, body = post({"texts": "one string"})
        assert status == 400 and "list of strings" in body["error"]
        assert post({}, method="GET")[0] == 405
    finally:
        serve.shutdown()


@pytest.mark.ray
def test_the_reports_export_command_runs_as_written(tiny_run, tmp_path):
    """Each Pareto row of the report shows an ``archsearch export`` command; the first one,
    run as written (from another directory), writes the model."""
    import html
    import re
    import shlex
    import subprocess

    from conftest import cli_command

    page = (tiny_run.report_dir / "index.html").read_text()
    commands = [html.unescape(c) for c in re.findall(r"<code class=\"cmd\">(archsearch export [^<]+)</code>", page)]
    assert commands, "no export command in the report"
    argv = shlex.split(commands[0])
    proc = subprocess.run(cli_command(*argv[1:]), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    trial = argv[argv.index("--trial") + 1]
    assert (tmp_path / "models" / trial / "model.safetensors").is_file()


@pytest.mark.ray
def test_a_finished_search_keeps_weights_only_of_its_front_and_best_trials(tiny_run, tmp_path):
    """``budget.keep_weights: pareto`` (the default, which tiny_run ran with): the front's and each
    objective's best trial keep one checkpoint without optimizer state; the others keep none.
    ``none`` on a copy deletes every checkpoint, and export then says why it has no weights."""
    import torch

    from archsearch.runs import RunDir
    from archsearch.tune.weights import WEIGHTS_KEYS, checkpoints, keep_weights, kept_trials

    run = RunDir.open(tiny_run.run_dir)
    recs = run.read_trials()
    keep = kept_trials(tiny_run.summary, recs)
    assert tiny_run.disk["policy"] == "pareto" and set(tiny_run.disk["kept"]) == keep
    assert _best(tiny_run)["trial_id"] in keep
    for rec in recs:
        dirs = checkpoints(run, rec["trial_id"])
        if rec["trial_id"] in keep:
            assert len(dirs) == 1
            assert set(torch.load(dirs[0] / "state.pt", weights_only=True)) <= set(WEIGHTS_KEYS)
        else:
            assert dirs == [], rec["trial_id"]
    assert tiny_run.disk["tune_mb_after"] < tiny_run.disk["tune_mb_before"]

    copy = tmp_path / "copy"
    shutil.copytree(tiny_run.run_dir, copy)
    out = keep_weights(RunDir.open(copy), "none", tiny_run.summary)
    assert out["kept"] == [] and all(checkpoints(RunDir.open(copy), r["trial_id"]) == [] for r in recs)
    proc = run_cli("export", copy, "--best", "accuracy", "--out", tmp_path / "m")
    assert proc.returncode == 2 and "budget.keep_weights kept none for it" in proc.stderr




@pytest.mark.ray
def test_a_static_trial_loads_in_plain_transformers_with_the_same_logits(exported, tmp_path):
    """A static trial's export is also a transformers model (its modeling file in the directory):
    AutoModelForSequenceClassification, in a Python where archsearch cannot be imported, gives the
    logits archsearch.load gives (within 1e-5) on validation texts of many lengths."""
    import subprocess
    import sys

    import torch

    import archsearch
    from archsearch.data import load as load_dataset

    texts = list(load_dataset("rotten_tomatoes_sentences")["validation"]["text"])[:64]
    model = archsearch.load(exported)
    ids, mask = model.encode(texts)
    torch.save({"input_ids": ids, "attention_mask": mask}, tmp_path / "ids.pt")
    from conftest import load_benchmark

    (tmp_path / "run.py").write_text(load_benchmark("product.export").HF_SCRIPT)
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(exported), str(tmp_path / "ids.pt"),
                           str(tmp_path / "logits.pt")], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["archsearch_loaded"] is False and info["labels"] == {"0": "negative", "1": "positive"}
    with torch.no_grad():
        want = model.model(ids, mask)
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt", weights_only=True), want, rtol=0, atol=1e-5)


@pytest.mark.ray
def test_predict_refuses_an_unknown_regime_in_one_line_and_writes_nothing(exported, tmp_path):
    (tmp_path / "in.csv").write_text("text\na fine film\n")
    proc = run_cli("predict", exported, tmp_path / "in.csv", "--out", tmp_path / "preds.csv",
                   "--regime", "fastest")
    assert proc.returncode == 2 and "--regime" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "preds.csv").exists()
    proc = run_cli("predict", exported, tmp_path / "in.csv", "--out", tmp_path / "preds.csv",
                   "--state", tmp_path / "state.pt")  # a state file without --adapt
    assert proc.returncode == 2 and "--state" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "preds.csv").exists() and not (tmp_path / "state.pt").exists()


@pytest.mark.ray
def test_serve_on_a_port_in_use_is_one_line_exit_2(exported):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_cli("serve", exported, "--port", str(port))
    assert proc.returncode == 2 and "--port" not in proc.stdout
    line = proc.stderr.strip().splitlines()
    assert len(line) == 1 and str(port) in line[0] and "Traceback" not in proc.stderr
