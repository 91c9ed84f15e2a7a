"""Effectiveness against efficiency: a sweep of document-side pruning levels.

Pruning follows neural-search's ``max_ratio`` rule (``prune_type: max_ratio`` in the
``sparse_encoding`` processor, opensearch-contract.md §4.1): per document keep the weights
``w >= ratio * max(w)``. Each level is scored exactly as the local backend / OpenSearch would
(document weights truncated to Lucene's 9 significant bits), and reports the SPLADE FLOPS
(Formal et al. 2021) next to MRR@10, nDCG@10 and Recall@100.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from ..contract import truncate_feature_values
from .metrics import evaluate_run
from .retrieval import sparsity_stats, top_k_run

__all__ = ["DEFAULT_LEVELS", "prune_max_ratio", "truncate_csr", "prune_sweep"]

logger = logging.getLogger(__name__)

#: max_ratio levels swept by default (0 = unpruned).
DEFAULT_LEVELS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)


def prune_max_ratio(mat: sp.csr_matrix, ratio: float) -> sp.csr_matrix:
    """Keep, per row, the entries ``w >= ratio * max(row)`` (neural-search ``max_ratio``)."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"max_ratio must be in [0, 1), got {ratio}")
    mat = sp.csr_matrix(mat, copy=True)
    if ratio == 0.0 or mat.nnz == 0:
        return mat
    lengths = np.diff(mat.indptr)
    row_max = np.zeros(mat.shape[0], dtype=mat.data.dtype)
    nonempty = lengths > 0
    row_max[nonempty] = np.maximum.reduceat(mat.data, mat.indptr[:-1][nonempty])
    thresholds = np.repeat(row_max * ratio, lengths)
    mat.data[mat.data < thresholds] = 0
    mat.eliminate_zeros()
    return mat


def truncate_csr(mat: sp.csr_matrix) -> sp.csr_matrix:
    """Document weights as Lucene stores them (9 significant bits)."""
    out = sp.csr_matrix(mat, dtype=np.float32, copy=True)
    out.data = truncate_feature_values(out.data)
    return out


def prune_sweep(
    queries: sp.csr_matrix,
    docs: sp.csr_matrix,
    query_ids: Sequence[str],
    doc_ids: Sequence[str],
    qrels: Mapping[str, Mapping[str, int]],
    levels: Sequence[float] = DEFAULT_LEVELS,
    k: int = 100,
) -> list[dict[str, float]]:
    """One row per level: ``{"max_ratio", "mrr@10", "ndcg@10", "recall@100", "flops",
    "query_active_dims", "doc_active_dims"}``."""
    rows = []
    for level in levels:
        pruned = truncate_csr(prune_max_ratio(docs, float(level)))
        run = top_k_run(queries, pruned, query_ids, doc_ids, k=k)
        row = {"max_ratio": float(level), **evaluate_run(qrels, run), **sparsity_stats(queries, pruned)}
        logger.info("max_ratio %.2f: %s", level, row)
        rows.append(row)
    return rows
