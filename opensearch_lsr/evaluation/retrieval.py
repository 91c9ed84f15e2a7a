"""In-memory exact sparse retrieval for evaluation: encode with a ``SparseEncoder``, score Q @ D^T.

Scores are the dot product of query and document weights, as OpenSearch ``neural_sparse`` on
``rank_features`` computes them. Special-token dimensions are zeroed, as the exported OpenSearch
model does (ML Commons drops them anyway: their single-id decode is empty).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
import torch

from ..encoding.keyed import encode_to_csr
from .datasets import BeirDataset
from .metrics import evaluate_run

__all__ = ["top_k_run", "evaluate_encoder", "sparsity_stats"]


def top_k_run(
    queries: sp.csr_matrix,
    docs: sp.csr_matrix,
    query_ids: Sequence[str],
    doc_ids: Sequence[str],
    k: int = 100,
    block: int = 256,
) -> dict[str, dict[str, float]]:
    """Exact top-k by sparse matrix product, in query blocks to bound memory.

    Dense-ish vectors (badly initialised models activate most of the vocabulary) make sparse x sparse
    products crawl; above 5% density the same sums are computed as a dense float32 product.
    """
    run: dict[str, dict[str, float]] = {}
    density = docs.nnz / max(1, docs.shape[0] * docs.shape[1])
    dense_docs_t = torch.from_numpy(docs.T.toarray().astype(np.float32)) if density > 0.05 else None
    docs_t = docs.T.tocsc()
    for start in range(0, queries.shape[0], block):
        if dense_docs_t is not None:
            q = torch.from_numpy(queries[start:start + block].toarray().astype(np.float32))
            scores = (q @ dense_docs_t).numpy()
        else:
            scores = (queries[start:start + block] @ docs_t).toarray()
        kk = min(k, scores.shape[1])
        if kk == 0:
            break
        top = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
        for row, cols in enumerate(top):
            qid = query_ids[start + row]
            run[qid] = {doc_ids[c]: float(scores[row, c]) for c in cols if scores[row, c] > 0}
    return run


def sparsity_stats(queries: sp.csr_matrix, docs: sp.csr_matrix) -> dict[str, float]:
    """Average active dimensions and FLOPS (SPLADE, Formal et al. 2021: sum_j p_q(j) p_d(j), where
    p(j) is the share of queries/documents with a nonzero weight on token j)."""
    q_active = np.diff(queries.indptr).mean() if queries.shape[0] else 0.0
    d_active = np.diff(docs.indptr).mean() if docs.shape[0] else 0.0
    pq = np.asarray((queries != 0).mean(axis=0)).ravel() if queries.shape[0] else 0.0
    pd = np.asarray((docs != 0).mean(axis=0)).ravel() if docs.shape[0] else 0.0
    flops = float(np.sum(pq * pd))
    return {"query_active_dims": float(q_active), "doc_active_dims": float(d_active), "flops": flops}


def evaluate_encoder(
    encoder,
    dataset: BeirDataset,
    batch_size: int = 32,
    k: int = 100,
    query_encoder=None,
    show_progress_bar: bool = False,
) -> dict[str, float]:
    """Encode corpus and queries, retrieve exactly, return MRR@10, nDCG@10, Recall@100 + sparsity."""
    doc_ids = list(dataset.corpus)
    qids = list(dataset.queries)
    docs = encode_to_csr(encoder, [dataset.corpus[d] for d in doc_ids], "document", batch_size, show_progress_bar)
    queries = encode_to_csr(query_encoder or encoder, [dataset.queries[q] for q in qids], "query", batch_size)
    run = top_k_run(queries, docs, qids, doc_ids, k=k)
    result = evaluate_run(dataset.qrels, run)
    result.update(sparsity_stats(queries, docs))
    return result
