"""An embedded, on-disk, exact sparse index that answers like OpenSearch ``rank_features`` +
``neural_sparse`` (opensearch-contract.md §4.2, §6).

Why hand-written: no library offers an embedded index with Lucene ``FeatureField`` semantics
(9-significant-bit document weights, linear feature scoring, the validation and error strings)
and the OpenSearch request/response shapes; the heavy lifting is scipy sparse products.

Layout of an index directory::

    manifest.json        atomic (temp + fsync + rename): mappings, segment list, registered models
    seg-000001.npz ...   immutable segments: doc ids, deleted ids, JSON sources and, per
                         ``rank_features`` field, a CSR matrix over segment-local feature names
    write.lock           advisory lock taken by writers

A segment is written and fsynced before the manifest that names it, so ``bulk()`` is durable when
it returns and a crash leaves either the old or the new manifest (unreferenced segment files are
ignored and removed by the next writer). Later segments win: re-indexing an ``_id`` overwrites it.

Scoring equals Lucene's: ``score = boost * sum_t q_t * decode(encode(d_t))`` where ``encode`` keeps
the top 9 significant bits of the float (``floatToIntBits(v) >>> 15``) and ``q_t`` in (0, 64]. The
only difference is rounding: Lucene multiplies in float32 per clause, here products are exact in
float64 and the sum is rounded to float32 once (relative differences ~1e-7).
"""
from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..config import read_json
from ..errors import LsrError

__all__ = [
    "LocalIndex",
    "LocalIndexError",
    "truncate_feature_value",
    "truncate_feature_values",
    "FLOAT_MIN_NORMAL",
    "MAX_RESULT_WINDOW",
]

logger = logging.getLogger(__name__)

#: Java ``Float.MIN_NORMAL``: smallest accepted feature value (Lucene ``FeatureField``).
FLOAT_MIN_NORMAL = float(np.finfo(np.float32).tiny)
#: OpenSearch ``index.max_result_window`` default.
MAX_RESULT_WINDOW = 10_000
#: ``track_total_hits`` default: totals are exact up to this many hits, then "gte".
TRACK_TOTAL_HITS = 10_000
MANIFEST = "manifest.json"
FORMAT_VERSION = 1
_MERGE_AT = 32  # merge all segments into one once there are more than this many

NEURAL_SPARSE_FIELDS = {"query_text", "model_id", "query_tokens", "analyzer", "max_token_score", "boost",
                        "_name", "method_parameters"}


class LocalIndexError(LsrError, ValueError):
    """An OpenSearch-like error: ``status``, ``error_type`` and ``reason`` as the REST API reports them."""

    def __init__(self, reason: str, error_type: str = "illegal_argument_exception", status: int = 400):
        super().__init__(reason)
        self.reason = reason
        self.error_type = error_type
        self.status = status

    def to_response(self) -> dict:
        """The REST error body: ``{"error": {"root_cause": [...], "type", "reason"}, "status"}``."""
        cause = {"type": self.error_type, "reason": self.reason}
        return {"error": {"root_cause": [cause], **cause}, "status": self.status}


def truncate_feature_values(values: np.ndarray) -> np.ndarray:
    """Lucene ``FeatureField`` storage: ``intBitsToFloat((floatToIntBits(v) >>> 15) << 15)`` (contract §6.2).

    Keeps the top 9 significant bits of a positive float32 (relative error <= 2^-8, by truncation).
    """
    arr = np.ascontiguousarray(values, dtype=np.float32)
    bits = arr.view(np.uint32)
    return ((bits >> np.uint32(15)) << np.uint32(15)).view(np.float32)


def truncate_feature_value(value: float) -> float:
    """Scalar form of :func:`truncate_feature_values`."""
    return float(truncate_feature_values(np.array([value], dtype=np.float32))[0])


# --------------------------------------------------------------------------------------------
# storage
# --------------------------------------------------------------------------------------------


@dataclass
class _Segment:
    name: str
    ids: list[str]
    deleted: list[str]
    sources: list[bytes]
    fields: dict[str, tuple[sp.csr_matrix, list[str]]]  # field -> (raw float32 CSR, feature names)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _write_segment(path: Path, seg: _Segment) -> None:
    arrays: dict[str, np.ndarray] = {
        "ids": np.array(seg.ids, dtype=str) if seg.ids else np.zeros(0, dtype="U1"),
        "deleted": np.array(seg.deleted, dtype=str) if seg.deleted else np.zeros(0, dtype="U1"),
        "source_offsets": np.cumsum([0] + [len(s) for s in seg.sources]).astype(np.int64),
        "sources": np.frombuffer(b"".join(seg.sources), dtype=np.uint8),
        "fields": np.array(list(seg.fields), dtype=str) if seg.fields else np.zeros(0, dtype="U1"),
    }
    for i, (mat, terms) in enumerate(seg.fields.values()):
        arrays[f"f{i}_indptr"] = mat.indptr.astype(np.int64)
        arrays[f"f{i}_indices"] = mat.indices.astype(np.int32)
        arrays[f"f{i}_data"] = mat.data.astype(np.float32)
        # feature names as one UTF-8 JSON array: numpy unicode arrays would strip trailing NULs
        arrays[f"f{i}_terms"] = np.frombuffer(json.dumps(terms, ensure_ascii=False).encode("utf-8"), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    _atomic_write_bytes(path, buf.getvalue())


def _read_segment(path: Path) -> _Segment:
    with np.load(path, allow_pickle=False) as z:
        ids = [str(x) for x in z["ids"]]
        deleted = [str(x) for x in z["deleted"]]
        offs = z["source_offsets"]
        blob = z["sources"].tobytes()
        sources = [blob[offs[i]:offs[i + 1]] for i in range(len(ids))]
        fields = {}
        for i, fname in enumerate(str(x) for x in z["fields"]):
            terms = json.loads(z[f"f{i}_terms"].tobytes().decode("utf-8"))
            mat = sp.csr_matrix((z[f"f{i}_data"], z[f"f{i}_indices"], z[f"f{i}_indptr"]),
                                shape=(len(ids), len(terms)))
            fields[fname] = (mat, terms)
    return _Segment(path.name, ids, deleted, sources, fields)


@contextlib.contextmanager
def _write_lock(root: Path):
    """An advisory lock so two writers never interleave manifests (POSIX only; no-op elsewhere)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(root / "write.lock", "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# the in-memory view of the live documents
# --------------------------------------------------------------------------------------------


class _View:
    """Live documents of all segments: ids, sources, and per field a truncated CSC-ready matrix."""

    def __init__(self, segments: list[_Segment], vector_fields: list[str]):
        latest: dict[str, tuple[int, int]] = {}
        for s, seg in enumerate(segments):
            for did in seg.deleted:
                latest.pop(did, None)
            for r, did in enumerate(seg.ids):
                latest.pop(did, None)  # re-insert so order = last write
                latest[did] = (s, r)
        self.ids: list[str] = list(latest)
        self.row_of: dict[str, int] = {d: i for i, d in enumerate(self.ids)}
        seg_rows: dict[int, list[int]] = {}
        order: dict[int, list[int]] = {}
        for pos, (s, r) in enumerate(latest.values()):
            seg_rows.setdefault(s, []).append(r)
            order.setdefault(s, []).append(pos)
        self.sources: list[bytes] = [b""] * len(self.ids)
        for s, rows in seg_rows.items():
            for pos, r in zip(order[s], rows):
                self.sources[pos] = segments[s].sources[r]
        self._parsed: dict[int, dict] = {}
        self.vocab: dict[str, dict[str, int]] = {}
        self.terms: dict[str, list[str]] = {}
        self.raw: dict[str, sp.csr_matrix] = {}
        self.by_feature: dict[str, sp.csr_matrix] = {}  # [V, N] CSR (= docs CSC): fast column gathers
        n = len(self.ids)
        for field in vector_fields:
            vocab: dict[str, int] = {}
            blocks, positions = [], []
            for s, rows in seg_rows.items():
                if field not in segments[s].fields:
                    blocks.append(None)
                    positions.append(order[s])
                    continue
                mat, terms = segments[s].fields[field]
                remap = np.array([vocab.setdefault(t, len(vocab)) for t in terms], dtype=np.int64)
                sub = mat[rows]
                blocks.append((sub, remap))
                positions.append(order[s])
            v = len(vocab)
            coo_rows, coo_cols, coo_vals = [], [], []
            for blk, pos in zip(blocks, positions):
                if blk is None:
                    continue
                sub, remap = blk
                sub = sub.tocoo()
                coo_rows.append(np.asarray(pos, dtype=np.int64)[sub.row])
                coo_cols.append(remap[sub.col])
                coo_vals.append(sub.data.astype(np.float32))
            if coo_rows:
                raw = sp.csr_matrix((np.concatenate(coo_vals), (np.concatenate(coo_rows), np.concatenate(coo_cols))),
                                    shape=(n, v), dtype=np.float32)
            else:
                raw = sp.csr_matrix((n, v), dtype=np.float32)
            raw.sort_indices()
            self.vocab[field] = vocab
            self.terms[field] = [None] * v  # type: ignore[list-item]
            for t, j in vocab.items():
                self.terms[field][j] = t
            self.raw[field] = raw
            stored = raw.copy()
            stored.data = truncate_feature_values(stored.data)
            self.by_feature[field] = stored.T.tocsr()

    def __len__(self) -> int:
        return len(self.ids)

    def source(self, row: int) -> dict:
        doc = self._parsed.get(row)
        if doc is None:
            doc = json.loads(self.sources[row].decode("utf-8"))
            self._parsed[row] = doc
        return doc

    def full_source(self, row: int) -> dict:
        """The stored source with its ``rank_features`` fields put back (float32 values)."""
        doc = dict(self.source(row))
        for field, raw in self.raw.items():
            start, end = raw.indptr[row], raw.indptr[row + 1]
            if end > start:
                terms = self.terms[field]
                # float32 values printed shortest (as Java prints the float the client sent)
                doc[field] = {terms[j]: float(str(w)) for j, w in zip(raw.indices[start:end], raw.data[start:end])}
        return doc


# --------------------------------------------------------------------------------------------
# the index
# --------------------------------------------------------------------------------------------


QueryEncoder = Callable[[str], Mapping[str, float]]


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
        self._view: _View | None = None
        self._view_key: tuple[str, ...] = ()
        self._encoders: dict[str, QueryEncoder] = {}
        self._analyzers: dict[str, QueryEncoder] = {}
        self._ids_cache: tuple[tuple[str, ...], set[str]] | None = None

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
        properties = _validate_mappings(mappings or {})
        root.mkdir(parents=True, exist_ok=True)
        manifest = {"format": FORMAT_VERSION, "name": root.name, "mappings": {"properties": properties},
                    "settings": dict(settings or {}), "segments": [], "next_segment": 1, "models": {},
                    "analyzers": {}, "created": time.time()}
        _atomic_write_bytes(root / MANIFEST, json.dumps(manifest, ensure_ascii=False, indent=1).encode("utf-8"))
        return cls(root, manifest)

    @classmethod
    def open(cls, path: str | os.PathLike) -> "LocalIndex":
        """Open an existing index (raises ``index_not_found_exception`` when there is none)."""
        root = Path(path)
        mpath = root / MANIFEST
        if not mpath.exists():
            raise LocalIndexError(f"no such index [{root.name}] (no {MANIFEST} in {root})",
                                  "index_not_found_exception", 404)
        manifest = read_json(mpath)
        if manifest.get("format") != FORMAT_VERSION:
            raise LocalIndexError(f"index [{root.name}] has unsupported format {manifest.get('format')!r}")
        return cls(root, manifest)

    @staticmethod
    def exists(path: str | os.PathLike) -> bool:
        return (Path(path) / MANIFEST).exists()

    def _reload_manifest(self) -> None:
        self._manifest = read_json(self.path / MANIFEST)

    def _commit_manifest(self, manifest: dict) -> None:
        _atomic_write_bytes(self.path / MANIFEST, json.dumps(manifest, ensure_ascii=False, indent=1).encode("utf-8"))
        self._manifest = manifest
        self._view = None

    @property
    def mappings(self) -> dict:
        return json.loads(json.dumps(self._manifest["mappings"]))

    @property
    def vector_fields(self) -> list[str]:
        """Fields mapped as ``rank_features``."""
        return [f for f, m in self._manifest["mappings"]["properties"].items() if m.get("type") == "rank_features"]

    def put_mapping(self, mappings: dict) -> None:
        """Add fields (``PUT <index>/_mapping``); changing an existing field's type is refused."""
        new = _validate_mappings(mappings)
        with _write_lock(self.path):
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
            with _write_lock(self.path):
                self._reload_manifest()
                manifest = json.loads(json.dumps(self._manifest))
                manifest["models"][model_id] = path
                self._commit_manifest(manifest)
        else:
            self._encoders[model_id] = _load_query_encoder(path)

    def register_analyzer(self, name: str, analyzer: str | os.PathLike | QueryEncoder) -> None:
        """Make ``name`` usable as ``neural_sparse.analyzer``: a dir/zip with ``tokenizer.json`` and
        optional ``idf.json`` (weights ``idf.getOrDefault(token, 1.0)``, non-positive dropped), or a callable."""
        if callable(analyzer) and not isinstance(analyzer, (str, os.PathLike)):
            self._analyzers[name] = analyzer
            return
        path = str(Path(analyzer).resolve())
        if not os.path.exists(path):
            raise ValueError(f"analyzer path {analyzer!s} does not exist")
        with _write_lock(self.path):
            self._reload_manifest()
            manifest = json.loads(json.dumps(self._manifest))
            manifest.setdefault("analyzers", {})[name] = path
            self._commit_manifest(manifest)

    def _encoder_for(self, model_id: str) -> QueryEncoder:
        if model_id in self._encoders:
            return self._encoders[model_id]
        path = self._manifest.get("models", {}).get(model_id)
        if path is None and os.path.exists(model_id):
            path = model_id
        if path is None:
            raise LocalIndexError(f"Failed to find model with id [{model_id}] (local backend: register it with "
                                  "LocalIndex.register_model or pass a model directory as model_id)",
                                  "resource_not_found_exception", 404)
        enc = _load_query_encoder(path)
        self._encoders[model_id] = enc
        return enc

    def _analyzer_for(self, name: str) -> QueryEncoder:
        if name in self._analyzers:
            return self._analyzers[name]
        path = self._manifest.get("analyzers", {}).get(name)
        if path is None:
            raise LocalIndexError(f"analyzer [{name}] is not available on the local backend (the built-in "
                                  "bert-uncased/mbert-uncased tables ship only with OpenSearch); register one "
                                  "with LocalIndex.register_analyzer")
        enc = _load_analyzer(path)
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
        with _write_lock(self.path):
            self._reload_manifest()
            manifest = json.loads(json.dumps(self._manifest))
            props = manifest["mappings"]["properties"]
            existing = None
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
                    if existing is None:
                        existing = self._live_ids()
                    found = (did in final and final[did][0] == "index") or (did not in final and did in existing)
                    final[did] = ("delete", None)
                    items.append({"delete": {"_index": self.name, "_id": did, "status": 200 if found else 404,
                                             "result": "deleted" if found else "not_found"}})
                    continue
                source = action.get("_source")
                if source is None:
                    source = {k: v for k, v in action.items() if not k.startswith("_")}
                if op == "create":
                    if existing is None:
                        existing = self._live_ids()
                    if (did in final and final[did][0] == "index") or (did not in final and did in existing):
                        items.append({"create": {"_index": self.name, "_id": did, "status": 409, "error": {
                            "type": "version_conflict_engine_exception",
                            "reason": f"[{did}]: version conflict, document already exists"}}})
                        continue
                try:
                    doc = _validate_document(did, source, props)
                except LocalIndexError as err:
                    items.append({op: {"_index": self.name, "_id": did, "status": err.status,
                                       "error": {"type": err.error_type, "reason": err.reason}}})
                    continue
                if existing is None:
                    existing = self._live_ids()
                updated = (did in final and final[did][0] == "index") or (did not in final and did in existing)
                final[did] = ("index", doc)
                items.append({op: {"_index": self.name, "_id": did, "status": 200 if updated else 201,
                                   "result": "updated" if updated else "created"}})
            if final:
                seg = _build_segment(final, props)
                name = f"seg-{manifest['next_segment']:06d}.npz"
                _write_segment(self.path / name, seg)
                manifest["next_segment"] += 1
                manifest["segments"].append(name)
                live = set(existing) if existing is not None else None
                self._commit_manifest(manifest)
                if live is not None:
                    for did, (op, _doc) in final.items():
                        (live.add if op == "index" else live.discard)(did)
                    self._ids_cache = (tuple(manifest["segments"]), live)
                if len(manifest["segments"]) > _MERGE_AT:
                    self._merge_locked()
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

    def _live_ids(self) -> set[str]:
        # cached per manifest state so a stream of bulks does not re-read every segment each time
        key = tuple(self._manifest["segments"])
        if self._ids_cache is None or self._ids_cache[0] != key:
            self._ids_cache = (key, set(self._get_view().row_of))
        return self._ids_cache[1]

    def force_merge(self) -> None:
        """Rewrite all live documents into one segment (``POST <index>/_forcemerge``)."""
        with _write_lock(self.path):
            self._reload_manifest()
            self._merge_locked()

    def _merge_locked(self) -> None:
        manifest = json.loads(json.dumps(self._manifest))
        if len(manifest["segments"]) <= 1:
            return
        view = _View([_read_segment(self.path / s) for s in manifest["segments"]], self.vector_fields)
        fields = {f: (view.raw[f], view.terms[f]) for f in view.raw}
        seg = _Segment("", list(view.ids), [], list(view.sources), fields)
        name = f"seg-{manifest['next_segment']:06d}.npz"
        _write_segment(self.path / name, seg)
        old = manifest["segments"]
        manifest["segments"] = [name]
        manifest["next_segment"] += 1
        self._commit_manifest(manifest)
        for s in old:
            with contextlib.suppress(OSError):
                os.remove(self.path / s)

    def refresh(self) -> None:
        """Re-read the manifest and rebuild the searchable view (``POST <index>/_refresh``)."""
        self._reload_manifest()
        self._view = None
        self._get_view()

    def _get_view(self) -> _View:
        if self._view is None or self._view_key != tuple(self._manifest["segments"]):
            self._view_key = tuple(self._manifest["segments"])
            self._cleanup_orphans()
            segs = [_read_segment(self.path / s) for s in self._manifest["segments"]]
            self._view = _View(segs, self.vector_fields)
        return self._view

    def _cleanup_orphans(self) -> None:
        live = set(self._manifest["segments"])
        for p in self.path.glob("seg-*.npz*"):
            if p.name not in live:
                with contextlib.suppress(OSError):
                    # only files older than a minute: a concurrent writer may be about to commit
                    if time.time() - p.stat().st_mtime > 60:
                        os.remove(p)

    def count(self) -> int:
        """Number of live documents."""
        return len(self._get_view())

    def get(self, doc_id: str) -> dict | None:
        """``GET <index>/_doc/<id>``-like: the source with its vectors, or ``None``."""
        view = self._get_view()
        row = view.row_of.get(str(doc_id))
        return None if row is None else view.full_source(row)

    def doc_matrix(self, field: str, truncated: bool = True) -> tuple[sp.csr_matrix, list[str], list[str]]:
        """``(docs [N, V] CSR, doc ids, feature names)`` of a ``rank_features`` field."""
        view = self._get_view()
        self._check_vector_field(field)
        mat = view.by_feature[field].T.tocsr() if truncated else view.raw[field]
        return mat, list(view.ids), list(view.terms[field])

    # ---- searching ----------------------------------------------------------------------------

    def search(self, body: dict | None = None) -> dict:
        """Run a ``_search`` body; returns the OpenSearch response shape.

        Supported: ``query`` with ``neural_sparse`` (``query_tokens``, or ``query_text`` with a
        registered ``model_id``/``analyzer``), ``bool`` (must/filter/should/must_not,
        ``minimum_should_match``), ``match_all``, ``term`` (filter context), ``terms``, ``ids``,
        ``exists``; ``size``, ``from``, ``_source``, ``explain``, ``track_total_hits``.
        """
        t0 = time.perf_counter()
        body = dict(body or {})
        allowed = {"query", "size", "from", "_source", "explain", "track_total_hits", "timeout"}
        for key in body:
            if key not in allowed:
                raise LocalIndexError(f"Unknown key for a START_OBJECT in [{key}].", "parsing_exception")
        size = _int_param(body.get("size", 10), "size")
        from_ = _int_param(body.get("from", 0), "from")
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
        ctx = _Ctx(self, view, explain=bool(body.get("explain", False)))
        match, score = ctx.node(query, scoring=True)
        rows = np.flatnonzero(match)
        scores = score[rows].astype(np.float32) if score is not None else np.ones(len(rows), np.float32)
        order = _top_order(scores, from_ + size)
        page = order[from_:from_ + size]
        source_spec = body.get("_source", True)
        hits = []
        for i in page:
            row = int(rows[i])
            hit: dict[str, Any] = {"_index": self.name, "_id": view.ids[row], "_score": float(scores[i])}
            src = _filter_source(view, row, source_spec)
            if src is not None:
                hit["_source"] = src
            if ctx.explain:
                hit["_explanation"] = ctx.explanation(row, float(scores[i]))
            hits.append(hit)
        total = len(rows)
        tth = body.get("track_total_hits", TRACK_TOTAL_HITS)
        limit = TRACK_TOTAL_HITS if tth is None else (math.inf if tth is True else (0 if tth is False else int(tth)))
        total_obj = {"value": total, "relation": "eq"} if total <= limit else {"value": int(limit), "relation": "gte"}
        resp = {"took": int((time.perf_counter() - t0) * 1000), "timed_out": False,
                "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
                "hits": {"max_score": float(scores[order[0]]) if len(order) and size else None, "hits": hits}}
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

    def _check_vector_field(self, field: str) -> None:
        if field not in self.vector_fields:
            raise LocalIndexError("[neural_sparse] query only works on [rank_features] fields")

    def score_matrix(self, field: str, queries: sp.csr_matrix, query_terms: list[str], k: int = 100,
                     block: int = 256) -> tuple[list[list[int]], list[list[float]], list[str]]:
        """Batch scoring for evaluation: top-``k`` rows and scores per query row of ``queries``
        (``[Q, len(query_terms)]``), with exactly the scores :meth:`search` gives."""
        view = self._get_view()
        self._check_vector_field(field)
        vocab = view.vocab[field]
        cols = np.array([vocab.get(t, -1) for t in query_terms], dtype=np.int64)
        keep = np.flatnonzero(cols >= 0)
        q = queries.tocsc()[:, keep].astype(np.float32).astype(np.float64)
        dt = view.by_feature[field][cols[keep]].astype(np.float64)  # [kept terms, N]
        top_rows: list[list[int]] = []
        top_scores: list[list[float]] = []
        for start in range(0, q.shape[0], block):
            s = (q[start:start + block].tocsr() @ dt).toarray().astype(np.float32)
            for row in s:
                matched = np.flatnonzero(row > 0)
                sub = row[matched]
                order = _top_order(sub, k)
                top_rows.append([int(matched[i]) for i in order])
                top_scores.append([float(sub[i]) for i in order])
        return top_rows, top_scores, list(view.ids)


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------

_FIELD_TYPES = {"rank_features", "text", "keyword", "integer", "long", "float", "double", "boolean", "date",
                "object", "match_only_text"}


def _validate_mappings(mappings: dict) -> dict:
    if not isinstance(mappings, dict):
        raise LocalIndexError("mappings must be an object")
    props = mappings.get("properties", {} if "mappings" not in mappings else None)
    if props is None:
        props = mappings["mappings"].get("properties", {})
    if not isinstance(props, dict):
        raise LocalIndexError("[properties] must be an object")
    out = {}
    for field, spec in props.items():
        if not isinstance(spec, dict):
            raise LocalIndexError(f"Expected map for property [fields] on field [{field}] but got a {type(spec).__name__}",
                                  "mapper_parsing_exception")
        ftype = spec.get("type", "object")
        if ftype not in _FIELD_TYPES:
            raise LocalIndexError(f"No handler for type [{ftype}] declared on field [{field}] (local backend "
                                  f"supports {sorted(_FIELD_TYPES)})", "mapper_parsing_exception")
        out[field] = dict(spec, type=ftype)
    return out


def _validate_document(did: str, source: Any, props: dict) -> dict:
    """Validate one document like OpenSearch's mappers would; maps new token->weight fields as
    ``rank_features`` (a local convenience; always map vector fields explicitly on a cluster)."""
    if not isinstance(source, dict):
        raise LocalIndexError("The bulk request must be terminated by a newline [\\n]" if source is None else
                              f"failed to parse document [{did}]: _source must be an object", "mapper_parsing_exception")
    for field, value in source.items():
        spec = props.get(field)
        if spec is None and isinstance(value, dict) and value and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
            spec = props[field] = {"type": "rank_features"}
        if spec is None or spec.get("type") != "rank_features" or value is None:
            continue
        if not isinstance(value, dict):
            raise LocalIndexError(
                f"failed to parse field [{field}] of type [rank_features] in document with id '{did}'. "
                "Preview of field's value: '" + str(value)[:64] + "'", "mapper_parsing_exception")
        positive = spec.get("positive_score_impact", True)
        for key, weight in value.items():
            if not isinstance(key, str) or key == "":
                raise LocalIndexError(
                    f"failed to parse field [{field}] of type [rank_features] in document with id '{did}'. "
                    "feature names must be non-empty strings", "mapper_parsing_exception")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise LocalIndexError(
                    f"failed to parse field [{field}] of type [rank_features] in document with id '{did}'. "
                    "[rank_features] fields take hashes that map a feature to a strictly positive float, but got "
                    f"unexpected token {'VALUE_STRING' if isinstance(weight, str) else 'START_OBJECT'}",
                    "mapper_parsing_exception")
            w = float(np.float32(weight))
            if not positive and w != 0.0:
                w = float(np.float32(1.0 / w))
            if not math.isfinite(w):
                raise LocalIndexError(
                    f"failed to parse field [{field}] of type [rank_features] in document with id '{did}'. "
                    f"featureValue must be finite, got: {weight} for feature {key} on field {field}",
                    "mapper_parsing_exception")
            if w < FLOAT_MIN_NORMAL:
                raise LocalIndexError(
                    f"failed to parse field [{field}] of type [rank_features] in document with id '{did}'. "
                    f"featureValue must be a positive normal float, got: {weight} for feature {key} on field "
                    f"{field} which is less than the minimum positive normal float: {FLOAT_MIN_NORMAL}",
                    "mapper_parsing_exception")
    return source


def _build_segment(final: dict[str, tuple[str, dict | None]], props: dict) -> _Segment:
    ids, deleted, sources = [], [], []
    vec_fields = [f for f, m in props.items() if m.get("type") == "rank_features"]
    per_field: dict[str, tuple[list[int], list[int], list[float], dict[str, int]]] = {
        f: ([0], [], [], {}) for f in vec_fields}
    for did, (op, doc) in final.items():
        if op == "delete":
            deleted.append(did)
            continue
        ids.append(did)
        rest = {}
        for key, value in doc.items():
            if key in per_field:
                indptr, indices, data, vocab = per_field[key]
                positive = props[key].get("positive_score_impact", True)
                if isinstance(value, dict):
                    for tok, w in value.items():
                        w = float(np.float32(w))
                        indices.append(vocab.setdefault(tok, len(vocab)))
                        data.append(w if positive else 1.0 / w)
                if value is None:
                    rest[key] = None
            else:
                rest[key] = value
        for indptr, indices, _data, _vocab in per_field.values():
            indptr.append(len(indices))
        sources.append(json.dumps(rest, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    fields = {}
    for f, (indptr, indices, data, vocab) in per_field.items():
        if not vocab and not indices:
            mat = sp.csr_matrix((len(ids), 0), dtype=np.float32)
        else:
            mat = sp.csr_matrix((np.array(data, np.float32), np.array(indices, np.int32), np.array(indptr, np.int64)),
                                shape=(len(ids), len(vocab)))
        terms = [""] * len(vocab)
        for t, j in vocab.items():
            terms[j] = t
        fields[f] = (mat, terms)
    return _Segment("", ids, deleted, sources, fields)


def _int_param(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise LocalIndexError(f"[{name}] must be an integer, got [{value}]", "parsing_exception")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise LocalIndexError(f"[{name}] must be an integer, got [{value}]", "parsing_exception") from None


def _top_order(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` best scores, descending; ties keep insertion order (deterministic)."""
    n = len(scores)
    if k <= 0 or n == 0:
        return np.zeros(0, dtype=np.int64)
    if n > 4 * k:
        thr = np.partition(scores, n - k)[n - k]
        cand = np.flatnonzero(scores >= thr)
    else:
        cand = np.arange(n)
    order = cand[np.argsort(-scores[cand], kind="stable")]
    return order[:k]


def _filter_source(view: _View, row: int, spec: Any) -> dict | None:
    if spec is False:
        return None
    if spec is True or spec is None:
        return view.full_source(row)
    includes: list[str]
    excludes: list[str] = []
    if isinstance(spec, str):
        includes = [spec]
    elif isinstance(spec, list):
        includes = [str(s) for s in spec]
    elif isinstance(spec, dict):
        inc = spec.get("includes", spec.get("include", []))
        exc = spec.get("excludes", spec.get("exclude", []))
        includes = [inc] if isinstance(inc, str) else list(inc)
        excludes = [exc] if isinstance(exc, str) else list(exc)
    else:
        raise LocalIndexError("[_source] must be a boolean, a string, an array or an object", "parsing_exception")
    base = view.source(row)
    names = set(base) | {f for f in view.raw}
    keep = [n for n in names if (not includes or any(fnmatch.fnmatchcase(n, p) for p in includes))
            and not any(fnmatch.fnmatchcase(n, p) for p in excludes)]
    if any(n in view.raw for n in keep):
        full = view.full_source(row)
        return {n: full[n] for n in full if n in keep}
    return {n: base[n] for n in base if n in keep}


# --------------------------------------------------------------------------------------------
# query evaluation (vectorised over all live documents)
# --------------------------------------------------------------------------------------------


class _Ctx:
    def __init__(self, index: LocalIndex, view: _View, explain: bool):
        self.index = index
        self.view = view
        self.n = len(view)
        self.explain = explain
        self.sparse_clauses: list[tuple[str, dict[str, float], float]] = []

    def node(self, query: Any, scoring: bool) -> tuple[np.ndarray, np.ndarray | None]:
        if not isinstance(query, dict) or len(query) != 1:
            raise LocalIndexError("query malformed, must start with start_object" if not isinstance(query, dict)
                                  else "[_na] query malformed, no start_object after query name", "parsing_exception")
        (kind, spec), = query.items()
        handler = getattr(self, f"q_{kind}", None)
        if handler is None:
            raise LocalIndexError(f"unknown query [{kind}] (local backend supports neural_sparse, bool, match_all, "
                                  "term, terms, ids, exists)", "parsing_exception")
        return handler(spec, scoring)

    # match_all / term / terms / ids / exists -----------------------------------------------
    def q_match_all(self, spec: Any, scoring: bool):
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
            if value is None and field in self.view.raw:
                value = self.view.full_source(row).get(field)
            yield row, (value if isinstance(value, list) else [value])

    def _field_type(self, field: str) -> str:
        return self.index._manifest["mappings"]["properties"].get(field, {}).get("type", "keyword")

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

    def q_term(self, spec: Any, scoring: bool):
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

    def q_terms(self, spec: Any, scoring: bool):
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

    def q_ids(self, spec: Any, scoring: bool):
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

    def q_exists(self, spec: Any, scoring: bool):
        field = spec.get("field") if isinstance(spec, dict) else None
        if not field:
            raise LocalIndexError("[exists] must be provided with a [field]", "parsing_exception")
        if field in self.view.raw:
            mask = np.diff(self.view.raw[field].indptr) > 0
        else:
            mask = np.array([any(v is not None for v in vals) for _, vals in self._values(field)], bool)
        boost = float(spec.get("boost", 1.0))
        return mask, np.where(mask, boost, 0.0) if scoring else None

    # bool --------------------------------------------------------------------------------------
    def q_bool(self, spec: Any, scoring: bool):
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
            m, s = self.node(c, scoring)
            match &= m
            if s is not None:
                score += np.where(m, s, 0.0)
        for c in clauses("filter"):
            m, _ = self.node(c, False)
            match &= m
        for c in clauses("must_not"):
            m, _ = self.node(c, False)
            match &= ~m
        should = clauses("should")
        if should:
            msm = spec.get("minimum_should_match")
            if msm is None:
                msm = 0 if (clauses("must") or clauses("filter")) else 1
            msm = _min_should(msm, len(should))
            hits = np.zeros(self.n, np.int64)
            for c in should:
                m, s = self.node(c, scoring)
                hits += m
                if s is not None:
                    score += np.where(m, s, 0.0)
            match &= hits >= msm
        boost = float(spec.get("boost", 1.0))
        return match, (score * boost if scoring else None)

    # neural_sparse -------------------------------------------------------------------------------
    def q_neural_sparse(self, spec: Any, scoring: bool):
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
        self.index._check_vector_field(field)
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
                weights = dict(self.index._encoder_for(str(model_id))(text))
            else:
                weights = {k: v for k, v in self.index._analyzer_for(analyzer or "bert-uncased")(text).items() if v > 0}
        boost = float(params.get("boost", 1.0))
        q = {}
        for k, v in weights.items():
            w = float(np.float32(v))
            if not (0.0 < w <= 64.0) or math.isnan(w):
                raise LocalIndexError(f"weight must be in (0, 64.0], got: {w}")
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
        sub = self.view.by_feature[field][cols]  # [t, N] truncated doc weights
        score = np.asarray(sub.T.astype(np.float64) @ np.asarray(ws, np.float64)).ravel()
        match = np.diff(sub.tocsc().indptr) > 0
        return match, score * boost

    def explanation(self, row: int, total: float) -> dict:
        details = []
        for field, q, boost in self.sparse_clauses:
            vocab = self.view.vocab[field]
            mat = self.view.by_feature[field]
            for tok, w in q.items():
                j = vocab.get(tok)
                if j is None:
                    continue
                start, end = mat.indptr[j], mat.indptr[j + 1]
                pos = np.searchsorted(mat.indices[start:end], row)
                if pos < end - start and mat.indices[start + pos] == row:
                    d = float(mat.data[start + pos])
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


# --------------------------------------------------------------------------------------------
# query encoders for query_text (model_id / analyzer)
# --------------------------------------------------------------------------------------------


def _load_query_encoder(path: str) -> QueryEncoder:
    """``text -> {token: weight}`` from a path: a SPARSE_* zip, an export bundle dir (its
    ``sparse_encoding.zip``/``sparse_tokenize.zip``), or a ``SparseEncoder`` dir."""
    from ..opensearch.query import tokenize_query

    p = Path(path)
    if p.is_dir() and (p / "manifest.json").exists() and not (p / "modules.json").exists():
        for name in ("sparse_tokenize.zip", "sparse_encoding.zip"):
            if (p / name).exists():
                p = p / name
                break
    if p.suffix == ".zip":
        import zipfile

        with zipfile.ZipFile(p) as zf:
            names = set(zf.namelist())
            if not any(n.endswith((".pt", ".onnx")) for n in names):  # SPARSE_TOKENIZE: tokenizer (+ idf)
                from tokenizers import Tokenizer

                tok = Tokenizer.from_str(zf.read("tokenizer.json").decode("utf-8"))
                idf = json.loads(zf.read("idf.json")) if "idf.json" in names else None
                from ..opensearch.query import backend_tokenizer

                tok = backend_tokenizer(tok)
                return lambda text: tokenize_query(text, tok, idf)
        try:
            from ..opensearch.conformance import MLCommonsRuntime
        except ImportError as err:  # pragma: no cover - depends on H-export's module
            raise LocalIndexError(f"cannot run {p.name}: the ML Commons runtime is unavailable ({err})") from err
        rt = MLCommonsRuntime.from_zip(str(p), function_name="SPARSE_ENCODING")
        return lambda text: rt.predict([text])[0]
    from .encoders import sparse_encoder_query_fn

    return sparse_encoder_query_fn(str(p))


def _load_analyzer(path: str) -> QueryEncoder:
    from ..opensearch.query import backend_tokenizer

    p = Path(path)
    idf = None
    if p.suffix == ".zip":
        import zipfile

        from tokenizers import Tokenizer

        with zipfile.ZipFile(p) as zf:
            tok = Tokenizer.from_str(zf.read("tokenizer.json").decode("utf-8"))
            if "idf.json" in zf.namelist():
                idf = json.loads(zf.read("idf.json"))
    else:
        tok = backend_tokenizer(p)
        if (p / "idf.json").exists():
            idf = read_json(p / "idf.json")
    tok = backend_tokenizer(tok)
    tok.no_truncation()  # analyzers cover long text with overflow segments instead of truncating

    def analyze(text: str) -> dict[str, float]:
        # HFModelTokenizer: encode without special tokens; terms are raw tokens; idf.getOrDefault(term, 1)
        enc = tok.encode(text, add_special_tokens=False)
        return {t: float(idf.get(t, 1.0)) if idf is not None else 1.0 for t in enc.tokens}

    return analyze
