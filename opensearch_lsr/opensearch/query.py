"""OpenSearch's ``neural_sparse`` query DSL and client-side ``query_tokens``, by their historical names.

The builders live in :mod:`opensearch_lsr.engines.query_dsl` (the local engine evaluates the same
bodies) and the query-token functions in :mod:`opensearch_lsr.encoding.query_tokens` (Elasticsearch
builds its ``query_vector`` with them too); this module keeps the names importable from here.
"""
from __future__ import annotations

from ..encoding.query_tokens import cap_query_weights, query_tokens_for, tokenize_query, tokenize_query_ids
from ..engines.query_dsl import (bool_query, explain_contributions, filter_clauses, method_parameters, nested_query,
                                 neural_sparse_query, parse_version, search_body)

__all__ = [
    "tokenize_query",
    "tokenize_query_ids",
    "neural_sparse_query",
    "nested_query",
    "method_parameters",
    "cap_query_weights",
    "bool_query",
    "filter_clauses",
    "search_body",
    "parse_version",
    "query_tokens_for",
    "explain_contributions",
]
