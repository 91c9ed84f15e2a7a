"""A faithful HTTP test double of OpenSearch + ML Commons + neural-search (``opensearch-contract.md`` section 8).

Start it with :meth:`OpenSearchDouble.start` (threaded ``http.server`` on 127.0.0.1, port 0) and point
opensearch-py at ``double.url``. Every request is logged and its body validated against the vendored
API spec (``spec.py``); ``double.violations`` lists what did not conform (documented deviations excepted).

Emulated (contract section in brackets): ``GET /`` version [4.4], ``_cat/plugins``, ``_cluster/settings``
and the ML Commons settings gates [1.2], model groups [1.3], ``_register_meta`` + raw chunks on new and
deprecated paths [1.4], deploy with the sha256 check and the memory breaker, tasks
CREATED->RUNNING->COMPLETED|FAILED [1.6], ``_predict`` response shapes [1.7], models executed through
H-export's ``MLCommonsRuntime`` (the conformance runtime that runs a zip the way ML Commons does),
index create with mappings/analyzers, ``sparse_encoding`` ingest pipelines with prune validation [4.1],
``_bulk`` with per-item errors, ``rank_features`` 9-bit storage and ``neural_sparse`` scoring [4.2],
``sparse_vector`` + ``index.sparse`` [4.3], search pipelines (two-phase is a pass-through: with the
default window the two-phase result equals the full query's; hybrid normalization/RRF are computed).
Fault injection: arbitrary status codes per path, task FAILED, chunk corruption (hash mismatch),
breaker open, per-item bulk rejections.
"""
from __future__ import annotations

import base64
import hashlib
import itertools
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

from .spec import SpecValidator
from .store import ApiError, Index, analyze, eval_query

__all__ = ["OpenSearchDouble", "Fault", "LOCAL_FILE_GATE", "BREAKER_OPEN", "DISK_BREAKER_OPEN", "NO_ELIGIBLE_NODE"]

logger = logging.getLogger(__name__)

LOCAL_FILE_GATE = ("To upload custom model from local file, user needs to enable allow_registering_model_via_local_file "
                   "settings. Otherwise please use opensearch pre-trained models")
BREAKER_OPEN = "Memory Circuit Breaker is open, please check your resources!"
DISK_BREAKER_OPEN = "Disk Circuit Breaker is open, please check your resources!"
#: ``_deploy``'s own message (ml-commons TransportDeployModelAction, 3.3.0.0)
NO_ELIGIBLE_NODE = "no eligible node found"
#: MLTaskDispatcher's message (dispatching predict/register tasks)
NO_ML_NODE = ("No eligible node found to execute this request. It's best practice to provision ML nodes to serve your "
              "models. You can disable this setting to serve the model on your data node for development purposes by "
              "disabling the \"plugins.ml_commons.only_run_on_ml_node\" configuration using the _cluster/setting api")
CHUNK_SIZE = 10_000_000
ML = "/_plugins/_ml"
_RUNTIME_CACHE: dict[tuple[str, str], Any] = {}
_RUNTIME_LOCK = threading.Lock()

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


def _bytes_of(value: Any) -> int:
    """``"5gb"`` -> bytes (OpenSearch ByteSizeValue units)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|tb|pb)?\s*", str(value).lower())
    if not match:
        raise ApiError(400, "illegal_argument_exception", f"failed to parse setting value [{value}] as a size in bytes")
    unit = {"b": 1, None: 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40, "pb": 1 << 50}[match.group(2)]
    return int(float(match.group(1)) * unit)


def default_model_loader(zip_path: Path, function_name: str):
    """Load a deployed zip with H-export's conformance runtime (cached per content hash)."""
    from opensearch_lsr.opensearch.conformance import MLCommonsRuntime

    digest = hashlib.sha256(Path(zip_path).read_bytes()).hexdigest()
    key = (digest, function_name)
    with _RUNTIME_LOCK:
        if key not in _RUNTIME_CACHE:
            _RUNTIME_CACHE[key] = MLCommonsRuntime.from_zip(zip_path, function_name=function_name)
        return _RUNTIME_CACHE[key]


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


class OpenSearchDouble:
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
        self.request_log: list[dict[str, Any]] = []
        self.violations: list[dict[str, Any]] = []
        self.faults: list[Fault] = []
        self.heap_used_percent = 40
        self.disk_free_bytes = 100 << 30
        self.fail_deploy_error: str | None = None
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
            for key in (body.get(scope) or {}):
                if key not in KNOWN_SETTINGS:
                    raise ApiError(400, "illegal_argument_exception", f"{scope} setting [{key}], not recognized")
        for scope in ("persistent", "transient"):
            for key, value in (body.get(scope) or {}).items():
                if value is None:  # null resets to the default
                    self.settings.pop(key, None)
                    ack[scope][key] = None
                    continue
                if key == "plugins.ml_commons.disk_free_space_threshold":
                    _bytes_of(value)
                if key == "plugins.ml_commons.jvm_heap_memory_threshold" and not (0 <= int(value) <= 100):
                    raise ApiError(400, "illegal_argument_exception",
                                   f"Failed to parse value [{value}] for setting [{key}] must be <= 100")
                self.settings[key] = value
                ack[scope][key] = value
        return 200, {"acknowledged": True, **ack}

    # ======================================================================================
    # ML Commons
    # ======================================================================================
    def _ml(self, method: str, segs: list[str], query: dict, body: bytes) -> tuple[int, Any]:
        if "opensearch-ml" not in self.plugins:
            raise ApiError(400, "illegal_argument_exception", "no handler found for uri [/_plugins/_ml] (ML Commons is not installed)")
        if segs == ["model_groups", "_register"] and method == "POST":
            return self._register_group(self._json(body))
        if segs == ["model_groups", "_search"] and method in ("GET", "POST"):
            return 200, self._search_docs(self.model_groups, self._json(body))
        if segs in (["models", "_register_meta"], ["models", "meta"]) and method == "POST":
            return self._register_meta(body)
        if len(segs) == 4 and segs[0] == "models" and segs[2] in ("upload_chunk", "chunk") and method == "POST":
            return self._upload_chunk(segs[1], segs[3], body)
        if len(segs) == 3 and segs[0] == "models" and segs[2] in ("_deploy", "_load") and method == "POST":
            return self._deploy(segs[1])
        if len(segs) == 3 and segs[0] == "models" and segs[2] in ("_undeploy", "_unload") and method == "POST":
            return self._undeploy(segs[1])
        if segs == ["models", "_search"] and method in ("GET", "POST"):
            docs = {mid: {k: v for k, v in m.items() if not k.startswith("_")} for mid, m in self.models.items()}
            for mid, chunks in self.chunks.items():  # chunk docs live in the same index (contract 1.4)
                for n in chunks:
                    docs[f"{mid}_{n}"] = {"model_id": mid, "chunk_number": n, "name": self.models[mid]["name"],
                                          "algorithm": self.models[mid]["algorithm"],
                                          "model_content_hash_value": self.models[mid]["model_content_hash_value"]}
            return 200, self._search_docs(docs, self._json(body))
        if len(segs) == 2 and segs[0] == "models" and method == "GET":
            model = self._model(segs[1])
            return 200, {k: v for k, v in model.items() if not k.startswith("_")}
        if len(segs) == 2 and segs[0] == "models" and method == "DELETE":
            model = self._model(segs[1])
            if model["model_state"] in ("DEPLOYED", "DEPLOYING", "PARTIALLY_DEPLOYED"):
                raise ApiError(400, "illegal_argument_exception",
                               f"Model cannot be deleted in deploying or deployed state. Try undeploy model first then delete")
            del self.models[segs[1]]
            self.chunks.pop(segs[1], None)
            return 200, {"_index": ".plugins-ml-model", "_id": segs[1], "result": "deleted"}
        if len(segs) == 2 and segs[0] == "tasks" and method == "GET":
            task = self.tasks.get(segs[1])
            if task is None:
                raise ApiError(404, "status_exception", "Failed to find task")
            return 200, dict(task)
        if len(segs) == 3 and segs[0] == "_predict" and method == "POST":
            return self._predict(segs[2], self._json(body), algorithm=segs[1])
        if len(segs) == 3 and segs[0] == "models" and segs[2] == "_predict" and method == "POST":
            return self._predict(segs[1], self._json(body), algorithm=None)
        raise ApiError(400, "illegal_argument_exception", f"no handler found for uri [{ML}/{'/'.join(segs)}] and method [{method}]")

    def _model(self, model_id: str) -> dict[str, Any]:
        model = self.models.get(model_id)
        if model is None:
            raise ApiError(404, "status_exception", "Failed to find model")
        return model

    def _search_docs(self, docs: dict[str, dict], body: dict) -> dict[str, Any]:
        query = body.get("query")
        hits = [{"_index": ".plugins-ml", "_id": did, "_score": 1.0, "_source": src}
                for did, src in docs.items() if eval_query(query, {**src, "_id": did})]
        size = int(body.get("size", 10))
        return {"took": 1, "timed_out": False, "hits": {"total": {"value": len(hits), "relation": "eq"},
                                                         "max_score": 1.0 if hits else None, "hits": hits[:size]}}

    def _register_group(self, body: dict) -> tuple[int, Any]:
        name = body.get("name")
        if not name:
            raise ApiError(400, "illegal_argument_exception", "model group name is required")
        for gid, group in self.model_groups.items():
            if group["name"] == name:
                raise ApiError(400, "illegal_argument_exception",
                               f"The name you provided is already being used by a model group with ID: {gid}.")
        gid = uuid.uuid4().hex[:20]
        self.model_groups[gid] = {"name": name, "description": body.get("description", ""), "latest_version": 0,
                                  "access": body.get("access_mode", "public")}
        return 200, {"model_group_id": gid, "status": "CREATED"}

    def _register_meta(self, body: bytes) -> tuple[int, Any]:
        if not _truthy(self.setting("plugins.ml_commons.allow_registering_model_via_local_file")):
            raise ApiError(400, "illegal_argument_exception", LOCAL_FILE_GATE)
        if not body:
            raise ApiError(400, "i_o_exception", "Model meta request has empty body")
        meta = self._json(body)
        function_name = str(meta.get("function_name", "TEXT_EMBEDDING")).upper()
        for key in ("name", "model_format", "model_content_hash_value", "total_chunks"):
            if meta.get(key) in (None, ""):
                raise ApiError(400, "illegal_argument_exception", f"{key} is null")
        if meta["model_format"] not in ("TORCH_SCRIPT", "ONNX"):  # MLModelFormat.valueOf is case-sensitive
            raise ApiError(400, "illegal_argument_exception",
                           f"No enum constant org.opensearch.ml.common.model.MLModelFormat.{meta['model_format']}")
        if function_name not in ("SPARSE_ENCODING", "SPARSE_TOKENIZE") and "model_config" not in meta:
            raise ApiError(400, "illegal_argument_exception", "model config is null")
        group_id = meta.get("model_group_id")
        if group_id and group_id not in self.model_groups:
            raise ApiError(404, "status_exception", "Failed to find model group")
        if not group_id:  # reuse or create a group named after the model (TransportRegisterModelMetaAction)
            group_id = next((g for g, v in self.model_groups.items() if v["name"] == meta["name"]), None)
            if group_id is None:
                group_id = self._register_group({"name": meta["name"]})[1]["model_group_id"]
        group = self.model_groups[group_id]
        group["latest_version"] += 1
        model_id = uuid.uuid4().hex[:20]
        self.models[model_id] = {
            "model_id": model_id, "name": meta["name"], "model_group_id": group_id,
            "model_version": str(group["latest_version"]), "description": meta.get("description", ""),
            # MLModel.toXContent writes the function name as "algorithm" (ml-commons MLModel.java, ml_model.json)
            "algorithm": function_name, "model_format": meta["model_format"],
            "model_state": "REGISTERING", "model_content_hash_value": meta["model_content_hash_value"],
            "model_content_size_in_bytes": meta.get("model_content_size_in_bytes"),
            "total_chunks": int(meta["total_chunks"]), "created_time": int(time.time() * 1000),
            "model_config": meta.get("model_config"),
        }
        self.chunks[model_id] = {}
        return 200, {"model_id": model_id, "status": "CREATED"}

    def _upload_chunk(self, model_id: str, number: str, body: bytes) -> tuple[int, Any]:
        if not _truthy(self.setting("plugins.ml_commons.allow_registering_model_via_local_file")):
            raise ApiError(400, "illegal_argument_exception", LOCAL_FILE_GATE)
        model = self._model(model_id)
        n = int(number)
        # MLModelChunkUploader throws a plain java.lang.Exception for these three, which OpenSearch
        # answers with HTTP 500 and type "exception" (ml-commons 3.3.0.0, MLModelChunkUploader.java)
        if n >= model["total_chunks"]:
            raise ApiError(500, "exception", "Chunk number exceeds total chunks")
        if not body:
            raise ApiError(500, "exception", "Chunk size either 0 or null")
        if len(body) > CHUNK_SIZE:
            raise ApiError(500, "exception", "Chunk size exceeds 10MB")
        data = bytes(body)
        if self.corrupt_chunks > 0:
            self.corrupt_chunks -= 1
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        # stored base64 in a doc with id <model_id>_<n>; the raw request bytes ARE the chunk
        self.chunks[model_id][n] = base64.b64decode(base64.b64encode(data))
        if n == model["total_chunks"] - 1:  # REGISTERED when the last chunk arrives, present or not
            model["model_state"] = "REGISTERED"
        return 200, {"status": "Uploaded"}

    def _new_task(self, model_id: str, task_type: str, function_name: str) -> dict[str, Any]:
        task_id = uuid.uuid4().hex[:20]
        now = int(time.time() * 1000)
        task = {"task_id": task_id, "model_id": model_id, "task_type": task_type, "function_name": function_name,
                "state": "CREATED", "worker_node": [self.node_id], "create_time": now, "last_update_time": now,
                "is_async": True}
        self.tasks[task_id] = task
        return task

    def _deploy(self, model_id: str) -> tuple[int, Any]:
        model = self._model(model_id)
        if not self.ml_node and _truthy(self.setting("plugins.ml_commons.only_run_on_ml_node")):
            # TransportDeployModelAction.deployModel: no eligible node -> synchronous 400 with this short text
            raise ApiError(400, "illegal_argument_exception", NO_ELIGIBLE_NODE)
        # no model-state check at _deploy (TransportDeployModelAction): a REGISTERING model gets a task,
        # which fails when the worker cannot assemble the chunks (_run_deploy's hash/chunk check)
        task = self._new_task(model_id, "DEPLOY_MODEL", model["algorithm"])
        model["model_state"] = "DEPLOYING"
        threading.Thread(target=self._run_deploy, args=(model, task), daemon=True).start()
        return 200, {"task_id": task["task_id"], "task_type": "DEPLOY_MODEL", "status": "CREATED"}

    def _run_deploy(self, model: dict[str, Any], task: dict[str, Any]) -> None:
        time.sleep(self.task_delay_s)
        task.update(state="RUNNING", last_update_time=int(time.time() * 1000))
        time.sleep(self.task_delay_s)
        model_id = model["model_id"]
        try:
            threshold = int(self.setting("plugins.ml_commons.jvm_heap_memory_threshold"))
            if threshold < 100 and self.heap_used_percent > threshold:
                raise RuntimeError(BREAKER_OPEN)
            if self.disk_free_bytes < _bytes_of(self.setting("plugins.ml_commons.disk_free_space_threshold")):
                raise RuntimeError(DISK_BREAKER_OPEN)  # DiskCircuitBreaker (ml-commons >= 2.16)
            if self.fail_deploy_error:
                error, self.fail_deploy_error = self.fail_deploy_error, None
                raise RuntimeError(error)
            chunks = self.chunks.get(model_id, {})
            data = b"".join(chunks[i] for i in sorted(chunks))
            if len(chunks) != model["total_chunks"] or hashlib.sha256(data).hexdigest() != model["model_content_hash_value"]:
                raise RuntimeError("model content changed")
            zip_path = Path(self._tmp.name) / f"{model_id}.zip"
            zip_path.write_bytes(data)
            try:
                runtime = self.model_loader(zip_path, model["algorithm"])
                runtime.predict(["warm up sentence"], "word")  # DLModel.warmUp
            except Exception as err:  # noqa: BLE001 - every load error becomes this message (DLModel.loadModel)
                logger.info("deploy of %s failed: %r", model_id, err)
                raise RuntimeError(f"Failed to deploy model {model_id}") from err
            self.runtimes[model_id] = runtime
            model["model_state"] = "DEPLOYED"
            task.update(state="COMPLETED", last_update_time=int(time.time() * 1000))
        except Exception as err:  # noqa: BLE001 - every failure ends the task FAILED with its message
            model["model_state"] = "DEPLOY_FAILED"
            task.update(state="FAILED", error=json.dumps({self.node_id: str(err)}),
                        last_update_time=int(time.time() * 1000))

    def _undeploy(self, model_id: str) -> tuple[int, Any]:
        model = self._model(model_id)
        self.runtimes.pop(model_id, None)
        model["model_state"] = "UNDEPLOYED"
        return 200, {self.node_id: {"stats": {model_id: "undeployed"}}}

    def _runtime(self, model_id: str):
        model = self.models.get(model_id)
        if model is None:
            raise ApiError(404, "status_exception", "Failed to find model")
        runtime = self.runtimes.get(model_id)
        if runtime is None or model["model_state"] != "DEPLOYED":
            raise ApiError(400, "illegal_argument_exception",
                           f"Model not ready yet. Please run this first: POST /_plugins/_ml/models/{model_id}/_deploy")
        return model, runtime

    def predict_map(self, model_id: str, texts: list[str], embedding_format: str = "word") -> list[dict[str, float]]:
        model, runtime = self._runtime(model_id)
        if model["algorithm"] not in ("SPARSE_ENCODING", "SPARSE_TOKENIZE"):
            raise ApiError(400, "illegal_argument_exception", "wrong function name for sparse inference")
        return [dict(m) for m in runtime.predict(list(texts), embedding_format)]

    def _predict(self, model_id: str, body: dict, algorithm: str | None) -> tuple[int, Any]:
        model, _ = self._runtime(model_id)
        if algorithm is not None and algorithm.upper() != model["algorithm"]:
            raise ApiError(400, "illegal_argument_exception",
                           f"Wrong function name: {algorithm.upper()} does not match model function {model['algorithm']}")
        texts = body.get("text_docs")
        if not isinstance(texts, list) or not texts:
            raise ApiError(400, "illegal_argument_exception", "Empty text docs")
        fmt = "word"
        params = body.get("parameters") or {}
        if "sparse_embedding_format" in params:
            if self.version < (3, 2, 0):
                raise ApiError(400, "illegal_argument_exception", "unknown parameter [sparse_embedding_format]")
            value = str(params["sparse_embedding_format"]).upper()
            if value not in ("WORD", "TOKEN_ID"):
                raise ApiError(400, "illegal_argument_exception",
                               f"No enum constant org.opensearch.ml.common.input.parameter.textembedding.SparseEmbeddingFormat.{value}")
            fmt = value.lower()
        maps = self.predict_map(model_id, texts, fmt)
        results = []
        for weights in maps:
            tensor: dict[str, Any] = {"dataAsMap": {"response": [weights]}}
            if model["algorithm"] == "SPARSE_ENCODING":  # SPARSE_TOKENIZE tensors carry no name
                tensor = {"name": "output", **tensor}
            results.append({"output": [tensor]})
        return 200, {"inference_results": results}

    # ======================================================================================
    # pipelines
    # ======================================================================================
    def _ingest_pipeline(self, method: str, pid: str, body: dict) -> tuple[int, Any]:
        if method == "GET":
            if pid not in self.ingest_pipelines:
                return 404, {}
            return 200, {pid: self.ingest_pipelines[pid]}
        if method == "DELETE":
            if self.ingest_pipelines.pop(pid, None) is None:
                raise ApiError(404, "resource_not_found_exception", f"pipeline [{pid}] is missing")
            return 200, {"acknowledged": True}
        if method != "PUT":
            raise ApiError(405, "method_not_allowed", "method not allowed")
        for proc in body.get("processors", []):
            (ptype, config), = proc.items()
            self._validate_ingest_processor(ptype, dict(config))
        self.ingest_pipelines[pid] = body
        return 200, {"acknowledged": True}

    def _validate_ingest_processor(self, ptype: str, config: dict[str, Any]) -> None:
        if ptype != "sparse_encoding" or "opensearch-neural-search" not in self.plugins:
            raise ApiError(400, "parse_exception", f"No processor type exists with name [{ptype}]")
        allowed = {"model_id", "field_map", "tag", "description", "ignore_failure", "if", "on_failure"}
        if self.version >= (2, 16, 0):
            allowed.add("batch_size")
        if self.version >= (2, 19, 0):
            allowed |= {"prune_type", "prune_ratio"}
        if self.version >= (3, 0, 0):
            allowed.add("skip_existing")
        for key in ("model_id", "field_map"):
            if key not in config:
                raise ApiError(400, "parse_exception", f"[{key}] required property is missing")
        extra = [k for k in config if k not in allowed]
        if extra:
            raise ApiError(400, "parse_exception",
                           f"processor [sparse_encoding] doesn't support one or more provided configuration parameters {extra}")
        prune_type = config.get("prune_type") or "none"
        checks = {"none": None, "top_k": (lambda r: r > 0 and r == int(r), "prune_ratio should be positive integer."),
                  "max_ratio": (lambda r: 0 <= r < 1, "prune_ratio should be in the range [0, 1)."),
                  "alpha_mass": (lambda r: 0 <= r < 1, "prune_ratio should be in the range [0, 1)."),
                  "abs_value": (lambda r: r >= 0, "prune_ratio should be non-negative.")}
        if prune_type not in checks:
            raise ApiError(400, "illegal_argument_exception", f"Unknown prune type: {prune_type}")
        if prune_type != "none":
            if "prune_ratio" not in config:
                raise ApiError(400, "parse_exception", "[prune_ratio] required property is missing")
            ratio = float(config["prune_ratio"])
            ok, desc = checks[prune_type]
            if not ok(ratio):
                raise ApiError(400, "illegal_argument_exception",
                               f"Illegal prune_ratio {ratio:f} for prune_type: {prune_type}. {desc}")
        elif "prune_ratio" in config:
            raise ApiError(400, "illegal_argument_exception",
                           "prune_ratio field is not supported when prune_type is not provided")

    def _search_pipeline(self, method: str, pid: str, body: dict) -> tuple[int, Any]:
        if method == "GET":
            if pid not in self.search_pipelines:
                return 404, {}
            return 200, {pid: self.search_pipelines[pid]}
        if method == "DELETE":
            self.search_pipelines.pop(pid, None)
            return 200, {"acknowledged": True}
        if method != "PUT":
            raise ApiError(405, "method_not_allowed", "method not allowed")
        for proc in body.get("request_processors", []) or []:
            (ptype, config), = proc.items()
            if ptype == "neural_sparse_two_phase_processor" and self.version >= (2, 15, 0):
                params = config.get("two_phase_parameter", {}) or {}
                prune_type = params.get("prune_type", "max_ratio")
                if "prune_type" in params and self.version < (2, 19, 0):
                    raise ApiError(400, "illegal_argument_exception", "unknown parameter [prune_type] in two_phase_parameter")
                ratio = float(params.get("prune_ratio", 0.4))
                if prune_type in ("max_ratio", "alpha_mass") and not 0 <= ratio < 1:
                    raise ApiError(400, "illegal_argument_exception",
                                   f"Illegal prune_ratio {ratio:f} for prune_type: {prune_type}. prune_ratio should be in the range [0, 1).")
                if float(params.get("expansion_rate", 5.0)) < 1.0:
                    raise ApiError(400, "illegal_argument_exception", "two_phase_parameter.expansion_rate must be >= 1.0")
                if int(params.get("max_window_size", 10000)) < 50:
                    raise ApiError(400, "illegal_argument_exception", "two_phase_parameter.max_window_size must be >= 50")
            elif ptype == "neural_query_enricher":
                pass
            else:
                raise ApiError(400, "illegal_argument_exception", f"Invalid processor type [{ptype}]")
        for proc in body.get("phase_results_processors", []) or []:
            (ptype, config), = proc.items()
            if ptype == "normalization-processor" and self.version >= (2, 10, 0):
                tech = (config.get("normalization") or {}).get("technique", "min_max")
                comb = config.get("combination") or {}
                if tech not in ("min_max", "l2", "z_score"):
                    raise ApiError(400, "illegal_argument_exception", f"provided normalization technique [{tech}] is not supported")
                if comb.get("technique", "arithmetic_mean") not in ("arithmetic_mean", "geometric_mean", "harmonic_mean"):
                    raise ApiError(400, "illegal_argument_exception",
                                   f"provided combination technique [{comb.get('technique')}] is not supported")
                weights = (comb.get("parameters") or {}).get("weights")
                if weights is not None and abs(sum(weights) - 1.0) > 0.0001:
                    raise ApiError(400, "illegal_argument_exception",
                                   f"sum of weights for combination must be equal to 1.0, supplied weights sum: {sum(weights)}")
            elif ptype == "score-ranker-processor" and self.version >= (2, 19, 0):
                comb = config.get("combination") or {}
                if comb.get("technique") != "rrf":
                    raise ApiError(400, "illegal_argument_exception", "only the [rrf] technique is supported by score-ranker-processor")
                if int(comb.get("rank_constant", 60)) < 1:
                    raise ApiError(400, "illegal_argument_exception", "rank constant must be >= 1")
            else:
                raise ApiError(400, "illegal_argument_exception", f"Invalid processor type [{ptype}]")
        self.search_pipelines[pid] = body
        return 200, {"acknowledged": True}

    def _run_ingest(self, index: Index, pipeline_id: str, doc_id: str, source: dict[str, Any]) -> dict[str, Any]:
        pipeline = self.ingest_pipelines.get(pipeline_id)
        if pipeline is None:
            raise ApiError(400, "illegal_argument_exception", f"pipeline with id [{pipeline_id}] does not exist")
        source = dict(source)
        ann = index.sparse_ann_fields()
        for proc in pipeline.get("processors", []):
            (ptype, config), = proc.items()
            field_map = config["field_map"]
            prune_type = config.get("prune_type") or "none"
            ratio = float(config.get("prune_ratio", 0) or 0)
            for src, dst in field_map.items():
                value = source.get(src)
                if value is None:
                    continue
                prev = index.docs.get(doc_id)
                if config.get("skip_existing") and prev is not None and prev.source.get(src) == value and dst in prev.source:
                    source[dst] = prev.source[dst]
                    continue
                fmt = "token_id" if dst in ann else "word"
                texts = value if isinstance(value, list) else [value]
                maps = self.predict_map(config["model_id"], [str(t) for t in texts], fmt)
                if self.version >= (2, 19, 0):
                    maps = [_prune(m, prune_type, ratio) for m in maps]
                source[dst] = [{"sparse_encoding": m} for m in maps] if isinstance(value, list) else maps[0]
        return source

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
            if method == "DELETE":
                self._get_index(name)
                del self.indices[name]
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
        if rest == ["_settings"] and method == "GET":
            idx = self._get_index(name)
            return 200, {name: {"settings": _nest(idx.settings)}}
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
            return {"_index": index_name, "_id": doc_id, "status": err.status,
                    "error": {"type": err.type, "reason": err.reason}}

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
            should_hit: set[str] = set()
            for sub in should:
                s, _ = self._score(idx, sub, docs)
                should_hit |= set(s)
                for d, v in s.items():
                    total[d] = total.get(d, 0.0) + v
            if should and not clauses("must") and not clauses("filter"):
                candidates &= should_hit
            return {d: total.get(d, 0.0) for d in candidates}, None
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
            tokens = self.predict_map(model_id, [query_text], fmt)[0]
        if not is_ann and ftype != "rank_features":
            raise ApiError(400, "illegal_argument_exception", "[neural_sparse] query only works on [rank_features] fields")
        tokens = {str(k): float(v) for k, v in tokens.items()}
        limit = None
        method_params = clause.get("method_parameters")
        if is_ann and method_params:
            top_n = int(method_params.get("top_n", 10))
            tokens = dict(sorted(tokens.items(), key=lambda kv: -kv[1])[:top_n])
            limit = int(method_params.get("k", 10))
            if method_params.get("filter"):
                docs = {d: doc for d, doc in docs.items() if eval_query(method_params["filter"], doc.source)}
        if is_ann:
            bad = [t for t in tokens if not t.isdigit()]
            if bad:
                raise ApiError(400, "illegal_argument_exception", f"[sparse_vector] query tokens should be valid integer, got [{bad[0]}]")
        for token, weight in tokens.items():
            from .store import f32
            w = f32(weight)
            if not (0 < w <= 64.0):  # FeatureField.newLinearQuery
                raise ApiError(400, "illegal_argument_exception", f"weight must be in (0, 64.0], got: {w!r}")
        boost = float(clause.get("boost", 1.0))
        scores: dict[str, float] = {}
        from .store import f32
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
            k = int((config.get("combination") or {}).get("rank_constant", 60))
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

    # -- introspection for tests -------------------------------------------------------------------
    def requests_to(self, pattern: str, method: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.request_log if re.search(pattern, e["path"]) and (method is None or e["method"] == method)]


def _prune(weights: dict[str, float], prune_type: str, ratio: float) -> dict[str, float]:
    """neural-search ``PruneUtils.pruneSparseVector`` (>= 2.19): positivity check, then the prune."""
    for value in weights.values():
        if value <= 0:
            raise ApiError(400, "illegal_argument_exception", "Pruned values must be positive")
    if prune_type == "top_k":
        keep = sorted(weights.items(), key=lambda kv: -kv[1])[:int(ratio)]
        return dict(keep)
    if prune_type == "max_ratio":
        top = max(weights.values(), default=0.0)
        return {k: v for k, v in weights.items() if v >= ratio * top}
    if prune_type == "abs_value":
        return {k: v for k, v in weights.items() if v >= ratio}
    if prune_type == "alpha_mass":
        total = sum(weights.values())
        out, acc = {}, 0.0
        for k, v in sorted(weights.items(), key=lambda kv: -kv[1]):
            acc += v
            if acc <= ratio * total:
                out[k] = v
        return out
    return dict(weights)


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value if not isinstance(value, bool) else str(value).lower()
    return out
