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

A batch whose own bucket has no graph is padded up to the smallest captured bucket it fits with at most
``borrow_ratio`` times its own bucket's tokens (:meth:`GraphReplay.bucket_for`, counted as ``borrowed``), rather than
run without a graph. Those batches are the part-filled ones a job launches whenever its source runs dry (its
batches are then small and the host, not the device, sets the pace): on an H200 22 of the job's 52 batches ran
without a graph, and they took the device thread about 0.9 of its 1.22 s of launching (about 40 ms a batch, where
the encoder alone launched a replayed one in 7.1 ms; ``benchmarks/results/gpu_encode.md``, run 18). The padding's
device time is the price: at most ``borrow_ratio - 1`` times the batch's own. So that a bucket to pad up to is there,
a warm-up also records the few that every batch of the budget fits (:func:`.graph_buckets.catch_all_buckets`,
:meth:`GraphReplay.capture_buckets`).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .graph_buckets import graph_key, larger_bucket
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
    #: batches whose own bucket had no graph, padded up to a larger captured bucket (:meth:`GraphReplay.bucket_for`)
    borrowed: int = 0
    #: the tokens those batches were padded with beyond their own buckets
    borrowed_tokens: int = 0


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
        borrow_ratio: a batch whose bucket has no graph is padded up to a captured bucket of at most this many times
            its own bucket's tokens (:meth:`bucket_for`); ``1`` never pads beyond the batch's own bucket.

    If a capture fails, :meth:`__call__` warns once and runs ``body`` directly from then on.
    """

    def __init__(self, body: Callable[[torch.Tensor, Any], torch.Tensor], capture: Capture | None = None, *,
                 capture_after: int = 2, max_graphs: int = 32, borrow_ratio: float = 4.0) -> None:
        if capture_after < 1 or max_graphs < 1 or borrow_ratio < 1:
            raise ValueError("capture_after and max_graphs must be >= 1, borrow_ratio >= 1")
        self.body = body
        self.capture_after = capture_after
        self.max_graphs = max_graphs
        self.borrow_ratio = borrow_ratio
        self._warming = False  # inside capturing_every_shape: each batch is padded to its own bucket only
        self._sightings: Counter = Counter()
        if capture is None:
            capture = functools.partial(capture_cuda_graph, pool=torch.cuda.graph_pool_handle(), side=torch.cuda.Stream())
        self.capture: Capture = capture
        self.stats = GraphStats()
        self._graphs: dict[tuple[int, int, int], tuple[torch.Tensor, Any, Callable[[], None], torch.Tensor]] = {}

    @contextmanager
    def capturing_every_shape(self) -> Iterator[None]:
        """Within it, each new shape is captured on its first batch (a warm-up, before any clock)."""
        saved, self.capture_after, self._warming = self.capture_after, 1, True
        try:
            yield
        finally:
            self.capture_after, self._warming = saved, False

    def capture_buckets(self, keys: Iterable[tuple[int, int, int]],
                        batch: Callable[[tuple[int, int, int]], tuple[torch.Tensor, Any]]) -> None:
        """Capture each bucket of ``keys`` not captured yet (while fewer than ``max_graphs`` are) from ``batch(key)``,
        inputs padded up to it: in a warm-up, buckets for later batches to be padded up to (:meth:`bucket_for`)."""
        for key in keys:
            if key not in self._graphs and len(self._graphs) < self.max_graphs and self.stats.failed is None:
                ids, seg = batch(key)
                if _key(ids, seg) != tuple(key):
                    raise ValueError(f"batch({key}) gave inputs of another bucket")
                self._capture(tuple(key), ids, seg)  # recorded, not replayed: no batch needs its output

    def bucket_for(self, lengths: np.ndarray, max_doc: int) -> tuple[int, int, int]:
        """The bucket key a batch of documents of ``lengths`` is padded to: its own (:func:`.graph_buckets.graph_key`)
        when that has a graph, or no captured bucket fits it within ``borrow_ratio`` of its tokens
        (:func:`.graph_buckets.larger_bucket`); else the smallest captured one that does (counted as ``borrowed``).
        Outside a warm-up (which captures every shape it meets)."""
        own = graph_key(lengths, max_doc)
        if own in self._graphs or self.stats.failed is not None or self._warming or self.borrow_ratio <= 1:
            return own
        larger = larger_bucket(lengths, self._graphs, self.borrow_ratio * own[0])
        if larger is None:
            return own
        self.stats.borrowed += 1
        self.stats.borrowed_tokens += larger[0] - own[0]
        return larger

    def reset_stats(self) -> None:
        """Count afresh (after a warm-up); a failed capture's error stays."""
        self.stats = GraphStats(failed=self.stats.failed)

    def __call__(self, ids: torch.Tensor, seg: Any) -> torch.Tensor:
        """The body's output for this batch: the bucket's captured output tensor, valid until the next call."""
        if self.stats.failed is not None:
            return self.body(ids, seg)
        key = _key(ids, seg)
        entry = self._graphs.get(key)
        if entry is None:
            self._sightings[key] += 1
            if self._sightings[key] < self.capture_after or len(self._graphs) >= self.max_graphs:
                self.stats.uncaptured += 1
                return self.body(ids, seg)
            entry = self._capture(key, ids, seg)
            if entry is None:
                return self.body(ids, seg)
            replay, out = entry[2:]  # a capture records kernels without running them: replay it for this batch
        else:
            static_ids, static_seg, replay, out = entry
            _refresh_inputs(static_ids, static_seg, ids, seg)
        replay()
        self.stats.replays += 1
        return out

    def _capture(self, key: tuple[int, int, int], ids: torch.Tensor, seg: Any) -> tuple | None:
        """Record ``key``'s graph from this batch; ``None`` (graphs off from now on, with a warning) if that fails."""
        try:
            entry = self._graphs[key] = self._record(ids, seg)
        except torch.OutOfMemoryError:
            raise
        except Exception as err:  # noqa: BLE001 - the body without graphs computes the same
            self.stats.failed = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
            logger.warning("CUDA graph capture of the packed body failed (%s); running it without graphs",
                           self.stats.failed)
            return None
        return entry

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


def _key(ids: torch.Tensor, seg: Any) -> tuple[int, int, int]:
    """The bucket key of a padded batch: ``(tokens, documents, longest)``, as :func:`.graph_buckets.graph_key` gives it."""
    return int(ids.shape[0]), int(seg.lengths.shape[0]), int(seg.max_len)


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
