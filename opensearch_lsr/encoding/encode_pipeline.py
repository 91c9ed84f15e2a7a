"""The index job's encoder as a pipeline: chunks go in, futures of their vectors come out, the device never waits.

``submit(chunk)`` queues a chunk (texts, or texts already tokenized once by the caller) and returns a
``concurrent.futures.Future``. One device thread takes every chunk queued so far, up to ``window_docs``
documents, cuts them into token-budgeted packed batches (sorted by length inside the window, whatever
the chunking), and streams those batches through the :class:`~.packed_runner.PackedRunner` with several
in flight; when the last document of a chunk comes back, its future is resolved. So reading, tokenizing,
building documents and writing (the caller's threads) overlap with the device, and the caller keeps
consuming futures in submission order, which keeps the job's checkpoints sequential.

When no chunk is waiting, the batches in flight are drained (so a caller blocked on a future is always
served); an error in the device thread fails every pending future and every later ``submit``.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .sparse_vector import SparseVector
from .packed_runner import FLUSH
from .token_batches import token_budget_batches
from .token_ids import TokenizedTexts, concat_tokenized

__all__ = ["PipelinedEncoder"]

_STOP = object()


class _Chunk:
    """One submitted chunk: its ids (or their future, from the tokenizer thread), its vectors as they
    arrive, and the future the caller holds (``future.tokens`` is set once the chunk is tokenized)."""

    def __init__(self, tokens: TokenizedTexts | Future) -> None:
        self._tokens = tokens
        self.vectors: list[SparseVector | None] = []
        self.missing = 0
        self.future: Future = Future()

    @property
    def tokens(self) -> TokenizedTexts:
        if isinstance(self._tokens, Future):
            self._tokens = self._tokens.result()
        return self._tokens

    def start(self) -> None:
        """Wait for the ids; make room for the vectors."""
        n = len(self.tokens.lengths)
        self.future.tokens = self.tokens  # type: ignore[attr-defined]
        self.vectors, self.missing = [None] * n, n


class PipelinedEncoder:
    """A :class:`~.encoder.SparseDocumentEncoder` with packed batching, behind ``submit`` / ``close``.

    Args:
        encoder: the encoder (its ``runner`` does the device work; everything else is delegated to it).
        window_docs: documents sorted into batches together (independent of the caller's chunk size).
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
        self._open: set[_Chunk] = set()  # taken by the device thread, not yet resolved
        self._thread = threading.Thread(target=self._run, name="lsr-os-device", daemon=True)
        self._thread.start()

    def __getattr__(self, name: str) -> Any:  # keys, tokenizer, max_length, device, precision, stats ...
        return getattr(self.__dict__["encoder"], name)

    def max_inflight(self, chunk_docs: int) -> int:
        """Chunks a caller should keep submitted: two windows' worth, so the next window is queued
        while the device works through the current one."""
        return 2 * max(1, -(-self.window_docs // max(1, chunk_docs))) + 2

    def submit(self, chunk: Sequence[str] | TokenizedTexts) -> Future:
        """Queue a chunk; its future resolves to one :class:`~.encoder.SparseVector` per text, in order.
        Texts are tokenized by the encoder's tokenizer process or thread (``future.tokens`` holds the ids
        afterwards)."""
        if self._error is not None:
            raise RuntimeError("the encoding pipeline failed") from self._error
        if self._closed:
            raise RuntimeError("the encoding pipeline is closed")
        if not isinstance(chunk, TokenizedTexts):
            chunk = self.encoder.tokenize_async(list(chunk))  # a tokenizer process on CUDA, else a thread
        item = _Chunk(chunk)
        self._queue.put(item)
        return item.future

    def encode(self, texts: Sequence[str] | TokenizedTexts) -> list[SparseVector]:
        """Synchronous form of :meth:`submit`."""
        return self.submit(texts).result()

    def close(self) -> None:
        """Finish what was submitted and stop the device thread."""
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join()
            self.encoder.close()

    # ------------------------------------------------------------------ the device thread
    def _windows(self) -> Iterator[tuple[Any, TokenizedTexts | None]]:
        """``(tag, batch)`` pairs for the runner: a window of queued chunks at a time; a ``FLUSH`` when
        nothing is queued (the runner then completes what is in flight)."""
        while True:
            try:
                first = self._queue.get_nowait()
            except queue.Empty:
                yield FLUSH, None
                first = self._queue.get()
            if first is _STOP:
                return
            chunks, docs, stop = [], 0, False
            item = first
            while True:
                self._open.add(item)
                item.start()
                if item.missing:
                    chunks.append(item)
                    docs += item.missing
                else:
                    self._open.discard(item)
                    item.future.set_result([])
                if docs >= self.window_docs:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
            if not chunks:
                if stop:
                    return
                continue
            tokens = concat_tokenized([c.tokens for c in chunks])
            owner = np.repeat(np.arange(len(chunks)), [len(c.tokens.lengths) for c in chunks])
            within = np.concatenate([np.arange(len(c.tokens.lengths)) for c in chunks])
            for batch in token_budget_batches(tokens.lengths, self.encoder.runner.max_batch_tokens):
                yield (chunks, owner[batch], within[batch]), tokens.select(batch)
            if stop:
                return

    def _run(self) -> None:
        stats = self.encoder.stats
        runner = self.encoder.runner
        dropped_before = stats.nonfinite_dropped - runner.stats.nonfinite_dropped
        try:
            for tag, vectors in runner.stream(self._windows()):
                chunks, owners, positions = tag
                stats.nonfinite_dropped = dropped_before + runner.stats.nonfinite_dropped
                for c, i, vector in zip(owners.tolist(), positions.tolist(), vectors):
                    chunk = chunks[c]
                    chunk.vectors[i] = vector
                    chunk.missing -= 1
                    if chunk.missing == 0:
                        stats.texts += len(chunk.vectors)
                        stats.tokens += int(chunk.tokens.lengths.sum())
                        self._open.discard(chunk)
                        chunk.future.set_result(chunk.vectors)
        except BaseException as err:  # noqa: BLE001 - handed to every waiting caller
            self._error = err
            self._fail_pending(err)

    def _fail_pending(self, err: BaseException) -> None:
        for chunk in list(self._open):
            if not chunk.future.done():
                chunk.future.set_exception(err)
        self._open.clear()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP and not item.future.done():
                item.future.set_exception(err)
