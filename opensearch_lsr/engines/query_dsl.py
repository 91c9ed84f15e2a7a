"""The ``neural_sparse`` query language the toolkit sends: query clauses and ``_search`` bodies.

OpenSearch answers these bodies (neural-search's ``NeuralSparseQueryBuilder``; contract sections 4.2-4.4)
and the local engine evaluates the same bodies exactly as OpenSearch scores them, so the builders belong
to no engine. ``neural_sparse_query`` refuses combinations OpenSearch rejects and features a cluster
version does not have. Elasticsearch speaks its own ``sparse_vector`` query
(:mod:`opensearch_lsr.elasticsearch.query`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ..contract import MAX_QUERY_WEIGHT
from .versions import as_version as parse_version

__all__ = [
    "neural_sparse_query",
    "nested_query",
    "method_parameters",
    "bool_query",
    "filter_clauses",
    "search_body",
    "parse_version",
    "explain_contributions",
]


def method_parameters(k: int | None = None, top_n: int | None = None, heap_factor: float | None = None,
                      filter: Mapping[str, Any] | None = None) -> dict[str, Any]:  # noqa: A002 - the DSL's name
    """``neural_sparse.method_parameters`` of a SEISMIC (``sparse_vector``) search, validated like
    neural-search's ``SparseAnnQueryBuilder.fromXContent`` (3.3.0.0): ``k`` hits per shard and
    ``top_n`` query tokens kept (positive integers, default 10 each), ``heap_factor`` (positive, default
    1.0), ``filter`` (a query clause applied inside the ANN search). Only the given keys are sent.
    """
    out: dict[str, Any] = {}
    for key, value in (("k", k), ("top_n", top_n)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"method_parameters.{key} must be a positive integer, got {value!r}")
        out[key] = value
    if heap_factor is not None:
        if isinstance(heap_factor, bool) or not isinstance(heap_factor, (int, float)) or not heap_factor > 0:
            raise ValueError(f"method_parameters.heap_factor must be a positive number, got {heap_factor!r}")
        out["heap_factor"] = float(heap_factor)
    if filter is not None:
        if not isinstance(filter, Mapping) or len(filter) != 1:
            raise ValueError("method_parameters.filter must be one query clause, e.g. {\"term\": {\"lang\": \"ko\"}}")
        out["filter"] = dict(filter)
    return out


def neural_sparse_query(
    field: str,
    *,
    query_text: str | None = None,
    model_id: str | None = None,
    query_tokens: Mapping[str, float] | None = None,
    analyzer: str | None = None,
    boost: float | None = None,
    name: str | None = None,
    version: str | Sequence[int] | None = None,
    method_params: Mapping[str, Any] | None = None,
) -> dict:
    """A ``neural_sparse`` query clause (contract §4.2, §4.3).

    Exactly one of ``query_text`` (with ``model_id``, ``analyzer``, or neither: the cluster default
    model/analyzer) and ``query_tokens``. ``version`` (the cluster's) refuses what it lacks:
    ``query_tokens`` < 2.14, ``analyzer`` < 3.1, a missing ``model_id`` < 2.13, ``method_params``
    < 3.3. ``method_params`` (see :func:`method_parameters`) only act on a ``sparse_vector`` field:
    without them OpenSearch 3.3 scores a SEISMIC field exactly, while 3.4+ applies its defaults
    (k 10, top_n 10; neural-search ``NeuralSparseQueryBuilder`` at 3.3.0.0 vs 3.4.0.0).
    """
    if not field:
        raise ValueError("field must be a non-empty field name")
    if (query_text is None) == (query_tokens is None):
        raise ValueError("pass exactly one of query_text and query_tokens")
    if model_id is not None and analyzer is not None:
        raise ValueError("model_id and analyzer cannot be used together in a neural_sparse query")
    if query_tokens is not None and (model_id is not None or analyzer is not None):
        raise ValueError("query_tokens are sent as they are: do not combine them with model_id or analyzer")
    ver = parse_version(version)
    body: dict[str, Any] = {}
    if query_tokens is not None:
        if ver is not None and ver < (2, 14, 0):
            raise ValueError(f"query_tokens needs OpenSearch >= 2.14 (cluster is {'.'.join(map(str, ver))})")
        tokens = {}
        for key, value in query_tokens.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"query token keys must be non-empty strings, got {key!r}")
            w = float(value)
            if not (0.0 < w <= MAX_QUERY_WEIGHT):
                raise ValueError(f"weight must be in (0, 64.0], got: {w} (token {key!r})")
            tokens[key] = w
        if not tokens:
            raise ValueError("query_tokens is empty: the query has no token with a positive weight")
        body["query_tokens"] = tokens
    else:
        if not isinstance(query_text, str) or not query_text.strip():
            raise ValueError("query_text must be a non-empty string")
        body["query_text"] = query_text
        if model_id is not None:
            body["model_id"] = model_id
        elif analyzer is not None:
            if ver is not None and ver < (3, 1, 0):
                raise ValueError(f"analyzer needs OpenSearch >= 3.1 (cluster is {'.'.join(map(str, ver))})")
            body["analyzer"] = analyzer
        elif ver is not None and ver < (2, 13, 0):
            raise ValueError("model_id is required before OpenSearch 2.13 (no default model)")
    if method_params:
        if ver is not None and ver < (3, 3, 0):
            raise ValueError(f"method_parameters need OpenSearch >= 3.3 (cluster is {'.'.join(map(str, ver))})")
        body["method_parameters"] = method_parameters(**dict(method_params))
    if boost is not None:
        body["boost"] = float(boost)
    if name is not None:
        body["_name"] = name
    return {"neural_sparse": {field: body}}


def nested_query(path: str, query: dict, score_mode: Literal["max", "avg", "sum", "min"] = "max") -> dict:
    """Wrap ``query`` for documents split into nested passages (``lsr-os index --long-text split``):
    the document scores as its best passage (``max``; OpenSearch's own default is ``avg``)."""
    if score_mode not in ("max", "avg", "sum", "min"):
        raise ValueError(f"score_mode must be one of max, avg, sum, min, got {score_mode!r}")
    return {"nested": {"path": path, "query": query, "score_mode": score_mode}}


def bool_query(must: Sequence[dict] | dict, filters: Mapping[str, Any] | Sequence[dict] | None = None) -> dict:
    """Scoring clauses that must all match, plus non-scoring ``filter`` clauses.

    The scoring clauses go under ``bool.should`` with ``minimum_should_match`` = their number (the
    same matches and scores as ``must``) because neural-search's two-phase processor only rewrites a
    ``neural_sparse`` that is the query itself or sits under ``bool.should``
    (``NeuralSparseTwoPhaseProcessor.collectNeuralQueryBuilderWithSparseEmbedding``, 2.15.0.0 to
    3.8.0.0): under ``must`` a two-phase pipeline would silently do nothing.
    ``filters`` may be ``{field: value}`` (a ``term`` per field, a ``terms`` for lists) or clauses.
    """
    must_list = [must] if isinstance(must, dict) else list(must)
    if not filters:
        return must_list[0] if len(must_list) == 1 else {"bool": {"should": must_list,
                                                                  "minimum_should_match": len(must_list)}}
    return {"bool": {"should": must_list, "minimum_should_match": len(must_list), "filter": filter_clauses(filters)}}


def filter_clauses(filters: Mapping[str, Any] | Sequence[dict]) -> list[dict]:
    """``{field: value}`` -> a ``term`` per field (``terms`` for lists); a list of clauses stays as it is."""
    if isinstance(filters, Mapping):
        return [{"terms": {k: list(v)}} if isinstance(v, (list, tuple)) else {"term": {k: v}}
                for k, v in filters.items()]
    return list(filters)


def search_body(
    query: dict,
    size: int = 10,
    from_: int = 0,
    source: bool | Sequence[str] | Mapping[str, Any] | None = None,
    explain: bool = False,
) -> dict:
    """A ``_search`` request body."""
    body: dict[str, Any] = {"query": query, "size": int(size)}
    if from_:
        body["from"] = int(from_)
    if source is not None:
        body["_source"] = source if isinstance(source, (bool, Mapping)) else list(source)
    if explain:
        body["explain"] = True
    return body


def explain_contributions(hit: Mapping[str, Any]) -> list[tuple[str, float]]:
    """``[(token, contribution), ...]`` from a hit's ``_explanation`` (local backend or OpenSearch's
    ``FeatureQuery`` explanations: "... for the <token> feature ...")."""
    import re

    out: list[tuple[str, float]] = []

    def walk(node: Mapping[str, Any]) -> None:
        m = re.search(r"for the (.+?) feature", node.get("description", ""))
        if m:
            out.append((m.group(1), float(node.get("value", 0.0))))
            return
        for child in node.get("details", []) or []:
            walk(child)

    if hit.get("_explanation"):
        walk(hit["_explanation"])
    return sorted(out, key=lambda kv: -kv[1])
