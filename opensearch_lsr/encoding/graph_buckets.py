"""Bucketed batch shapes, so that a compiled body can be replayed as a CUDA graph.

A CUDA graph replays fixed shapes; packed batches have a different token and document count each time. With
``compile="graphs"`` (:class:`~.packed.PackedMLM`) a batch is padded up to a bucket: the token count to a
multiple of ``granularity``, the document count to a power of two, and the longest document to the model's
longest (what varlen attention is told), so a corpus needs a handful of recorded graphs, not one per batch. The
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

__all__ = ["GRAPH_TOKEN_GRANULARITY", "graph_shape", "padding_lengths"]

#: token counts of graph batches are multiples of this: 64 buckets up to a 64k budget, at most 1.6 % padding
#: at that budget (plus one token per padding document)
GRAPH_TOKEN_GRANULARITY = 1024


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

