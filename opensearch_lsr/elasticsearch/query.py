"""Elasticsearch query side: the ``sparse_vector`` query, client-side query vectors, ``rrf`` hybrid, runs.

* :func:`sparse_vector_query` (8.15+; ``_types.query_dsl.SparseVectorQuery``): either
  ``inference_id`` + ``query`` (the cluster expands the text with the deployed model or endpoint)
  or ``query_vector`` (client-side tokens); ``prune`` + an always explicit ``pruning_config``
  (``tokens_freq_ratio_threshold`` a whole number in [1, 100], ``tokens_weight_threshold`` in [0, 1]).
* :func:`query_vector_for`: the inference-free IDF query side (the bundle's ``sparse_tokenize``
  tokenizer + ``idf.json``, computed exactly as for OpenSearch by
  :func:`~opensearch_lsr.encoding.query_tokens.tokenize_query`) or the encoder's own query vector,
  keys sanitised as the index expects.
* :func:`rrf_body`: BM25 ``match`` on the nori field + ``sparse_vector`` fused by the ``rrf``
  retriever (8.16+; Cormack et al., SIGIR 2009: ``score = sum 1 / (rank_constant + rank)``).

Scoring of ``sparse_vector`` is Lucene ``FeatureField.newLinearQuery``: ``sum q_t * d_t`` with the
document weight stored in 9 significant bits (``floatToIntBits(v) >>> 15``).
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .client import EsFeatures
from .keys import sanitize_features

__all__ = ["sparse_vector_query", "rrf_body", "check_rrf", "search_body", "query_vector_for", "run_queries"]


#: ``TokenPruningConfig`` defaults (``DEFAULT_TOKENS_FREQ_RATIO_THRESHOLD`` 5, ``DEFAULT_TOKENS_WEIGHT_THRESHOLD`` 0.4).
DEFAULT_PRUNING = {"tokens_freq_ratio_threshold": 5, "tokens_weight_threshold": 0.4}


def _pruning_config(tokens_freq_ratio_threshold: float | None, tokens_weight_threshold: float | None) -> dict | None:
    """The query's ``pruning_config``.

    ``TokenPruningConfig.fromXContent`` (the query parser) reads ``tokens_freq_ratio_threshold`` with
    ``parser.intValue()``: 2.5 would silently become 2, so a fractional value is refused and an integer sent
    (the mapping's ``index_options`` parser reads a float). elastic/elasticsearch
    ``server/src/main/java/org/elasticsearch/index/mapper/vectors/TokenPruningConfig.java``
    (``x-pack/plugin/core/.../ml/search/TokenPruningConfig.java`` before 8.19).
    """
    cfg: dict[str, Any] = {}
    if tokens_freq_ratio_threshold is not None:
        if not 1 <= tokens_freq_ratio_threshold <= 100:
            raise ValueError("[tokens_freq_ratio_threshold] must be between [1] and [100]")
        if float(tokens_freq_ratio_threshold) != int(tokens_freq_ratio_threshold):
            raise ValueError(f"tokens_freq_ratio_threshold must be a whole number in a query (Elasticsearch reads it "
                             f"as an integer, {tokens_freq_ratio_threshold} would become "
                             f"{int(tokens_freq_ratio_threshold)})")
        cfg["tokens_freq_ratio_threshold"] = int(tokens_freq_ratio_threshold)
    if tokens_weight_threshold is not None:
        if not 0 <= tokens_weight_threshold <= 1:
            raise ValueError("[tokens_weight_threshold] must be between 0 and 1")
        cfg["tokens_weight_threshold"] = float(tokens_weight_threshold)
    return cfg or None


def sparse_vector_query(field: str, *, query_vector: Mapping[str, float] | None = None,
                        inference_id: str | None = None, query: str | None = None, prune: bool | None = None,
                        tokens_freq_ratio_threshold: float | None = None, tokens_weight_threshold: float | None = None,
                        boost: float | None = None, name: str | None = None,
                        features: EsFeatures | None = None) -> dict[str, Any]:
    """A ``sparse_vector`` query clause.

    Exactly one of ``query_vector`` and ``inference_id`` (which needs ``query``).
    """
    if not field:
        raise ValueError("field must be a non-empty field name")
    if features is not None and not features.sparse_vector_query:
        raise ValueError(f"the sparse_vector query needs Elasticsearch 8.15+, the cluster runs {features.to_dict()['version']}")
    if (query_vector is None) == (inference_id is None):
        raise ValueError("pass exactly one of query_vector and inference_id")
    body: dict[str, Any] = {"field": field}
    if query_vector is not None:
        if query is not None:
            raise ValueError("query text goes with inference_id, not with query_vector")
        vec = sanitize_features(query_vector)
        if not vec:
            raise ValueError("query_vector is empty: the query has no token with a positive weight")
        body["query_vector"] = vec
    else:
        if not isinstance(query, str) or not query.strip():
            raise ValueError("inference_id needs a non-empty query text")
        body["inference_id"] = inference_id
        body["query"] = query
    cfg = _pruning_config(tokens_freq_ratio_threshold, tokens_weight_threshold)
    if prune or cfg:
        # always explicit: `prune: true` without `pruning_config` means the defaults on 8.15-8.18
        # (SparseVectorQueryBuilder) but no pruning at all in the 8.19 / 9.1 SparseVectorFieldType.
        # finalizeSparseVectorQuery (`pruningConfig = shouldPruneTokensFromQuery ? tokenPruningConfigFromQuery : null`)
        body["prune"] = True
        body["pruning_config"] = {**DEFAULT_PRUNING, **(cfg or {})}
    if boost is not None:
        body["boost"] = float(boost)
    if name is not None:
        body["_name"] = name
    return {"sparse_vector": body}


def search_body(query: dict[str, Any], size: int = 10, source: bool | Sequence[str] = False) -> dict[str, Any]:
    """A ``_search`` body with ``query``."""
    return {"query": query, "size": int(size), "_source": source if isinstance(source, bool) else list(source)}


def check_rrf(features: EsFeatures) -> None:
    """Refuse the ``rrf`` retriever where the cluster would: before 8.16 (GA) or without an Enterprise/trial
    licence (:attr:`~opensearch_lsr.elasticsearch.client.EsFeatures.rrf_licensed`; the server answers 403
    "current license is non-compliant for [Reciprocal Rank Fusion (RRF)]")."""
    if not features.rrf_retriever:
        raise ValueError(f"the rrf retriever needs Elasticsearch 8.16+, the cluster runs {features.to_dict()['version']}")
    if features.rrf_licensed is False:
        kind, status = features.license or ("?", "?")
        raise ValueError(f"the rrf retriever (--mode hybrid) needs an active Enterprise or trial licence; the cluster "
                         f"has a {status} {kind!r} licence (RRFRankPlugin: License.OperationMode.ENTERPRISE). Use "
                         "--mode tokens / model, or start a trial: POST _license/start_trial?acknowledge=true")


def rrf_body(text_field: str, text: str, sparse_clause: dict[str, Any], *, size: int = 10,
             rank_constant: int = 60, rank_window_size: int = 100,
             features: EsFeatures | None = None) -> dict[str, Any]:
    """BM25 ``match`` + ``sparse_vector`` fused by the ``rrf`` retriever (``rank_window_size >= size``)."""
    if features is not None:
        check_rrf(features)
    if rank_constant < 1:
        raise ValueError("[rank_constant] must be greater than or equal to [1]")
    if rank_window_size < size:
        raise ValueError(f"[rank_window_size] ({rank_window_size}) must be greater than or equal to [size] ({size})")
    return {"retriever": {"rrf": {"retrievers": [
        {"standard": {"query": {"match": {text_field: {"query": text}}}}},  # long form: the spec has no shorthand
        {"standard": {"query": sparse_clause}},
    ], "rank_constant": int(rank_constant), "rank_window_size": int(rank_window_size)}},
        "size": int(size), "_source": False}


def query_vector_for(text: str, model: str | os.PathLike, idf: Mapping[str, float] | None = None) -> dict[str, float]:
    """Client-side ``query_vector`` for ``text``: inference-free IDF tokens or the encoder's weights.

    ``model`` is a bundle dir / SPARSE_TOKENIZE zip (IDF side) or an encoder dir, as for OpenSearch's
    ``query_tokens`` (:func:`opensearch_lsr.encoding.query_tokens.query_tokens_for`, WORD keys), then
    sanitised (dots -> ``__``).
    """
    from ..encoding.query_tokens import query_tokens_for

    return sanitize_features(query_tokens_for(text, model, idf, key_format="word"))


def run_queries(search, index: str, queries: Mapping[str, dict[str, Any]], k: int = 100) -> dict[str, dict[str, float]]:
    """Run ``{qid: search body}`` through ``search(index, body)`` and return a ranx-style run."""
    run: dict[str, dict[str, float]] = {}
    for qid, body in queries.items():
        resp = search(index, dict(body, size=k))
        hits = resp["hits"]["hits"]
        run[qid] = {h["_id"]: float(h["_score"]) for h in hits}
    return run
