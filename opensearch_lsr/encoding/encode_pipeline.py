"""The index job's encoder as a pipeline: chunks go in, futures of their vectors come out, the device never waits.

``submit(chunk)`` queues a chunk (texts, or texts already tokenized once by the caller) and returns a
``concurrent.futures.Future``. One device thread takes the first queued chunk and every queued chunk already
tokenized after it, up to ``window_docs`` documents, cuts them into packed batches of the token budget
(:func:`~.packed_runner.ready_batches`: sorted by length inside the window, whatever the chunking; a
part-filled last batch waits for the next window), and streams those batches through the :class:`~.packed_runner.PackedRunner` with
several in flight; when the last document of a chunk comes back, its future is resolved. So reading, tokenizing,
building documents and writing (the caller's threads) overlap with the device, and the caller keeps
consuming futures in submission order, which keeps the job's checkpoints sequential.

When no chunk is waiting, what is held back is launched and the batches in flight are drained (so a caller blocked on a future is always
served); an error in the device thread fails every pending future and every later ``submit``.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np

from .gc_freeze import thawed
from .sparse_vector import SparseVector, SparseVectors, in_order
from .packed_runner import ready_batches
from .token_ids import TokenizedTexts

__all__ = ["PipelinedEncoder"]

_STOP = object()


class _Chunk:
    """One submitted chunk: its ids (or their future, from the tokenizer thread), its vectors as they
    arrive (``(positions in the chunk, vectors)`` pieces, one per batch that held some of its documents), and the
    future the caller holds (``future.tokens`` is set once the chunk is tokenized)."""

    def __init__(self, tokens: TokenizedTexts | Future, serial: int) -> None:
        self._tokens = tokens
        self.serial = serial
        self.pieces: list[tuple[np.ndarray, SparseVectors]] = []
        self.missing = 0
        self.future: Future = Future()

    @property
    def tokens(self) -> TokenizedTexts:
        if isinstance(self._tokens, Future):
            self._tokens = self._tokens.result()
        return self._tokens

    def ready(self) -> bool:
        """Whether the ids are there (``start`` would not wait)."""
        return not isinstance(self._tokens, Future) or self._tokens.done()

    def start(self) -> None:
        """Wait for the ids; count the vectors to come."""
        self.future.tokens = self.tokens  # type: ignore[attr-defined]
        self.missing = len(self.tokens.lengths)


class PipelinedEncoder:
    """A :class:`~.encoder.SparseDocumentEncoder` with packed batching, behind ``submit`` / ``close``.

    Args:
        encoder: the encoder (its ``runner`` does the device work; everything else is delegated to it).
        window_docs: the most documents cut into batches together (independent of the caller's chunk size).
    """

    def __init__(self, encoder: Any, *, window_docs: int = 4096) -> None:
        if getattr(encoder, "runner", None) is None:
            raise ValueError("PipelinedEncoder needs an encoder with packed batching")
        if window_docs < 1:
            raise ValueError("window_docs must be >= 1")
        self.encoder = encoder
        self.window_docs = int(window_docs)
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._closed = False
        self._open: dict[int, _Chunk] = {}  # taken by the device thread, not yet resolved, by serial
        self._ahead: deque = deque()  # taken from the queue by the device thread, not started yet
        self._flushed = False  # the device thread said "nothing queued" and now waits for the queue
        self._frozen = False  # the device thread holds the frozen heap (.gc_freeze), let go while it waits
        self._serials = itertools.count()
        self._thread = threading.Thread(target=self._run, name="lsr-os-device", daemon=True)
        self._thread.start()

    def __getattr__(self, name: str) -> Any:  # keys, tokenizer, max_length, device, precision, stats ...
        return getattr(self.__dict__["encoder"], name)

    def max_inflight(self, chunk_docs: int) -> int:
        """Chunks a caller should keep submitted: two windows' worth, so the next window is queued
        while the device works through the current one."""
        return 2 * max(1, -(-self.window_docs // max(1, chunk_docs))) + 2

    def submit(self, chunk: Sequence[str] | TokenizedTexts) -> Future:
        """Queue a chunk; its future resolves to one :class:`~.sparse_vector.SparseVector` per text, in order (a
        :class:`~.sparse_vector.SparseVectors`: flat arrays, handed to document workers as they are). Texts are
        tokenized by the encoder's tokenizer process or thread (``future.tokens`` holds the ids afterwards)."""
        if self._error is not None:
            raise RuntimeError("the encoding pipeline failed") from self._error
        if self._closed:
            raise RuntimeError("the encoding pipeline is closed")
        if not isinstance(chunk, TokenizedTexts):
            chunk = self.encoder.tokenize_async(list(chunk))  # a tokenizer process on CUDA, else a thread
        item = _Chunk(chunk, next(self._serials))
        self._queue.put(item)
        return item.future

    def encode(self, texts: Sequence[str] | TokenizedTexts) -> list[SparseVector]:
        """Synchronous form of :meth:`submit`."""
        return list(self.submit(texts).result())

    def close(self) -> None:
        """Finish what was submitted and stop the device thread."""
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join()
            self.encoder.close()

    # ------------------------------------------------------------------ the device thread
    def _peek(self, block: bool) -> Any:
        """The next queued item, left at the front of ``_ahead``; ``None`` if nothing is queued and not ``block``."""
        if not self._ahead:
            try:
                self._ahead.append(self._queue.get() if block else self._queue.get_nowait())
            except queue.Empty:
                return None
        return self._ahead[0]

    def _take_window(self) -> list[tuple[np.ndarray, TokenizedTexts]] | None:
        """The next window for :func:`~.packed_runner.ready_batches`: the first queued chunk (waiting for its
        ids), then every queued chunk already tokenized, up to ``window_docs`` documents; ``[]`` when nothing
        is queued (the caller may be waiting on a future: what is in flight is completed), ``None`` once closed.
        A chunk's keys are rows ``(serial, position in the chunk)``."""
        window, docs = [], 0
        while docs < self.window_docs:
            item = self._peek(block=False)
            if item is None:
                if window:
                    break
                if not self._flushed:
                    self._flushed = True
                    return []
                t0 = time.perf_counter()
                with thawed() if self._frozen else nullcontext():  # idle: the process's heap is not kept frozen
                    item = self._peek(block=True)
                self.encoder.runner.stats.by_stage["source_caller"] += time.perf_counter() - t0
            if item is _STOP:
                return window or None
            if window and not item.ready():
                break
            self._ahead.popleft()
            self._flushed = False
            self._open[item.serial] = item
            t0 = time.perf_counter()
            item.start()  # waits for the ids of the window's first chunk only
            self.encoder.runner.stats.by_stage["source_tokenizer"] += time.perf_counter() - t0
            if not item.missing:
                del self._open[item.serial]
                item.future.set_result(SparseVectors.empty())
                continue
            keys = np.stack([np.full(item.missing, item.serial), np.arange(item.missing)], axis=1)
            window.append((keys, item.tokens))
            docs += item.missing
        return window

    def _run(self) -> None:
        stats = self.encoder.stats
        runner = self.encoder.runner
        dropped_before = stats.nonfinite_dropped - runner.stats.nonfinite_dropped
        self._frozen = runner.freeze_heap  # what heap_frozen does on entry, so a wait lets go of it alike
        try:
            with runner.heap_frozen():
                for keys, vectors in runner.stream(ready_batches(self._take_window, runner.max_batch_tokens)):
                    stats.nonfinite_dropped = dropped_before + runner.stats.nonfinite_dropped
                    for serial, rows in _rows_by_serial(keys[:, 0]):
                        chunk = self._open[serial]
                        piece = vectors if len(rows) == len(vectors) else vectors.take(rows)
                        chunk.pieces.append((keys[rows, 1], piece))
                        chunk.missing -= len(rows)
                        if chunk.missing == 0:
                            done = in_order(chunk.pieces)
                            stats.texts += len(done)
                            stats.tokens += int(chunk.tokens.lengths.sum())
                            del self._open[serial]
                            chunk.future.set_result(done)
        except BaseException as err:  # noqa: BLE001 - handed to every waiting caller
            self._error = err
            self._fail_pending(err)

    def _fail_pending(self, err: BaseException) -> None:
        for chunk in [*self._open.values(), *(i for i in self._ahead if i is not _STOP)]:
            if not chunk.future.done():
                chunk.future.set_exception(err)
        self._open.clear()
        self._ahead.clear()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP and not item.future.done():
                item.future.set_exception(err)


def _rows_by_serial(serials: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """A batch's rows grouped by the chunk they belong to: ``(serial, rows)`` (rows ascending within a chunk)."""
    if len(serials) and serials[0] == serials[-1] and (serials == serials[0]).all():
        return [(int(serials[0]), np.arange(len(serials)))]
    order = np.argsort(serials, kind="stable")
    cuts = np.flatnonzero(np.diff(serials[order])) + 1
    return [(int(serials[rows[0]]), rows) for rows in np.split(order, cuts)]
