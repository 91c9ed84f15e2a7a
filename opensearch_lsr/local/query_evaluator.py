"""The query DSL of the local backend: one evaluator, one method per query type.

Supported: ``neural_sparse`` (``query_tokens``, or ``query_text`` with a ``model_id``/``analyzer``),
``match`` (text fields, Lucene BM25: :mod:`opensearch_lsr.lexical`), ``bool`` (must/filter/should/must_not, ``minimum_should_match``), ``match_all``, ``term`` (filter
context), ``terms``, ``ids``, ``exists``. Add a query type as a ``query_<type>`` method of
:class:`QueryEvaluator`. Request validation and error strings follow OpenSearch (contract §4.2).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from ..contract import MAX_QUERY_WEIGHT
from .errors import LocalIndexError
from .view import LiveView

__all__ = ["QueryEvaluator", "SearchTarget", "Clause", "QueryEncoder", "NEURAL_SPARSE_FIELDS"]

#: ``text -> {token: weight}``: what a ``model_id`` or an ``analyzer`` does to ``query_text``.
QueryEncoder = Callable[[str], Mapping[str, float]]
#: ``(match mask, scores or None)`` over the rows of a :class:`LiveView`.
Clause = tuple[np.ndarray, "np.ndarray | None"]

#: Parameters a ``neural_sparse`` clause accepts.
NEURAL_SPARSE_FIELDS = {"query_text", "model_id", "query_tokens", "analyzer", "max_token_score", "boost",
                        "_name", "method_parameters"}


class SearchTarget(Protocol):
    """What the evaluator needs from the index it searches."""

    def field_type(self, field: str) -> str:
        """The mapped type of ``field`` (``keyword`` when unmapped)."""

    def check_vector_field(self, field: str) -> None:
        """Raise unless ``field`` is a vector (``rank_features``) field."""

    def query_encoder(self, model_id: str) -> QueryEncoder:
        """The encoder registered as ``model_id``."""

    def analyzer(self, name: str) -> QueryEncoder:
        """The analyzer registered as ``name``."""

    def text_bm25(self, field: str, analyzer: str | None = None) -> tuple[Any, Any]:
        """``(LuceneBM25 over the live rows, search analyzer)`` of a ``text`` field (``match``)."""


class QueryEvaluator:
    """Evaluates one ``_search`` query over every live document of a :class:`LiveView` at once.

    Each query type is one method ``query_<type>(spec, scoring) -> (match, score)``: ``match`` a
    boolean mask over the view's rows, ``score`` float64 scores (``None`` in filter context, when
    ``scoring`` is false). :meth:`evaluate` dispatches on the query's single key, so a new query type
    is one new method. Scores follow Lucene: ``bool`` sums its scoring clauses, ``neural_sparse``
    is ``boost * sum_t q_t * stored(d_t)`` with 9-bit stored document weights.
    """

    def __init__(self, target: SearchTarget, view: LiveView, explain: bool = False):
        self.target = target
        self.view = view
        self.n = len(view)
        self.explain = explain
        self.sparse_clauses: list[tuple[str, dict[str, float], float]] = []

    @classmethod
    def supported_queries(cls) -> list[str]:
        """The query types this evaluator answers (its ``query_<type>`` methods)."""
        return sorted(name[len("query_"):] for name in dir(cls) if name.startswith("query_"))

    def evaluate(self, query: Any, scoring: bool) -> Clause:
        """``(match, score)`` of one query object ``{"<type>": spec}``."""
        if not isinstance(query, dict) or len(query) != 1:
            raise LocalIndexError("query malformed, must start with start_object" if not isinstance(query, dict)
                                  else "[_na] query malformed, no start_object after query name", "parsing_exception")
        (kind, spec), = query.items()
        handler = getattr(self, f"query_{kind}", None)
        if handler is None:
            raise LocalIndexError(f"unknown query [{kind}] (local backend supports "
                                  f"{', '.join(self.supported_queries())})", "parsing_exception")
        return handler(spec, scoring)

    # match / hybrid (opensearch_lsr.lexical) ----------------------------------------------------
    def query_match(self, spec: Any, scoring: bool) -> Clause:
        """``match`` on a ``text`` field: the mapped analyzer (nori or standard) and Lucene BM25."""
        from ..errors import LsrError
        from ..lexical.queries import match_clause, parse_match

        try:
            parsed = parse_match(spec)
            bm25, search_analyzer = self.target.text_bm25(parsed.field, self._match_analyzer(spec))
            mask, score = match_clause(bm25, parsed, search_analyzer)
        except LocalIndexError:
            raise
        except LsrError as err:
            raise LocalIndexError(str(err), getattr(err, "error_type", "illegal_argument_exception")) from None
        return mask, score if scoring else None

    @staticmethod
    def _match_analyzer(spec: Any) -> str | None:
        value = next(iter(spec.values()), None) if isinstance(spec, dict) and len(spec) == 1 else None
        return value.get("analyzer") if isinstance(value, dict) else None

    def query_hybrid(self, spec: Any, scoring: bool) -> Clause:
        # neural-search HybridQueryBuilder: only LocalIndex.search runs a top-level hybrid query
        raise LocalIndexError("hybrid query must be a top level query and cannot be wrapped into other queries",
                              "illegal_argument_exception")

    # match_all / term / terms / ids / exists -----------------------------------------------
    def query_match_all(self, spec: Any, scoring: bool) -> Clause:
        boost = float((spec or {}).get("boost", 1.0))
        return np.ones(self.n, bool), np.full(self.n, boost, np.float64)

    def _values(self, field: str):
        for row in range(self.n):
            if field == "_id":
                yield row, [self.view.ids[row]]
                continue
            doc = self.view.source(row)
            value = doc
            for part in field.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if value is None and field in self.view.vector_fields:
                value = self.view.full_source(row).get(field)
            yield row, (value if isinstance(value, list) else [value])

    def _field_type(self, field: str) -> str:
        return self.target.field_type(field)

    def _matches(self, field: str, wanted: list[Any]) -> np.ndarray:
        ftype = self._field_type(field)
        mask = np.zeros(self.n, bool)
        wanted_set = {_norm_term(w) for w in wanted}
        for row, values in self._values(field):
            for v in values:
                if v is None:
                    continue
                if ftype in ("text", "match_only_text") and isinstance(v, str):
                    # standard analyzer approximation: lowercase word tokens
                    if wanted_set & set(re.findall(r"\w+", v.lower())):
                        mask[row] = True
                        break
                elif _norm_term(v) in wanted_set:
                    mask[row] = True
                    break
        return mask

    def query_term(self, spec: Any, scoring: bool) -> Clause:
        if not isinstance(spec, dict) or len(spec) != 1:
            raise LocalIndexError("[term] query doesn't support multiple fields", "parsing_exception")
        (field, value), = spec.items()
        boost = 1.0
        if isinstance(value, dict):
            boost = float(value.get("boost", 1.0))
            value = value.get("value")
        if scoring and field != "_id":
            raise LocalIndexError("the local backend cannot reproduce the BM25 score of a [term] query: put it "
                                  "under bool.filter (or use [terms], which is constant-score)")
        mask = self._matches(field, [value])
        return mask, np.where(mask, boost, 0.0) if scoring else None

    def query_terms(self, spec: Any, scoring: bool) -> Clause:
        spec = dict(spec)
        boost = float(spec.pop("boost", 1.0))
        spec.pop("_name", None)
        if len(spec) != 1:
            raise LocalIndexError("[terms] query does not support multiple fields", "parsing_exception")
        (field, values), = spec.items()
        if not isinstance(values, list):
            raise LocalIndexError(f"[terms] query does not support [{field}] as a single value; use a list",
                                  "parsing_exception")
        mask = self._matches(field, values)
        return mask, np.where(mask, boost, 0.0) if scoring else None

    def query_ids(self, spec: Any, scoring: bool) -> Clause:
        values = spec.get("values", []) if isinstance(spec, dict) else None
        if not isinstance(values, list):
            raise LocalIndexError("[ids] query requires a [values] array", "parsing_exception")
        mask = np.zeros(self.n, bool)
        for v in values:
            row = self.view.row_of.get(str(v))
            if row is not None:
                mask[row] = True
        boost = float(spec.get("boost", 1.0))
        return mask, np.where(mask, boost, 0.0) if scoring else None

    def query_exists(self, spec: Any, scoring: bool) -> Clause:
        field = spec.get("field") if isinstance(spec, dict) else None
        if not field:
            raise LocalIndexError("[exists] must be provided with a [field]", "parsing_exception")
        if field in self.view.vector_fields:
            mask = self.view.exists(field)
        else:
            mask = np.array([any(v is not None for v in vals) for _, vals in self._values(field)], bool)
        boost = float(spec.get("boost", 1.0))
        return mask, np.where(mask, boost, 0.0) if scoring else None

    # bool --------------------------------------------------------------------------------------
    def query_bool(self, spec: Any, scoring: bool) -> Clause:
        if not isinstance(spec, dict):
            raise LocalIndexError("[bool] query malformed", "parsing_exception")
        allowed = {"must", "filter", "should", "must_not", "minimum_should_match", "boost", "_name"}
        for key in spec:
            if key not in allowed:
                raise LocalIndexError(f"[bool] query does not support [{key}]", "parsing_exception")

        def clauses(key):
            v = spec.get(key, [])
            return [v] if isinstance(v, dict) else list(v)

        match = np.ones(self.n, bool)
        score = np.zeros(self.n, np.float64)
        for c in clauses("must"):
            m, s = self.evaluate(c, scoring)
            match &= m
            if s is not None:
                score += np.where(m, s, 0.0)
        for c in clauses("filter"):
            m, _ = self.evaluate(c, False)
            match &= m
        for c in clauses("must_not"):
            m, _ = self.evaluate(c, False)
            match &= ~m
        should = clauses("should")
        if should:
            msm = spec.get("minimum_should_match")
            if msm is None:
                msm = 0 if (clauses("must") or clauses("filter")) else 1
            msm = _min_should(msm, len(should))
            hits = np.zeros(self.n, np.int64)
            for c in should:
                m, s = self.evaluate(c, scoring)
                hits += m
                if s is not None:
                    score += np.where(m, s, 0.0)
            match &= hits >= msm
        boost = float(spec.get("boost", 1.0))
        return match, (score * boost if scoring else None)

    # neural_sparse -------------------------------------------------------------------------------
    def query_neural_sparse(self, spec: Any, scoring: bool) -> Clause:
        if not isinstance(spec, dict) or len(spec) != 1:
            raise LocalIndexError("[neural_sparse] query doesn't support multiple fields, found ["
                                  + ", ".join(spec) + "]" if isinstance(spec, dict) else
                                  "[neural_sparse] query malformed", "parsing_exception")
        (field, params), = spec.items()
        if not isinstance(params, dict):
            raise LocalIndexError("[neural_sparse] query malformed, no start_object after query name",
                                  "parsing_exception")
        for key in params:
            if key not in NEURAL_SPARSE_FIELDS:
                raise LocalIndexError(f"[neural_sparse] query does not support [{key}] field", "parsing_exception")
        if "method_parameters" in params:
            raise LocalIndexError("[method_parameters] is for [sparse_vector] (SEISMIC) fields, which the local "
                                  "backend does not have")
        self.target.check_vector_field(field)
        text, tokens = params.get("query_text"), params.get("query_tokens")
        model_id, analyzer = params.get("model_id"), params.get("analyzer")
        if model_id is not None and analyzer is not None:
            raise LocalIndexError("[neural_sparse] query cannot use both [model_id] and [analyzer]")
        if tokens is not None and text is not None:
            raise LocalIndexError("[neural_sparse] query only accepts one of [query_text] and [query_tokens]")
        if tokens is None and text is None:
            raise LocalIndexError("either query_text or query_tokens must be provided")
        if tokens is not None:
            if not isinstance(tokens, dict):
                raise LocalIndexError("[neural_sparse] query_tokens must be an object of token: weight",
                                      "parsing_exception")
            weights = {}
            for k, v in tokens.items():
                if not isinstance(k, str) or k == "":
                    raise LocalIndexError("query token names must be non-empty strings")
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise LocalIndexError(f"[neural_sparse] query_tokens value for [{k}] must be a number",
                                          "parsing_exception")
                weights[k] = v
        else:
            if not isinstance(text, str):
                raise LocalIndexError("[neural_sparse] query_text must be a string", "parsing_exception")
            if model_id is not None:
                weights = dict(self.target.query_encoder(str(model_id))(text))
            else:
                weights = {k: v for k, v in self.target.analyzer(analyzer or "bert-uncased")(text).items() if v > 0}
        boost = float(params.get("boost", 1.0))
        q = {}
        for k, v in weights.items():
            w = float(np.float32(v))
            if not (0.0 < w <= MAX_QUERY_WEIGHT) or math.isnan(w):
                raise LocalIndexError(f"weight must be in (0, {MAX_QUERY_WEIGHT}], got: {w}")
            q[k] = w
        self.sparse_clauses.append((field, q, boost))
        vocab = self.view.vocab[field]
        cols, ws = [], []
        for k, w in q.items():
            j = vocab.get(k)
            if j is not None:
                cols.append(j)
                ws.append(w)
        if not cols:
            return np.zeros(self.n, bool), np.zeros(self.n, np.float64)
        match, score = self.view.score_terms(field, cols, ws)  # stored 9-bit doc weights
        return match, score * boost

    # sparse_vector (Elasticsearch's query) ---------------------------------------
    def query_sparse_vector(self, spec: Any, scoring: bool) -> Clause:
        """Elasticsearch's ``sparse_vector`` query (``SparseVectorQueryBuilder``) on a vector field:
        ``query_vector`` scores like ``query_tokens``, ``inference_id`` + ``query`` like ``model_id`` +
        ``query_text``; the same Lucene ``FeatureField`` linear scoring. Token pruning needs field
        statistics the local backend does not keep, so ``prune`` is refused."""
        if not isinstance(spec, dict) or not isinstance(spec.get("field"), str):
            raise LocalIndexError("[sparse_vector] requires a [field]", "parsing_exception")
        allowed = {"field", "query_vector", "inference_id", "query", "prune", "pruning_config", "boost", "_name"}
        for key in spec:
            if key not in allowed:
                raise LocalIndexError(f"[sparse_vector] unknown field [{key}]", "parsing_exception")
        if spec.get("prune") or spec.get("pruning_config"):
            raise LocalIndexError("[sparse_vector] prune/pruning_config needs Elasticsearch's field statistics; "
                                  "the local backend scores every token")
        if ("query_vector" in spec) == ("inference_id" in spec):
            raise LocalIndexError("[sparse_vector] requires one of [query_vector] or [inference_id]")
        params: dict[str, Any] = {"boost": spec.get("boost", 1.0)}
        if "query_vector" in spec:
            params["query_tokens"] = spec["query_vector"]
        else:
            if not isinstance(spec.get("query"), str):
                raise LocalIndexError("[sparse_vector] [query] must be specified with [inference_id]")
            params.update(query_text=spec["query"], model_id=spec["inference_id"])
        return self.query_neural_sparse({spec["field"]: params}, scoring)

    def explanation(self, row: int, total: float) -> dict:
        """The ``_explanation`` of a hit: one entry per matched ``neural_sparse`` token."""
        details = []
        for field, q, boost in self.sparse_clauses:
            vocab = self.view.vocab[field]
            for tok, w in q.items():
                j = vocab.get(tok)
                d = None if j is None else self.view.stored_value(field, j, row)
                if d is not None:
                    details.append({
                        "value": float(np.float32(w * d * boost)),
                        "description": f"Linear function on the {field} field for the {tok} feature, computed as "
                                       f"w * S from:",
                        "details": [{"value": float(w * boost), "description": "w, weight of this function",
                                     "details": []},
                                    {"value": d, "description": "S, feature value", "details": []}]})
        details.sort(key=lambda d: -d["value"])
        return {"value": total, "description": "sum of:", "details": details}


def _norm_term(v: Any) -> Any:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    return str(v)


def _min_should(msm: Any, n: int) -> int:
    if isinstance(msm, int):
        return msm if msm >= 0 else max(n + msm, 0)
    s = str(msm).strip()
    if s.endswith("%"):
        pct = int(s[:-1])
        return int(n * pct / 100) if pct >= 0 else n - int(n * -pct / 100)
    return int(s)
