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

A batch whose own bucket has no graph yet may instead be padded up to a larger bucket that has one
(:func:`larger_bucket`), as vLLM pads a batch to the next captured size (``cudagraph_capture_sizes`` and
``bs_to_padded_graph_size`` of ``CompilationConfig``, ``vllm/config/compilation.py``):
the padding costs device time, a batch without a graph costs the host one launch per kernel. A warm-up captures,
besides the shapes it meets, the few buckets any batch of the budget fits (:func:`catch_all_buckets`).
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = [
    "GRAPH_MAX_LEN_GRANULARITY",
    "GRAPH_TOKEN_GRANULARITY",
    "catch_all_buckets",
    "graph_key",
    "graph_max_len",
    "graph_shape",
    "larger_bucket",
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


def larger_bucket(lengths: np.ndarray, buckets: Iterable[tuple[int, int, int]],
                  max_tokens: float) -> tuple[int, int, int] | None:
    """The smallest of ``buckets`` (``(tokens, documents, longest)`` keys, :func:`graph_key`) that a batch of
    documents of ``lengths`` can be padded up to, with at most ``max_tokens`` tokens; ``None`` if none fits.

    A bucket fits when it has more documents than the batch, room for at least one token per padding document,
    a ``longest`` that the batch's longest document and the padding documents (sharing the extra tokens evenly,
    :func:`padding_lengths`) stay within.
    """
    lengths = np.asarray(lengths)
    tokens, docs, longest = int(lengths.sum()), len(lengths), int(lengths.max(initial=0))
    fits = [key for key in buckets
            if key[1] > docs and key[0] - tokens >= key[1] - docs and key[2] >= longest
            and -(-(key[0] - tokens) // (key[1] - docs)) <= key[2] and key[0] <= max_tokens]
    return min(fits) if fits else None


#: :func:`catch_all_buckets` go up to this many documents (a 64k-token batch of them averages 32 tokens a document)
CATCH_ALL_MOST_DOCS = 2048


def catch_all_buckets(max_tokens: int, max_doc: int, most_docs: int = CATCH_ALL_MOST_DOCS,
                      granularity: int = GRAPH_TOKEN_GRANULARITY) -> list[tuple[int, int, int]]:
    """Buckets for batches of at most ``max_tokens`` tokens to be padded up to (:func:`larger_bucket`) when their own
    has no graph: a token bucket above the budget, the longest document the model takes, and each power of two of
    documents from the fewest that can hold those tokens (one document of one token and padding documents of at most
    ``max_doc``) up to ``most_docs`` (random batches of up to ``most_docs / 2`` documents within budgets of 1k-64k
    tokens all fit one: ``tests/encoding/test_packed.py``). The varlen attention of a batch padded up to one is told
    the longest ``max_doc``: on an H200 5.94 against 3.50 ms per 64k-token BERT-base batch at its own rounded length
    (:data:`GRAPH_MAX_LEN_GRANULARITY`), against about 40 ms of host time for a batch without a graph in a job."""
    if max_tokens < 1 or max_doc < 1 or most_docs < 2:
        raise ValueError("max_tokens and max_doc must be >= 1, most_docs >= 2")
    tokens = (-(-max_tokens // granularity) + 1) * granularity
    longest = graph_max_len(max_doc, max_doc)
    docs = 1 << max(1, (-(-(tokens - 1) // longest)).bit_length())  # > (tokens - 1) / longest padding documents
    return [(tokens, n, longest) for n in (docs << k for k in range(32)) if n <= most_docs] or [(tokens, docs, longest)]
