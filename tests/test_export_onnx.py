"""``archsearch export --format onnx`` (issue 62): a static trial's ``model.onnx`` run by
onnxruntime gives :func:`archsearch.load`'s logits; a dynamic or tied trial is refused (one line,
exit code 2, nothing written); ``model.onnx`` is under ``archsearch.json``'s sha256; a file that
fails the onnxruntime check is not kept.

No Ray and no search: the run directory is written by hand (:func:`archsearch.report.synthetic.write_run_dir`,
conftest's ``TINY_SPACE``) around one real static trial trained for one epoch on real sentences
(conftest's ``sentence_subsets``) and saved as Tune would (``tune/train_trial_ID_*/checkpoint_*``),
plus records of a DHT trial and a tied trial (their configs are all the refusal reads)."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import TINY_SPACE, run_cli, sentence_subsets

STATIC_CFG = {"gating": "static", "n_layers": 2, "d_model": 32, "n_heads": 2, "warmup_steps": 4, "lr": 2e-3}


@pytest.fixture(scope="module")
def small_data(cache_dir):
    return sentence_subsets(train=256, validation=64, test=64)


@pytest.fixture(scope="module")
def static_loop(small_data, device):
    import torch

    from archsearch.tune.trainable import TrialLoop

    torch.set_num_threads(1)
    loop = TrialLoop(STATIC_CFG, small_data, {"epochs": 1, "batch_size": 32, "seed": 0, "device": str(device)})
    loop.train_epoch()
    loop.model.eval()
    return loop


@pytest.fixture(scope="module")
def onnx_run(static_loop, tmp_path_factory):
    """A run directory: ``static0`` (the trained loop, with a checkpoint), ``dht0`` and ``tied0``
    (records only), all three on the accuracy/FLOPs front."""
    import yaml

    from archsearch.report.synthetic import write_run_dir

    def rec(tid, cfg, acc, flops):
        return {"trial_id": tid, "status": "TERMINATED", "config": cfg,
                "metrics": {"accuracy": acc, "flops_per_sample": flops, "params_trainable": 4e4},
                "history": []}

    run = write_run_dir(tmp_path_factory.mktemp("onnx-run") / "run",
                        [rec("static0", STATIC_CFG, 0.6, 2e5),
                         rec("dht0", {**STATIC_CFG, "gating": "dht"}, 0.7, 3e5),
                         rec("tied0", {**STATIC_CFG, "tying": "every_k"}, 0.5, 1e5)],
                        space_yaml=yaml.safe_dump(TINY_SPACE), name="onnx-run")
    ckpt = run / "tune" / "train_trial_static0_00000" / "checkpoint_000000"
    ckpt.mkdir(parents=True)
    static_loop.save(str(ckpt), weights_only=True)
    return run


@pytest.fixture(scope="module")
def onnx_export(onnx_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx-export") / "static0"
    proc = run_cli("export", onnx_run, "--trial", "static0", "--format", "onnx", "--out", out)
    assert proc.returncode == 0, proc.stderr
    return out


def refused(*args, says: str):
    proc = run_cli(*args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], (proc.returncode, proc.stderr)
    return lines[0]


def test_onnxruntime_gives_the_loaded_models_logits_at_any_batch_size_and_length(onnx_export, small_data):
    """model.onnx (dynamic batch and length axes) under onnxruntime against archsearch.load's
    predict_ids, within 1e-4, at batch sizes 1 and 16 and lengths 8 and max_len (32), on real
    validation sentences (padded and cut as the tokenizer pads them)."""
    import onnxruntime as ort
    import torch

    import archsearch
    from archsearch.data import load as load_dataset
    from archsearch.export_onnx import ATOL, OPSET, onnx_logits

    meta = json.loads((onnx_export / "archsearch.json").read_text())
    files = {p.relative_to(onnx_export).as_posix() for p in onnx_export.rglob("*") if p.is_file()}
    assert "model.onnx" in meta["sha256"] and set(meta["sha256"]) == files - {"archsearch.json"}
    assert {"model.safetensors", "config.json", "modeling_archsearch.py"} <= files  # all the default writes
    assert meta["onnx"]["opset"] == OPSET and meta["onnx"]["check_max_abs_logit_diff"] <= ATOL
    sess = ort.InferenceSession(str(onnx_export / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type) for i in sess.get_inputs()] == [("input_ids", "tensor(int64)"),
                                                             ("attention_mask", "tensor(int64)")]
    assert all(isinstance(d, str) for i in sess.get_inputs() for d in i.shape)  # B and T dynamic
    assert sess.get_outputs()[0].name == "logits"

    model = archsearch.load(onnx_export)
    texts = list(load_dataset("rotten_tomatoes_sentences")["validation"]["text"])[:16]
    ids, mask = model.encode(texts)
    assert ids.shape[1] == model.max_len == 32
    worst = 0.0
    for rows in (1, 16):
        for length in (8, 32):
            x, m = ids[:rows, :length], mask[:rows, :length]
            want = model.predict_ids(x, m).logits
            got = onnx_logits(onnx_export / "model.onnx", x, m, session=sess)
            assert got.shape == want.shape == (rows, 2)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
            worst = max(worst, float((got - want).abs().max()))
    print(f"onnx max abs logit diff {worst:.3g}")


def test_onnx_on_a_dynamic_or_tied_trial_is_one_line_exit_2_and_writes_nothing(onnx_run, tmp_path):
    from archsearch.errors import UserError
    from archsearch.export import check_format, export_trial

    line = refused("export", onnx_run, "--trial", "dht0", "--format", "onnx", "--out", tmp_path / "a",
                   says="--format: trial dht0: its gating 'dht'")
    assert "static trials only" in line
    # the front holds all three: refused before any of them is written
    refused("export", onnx_run, "--pareto", "--format", "onnx", "--out", tmp_path / "a", says="--format: trial ")
    with pytest.raises(UserError, match="--format: trial tied0: its tying is 'every_k'"):
        export_trial(onnx_run, "tied0", tmp_path / "a", format="onnx")
    with pytest.raises(UserError, match="--format: 'tflite' is not one of safetensors, onnx"):
        check_format(onnx_run, ["static0"], "tflite")
    check_format(onnx_run, ["static0"], "onnx")
    check_format(onnx_run, ["dht0", "tied0"], "safetensors")
    assert list(tmp_path.iterdir()) == []


def test_a_changed_model_onnx_is_refused_by_load(onnx_export, tmp_path):
    import archsearch
    from archsearch.errors import UserError

    damaged = tmp_path / "damaged"
    shutil.copytree(onnx_export, damaged)
    blob = bytearray((damaged / "model.onnx").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (damaged / "model.onnx").write_bytes(bytes(blob))
    with pytest.raises(UserError, match="model.onnx: does not match its sha256"):
        archsearch.load(damaged)
    (damaged / "model.onnx").unlink()
    with pytest.raises(UserError, match="model.onnx: missing"):
        archsearch.load(damaged)


def test_a_file_that_fails_the_onnxruntime_check_is_not_kept(static_loop, onnx_export, tmp_path, monkeypatch):
    """The check compares onnxruntime with PyTorch: a model that differs (head bias + 0.5) fails
    it with the difference named; an exporter that writes a broken file leaves no directory."""
    import copy

    import torch

    from archsearch.export import export_loop
    from archsearch.export_onnx import OnnxExportError, check_onnx

    other = copy.deepcopy(static_loop.model).cpu()
    with torch.no_grad():
        other.head.bias += 0.5
    with pytest.raises(OnnxExportError, match=r"differ from PyTorch's by 0\.5"):
        check_onnx(onnx_export / "model.onnx", other)

    monkeypatch.setattr(torch.onnx, "export", lambda model, args, f, **kw: open(f, "wb").write(b"not onnx"))
    with pytest.raises(OnnxExportError, match="onnxruntime cannot load it") as err:
        export_loop(static_loop, tmp_path / "model", format="onnx")
    assert err.value.exit_code == 1 and list(tmp_path.iterdir()) == []
    assert err.value.file == str(tmp_path / "model" / "model.onnx")  # where it would have been


def test_a_bert_style_model_exports_within_tolerance(tmp_path):
    """The layout of an init_from checkpoint (MiniLM: post-LN, embedding LayerNorm, token-type
    embedding, tanh GELU, three classes) exports and passes the check too."""
    import torch

    from archsearch.export_onnx import ATOL, write_onnx
    from archsearch.models.transformer import Transformer, TransformerConfig

    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=300, max_len=40, n_layers=2, d_model=24, n_heads=3,
                                          d_ffn=48, n_classes=3, norm_position="post", embedding_norm=True,
                                          type_vocab_size=2, activation="gelu_tanh")).train()
    diff = write_onnx(model, tmp_path / "m.onnx")
    assert diff <= ATOL and (tmp_path / "m.onnx").is_file() and model.training  # the model is left as it was
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
