"""The ``match`` and ``hybrid`` queries of the local backend, and the request bodies for them.

``match`` (OpenSearch ``MatchQueryBuilder`` -> Lucene ``QueryBuilder``): the query text goes through the
field's search analyzer; each token is a ``TermQuery`` clause (SHOULD for ``operator: or``, MUST for
``and``), ``minimum_should_match`` counts clauses, the score is the sum of the matching clauses' BM25
scores times ``boost`` (:class:`~opensearch_lsr.lexical.bm25.LuceneBM25`). A query with no token matches
nothing (``zero_terms_query: none``, the default). A MIXED nori stream is a token graph (the compound
spans its parts): as OpenSearch's ``MatchQuery.analyzeGraphBoolean`` does, each span becomes one clause
whose alternatives are the compound's term and the exact phrase of its parts (positions are indexed).
(Stacked tokens of equal length would be a ``SynonymQuery``; nori does not produce them, and they are
scored as alternatives here.)

``hybrid`` (neural-search ``HybridQueryBuilder``, 1-5 sub-queries, optional ``pagination_depth`` and
``filter``): each sub-query is evaluated on its own, contributes its top ``pagination_depth`` (else
``from + size``; ``from > 0`` without ``pagination_depth`` is rejected as upstream) hits, and the search
pipeline's processor fuses them (:mod:`opensearch_lsr.lexical.fusion`). The total is the number of
documents any sub-query matched.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import LsrError
from .bm25 import LuceneBM25, top_rows
from .fusion import MAX_SUB_QUERIES, HybridFusion

__all__ = ["MatchQuery", "QueryParseError", "parse_match", "match_clause", "query_graph", "hybrid_hits",
           "match_query", "hybrid_query", "MATCH_PARAMETERS"]

#: ``match`` parameters the local backend honours.
MATCH_PARAMETERS = {"query", "operator", "minimum_should_match", "boost", "_name", "zero_terms_query", "analyzer"}


class QueryParseError(LsrError, ValueError):
    """A ``match``/``hybrid`` body the server would reject (``parsing_exception`` wording)."""

    error_type = "parsing_exception"


@dataclass(frozen=True)
class MatchQuery:
    """A parsed ``match`` clause."""

    field: str
    query: str
    operator: str = "or"
    minimum_should_match: Any = None
    boost: float = 1.0


def parse_match(spec: Any) -> MatchQuery:
    """``{"<field>": "text"}`` or ``{"<field>": {"query": ..., "operator": ..., ...}}``."""
    if not isinstance(spec, Mapping) or len(spec) != 1:
        raise QueryParseError("[match] query doesn't support multiple fields, found [" +
                              ", ".join(map(str, spec)) + "]" if isinstance(spec, Mapping) else
                              "[match] query malformed, no start_object after query name")
    (field, value), = spec.items()
    if not isinstance(value, Mapping):
        return MatchQuery(field, str(value))
    unknown = sorted(set(value) - MATCH_PARAMETERS)
    if unknown:
        raise QueryParseError(f"[match] query does not support [{unknown[0]}] on the local backend (supported: "
                              f"{', '.join(sorted(MATCH_PARAMETERS))})")
    if "query" not in value:
        raise QueryParseError(f"[match] requires query value for field [{field}]")
    operator = str(value.get("operator", "or")).lower()
    if operator not in ("or", "and"):
        raise QueryParseError(f"[match] operator must be or/and, got [{operator}]")
    if str(value.get("zero_terms_query", "none")).lower() != "none":
        raise QueryParseError("[match] zero_terms_query other than none is not supported by the local backend")
    return MatchQuery(field, str(value["query"]), operator, value.get("minimum_should_match"),
                      float(value.get("boost", 1.0)))


def _min_should(msm: Any, n: int) -> int:
    """``Queries.calculateMinShouldMatch``: an integer, a percentage, negative forms (conditional forms unsupported)."""
    if msm is None:
        return 0
    text = str(msm).strip()
    try:
        if text.endswith("%"):
            calc = np.float32(n * int(text[:-1])) * np.float32(1 / 100)
            value = n + int(calc) if calc < 0 else int(calc)
        else:
            calc_i = int(text)
            value = n + calc_i if calc_i < 0 else calc_i
    except ValueError:
        raise QueryParseError(f"minimum_should_match [{msm}] is not supported by the local backend "
                              "(use an integer or a percentage)") from None
    return max(0, value)  # more than the clause count matches nothing, as in Lucene


def query_graph(tokens: Sequence[Any]) -> list[list[list[tuple[str, int]]]] | None:
    """OpenSearch ``MatchQuery.analyzeGraphBoolean`` for a token graph (MIXED decompounding).

    Returns the positional clauses, each a list of alternative paths of ``(term, position)``: a
    one-term path is a ``TermQuery``, a longer one a ``PhraseQuery`` (``auto_generate_synonyms_phrase_query``
    defaults to true for fields with positions), the alternatives a SHOULD ``newGraphSynonymQuery``.
    ``None`` when the stream is flat (no stacked token), where plain term clauses apply.
    """
    if not any(t.position_increment == 0 or t.position_length > 1 for t in tokens):
        return None
    spans, pos = [], -1
    for t in tokens:
        pos = max(pos + t.position_increment, 0)
        spans.append((pos, pos + max(t.position_length, 1), t.term))
    spans.sort(key=lambda x: (x[0], -x[1]))
    segments: list[list[tuple[int, int, str]]] = []
    end = -1
    for span in spans:  # split at articulation points: no token spans across them
        if not segments or span[0] >= end:
            segments.append([])
        segments[-1].append(span)
        end = max(end, span[1])
    clauses = []
    for seg in segments:
        seg_end = max(e for _, e, _ in seg)

        def paths(p: int) -> list[list[tuple[str, int]]]:
            if p >= seg_end:
                return [[]]
            here = [(e, term) for s_, e, term in seg if s_ == p]
            if not here:  # a hole left by a removed token: continue at the next start
                later = [s_ for s_, _, _ in seg if s_ > p]
                return paths(min(later)) if later else [[]]
            return [[(term, p), *rest] for e, term in here for rest in paths(e)]

        clauses.append([path for path in paths(seg[0][0]) if path])
    return clauses


def match_clause(bm25: LuceneBM25, match: MatchQuery, analyzer: Any | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(mask, float64 scores)`` over the index rows for one parsed ``match`` query.

    ``analyzer``: the field's search analyzer when it differs from the index analyzer.
    """
    tokens = (analyzer or bm25.analyzer).tokens(match.query)
    n = len(bm25)
    if not tokens:
        return np.zeros(n, bool), np.zeros(n, np.float64)
    graph = query_graph(tokens)
    if graph is not None:
        return _graph_clause(bm25, match, graph)
    terms = [t.term for t in tokens]
    counts: dict[str, int] = {}
    for t in terms:
        counts[t] = counts.get(t, 0) + 1
    required = len(terms) if match.operator == "and" else _min_should(match.minimum_should_match, len(terms))
    acc = np.zeros(n, np.float64)
    matched = np.zeros(n, np.int64)
    for term, reps in counts.items():
        rows, s = bm25.term_scores(term, match.boost * reps)
        acc[rows] += s
        matched[rows] += reps
    mask = matched >= max(required, 1)
    # DisjunctionSumScorer sums in double, returns float
    return mask, np.where(mask, acc.astype(np.float32), 0.0).astype(np.float64)


def _graph_clause(bm25: LuceneBM25, match: MatchQuery, graph: list[list[list[tuple[str, int]]]]
                  ) -> tuple[np.ndarray, np.ndarray]:
    n = len(bm25)
    acc = np.zeros(n, np.float64)
    matched = np.zeros(n, np.int64)
    for alternatives in graph:
        seg_hit = np.zeros(n, bool)
        for path in alternatives:
            if len(path) == 1:
                rows, s = bm25.term_scores(path[0][0], match.boost)
            else:
                rows, s = bm25.phrase_scores(path, match.boost)
            acc[rows] += s
            seg_hit[rows] = True
        matched += seg_hit
    required = len(graph) if match.operator == "and" else _min_should(match.minimum_should_match, len(graph))
    mask = matched >= max(required, 1)
    return mask, np.where(mask, acc.astype(np.float32), 0.0).astype(np.float64)


def hybrid_hits(spec: Any, evaluate: Callable[[Any], tuple[np.ndarray, np.ndarray | None]],
                fusion: HybridFusion | None, size: int, from_: int = 0
                ) -> tuple[list[tuple[int, float]], int, float | None]:
    """Run a ``hybrid`` query: ``([(row, fused score)] of the requested page, total hits, max score)``.

    Args:
        spec: the body of ``{"hybrid": spec}``.
        evaluate: ``query -> (mask, scores)`` over the index rows (the local query evaluator).
        fusion: the search pipeline's fusion (``None``: no pipeline, rejected like the server does).
    """
    if not isinstance(spec, Mapping) or not isinstance(spec.get("queries"), list):
        raise QueryParseError("[hybrid] requires 'queries' field with at least one clause")
    unknown = sorted(set(spec) - {"queries", "pagination_depth", "filter", "boost", "_name"})
    if unknown:
        raise QueryParseError(f"[hybrid] query does not support [{unknown[0]}]")
    queries = spec["queries"]
    if not queries:
        raise QueryParseError("[hybrid] requires 'queries' field with at least one clause")
    if len(queries) > MAX_SUB_QUERIES:
        raise QueryParseError("Number of sub-queries exceeds maximum supported by [hybrid] query")
    if fusion is None:
        raise QueryParseError("a [hybrid] query needs a search pipeline with a normalization-processor or "
                              "score-ranker-processor (pass search_pipeline)")
    depth = spec.get("pagination_depth")
    if depth is None and from_ > 0:
        raise QueryParseError("pagination_depth param is missing in the search request")
    if depth is not None and (not isinstance(depth, int) or depth < 1):
        raise QueryParseError("pagination_depth should be greater than 0")
    window = int(depth) if depth is not None else size
    filt = spec.get("filter")
    subs: list[list[tuple[int, float]]] = []
    union = None
    for q in queries:
        query = {"bool": {"must": [q], "filter": [filt]}} if filt is not None else q
        mask, scores = evaluate(query)
        scores32 = (scores if scores is not None else np.ones(len(mask))).astype(np.float32)
        rows = np.flatnonzero(mask)
        union = mask.copy() if union is None else union | mask
        top = top_rows(rows, scores32, window) if window > 0 else rows[:0]
        subs.append([(int(r), float(scores32[r])) for r in top])
    fused = fusion.fuse(subs, size=from_ + size)
    total = int(union.sum()) if union is not None else 0
    return fused[from_:from_ + size], total, (fused[0][1] if fused else None)


def match_query(field: str, text: str, **params: Any) -> dict[str, Any]:
    """``{"match": {field: text}}``, or with parameters (``operator``, ``boost``, ...)."""
    return {"match": {field: {"query": text, **params} if params else text}}


def hybrid_query(queries: Sequence[Mapping[str, Any]], pagination_depth: int | None = None) -> dict[str, Any]:
    """``{"hybrid": {"queries": [...]}}`` (sub-queries in the order the pipeline's weights follow)."""
    if not 1 <= len(queries) <= MAX_SUB_QUERIES:
        raise QueryParseError(f"a hybrid query takes 1 to {MAX_SUB_QUERIES} sub-queries, got {len(queries)}")
    body: dict[str, Any] = {"queries": [dict(q) for q in queries]}
    if pagination_depth is not None:
        body["pagination_depth"] = int(pagination_depth)
    return {"hybrid": body}

