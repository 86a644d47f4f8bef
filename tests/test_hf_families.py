"""Encoder checkpoints beyond BERT (RoBERTa, XLM-R, CamemBERT, DistilBERT), their tokenizers,
Hub model ids and the pre-launch checks, on tiny random-weight models built offline with
``AutoConfig.for_model`` / ``AutoModel.from_config`` and tokenizers trained here with
``tokenizers`` (no network: the Hub is only ever reached through its cache, offline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, run_cli, tiny_space, tiny_space_file

FAMILIES = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert")
ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert")
TEXTS = ["the movie was good", "a bad film, really bad", "what a lovely day it was",
         "an utterly boring and predictable plot", "the actors were great fun to watch"] * 20


def hf_config(model_type: str, vocab_size: int = 120, max_positions: int = 40, **extra):
    """A tiny config of ``model_type`` (2 layers, width 32, 4 heads)."""
    from transformers import AutoConfig

    if model_type == "distilbert":
        sizes = dict(n_layers=2, dim=32, n_heads=4, hidden_dim=64)
    else:
        sizes = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                     type_vocab_size=1 if model_type in ROBERTA_LIKE else 2)
    return AutoConfig.for_model(model_type, vocab_size=vocab_size, max_position_embeddings=max_positions,
                                **{**sizes, **extra})


def save_model(directory: Path, config, *, head: bool = False):
    """``AutoModel`` (or ``AutoModelForSequenceClassification``, whose weight names carry the
    family prefix) with random weights, saved to ``directory``; returns it in eval mode."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    torch.manual_seed(0)
    model = (AutoModelForSequenceClassification if head else AutoModel).from_config(config)
    # LayerNorms start at (1, 0): make them random too, so a mix-up cannot hide
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.1)
    model.save_pretrained(directory)
    return model.eval()


def roberta_tokenizer():
    """A byte-level BPE ``RobertaTokenizer`` trained on :data:`TEXTS` (<s>=0, <pad>=1, </s>=2)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import RobertaTokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    vocab = tok.get_vocab()
    merges = [tuple(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    return RobertaTokenizer(vocab=vocab, merges=merges)


def distilbert_tokenizer():
    """A lower-cased WordPiece ``DistilBertTokenizer`` trained on :data:`TEXTS`
    ([PAD]=0, [CLS]=2, [SEP]=3)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import DistilBertTokenizer

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(TEXTS, trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    return DistilBertTokenizer(vocab=tok.get_vocab())


def padded_batch(pad_id: int, vocab_size: int, T: int = 16, device="cpu"):
    """``B=4 x T`` ids with right padding (rows of length T, 11, 4, 1) and their bool mask,
    drawn on the CPU (the same numbers on every device), on ``device``."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab_size, (4, T), generator=g)
    ids[ids == pad_id] = 3
    lengths = torch.tensor([T, 11, 4, 1])
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    ids[~mask] = pad_id
    return ids.to(device), mask.to(device)


# ------------------------------------------------------------------------------------------
# equivalence with transformers, every gate open
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type,extra", [(f, {}) for f in FAMILIES] + [
    ("bert", {"hidden_act": "gelu_new"}), ("roberta", {"hidden_act": "relu"}),
    ("distilbert", {"activation": "relu"}), ("distilbert", {"sinusoidal_pos_embds": True})],
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items()) or "default")
def test_all_gates_open_equals_hf_last_hidden_state(tmp_path, model_type, extra, device):
    from archsearch.dynamic.depth.dht import DHTGating
    from archsearch.models.pretrained import transformer_from_pretrained

    torch.set_num_threads(1)
    config = hf_config(model_type, **extra)
    hf = save_model(tmp_path, config).to(device)
    ours = transformer_from_pretrained(tmp_path, max_len=16).to(device).eval()
    assert (ours.config.n_layers, ours.config.d_model, ours.config.n_heads) == (2, 32, 4)
    assert ours.config.type_vocab_size == (0 if model_type == "distilbert" else config.type_vocab_size)
    ids, mask = padded_batch(config.pad_token_id, config.vocab_size, device=device)
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True)
        pad = ours.padding_mask(ids, mask)
        hidden = ours.run_layers(ours.embed(ids), pad)  # (B, T, d)
        first = ours.run_layers(ours.embed(ids), pad, 0, 1)  # early exit after block 1
        logits = ours(ids, mask)
        dht = DHTGating(ours, {"n_fixed": 1}, {"seed": 0})
        dht.force_depth = 2
        logits_dht = dht.predict(ids, mask)[0]
        # the classifier mean-pools HF's hidden states over real tokens
        m = mask[..., None].float()
        expected = ours.head((out.last_hidden_state * m).sum(1) / m.sum(1))  # (B, C)
    ref = out.last_hidden_state  # (B, T, d)
    assert (hidden - ref)[mask].abs().max().item() < 1e-4
    assert (first - out.hidden_states[1])[mask].abs().max().item() < 1e-4
    assert (logits - expected).abs().max().item() < 1e-4
    torch.testing.assert_close(logits_dht, logits, rtol=0, atol=1e-6)
    if model_type not in ROBERTA_LIKE:  # same position ids at pad tokens too
        assert (hidden - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("model_type", ["roberta", "distilbert"])
def test_task_model_checkpoints_with_the_family_prefix_load(tmp_path, model_type, device):
    """``XForSequenceClassification`` checkpoints name every encoder weight ``roberta.`` /
    ``distilbert.``; the encoder is loaded, their head is not."""
    from safetensors import safe_open

    from archsearch.models.pretrained import check_checkpoint, transformer_from_pretrained

    config = hf_config(model_type)
    hf = save_model(tmp_path, config, head=True)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as h:
        prefix = {"roberta": "roberta.", "distilbert": "distilbert."}[model_type]
        assert any(k.startswith(prefix + "embeddings.") for k in h.keys())
    check_checkpoint(tmp_path, max_len=16)
    ours = transformer_from_pretrained(tmp_path, max_len=16).to(device).eval()
    encoder = getattr(hf, "roberta" if model_type == "roberta" else "distilbert").to(device)
    ids, mask = padded_batch(config.pad_token_id, config.vocab_size, device=device)
    with torch.no_grad():
        ref = encoder(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        hidden = ours.run_layers(ours.embed(ids), ours.padding_mask(ids, mask))
    assert (hidden - ref)[mask].abs().max().item() < 1e-4


def test_roberta_positions_start_after_the_padding_index(tmp_path):
    from archsearch.models.pretrained import pretrained_transformer_config, transformer_from_pretrained

    save_model(tmp_path, hf_config("roberta", max_positions=40))  # pad 1: 38 usable positions
    assert pretrained_transformer_config(tmp_path, max_len=38).max_len == 38
    with pytest.raises(ValueError, match="38 tokens"):
        pretrained_transformer_config(tmp_path, max_len=39)
    ours = transformer_from_pretrained(tmp_path, max_len=38)
    from safetensors.torch import load_file

    table = load_file(str(tmp_path / "model.safetensors"))["embeddings.position_embeddings.weight"]
    torch.testing.assert_close(ours.pos_emb.weight, table[2:40], rtol=0, atol=0)


# ------------------------------------------------------------------------------------------
# tokenizers and the whole path: prepare -> trainable
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def family_checkpoints(tmp_path_factory):
    """``roberta`` and ``distilbert``: model + its own tokenizer in one directory, as the Hub
    has them; vocabularies match."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for name, make in (("roberta", roberta_tokenizer), ("distilbert", distilbert_tokenizer)):
        tok = make()
        tok.save_pretrained(root / name)
        save_model(root / name, hf_config(name, vocab_size=len(tok), max_positions=64))
        out[name] = root / name
    return out


@pytest.mark.parametrize("model_type", ["roberta", "distilbert"])
def test_checkpoint_tokenizer_prepares_data_and_fine_tunes(model_type, family_checkpoints, cache_dir, device):
    import dataclasses

    from archsearch.data import prepare
    from archsearch.dynamic.known_costs import known_costs_fn
    from archsearch.models.pretrained import transformer_from_pretrained
    from archsearch.tune.trainable import TrialLoop

    torch.set_num_threads(1)
    ckpt = family_checkpoints[model_type]
    data = prepare("rotten_tomatoes_sentences", max_len=24, tokenizer=str(ckpt))
    cls, sep, pad = {"roberta": (0, 2, 1), "distilbert": (2, 3, 0)}[model_type]
    s = data.train
    assert data.pad_id == pad and data.vocab_size == json.loads((ckpt / "config.json").read_text())["vocab_size"]
    assert (s.input_ids[:, 0] == cls).all()
    assert (s.input_ids[torch.arange(len(s)), s.lengths - 1] == sep).all()
    assert (s.input_ids[~s.attention_mask] == pad).all()
    assert data.decode(s.input_ids[0]).strip()  # real words come back

    tr, va = data.train, data["validation"]
    data = dataclasses.replace(data, data={
        **data.data,
        "train": dataclasses.replace(tr, input_ids=tr.input_ids[:32], attention_mask=tr.attention_mask[:32],
                                     labels=tr.labels[:32]),
        "validation": dataclasses.replace(va, input_ids=va.input_ids[:16], attention_mask=va.attention_mask[:16],
                                          labels=va.labels[:16])})
    loop = TrialLoop({"init_from": str(ckpt), "lr": 1e-3, "warmup_steps": 1}, data,
                     {"epochs": 1, "batch_size": 16, "seed": 0, "device": str(device)})
    ref = transformer_from_pretrained(ckpt, max_len=24).to(device)
    torch.testing.assert_close(loop.model.blocks[1].ffn.fc2.weight, ref.blocks[1].ffn.fc2.weight)
    assert loop.model.config.pad_id == pad
    loss = loop.train_epoch()
    m = loop.evaluate()
    assert loss == loss and 0.0 <= m["accuracy"] <= 1.0
    assert not torch.equal(loop.model.blocks[1].ffn.fc2.weight, ref.blocks[1].ffn.fc2.weight)
    known = known_costs_fn(data)({"init_from": str(ckpt)})
    assert (known["params_total"], known["params_trainable"]) == (m["params_total"], m["params_trainable"])


# ------------------------------------------------------------------------------------------
# pre-launch checks (in-process: no Ray starts)
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad_checkpoints(tmp_path_factory):
    """``gpt2`` (a decoder), ``distilbert_truncated`` / ``roberta_truncated`` (weight file
    cut in half), ``distilbert_more_layers`` (config says 3 layers, weights hold 2),
    ``roberta_relative`` (relative position embeddings), ``roberta`` (good; 40 positions,
    pad 1: 38 tokens)."""
    import shutil

    from transformers import AutoConfig, AutoModel

    root = tmp_path_factory.mktemp("bad")
    gpt2 = AutoConfig.for_model("gpt2", n_layer=1, n_embd=16, n_head=2, vocab_size=128, n_positions=64,
                                bos_token_id=0, eos_token_id=0)
    AutoModel.from_config(gpt2).save_pretrained(root / "gpt2")
    for family in ("roberta", "distilbert"):
        save_model(root / family, hf_config(family))
        shutil.copytree(root / family, root / f"{family}_truncated")
        weights = root / f"{family}_truncated" / "model.safetensors"
        with open(weights, "r+b") as f:
            f.truncate(weights.stat().st_size // 2)
    shutil.copytree(root / "distilbert", root / "distilbert_more_layers")
    cfg_file = root / "distilbert_more_layers" / "config.json"
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()), "n_layers": 3}))
    shutil.copytree(root / "roberta", root / "roberta_relative")
    cfg_file = root / "roberta_relative" / "config.json"
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()),
                                    "position_embedding_type": "relative_key"}))
    return root


def _space(tmp_path, init_from, *, max_len=32, tokenizer=None):
    dataset = {"name": "rotten_tomatoes_sentences", "vocab_size": 1000, "max_len": max_len,
               "max_train_samples": 64, "tokenizer": tokenizer or init_from}
    return tiny_space(tmp_path, fixed={"init_from": init_from}, dataset=dataset)


@pytest.mark.parametrize("case,says", [
    ("gpt2", "model_type 'gpt2' is not BERT-style (not an encoder this loader maps); supported "
             "model_type values: bert, camembert, distilbert, roberta, xlm-roberta"),
    ("distilbert_truncated", "distilbert_truncated/model.safetensors is truncated or corrupt"),
    ("roberta_truncated", "roberta_truncated/model.safetensors is truncated or corrupt"),
    ("distilbert_more_layers", "16 distilbert weight(s) missing, e.g. 'transformer.layer.2."),
    ("roberta_relative", "position_embedding_type 'relative_key': only 'absolute' is supported"),
])
def test_check_init_from_refuses_with_one_line(tmp_path, bad_checkpoints, case, says):
    from archsearch.errors import UserError
    from archsearch.tune.preflight import check_init_from

    space = _space(tmp_path, str(bad_checkpoints / case))
    with pytest.raises(UserError) as e:
        check_init_from(space)
    line = e.value.one_line()
    assert line.startswith(f"{space.source}: fixed.init_from: ") and "\n" not in line
    assert says in line, line


def test_check_init_from_knows_roberta_position_limit(tmp_path, bad_checkpoints):
    from archsearch.errors import UserError
    from archsearch.tune.preflight import check_init_from

    check_init_from(_space(tmp_path, str(bad_checkpoints / "roberta"), max_len=38))
    with pytest.raises(UserError, match="takes at most 38 tokens, dataset.max_len is 39"):
        check_init_from(_space(tmp_path, str(bad_checkpoints / "roberta"), max_len=39))


# ------------------------------------------------------------------------------------------
# Hub model ids (HF_HUB_OFFLINE=1: the cache only)
# ------------------------------------------------------------------------------------------


def offline_env(hub_cache: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache),
           "HF_HOME": str(hub_cache.parent / "hf-home")}
    env.pop("TRANSFORMERS_OFFLINE", None)
    return env


@pytest.mark.parametrize("field", ["fixed.init_from", "dataset.tokenizer"])
def test_hub_id_not_in_the_cache_offline_is_one_line_exit_2(tmp_path, cache_dir, field):
    repo = "archsearch-test/no-such-model"
    if field == "fixed.init_from":
        space = tiny_space_file(tmp_path, fixed={"init_from": repo},  # the tokenizer is checked after
                                dataset={**_space_dataset(), "tokenizer": repo})
    else:
        space = tiny_space_file(tmp_path, dataset={**_space_dataset(), "tokenizer": repo})
    proc = run_cli("search", space, "--searcher", "random", "--storage", tmp_path / "runs",
                   "--no-progress", "--no-ray-dashboard", cwd=tmp_path,
                   env=offline_env(tmp_path / "hub"), timeout=180)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"error: {space}: {field}: '{repo}' is no local directory, and as a "
                               f"Hugging Face Hub model id it is not in the cache"), lines[0]
    assert "HF_HUB_OFFLINE is set" in lines[0]
    assert not (tmp_path / "runs").exists()


def _space_dataset():
    from conftest import TINY_SPACE

    return dict(TINY_SPACE["dataset"])


def test_hub_id_in_the_cache_resolves_offline(tmp_path, family_checkpoints):
    """A snapshot laid out as huggingface_hub's cache keeps it (``models--ORG--NAME``,
    ``refs/main`` -> ``snapshots/<commit>``) is found with HF_HUB_OFFLINE=1, for the model
    and for the tokenizer; an id cached without weights is refused offline."""
    import shutil

    hub = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = hub / "models--tiny-org--tiny-roberta" / "snapshots" / commit
    shutil.copytree(family_checkpoints["roberta"], snap)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text(commit)
    tok_only = hub / "models--tiny-org--tokenizer-only" / "snapshots" / commit
    tok_only.mkdir(parents=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(snap / f, tok_only / f)
    (tok_only.parents[1] / "refs").mkdir()
    (tok_only.parents[1] / "refs" / "main").write_text(commit)
    code = """
import json, torch
from archsearch.data.tokenizer import check_tokenizer_arg, pretrained_dir, PretrainedTokenizer
from archsearch.errors import UserError
from archsearch.models.pretrained import check_checkpoint, transformer_from_pretrained, checkpoint_dir
check_checkpoint("tiny-org/tiny-roberta", max_len=32)
m = transformer_from_pretrained("tiny-org/tiny-roberta", max_len=32)
d = str(checkpoint_dir("tiny-org/tiny-roberta"))
ref = transformer_from_pretrained(d, max_len=32)
same = all(torch.equal(a, b) for (k, a), (_, b) in zip(m.state_dict().items(), ref.state_dict().items()) if not k.startswith("head"))
tok = PretrainedTokenizer(pretrained_dir("tiny-org/tokenizer-only"))
try:
    check_checkpoint("tiny-org/tokenizer-only", file="space.yaml", field="fixed.init_from")
    err = None
except UserError as e:
    err = e.one_line()
print(json.dumps({"dir": d, "same": same, "kind": check_tokenizer_arg("tiny-org/tiny-roberta"),
                  "tok_dir": pretrained_dir("tiny-org/tokenizer-only"), "prefix": tok.prefix, "err": err}))
"""
    proc = subprocess.run([sys.executable, "-c", code], env=offline_env(hub), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["dir"] == str(snap) and out["same"] and out["kind"] == "pretrained"
    assert out["tok_dir"] == str(tok_only.resolve()) and out["prefix"] == [0]
    assert out["err"].startswith("space.yaml: fixed.init_from: 'tiny-org/tokenizer-only' is no "
                                 "local directory, and as a Hugging Face Hub model id its cached "
                                 f"snapshot {tok_only} has no config.json"), out["err"]
