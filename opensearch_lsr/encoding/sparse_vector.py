"""The encoders' output type: one text's sparse vector; a chunk's vectors as flat arrays, to cross processes."""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

__all__ = ["SparseVector", "flat_vectors", "split_vectors"]


class SparseVector(NamedTuple):
    """One encoded text: vocabulary ids (ascending, int64) and their weights (float32, > 0)."""

    ids: np.ndarray
    weights: np.ndarray


def flat_vectors(vectors: Sequence[SparseVector]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A chunk's vectors as three flat arrays (ids, weights, counts): pickled as three buffers, where a list
    of vectors pickles two small arrays per document (2.3 against 0.5 ms for 256 documents of 150 ids)."""
    counts = np.fromiter((len(v.ids) for v in vectors), dtype=np.int64, count=len(vectors))
    if not len(vectors):
        return np.zeros(0, np.int64), np.zeros(0, np.float32), counts
    return (np.concatenate([v.ids for v in vectors]), np.concatenate([v.weights for v in vectors]), counts)


def split_vectors(ids: np.ndarray, weights: np.ndarray, counts: np.ndarray) -> list[SparseVector]:
    """The vectors :func:`flat_vectors` flattened (views into ``ids`` and ``weights``)."""
    if not len(counts):
        return []
    cuts = np.cumsum(counts)[:-1]
    return [SparseVector(i, w) for i, w in zip(np.split(ids, cuts), np.split(weights, cuts))]
