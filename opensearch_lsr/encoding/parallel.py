"""One encoder process per device: several GPUs encode different chunks of a corpus at once.

:class:`DevicePool` starts one worker process per device (``spawn``, so CUDA initialises cleanly in
each), each holding its own :class:`~opensearch_lsr.encoding.encoder.SparseDocumentEncoder` on its
device. ``submit(texts)`` returns a ``concurrent.futures.Future`` of the sparse vectors and sends the
chunk at once to the worker with the fewest documents outstanding. With packed batching each worker
streams the chunks it receives through its own :class:`~.encode_pipeline.PipelinedEncoder`, as the
one-process job does: the next chunks are tokenized while the device works, and batches are cut from
windows of several chunks, so a worker's device does not wait between chunks. The index job keeps a few
chunks in flight and consumes the futures in submission order, so its checkpoints stay sequential. Each
worker tokenizes its chunks once and sends their token counts back with the vectors (the 512-token
policy's report), so the parent, which never loads the model weights, only tokenizes to split long texts
(``--long-text split``) and decodes the WORD keys.

Hand-written rather than a ``ProcessPoolExecutor``: an executor gives a worker one call at a time, and
the call must return before the worker takes the next, so each chunk's tokenization and the last batch's
completion would leave the device idle; here a worker takes requests as they come and answers them in
order from a thread of its own (:func:`serve`).
"""
from __future__ import annotations

import atexit
import itertools
import multiprocessing as mp
import os
import pickle
import queue
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..contract import MAX_LENGTH, decode_keys
from ..errors import LsrError
from .encoder import EncoderStats, SparseVector, count_tokens
from .sparse_vector import SparseVectors, flat_vectors

__all__ = ["resolve_devices", "DevicePool", "ChunkTokens", "EncoderProcessError", "serve"]


class EncoderProcessError(LsrError, RuntimeError):
    """An encoder process could not start (the model did not load, a bad setting): the CLI prints one line."""


def resolve_devices(device: str | None) -> list[str]:
    """Devices to encode on: ``None`` -> every GPU (or ``cpu``); ``"cuda"`` -> every GPU;
    ``"cuda:1"`` -> that one; ``"cuda:0,cuda:1"`` (or ``"cpu,cpu"``) -> one worker each."""
    import torch

    if device is not None and "," in device:
        devices = [d.strip() for d in device.split(",") if d.strip()]
        if not devices:
            raise ValueError(f"device list {device!r} is empty")
        return devices
    if device in (None, "cuda"):
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n > 1:
            return [f"cuda:{i}" for i in range(n)]
        if n == 1:
            return ["cuda"]
        if device == "cuda":
            raise ValueError("device 'cuda' was asked for but no CUDA device is available")
        return ["cpu"]
    return [device]


@dataclass(frozen=True)
class ChunkTokens:
    """What a worker reports of a chunk's tokenization: untruncated token counts with special tokens (the
    512-token policy), so the parent never tokenizes the texts a second time."""

    full_lengths: np.ndarray


# ---------------------------------------------------------------------------------------------- the worker
class _Synchronous:
    """An encoder without packed batching behind the pipeline's ``submit`` / ``close``: each chunk is
    encoded when it is submitted (and its tokens counted, for the 512-token policy)."""

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder

    def submit(self, texts: Sequence[str]) -> Future:
        future: Future = Future()
        counts = np.asarray(count_tokens(self.encoder.tokenizer, texts), np.int64)
        future.tokens = ChunkTokens(counts)  # type: ignore[attr-defined]
        future.set_result(self.encoder.encode(list(texts)))
        return future

    def close(self) -> None:
        self.encoder.close()


def _portable(err: BaseException) -> BaseException:
    """``err`` if it survives pickling (to cross to the parent), else a RuntimeError with its traceback."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:  # noqa: BLE001 - any pickling failure
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        return RuntimeError(f"{type(err).__name__}: {err}\n{text}")


def serve(pipeline: Any, requests: Any, reply: Callable[[str, int | None, Any], None],
          dropped: Callable[[], int] = lambda: 0) -> None:
    """A worker's loop: ``(seq, texts)`` requests from ``requests`` (until ``None``) go into ``pipeline``
    (``submit`` -> future with ``.tokens``) as they arrive, and a thread of their own answers them in
    order with ``reply("done", seq, (flat_vectors(vectors), nonfinite_dropped, full_lengths))`` or ``reply("failed",
    seq, error)``; ``pipeline`` is closed (what was submitted is finished) before it returns. ``dropped``
    reads the encoder's running count of non-finite weights dropped (each answer carries what it grew by)."""
    order: queue.Queue = queue.Queue()

    def answer() -> None:
        before = dropped()  # the running count when serving starts: what came before is no chunk's
        while (item := order.get()) is not None:
            seq, future = item
            try:
                flat = flat_vectors(future.result())  # three buffers to pickle, not two arrays a document
                now = dropped()
                reply("done", seq, (flat, now - before, np.asarray(future.tokens.full_lengths, np.int64)))
                before = now
            except BaseException as err:  # noqa: BLE001 - the parent's future gets it
                reply("failed", seq, _portable(err))

    answering = threading.Thread(target=answer, name="lsr-os-encoder-answers", daemon=True)
    answering.start()
    try:
        while (request := requests.get()) is not None:
            seq, texts = request
            try:
                future = pipeline.submit(texts)
            except BaseException as err:  # noqa: BLE001 - a failed pipeline fails each later chunk
                future = Future()
                future.set_exception(err)
            order.put((seq, future))
    finally:
        try:
            pipeline.close()
        finally:
            order.put(None)
            answering.join()


class _WhileParentLives:
    """A worker's request queue that reads as ended (``None``) once the parent process is gone (killed
    before it could say stop), so the worker finishes and frees its device instead of waiting forever."""

    def __init__(self, requests: Any) -> None:
        self.requests = requests

    def get(self) -> Any:
        while True:
            try:
                return self.requests.get(timeout=1.0)
            except queue.Empty:
                parent = mp.parent_process()
                if parent is not None and not parent.is_alive():
                    return None


def _worker_main(index: int, device: str, model: str, kwargs: dict, workers: int, window_docs: int,
                 requests: Any, results: Any) -> None:
    """A worker process: the encoder on ``device`` (warmed up), then :func:`serve` until asked to stop;
    last, a report of where its device thread spent its time."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    def reply(kind: str, seq: int | None, payload: Any) -> None:
        results.put((kind, index, seq, payload))

    try:
        from .encode_pipeline import PipelinedEncoder
        from .encoder import SparseDocumentEncoder
        from .packed_runner import device_thread_report
        from .tokenizer_process import default_tokenizer_threads

        encoder = SparseDocumentEncoder(model, device=device, **kwargs)
        encoder.tokenizer_threads = default_tokenizer_threads(workers)  # the devices share the tokenizing cores
        encoder.warm_up()  # CUDA's one-off costs here, at start-up (a no-op on CPU)
        pipeline = (PipelinedEncoder(encoder, window_docs=window_docs) if encoder.runner is not None
                    else _Synchronous(encoder))
        resolved = {"precision": encoder.precision, "batching": encoder.batching,
                    "body_precision": getattr(encoder, "body_precision", encoder.precision)}
    except BaseException as err:  # noqa: BLE001 - the parent raises it
        reply("failed", None, _portable(err))
        return
    reply("ready", None, resolved)
    serve(pipeline, _WhileParentLives(requests), reply, lambda: encoder.stats.nonfinite_dropped)
    reply("closed", None, device_thread_report(encoder))
    # Every answer is in the pipe and the encoder is closed. Tearing the interpreter down (torch's modules and
    # the model's tensors) would take over a second (1.4 s on 2 CPU cores), and the job's clock waits for it:
    # run the exit handlers (multiprocessing's finalizers, the tokenizer's and logging's) and leave.
    results.close()
    results.join_thread()
    atexit._run_exitfuncs()
    os._exit(0)


# ---------------------------------------------------------------------------------------------- the parent
def _stop(request_queues: list) -> None:
    for requests in request_queues:
        try:
            requests.put(None)
        except (OSError, ValueError):  # already closed
            pass


@dataclass
class _Worker:
    device: str
    process: Any
    requests: Any
    outstanding: dict[int, int] = field(default_factory=dict)  # seq -> documents, answers not yet in
    ready: bool = False
    ended: bool = False
    error: BaseException | None = None
    report: dict | None = None


class DevicePool:
    """Encoder processes, one per device, behind the parts of the encoder interface the job uses.

    Args:
        model: the SparseEncoder directory (as for :class:`SparseDocumentEncoder`).
        devices: one worker per entry (``["cuda:0", "cuda:1"]``; ``["cpu", "cpu"]`` works too).
        precision, batch_size, max_length, num_threads, batching, max_batch_tokens, compile: passed to each
            worker's encoder (``precision``, ``body_precision`` and ``batching`` say what its encoder resolved
            ``"auto"`` to once a worker has started).
        window_docs: the most documents a worker cuts into packed batches together (its
            :class:`~.encode_pipeline.PipelinedEncoder`'s window).
    """

    #: the workers count the tokens of what they encode (``future.tokens``): the job need not count them first
    counts_tokens = True

    def __init__(self, model: str | os.PathLike, devices: Sequence[str], *, precision: str = "auto",
                 batch_size: int = 32, max_length: int = MAX_LENGTH, num_threads: int | None = None,
                 batching: str = "auto", max_batch_tokens: int | None = None, compile: bool | str | None = None,
                 window_docs: int = 4096) -> None:
        from transformers import AutoConfig

        from ..transfer.surgery import load_target_tokenizer, resolve_model_path

        if len(devices) < 1:
            raise ValueError("DevicePool needs at least one device")
        path = resolve_model_path(str(model))
        self.model_path = path
        self.tokenizer = load_target_tokenizer(path, what="model tokenizer")
        positions = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", max_length)
        self.max_length = int(min(max_length, positions))
        self.devices = list(devices)
        self.num_workers = len(self.devices)
        self.device = ",".join(self.devices)
        self.precision = precision
        self.batching = batching
        self.body_precision = precision
        self.batch_size = int(batch_size)
        self.window_docs = int(window_docs)
        self.stats = EncoderStats()
        kwargs = {"precision": precision, "batch_size": batch_size, "max_length": max_length,
                  "num_threads": num_threads, "batching": batching, "max_batch_tokens": max_batch_tokens,
                  "compile": compile}
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._futures: dict[int, tuple[Future, _Worker]] = {}
        self._serials = itertools.count()
        self._closing = False
        self._workers: list[_Worker] = []
        for i, device in enumerate(self.devices):
            requests = ctx.Queue()
            # not a daemon: a worker on a GPU starts tokenizer processes of its own
            process = ctx.Process(target=_worker_main, name=f"lsr-os-encoder-{device}",
                                  args=(i, device, path, kwargs, self.num_workers, self.window_docs, requests,
                                        self._results))
            process.start()
            self._workers.append(_Worker(device, process, requests))
        self._collector = threading.Thread(target=self._collect, name="lsr-os-encoder-results", daemon=True)
        self._collector.start()
        # a pool never closed: its workers are told to stop when the interpreter exits (before multiprocessing
        # joins them)
        self._stop_at_exit = weakref.finalize(self, _stop, [w.requests for w in self._workers])

    @property
    def keys(self) -> list[str]:
        """WORD keys per id (single-id decode), computed once in the parent."""
        if not hasattr(self, "_keys"):
            self._keys = decode_keys(self.tokenizer)
        return self._keys

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Untruncated token counts with special tokens (the 512-token policy)."""
        return count_tokens(self.tokenizer, texts)

    def max_inflight(self, chunk_docs: int) -> int:
        """Chunks a caller should keep submitted: two windows' worth per worker, so each worker has its
        next window queued while its device works through the current one."""
        return self.num_workers * (2 * max(1, -(-self.window_docs // max(1, chunk_docs))) + 2)

    def submit(self, texts: Sequence[str]) -> Future:
        """Encode ``texts`` on the device with the fewest documents outstanding; the future's result is
        ``list[SparseVector]`` and, once it is done, ``future.tokens`` (:class:`ChunkTokens`) holds the worker's
        token counts."""
        texts = list(texts)
        future: Future = Future()
        with self._lock:
            if self._closing:
                raise RuntimeError("the device pool is closed")
            live = [w for w in self._workers if not w.ended]
            if not live:
                raise RuntimeError("every encoder process of the pool has ended") from self._first_error()
            worker = min(live, key=lambda w: sum(w.outstanding.values()))
            seq = next(self._serials)
            worker.outstanding[seq] = len(texts)
            self._futures[seq] = (future, worker)
        worker.requests.put((seq, texts))
        return future

    def warm_up(self) -> float:
        """Wait until every worker has loaded its model and warmed its encoder up; returns the seconds spent.
        The index job calls it before its clock starts, as it does for an in-process encoder.

        Raises:
            EncoderProcessError: a worker failed to start (its error is the cause, its first line in the message).
        """
        t0 = time.perf_counter()
        with self._changed:
            self._changed.wait_for(lambda: all(w.ready or w.ended for w in self._workers))
            failed = [w for w in self._workers if w.ended and not w.ready]
        if failed:
            cause = failed[0].error
            lines = str(cause).strip().splitlines() if cause is not None else []
            reason = lines[0] if lines else "no reason given"
            raise EncoderProcessError(f"the encoder process on {failed[0].device} failed to start: {reason}") from cause
        return time.perf_counter() - t0

    def encode(self, texts: Sequence[str]) -> list[SparseVector]:
        """Blocking encode on one device (order of ``texts`` kept)."""
        return list(self.submit(texts).result())

    __call__ = encode

    @property
    def device_reports(self) -> list[dict]:
        """Per worker, once the pool is closed: where its device thread spent its time
        (:func:`~.packed_runner.device_thread_report`; empty without packed batching)."""
        return [w.report for w in self._workers if w.report is not None]

    def close(self) -> None:
        """Finish what was submitted, stop the workers and wait for them."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._stop_at_exit.detach()
        for w in self._workers:
            if not w.ended:
                w.requests.put(None)
        for w in self._workers:
            w.process.join()
        self._collector.join()

    def __enter__(self) -> "DevicePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DevicePool({self.model_path!r}, devices={self.devices}, precision={self.precision})"

    # ------------------------------------------------------------------ the results thread
    def _first_error(self) -> BaseException | None:
        return next((w.error for w in self._workers if w.error is not None), None)

    def _collect(self) -> None:
        """Resolve futures from the workers' answers; fail a worker's outstanding futures when its process
        ends without answering them (killed, crashed); stop once every worker has ended."""
        checked = time.monotonic()
        while not all(w.ended for w in self._workers):
            try:
                kind, index, seq, payload = self._results.get(timeout=0.5)
                self._handle(kind, self._workers[index], seq, payload)
            except queue.Empty:
                pass
            if time.monotonic() - checked >= 0.5:  # also while other workers keep answering
                checked = time.monotonic()
                for w in self._workers:
                    if not w.ended and not w.process.is_alive():
                        self._drain_results()  # answers it sent before it ended come first
                        if not w.ended:
                            code = w.process.exitcode
                            self._end(w, RuntimeError(f"the encoder process on {w.device} ended (exit code {code})"))

    def _drain_results(self) -> None:
        while True:
            try:
                kind, index, seq, payload = self._results.get_nowait()
            except queue.Empty:
                return
            self._handle(kind, self._workers[index], seq, payload)

    def _handle(self, kind: str, worker: _Worker, seq: int | None, payload: Any) -> None:
        if kind == "ready":  # with what the worker's encoder resolved "auto" to
            with self._changed:
                for name, value in payload.items():
                    setattr(self, name, value)
                worker.ready = True
                self._changed.notify_all()
        elif kind == "closed":
            worker.report = payload or None
            self._end(worker, None)
        elif seq is None:  # "failed" before serving: the worker could not start
            self._end(worker, payload)
        else:
            with self._lock:
                future, _ = self._futures.pop(seq, (None, None))
                worker.outstanding.pop(seq, None)
            if future is None:  # already failed: its worker was taken for ended
                return
            if kind == "done":
                flat, dropped, full = payload
                vectors = SparseVectors(*flat)  # flat, as the job's document workers take them
                future.tokens = ChunkTokens(full)  # type: ignore[attr-defined]
                self.stats.texts += len(vectors)
                self.stats.nonfinite_dropped += dropped
                future.set_result(vectors)
            else:
                future.set_exception(payload)

    def _end(self, worker: _Worker, error: BaseException | None) -> None:
        """The worker is gone: fail what it still owed (with ``error``, or a plain notice)."""
        with self._changed:
            worker.ended = True
            worker.error = error
            owed = [self._futures.pop(s) for s in list(worker.outstanding) if s in self._futures]
            worker.outstanding.clear()
            self._changed.notify_all()
        for future, _ in owed:
            err = RuntimeError(f"the encoder process on {worker.device} ended before answering")
            if error is not None:
                err.__cause__ = error
            future.set_exception(err)
