"""Run packed, token-budgeted batches through a :class:`~.packed.PackedMLM`, several in flight.

For each batch the host copies the ids and index tensors (one pinned buffer, one non-blocking copy), launches the forward, the activation and
the special-id zeroing on the compute stream, and hands the weights to a second stream that sparsifies
them (:func:`~.device_sparse.sparsify` with ``torch.nonzero_static``: no host synchronisation) and copies
ids / weights / counts back. Up to ``depth`` batches are in flight; the host waits on a batch's event only
when it takes the result, by which time the device is already working on the next ones. So the launch
side never blocks the device, and the one wait per batch overlaps with the device's work.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from .device_sparse import PendingSparse, sparsify
from .gc_freeze import frozen_heap
from .graph_buckets import catch_all_buckets
from .packed import PackedMLM, Segments
from .sparse_vector import SparseVector, SparseVectors, in_order
from .token_batches import token_budget_batches
from .token_ids import TokenizedTexts, concat_tokenized

logger = logging.getLogger(__name__)

__all__ = ["RunnerStats", "PackedRunner", "FLUSH", "ready_batches", "capturing_every_shape",
           "capture_catch_all_buckets", "device_thread_report"]

#: A tag for :meth:`PackedRunner.stream`: complete every batch in flight before taking the next one.
FLUSH = object()


@dataclass
class RunnerStats:
    """What the runner did: batches, real tokens, documents, host wall time per stage (seconds)."""

    batches: int = 0
    tokens: int = 0
    documents: int = 0
    nonfinite_dropped: int = 0
    #: ``launch``: queuing batches on the device; ``wait``: for their results; ``split``: into vectors;
    #: ``source``: for the next batch (tokenizing, the window's cut, or a caller with nothing queued), of which
    #: ``source_caller`` for a chunk to be queued and ``source_tokenizer`` for a queued chunk's ids (a job's pipeline)
    by_stage: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("launch", "wait", "split", "source", "source_caller", "source_tokenizer"), 0.0))
    #: waits for the next batch longer than 1 ms (the device runs dry if they outlast what is in flight)
    source_waits_over_1ms: int = 0
    #: batches encoded again by the fallback model because their weights came out NaN / inf (fp16's overflow)
    overflow_reruns: int = 0


def ready_batches(take_window: Callable[[], list[tuple[np.ndarray, TokenizedTexts]] | None],
                  max_batch_tokens: int) -> Iterator[tuple[Any, TokenizedTexts | None]]:
    """``(keys, batch)`` pairs of packed batches cut from documents as their tokenization finishes.

    ``take_window()`` gives the next window: the chunks ``(keys, tokens)`` tokenized so far (waiting for one
    at most, so the device never waits for a window's last chunk while its first ones are ready), ``[]``
    when nothing is queued now (whatever is held back is launched, then ``(FLUSH, None)``), or ``None`` at the
    end. A window's documents are sorted by length into batches of the budget (the CPU's padded attention
    view wastes least on similar lengths: 6.2 s against 7.7 s in input order for 1,500 Korean passages on
    2 cores); its last batch, if below the budget, is held back and sorted in with the next window, so
    batches stay full while more is coming, but never twice (nothing waits longer than two windows).
    ``keys`` (one row per document) say which documents a batch holds.
    """
    held: tuple[np.ndarray, TokenizedTexts] | None = None
    while True:
        window = take_window()
        if not window:
            if held is not None:
                yield held
                held = None
            if window is None:
                return
            yield FLUSH, None
            continue
        parts = ([held] if held is not None else []) + window
        keys = np.concatenate([k for k, _ in parts])
        tokens = concat_tokenized([t for _, t in parts])
        was_held = np.zeros(len(keys), bool)
        was_held[:0 if held is None else len(held[0])] = True
        batches = token_budget_batches(tokens.lengths, max_batch_tokens)
        held = None
        if batches and int(tokens.lengths[batches[-1]].sum()) < max_batch_tokens \
                and not was_held[batches[-1]].any():
            last = batches.pop()
            held = keys[last], tokens.select(last)
        for b in batches:
            yield keys[b], tokens.select(b)


class PackedRunner:
    """Packed batches of at most ``max_batch_tokens`` real tokens, ``depth`` of them in flight.

    Args:
        model: the packed masked LM.
        activation: ``"relu"`` (``log1p(relu(max))``) or ``"log1p_relu"`` (``log1p`` once more).
        special_ids: ids zeroed in every vector (the export does the same).
        max_batch_tokens: real tokens per forward pass.
        depth: batches launched before the oldest one's result is taken (>= 1).
        fallback: builds the model for batches whose weights came out non-finite (see :meth:`_take`); it encodes
            every batch once most overflow (:attr:`OVERFLOWS_BEFORE_SWITCH`).
    """

    #: after this many re-encoded batches, if they are more than half of all batches, the fallback model encodes
    #: every batch (a model whose activations overflow fp16 everywhere would otherwise be paid twice per batch)
    OVERFLOWS_BEFORE_SWITCH = 8

    #: keep the objects alive when an encode starts from the cycle collector until it ends (its full passes stall
    #: the launching thread; :meth:`heap_frozen`, :mod:`.gc_freeze`)
    freeze_heap: bool = True

    def __init__(self, model: PackedMLM, *, activation: str, special_ids: Sequence[int], max_batch_tokens: int,
                 depth: int = 2, fallback: Callable[[], PackedMLM] | None = None) -> None:
        if max_batch_tokens < 1 or depth < 1:
            raise ValueError("max_batch_tokens and depth must be >= 1")
        self.model = model
        #: builds (once, on first need) the model that encodes a batch again when its weights came out NaN / inf:
        #: with fp16 compute, where activations past 65,504 overflow, a bf16 model (fp32's range; fp32 without bf16,
        #: :func:`.precision.overflow_dtype`)
        self.fallback = fallback
        self._fallback_model: PackedMLM | None = None
        self.device = model.device
        self.activation = activation
        self.special = torch.tensor(sorted(set(special_ids)), dtype=torch.long, device=self.device)
        self.max_batch_tokens = int(max_batch_tokens)
        self.depth = int(depth)
        self.on_cuda = self.device.type == "cuda"
        self.sparse_stream = torch.cuda.Stream(self.device) if self.on_cuda else None
        self.static_per_doc = 512  # grows when a batch lists more entries than this per document
        self.stats = RunnerStats()

    def reset_stats(self) -> None:
        """Start the counters afresh (after a warm-up): the runner's, and the CUDA graphs' of ``compile="graphs"``
        (which keep a failed capture's error)."""
        self.stats = RunnerStats()
        graphs = getattr(self.model, "graph_replay", None)
        if graphs is not None:
            graphs.reset_stats()

    def activate(self, pooled: torch.Tensor) -> torch.Tensor:
        """SPLADE weights of max-pooled logits, in place (the encoder's ``activate`` with a device index)."""
        act = pooled.relu_().log1p_()
        if self.activation == "log1p_relu":
            act = act.log1p_()
        if len(self.special):
            act.index_fill_(1, self.special, 0.0)
        return act

    @torch.inference_mode()
    def launch(self, batch: TokenizedTexts, model: PackedMLM | None = None) -> PendingSparse:
        """Queue one packed batch on the device (through ``model``, default :attr:`model`); returns its pending
        sparse result."""
        model = model or self.model
        shape = model.graph_bucket(batch.lengths)  # compile="graphs": a bucket's shape
        ids, seg = Segments.packed_batch(batch.ids, batch.lengths, self.device, pin=self.on_cuda, pad_to=shape,
                                         max_doc=model.max_doc_tokens)  # one copy to the device
        weights = self.activate(model.pooled_max(ids, seg))
        if not self.on_cuda:
            return sparsify(weights)
        done = torch.cuda.Event()
        done.record()
        self.sparse_stream.wait_event(done)
        with torch.cuda.stream(self.sparse_stream):
            weights.record_stream(self.sparse_stream)
            return sparsify(weights, static_size=self.static_per_doc * len(batch.lengths))

    def _take(self, pending: PendingSparse, batch: TokenizedTexts) -> SparseVectors:
        """A launched batch's vectors. If some weights came out NaN / inf and a :attr:`fallback` is set, the batch
        is encoded again by the fallback model and its vectors are taken instead (what stays non-finite then is
        dropped and counted, as always)."""
        n_docs = len(batch.lengths)
        t0 = time.perf_counter()
        pending.wait()
        t1 = time.perf_counter()
        vectors, nonfinite = pending.result()
        self.stats.by_stage["wait"] += t1 - t0
        self.stats.by_stage["split"] += time.perf_counter() - t1
        if nonfinite and self.fallback is not None:
            vectors, nonfinite = self._rerun(batch, nonfinite)
        self.stats.nonfinite_dropped += nonfinite
        listed = len(vectors.ids)
        if listed > self.static_per_doc * n_docs // 2:  # keep the static list about twice what is used
            self.static_per_doc = int(2 * listed / max(1, n_docs)) + 1
        return vectors

    def _rerun(self, batch: TokenizedTexts, nonfinite: int) -> tuple[SparseVectors, int]:
        """``batch`` through the fallback model, at once (its vectors and non-finite count); the fallback is
        dropped for good when it gives non-finite weights too (the model itself outputs them: no precision helps,
        and every batch would be paid twice)."""
        if self._fallback_model is None:
            logger.warning("%d weights of a batch came out NaN / inf (an fp16 overflow?): such batches are encoded "
                           "again with the fallback model (counted in overflow_reruns)", nonfinite)
            self._fallback_model = self.fallback()
        self.stats.overflow_reruns += 1
        vectors, still = self.launch(batch, self._fallback_model).result()
        if still:
            logger.warning("the fallback model gave %d NaN / inf weights too: the model outputs them itself; no more "
                           "batches are encoded again, their non-finite weights are dropped and counted", still)
            self.fallback = None
        elif self.model is not self._fallback_model and self.stats.overflow_reruns >= self.OVERFLOWS_BEFORE_SWITCH \
                and 2 * self.stats.overflow_reruns > self.stats.batches:
            logger.warning("%d of %d batches overflowed and were encoded twice: the fallback model encodes every batch "
                           "from now on (head %s)", self.stats.overflow_reruns, self.stats.batches,
                           str(self._fallback_model.head_dtype).removeprefix("torch."))
            self.model = self._fallback_model  # batches still in flight on the old model are encoded again as before
        return vectors, still

    def heap_frozen(self) -> AbstractContextManager[None]:
        """Around a loop over :meth:`stream`: the objects alive when it starts are kept from the cycle collector
        until it ends (:func:`.gc_freeze.frozen_heap`; nothing when :attr:`freeze_heap` is off). Held by a plain
        function frame, not inside the generator, so an abandoned stream cannot leave the heap frozen."""
        return frozen_heap() if self.freeze_heap else nullcontext()

    def stream(self, batches: Iterator[tuple[object, TokenizedTexts]]) -> Iterator[tuple[object, SparseVectors]]:
        """Run ``(tag, batch)`` pairs in order with ``depth`` in flight; yields ``(tag, vectors)`` in order.
        A ``(FLUSH, None)`` pair completes everything in flight first (the source is about to wait). Callers
        that own the loop hold :meth:`heap_frozen` around it."""
        inflight: deque = deque()
        for tag, batch in self._timed_source(batches):
            if tag is FLUSH:
                while inflight:
                    tag0, batch0, pending = inflight.popleft()
                    yield tag0, self._take(pending, batch0)
                continue
            t0 = time.perf_counter()
            inflight.append((tag, batch, self.launch(batch)))
            self.stats.by_stage["launch"] += time.perf_counter() - t0
            self.stats.batches += 1
            self.stats.tokens += int(batch.lengths.sum())
            self.stats.documents += len(batch.lengths)
            if len(inflight) > self.depth:
                tag0, batch0, pending = inflight.popleft()
                yield tag0, self._take(pending, batch0)
        while inflight:
            tag0, batch0, pending = inflight.popleft()
            yield tag0, self._take(pending, batch0)

    def _timed_source(self, batches: Iterator[tuple[object, TokenizedTexts | None]]) -> Iterator[tuple[object, Any]]:
        """``batches``, with the time spent waiting for each one in ``stats``."""
        it = iter(batches)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            waited = time.perf_counter() - t0
            self.stats.by_stage["source"] += waited
            self.stats.source_waits_over_1ms += waited > 1e-3
            yield item

    def run_texts(self, texts: Sequence[str], tokenize_async: Callable[[Sequence[str]], Future],
                  window_docs: int = 4096) -> tuple[list[SparseVector], int]:
        """Vectors of ``texts``, input order, and the number of real tokens. ``tokenize_async`` (a future of
        :class:`~.token_ids.TokenizedTexts`: a tokenizer process or thread) gets chunks of ``window_docs / 8``
        texts (at least 256), up to two windows ahead of the device, so it never idles while the device
        works; batches are cut from whatever is tokenized (:func:`ready_batches`)."""
        n = len(texts)
        if not n:
            return [], 0
        pieces: list[tuple[np.ndarray, SparseVectors]] = []
        chunk = max(256, int(window_docs) // 8)
        bounds = [(s, min(n, s + chunk)) for s in range(0, n, chunk)]
        pending: deque = deque()
        submitted = tokens_seen = 0

        def top_up() -> None:
            nonlocal submitted
            while submitted < len(bounds) and sum(e - s for s, e, _ in pending) < 2 * window_docs:
                s, e = bounds[submitted]
                pending.append((s, e, tokenize_async(texts[s:e])))
                submitted += 1

        def take_window():
            nonlocal tokens_seen
            top_up()
            if not pending:
                return None
            window, docs = [], 0
            while pending and docs < window_docs and (not window or pending[0][2].done()):
                s, e, future = pending.popleft()
                tokens = future.result()
                tokens_seen += int(tokens.lengths.sum())
                window.append((np.arange(s, e), tokens))
                docs += e - s
            top_up()
            return window

        with self.heap_frozen():
            pieces.extend(self.stream(ready_batches(take_window, self.max_batch_tokens)))
        return list(in_order(pieces)), tokens_seen

    def run(self, tokens: TokenizedTexts) -> list[SparseVector]:
        """Vectors of every text in ``tokens``, input order (batches sorted by length inside)."""
        batches = token_budget_batches(tokens.lengths, self.max_batch_tokens)
        with self.heap_frozen():
            pieces = list(self.stream((b, tokens.select(b)) for b in batches))
        return list(in_order(pieces))


@contextmanager
def capturing_every_shape(runner: PackedRunner | None) -> Iterator[None]:
    """For a warm-up: with ``compile="graphs"`` on CUDA, every new batch shape is captured on its first batch
    (:meth:`.graph_replay.GraphReplay.capturing_every_shape`), then the buckets every batch of the budget fits
    (:func:`.graph_buckets.catch_all_buckets`, for batches whose own bucket has no graph to be padded up to); nothing
    otherwise."""
    model = getattr(runner, "model", None)
    graphs = getattr(model, "graph_replay", None)
    if graphs is None:
        yield
        return
    with graphs.capturing_every_shape():
        yield
    capture_catch_all_buckets(graphs, runner.max_batch_tokens, model.max_doc_tokens, runner.device, runner.on_cuda)


def capture_catch_all_buckets(graphs: Any, max_tokens: int, max_doc: int, device: torch.device,
                              pin: bool = False) -> None:
    """Capture :func:`.graph_buckets.catch_all_buckets` into ``graphs`` (a :class:`.graph_replay.GraphReplay`), each
    from one document of one token padded up to it."""
    one = np.ones(1, dtype=np.int64)
    graphs.capture_buckets(catch_all_buckets(max_tokens, max_doc), lambda key: Segments.packed_batch(
        one, one, device, pin=pin, pad_to=key, max_doc=max_doc))


def device_thread_report(encoder: Any) -> dict[str, Any]:
    """The packed model's head dtype, and where packed batching's device thread spent its time since the warm-up
    (launching, waiting for the next batch or for results, splitting them); with ``--compile graphs`` on CUDA,
    the CUDA graphs it captured and replayed since the warm-up (:class:`.graph_replay.GraphStats`). Empty for
    an encoder without packed batching."""
    runner = getattr(encoder, "runner", None)
    stats = getattr(runner, "stats", None)
    if stats is None:
        return {}
    out = {"head_precision": str(runner.model.head_dtype).removeprefix("torch."),
           "device_thread_s": {k: round(v, 3) for k, v in stats.by_stage.items()}, "batches": stats.batches,
           "source_waits_over_1ms": stats.source_waits_over_1ms, "overflow_reruns": stats.overflow_reruns}
    graphs = getattr(runner.model, "graph_replay", None)
    if graphs is not None:
        out["cuda_graphs"] = asdict(graphs.stats)
    return out
