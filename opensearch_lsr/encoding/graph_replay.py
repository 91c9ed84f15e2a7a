"""The packed body as one CUDA graph per graph bucket: captured on a bucket's first batch, then replayed.

With ``compile="graphs"`` (:class:`~.packed.PackedMLM`) every batch is padded to a bucket's shape
(:mod:`.graph_buckets`). A bucket's first batch warms the (compiled) body up on a side stream and captures it
there (the recipe of PyTorch's CUDA-graphs notes, :func:`capture_cuda_graph`); later batches of that bucket copy
their ids and index tensors into the captured inputs (one copy: both are views of one buffer, :mod:`.staging`) and
replay the graph: one launch for the whole body, and no Dynamo guard evaluated per batch.

Why by hand rather than ``torch.compile(mode="reduce-overhead")``: its CUDA-graph trees keep their state per
Python thread, and until pytorch/pytorch#184357 (merged June 2026; the card runs so far had torch 2.11) they
assert in any thread that autograd did not start (pytorch/pytorch#123177), which is where ``lsr-os index``
drives the device (:mod:`.encode_pipeline`'s device thread). ``torch.cuda.CUDAGraph`` works in any thread of any
torch this toolkit supports.

A capture is dear beyond its own time: it synchronises the device, so the batches in flight drain (and
``torch.cuda.graph`` also empties the device and pinned-host caches before it records, so the next batches
allocate afresh: :func:`capture_cuda_graph` records without that). Which shapes a run meets depends on when its
tokenized chunks arrive: on an H200 a timed pass over the corpus the encoder had just warmed up on still captured
3 new shapes, and the ``lsr-os index`` job 13 (1.2 of its 3.0 s, ``benchmarks/results/gpu_encode.md``, run 17).
So after a warm-up a shape is captured on its ``capture_after``-th batch; until then the body runs without a graph
(compiled, one launch per kernel), counted as ``uncaptured``. Warm-ups capture every shape at once
(:meth:`GraphReplay.capturing_every_shape`).

Every bucket captures into one shared memory pool. That is safe because each replay's output is consumed (the
vocabulary head is queued on the same stream) before the next replay is queued, so no graph's output is still
needed when another graph reuses its memory ("Sharing memory across captures" in the notes); the captured
outputs themselves stay allocated, one ``[tokens, hidden]`` tensor in the head's dtype per bucket (96 MiB for
BERT-base at 64k tokens in fp16). A long job whose source often runs dry meets many part-filled batches, so at
most ``max_graphs`` shapes are captured (the first to qualify; the warm-up's come first), and batches of any other
shape run the body without a graph (``uncaptured``): the Korean passages need 9 at a 64k budget (``graph_buckets``
in ``gpu_encode.py``'s results).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import torch

from .staging import is_view_of, rebase

logger = logging.getLogger(__name__)

__all__ = ["GraphReplay", "GraphStats", "capture_cuda_graph"]

#: what the body reads from a batch's :class:`~.packed.Segments` (copied into the captured inputs per replay)
SEGMENT_TENSORS = ("lengths", "cu_seqlens", "positions", "pad_slots")

#: ``capture(fn) -> (replay, output)``: records ``fn()`` once; ``replay()`` reruns it into ``output``
Capture = Callable[[Callable[[], torch.Tensor]], tuple[Callable[[], None], torch.Tensor]]


@dataclass
class GraphStats:
    """Buckets captured, replays, seconds spent warming up and capturing, and why graphs stopped (if they did)."""

    captured: int = 0
    replays: int = 0
    #: batches run without a graph: their shape had not been seen ``capture_after`` times yet, or ``max_graphs`` were
    #: captured already
    uncaptured: int = 0
    capture_s: float = 0.0
    failed: str | None = None


def capture_cuda_graph(fn: Callable[[], torch.Tensor], pool: Any, side: torch.cuda.Stream,
                       warmup: int = 2) -> tuple[Callable[[], None], torch.Tensor]:
    """Warm ``fn`` up on the ``side`` stream (first calls compile, allocate workspaces, pick kernels), then capture
    it on that stream into a ``torch.cuda.CUDAGraph`` drawing from ``pool``; returns the graph's ``replay`` and its
    output.

    The recording is ``torch.cuda.graph``'s (torch 2.11-2.13 ``torch/cuda/graphs.py``: synchronise, then
    ``capture_begin`` / ``capture_end`` on a side stream) without what its ``__enter__`` does first: empty the
    device's and the pinned host memory's caches. Those free every cached block, so the batches after a capture
    allocate afresh, and ``cudaFree`` / ``cudaFreeHost`` synchronise the device (run 17's profile: 1.6 ``cudaFree``
    and 2.6 ``cudaFreeHost`` per batch after three captures). The host cache is emptied for graphs that read
    pinned host memory (pytorch/pytorch#167507, #171270); the body reads device tensors only."""
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        # thread_local: only this thread's CUDA calls are checked while it captures (the job's other threads go on)
        graph.capture_begin(pool, capture_error_mode="thread_local")
        try:
            out = fn()
        except BaseException:
            with suppress(Exception):  # end the failed capture, so the stream captures no more
                graph.capture_end()
            raise
        graph.capture_end()
    return graph.replay, out


class GraphReplay:
    """``body(ids, seg)`` through one captured graph per ``(tokens, documents)`` shape.

    Args:
        body: the packed body, ``(ids, seg) -> [tokens, hidden]``; it must not synchronise with the host.
        capture: how a bucket is recorded (default: :func:`capture_cuda_graph` into one pool, warming up on one
            side stream, so the allocator caches one stream's warm-up blocks; tests pass a stand-in).
        capture_after: the batch of a shape on which it is captured (earlier ones run the body without a graph).
        max_graphs: the most shapes captured (each keeps its output allocated); later shapes run without a graph.

    If a capture fails, :meth:`__call__` warns once and runs ``body`` directly from then on.
    """

    def __init__(self, body: Callable[[torch.Tensor, Any], torch.Tensor], capture: Capture | None = None, *,
                 capture_after: int = 2, max_graphs: int = 32) -> None:
        if capture_after < 1 or max_graphs < 1:
            raise ValueError("capture_after and max_graphs must be >= 1")
        self.body = body
        self.capture_after = capture_after
        self.max_graphs = max_graphs
        self._sightings: Counter = Counter()
        if capture is None:
            capture = functools.partial(capture_cuda_graph, pool=torch.cuda.graph_pool_handle(), side=torch.cuda.Stream())
        self.capture: Capture = capture
        self.stats = GraphStats()
        self._graphs: dict[tuple[int, int, int], tuple[torch.Tensor, Any, Callable[[], None], torch.Tensor]] = {}

    @contextmanager
    def capturing_every_shape(self) -> Iterator[None]:
        """Within it, each new shape is captured on its first batch (a warm-up, before any clock)."""
        saved, self.capture_after = self.capture_after, 1
        try:
            yield
        finally:
            self.capture_after = saved

    def reset_stats(self) -> None:
        """Count afresh (after a warm-up); a failed capture's error stays."""
        self.stats = GraphStats(failed=self.stats.failed)

    def __call__(self, ids: torch.Tensor, seg: Any) -> torch.Tensor:
        """The body's output for this batch: the bucket's captured output tensor, valid until the next call."""
        if self.stats.failed is not None:
            return self.body(ids, seg)
        key = (int(ids.shape[0]), int(seg.lengths.shape[0]), int(seg.max_len))
        entry = self._graphs.get(key)
        if entry is None:
            self._sightings[key] += 1
            if self._sightings[key] < self.capture_after or len(self._graphs) >= self.max_graphs:
                self.stats.uncaptured += 1
                return self.body(ids, seg)
            try:
                entry = self._graphs[key] = self._record(ids, seg)
            except torch.OutOfMemoryError:
                raise
            except Exception as err:  # noqa: BLE001 - the body without graphs computes the same
                self.stats.failed = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
                logger.warning("CUDA graph capture of the packed body failed (%s); running it without graphs",
                               self.stats.failed)
                return self.body(ids, seg)
            replay, out = entry[2:]  # a capture records kernels without running them: replay it for this batch
        else:
            static_ids, static_seg, replay, out = entry
            _refresh_inputs(static_ids, static_seg, ids, seg)
        replay()
        self.stats.replays += 1
        return out

    def _record(self, ids: torch.Tensor, seg: Any) -> tuple[torch.Tensor, Any, Callable[[], None], torch.Tensor]:
        t0 = time.perf_counter()
        staged = _staged_with(ids, seg)
        if staged is not None:  # the captured inputs: views of one buffer too, refreshed with one copy
            buffer = staged.clone()
            static_ids, *views = rebase([ids, *(getattr(seg, name) for name in SEGMENT_TENSORS)], staged, buffer)
            static_seg = dataclasses.replace(seg, staged=buffer, **dict(zip(SEGMENT_TENSORS, views)))
        else:
            static_ids = ids.clone()
            clones = {name: getattr(seg, name).clone() for name in SEGMENT_TENSORS}
            static_seg = dataclasses.replace(seg, **clones, **({"staged": None} if hasattr(seg, "staged") else {}))
        replay, out = self.capture(lambda: self.body(static_ids, static_seg))
        self.stats.captured += 1
        self.stats.capture_s += time.perf_counter() - t0
        return static_ids, static_seg, replay, out


def _staged_with(ids: torch.Tensor, seg: Any) -> torch.Tensor | None:
    """The buffer that ``ids`` and every index tensor of ``seg`` are views of (:meth:`.packed.Segments.packed_batch`),
    else ``None``."""
    staged = getattr(seg, "staged", None)
    if staged is None or not all(is_view_of(t, staged) for t in (ids, *(getattr(seg, n) for n in SEGMENT_TENSORS))):
        return None
    return staged


def _refresh_inputs(static_ids: torch.Tensor, static_seg: Any, ids: torch.Tensor, seg: Any) -> None:
    """Copy a batch's ids and index tensors into a graph's captured inputs: one copy when both sides are views of
    one buffer of the same layout (the same shape key, staged the same way), else one per tensor."""
    staged, static = _staged_with(ids, seg), getattr(static_seg, "staged", None)  # set by _record when one buffer
    if staged is not None and static is not None and staged.shape == static.shape \
            and _offsets(ids, seg, staged) == _offsets(static_ids, static_seg, static):
        static.copy_(staged)
        return
    static_ids.copy_(ids)
    for name in SEGMENT_TENSORS:
        getattr(static_seg, name).copy_(getattr(seg, name))


def _offsets(ids: torch.Tensor, seg: Any, staged: torch.Tensor) -> list[tuple[int, int]]:
    """Where in ``staged`` each input lies: ``(byte offset, bytes)``."""
    return [(t.storage_offset() * t.element_size() - staged.storage_offset(), t.numel() * t.element_size())
            for t in (ids, *(getattr(seg, n) for n in SEGMENT_TENSORS))]
