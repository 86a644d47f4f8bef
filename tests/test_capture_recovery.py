"""A failed CUDA graph capture leaves the process's CUDA RNG usable
(:func:`archsearch.dynamic.depth.cascade_graphs.recover_after_failed_capture`), on a CPU: a fake
graph whose ``capture_end`` raises and a fake generator that stays "capturing" (every dropout
draw fails, as PyTorch's philox state does) until the graph's ``reset`` or a restored RNG state
clears it. :meth:`SegmentGraphs.run` then switches graphs off with a warning, counts the failure
and runs the segment eagerly; a generator nothing can clear raises one clear error."""

from __future__ import annotations

import contextlib

import pytest
import torch

from archsearch.dynamic.depth import cascade_graphs
from archsearch.dynamic.depth.cascade_graphs import SegmentGraphs, recover_after_failed_capture

PHILOX = "philox_cuda_state for an unexpected CUDA generator used during capture"


class FakeGenerator:
    """The device's default generator: registered for a capture, every draw fails."""

    def __init__(self):
        self.capturing = False
        self.restored = []

    def draw(self, device=None):  # dropout's philox draw (the probe)
        if self.capturing:
            raise RuntimeError(PHILOX)


class FakeStream:
    def __init__(self):
        self.capturing = False

    def wait_stream(self, other):
        pass


class FakeGraph:
    """``capture_end`` raises (the segment synchronised with the host). ``ends``: whether it ended
    the stream's capture before raising (else a second call ends it); ``reset_cleans``: whether
    ``reset`` unregisters the generator (PyTorch with PR #171265) or not (older PyTorch)."""

    def __init__(self, gen, stream, *, reset_cleans=True, ends=True):
        self.gen, self.stream, self.reset_cleans, self.ends = gen, stream, reset_cleans, ends
        self.end_calls = self.resets = 0

    def capture_begin(self, pool=None):
        self.stream.capturing = self.gen.capturing = True

    def capture_end(self):
        self.end_calls += 1
        if self.ends or self.end_calls > 1:
            self.stream.capturing = False
        if self.end_calls == 1:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    def reset(self):
        self.resets += 1
        if self.reset_cleans:
            self.gen.capturing = False

    def replay(self):
        raise AssertionError("a failed capture is never replayed")


def fake_cuda(monkeypatch, *, reset_cleans=True, restore_cleans=True, ends=True):
    """Replace the ``torch.cuda`` pieces :meth:`SegmentGraphs._capture` calls by fakes; returns
    ``(generator, graphs made, side stream)``."""
    gen, main, side, graphs = FakeGenerator(), FakeStream(), FakeStream(), []
    current = [main]

    @contextlib.contextmanager
    def stream(s):
        current.append(s)
        try:
            yield
        finally:
            current.pop()

    def set_rng_state(state, device=None):
        gen.restored.append(state)
        if restore_cleans:
            gen.capturing = False

    def new_graph():
        graphs.append(FakeGraph(gen, side, reset_cleans=reset_cleans, ends=ends))
        return graphs[-1]

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[-1])
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: side)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool",))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", new_graph)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=None: torch.tensor([7, 7], dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: current[-1].capturing)
    monkeypatch.setattr(cascade_graphs, "_probe_rng", gen.draw)
    return gen, graphs, side


def segment(k, h, pad, state):
    return h + 1, h.sum(-1), h[:, 0, 0] > 0, state


def run_once(sg):
    h = torch.randn(3, 5, 4)
    return h, sg.run((("p",), None), 0, segment, h, None, None)


@pytest.mark.parametrize("reset_cleans", [True, False], ids=["reset-cleans", "restore-needed"])
def test_a_failed_capture_switches_graphs_off_and_leaves_dropout_working(monkeypatch, reset_cleans):
    gen, graphs, side = fake_cuda(monkeypatch, reset_cleans=reset_cleans)
    sg = SegmentGraphs(measure=False, capture_after=1)
    with pytest.warns(RuntimeWarning, match="cascade graphs off: a segment could not be captured"):
        h, (out, logits, stop, state) = run_once(sg)
    torch.testing.assert_close(out, h + 1)  # the segment ran eagerly
    assert sg.enabled is False
    assert sg.counts["failed"] == 1 and sg.counts["captured"] == 0 and sg.counts["eager_runs"] == 1
    assert graphs[0].resets == 1 and not side.capturing
    gen.draw()  # a later dropout draws
    # restored only where the reset did not clean the generator, with the state saved before
    assert len(gen.restored) == (0 if reset_cleans else 1)
    if gen.restored:
        assert gen.restored[0].tolist() == [7, 7]


def test_a_stream_left_capturing_is_ended_before_the_reset(monkeypatch):
    gen, graphs, side = fake_cuda(monkeypatch, ends=False)
    sg = SegmentGraphs(measure=False, capture_after=1)
    with pytest.warns(RuntimeWarning, match="cascade graphs off"):
        run_once(sg)
    assert graphs[0].end_calls == 2 and not side.capturing and graphs[0].resets == 1
    gen.draw()
    assert sg.counts["failed"] == 1


def test_an_unrecoverable_generator_raises_one_clear_error(monkeypatch):
    gen, graphs, _ = fake_cuda(monkeypatch, reset_cleans=False, restore_cleans=False)
    sg = SegmentGraphs(measure=False, capture_after=1)
    with pytest.raises(RuntimeError, match="CUDA RNG on cpu is unusable after a failed CUDA graph capture") as e:
        run_once(sg)
    assert PHILOX in str(e.value) and "new process" in str(e.value)
    assert sg.enabled is False and sg.counts["failed"] == 1 and len(gen.restored) == 1


def test_the_recovery_with_injected_pieces():
    """The function alone: each piece injected, no ``torch.cuda`` at all."""
    gen, stream = FakeGenerator(), FakeStream()
    calls = []

    def set_state(state, device):
        calls.append((state, device))
        gen.capturing = False

    graph = FakeGraph(gen, stream, reset_cleans=False)
    graph.capture_begin()
    assert recover_after_failed_capture(graph, "dev", "saved", probe=gen.draw, set_state=set_state) == "restored"
    assert calls == [("saved", "dev")] and graph.resets == 1
    graph = FakeGraph(gen, stream, reset_cleans=True)
    graph.capture_begin()
    assert recover_after_failed_capture(graph, "dev", "saved", probe=gen.draw, set_state=set_state) == "reset"
    assert len(calls) == 1

    class Broken(FakeGraph):
        def reset(self):
            raise RuntimeError("reset failed too")  # ignored: the probe decides

    graph = Broken(gen, stream)
    graph.capture_begin()
    with pytest.raises(RuntimeError, match="unusable after a failed CUDA graph capture.*still capturing"):
        recover_after_failed_capture(graph, "dev", "saved", stream=stream, probe=gen.draw,
                                     set_state=lambda s, d: None, is_capturing=lambda s: True)
