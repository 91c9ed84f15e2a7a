"""The encoders' output type: one text's sparse vector; many texts' vectors as flat arrays.

:class:`SparseVectors` keeps a batch's or a chunk's vectors as the device's sparsify hands them over (ids, weights,
offsets): regrouping them (by chunk, back into input order) is a few vectorised gathers, and a chunk crosses to
a process as three buffers, where a list of vectors costs a Python object and two array views per document on
every hand-over (on an H200 the index job's device thread spent 0.67 of its 3.4 s taking batches' results and
placing them per document, waits for the interpreter lock included: ``benchmarks/results/gpu_encode_run18_bert.json``;
``benchmarks/vector_handover.py`` times both ways).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

__all__ = ["SparseVector", "SparseVectors", "flat_vectors", "in_order"]


class SparseVector(NamedTuple):
    """One encoded text: vocabulary ids (ascending, int64) and their weights (float32, > 0)."""

    ids: np.ndarray
    weights: np.ndarray


class SparseVectors(Sequence):
    """Vectors in flat arrays: document ``k``'s ids are ``ids[offsets[k]:offsets[k + 1]]`` (its weights alike).
    A read-only sequence of :class:`SparseVector` (views); :meth:`take` and :meth:`concat` regroup without a
    Python step per document.

    Why not ``scipy.sparse.csr_array``, the same three arrays: every consumer reads ``(ids, weights)`` pairs, not
    ``1 x V`` rows, and regrouping a corpus's batches by chunk through it (construction, row indexing, ``vstack``)
    took longer than :meth:`take` and :func:`in_order` here (``benchmarks/results/vector_handover.md``).

    Args:
        ids: every document's ids, one after another (int64).
        weights: their weights (float32).
        counts: ids per document.
    """

    __slots__ = ("ids", "offsets", "weights")

    def __init__(self, ids: np.ndarray, weights: np.ndarray, counts: np.ndarray) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        self.offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.offsets[1:])
        if len(ids) != self.offsets[-1] or len(weights) != len(ids):
            raise ValueError(f"{len(ids)} ids and {len(weights)} weights for counts summing to {self.offsets[-1]}")
        self.ids, self.weights = ids, weights

    @classmethod
    def empty(cls) -> SparseVectors:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int64))

    @property
    def counts(self) -> np.ndarray:
        """Ids per document."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index):  # type: ignore[override] - int: a SparseVector (views); slice: SparseVectors
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return self.take(np.arange(start, stop, step))
            stop = max(start, stop)
            a, b = self.offsets[start], self.offsets[stop]
            return SparseVectors(self.ids[a:b], self.weights[a:b], np.diff(self.offsets[start:stop + 1]))
        k = range(len(self))[index]  # negative indices, IndexError
        a, b = self.offsets[k], self.offsets[k + 1]
        return SparseVector(self.ids[a:b], self.weights[a:b])

    def __iter__(self):
        if not len(self):
            return iter(())
        cuts = self.offsets[1:-1]
        return map(SparseVector, np.split(self.ids, cuts), np.split(self.weights, cuts))

    def take(self, rows: np.ndarray) -> SparseVectors:
        """The documents ``rows``, in that order (copies)."""
        rows = np.asarray(rows, dtype=np.int64)
        counts = self.offsets[rows + 1] - self.offsets[rows]
        starts = np.zeros(len(rows), dtype=np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        index = np.repeat(self.offsets[rows] - starts, counts) + np.arange(int(counts.sum()), dtype=np.int64)
        return SparseVectors(self.ids[index], self.weights[index], counts)

    @staticmethod
    def concat(parts: Sequence[SparseVectors]) -> SparseVectors:
        """``parts`` one after another."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return SparseVectors.empty()
        return SparseVectors(np.concatenate([p.ids for p in parts]), np.concatenate([p.weights for p in parts]),
                             np.concatenate([p.counts for p in parts]))


def in_order(pieces: Sequence[tuple[np.ndarray, SparseVectors]]) -> SparseVectors:
    """``(positions, vectors)`` pieces (their positions together a permutation of ``0 .. n - 1``) as one
    :class:`SparseVectors` in position order: the batches of a length-sorted window back in input order."""
    if not pieces:
        return SparseVectors.empty()
    positions = np.concatenate([np.asarray(p, dtype=np.int64) for p, _ in pieces])
    joined = SparseVectors.concat([v for _, v in pieces])
    if len(positions) != len(joined):
        raise ValueError(f"{len(positions)} positions for {len(joined)} vectors")
    if np.array_equal(positions, np.arange(len(positions))):
        return joined
    order = np.empty_like(positions)
    order[positions] = np.arange(len(positions))
    return joined.take(order)


def flat_vectors(vectors: Sequence[SparseVector]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A chunk's vectors as three flat arrays (ids, weights, counts): pickled as three buffers, where a list
    of vectors pickles two small arrays per document (2.3 against 0.5 ms for 256 documents of 150 ids).
    :class:`SparseVectors` hand over their arrays as they are."""
    if isinstance(vectors, SparseVectors):
        return vectors.ids, vectors.weights, vectors.counts
    counts = np.fromiter((len(v.ids) for v in vectors), dtype=np.int64, count=len(vectors))
    if not len(vectors):
        return np.zeros(0, np.int64), np.zeros(0, np.float32), counts
    return (np.concatenate([v.ids for v in vectors]), np.concatenate([v.weights for v in vectors]), counts)
