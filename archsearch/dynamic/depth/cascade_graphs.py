"""CUDA graphs of an early-exit cascade's segments: per-sample exits that do not pay for kernel
launches (issue 35).

On a GPU a MiniLM-sized block on a small batch (batch 1, or batch 32 at length <= 128) is
launch-bound: the time goes to the host queueing some twenty small kernels per block, not to the
arithmetic, so an early-exit cascade (:func:`~archsearch.dynamic.depth.exits.run_cascade`), which
adds an exit head and a stop rule per exit and one host synchronisation per exit, ran 1.1x (batch 1) to
1.9x (batch 32) the full model's wall time on an H100 while executing half its FLOPs. A segment --
the blocks up to an exit, that exit's head and its stop rule -- has a fixed shape for a given
number of rows and length, so it can be captured once as a CUDA graph and replayed with one launch
(``torch.cuda.CUDAGraph``; NVIDIA, "CUDA C++ Programming Guide", CUDA Graphs). The rows still
running are gathered into the static input of the next segment's graph, padded up to a power of
two of rows (a bounded number of graphs per length; the padding rows' results are never read and
their arithmetic is not counted in the reported FLOPs).

Which executor runs a batch -- the gathered cascade, the whole batch to the exit where every
row has stopped, or the whole batch to the last exit without a host synchronisation
(:data:`EXECUTORS`) -- is measured too, per (rows, length)
(:meth:`SegmentGraphs.choose_executor`): the first meetings of a shape run each executor untimed
(their graphs get captured), the next ones take them in turn timed (device synchronised, runs
during which a graph was captured discarded) until each has :attr:`SegmentGraphs.timed_runs`
clean timings, and the fastest (the lowest best time) runs that shape from then on.

How a segment runs is chosen by measurement on the device, per (segment, rows, length): when it
is first met, the segment is timed eagerly and as a graph replay (each after a warm-up, device
synchronised), and the faster is kept. Segments over :attr:`SegmentGraphs.max_tokens` rows x
tokens (compute-bound: a graph saves nothing there and would hold large buffers) and everything
on a CPU run eagerly.

A graph bakes in the constants its stop rule read at capture (a threshold, a price, fitted
weights) and the addresses of the model's weights: the caller names them in ``key``'s first
element (the *prefix*), and a new prefix drops every graph held. Python-side effects of a segment
(module forward hooks, counters) run at capture, not at replays: instrumented runs set
:attr:`SegmentGraphs.enabled` False. A segment must not synchronise with the host or copy from
pageable host memory (the capture refuses it; then graphs are switched off for the gating, with
a warning). A failed capture can leave the device's default CUDA generator registered for the
capture, which breaks every later dropout in the process (a philox draw):
:func:`recover_after_failed_capture` ends the capture, resets the graph, checks a draw and, if
that fails, restores the generator state saved before the capture, or raises.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from typing import Any, Callable

import torch

#: ``segment(k, h, pad, state) -> (h, logits, stop, state)``: the cascade's segment ``k`` (see
#: :func:`archsearch.dynamic.depth.exits.run_cascade`) on ``b`` rows: ``h`` ``b x T x d``, ``pad``
#: ``b x T`` bool or ``None``, ``state`` ``None`` or a tuple of ``b``-row tensors; ``stop`` a ``b``
#: bool tensor or ``None`` at the last exit.
Segment = Callable[[int, torch.Tensor, "torch.Tensor | None", Any], tuple]

_EAGER = "eager"  # a segment measured faster without a graph

#: How :func:`~archsearch.dynamic.depth.exits.run_cascade` can run a batch: gathered survivors, the
#: whole batch until every row has stopped, or the whole batch to the last exit without waiting
#: for the device.
EXECUTORS = ("gather", "whole", "whole_async")


def _rows_bucket(b: int) -> int:
    """The graph's row count for ``b`` live rows: the next power of two."""
    return 1 << max(b - 1, 0).bit_length()


def _padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    """A new tensor of ``rows`` rows (outside any graph pool): ``x`` then copies of its first row."""
    out = x.new_empty((rows,) + tuple(x.shape[1:]))
    out[:len(x)] = x
    out[len(x):] = x[:1]
    return out


def model_signature(model: torch.nn.Module) -> tuple:
    """What a graph of ``model`` bakes in besides the stop rule's constants, for a key's prefix:
    the model, where its first weight lives (a move or a cast reallocates it; ``load_state_dict``
    copies in place and keeps it), and the autocast dtype. Replacing a submodule is not seen:
    call :meth:`SegmentGraphs.clear` after one."""
    first = next(model.parameters())
    dev = first.device.type
    amp = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
    return (id(model), first.data_ptr(), str(first.dtype), str(amp))


def graphs_of(owner: Any) -> "SegmentGraphs":
    """``owner``'s :class:`SegmentGraphs` (attribute ``_segment_graphs``), made on first use."""
    g = owner.__dict__.get("_segment_graphs")
    if g is None:
        g = owner._segment_graphs = SegmentGraphs()
    return g


def _probe_rng(device: torch.device) -> None:
    """Draw from ``device``'s default generator as dropout does (a philox Bernoulli draw) and
    wait for it: raises where the generator is unusable."""
    torch.empty(1, device=device).bernoulli_(0.5)
    torch.cuda.synchronize(device)


def _stream_capturing(stream) -> bool:
    """Whether ``stream`` is capturing a CUDA graph."""
    with torch.cuda.stream(stream):
        return torch.cuda.is_current_stream_capturing()


def recover_after_failed_capture(graph: Any, device: torch.device, saved_state: torch.Tensor, *,
                                 stream: Any = None, probe: Callable[[torch.device], None] | None = None,
                                 set_state: Callable[[torch.Tensor, torch.device], None] | None = None,
                                 is_capturing: Callable[[Any], bool] | None = None) -> str:
    """Leave the process's CUDA RNG usable after ``graph``'s capture on ``stream`` failed.

    A capture that fails between ``capture_begin`` and ``capture_end`` can leave ``stream``
    capturing and the device's default generator registered for the capture (PyTorch's
    ``CUDAGraph.capture_end`` ends the generators' capture only after the stream's capture ended
    cleanly), and then every later dropout in the process fails ("philox_cuda_state for an
    unexpected CUDA generator used during capture", offset errors). In order:

    1. a ``stream`` still capturing has its capture ended (``graph.capture_end()`` again, on it;
       errors ignored);
    2. ``graph.reset()`` (errors ignored): it releases the graph, and since PyTorch PR #171265
       ("Implement Cleanup for Generator States in CUDAGraph Reset Method") the generator states
       the capture registered;
    3. ``probe(device)``, a draw as dropout makes (it advances the generator); if it raises,
       ``set_state(saved_state, device)`` restores the generator state saved before
       ``capture_begin`` and the draw is tried again.

    Args:
        graph: the ``torch.cuda.CUDAGraph`` whose capture failed.
        device: the CUDA device.
        saved_state: ``torch.cuda.get_rng_state(device)`` taken before ``capture_begin``.
        stream: the capturing stream (``None``: not checked).
        probe, set_state, is_capturing: default :func:`_probe_rng`,
            ``torch.cuda.set_rng_state`` and :func:`_stream_capturing` (tests replace them).

    Returns:
        ``"reset"`` (the draw worked after steps 1-2) or ``"restored"`` (after the restore).

    Raises:
        RuntimeError: the draw still fails after the restore: the process's CUDA RNG is
            unusable (a new process is needed for anything that draws random numbers on it).
    """
    probe = probe or _probe_rng
    set_state = set_state or torch.cuda.set_rng_state
    is_capturing = is_capturing or _stream_capturing
    if stream is not None:
        with contextlib.suppress(Exception):
            if is_capturing(stream):
                with torch.cuda.stream(stream), contextlib.suppress(Exception):
                    graph.capture_end()
    with contextlib.suppress(Exception):
        graph.reset()
    try:
        probe(device)
        return "reset"
    except Exception:  # whatever the generator raises, the restore comes next
        pass
    try:
        set_state(saved_state, device)
        probe(device)
    except Exception as e:
        still = ""
        with contextlib.suppress(Exception):
            if stream is not None and is_capturing(stream):
                still = "; its capturing stream is still capturing"
        why = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise RuntimeError(
            f"the process's CUDA RNG on {device} is unusable after a failed CUDA graph capture "
            f"(a random draw fails even after restoring the generator state saved before the "
            f"capture{still}: {why}); dropout and other random ops on this device need a new "
            "process") from e
    return "restored"


class _Graph:
    """One captured segment: static inputs, the graph, and its static outputs."""

    __slots__ = ("h", "pad", "state", "graph", "out")

    def __init__(self, h, pad, state, graph, out):
        self.h, self.pad, self.state, self.graph, self.out = h, pad, state, graph, out


class SegmentGraphs:
    """The CUDA graphs of one gating's cascade segments, chosen by measurement (module docstring).

    A shape is captured the :attr:`capture_after`-th time it is met (a length met once, as in an
    evaluation over varied lengths, is not worth a capture); until then it runs eagerly.

    Args:
        max_tokens: segments of more than this many rows x tokens run eagerly (default 16,384:
            batch 32 at length 512, batch 256 at length 64).
        max_graphs: the graphs held at most; past it every graph is dropped and captured again as
            met (bounds memory when lengths vary widely).
        capture_after: meetings of a shape before it is captured (default 2).
        measure: time eager against the graph at capture and keep the faster (default); False
            keeps every graph (tests).

    Attributes:
        enabled: set False to run every segment eagerly (the benchmarks time both).
        counts: ``{"captured", "eager_chosen", "replays", "eager_runs", "failed"}`` since creation.
        executors: ``{(rows, length): executor}`` (one of
            :data:`EXECUTORS`), the executors chosen so far.
        timed_runs: clean timings of each executor before a shape's choice (default 2).
    """

    #: untimed meetings of a new shape per executor (graphs are captured at the second)
    untimed_runs = 2
    timed_runs = 2
    #: meetings after which a shape's choice is made with the timings there are (captures that
    #: never stop, e.g. row counts that keep changing, would otherwise keep it measuring)
    max_trial_runs = 18

    def __init__(self, max_tokens: int = 16384, max_graphs: int = 512, capture_after: int = 2,
                 measure: bool = True):
        self.max_tokens, self.max_graphs, self.capture_after = int(max_tokens), int(max_graphs), int(capture_after)
        self.measure = bool(measure)
        self.enabled = True
        self.counts = {"captured": 0, "eager_chosen": 0, "replays": 0, "eager_runs": 0, "failed": 0}
        self._prefix: Any = None
        self._graphs: dict[tuple, Any] = {}
        self._seen: dict[tuple, int] = {}
        self._pool = None
        self._stream = None
        self.executors: dict[tuple, str] = {}
        self._trials: dict[tuple, dict] = {}  # (rows, length) -> meetings and timings while choosing

    def usable(self, model: torch.nn.Module, h: torch.Tensor) -> bool:
        """Whether graphs may run this cascade: enabled, on CUDA, the model in eval mode, and no
        gradient being recorded."""
        return self.enabled and h.is_cuda and not model.training and not torch.is_grad_enabled()

    def clear(self) -> None:
        """Drop every graph held (their memory returns to the allocator, and with the last graph
        their memory pool goes: the next capture starts a new one) and every executor choice."""
        self._drop_graphs()
        self.executors.clear()
        self._trials.clear()

    def _drop_graphs(self) -> None:
        self._graphs.clear()
        self._seen.clear()
        self._pool = None

    def _capture_events(self) -> int:
        """Captures attempted so far (kept, measured slower, or failed)."""
        return self.counts["captured"] + self.counts["eager_chosen"] + self.counts["failed"]

    def _check_prefix(self, prefix) -> None:
        """A new prefix (other constants baked in) drops every graph and executor choice."""
        if prefix != self._prefix:
            self.clear()
            self._prefix = prefix

    @property
    def choosing(self) -> bool:
        """Whether some shape's executor is still being measured."""
        return bool(self._trials)

    def choose_executor(self, key: tuple, rows: int, length: int) -> tuple[str, bool]:
        """``(executor, timed)`` for a batch of ``rows`` x ``length`` (module docstring): one of
        :data:`EXECUTORS`; ``timed``: run it through :meth:`timed_run`
        (the choice is still being measured). Shapes over :attr:`max_tokens` (compute-bound: the
        whole batch only adds arithmetic) and batches of one row (nothing to gather) take
        ``"gather"``."""
        self._check_prefix(key[0])
        shape = (int(rows), int(length))
        if shape in self.executors:
            return self.executors[shape], False
        if rows <= 1 or _rows_bucket(rows) * length > self.max_tokens:
            self.executors[shape] = "gather"
            return "gather", False
        t = self._trials.setdefault(shape, {"met": 0, **{e: [] for e in EXECUTORS}})
        t["met"] += 1
        n = t["met"]
        if n <= len(EXECUTORS) * self.untimed_runs:  # each executor in turn, untimed: graphs get captured
            return EXECUTORS[(n - 1) // self.untimed_runs], False
        if n > self.max_trial_runs or min(len(t[e]) for e in EXECUTORS) >= self.timed_runs:
            best = {e: min(t[e]) if t[e] else float("inf") for e in EXECUTORS}
            choice = min(EXECUTORS, key=lambda e: best[e])  # ties: the earlier (gather first)
            self.executors[shape] = choice
            del self._trials[shape]
            return choice, False
        return EXECUTORS[n % len(EXECUTORS)], True

    def timed_run(self, key: tuple, rows: int, length: int, executor: str, fn: Callable[[], Any],
                  device: torch.device) -> Any:
        """Run ``fn`` (the cascade under ``executor``) timed on the device (synchronised before
        and after) and record the time for :meth:`choose_executor` unless a graph was captured
        during the run (a capture's one-off cost is not the executor's). Returns ``fn()``."""
        before = self._capture_events()
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
        t = self._trials.get((int(rows), int(length)))
        if t is not None and self._capture_events() == before and self._prefix == key[0]:
            t[executor].append(seconds)
        return out

    def run(self, key: tuple, k: int, segment: Segment, h: torch.Tensor, pad: torch.Tensor | None,
            state: Any) -> tuple:
        """Segment ``k`` on the ``b`` rows of ``h`` / ``pad`` / ``state``, as a graph replay or
        eagerly (whichever was measured faster for its shape): ``segment``'s outputs for the
        ``b`` rows (views of the graph's static outputs, valid until the next :meth:`run`).

        Args:
            key: ``(prefix, extra)``: ``prefix`` hashable, naming every constant the segment
                reads besides its tensor inputs (a new one drops every graph); ``extra`` more
                of the shape key (e.g. the exit depths).
        """
        b, T = int(h.shape[0]), int(h.shape[1])
        rows = _rows_bucket(b)
        prefix, extra = key
        if rows * T > self.max_tokens:
            g = _EAGER
        else:
            self._check_prefix(prefix)
            if len(self._graphs) >= self.max_graphs:
                self._drop_graphs()  # the measured executor choices stay
            gkey = (extra, k, rows, T, pad is None, None if state is None else len(state))
            g = self._graphs.get(gkey)
            if g is None:
                seen = self._seen[gkey] = self._seen.get(gkey, 0) + 1
                if seen >= self.capture_after:
                    g = self._graphs[gkey] = self._capture(k, segment, h, pad, state, rows)
        if g is None or g is _EAGER:
            self.counts["eager_runs"] += 1
            return segment(k, h, pad, state)
        with torch.inference_mode(False), torch.no_grad():  # static buffers are normal tensors
            g.h[:b].copy_(h)
            if pad is not None:
                g.pad[:b].copy_(pad)
            for buf, s in zip(g.state or (), state or ()):
                buf[:b].copy_(s)
        g.graph.replay()
        self.counts["replays"] += 1
        oh, olg, ostop, ostate = g.out
        return (oh[:b], olg[:b], None if ostop is None else ostop[:b],
                None if ostate is None else tuple(s[:b] for s in ostate))

    def _capture(self, k: int, segment: Segment, h, pad, state, rows: int):
        """Capture segment ``k`` at ``rows`` rows; :data:`_EAGER` where eager was measured at least
        as fast or the capture failed (then eager from now on for that shape)."""
        dev = h.device
        main = torch.cuda.current_stream(dev)
        if self._stream is None:
            self._stream = torch.cuda.Stream(dev)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        side = self._stream
        # autocast's cache of cast weights must stay out of a graph: a cached copy made outside
        # the capture would be freed (and its memory reused) when the caller's autocast exits
        amp = torch.is_autocast_enabled("cuda")
        no_cache = torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), enabled=amp, cache_enabled=False)
        with torch.inference_mode(False), torch.no_grad(), no_cache:
            hb = _padded(h, rows)
            pb = None if pad is None else _padded(pad, rows)
            sb = None if state is None else tuple(_padded(s, rows) for s in state)
            side.wait_stream(main)
            with torch.cuda.stream(side):  # warm-up on the capturing stream: lazy caches, handles
                segment(k, hb, pb, sb)
            main.wait_stream(side)
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            segment(k, hb, pb, sb)
            torch.cuda.synchronize(dev)
            eager = time.perf_counter() - t0
            graph = torch.cuda.CUDAGraph()
            rng = torch.cuda.get_rng_state(dev)  # restored if a failed capture leaves it unusable
            # torch.cuda.graph() without its gc.collect() per capture; one pool for all graphs
            # (every replay's outputs are read before the next replay)
            try:
                with torch.cuda.stream(side):
                    graph.capture_begin(pool=self._pool)
                    try:
                        out = segment(k, hb, pb, sb)
                    finally:
                        graph.capture_end()
            except RuntimeError as e:  # an op the capture refuses (a host sync, a pageable copy)
                self.enabled = False  # no more captures for this gating
                self.counts["failed"] += 1
                # the CUDA generator may still be registered for the capture: make it usable or raise
                recover_after_failed_capture(graph, dev, rng, stream=side)
                warnings.warn(f"cascade graphs off: a segment could not be captured ({str(e).splitlines()[0][:160]})",
                              RuntimeWarning, stacklevel=2)
                return _EAGER
            main.wait_stream(side)
            graph.replay()  # the first replay pays one-off set-up
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize(dev)
            replay = time.perf_counter() - t0
        if self.measure and replay >= eager:
            self.counts["eager_chosen"] += 1
            del graph, out
            if not any(isinstance(g, _Graph) for g in self._graphs.values()):
                # recent PyTorch frees a private pool once no graph holds it; its handle cannot be
                # captured into again (an INTERNAL ASSERT on use_count in CUDACachingAllocator)
                self._pool = None
            return _EAGER
        self.counts["captured"] += 1
        return _Graph(hb, pb, sb, graph, out)
