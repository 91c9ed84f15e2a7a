"""Token-budgeted batches: as many documents per forward pass as a token budget allows.

Count-based batches (``batch_size`` texts) either waste a GPU on short texts or overflow it on long
ones, and padding to the longest text of a batch computes tokens that carry nothing. Here a batch is a
run of length-sorted documents whose cost stays within ``max_batch_tokens``: the sum of their lengths
for packed batches (no padding at all), ``count x longest`` for padded ones. Sorting happens inside a
window of documents that the caller chooses independently of how the corpus is chunked; every batch
carries the documents' positions so the caller restores input order.
"""
from __future__ import annotations

import numpy as np

__all__ = ["token_budget_batches", "default_max_batch_tokens"]


def default_max_batch_tokens(device_type: str) -> int:
    """Tokens per forward pass: 64k on a GPU (on an H200, BERT-base peaks at 3.6 GB and SPLADE-tiny runs 14 %
    faster than at 32k: ``benchmarks/results/gpu_encode.md``), 4k on CPU (cache-friendly, the padded path's
    32 x ~128)."""
    return 65_536 if device_type == "cuda" else 4_096


def token_budget_batches(lengths: np.ndarray, max_batch_tokens: int, *, padded: bool = False,
                         max_batch_docs: int | None = None) -> list[np.ndarray]:
    """Split documents into batches of ascending length within a token budget.

    Args:
        lengths: tokens per document (special tokens included).
        max_batch_tokens: the budget: sum of lengths (packed) or ``count x max length`` (``padded``).
            A document longer than the budget forms a batch of its own.
        padded: budget padded batches instead of packed ones.
        max_batch_docs: an optional cap on documents per batch.

    Returns:
        Index arrays into ``lengths``, each sorted by length; together every index exactly once.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if max_batch_tokens < 1:
        raise ValueError("max_batch_tokens must be >= 1")
    if max_batch_docs is not None and max_batch_docs < 1:
        raise ValueError("max_batch_docs must be >= 1")
    order = np.argsort(lengths, kind="stable")
    sorted_lens = lengths[order]
    n = len(order)
    cap = max_batch_docs or n
    batches: list[np.ndarray] = []
    start = 0
    if padded:
        while start < n:
            # ascending lengths: the last document of a batch is its longest, so count x last <= budget
            end = start + 1
            while end < n and end - start < cap and (end - start + 1) * sorted_lens[end] <= max_batch_tokens:
                end += 1
            batches.append(order[start:end])
            start = end
        return batches
    cum = np.concatenate([[0], np.cumsum(sorted_lens)])
    while start < n:
        end = int(np.searchsorted(cum, cum[start] + max_batch_tokens, side="right")) - 1
        end = min(max(end, start + 1), start + cap, n)
        batches.append(order[start:end])
        start = end
    return batches
