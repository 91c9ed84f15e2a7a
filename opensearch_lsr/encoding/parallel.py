"""One encoder process per device: several GPUs encode different chunks of a corpus at once.

:class:`DevicePool` starts one worker process per device (``spawn``, so CUDA initialises cleanly in
each), each holding its own :class:`~opensearch_lsr.encoding.encoder.SparseDocumentEncoder` on its
device. ``submit(texts)`` returns a ``concurrent.futures.Future`` of the sparse vectors; whichever
worker is free takes the next chunk. The index job keeps a few chunks in flight and consumes the
futures in submission order, so its checkpoints stay sequential. Each worker tokenizes its chunk once
and sends its token counts back with the vectors (the 512-token policy's report), so the parent, which
never loads the model weights, only tokenizes to split long texts (``--long-text split``) and decodes
the WORD keys.

``concurrent.futures.ProcessPoolExecutor`` does the process management; what it lacks is pinning
each worker to one device, done here by handing each worker one device name from a queue in its
initializer.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..contract import MAX_LENGTH, decode_keys
from .encoder import EncoderStats, SparseVector, count_tokens

__all__ = ["resolve_devices", "DevicePool", "ChunkTokens"]

_WORKER = None  # the worker process's encoder


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


def _init_worker(devices, model: str, kwargs: dict, workers: int) -> None:
    global _WORKER
    from .encoder import SparseDocumentEncoder
    from .tokenizer_process import default_tokenizer_threads

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _WORKER = SparseDocumentEncoder(model, device=devices.get(), **kwargs)
    _WORKER.tokenizer_threads = default_tokenizer_threads(workers)  # the devices share the tokenizing cores
    _WORKER.warm_up()  # CUDA's one-off costs here, at start-up (a no-op on CPU)


@dataclass(frozen=True)
class ChunkTokens:
    """What a worker reports of a chunk's tokenization: untruncated token counts with special tokens (the
    512-token policy), so the parent never tokenizes the texts a second time."""

    full_lengths: np.ndarray


def _encode(texts: list[str]) -> tuple[list[SparseVector], int, np.ndarray]:
    """Runs in a worker: the vectors, how many non-finite weights were dropped, and the untruncated token
    counts (packed batching: from the one tokenization it encodes; padded: counted here)."""
    before = _WORKER.stats.nonfinite_dropped
    if not texts:
        return [], 0, np.zeros(0, np.int64)
    if _WORKER.runner is not None:  # the encoder's own tokenizer (its process on CUDA, a thread on CPU)
        tokens = _WORKER.tokenize_async(texts).result()
        vectors, full = _WORKER.encode_tokenized(tokens), tokens.full_lengths
    else:
        vectors, full = _WORKER.encode(texts), np.asarray(count_tokens(_WORKER.tokenizer, texts), np.int64)
    return vectors, _WORKER.stats.nonfinite_dropped - before, np.asarray(full)


class DevicePool:
    """Encoder processes, one per device, behind the parts of the encoder interface the job uses.

    Args:
        model: the SparseEncoder directory (as for :class:`SparseDocumentEncoder`).
        devices: one worker per entry (``["cuda:0", "cuda:1"]``; ``["cpu", "cpu"]`` works too).
        precision, batch_size, max_length, num_threads, batching, max_batch_tokens: passed to each worker's
            encoder (packed batching runs the same in-flight device pipeline inside each worker).
    """

    def __init__(self, model: str | os.PathLike, devices: Sequence[str], *, precision: str = "auto",
                 batch_size: int = 32, max_length: int = MAX_LENGTH, num_threads: int | None = None,
                 batching: str = "auto", max_batch_tokens: int | None = None, compile: bool | str | None = None) -> None:
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
        self.batch_size = int(batch_size)
        self.stats = EncoderStats()
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        for d in self.devices:
            queue.put(d)
        kwargs = {"precision": precision, "batch_size": batch_size, "max_length": max_length,
                  "num_threads": num_threads, "batching": batching, "max_batch_tokens": max_batch_tokens,
                  "compile": compile}
        self._executor = ProcessPoolExecutor(max_workers=len(self.devices), mp_context=ctx,
                                             initializer=_init_worker,
                                             initargs=(queue, path, kwargs, len(self.devices)))

    @property
    def keys(self) -> list[str]:
        """WORD keys per id (single-id decode), computed once in the parent."""
        if not hasattr(self, "_keys"):
            self._keys = decode_keys(self.tokenizer)
        return self._keys

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Untruncated token counts with special tokens (the 512-token policy)."""
        return count_tokens(self.tokenizer, texts)

    #: the workers count the tokens of what they encode (``future.tokens``): the job need not count them first
    counts_tokens = True

    def submit(self, texts: Sequence[str]) -> Future:
        """Encode ``texts`` on the next free device; the future's result is ``list[SparseVector]`` and, once it
        is done, ``future.tokens`` (:class:`ChunkTokens`) holds the worker's token counts."""
        outer: Future = Future()
        inner = self._executor.submit(_encode, list(texts))

        def done(f: Future) -> None:
            try:
                vectors, dropped, full = f.result()
            except BaseException as err:  # noqa: BLE001 - handed to whoever waits on the future
                outer.set_exception(err)
                return
            outer.tokens = ChunkTokens(full)  # type: ignore[attr-defined]
            self.stats.texts += len(vectors)
            self.stats.nonfinite_dropped += dropped
            outer.set_result(vectors)

        inner.add_done_callback(done)
        return outer

    def warm_up(self) -> float:
        """Start every worker (model load, its encoder's warm-up) and wait for them; returns the seconds spent.
        The index job calls it before its clock starts, as it does for an in-process encoder."""
        import time

        t0 = time.perf_counter()
        for f in [self._executor.submit(_encode, ["warm up"]) for _ in self.devices]:
            f.result()
        return time.perf_counter() - t0

    def encode(self, texts: Sequence[str]) -> list[SparseVector]:
        """Blocking encode on one free device (order of ``texts`` kept)."""
        return self.submit(texts).result()

    __call__ = encode

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "DevicePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DevicePool({self.model_path!r}, devices={self.devices}, precision={self.precision})"
