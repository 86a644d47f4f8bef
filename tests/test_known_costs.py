"""The costs known before training (:func:`archsearch.dynamic.known_costs.known_costs_fn`) are the
ones a trial reports, for every registered gating with its DEFAULT settings: each gating declares
what it changes (``GatingStrategy.known_cost``: its ``flops_budget``, its exit heads), and
``models/`` keeps only the gating-free arithmetic (``static_costs_fn``, ``exit_head_params``).
Real training of tiny models on real data through :class:`~archsearch.tune.trainable.TrialLoop`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import sentence_subsets
import torch

from archsearch.dynamic import GATING

N_TRAIN, N_VAL = 384, 160
ARCH = {"n_layers": 3, "d_model": 32, "n_heads": 4, "warmup_steps": 4, "lr": 2e-3}
MODELS = Path(__file__).resolve().parents[1] / "archsearch" / "models"


@pytest.fixture(scope="module")
def small_data(cache_dir):
    return sentence_subsets(train=N_TRAIN, validation=N_VAL)


@pytest.mark.parametrize("task", ["classification", "lm"])
def test_exit_head_params_is_what_add_exit_heads_adds(task):
    from archsearch.models.costs import exit_head_params, params_total, params_trainable
    from archsearch.models.transformer import Transformer, TransformerConfig

    config = TransformerConfig(vocab_size=50, max_len=8, n_layers=3, d_model=16, n_heads=2, d_ffn=32,
                               task=task, n_classes=5 if task == "classification" else 0)
    for depths in ([1, 2, 3], [0, 3], [], [2, 2, 1], [3]):
        with torch.device("meta"):
            model = Transformer(config)
        before = (params_total(model), params_trainable(model))
        model.add_exit_heads(depths)
        added = exit_head_params(config, depths)
        assert (params_total(model) - before[0], params_trainable(model) - before[1]) == (added, added), depths
        if task == "classification":
            assert added == len({d for d in depths if d < 3}) * (16 * 5 + 5)
        else:
            assert added == 0  # a no-op for LM
    if task == "classification":
        with pytest.raises(ValueError, match="exit depth 4"):
            exit_head_params(config, [1, 4])


def trained(name, data, device, **cfg):
    from archsearch.tune.trainable import TrialLoop

    torch.set_num_threads(1)
    loop = TrialLoop({"gating": name, **ARCH, **cfg}, data,
                     {"epochs": 1, "batch_size": 32, "seed": 0, "latency_batch_size": 8, "device": str(device)})
    loop.train_epoch()
    return loop


@pytest.mark.parametrize("name,cfg", [(n, {}) for n in sorted(GATING)]
                         + [("confidence_exit", {"flops_budget": 0.5})])
def test_known_costs_with_default_settings_are_what_a_trial_reports(small_data, device, name, cfg):
    """Only ``gating`` (and the architecture) set: ``dht`` runs at its default budget 0.5 with
    exit heads, ``depth_predictor`` / ``confidence_exit`` with exit heads and no budget,
    ``cascade`` with its one cut model and no budget."""
    from archsearch.dynamic import gating_class
    from archsearch.dynamic.known_costs import known_costs_fn

    loop = trained(name, small_data, device, **cfg)
    val = loop.evaluate("validation")
    cost_fn = known_costs_fn(small_data)
    known = cost_fn({"gating": name, **ARCH, **cfg})
    assert known == cost_fn(loop.cfg)  # the config as given, or as the trial completed it
    static = cost_fn({**ARCH})  # gating: static, the DEFAULTS' value
    assert (known["params_total"], known["params_trainable"]) == (val["params_total"], val["params_trainable"])
    s = gating_class(name).Settings.from_config(loop.cfg)
    if getattr(s, "exit_heads", False):
        assert known["params_total"] == static["params_total"] + 2 * (32 * small_data.n_classes + small_data.n_classes)
    budget = getattr(s, "flops_budget", None)
    assert budget == cfg.get("flops_budget", 0.5 if name == "dht" else None)
    if budget is not None:
        assert known["flops_per_sample"] == pytest.approx(budget * static["flops_per_sample"], rel=1e-12)
        assert abs(val["flops_per_sample"] - known["flops_per_sample"]) <= 0.05 * static["flops_per_sample"]
    elif name == "static":
        assert val["flops_per_sample"] == pytest.approx(known["flops_per_sample"], rel=1e-9)
    elif name == "cascade":  # every row through every model: a bound above the static value
        assert known["flops_per_sample"] > static["flops_per_sample"]
        assert val["flops_per_sample"] <= known["flops_per_sample"] * (1 + 1e-9)
    else:  # an upper bound (the depth predictor's own MLP on top of the blocks it runs)
        own = loop.gating.predictor.flops_per_sample() if name == "depth_predictor" else 0
        assert known["flops_per_sample"] == static["flops_per_sample"]
        assert val["flops_per_sample"] <= known["flops_per_sample"] + own + 1e-6


def test_an_unknown_gating_or_a_refused_setting_raises(small_data):
    from archsearch.dynamic.known_costs import known_costs_fn

    cost_fn = known_costs_fn(small_data)
    with pytest.raises(ValueError, match="unknown gating"):
        cost_fn({"gating": "nope"})
    with pytest.raises(ValueError, match="flops_budget"):
        cost_fn({"gating": "confidence_exit", "flops_budget": 0.0})


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """``(line, value)`` of every string literal of ``path`` that is not a docstring."""
    tree = ast.parse(path.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_models_names_no_gating():
    """``models/`` is below ``dynamic/``: its code spells no gating (comments and docstrings may
    mention them), except ``DEFAULTS``' ``gating: static`` (the value of a key a trial config
    leaves out)."""
    from archsearch.models import costs

    assert not hasattr(costs, "BUDGETED_GATINGS") and not hasattr(costs, "budget_fraction")
    assert not hasattr(costs, "known_costs_fn")
    named = [f"{p.name}:{line}: {s!r}" for p in sorted(MODELS.glob("*.py"))
             for line, s in _code_strings(p) if s in GATING and s != "static"]
    assert not named, named
    from archsearch.models.config import DEFAULTS

    assert DEFAULTS["gating"] == "static"
