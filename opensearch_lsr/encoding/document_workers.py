"""Build and serialise NDJSON documents in worker processes.

On a GPU the encoder outpaces what one Python thread can turn into documents: keys per id, a dict per
document and its JSON are about 50-100 us of interpreter time each, and every thread of the job shares one
interpreter lock. :class:`NdjsonDocumentPool` hands a chunk's records and vectors to worker processes
(``concurrent.futures.ProcessPoolExecutor``, ``spawn``), each holding the job's
:class:`~.documents.DocumentBuilder`, and gets back the chunk's ``_bulk`` lines in one buffer
(:class:`NdjsonLines`); the job's writer thread writes them in chunk order, so checkpoints and the
exactly-once rules are unchanged. The lines are byte for byte what :class:`~.writers.NdjsonWriter` writes for the
same action.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import orjson

from .documents import DocumentBuilder, doc_id_for
from .sparse_vector import SparseVector, SparseVectors, flat_vectors

__all__ = ["NdjsonDocumentPool", "NdjsonLines", "default_build_workers", "ndjson_lines"]

_BUILDER: DocumentBuilder | None = None
_INDEX = ""


def default_build_workers(device: str | None) -> int:
    """Worker processes for documents by default: up to 8 beside a GPU, leaving 4 cores to the job's own
    threads (reader, device, tokenizer, writer); none on CPU, where the encoder wants every core.

    A chunk goes to a worker as three flat arrays and its records (:func:`~.sparse_vector.flat_vectors`), and the workers
    start before the job's clock. (Handing over a list of per-document vectors instead cost the main thread
    more than building there: 6,013 docs/s with 8 workers against 7,486 without on an H200,
    ``benchmarks/results/gpu_encode.md`` run 4.) ``--build-workers N`` sets it.
    """
    if not str(device or "cpu").startswith("cuda"):
        return 0
    spare = (os.cpu_count() or 1) - 4
    return min(8, spare) if spare >= 2 else 0


@dataclass(frozen=True)
class NdjsonLines:
    """A chunk's documents already serialised (by the job's document workers): their ``_id`` s, and their ``_bulk``
    lines one after another in ``data``, document ``k``'s ending at byte ``ends[k]``. :class:`NdjsonWriter` writes
    them as a few slices of one buffer, where a bytes object per document cost its writer thread a buffered write
    each (9.7 against 2.5 us per 6.8 KB document here)."""

    ids: list[str]
    data: bytes
    ends: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


def ndjson_lines(builder: DocumentBuilder, index: str, doc_id: str, text: str, vector: SparseVector) -> bytes:
    """One document's ``_bulk`` action and source lines (what ``NdjsonWriter`` writes for it)."""
    return (orjson.dumps({"index": {"_index": index, "_id": doc_id}}) + b"\n"
            + orjson.dumps(builder.source(doc_id, text, vector)) + b"\n")


def _init(builder: DocumentBuilder, index: str) -> None:
    global _BUILDER, _INDEX
    _BUILDER, _INDEX = builder, index


def _started() -> bool:
    return True


def _serialise(doc_ids: Sequence[str | None], texts: Sequence[str], ids: np.ndarray, weights: np.ndarray,
               counts: np.ndarray) -> NdjsonLines:
    dids, lines = [], []
    for doc_id, text, vector in zip(doc_ids, texts, SparseVectors(ids, weights, counts)):
        did = doc_id_for(doc_id, text)
        dids.append(did)
        lines.append(ndjson_lines(_BUILDER, _INDEX, did, text, vector))  # type: ignore[arg-type]
    return NdjsonLines(dids, b"".join(lines), np.cumsum([len(x) for x in lines], dtype=np.int64))


class NdjsonDocumentPool:
    """Worker processes that turn ``(doc_id, text)`` records and their vectors into ``_bulk`` lines.

    Args:
        builder: how documents look (sent to each worker once).
        index: the ``_index`` of the action lines.
        workers: processes.
    """

    def __init__(self, builder: DocumentBuilder, index: str, workers: int) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.workers = workers
        self._pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init,
                                         initargs=(builder, index))
        # start every process now (each imports the job's main module), not on the first chunks
        for future in [self._pool.submit(_started) for _ in range(workers)]:
            future.result()

    def submit(self, records: Sequence[tuple[str | None, str]], vectors: Sequence[SparseVector]) -> Future:
        """A future of the chunk's :class:`NdjsonLines` (its documents in record order)."""
        return self._pool.submit(_serialise, [r[0] for r in records], [r[1] for r in records], *flat_vectors(vectors))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
