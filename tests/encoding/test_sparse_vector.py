"""``SparseVectors``: many vectors in flat arrays, regrouped without a Python step per document."""
from __future__ import annotations

import numpy as np
import pytest

from opensearch_lsr.encoding.sparse_vector import (
    SparseVector,
    SparseVectors,
    flat_vectors,
    in_order,
)


def _vectors(counts, seed=0) -> list[SparseVector]:
    rng = np.random.default_rng(seed)
    return [SparseVector(np.sort(rng.choice(1000, k, replace=False)).astype(np.int64),
                         rng.random(k, dtype=np.float32) + 0.1) for k in counts]


def _same(got, expected) -> bool:
    return len(got) == len(expected) and all(
        np.array_equal(a.ids, b.ids) and np.array_equal(a.weights, b.weights) for a, b in zip(got, expected))


def test_a_flat_sequence_reads_like_the_list_it_was_made_from():
    vectors = _vectors([3, 0, 5, 2, 7])
    flat = SparseVectors(*flat_vectors(vectors))
    assert _same(flat, vectors) and _same(list(flat), vectors)
    assert _same([flat[k] for k in range(-5, 5)], vectors + vectors)
    assert _same(flat[1:4], vectors[1:4]) and _same(flat[::2], vectors[::2]) and len(flat[4:1]) == 0
    assert np.array_equal(flat.counts, [3, 0, 5, 2, 7])
    with pytest.raises(IndexError):
        flat[5]
    ids, weights, counts = flat_vectors(flat)  # handed over as they are, not concatenated again
    assert ids is flat.ids and weights is flat.weights and np.array_equal(counts, flat.counts)
    assert len(SparseVectors.empty()) == 0 and list(SparseVectors.empty()) == []
    with pytest.raises(ValueError, match="counts summing to 4"):
        SparseVectors(np.arange(3), np.ones(3, np.float32), np.array([4]))


def test_take_and_concat_regroup_documents():
    vectors = _vectors([4, 1, 0, 6, 2, 3], seed=1)
    flat = SparseVectors(*flat_vectors(vectors))
    rows = np.array([5, 0, 2, 3])
    assert _same(flat.take(rows), [vectors[k] for k in rows])
    assert len(flat.take(np.zeros(0, np.int64))) == 0
    joined = SparseVectors.concat([flat[:2], flat[2:2], flat[2:]])
    assert _same(joined, vectors) and SparseVectors.concat([flat]) is flat and len(SparseVectors.concat([])) == 0


def test_in_order_puts_length_sorted_batches_back_in_input_order():
    vectors = _vectors([5, 1, 0, 9, 2, 4, 7, 3], seed=2)
    flat = SparseVectors(*flat_vectors(vectors))
    # three "batches" holding the documents in another order, as a length-sorted window cuts them
    batches = [np.array([2, 1, 7]), np.array([4, 0]), np.array([6, 3, 5])]
    pieces = [(rows, flat.take(rows)) for rows in batches]
    assert _same(in_order(pieces), vectors)
    assert in_order([(np.arange(8), flat)]) is flat  # already in order: nothing copied
    assert len(in_order([])) == 0
    with pytest.raises(ValueError, match="positions"):
        in_order([(np.arange(3), flat)])
