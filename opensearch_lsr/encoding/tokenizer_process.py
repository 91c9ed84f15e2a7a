"""Tokenize in processes of their own beside a GPU, so the launching thread does not share its interpreter.

Every PyTorch op called from Python releases the interpreter lock and takes it back, and the host needs
several hundred of them to launch one packed batch; whatever else runs in the process (the tokenizer turning
Rust encodings into id arrays, its thread pool's cores) slows that launch. Measured on an H200 with 16 cores
(``benchmarks/results/gpu_encode.md``, runs 5 and 6): with the tokenizer in a thread the host took 20.3 ms
to launch each 32k-token BERT-base batch (21.5 ms of kernels), with this process 12.7 ms; packed encoding
went from 13,810 to 14,569 docs/s and ``lsr-os index --backend ndjson`` from 0.60 to 0.77 of it. (SPLADE-tiny,
243 tokens per passage, stays bound by tokenizing itself: launch 24-26 ms per batch either way, 4.6 ms
pre-tokenized.) The processes receive texts and return the flat id arrays of
:class:`~.token_ids.TokenizedTexts` (three numpy buffers); the Rust tokenizer's thread pools
(``RAYON_NUM_THREADS``) share half the cores.

Each call's texts are split into one contiguous slice per process, tokenized at once and joined in order.
One Rust pool stops scaling early; smaller pools in separate processes go further, so the default is two
threads per process (H200, 16 cores, SPLADE-tiny passages/s: 8 threads 11.0k in one process,
14.4k in four; 16 threads 13.1k in one, 23.3k in four: ``benchmarks/results/tokenizer_scaling_processes_h200.md``,
``benchmarks/tokenizer_scaling.py --processes``).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np

from .token_ids import OnceTokenizer, TokenizedTexts, concat_tokenized

__all__ = ["TokenizerProcess", "BackgroundTokenizer", "default_tokenizer_threads", "default_tokenizer_processes"]

_ONCE: OnceTokenizer | None = None


def default_tokenizer_threads(encoders: int = 1) -> int:
    """Threads of the Rust tokenizer beside one GPU: half the cores shared by the ``encoders`` (one per device in
    a multi-GPU pool), at least one each (the other half serve the launching threads, the job's reader and
    writer, and the document workers)."""
    return max(1, (os.cpu_count() or 2) // (2 * max(1, encoders)))


def default_tokenizer_processes(threads: int | None = None) -> int:
    """Processes the tokenizer's ``threads`` are spread over beside a GPU: two threads each, at most four.

    Measured on an H200 with 16 cores (``benchmarks/results/gpu_encode.md``, runs 11-12): 8 threads in 4
    processes tokenized 14,365 SPLADE-tiny passages/s against 11,017 in one, and packed SPLADE-tiny encoding
    went from 10,203 to 12,792 docs/s (16 threads in 4 processes: 11,946, the launching thread short of a core).
    """
    return max(1, min(4, int(threads or default_tokenizer_threads()) // 2))


def _init(once: OnceTokenizer, threads: int) -> None:
    global _ONCE
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # before the first parallel encode builds the pool
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    _ONCE = once


def _tokenize(texts: list[str]) -> TokenizedTexts:
    return _ONCE(texts)  # type: ignore[misc]


def _warm(texts: list[str]) -> None:
    _ONCE.rust_ids(texts)  # type: ignore[union-attr] - the Rust pool, without counting in the word cache's probe


def _joined(parts: list[Future]) -> Future:
    """One future of the slices' results concatenated in order (the first failure, if one fails)."""
    joined: Future = Future()
    left = [len(parts)]
    lock = threading.Lock()

    def done(_: Future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        try:
            joined.set_result(concat_tokenized([f.result() for f in parts]))
        except BaseException as err:  # noqa: BLE001 - handed to whoever waits on the joined future
            joined.set_exception(err)

    for f in parts:
        f.add_done_callback(done)
    return joined


class TokenizerProcess:
    """:class:`~.token_ids.OnceTokenizer` calls run in spawned processes; :meth:`submit` returns a future.

    Args:
        once: the tokenizer (pickled to each process once).
        threads: the Rust tokenizer's threads in all [default: :func:`default_tokenizer_threads`].
        processes: how many processes share them [default: :func:`default_tokenizer_processes`]; a call's
            texts are split into that many slices.
    """

    def __init__(self, once: OnceTokenizer, threads: int | None = None, processes: int | None = None) -> None:
        self.threads = int(threads or default_tokenizer_threads())
        self.processes = max(1, min(int(processes or default_tokenizer_processes(self.threads)), self.threads))
        self._pool = ProcessPoolExecutor(self.processes, mp_context=mp.get_context("spawn"), initializer=_init,
                                         initargs=(once, max(1, self.threads // self.processes)))
        # every process and its imports now, not in a job's clock (one task each while the others are busy)
        for f in [self._pool.submit(_warm, ["start"] * 4096) for _ in range(self.processes)]:
            f.result()

    def submit(self, texts: Sequence[str]) -> Future:
        """A future of ``once(texts)``."""
        texts = list(texts)
        if self.processes == 1 or len(texts) < 2 * self.processes:
            return self._pool.submit(_tokenize, texts)
        cuts = np.linspace(0, len(texts), self.processes + 1).astype(int)
        return _joined([self._pool.submit(_tokenize, texts[a:b]) for a, b in zip(cuts[:-1], cuts[1:])])

    def __call__(self, texts: Sequence[str]) -> TokenizedTexts:
        return self.submit(texts).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class BackgroundTokenizer:
    """:class:`~.token_ids.OnceTokenizer` calls off the caller's thread: in a :class:`TokenizerProcess` pool
    beside a GPU (``process=True``; ``processes`` and ``threads`` as it takes them), else in one helper thread (on
    CPU the encoder's own threads fill the cores, and the Rust tokenizer releases the interpreter lock while it
    works)."""

    def __init__(self, once: OnceTokenizer, *, process: bool, processes: int | None = None,
                 threads: int | None = None) -> None:
        self.once = once
        self._runner = TokenizerProcess(once, threads, processes) if process else \
            ThreadPoolExecutor(1, thread_name_prefix="lsr-os-tokenize")

    def submit(self, texts: Sequence[str]) -> Future:
        """A future of ``once(texts)``."""
        if isinstance(self._runner, TokenizerProcess):
            return self._runner.submit(texts)
        return self._runner.submit(self.once, list(texts))

    def close(self) -> None:
        if isinstance(self._runner, TokenizerProcess):
            self._runner.close()
        else:
            self._runner.shutdown(wait=True)
