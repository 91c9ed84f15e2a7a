"""Search side of the double: ``_search`` with bool/neural_sparse/hybrid, two-phase, SEISMIC rules.

Mixed into :class:`~double.server.OpenSearchDouble`.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from .store import ApiError, Index, ShardQueryError, eval_query, f32

#: neural-search SparseAnnQueryBuilder defaults (3.3.0.0): k, top_n (DEFAULT_QUERY_CUT), heap_factor
_ANN_DEFAULTS = {"k": 10, "top_n": 10, "heap_factor": 1.0}
#: NeuralSparseTwoPhaseProcessor.DEFAULT_BASE_QUERY_SIZE
_TWO_PHASE_BASE_SIZE = 10

__all__ = ["SearchMixin"]


class SearchMixin:
    """``<index>/_search``; ``self`` is the double."""

    # -- search -----------------------------------------------------------------------------------
    def _search(self, name: str, query: dict, body: dict) -> dict[str, Any]:
        idx = self._get_index(name)
        docs = idx.searchable()
        size = int(body.get("size", query.get("size", 10)))
        offset = int(body.get("from", query.get("from", 0)))
        pipeline_id = query.get("search_pipeline") or idx.settings.get("index.search.default_pipeline")
        pipeline = None
        if pipeline_id and pipeline_id != "_none":
            pipeline = self.search_pipelines.get(pipeline_id)
            if pipeline is None:
                raise ApiError(404, "resource_not_found_exception", f"Pipeline {pipeline_id} is not defined")
        q = body.get("query") or {"match_all": {}}
        if pipeline is not None:
            self._two_phase(idx, pipeline, q, body.get("size"))
        limit: int | None = None
        if "hybrid" in q:
            scores = self._hybrid(idx, q["hybrid"], docs, pipeline, size + offset)
        else:
            scores, limit = self._score(idx, q, docs)
        ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
        if limit is not None:
            ranked = ranked[:limit]
        hits = []
        for doc_id, score in ranked[offset:offset + size]:
            hit: dict[str, Any] = {"_index": name, "_id": doc_id, "_score": score}
            src_opt = body.get("_source", True)
            if src_opt is not False:
                src = docs[doc_id].source
                if isinstance(src_opt, list):
                    src = {k: v for k, v in src.items() if k in src_opt}
                elif isinstance(src_opt, dict) and "excludes" in src_opt:
                    src = {k: v for k, v in src.items() if k not in src_opt["excludes"]}
                hit["_source"] = src
            hits.append(hit)
        return {"took": 1, "timed_out": False, "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
                "hits": {"total": {"value": len(ranked), "relation": "eq"},
                         "max_score": hits[0]["_score"] if hits else None, "hits": hits}}

    def _score(self, idx: Index, q: dict, docs: dict) -> tuple[dict[str, float], int | None]:
        (kind, body), = q.items()
        if kind == "match_all":
            return {d: 1.0 for d in docs}, None
        if kind == "neural_sparse":
            return self._neural_sparse(idx, body, docs)
        if kind == "match":
            (fname, value), = body.items()
            text = value.get("query") if isinstance(value, dict) else value
            return idx.bm25(fname, str(text), docs), None
        if kind in ("term", "terms", "ids", "exists"):
            return {d: 1.0 for d, doc in docs.items() if eval_query(q, {**doc.source, "_id": d})}, None
        if kind == "bool":
            def clauses(key):
                value = body.get(key, [])
                return value if isinstance(value, list) else [value]
            candidates = set(docs)
            total: dict[str, float] = {}
            for sub in clauses("filter"):
                candidates &= {d for d, doc in docs.items() if eval_query(sub, {**doc.source, "_id": d})}
            for sub in clauses("must_not"):
                candidates -= {d for d, doc in docs.items() if eval_query(sub, {**doc.source, "_id": d})}
            for sub in clauses("must"):
                s, _ = self._score(idx, sub, docs)
                candidates &= set(s)
                for d, v in s.items():
                    total[d] = total.get(d, 0.0) + v
            should = clauses("should")
            should_hits: dict[str, int] = {}
            for sub in should:
                s, _ = self._score(idx, sub, docs)
                for d, v in s.items():
                    should_hits[d] = should_hits.get(d, 0) + 1
                    total[d] = total.get(d, 0.0) + v
            msm = body.get("minimum_should_match")
            if msm is None:  # BoolQueryBuilder: 1 when only should clauses, else 0
                msm = 0 if (clauses("must") or clauses("filter")) else 1
            if should:
                need = min(int(msm), len(should))
                candidates = {d for d in candidates if should_hits.get(d, 0) >= need}
            return {d: total.get(d, 0.0) for d in candidates}, None
        if kind == "nested":
            return self._nested(idx, body, docs), None
        raise ApiError(400, "parsing_exception", f"unknown query [{kind}]")

    def _neural_sparse(self, idx: Index, body: dict, docs: dict) -> tuple[dict[str, float], int | None]:
        if "opensearch-neural-search" not in self.plugins:
            raise ApiError(400, "parsing_exception", "unknown query [neural_sparse]")
        if len(body) != 1:
            a, b = list(body)[:2]
            raise ApiError(400, "parsing_exception", f"[neural_sparse] query doesn't support multiple fields, found [{a}] and [{b}]")
        (fname, clause), = body.items()
        allowed_values = {"query_text", "model_id", "boost", "_name", "max_token_score"}
        if self.version >= (3, 1, 0):
            allowed_values.add("analyzer")
        for key, value in clause.items():
            if isinstance(value, dict):
                if key == "query_tokens" and self.version >= (2, 14, 0):
                    continue
                if key == "method_parameters" and self.version >= (3, 3, 0):
                    continue
                raise ApiError(400, "parsing_exception", f"[neural_sparse] unknown token [START_OBJECT] after [{key}]")
            if key not in allowed_values:
                raise ApiError(400, "parsing_exception", f"[neural_sparse] query does not support [{key}] field")
        query_text, model_id, analyzer = clause.get("query_text"), clause.get("model_id"), clause.get("analyzer")
        tokens = clause.get("query_tokens")
        if tokens is None:
            if query_text is None:
                raise ApiError(400, "illegal_argument_exception",
                               "either query_text field or query_tokens field must be provided for [neural_sparse] query")
            if self.version < (2, 13, 0) and model_id is None:
                raise ApiError(400, "illegal_argument_exception",
                               "using query_text, model_id field must be provided for [neural_sparse] query")
        for key in ("query_text", "model_id", "analyzer"):
            if clause.get(key) == "":
                raise ApiError(400, "illegal_argument_exception", f"{key} field can not be empty")
        ftype = idx.field_type(fname)
        is_ann = ftype == "sparse_vector" and self.version >= (3, 3, 0)
        if tokens is None:
            if model_id is not None and analyzer is not None:
                raise ApiError(400, "illegal_argument_exception",
                               f"Cannot use both [model_id: {model_id}] and [analyzer: {analyzer}] for neural sparse query "
                               "tokenization. Specify only one tokenization method. These parameters can be set either in "
                               "the query or through the neural_query_enricher search processor.")
            if analyzer is not None or (model_id is None and self.version >= (3, 1, 0)):
                name = analyzer or "bert-uncased"
                # the pre-built bert-uncased / mbert-uncased analyzers ship inside ML Commons; the double has no
                # copy of their vocabularies, so it answers as a shard without that analyzer would
                raise ApiError(400, "illegal_argument_exception", f"Analyzer [{name}] not found in shard context. ")
            if not str(query_text or "").strip() or not str(model_id or "").strip():
                raise ApiError(400, "illegal_argument_exception", "query_text and model_id cannot be null")
            fmt = "token_id" if (is_ann and fname in idx.sparse_ann_fields()) else "word"
            if model_id not in self.models:  # the model is looked up with GetModel (ml-commons GetModelTransportAction)
                raise ApiError(404, "status_exception", f"Failed to find model with the provided model id: {model_id}")
            tokens = self.predict_map(model_id, [query_text], fmt)[0]
        if not is_ann and ftype != "rank_features":
            raise ShardQueryError("[neural_sparse] query only works on [rank_features] fields", idx.name)
        tokens = {str(k): float(v) for k, v in tokens.items()}
        limit = None
        method_params = clause.get("method_parameters")
        if method_params is not None:
            _check_method_parameters(method_params)
        # NeuralSparseQueryBuilder.doToQuery (3.3.0.0): a SEISMIC field without method_parameters gets the
        # exact FeatureField query (non-integer tokens simply match nothing); from 3.4.0.0 the builder
        # always attaches a SparseAnnQueryBuilder with its defaults (k 10, top_n 10).
        use_ann = is_ann and (method_params is not None or self.version >= (3, 4, 0))
        if use_ann:
            params = {**_ANN_DEFAULTS, **(method_params or {})}
            bad = [t for t in tokens if not t.lstrip("-").isdigit()]
            if bad:  # SparseAnnQueryBuilder.preprocessQueryTokens
                raise ApiError(400, "illegal_argument_exception", "Query tokens should be valid integer")
            if any(int(t) < 0 for t in tokens):
                raise ApiError(400, "illegal_argument_exception", "Query tokens should be non-negative integer!")
            tokens = dict(sorted(tokens.items(), key=lambda kv: -kv[1])[:int(params["top_n"])])
            limit = int(params["k"]) or _ANN_DEFAULTS["k"]
            if params.get("filter"):
                docs = {d: doc for d, doc in docs.items() if eval_query(params["filter"], doc.source)}
        for token, weight in tokens.items():
            w = f32(weight)
            if not (0 < w <= 64.0):  # FeatureField.newLinearQuery
                raise ShardQueryError(f"weight must be in (0, 64.0], got: {w!r}", idx.name)
        boost = float(clause.get("boost", 1.0))
        scores: dict[str, float] = {}
        for doc_id, doc in docs.items():
            feats = doc.features.get(fname)
            if not feats:
                continue
            score = 0.0
            matched = False
            for token, weight in tokens.items():
                dw = feats.get(token)
                if dw is not None:
                    score += f32(weight) * dw
                    matched = True
            if matched:
                scores[doc_id] = boost * score
        return scores, limit

    def _hybrid(self, idx: Index, body: dict, docs: dict, pipeline: dict | None, depth: int) -> dict[str, float]:
        subs = body.get("queries") or []
        if not subs:
            raise ApiError(400, "illegal_argument_exception", "hybrid query must have at least one sub-query")
        per_query = []
        for sub in subs:
            s, _ = self._score(idx, sub, docs)
            ranked = sorted(s.items(), key=lambda kv: (-kv[1], kv[0]))[:max(depth, 10)]
            per_query.append(ranked)
        procs = [p for p in (pipeline or {}).get("phase_results_processors", []) or []]
        if not procs:
            # without a normalization/score-ranker processor the double falls back to max of raw scores (UNVERIFIED)
            out: dict[str, float] = {}
            for ranked in per_query:
                for d, v in ranked:
                    out[d] = max(out.get(d, 0.0), v)
            return out
        (ptype, config), = procs[0].items()
        if ptype == "score-ranker-processor":
            k = rrf_rank_constant(config, self.version)
            out = {}
            for ranked in per_query:
                for rank, (d, _) in enumerate(ranked, start=1):
                    out[d] = out.get(d, 0.0) + 1.0 / (k + rank)
            return out
        comb = config.get("combination") or {}
        weights = (comb.get("parameters") or {}).get("weights") or [1.0 / len(subs)] * len(subs)
        if len(weights) != len(subs):
            raise ApiError(400, "illegal_argument_exception",
                           f"number of weights [{len(weights)}] must match number of sub-queries [{len(subs)}] in hybrid query")
        normed = []
        for ranked in per_query:
            if not ranked:
                normed.append({})
                continue
            values = [v for _, v in ranked]
            lo, hi = min(values), max(values)
            normed.append({d: (1.0 if hi == lo else max((v - lo) / (hi - lo), 0.001)) for d, v in ranked})
        out = {}
        all_docs = set().union(*[set(n) for n in normed])
        for d in all_docs:
            num = sum(w * n[d] for w, n in zip(weights, normed) if d in n)
            den = sum(w for w, n in zip(weights, normed) if d in n)
            out[d] = num / den if den else 0.0
        return out

    # -- nested (``--long-text split`` documents) ---------------------------------------------------
    def _nested(self, idx: Index, body: dict, docs: dict) -> dict[str, float]:
        """``nested`` query: the inner query runs per nested object, scores combined by ``score_mode``
        (OpenSearch NestedQueryBuilder; default ``avg``)."""
        path = body.get("path")
        if not path or idx.field_type(path) != "nested":
            raise ApiError(400, "query_shard_exception", f"[nested] failed to find nested object under path [{path}]")
        mode = body.get("score_mode", "avg")
        if mode not in ("avg", "max", "min", "sum", "none"):
            raise ApiError(400, "illegal_argument_exception", f"No ScoreMode found for value [{mode}]")
        out: dict[str, float] = {}
        for doc_id, doc in docs.items():
            objects = doc.nested.get(path) or []
            pseudo = {str(i): SimpleNamespace(features=o["features"], source=o["source"], terms={})
                      for i, o in enumerate(objects)}
            if not pseudo:
                continue
            scores, _ = self._score(idx, body.get("query") or {"match_all": {}}, pseudo)
            if not scores:
                continue
            values = list(scores.values())
            out[doc_id] = {"avg": sum(values) / len(values), "max": max(values), "min": min(values),
                           "sum": sum(values), "none": 0.0}[mode]
        return out

    # -- neural_sparse_two_phase_processor ------------------------------------------------------------
    def _two_phase(self, idx: Index, pipeline: dict, query: dict, size: Any) -> None:
        """NeuralSparseTwoPhaseProcessor.processRequest (neural-search 3.3.0.0): only a top-level
        ``neural_sparse`` or one under (nested) ``bool.should`` is two-phased (``bool.must``/``filter``
        are not looked at); a SEISMIC field is refused; the window is validated. Scoring stays the full
        query's (the rescore of the window with the pruned tokens is not emulated)."""
        for proc in pipeline.get("request_processors") or []:
            config = proc.get("neural_sparse_two_phase_processor")
            if config is None:
                continue
            params = config.get("two_phase_parameter") or {}
            if config.get("enabled", True) is False or float(params.get("prune_ratio", 0.4)) == 0.0:
                return
            found = _collect_two_phase(query)
            if not found:
                self.two_phase_log.append({"applied": False, "reason": "no neural_sparse under query or bool.should"})
                return
            ann = idx.sparse_ann_fields()
            if any(f in ann for f in found):
                raise ApiError(400, "illegal_argument_exception",
                               "Two phase search processor is not compatible with [seismic] field for now")
            base = _TWO_PHASE_BASE_SIZE if size is None or int(size) == -1 else int(size)
            window = int(base * float(params.get("expansion_rate", 5.0)))
            max_window = int(params.get("max_window_size", 10000))
            if window > max_window or window < 0:
                raise ApiError(400, "illegal_argument_exception",
                               f"The two-phase window size of neural_sparse_two_phase_processor should be "
                               f"[0,{max_window}], but get the value of {window}")
            self.two_phase_log.append({"applied": True, "fields": found, "window": window})
            return


def _collect_two_phase(query: dict) -> list[str]:
    """Fields of the neural_sparse clauses the two-phase processor would rewrite."""
    if not isinstance(query, dict) or len(query) != 1:
        return []
    (kind, body), = query.items()
    if kind == "neural_sparse":
        return list(body)
    if kind == "bool":
        should = body.get("should", [])
        out: list[str] = []
        for sub in (should if isinstance(should, list) else [should]):
            out.extend(_collect_two_phase(sub))
        return out
    return []


def _check_method_parameters(params: Any) -> None:
    """SparseAnnQueryBuilder.fromXContent validation (neural-search 3.3.0.0)."""
    if not isinstance(params, dict):
        raise ApiError(400, "parsing_exception", "[sparse_ann] method_parameters must be an object")
    for key, value in params.items():
        if key in ("k", "top_n"):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ApiError(400, "parsing_exception", f"[sparse_ann] {key} must be a positive integer")
        elif key == "heap_factor":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ApiError(400, "parsing_exception", "[sparse_ann] heap_factor must be a positive float")
        elif key == "filter":
            if not isinstance(value, dict):
                raise ApiError(400, "parsing_exception", "[sparse_ann] unknown token [VALUE] after [filter]")
        else:
            raise ApiError(400, "parsing_exception", f"[sparse_ann] unknown field [{key}]")


def rrf_rank_constant(config: dict, version: tuple[int, int, int]) -> int:
    """The rank constant a score-ranker-processor uses (neural-search RRFProcessorFactory): read from
    ``combination.parameters`` up to 3.0.x (a top-level ``combination.rank_constant`` is ignored) and
    from ``combination`` from 3.1.0.0 (where ``combination.parameters`` only takes ``weights``)."""
    comb = config.get("combination") or {}
    params = comb.get("parameters") or {}
    if version >= (3, 1, 0):
        extra = [k for k in params if k != "weights"]
        if extra:
            raise ApiError(400, "illegal_argument_exception", "provided parameter for combination technique is not "
                           "supported. supported parameters are [weights]")
        value = comb.get("rank_constant", 60)
    else:
        extra = [k for k in params if k != "rank_constant"]
        if extra:
            raise ApiError(400, "illegal_argument_exception", "unrecognized parameters in normalization technique")
        value = params.get("rank_constant", 60)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10000:
        raise ApiError(400, "illegal_argument_exception", f"rank constant must be in the interval between 1 and 10000, "
                       f"submitted rank constant: {value}")
    return value
