"""Devices and precisions (issue 35): a checkpoint written on the test device
(``ARCHSEARCH_TEST_DEVICE``, the ``device`` fixture) loads on the CPU and back, with the same
predictions, RNG states, optimizer state, tying agent and gating state; the precision a trial
runs at (:func:`archsearch.tune.trainable.resolve_precision`); a bf16 trial on the CPU; and
:func:`archsearch.models.costs.latency_ms` on the test device (synchronised on CUDA).

Real training of a tiny model on real data through :class:`~archsearch.tune.trainable.TrialLoop`
(the data and ``predictions`` as in ``tests/test_gating_contract.py``)."""

from __future__ import annotations

import math

import pytest

from conftest import sentence_subsets
import torch

from test_gating_contract import predictions

N_TRAIN, N_VAL, N_TEST = 512, 192, 160

#: DHT with the RL tying agent: the bandit takes over within the epoch (warm-up 3, at most 8
#: steps), and the agent decides every 2 steps (16 steps: 3 exploring rounds, rewarded and
#: replayed, then the greedy one).
CFG = {"gating": "dht", "tying": "rl", "tying_every": 2, "n_layers": 3, "d_model": 32, "n_heads": 4,
       "warmup_steps": 4, "lr": 2e-3, "flops_budget": 0.5, "dht_warmup_steps": 3, "dht_warmup_max_steps": 8}


@pytest.fixture(scope="module")
def small_data(cache_dir):
    return sentence_subsets(train=N_TRAIN, validation=N_VAL, test=N_TEST)


def make_loop(data, device, seed=0, cfg=None, **settings):
    from archsearch.tune.trainable import TrialLoop

    return TrialLoop(dict(CFG if cfg is None else cfg), data,
                     {"epochs": 1, "batch_size": 32, "seed": seed, "latency_batch_size": 16,
                      "device": str(device), **settings})


def assert_same(a, b, where="state"):
    """``a`` and ``b`` hold the same values: dicts, lists, numbers, strings and tensors (compared
    on the CPU, bit for bit, NaN equal to NaN; the dtype too)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, sorted(a), sorted(b))
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        torch.testing.assert_close(b.cpu(), a.cpu(), rtol=0, atol=0, equal_nan=True, msg=where)
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, (where, a, b)


def assert_restored(loop, ref):
    """``loop`` (just loaded) holds ``ref``'s weights, RNG, optimizer, schedule, tying and gating
    state, with its weights and optimizer moments on its own device."""
    from archsearch.dynamic.tying.maps import tying_map

    dev = loop.device.type
    assert all(p.device.type == dev for p in loop.model.parameters())
    assert_same(loop.model.state_dict(), ref.model.state_dict(), "model")
    # RNG states: CPU ByteTensors wherever the checkpoint was written
    for new, old in ((loop.gen, ref.gen), (loop.tying.agent.rng, ref.tying.agent.rng)):
        state = new.get_state()
        assert state.dtype == torch.uint8 and state.device.type == "cpu"
        assert torch.equal(state, old.get_state())
    # optimizer: the same per-parameter state, the moments where the parameters are ("step"
    # stays a CPU scalar: AdamW without capturable/fused keeps it there)
    params = [p for g in loop.opt.param_groups for p in g["params"]]
    ref_params = [p for g in ref.opt.param_groups for p in g["params"]]
    assert len(params) == len(ref_params) and len(loop.opt.state) == len(ref.opt.state) > 0
    for p, q in zip(params, ref_params):
        st, ref_st = loop.opt.state.get(p, {}), ref.opt.state.get(q, {})
        assert set(st) == set(ref_st)
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                assert v.device.type == ("cpu" if k == "step" else dev), (k, v.device)
        assert_same(st, ref_st, "opt")
    assert_same(loop.sched.state_dict(), ref.sched.state_dict(), "sched")
    # tying: the same map with real sharing, and the agent's whole state
    s = tying_map(loop.model)
    assert s == tying_map(ref.model)
    for i, j in enumerate(s):
        assert loop.model.blocks[i].attn.q.weight is loop.model.blocks[j].attn.q.weight
    assert_same(loop.tying.state_dict(), ref.tying.state_dict(), "tying")
    assert_same(loop.gating.state_dict(), ref.gating.state_dict(), "gating")
    assert (loop.step, loop.epoch) == (ref.step, ref.epoch)


def test_a_checkpoint_written_on_the_test_device_loads_on_the_cpu_and_back(small_data, device, tmp_path):
    from archsearch.dynamic.tying.maps import apply_tying_map, sync_optimizer

    torch.set_num_threads(1)
    loop = make_loop(small_data, device)
    loop.train_epoch()
    loop.evaluate("validation")  # calibrates the inference price: part of the saved state
    rl, dht = loop.tying, loop.gating
    assert rl.decisions > 0 and len(rl.agent.buffer) > 0 and rl.agent.updates > 0  # the agent acted and learnt
    assert dht.takeover_step is not None and dht.eval_price is not None
    # a map with a tie and an untied block (a fresh loop starts all tied): the load must re-create it
    if apply_tying_map(loop.model, [0, 1, 1]):
        sync_optimizer(loop)
    before = predictions(loop)
    (tmp_path / "device").mkdir()
    loop.save(str(tmp_path / "device"))

    on_cpu = make_loop(small_data, "cpu", seed=3)  # another seed: everything must come from the file
    on_cpu.load(str(tmp_path / "device"))
    assert_restored(on_cpu, loop)
    after = predictions(on_cpu)
    torch.testing.assert_close(after[0], before[0], rtol=1e-4, atol=1e-4)  # CPU vs device kernels
    torch.testing.assert_close(after[1], before[1])  # the same routing: the same FLOPs

    (tmp_path / "cpu").mkdir()  # and back: written on the CPU, loaded on the test device
    on_cpu.save(str(tmp_path / "cpu"))
    back = make_loop(small_data, device, seed=5)
    back.load(str(tmp_path / "cpu"))
    assert_restored(back, loop)
    again = predictions(back)
    torch.testing.assert_close(again[0], before[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(again[1], before[1])


def test_resolve_precision(device):
    from archsearch.tune.trainable import resolve_precision

    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("fp32", cpu) == "fp32" and resolve_precision("bf16", cpu) == "bf16"
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        resolve_precision("fp16", cpu)
    for bad in ("fp64", "half", "AUTO", ""):
        with pytest.raises(ValueError, match="precision must be fp32, bf16, fp16 or auto"):
            resolve_precision(bad, cpu)
    if device.type == "cuda":
        assert resolve_precision("auto", device) == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")
        assert resolve_precision("fp16", device) == "fp16"


def test_a_bf16_trial_trains_and_evaluates_on_the_cpu(small_data):
    torch.set_num_threads(1)
    cfg = {"n_layers": 2, "d_model": 32, "n_heads": 4, "warmup_steps": 4, "lr": 2e-3}
    loop = make_loop(small_data, "cpu", cfg=cfg, precision="bf16")
    assert loop.precision == "bf16"
    x, mask, _ = next(loop.eval_batches())
    seen = []
    hook = loop.model.blocks[0].ffn.fc1.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    try:
        with torch.no_grad(), loop.autocast():  # autocast runs on the CPU too: bf16 matrix products,
            logits = loop.model(x, mask)  # a float32 classifier (Transformer.head_logits)
    finally:
        hook.remove()
    assert seen == [torch.bfloat16] and logits.dtype == torch.float32
    loss = loop.train_epoch()
    m = loop.evaluate()
    assert (m["precision"], m["device"]) == ("bf16", "cpu")
    assert math.isfinite(loss) and math.isfinite(m["val_loss"]) and 0.0 <= m["accuracy"] <= 1.0
    assert m["latency_ms"] > 0


def test_latency_ms_runs_on_the_test_device_and_synchronises_cuda(device, monkeypatch):
    from archsearch.models import costs
    from archsearch.models.transformer import Transformer, TransformerConfig

    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=50, max_len=12, n_layers=2, d_model=32, n_heads=4,
                                          d_ffn=64)).to(device)
    ids = torch.randint(1, 50, (5, 12)).to(device)  # 5 rows, repeated cyclically into a batch of 8
    mask = torch.ones(5, 12, dtype=torch.bool, device=device)
    calls = []
    synchronize = torch.cuda.synchronize

    def counting(dev=None):
        calls.append(dev)
        return synchronize(dev)

    monkeypatch.setattr(torch.cuda, "synchronize", counting)
    ms = costs.latency_ms(model, ids, mask, batch_size=8, repeats=3, warmup=1)
    assert isinstance(ms, float) and ms > 0
    assert model.training  # its mode restored
    if device.type == "cuda":
        assert len(calls) == 2 * 3  # before and after each timed call: the kernels' time
    else:
        assert calls == []  # nothing to wait for on the CPU


class _Stop(Exception):
    pass


@pytest.mark.parametrize("cfg", [
    {"gating": "length_drop", "n_layers": 3, "d_model": 32, "n_heads": 4, "lr": 2e-3, "dropout": 0.1},
    {"gating": "static", "n_layers": 2, "d_model": 32, "n_heads": 4, "lr": 2e-3, "dropout": 0.1},
], ids=["length_drop", "static"])
def test_an_epoch_saved_part_way_resumes_to_the_same_weights(small_data, device, tmp_path, cfg):
    """TrialLoop.save inside an epoch (from ``after_step``) and load in a new process's loop:
    the epoch continues with its next batch, LengthDrop's sampler and dropout's RNG where they
    were, and ends float-for-float where an uninterrupted epoch ends (the long training stages of
    benchmarks/length/length_adaptive.py resume so across sessions)."""
    torch.set_num_threads(1)
    ref = make_loop(small_data, device, cfg=cfg)
    ref_loss = ref.train_epoch()
    ref.train_epoch()  # a second epoch: the resumed loop's next epoch draws the same order too

    part = make_loop(small_data, device, cfg=cfg)

    def stop_at_7():
        if part.epoch_step == 7:
            part.save(str(tmp_path))
            raise _Stop

    with pytest.raises(_Stop):
        part.train_epoch(after_step=stop_at_7)
    torch.manual_seed(123)  # what ran between the save and the load must not matter
    resumed = make_loop(small_data, device, seed=9, cfg=cfg)
    resumed.load(str(tmp_path))
    assert (resumed.epoch_step, resumed.step, resumed.epoch) == (7, 7, 0)
    assert resumed.train_epoch() == ref_loss  # the epoch's mean loss counts the batches before the save
    assert (resumed.epoch_step, resumed.epoch) == (0, 1) and resumed.step == ref.step // 2
    resumed.train_epoch()
    assert resumed.step == ref.step
    assert_same(resumed.model.state_dict(), ref.model.state_dict(), "model")
    assert_same(resumed.opt.state_dict()["state"], ref.opt.state_dict()["state"], "optimizer")


def test_the_length_adaptive_benchmark_resumes_a_pass_from_either_copy(small_data, device, tmp_path):
    """benchmarks/length/length_adaptive.py's ``save_partial`` always leaves a complete copy: the pass
    resumes from ``part`` or, when the swap was cut between its two steps, from ``part-new``;
    with neither there is nothing to resume."""
    from conftest import load_benchmark

    la = load_benchmark("length.length_adaptive")
    cfg = {"gating": "static", "n_layers": 2, "d_model": 32, "n_heads": 4, "lr": 2e-3}
    loop = make_loop(small_data, device, cfg=cfg)
    part = tmp_path / "full.pt.partial"
    assert not la.load_partial(make_loop(small_data, device, cfg=cfg), part)
    loop.train_epoch(after_step=lambda: loop.epoch_step % 5 or la.save_partial(loop, part))
    assert (part / "state.pt").exists() and not part.with_name(part.name + "-new").exists()
    saved = make_loop(small_data, device, seed=4, cfg=cfg)
    assert la.load_partial(saved, part) and saved.epoch_step == 15  # 16 batches: the last save at 15
    part.rename(part.with_name(part.name + "-new"))  # the swap cut after removing the old copy
    again = make_loop(small_data, device, seed=5, cfg=cfg)
    assert la.load_partial(again, part) and again.epoch_step == 15
    assert_same(again.model.state_dict(), saved.model.state_dict(), "model")


def test_an_infinite_gradient_with_a_finite_loss_fails_the_trial(small_data, device):
    """Clipping turns an infinite gradient into NaN and the optimizer writes it into the
    weights: the epoch raises FloatingPointError (the trial's error) instead of going on to
    report an accuracy of NaN logits."""
    loop = make_loop(small_data, device, cfg={"gating": "static", "n_layers": 2, "d_model": 32, "n_heads": 4})
    weight = next(p for p in loop.model.parameters() if p.requires_grad)
    weight.register_hook(lambda g: g * math.inf)
    with pytest.raises(FloatingPointError, match="gradient norm is nan at epoch 1, step 0"):
        loop.train_epoch()


def test_diverged_weights_fail_the_evaluation(small_data, device):
    """A model whose weights hold a NaN has a NaN validation loss (its argmax accuracy would
    look like a number): evaluate raises rather than returning metrics."""
    loop = make_loop(small_data, device, cfg={"gating": "static", "n_layers": 2, "d_model": 32, "n_heads": 4})
    loop.train_epoch()
    assert math.isfinite(loop.evaluate()["val_loss"])
    with torch.no_grad():
        next(loop.model.blocks[-1].ffn.parameters())[0, 0] = math.nan
    with pytest.raises(FloatingPointError, match="validation loss is nan after epoch 1"):
        loop.evaluate()
