"""Tokenize in a process of its own, so the thread that launches GPU work never waits for the interpreter lock.

Every PyTorch op called from Python releases the GIL and takes it back; a thread that runs Python while the
device thread launches a batch (the tokenizer turning the Rust encodings into id arrays) makes each of those
several hundred hand-backs wait, up to the interpreter's switch interval each. Measured on an H200 with 16
cores (SPLADE-tiny, packed, 65k-token batches, ``benchmarks/results/gpu_encode.md``): the host spent 24.6 ms
launching each batch while a tokenizer thread ran beside it, 4.6 ms when the same ids came pre-tokenized
(8,971 against 43,818 docs/s). A spawned process has its own interpreter; it receives texts and returns the
flat id arrays of :class:`~.token_ids.TokenizedTexts` (three numpy buffers), and the Rust tokenizer's own
thread pool (``RAYON_NUM_THREADS``) is sized there so that it leaves cores to the launching process.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor

from .token_ids import OnceTokenizer, TokenizedTexts

__all__ = ["TokenizerProcess", "default_tokenizer_threads"]

_ONCE: OnceTokenizer | None = None


def default_tokenizer_threads() -> int:
    """Threads of the Rust tokenizer in its process: half the cores, at least one (the other half serve the
    launching thread, the job's reader and writer, and the document workers)."""
    return max(1, (os.cpu_count() or 2) // 2)


def _init(once: OnceTokenizer, threads: int) -> None:
    global _ONCE
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # before the first parallel encode builds the pool
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    _ONCE = once


def _tokenize(texts: list[str]) -> TokenizedTexts:
    return _ONCE(texts)  # type: ignore[misc]


class TokenizerProcess:
    """:class:`~.token_ids.OnceTokenizer` calls run in one spawned process; :meth:`submit` returns a future.

    Args:
        once: the tokenizer (pickled to the process once).
        threads: the Rust tokenizer's threads there [default: :func:`default_tokenizer_threads`].
    """

    def __init__(self, once: OnceTokenizer, threads: int | None = None) -> None:
        self.threads = int(threads or default_tokenizer_threads())
        self._pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=_init,
                                         initargs=(once, self.threads))
        self._pool.submit(_tokenize, ["start"]).result()  # the process and its imports, now, not in a job's clock

    def submit(self, texts: Sequence[str]) -> Future:
        """A future of ``once(texts)``."""
        return self._pool.submit(_tokenize, list(texts))

    def __call__(self, texts: Sequence[str]) -> TokenizedTexts:
        return self.submit(texts).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
