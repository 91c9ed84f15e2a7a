"""A faithful HTTP test double of OpenSearch + ML Commons + neural-search (``opensearch-contract.md`` section 8).

Start it with :meth:`OpenSearchDouble.start` (threaded ``http.server`` on 127.0.0.1, port 0) and point
opensearch-py at ``double.url``. Every request is logged and its body validated against the vendored
API spec (``spec.py``); ``double.violations`` lists what did not conform (documented deviations excepted).

Emulated (contract section in brackets): ``GET /`` version [4.4], ``_cat/plugins``, ``_cluster/settings``
and the ML Commons settings gates [1.2], model groups [1.3], ``_register_meta`` + raw chunks on new and
deprecated paths [1.4], deploy with the sha256 check and the memory breaker, tasks
CREATED->RUNNING->COMPLETED|FAILED [1.6], ``_predict`` response shapes [1.7], models executed through
``MLCommonsRuntime`` (the conformance runtime that runs a zip the way ML Commons does),
index create with mappings/analyzers, ``sparse_encoding`` ingest pipelines with prune validation [4.1],
``_bulk`` with per-item errors, ``rank_features`` 9-bit storage and ``neural_sparse`` scoring [4.2],
``sparse_vector`` + ``index.sparse`` [4.3], search pipelines (two-phase: applicability, window and
SEISMIC checks, full-query scores; hybrid normalization/RRF are computed).
Fault injection: arbitrary status codes per path, task FAILED, chunk corruption (hash mismatch),
breaker open, per-item bulk rejections.

Every known deviation from a real cluster:
``docs/opensearch-double-deviations.md``.
"""
from __future__ import annotations

import json
import logging
import re
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qsl, unquote, urlsplit

from .mlcommons import (BREAKER_OPEN, DISK_BREAKER_OPEN, LOCAL_FILE_GATE, NO_ELIGIBLE_NODE, MLCommonsMixin,
                        bytes_of, default_model_loader)
from .pipelines import PipelinesMixin
from .search import SearchMixin
from .spec import SpecValidator
from .store import ApiError, Index

__all__ = ["OpenSearchDouble", "Fault", "LOCAL_FILE_GATE", "BREAKER_OPEN", "DISK_BREAKER_OPEN", "NO_ELIGIBLE_NODE"]

logger = logging.getLogger(__name__)


_SETTING_DEFAULTS = {
    "plugins.ml_commons.allow_registering_model_via_local_file": False,
    "plugins.ml_commons.allow_registering_model_via_url": False,
    "plugins.ml_commons.only_run_on_ml_node": True,
    "plugins.ml_commons.jvm_heap_memory_threshold": 85,
    "plugins.ml_commons.disk_free_space_threshold": "5gb",
}
#: dynamic cluster settings the double knows; any other key is refused like OpenSearch's
#: ``AbstractScopedSettings.validate`` does ("persistent setting [x], not recognized").
#: ML Commons: MLCommonsSettings.java; neural-search: NeuralSearchSettings / SparseSettings (3.3.0.0).
KNOWN_SETTINGS = set(_SETTING_DEFAULTS) | {f"plugins.ml_commons.{name}" for name in (
    "trusted_url_regex", "native_memory_threshold", "model_access_control_enabled", "max_model_on_node",
    "max_deploy_model_tasks_per_node", "max_register_model_tasks_per_node", "model_auto_redeploy.enable",
    "model_auto_redeploy.lifetime_retry_times", "sync_up_job_interval_in_seconds", "monitoring_request_count",
    "ml_task_timeout_in_seconds", "trusted_connector_endpoints_regex", "allow_custom_deployment_plan",
    "local_model.enabled", "remote_inference.enabled")} | {
    "plugins.neural_search.circuit_breaker.limit", "plugins.neural_search.circuit_breaker.overhead",
    "plugins.neural_search.sparse.algo_param.index_thread_qty", "cluster.routing.allocation.disk.threshold_enabled",
    "cluster.routing.allocation.disk.watermark.low", "cluster.routing.allocation.disk.watermark.high",
    "cluster.routing.allocation.disk.watermark.flood_stage", "action.auto_create_index", "search.max_buckets"}


@dataclass
class Fault:
    """Answer the next ``times`` requests matching ``method``/``path`` with an error."""

    path: str
    status: int
    method: str | None = None
    times: int = 1
    type: str = "injected_fault"
    reason: str = "injected fault"

    def matches(self, method: str, path: str) -> bool:
        return self.times > 0 and (self.method is None or self.method == method) and re.search(self.path, path) is not None


def _truthy(value: Any) -> bool:
    return str(value).lower() == "true"


class OpenSearchDouble(MLCommonsMixin, PipelinesMixin, SearchMixin):
    """State and request handling. ``start()`` binds it to a local port."""

    def __init__(self, version: str = "3.3.0", plugins: set[str] | None = None, *, ml_node: bool = False,
                 model_loader: Callable[[Path, str], Any] | None = None, validate: bool = True,
                 task_delay_s: float = 0.05, spec_path: str | Path | None = None,
                 product: str = "opensearch") -> None:
        from opensearch_lsr.opensearch.client import parse_version

        if product not in ("opensearch", "elasticsearch"):
            raise ValueError(f"product must be opensearch or elasticsearch, got {product!r}")
        self.product = product

        self.version_string = version
        self.version = parse_version(version)
        self.plugins = set(plugins if plugins is not None else
                           {"opensearch-ml", "opensearch-neural-search", "analysis-nori", "opensearch-knn"})
        self.ml_node = ml_node
        self.model_loader = model_loader or default_model_loader
        self.validator = SpecValidator.shared(spec_path) if validate else None
        self.task_delay_s = task_delay_s
        self.node_id = "dblNode" + uuid.uuid4().hex[:14]
        self.settings: dict[str, Any] = {}
        self.model_groups: dict[str, dict[str, Any]] = {}
        self.models: dict[str, dict[str, Any]] = {}
        self.chunks: dict[str, dict[int, bytes]] = {}
        self.runtimes: dict[str, Any] = {}
        self.tasks: dict[str, dict[str, Any]] = {}
        self.indices: dict[str, Index] = {}
        self.ingest_pipelines: dict[str, dict[str, Any]] = {}
        self.search_pipelines: dict[str, dict[str, Any]] = {}
        self.two_phase_log: list[dict[str, Any]] = []  # one entry per search through a two-phase pipeline
        self.request_log: list[dict[str, Any]] = []
        self.violations: list[dict[str, Any]] = []
        self.faults: list[Fault] = []
        self.heap_used_percent = 40
        self.disk_free_bytes = 100 << 30
        self.fail_deploy_error: str | None = None
        #: False emulates an ML node that cannot reach publish.djl.ai and has no seeded PyTorch cache
        #: (``<path.data>/ml_cache/pytorch/<version>-cpu-precxx11-linux-x86_64``): SPARSE_ENCODING deploys fail
        self.djl_cache_seeded = True
        self.corrupt_chunks = 0
        self.reject_bulk_items = 0
        self.lock = threading.RLock()
        self._tmp = tempfile.TemporaryDirectory(prefix="os-double-")
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> "OpenSearchDouble":
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True   # one small response must not wait for a delayed ACK
            wbufsize = 1 << 16               # headers + body leave in one write (flushed per request)

            def log_message(self, *args):  # quiet
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, payload, ctype = double.handle(method, self.path, body, dict(self.headers))
                data = b""
                if payload is not None:
                    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if method != "HEAD":
                    self.wfile.write(data)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def do_PUT(self):
                self._serve("PUT")

            def do_DELETE(self):
                self._serve("DELETE")

            def do_HEAD(self):
                self._serve("HEAD")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
        self._tmp.cleanup()

    def __enter__(self) -> "OpenSearchDouble":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the double first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- fault injection ------------------------------------------------------------------------
    def inject(self, path: str, status: int, *, method: str | None = None, times: int = 1,
               reason: str = "injected fault", type: str = "injected_fault") -> Fault:
        fault = Fault(path=path, status=status, method=method, times=times, reason=reason, type=type)
        self.faults.append(fault)
        return fault

    def setting(self, name: str) -> Any:
        return self.settings.get(name, _SETTING_DEFAULTS.get(name))

    # -- dispatch -------------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any, str]:
        split = urlsplit(raw_path)
        path = unquote(split.path) or "/"
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        entry: dict[str, Any] = {"method": method, "path": path, "query": query, "body_bytes": len(body),
                                 "content_type": headers.get("Content-Type") or headers.get("content-type")}
        if self.validator is not None:
            result = self.validator.validate(method, path, query, body or None, entry["content_type"])
            entry["operation"] = result.operation
            entry["deviations"] = sorted(set(result.deviations))
            if result.errors:
                entry["violations"] = result.errors
                with self.lock:
                    self.violations.append({"method": method, "path": path, "errors": result.errors})
        status, payload, ctype = self._dispatch(method, path, query, body, entry)
        entry["status"] = status
        with self.lock:
            self.request_log.append(entry)
        return status, payload, ctype

    def _dispatch(self, method, path, query, body, entry) -> tuple[int, Any, str]:
        for fault in self.faults:
            if fault.matches(method, path):
                fault.times -= 1
                return fault.status, ApiError(fault.status, fault.type, fault.reason).body(), "application/json"
        if body and not entry.get("content_type"):
            err = ApiError(406, "content_type_exception", "Content-Type header is missing")
            return 406, err.body(), "application/json"
        try:
            status, payload = self._route(method, path, query, body)
            if isinstance(payload, str):
                return status, payload.encode("utf-8"), "text/plain; charset=UTF-8"
            return status, payload, "application/json"
        except ApiError as err:
            return err.status, err.body(), "application/json"

    def _json(self, body: bytes) -> Any:
        if not body:
            return {}
        try:
            return json.loads(body)
        except ValueError as err:
            raise ApiError(400, "parse_exception", f"request body is required to be valid JSON: {err}")

    def _route(self, method: str, path: str, query: dict, body: bytes) -> tuple[int, Any]:
        segs = [s for s in path.split("/") if s]
        if path == "/":
            if method in ("GET", "HEAD"):
                return 200, self._info()
        if segs[:2] == ["_plugins", "_ml"]:
            return self._ml(method, segs[2:], query, body)
        if segs == ["_cat", "plugins"] and method == "GET":
            rows = [{"name": self.node_id, "component": p, "version": self.version_string} for p in sorted(self.plugins)]
            if query.get("format") == "json":
                return 200, rows
            return 200, "".join(f"{r['name']} {r['component']} {r['version']}\n" for r in rows)
        if segs == ["_cluster", "settings"]:
            return self._cluster_settings(method, self._json(body))
        if segs[:2] == ["_ingest", "pipeline"] and len(segs) == 3:
            return self._ingest_pipeline(method, segs[2], self._json(body))
        if segs[:2] == ["_search", "pipeline"] and len(segs) == 3:
            return self._search_pipeline(method, segs[2], self._json(body))
        if segs == ["_bulk"] and method in ("POST", "PUT"):
            return self._bulk(None, query, body)
        if segs == ["_refresh"]:
            for idx in self.indices.values():
                idx.refresh()
            return 200, {"_shards": {"total": 1, "successful": 1, "failed": 0}}
        if segs and not segs[0].startswith("_"):
            return self._index_api(method, segs, query, body)
        raise ApiError(400, "illegal_argument_exception", f"no handler found for uri [{path}] and method [{method}]")

    def _info(self) -> dict[str, Any]:
        if self.product == "elasticsearch":  # Elasticsearch's GET / (no distribution, build_flavor, its tagline)
            return {"name": self.node_id, "cluster_name": "es-double", "cluster_uuid": "double",
                    "version": {"number": self.version_string, "build_flavor": "default", "build_type": "docker",
                                "lucene_version": "9.11.1"}, "tagline": "You Know, for Search"}
        return {"name": self.node_id, "cluster_name": "opensearch-double", "cluster_uuid": "double",
                "version": {"distribution": "opensearch", "number": self.version_string, "build_type": "tar",
                            "lucene_version": "9.12.0", "minimum_wire_compatibility_version": "2.19.0",
                            "minimum_index_compatibility_version": "2.0.0"},
                "tagline": "The OpenSearch Project: https://opensearch.org/"}

    def _cluster_settings(self, method: str, body: dict) -> tuple[int, Any]:
        if method == "GET":
            return 200, {"persistent": dict(self.settings), "transient": {}}
        if method != "PUT":
            raise ApiError(405, "method_not_allowed", "method not allowed")
        ack = {"persistent": {}, "transient": {}}
        for scope in ("persistent", "transient"):
            for key, value in (body.get(scope) or {}).items():
                # AbstractScopedSettings.updateSettings: deleting (null) an unknown key is allowed
                if key not in KNOWN_SETTINGS and value is not None:
                    # a SettingsException (type settings_exception), observed on OpenSearch 3.6.0
                    raise ApiError(400, "settings_exception", f"{scope} setting [{key}], not recognized")
        for scope in ("persistent", "transient"):
            for key, value in (body.get(scope) or {}).items():
                if value is None:  # null resets to the default
                    self.settings.pop(key, None)
                    ack[scope][key] = None
                    continue
                if key == "plugins.ml_commons.disk_free_space_threshold":
                    bytes_of(value)
                if key == "plugins.ml_commons.jvm_heap_memory_threshold" and not (0 <= int(value) <= 100):
                    raise ApiError(400, "illegal_argument_exception",
                                   f"Failed to parse value [{value}] for setting [{key}] must be <= 100")
                self.settings[key] = value
                ack[scope][key] = value
        return 200, {"acknowledged": True, **ack}

    # ======================================================================================
    # indices, documents, bulk, search
    # ======================================================================================
    def _index_api(self, method: str, segs: list[str], query: dict, body: bytes) -> tuple[int, Any]:
        name = segs[0]
        rest = segs[1:]
        if not rest:
            if method == "PUT":
                return self._create_index(name, self._json(body))
            if method in ("GET", "HEAD"):
                idx = self._get_index(name)
                return 200, {name: {"settings": _nest(idx.settings), "mappings": idx.mappings, "aliases": {}}}
            if method == "DELETE":  # a comma-separated list deletes each (all must exist unless ignore_unavailable)
                names = name.split(",")
                if _truthy_param(query.get("ignore_unavailable")):
                    names = [n for n in names if n in self.indices]
                for one in names:
                    self._get_index(one)
                for one in names:
                    del self.indices[one]
                return 200, {"acknowledged": True}
        if rest == ["_settings"] and method == "PUT":
            idx = self._get_index(name)
            new = self._json(body)
            from .store import _flatten_settings
            flat = _flatten_settings(new)
            if "index.sparse" in flat:
                raise ApiError(400, "illegal_argument_exception",
                               f"final {name} setting [index.sparse], not updateable")
            idx.settings.update(flat)
            return 200, {"acknowledged": True}
        if rest[:1] == ["_settings"] and len(rest) <= 2 and method == "GET":
            idx = self._get_index(name)
            flat = {k: v for k, v in idx.settings.items() if len(rest) == 1 or k == rest[1]}
            if _truthy_param(query.get("flat_settings")):
                return 200, {name: {"settings": {k: (str(v).lower() if isinstance(v, bool) else v)
                                                 for k, v in flat.items()}}}
            return 200, {name: {"settings": _nest(flat)}}
        if rest == ["_mapping"] and method == "GET":
            idx = self._get_index(name)
            return 200, {name: {"mappings": idx.mappings}}
        if rest == ["_refresh"]:
            self._get_index(name).refresh()
            return 200, {"_shards": {"total": 1, "successful": 1, "failed": 0}}
        if rest == ["_bulk"] and method in ("POST", "PUT"):
            return self._bulk(name, query, body)
        if rest[:1] == ["_doc"]:
            if method in ("PUT", "POST"):
                doc_id = rest[1] if len(rest) > 1 else uuid.uuid4().hex[:20]
                item = self._index_one(name, doc_id, self._json(body), query.get("pipeline"))
                self._maybe_refresh(name, query)
                return item["status"], {k: v for k, v in item.items() if k != "status"}
            if method == "GET" and len(rest) > 1:
                idx = self._get_index(name)
                doc = idx.docs.get(rest[1])
                if doc is None:
                    return 404, {"_index": name, "_id": rest[1], "found": False}
                return 200, {"_index": name, "_id": doc.id, "_version": doc.version, "found": True, "_source": doc.source}
            if method == "DELETE" and len(rest) > 1:
                found = self._get_index(name).delete_doc(rest[1])
                return (200 if found else 404), {"_index": name, "_id": rest[1], "result": "deleted" if found else "not_found"}
        if rest == ["_count"]:
            idx = self._get_index(name)
            return 200, {"count": len(idx.searchable())}
        if rest == ["_search"] and method in ("GET", "POST"):
            return 200, self._search(name, query, self._json(body))
        raise ApiError(400, "illegal_argument_exception", f"no handler found for uri [/{'/'.join(segs)}] and method [{method}]")

    def _get_index(self, name: str) -> Index:
        idx = self.indices.get(name)
        if idx is None:
            raise ApiError(404, "index_not_found_exception", f"no such index [{name}]")
        return idx

    def _create_index(self, name: str, body: dict) -> tuple[int, Any]:
        if name in self.indices:
            raise ApiError(400, "resource_already_exists_exception", f"index [{name}/double] already exists")
        if name != name.lower() or name.startswith(("_", "-", "+")):
            raise ApiError(400, "invalid_index_name_exception", f"Invalid index name [{name}], must be lowercase")
        settings = body.get("settings") or {}
        from .store import _flatten_settings
        flat = _flatten_settings(settings)
        if "index.sparse" in flat and self.version < (3, 3, 0):
            raise ApiError(400, "illegal_argument_exception", "unknown setting [index.sparse] please check that any "
                           "required plugins are installed, or check the breaking changes documentation for removed settings")
        for key in ("index.default_pipeline",):
            pid = flat.get(key)
            if pid and pid != "_none" and pid not in self.ingest_pipelines:
                # OpenSearch accepts a missing pipeline at creation and fails at ingest; keep that behaviour
                logger.info("index %s names missing pipeline %s", name, pid)
        self.indices[name] = Index(name, settings, body.get("mappings") or {}, plugins=self.plugins, version=self.version)
        return 200, {"acknowledged": True, "shards_acknowledged": True, "index": name}

    def _index_one(self, index_name: str, doc_id: str, source: dict, pipeline: str | None) -> dict[str, Any]:
        try:
            if index_name not in self.indices:  # auto-create with dynamic mappings
                self.indices[index_name] = Index(index_name, {}, {}, plugins=self.plugins, version=self.version)
            idx = self.indices[index_name]
            pid = pipeline or idx.settings.get("index.default_pipeline")
            if pid and pid != "_none":
                source = self._run_ingest(idx, pid, doc_id, source)
            result, version = idx.index_doc(doc_id, source)
            return {"_index": index_name, "_id": doc_id, "_version": version, "result": result,
                    "_shards": {"total": 1, "successful": 1, "failed": 0}, "status": 201 if result == "created" else 200}
        except ApiError as err:
            return {"_index": index_name, "_id": doc_id, "status": err.status, "error": err.item()}

    def _maybe_refresh(self, index: str | None, query: dict) -> None:
        if query.get("refresh") in ("true", "", "wait_for"):
            for name, idx in self.indices.items():
                if index is None or name == index:
                    idx.refresh()

    def _bulk(self, default_index: str | None, query: dict, body: bytes) -> tuple[int, Any]:
        start = time.monotonic()
        lines = [line for line in body.decode("utf-8").split("\n") if line.strip()]
        items = []
        i = 0
        touched: set[str] = set()
        while i < len(lines):
            action = json.loads(lines[i])
            (op, meta), = action.items()
            index_name = meta.get("_index") or default_index
            doc_id = str(meta.get("_id") or uuid.uuid4().hex[:20])
            if index_name is None:
                raise ApiError(400, "action_request_validation_exception", "Validation Failed: 1: index is missing;")
            touched.add(index_name)
            if op == "delete":
                found = index_name in self.indices and self.indices[index_name].delete_doc(doc_id)
                items.append({"delete": {"_index": index_name, "_id": doc_id, "status": 200 if found else 404,
                                         "result": "deleted" if found else "not_found"}})
                i += 1
                continue
            source = json.loads(lines[i + 1])
            i += 2
            if op not in ("index", "create"):
                items.append({op: {"_index": index_name, "_id": doc_id, "status": 400, "error": {
                    "type": "illegal_argument_exception", "reason": f"the double does not emulate bulk [{op}]"}}})
                continue
            if self.reject_bulk_items > 0:
                self.reject_bulk_items -= 1
                items.append({op: {"_index": index_name, "_id": doc_id, "status": 429, "error": {
                    "type": "es_rejected_execution_exception",
                    "reason": "rejected execution of coordinating operation [queue capacity reached]"}}})
                continue
            if op == "create" and index_name in self.indices and doc_id in self.indices[index_name].docs:
                items.append({op: {"_index": index_name, "_id": doc_id, "status": 409, "error": {
                    "type": "version_conflict_engine_exception",
                    "reason": f"[{doc_id}]: version conflict, document already exists"}}})
                continue
            item = self._index_one(index_name, doc_id, source, meta.get("pipeline") or query.get("pipeline"))
            items.append({op: item})
        self._maybe_refresh(None, query)
        errors = any("error" in next(iter(it.values())) for it in items)
        return 200, {"took": int((time.monotonic() - start) * 1000), "errors": errors, "items": items}

    # -- introspection for tests -------------------------------------------------------------------
    def requests_to(self, pattern: str, method: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.request_log if re.search(pattern, e["path"]) and (method is None or e["method"] == method)]


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value if not isinstance(value, bool) else str(value).lower()
    return out


def _truthy_param(value: Any) -> bool:
    return value is not None and str(value).lower() in ("", "true")
