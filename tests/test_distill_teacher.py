"""``distill_teacher``: the exits of DHT and the depth predictor distil toward a separately
fine-tuned full model (DynaBERT, Hou et al. 2020) instead of toward their own deepest exit; on
a tiny random-weight checkpoint built offline (``test_hf_families.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from test_hf_families import hf_config, padded_batch, save_model
from test_pretrained_cut import _Data


@pytest.fixture(scope="module")
def setup(tmp_path_factory, device):
    """A 4-layer tiny BERT (``init_from``), a teacher file (its weights with a different head,
    written from the test device as ``TrialLoop.save`` writes it there), a 2-layer model's file
    (the wrong architecture) and a loop on the test device that carries the data."""
    from archsearch.models.pretrained import transformer_for_data

    root = tmp_path_factory.mktemp("teacher")
    save_model(root / "bert", hf_config("bert", num_hidden_layers=4))
    save_model(root / "bert2", hf_config("bert", num_hidden_layers=2))
    _, mask = padded_batch(0, 120)
    data = _Data(task="classification", tokenizer="ckpt", vocab_size=120, max_len=16, n_classes=3,
                 pad_id=0, splits={"validation": SimpleNamespace(attention_mask=mask)})
    torch.manual_seed(1)
    teacher = transformer_for_data(str(root / "bert"), data, dropout=0.0).to(device).eval()
    torch.save({"model": teacher.state_dict()}, root / "state.pt")  # as TrialLoop.save writes it
    torch.save(transformer_for_data(str(root / "bert2"), data).state_dict(), root / "bert2.pt")
    loop = SimpleNamespace(data=data, device=device, settings={"epochs": 1}, steps_per_epoch=lambda: 10)
    return root, data, teacher, loop


def test_all_exit_loss_with_a_teacher_distils_every_exit_toward_it():
    from archsearch.dynamic.depth.exits import all_exit_loss, distill

    g = torch.Generator().manual_seed(0)
    exits = [torch.randn(5, 3, generator=g) for _ in range(3)]
    teacher, y = torch.randn(5, 3, generator=g), torch.tensor([0, 1, 2, 0, 1])
    deep, shallow = all_exit_loss(exits, y, F.cross_entropy, "sum", teacher=teacher)
    torch.testing.assert_close(deep, F.cross_entropy(exits[2], y) + distill(exits[2], teacher))
    torch.testing.assert_close(shallow, sum((F.cross_entropy(e, y) + distill(e, teacher)) / 2 for e in exits[:2]))
    own_deep, own_shallow = all_exit_loss(exits, y, F.cross_entropy, "sum")  # toward the deepest exit
    torch.testing.assert_close(own_deep, F.cross_entropy(exits[2], y))
    assert not torch.allclose(own_shallow, shallow)


@pytest.mark.parametrize("gating", ["dht", "depth_predictor"])
def test_strategies_load_a_frozen_teacher_and_its_logits_enter_the_loss(setup, gating, device):
    from archsearch.dynamic.depth.dht import DHTGating
    from archsearch.dynamic.depth.predictor import DepthPredictorGating
    from archsearch.models.pretrained import transformer_for_data

    root, data, teacher, loop = setup
    cls = DHTGating if gating == "dht" else DepthPredictorGating
    x, mask = padded_batch(0, 120, device=device)
    y = torch.tensor([0, 1, 2, 1], device=device)
    cfg = {"init_from": str(root / "bert"), "exit_heads": True, "min_layers": 1, "n_fixed": 1,
           "dht_warmup_steps": 5, "depth_warmup_steps": 5}  # the loop here knows no step count
    states = []
    for extra in ({}, {"distill_teacher": str(root / "state.pt")}):
        torch.manual_seed(0)
        student = transformer_for_data(str(root / "bert"), data, dropout=0.0).to(device).train()
        g = cls(student, {**cfg, **extra}, {"seed": 0}, loop=loop)
        states.append((torch.random.get_rng_state(), student.state_dict(), g))
    (rng0, sd0, plain), (rng1, sd1, g) = states
    assert plain.teacher is None and torch.equal(rng0, rng1)  # loading the teacher draws no random number
    assert all(torch.equal(sd0[k], sd1[k]) for k in sd0)  # the same student, exit heads included
    with torch.no_grad():  # the file's weights, frozen, in eval mode
        torch.testing.assert_close(g.teacher(x, mask), teacher(x, mask))
    assert not g.teacher.training and not any(q.requires_grad for q in g.teacher.parameters())
    assert all(q.device.type == device.type for q in g.teacher.parameters())  # on the loop's device
    loss = g.training_loss(x, mask, y, F.cross_entropy)
    loss.backward()
    assert all(q.grad is None for q in g.teacher.parameters())
    assert any(q.grad is not None for q in g.model.parameters())
    with_teacher = float(loss.detach())
    g.teacher = None  # the same strategy, model and batch: only the KD targets change
    assert float(g.training_loss(x, mask, y, F.cross_entropy).detach()) != pytest.approx(with_teacher)


def test_a_bad_teacher_file_is_one_line_naming_it(setup):
    from archsearch.dynamic.depth.dht import DHTGating
    from archsearch.models.pretrained import transformer_for_data

    root, data, _, loop = setup
    (root / "broken.pt").write_bytes(b"not a checkpoint")
    for name, match in (("missing.pt", "cannot read"), ("broken.pt", "cannot read"),
                        ("bert2.pt", "does not hold a full")):
        student = transformer_for_data(str(root / "bert"), data)
        with pytest.raises(ValueError, match=match) as e:
            DHTGating(student, {"init_from": str(root / "bert"), "distill_teacher": str(root / name)},
                      {"seed": 0}, loop=loop)
        assert name in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="needs init_from"):
        DHTGating(transformer_for_data(str(root / "bert"), data), {"distill_teacher": str(root / "state.pt")},
                  {"seed": 0}, loop=loop)


def test_a_static_cut_with_a_teacher_learns_half_from_it(setup, device):
    """The distilled static cut (``force_depth`` with ``distill_teacher``): ``(CE + KD) / 2`` of
    the cut's own logits toward the teacher's."""
    from archsearch.dynamic.depth.dht import DHTGating
    from archsearch.dynamic.depth.exits import distill
    from archsearch.models.pretrained import transformer_for_data

    root, data, teacher, loop = setup
    x, mask = padded_batch(0, 120, device=device)
    y = torch.tensor([0, 1, 2, 1], device=device)
    student = transformer_for_data(str(root / "bert"), data, dropout=0.0).to(device).eval()
    g = DHTGating(student, {"init_from": str(root / "bert"), "distill_teacher": str(root / "state.pt")},
                  {"seed": 0}, loop=loop)
    g.force_depth = 2
    with torch.no_grad():
        cut = student(x, mask, n_layers=2)
        want = (F.cross_entropy(cut, y) + distill(cut, teacher(x, mask))) / 2
        torch.testing.assert_close(g.training_loss(x, mask, y, F.cross_entropy), want)
