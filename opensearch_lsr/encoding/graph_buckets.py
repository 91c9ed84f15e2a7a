"""Bucketed batch shapes, so that a compiled body can be replayed as a CUDA graph.

A CUDA graph replays fixed shapes; packed batches have a different token and document count each time. With
``compile="graphs"`` (:class:`~.packed.PackedMLM`) a batch is padded up to a bucket: the token count to a
multiple of ``granularity``, the document count to a power of two, and the longest document (what varlen
attention is told) to a multiple of :data:`GRAPH_MAX_LEN_GRANULARITY` (:func:`graph_max_len`), so a corpus needs a
handful of recorded graphs, not one per batch. The
padding tokens form extra documents of 1 to ``max_doc`` tokens (attention never crosses documents, so the real
ones are untouched) and are dropped before the vocabulary head.

What it buys and costs (:func:`graph_shape`): the host launches a batch's whole body with one graph replay
instead of one kernel launch per fused step (on an H200 the compiled body still took the host 13.5-15.6 ms per
32k-token batch against 18 ms of kernels, ``benchmarks/results/gpu_encode.md``), for at most
``granularity - 1`` padded tokens plus one per padding document. Why by hand: CUDA graphs (:mod:`.graph_replay`,
or torch.compile's ``mode="reduce-overhead"``) record one graph per distinct shape and pad nothing themselves.
"""
from __future__ import annotations

import numpy as np

__all__ = [
    "GRAPH_MAX_LEN_GRANULARITY",
    "GRAPH_TOKEN_GRANULARITY",
    "graph_key",
    "graph_max_len",
    "graph_shape",
    "padding_lengths",
]

#: token counts of graph batches are multiples of this: 64 buckets up to a 64k budget, at most 1.6 % padding
#: at that budget (plus one token per padding document)
GRAPH_TOKEN_GRANULARITY = 1024

#: the longest document varlen attention is told is rounded up to a multiple of this (FlashAttention's query block
#: of 128 rows: the kernel's grid is the same as for the exact length). Telling it the model's longest (512) instead
#: launched blocks for rows no document has: 5.94 against 3.50 ms of attention per 64k-token batch on an H200
#: (BERT-base shape, ``benchmarks/results/gpu_encode.md``)
GRAPH_MAX_LEN_GRANULARITY = 128


def graph_shape(tokens: int, docs: int, max_doc: int, granularity: int = GRAPH_TOKEN_GRANULARITY) -> tuple[int, int]:
    """``(tokens, documents)`` of the bucket a batch of ``tokens`` real tokens in ``docs`` documents is padded to.

    The document count is the next power of two above ``docs`` (one padding document at least); the token count
    the next multiple of ``granularity`` that gives every padding document at least one token; the document
    count doubles while the padding documents would need more than ``max_doc`` tokens each.
    """
    if tokens < 0 or docs < 0 or max_doc < 1 or granularity < 1:
        raise ValueError("tokens and docs must be >= 0, max_doc and granularity >= 1")
    n = 1 << int(docs).bit_length()  # > docs
    while True:
        extra = n - docs
        total = -(-(tokens + extra) // granularity) * granularity
        if -(-(total - tokens) // extra) <= max_doc:
            return total, n
        n *= 2


def graph_max_len(longest: int, max_doc: int, granularity: int = GRAPH_MAX_LEN_GRANULARITY) -> int:
    """The longest document a bucket is recorded for: ``longest`` (the batch's, padding documents included) rounded
    up to a multiple of ``granularity``, at most ``max_doc``; part of the bucket's key."""
    if longest > max_doc:
        raise ValueError(f"a document of {longest} tokens is over max_doc {max_doc}")
    return min(int(max_doc), -(-int(longest) // granularity) * granularity)


def graph_key(lengths: np.ndarray, max_doc: int, granularity: int = GRAPH_TOKEN_GRANULARITY) -> tuple[int, int, int]:
    """The bucket of a batch of documents of ``lengths``: ``(tokens, documents, longest)`` after its padding, the key
    its graph is captured and replayed under (:class:`.graph_replay.GraphReplay`)."""
    lengths = np.asarray(lengths)
    tokens, docs = int(lengths.sum()), len(lengths)
    shape = graph_shape(tokens, docs, max_doc, granularity)
    longest = max(int(lengths.max(initial=0)), int(padding_lengths(tokens, docs, shape).max()))
    return shape[0], shape[1], graph_max_len(longest, max_doc)


def padding_lengths(tokens: int, docs: int, shape: tuple[int, int]) -> np.ndarray:
    """Lengths of the padding documents that fill a batch of ``tokens`` in ``docs`` documents up to ``shape``:
    ``shape[1] - docs`` documents sharing ``shape[0] - tokens`` tokens as evenly as possible (each >= 1)."""
    total, n = shape
    extra, pad = n - docs, total - tokens
    if extra < 1 or pad < extra:
        raise ValueError(f"shape {shape} leaves no room for padding documents of >= 1 token")
    lengths = np.full(extra, pad // extra, dtype=np.int64)
    lengths[:pad % extra] += 1
    return lengths

