"""Static cuts of a pretrained checkpoint: ``n_layers`` next to ``init_from`` keeps the
checkpoint's first blocks (top-layer dropping, Sajjad et al. 2020), on tiny random-weight
checkpoints built offline (``AutoConfig.for_model``, as ``test_hf_families.py``)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_space
from test_hf_families import hf_config, padded_batch, save_model

LAYERS = 4  # of the tiny checkpoints


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """``bert`` and ``distilbert``: 4 layers, width 32, 4 heads, 40 positions, vocab 120;
    ``bert2``: the same with 2 layers."""
    root = tmp_path_factory.mktemp("cut")
    save_model(root / "bert", hf_config("bert", num_hidden_layers=LAYERS))
    save_model(root / "bert2", hf_config("bert", num_hidden_layers=2))
    save_model(root / "distilbert", hf_config("distilbert", n_layers=LAYERS))
    return root


class _Data(SimpleNamespace):
    """What :func:`archsearch.dynamic.known_costs.known_costs_fn` and
    :func:`~archsearch.models.pretrained.transformer_for_data` read of a PreparedData."""

    def __getitem__(self, split):
        return self.splits[split]


def _data(pad_id: int = 0) -> _Data:
    _, mask = padded_batch(pad_id, 120)  # (4, 16) bool
    return _Data(task="classification", tokenizer="ckpt", vocab_size=120, max_len=16, n_classes=3,
                 pad_id=pad_id, splits={"validation": SimpleNamespace(attention_mask=mask)})


@pytest.mark.parametrize("model_type", ["bert", "distilbert"])
def test_cut_keeps_the_first_blocks_and_equals_early_exit_of_the_full_model(checkpoints, model_type, device):
    from archsearch.models.pretrained import transformer_from_pretrained

    torch.set_num_threads(1)
    ckpt = checkpoints / model_type
    full = transformer_from_pretrained(ckpt, max_len=16).to(device).eval()
    cut = transformer_from_pretrained(ckpt, max_len=16, n_layers=2).to(device).eval()
    assert (full.config.n_layers, cut.config.n_layers, len(cut.blocks)) == (LAYERS, 2, 2)
    own, ref = cut.state_dict(), full.state_dict()
    assert set(own) == {k for k in ref if not k.startswith(("blocks.2.", "blocks.3."))}
    for name, w in own.items():  # embeddings and blocks 0-1: the checkpoint's weights
        if not name.startswith("head."):
            torch.testing.assert_close(w, ref[name], rtol=0, atol=0, msg=name)
    cut.head.load_state_dict(full.head.state_dict())  # both heads are fresh: make them equal
    ids, mask = padded_batch(0, 120, device=device)
    with torch.no_grad():
        torch.testing.assert_close(cut(ids, mask), full(ids, mask, n_layers=2), rtol=0, atol=1e-6)


@pytest.mark.parametrize("n_layers", [0, LAYERS + 1, 2.5])
def test_cut_outside_the_checkpoint_raises_one_line(checkpoints, n_layers):
    from archsearch.models.pretrained import pretrained_transformer_config, transformer_from_pretrained

    for build in (pretrained_transformer_config, transformer_from_pretrained):
        with pytest.raises(ValueError, match="n_layers") as e:
            build(checkpoints / "bert", max_len=16, n_layers=n_layers)
        line = str(e.value)
        assert "\n" not in line
        if n_layers != 2.5:
            assert f"n_layers {n_layers} outside 1 .. {LAYERS}" in line and f"{LAYERS} layers" in line


def test_trial_config_cuts_only_when_n_layers_is_given_and_costs_follow(checkpoints):
    from archsearch.dynamic.known_costs import known_costs_fn
    from archsearch.models import costs
    from archsearch.models.config import eval_lengths, model_config, trial_config
    from archsearch.models.pretrained import transformer_for_data

    ckpt = str(checkpoints / "bert")
    data = _data()
    # no n_layers (or an inactive conditional one): every layer, not DEFAULTS' from-scratch 2
    for cfg in ({"init_from": ckpt}, {"init_from": ckpt, "gating": "dht", "n_layers": None}):
        full = trial_config(cfg)
        assert "n_layers" not in full and model_config(full, data).n_layers == LAYERS
    assert model_config(trial_config({"init_from": ckpt}, {"n_layers": 3}), data).n_layers == 3
    cut_cfg = trial_config({"init_from": ckpt, "gating": "static", "n_layers": 2})
    cut = model_config(cut_cfg, data)
    assert cut.n_layers == 2
    assert model_config(trial_config({"n_layers": 3}), data).n_layers == 3  # from scratch as before
    assert trial_config({})["n_layers"] == 2
    # the trainable's model is the config's
    model = transformer_for_data(ckpt, data, n_layers=cut_cfg.get("n_layers"))
    assert model.config == cut and len(model.blocks) == 2
    # the searchers' costs: the cut's FLOPs are the full model's early exit after 2 blocks
    cost = known_costs_fn(data)
    full_cfg = model_config(trial_config({"init_from": ckpt}), data)
    lengths = eval_lengths(data)
    rows = sum(n for _, n in lengths)
    expected = sum(n * costs.flops_per_sample(full_cfg, T, n_layers=2) for T, n in lengths) / rows
    got = cost({"init_from": ckpt, "gating": "static", "n_layers": 2})
    assert got["flops_per_sample"] == pytest.approx(expected)
    assert got["flops_per_sample"] < cost({"init_from": ckpt})["flops_per_sample"]
    assert got["params_total"] == sum(p.numel() for p in model.parameters())


def _space(tmp_path, ckpt, **changes):
    dataset = {"name": "rotten_tomatoes_sentences", "vocab_size": 1000, "max_len": 32,
               "max_train_samples": 64, "tokenizer": ckpt}
    changes.setdefault("fixed", {"init_from": ckpt})
    return tiny_space(tmp_path, dataset=dataset, **changes)


@pytest.mark.parametrize("case,field,says", [
    ({"n_layers": {"type": "int", "low": 1, "high": 6}}, "params.n_layers", "n_layers 1 .. 6"),
    ({"gating": {"type": "categorical", "choices": ["static", "dht"]},
      "n_layers": {"type": "int", "low": 1, "high": 5, "when": {"gating": ["static"]}}},
     "params.n_layers", "n_layers 1 .. 5"),
    ({"n_layers": {"type": "categorical", "choices": [3, 5]}}, "params.n_layers", "n_layers 3 .. 5"),
    # (n_layers 0 is refused for any model when the space loads: tests/test_space.py)
    ({}, "fixed.n_layers", "n_layers 7"),
])
def test_check_init_from_refuses_a_cut_the_checkpoint_cannot_give(tmp_path, checkpoints, case, field,
                                                                  says):
    from archsearch.errors import UserError
    from archsearch.tune.preflight import check_init_from

    ckpt = str(checkpoints / "bert")
    params = {"lr": {"type": "float", "low": 1e-3, "high": 3e-3}, **case}
    fixed = {"init_from": ckpt, **({} if case else {"n_layers": 7})}
    with pytest.raises(UserError) as e:
        check_init_from(_space(tmp_path, ckpt, params=params, fixed=fixed))
    line = e.value.one_line()
    assert f": {field}: " in line and "\n" not in line, line
    assert says in line and f"{LAYERS} layers" in line, line


def test_check_init_from_accepts_cuts_within_the_checkpoint(tmp_path, checkpoints):
    from archsearch.errors import UserError
    from archsearch.tune.preflight import check_init_from

    ckpt = str(checkpoints / "bert")
    check_init_from(_space(tmp_path, ckpt, params={
        "gating": {"type": "categorical", "choices": ["static", "dht"]},
        "n_layers": {"type": "int", "low": 1, "high": LAYERS, "when": {"gating": ["static"]}}}))
    check_init_from(_space(tmp_path, ckpt, params={"lr": {"type": "float", "low": 1e-3, "high": 3e-3}},
                           fixed={"init_from": ckpt, "n_layers": 1}))
    # a searched init_from: n_layers conditional on a checkpoint is checked against it only
    shallow = str(checkpoints / "bert2")
    params = {"init_from": {"type": "categorical", "choices": [ckpt, shallow]},
              "n_layers": {"type": "int", "low": 1, "high": LAYERS, "when": {"init_from": [ckpt]}}}
    check_init_from(_space(tmp_path, ckpt, fixed={}, params=params))
    del params["n_layers"]["when"]  # now also paired with the 2-layer checkpoint
    with pytest.raises(UserError, match=re.escape(f"n_layers 1 .. {LAYERS} with init_from {shallow}: "
                                                  f"a static cut keeps 1 .. 2 of its 2 layers")):
        check_init_from(_space(tmp_path, ckpt, fixed={}, params=params))


def test_relative_checkpoint_paths_are_made_absolute_before_launch(tmp_path, monkeypatch):
    """Trials run in their own directories: a relative init_from / tokenizer that exists from
    the command's directory is recorded absolute; a Hub id is left alone."""
    from archsearch.tune.preflight import absolute_local_paths
    from archsearch.space import parse_space

    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir(tmp_path)
    space = parse_space({
        "name": "t", "objectives": [{"metric": "accuracy", "mode": "max"}],
        "dataset": {"name": "rotten_tomatoes_sentences", "tokenizer": "ckpt"},
        "params": {"lr": {"type": "float", "low": 1e-5, "high": 1e-4},
                   "init_from": {"type": "categorical", "choices": ["ckpt", "org/some-model"]}},
        "fixed": {"dropout": 0.1}})
    out = absolute_local_paths(space)
    assert out.params["init_from"].choices == [str(tmp_path / "ckpt"), "org/some-model"]
    assert out.dataset.tokenizer == str(tmp_path / "ckpt")
    fixed = absolute_local_paths(space.model_copy(update={"fixed": {"init_from": "./ckpt"}}))
    assert fixed.fixed["init_from"] == str(tmp_path / "ckpt")
    assert out.dataset.name == "rotten_tomatoes_sentences"  # bundled: a name, not a path
    # a local data file too (a resumed run reads the run's space.yaml from anywhere)
    (tmp_path / "reviews.csv").write_text("text,label\na,0\nb,1\n")
    local = absolute_local_paths(space.model_copy(update={"dataset": space.dataset.model_copy(
        update={"name": "reviews.csv"})}))
    assert local.dataset.name == str(tmp_path / "reviews.csv")
    assert absolute_local_paths(parse_space({"name": "t", "objectives": [{"metric": "accuracy", "mode": "max"}],
                                             "params": {"lr": {"type": "float", "low": 1e-5, "high": 1e-4}}}))
