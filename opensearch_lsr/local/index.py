"""An embedded, on-disk, exact sparse index that answers like OpenSearch ``rank_features`` +
``neural_sparse`` (opensearch-contract.md §4.2, §6): the facade of the local backend.

Why hand-written: no library offers an embedded index with Lucene ``FeatureField`` semantics
(9-significant-bit document weights, linear feature scoring, the validation and error strings)
and the OpenSearch request/response shapes; the heavy lifting is scipy sparse products.

The parts: :mod:`.storage` (segments, atomic manifest, the writer lock), :mod:`.mappings`
(mapping and document validation), :mod:`.view` (the searchable view of live documents),
:mod:`.query_evaluator` (the query DSL, one method per query type), :mod:`.models` (what
``model_id`` / ``analyzer`` run). Later segments win: re-indexing an ``_id`` overwrites it.

Scoring equals Lucene's: ``score = boost * sum_t q_t * decode(encode(d_t))`` where ``encode`` keeps
the top 9 significant bits of the float (``floatToIntBits(v) >>> 15``) and ``q_t`` in (0, 64]. The
only difference is rounding: Lucene multiplies in float32 per clause, here products are exact in
float64 and the sum is rounded to float32 once (relative differences ~1e-7).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..contract import MAX_RESULT_WINDOW
from .errors import LocalIndexError
from .mappings import validate_document, validate_mappings
from .merge import merge_segments, plan_merge
from .models import load_analyzer, load_query_encoder
from .query_evaluator import QueryEncoder, QueryEvaluator
from .storage import (FORMAT_VERSION, MANIFEST, SegmentReader, build_segment, live_among, live_masks, read_manifest,
                      remove_segment, try_write_lock, upgrade_format_1, write_lock, write_manifest,
                      write_segment)
from .view import LiveView, filter_source, top_order

__all__ = ["LocalIndex", "LocalIndexError", "TRACK_TOTAL_HITS"]

logger = logging.getLogger(__name__)

#: ``track_total_hits`` default: totals are exact up to this many hits, then "gte".
TRACK_TOTAL_HITS = 10_000


class LocalIndex:
    """An on-disk exact sparse index with OpenSearch ``rank_features`` + ``neural_sparse`` semantics.

    Create with :meth:`create`, reopen with :meth:`open`. Documents go in through :meth:`bulk`
    (the actions ``opensearch-py`` helpers accept) and come back from :meth:`search` in the
    shape of OpenSearch's ``_search`` response.
    """

    def __init__(self, path: str | os.PathLike, _manifest: dict):
        self.path = Path(path)
        self.name = _manifest.get("name") or self.path.name
        self._manifest = _manifest
        self._view: LiveView | None = None
        self._view_key: tuple[str, ...] = ()
        self._encoders: dict[str, QueryEncoder] = {}
        self._analyzers: dict[str, QueryEncoder] = {}
        self._readers: dict[str, SegmentReader] = {}

    # ---- lifecycle --------------------------------------------------------------------------

    @classmethod
    def create(cls, path: str | os.PathLike, mappings: dict | None = None, exist_ok: bool = False,
               settings: dict | None = None) -> "LocalIndex":
        """Create an index at ``path`` (``mappings`` as in ``PUT <index>``; rank_features fields
        may also be mapped dynamically by the first document that carries a token->weight map)."""
        root = Path(path)
        if (root / MANIFEST).exists():
            if exist_ok:
                idx = cls.open(root)
                if mappings:
                    idx.put_mapping(mappings)
                return idx
            raise LocalIndexError(f"index [{root.name}] already exists", "resource_already_exists_exception")
        properties = validate_mappings(mappings or {})
        root.mkdir(parents=True, exist_ok=True)
        manifest = {"format": FORMAT_VERSION, "name": root.name, "mappings": {"properties": properties},
                    "settings": dict(settings or {}), "segments": [], "next_segment": 1, "models": {},
                    "analyzers": {}, "created": time.time()}
        write_manifest(root, manifest)
        return cls(root, manifest)

    @classmethod
    def open(cls, path: str | os.PathLike) -> "LocalIndex":
        """Open an existing index (raises ``index_not_found_exception`` when there is none)."""
        root = Path(path)
        mpath = root / MANIFEST
        if not mpath.exists():
            raise LocalIndexError(f"no such index [{root.name}] (no {MANIFEST} in {root})",
                                  "index_not_found_exception", 404)
        manifest = read_manifest(root)
        if manifest.get("format") == 1:
            manifest = upgrade_format_1(root)
        if manifest.get("format") != FORMAT_VERSION:
            raise LocalIndexError(f"index [{root.name}] has unsupported format {manifest.get('format')!r}")
        return cls(root, manifest)

    @staticmethod
    def exists(path: str | os.PathLike) -> bool:
        return (Path(path) / MANIFEST).exists()

    def _reload_manifest(self) -> None:
        self._manifest = read_manifest(self.path)

    def _commit_manifest(self, manifest: dict) -> None:
        write_manifest(self.path, manifest)
        self._manifest = manifest
        self._view = None

    @property
    def mappings(self) -> dict:
        return json.loads(json.dumps(self._manifest["mappings"]))

    @property
    def settings(self) -> dict:
        """The index settings given at creation (analysis, default search pipeline)."""
        return json.loads(json.dumps(self._manifest.get("settings") or {}))

    @property
    def vector_fields(self) -> list[str]:
        """Fields mapped as ``rank_features``."""
        return [f for f, m in self._manifest["mappings"]["properties"].items() if m.get("type") == "rank_features"]

    def put_mapping(self, mappings: dict) -> None:
        """Add fields (``PUT <index>/_mapping``); changing an existing field's type is refused."""
        new = validate_mappings(mappings)
        with write_lock(self.path):
            self._reload_manifest()
            manifest = json.loads(json.dumps(self._manifest))
            props = manifest["mappings"]["properties"]
            for field, spec in new.items():
                if field in props and props[field].get("type") != spec.get("type"):
                    raise LocalIndexError(f"mapper [{field}] cannot be changed from type [{props[field].get('type')}] "
                                          f"to [{spec.get('type')}]")
                props[field] = spec
            self._commit_manifest(manifest)

    # ---- models for query_text ----------------------------------------------------------------

    def register_model(self, model_id: str, model: str | os.PathLike | QueryEncoder, persist: bool = True) -> None:
        """Make ``model_id`` usable in ``neural_sparse.query_text`` queries.

        ``model`` is a path (a ``SparseEncoder`` dir, an export bundle dir, or an ML Commons zip),
        persisted in the manifest, or a callable ``text -> {token: weight}`` kept in memory.
        """
        if not model_id:
            raise ValueError("model_id must be a non-empty string")
        if callable(model) and not isinstance(model, (str, os.PathLike)):
            self._encoders[model_id] = model
            return
        path = str(Path(model).resolve())
        if not os.path.exists(path):
            raise ValueError(f"model path {model!s} does not exist")
        self._encoders.pop(model_id, None)
        if persist:
            with write_lock(self.path):
                self._reload_manifest()
                manifest = json.loads(json.dumps(self._manifest))
                manifest["models"][model_id] = path
                self._commit_manifest(manifest)
        else:
            self._encoders[model_id] = load_query_encoder(path)

    def register_analyzer(self, name: str, analyzer: str | os.PathLike | QueryEncoder) -> None:
        """Make ``name`` usable as ``neural_sparse.analyzer``: a dir/zip with ``tokenizer.json`` and
        optional ``idf.json`` (weights ``idf.getOrDefault(token, 1.0)``, non-positive dropped), or a callable."""
        if callable(analyzer) and not isinstance(analyzer, (str, os.PathLike)):
            self._analyzers[name] = analyzer
            return
        path = str(Path(analyzer).resolve())
        if not os.path.exists(path):
            raise ValueError(f"analyzer path {analyzer!s} does not exist")
        with write_lock(self.path):
            self._reload_manifest()
            manifest = json.loads(json.dumps(self._manifest))
            manifest.setdefault("analyzers", {})[name] = path
            self._commit_manifest(manifest)

    def query_encoder(self, model_id: str) -> QueryEncoder:
        """The encoder of ``model_id`` (registered, or a model path used as the id)."""
        if model_id in self._encoders:
            return self._encoders[model_id]
        path = self._manifest.get("models", {}).get(model_id)
        if path is None and os.path.exists(model_id):
            path = model_id
        if path is None:
            raise LocalIndexError(f"Failed to find model with id [{model_id}] (local backend: register it with "
                                  "LocalIndex.register_model or pass a model directory as model_id)",
                                  "resource_not_found_exception", 404)
        enc = load_query_encoder(path)
        self._encoders[model_id] = enc
        return enc

    def analyzer(self, name: str) -> QueryEncoder:
        """The analyzer registered as ``name``."""
        if name in self._analyzers:
            return self._analyzers[name]
        path = self._manifest.get("analyzers", {}).get(name)
        if path is None:
            raise LocalIndexError(f"analyzer [{name}] is not available on the local backend (the built-in "
                                  "bert-uncased/mbert-uncased tables ship only with OpenSearch); register one "
                                  "with LocalIndex.register_analyzer")
        enc = load_analyzer(path)
        self._analyzers[name] = enc
        return enc

    # ---- writing ------------------------------------------------------------------------------

    def bulk(self, actions: Iterable[dict], refresh: bool | str = True) -> dict:
        """Index/delete documents; durable on disk when it returns.

        Actions are ``{"_op_type": "index"|"create"|"delete", "_id": ..., "_source": {...}}`` (or
        the source fields at top level, as ``opensearch-py`` helpers accept). Per-item errors do not
        stop the others; the response is shaped like ``POST _bulk``'s.
        """
        t0 = time.perf_counter()
        actions = list(actions)
        items: list[dict] = []
        with write_lock(self.path):
            self._reload_manifest()
            manifest = json.loads(json.dumps(self._manifest))
            props = manifest["mappings"]["properties"]
            existing = self._existing([str(a["_id"]) for a in actions
                                       if isinstance(a, dict) and a.get("_id") is not None])
            final: dict[str, tuple[str, dict | None]] = {}
            auto_id = 0
            for action in actions:
                op = action.get("_op_type", "index")
                if op == "update":
                    items.append({"update": {"_index": self.name, "_id": action.get("_id"), "status": 400,
                                             "error": {"type": "illegal_argument_exception",
                                                       "reason": "the local backend supports index, create and "
                                                                 "delete bulk actions, not update"}}})
                    continue
                if op not in ("index", "create", "delete"):
                    items.append({op: {"_index": self.name, "_id": action.get("_id"), "status": 400,
                                       "error": {"type": "illegal_argument_exception",
                                                 "reason": f"Malformed action/metadata line, expected one of "
                                                           f"[index, create, delete], got [{op}]"}}})
                    continue
                did = action.get("_id")
                if did is None:
                    if op == "delete":
                        items.append({"delete": {"_index": self.name, "_id": None, "status": 400, "error": {
                            "type": "action_request_validation_exception",
                            "reason": "Validation Failed: 1: id is missing;"}}})
                        continue
                    did = f"{int(time.time() * 1e6):x}{auto_id:06d}"
                    auto_id += 1
                did = str(did)
                if op == "delete":
                    found = (did in final and final[did][0] == "index") or (did not in final and did in existing)
                    final[did] = ("delete", None)
                    items.append({"delete": {"_index": self.name, "_id": did, "status": 200 if found else 404,
                                             "result": "deleted" if found else "not_found"}})
                    continue
                source = action.get("_source")
                if source is None:
                    source = {k: v for k, v in action.items() if not k.startswith("_")}
                if op == "create":
                    if (did in final and final[did][0] == "index") or (did not in final and did in existing):
                        items.append({"create": {"_index": self.name, "_id": did, "status": 409, "error": {
                            "type": "version_conflict_engine_exception",
                            "reason": f"[{did}]: version conflict, document already exists"}}})
                        continue
                try:
                    doc = validate_document(did, source, props)
                except LocalIndexError as err:
                    items.append({op: {"_index": self.name, "_id": did, "status": err.status,
                                       "error": {"type": err.error_type, "reason": err.reason}}})
                    continue
                updated = (did in final and final[did][0] == "index") or (did not in final and did in existing)
                final[did] = ("index", doc)
                items.append({op: {"_index": self.name, "_id": did, "status": 200 if updated else 201,
                                   "result": "updated" if updated else "created"}})
            if final:
                seg = build_segment(final, props)
                name = f"seg-{manifest['next_segment']:06d}"
                write_segment(self.path / name, seg)
                del seg
                manifest["next_segment"] += 1
                manifest["segments"].append(name)
                self._commit_manifest(manifest)
                self._merge_policy_locked()
        took = int((time.perf_counter() - t0) * 1000)
        errors = any("error" in next(iter(it.values())) for it in items)
        return {"took": took, "errors": errors, "items": items}

    def index(self, doc_id: str, source: dict) -> dict:
        """Index one document (``PUT <index>/_doc/<id>``)."""
        item = self.bulk([{"_id": doc_id, "_source": source}])["items"][0]["index"]
        if "error" in item:
            raise LocalIndexError(item["error"]["reason"], item["error"]["type"], item["status"])
        return item

    def delete(self, doc_id: str) -> dict:
        return self.bulk([{"_op_type": "delete", "_id": doc_id}])["items"][0]["delete"]

    def _reader(self, name: str) -> SegmentReader:
        seg = self._readers.get(name)
        if seg is None:
            seg = self._readers[name] = SegmentReader(self.path / name)
        return seg

    def _existing(self, ids: list[str]) -> set[str]:
        """Which of ``ids`` are live now (the segments' sorted id hashes; no view is built)."""
        return live_among([self._reader(n) for n in self._manifest["segments"]], ids)

    def force_merge(self) -> None:
        """Rewrite all live documents into one segment (``POST <index>/_forcemerge``)."""
        with write_lock(self.path):
            self._reload_manifest()
            if len(self._manifest["segments"]) > 1:
                self._merge_tail_locked(0)

    def _merge_policy_locked(self) -> None:
        while True:
            names = self._manifest["segments"]
            start = plan_merge([self._reader(n).n_docs for n in names])
            if start is None:
                return
            self._merge_tail_locked(start)

    def _merge_tail_locked(self, start: int) -> None:
        """Merge the segments from ``start`` to the newest into one (streamed: :mod:`.merge`)."""
        manifest = json.loads(json.dumps(self._manifest))
        names = manifest["segments"]
        readers = [self._reader(n) for n in names[start:]]
        masks = live_masks(readers)
        carry: list[str] = []
        if start > 0:  # deletions that hide documents of older segments must survive the merge
            deleted = [d for r in readers for d in r.deleted_ids()]
            live = live_among(readers, deleted)
            carry = [d for d in dict.fromkeys(deleted) if d not in live]
        name = f"seg-{manifest['next_segment']:06d}"
        merge_segments(readers, masks, carry, self.path / name)
        manifest["segments"] = names[:start] + [name]
        manifest["next_segment"] += 1
        self._commit_manifest(manifest)
        for old in names[start:]:
            seg = self._readers.pop(old, None)
            if seg is not None:
                seg.close()
            remove_segment(self.path / old)

    def refresh(self) -> None:
        """Re-read the manifest and make the searchable view current (``POST <index>/_refresh``); the
        view is rebuilt only when the segments changed (it is a function of them)."""
        self._reload_manifest()
        self._get_view()

    def _get_view(self) -> LiveView:
        if self._view is None or self._view_key != tuple(self._manifest["segments"]):
            self._view_key = tuple(self._manifest["segments"])
            self._cleanup_orphans()
            names = self._manifest["segments"]
            for stale in set(self._readers) - set(names):
                self._readers.pop(stale).close()
            self._view = LiveView([self._reader(n) for n in names], self.vector_fields)
        return self._view

    def _cleanup_orphans(self) -> None:
        # only when no writer holds the lock (a streamed merge writes its temp segment for minutes),
        # and only files older than a minute
        with try_write_lock(self.path) as locked:
            if not locked:
                return
            live = set(read_manifest(self.path)["segments"])
            for p in self.path.glob("seg-*"):
                if p.name not in live:
                    with contextlib.suppress(OSError):
                        if time.time() - p.stat().st_mtime > 60:
                            remove_segment(p)

    def count(self) -> int:
        """Number of live documents."""
        return len(self._get_view())

    def get(self, doc_id: str) -> dict | None:
        """``GET <index>/_doc/<id>``-like: the source with its vectors, or ``None``."""
        view = self._get_view()
        row = view.row_of.get(str(doc_id))
        return None if row is None else view.full_source(row)

    def doc_matrix(self, field: str, truncated: bool = True) -> tuple[sp.csr_matrix, list[str], list[str]]:
        """``(docs [N, V] CSR, doc ids, feature names)`` of a ``rank_features`` field (the whole field in
        memory: for evaluation-sized indices)."""
        view = self._get_view()
        self.check_vector_field(field)
        mat = (view.feature_matrix(field, np.arange(len(view.terms[field]))).T.tocsr() if truncated
               else view.raw_matrix(field))
        return mat, list(view.ids), list(view.terms[field])

    # ---- searching ----------------------------------------------------------------------------

    def search(self, body: dict | None = None, search_pipeline: str | dict | None = None) -> dict:
        """Run a ``_search`` body; returns the OpenSearch response shape.

        ``query`` takes the types of :class:`~opensearch_lsr.local.query_evaluator.QueryEvaluator`, or a
        top-level ``hybrid`` query fused by ``search_pipeline`` (a pipeline body, the name of one stored
        with :meth:`put_search_pipeline`, else the ``index.search.default_pipeline`` setting);
        also ``size``, ``from``, ``_source``, ``explain``, ``track_total_hits``.
        """
        t0 = time.perf_counter()
        body = dict(body or {})
        allowed = {"query", "size", "from", "_source", "explain", "track_total_hits", "timeout"}
        for key in body:
            if key not in allowed:
                raise LocalIndexError(f"Unknown key for a START_OBJECT in [{key}].", "parsing_exception")
        size = int_param(body.get("size", 10), "size")
        from_ = int_param(body.get("from", 0), "from")
        if size < 0:
            raise LocalIndexError(f"[size] parameter cannot be negative, found [{size}]")
        if from_ < 0:
            raise LocalIndexError(f"[from] parameter cannot be negative, found [{from_}]")
        if from_ + size > MAX_RESULT_WINDOW:
            raise LocalIndexError(
                f"Result window is too large, from + size must be less than or equal to: [{MAX_RESULT_WINDOW}] but "
                f"was [{from_ + size}]. See the scroll api for a more efficient way to request large data sets. "
                "This limit can be set by changing the [index.max_result_window] index level setting.")
        view = self._get_view()
        query = body.get("query", {"match_all": {}})
        ctx = QueryEvaluator(self, view, explain=bool(body.get("explain", False)))
        if isinstance(query, dict) and len(query) == 1 and "hybrid" in query:
            page_hits, total, best = self._hybrid(query["hybrid"], ctx, search_pipeline, size, from_)
        else:
            match, score = ctx.evaluate(query, scoring=True)
            rows = np.flatnonzero(match)
            scores = score[rows].astype(np.float32) if score is not None else np.ones(len(rows), np.float32)
            order = top_order(scores, from_ + size)
            page_hits = [(int(rows[i]), float(scores[i])) for i in order[from_:from_ + size]]
            total = len(rows)
            best = float(scores[order[0]]) if len(order) else None
        source_spec = body.get("_source", True)
        hits = []
        for row, row_score in page_hits:
            hit: dict[str, Any] = {"_index": self.name, "_id": view.ids[row], "_score": row_score}
            src = filter_source(view, row, source_spec)
            if src is not None:
                hit["_source"] = src
            if ctx.explain:
                hit["_explanation"] = ctx.explanation(row, row_score)
            hits.append(hit)
        tth = body.get("track_total_hits", TRACK_TOTAL_HITS)
        limit = TRACK_TOTAL_HITS if tth is None else (math.inf if tth is True else (0 if tth is False else int(tth)))
        total_obj = {"value": total, "relation": "eq"} if total <= limit else {"value": int(limit), "relation": "gte"}
        resp = {"took": int((time.perf_counter() - t0) * 1000), "timed_out": False,
                "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
                "hits": {"max_score": best if size else None, "hits": hits}}
        if tth is not False:
            resp["hits"] = {"total": total_obj, **resp["hits"]}
        return resp

    def msearch(self, bodies: Iterable[dict]) -> dict:
        """``_msearch``-like: ``{"responses": [...]}``; a failing body gives an error entry."""
        out = []
        for body in bodies:
            try:
                out.append({**self.search(body), "status": 200})
            except LocalIndexError as err:
                out.append(err.to_response())
        return {"took": 0, "responses": out}

    # ---- text fields and hybrid search (opensearch_lsr.lexical) -----------------------------------

    def text_bm25(self, field: str, analyzer: str | None = None) -> tuple[Any, Any]:
        """``(LuceneBM25 of text field over the live rows, search analyzer)``; postings are cached next
        to the segments (:mod:`opensearch_lsr.lexical.text_index`)."""
        from ..lexical.analysis import analyzer_for_field
        from ..lexical.text_index import text_field_bm25

        props = self._manifest["mappings"]["properties"]
        if props.get(field, {}).get("type") not in ("text", "match_only_text"):
            raise LocalIndexError(f"the local backend answers [match] on text fields only; [{field}] is "
                                  f"{'unmapped' if field not in props else props[field].get('type')}")
        settings = self._manifest.get("settings")
        index_analyzer = analyzer_for_field(props, settings, field)
        search_analyzer = (analyzer_for_field({field: {"analyzer": analyzer}}, settings, field) if analyzer
                           else analyzer_for_field(props, settings, field, search=True))
        view = self._get_view()

        def values():
            for row in range(len(view)):
                value: Any = view.source(row)
                for part in field.split("."):
                    value = value.get(part) if isinstance(value, dict) else None
                yield value

        bm25 = text_field_bm25(self.path, self._manifest["segments"], field, index_analyzer, view.ids, values)
        return bm25, search_analyzer

    def put_search_pipeline(self, name: str, body: dict) -> None:
        """Store a search pipeline (``PUT _search/pipeline/<name>``) for hybrid queries on this index."""
        if not isinstance(body, dict):
            raise LocalIndexError("search pipeline body must be an object", "parse_exception")
        with write_lock(self.path):
            self._reload_manifest()
            manifest = json.loads(json.dumps(self._manifest))
            manifest.setdefault("search_pipelines", {})[str(name)] = body
            self._commit_manifest(manifest)

    def _hybrid(self, spec: Any, ctx: QueryEvaluator, pipeline: str | dict | None, size: int,
                from_: int) -> tuple[list[tuple[int, float]], int, float | None]:
        from ..errors import LsrError
        from ..lexical.fusion import HybridFusion
        from ..lexical.queries import hybrid_hits

        if pipeline is None:
            settings = self._manifest.get("settings") or {}
            index = settings.get("index", settings)
            pipeline = (settings.get("index.search.default_pipeline")
                        or ((index.get("search") or {}).get("default_pipeline") if isinstance(index, dict) else None))
        if isinstance(pipeline, str):
            stored = (self._manifest.get("search_pipelines") or {}).get(pipeline)
            if stored is None:
                raise LocalIndexError(f"Pipeline {pipeline} is not defined", "illegal_argument_exception", 404)
            pipeline = stored
        try:
            fusion = HybridFusion.from_pipeline(pipeline) if pipeline is not None else None
            return hybrid_hits(spec, lambda q: ctx.evaluate(q, scoring=True), fusion, size, from_)
        except LocalIndexError:
            raise
        except LsrError as err:
            raise LocalIndexError(str(err), getattr(err, "error_type", "illegal_argument_exception")) from None

    def field_type(self, field: str) -> str:
        """The mapped type of ``field`` (``keyword`` when unmapped)."""
        return self._manifest["mappings"]["properties"].get(field, {}).get("type", "keyword")

    def check_vector_field(self, field: str) -> None:
        """Raise the OpenSearch error unless ``field`` is a ``rank_features`` field."""
        if field not in self.vector_fields:
            raise LocalIndexError("[neural_sparse] query only works on [rank_features] fields")

    def score_matrix(self, field: str, queries: sp.csr_matrix, query_terms: list[str], k: int = 100,
                     block: int = 256) -> tuple[list[list[int]], list[list[float]], list[str]]:
        """Batch scoring for evaluation: top-``k`` rows and scores per query row of ``queries``
        (``[Q, len(query_terms)]``), with exactly the scores :meth:`search` gives."""
        view = self._get_view()
        self.check_vector_field(field)
        vocab = view.vocab[field]
        cols = np.array([vocab.get(t, -1) for t in query_terms], dtype=np.int64)
        keep = np.flatnonzero(cols >= 0)
        q = queries.tocsc()[:, keep].astype(np.float32).astype(np.float64).tocsr()
        top_rows: list[list[int]] = []
        top_scores: list[list[float]] = []
        for start in range(0, q.shape[0], block):
            qb = q[start:start + block]
            used = np.flatnonzero(np.diff(qb.tocsc().indptr) > 0)  # only this block's terms are read
            dt = view.feature_matrix(field, cols[keep][used]).astype(np.float64)  # [terms, N]
            s = (qb[:, used] @ dt).toarray().astype(np.float32)
            for row in s:
                matched = np.flatnonzero(row > 0)
                sub = row[matched]
                order = top_order(sub, k)
                top_rows.append([int(matched[i]) for i in order])
                top_scores.append([float(sub[i]) for i in order])
        return top_rows, top_scores, list(view.ids)


def int_param(value: Any, name: str) -> int:
    """A request integer parameter, with OpenSearch's parsing error."""
    if isinstance(value, bool):
        raise LocalIndexError(f"[{name}] must be an integer, got [{value}]", "parsing_exception")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise LocalIndexError(f"[{name}] must be an integer, got [{value}]", "parsing_exception") from None
