"""An HTTP test double of Elasticsearch 8.11+/9.x for the toolkit's Elasticsearch chain.

Written from Elasticsearch's source (``docs/elasticsearch-contract.md`` names the files): trained
models (config, base64 definition parts, vocabulary, ``fully_defined``), deployments
(``starting`` -> ``started`` | ``failed``; a model is loaded with the conformance runtime, i.e. ES's
tokenizer + ml-cpp's operation allow-list + ``TextExpansionProcessor``), ``_infer``, inference
endpoints (``elasticsearch`` service, ``sparse_embedding``), indices with ``sparse_vector``
(dot check, strictly positive values, 9-bit ``FeatureField`` storage, ``index_options`` gated by
version) and a nori/cjk text field (nori needs ``analysis-nori``), ingest pipelines with the
``inference`` processor, ``_bulk`` per-item errors, ``sparse_vector`` / ``match`` queries and the
``rrf`` retriever. Every request is validated against the serverless OpenAPI spec
(:mod:`.spec`); ``violations`` lists what did not conform. Responses carry
``X-Elastic-Product: Elasticsearch``, which elasticsearch-py requires.
"""
from __future__ import annotations

import base64
import json
import math
import re
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .spec import EsSpecValidator

__all__ = ["ElasticsearchDouble", "trunc9", "EsApiError"]

_WORD = re.compile(r"\w+", re.UNICODE)


def trunc9(value: float) -> float:
    """Lucene ``FeatureField``: float32 with the top 9 significant bits kept (``bits >>> 15 << 15``)."""
    bits = struct.unpack(">i", struct.pack(">f", value))[0]
    return struct.unpack(">f", struct.pack(">i", (bits >> 15) << 15))[0]


class EsApiError(Exception):
    def __init__(self, status: int, etype: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.etype, self.reason = status, etype, reason

    def body(self) -> dict[str, Any]:
        cause = {"type": self.etype, "reason": self.reason}
        return {"error": {"root_cause": [cause], **cause}, "status": self.status}


class ElasticsearchDouble:
    """State + request handling; ``start()`` binds a local port."""

    def __init__(self, version: str = "9.1.0", plugins: set[str] | None = None, *, validate: bool = True,
                 start_delay_s: float = 0.05, license_type: str = "trial") -> None:
        self.version_string = version
        self.version = tuple(int(x) for x in version.split(".")[:3])
        self.plugins = set(plugins if plugins is not None else {"analysis-nori"})
        self.validator = EsSpecValidator.shared() if validate else None
        self.start_delay_s = start_delay_s
        self.license_type = license_type
        self.models: dict[str, dict[str, Any]] = {}
        self.endpoints: dict[str, dict[str, Any]] = {}
        self.pipelines: dict[str, dict[str, Any]] = {}
        self.indices: dict[str, dict[str, Any]] = {}
        self.request_log: list[dict[str, Any]] = []
        self.violations: list[dict[str, Any]] = []
        self.fail_next_start: str | None = None
        self.reject_item_ids: dict[str, tuple[int, str, str]] = {}  # _id -> (status, type, reason) per bulk item
        self.faults: list[list] = []  # [method, path regex, status, times]
        self.lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "ElasticsearchDouble":
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, payload = double.handle(method, self.path, body, self.headers.get("Accept"))
                data = json.dumps(payload).encode("utf-8") if payload is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Elastic-Product", "Elasticsearch")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if method != "HEAD":
                    self.wfile.write(data)

            def do_GET(self): self._serve("GET")
            def do_POST(self): self._serve("POST")
            def do_PUT(self): self._serve("PUT")
            def do_DELETE(self): self._serve("DELETE")
            def do_HEAD(self): self._serve("HEAD")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]  # type: ignore[union-attr]
        return f"http://{host}:{port}"

    def at_least(self, major: int, minor: int) -> bool:
        return self.version[:2] >= (major, minor)

    # -- dispatch -----------------------------------------------------------------------------
    def handle(self, method: str, raw: str, body: bytes, accept: str | None = None) -> tuple[int, Any]:
        split = urlsplit(raw)
        path = unquote(split.path) or "/"
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        entry: dict[str, Any] = {"method": method, "path": path, "query": query}
        if self.validator is not None:
            res = self.validator.validate(method, path, query, body or None)
            entry["operation"] = res.operation
            if res.errors:
                entry["violations"] = res.errors
                with self.lock:
                    self.violations.append({"method": method, "path": path, "errors": res.errors})
        try:
            # RestCompatibleVersionHelper: a server serves `compatible-with` its own major and the one before
            wanted = re.search(r"compatible-with=(\d+)", accept or "")
            if wanted and int(wanted.group(1)) not in (self.version[0], self.version[0] - 1):
                raise EsApiError(400, "media_type_header_exception", "Invalid media-type value on headers [Accept]: "
                                 f"Accept version must be either version {self.version[0]} or {self.version[0] - 1}, "
                                 f"but found {wanted.group(1)}. Accept={accept}")
            for fault in self.faults:
                if fault[3] > 0 and fault[0] == method and re.search(fault[1], path):
                    fault[3] -= 1
                    raise EsApiError(fault[2], "injected_fault", "injected fault")
            status, payload = self._route(method, path, query, body)
        except EsApiError as err:
            status, payload = err.status, err.body()
        entry["status"] = status
        with self.lock:
            self.request_log.append(entry)
        return status, payload

    def _json(self, body: bytes) -> Any:
        try:
            return json.loads(body) if body else {}
        except ValueError as err:
            raise EsApiError(400, "parse_exception", f"request body is required: {err}") from err

    def _route(self, method: str, path: str, query: dict, body: bytes) -> tuple[int, Any]:
        segs = [s for s in path.split("/") if s]
        if not segs:
            return 200, {"name": "es-double", "cluster_name": "double", "tagline": "You Know, for Search",
                         "version": {"number": self.version_string, "build_flavor": "default"}}
        if segs == ["_license"] and method == "GET":
            return 200, {"license": {"status": "active", "uid": "double", "type": self.license_type,
                                     "issue_date_in_millis": 0, "max_nodes": 1000, "issued_to": "double",
                                     "issuer": "elasticsearch", "start_date_in_millis": -1}}
        if segs == ["_cat", "plugins"]:
            return 200, [{"name": "node-1", "component": p, "version": self.version_string} for p in sorted(self.plugins)]
        if segs[:2] == ["_ml", "trained_models"]:
            return self._ml(method, segs[2:], query, body)
        if segs[0] == "_inference":
            return self._inference(method, segs[1:], body)
        if segs[:2] == ["_ingest", "pipeline"] and len(segs) == 3:
            return self._pipeline(method, segs[2], body)
        if segs == ["_bulk"]:
            return self._bulk(None, query, body)
        if segs[0].startswith("_"):
            raise EsApiError(400, "illegal_argument_exception", f"no handler found for uri [{path}] and method [{method}]")
        return self._index_api(method, segs, query, body)

    # -- trained models -------------------------------------------------------------------------
    def _model(self, mid: str) -> dict[str, Any]:
        if mid not in self.models:
            raise EsApiError(404, "resource_not_found_exception", f"No known trained model with model_id [{mid}]")
        return self.models[mid]

    def _ml(self, method: str, segs: list[str], query: dict, body: bytes) -> tuple[int, Any]:
        mid = segs[0]
        rest = segs[1:]
        if not rest and method == "PUT":
            if not re.match(r"^[a-z0-9](?:[a-z0-9_\-.]*[a-z0-9])?$", mid) or len(mid) > 64:
                raise EsApiError(400, "illegal_argument_exception", f"Invalid model_id; '{mid}' can contain lowercase "
                                 "alphanumeric (a-z and 0-9), hyphens or underscores; must start and end with alphanumeric")
            if mid in self.models:
                raise EsApiError(400, "resource_already_exists_exception", f"Trained machine learning model [{mid}] already exists")
            cfg = self._json(body)
            if cfg.get("model_type") != "pytorch" or "text_expansion" not in (cfg.get("inference_config") or {}):
                raise EsApiError(400, "status_exception", "the double serves pytorch text_expansion models only")
            self.models[mid] = {"config": cfg, "parts": {}, "total_parts": None, "total_length": None,
                                "vocabulary": None, "state": None, "runtime": None, "reason": None,
                                "extra_deployments": []}
            return 200, dict(cfg, model_id=mid)
        if not rest and method == "GET":
            # TrainedModelConfig.toXContent writes `fully_defined` only under the `definition_status` param,
            # which RestGetTrainedModelsAction sets from `include=definition_status`
            m = self._model(mid)
            status = {"fully_defined": self._fully_defined(m)} if "definition_status" in query.get("include", "") else {}
            return 200, {"count": 1, "trained_model_configs": [dict(m["config"], model_id=mid, **status)]}
        if not rest and method == "DELETE":
            m = self._model(mid)
            if m["state"] in ("started", "starting") and query.get("force") != "true":
                raise EsApiError(409, "status_exception", f"Cannot delete model [{mid}] as it is currently deployed")
            del self.models[mid]
            return 200, {"acknowledged": True}
        m = self._model(mid)
        if rest[:1] == ["definition"] and method == "PUT":
            part = int(rest[1])
            req = self._json(body)
            total = int(req["total_parts"])
            if m["total_parts"] not in (None, total) or part >= total or part < 0:
                raise EsApiError(400, "illegal_argument_exception", f"[part] must be less than [total_parts] ({total})")
            m["total_parts"], m["total_length"] = total, int(req["total_definition_length"])
            m["parts"][part] = base64.b64decode(req["definition"])
            return 200, {"acknowledged": True}
        if rest == ["vocabulary"] and method == "PUT":
            vocab = self._json(body).get("vocabulary") or []
            if not vocab:
                raise EsApiError(400, "illegal_argument_exception", "[vocabulary] must not be empty")
            m["vocabulary"] = vocab
            return 200, {"acknowledged": True}
        if rest == ["deployment", "_start"] and method == "POST":
            return self._start(mid, m, query)
        if rest == ["deployment", "_stop"] and method == "POST":
            m["state"], m["runtime"] = None, None
            return 200, {"stopped": True}
        if rest == ["_stats"] and method == "GET":
            self._advance(m)
            dep = {} if m["state"] is None else {"deployment_id": mid, "model_id": mid, "state": m["state"],
                                                 "reason": m["reason"], "allocation_status": {
                                                     "state": "fully_allocated" if m["state"] == "started" else "starting",
                                                     "allocation_count": 1, "target_allocation_count": 1}}
            stats = [{"model_id": mid, **({"deployment_stats": dep} if dep else {})}]
            for did in m["extra_deployments"]:  # one entry per deployment (GetTrainedModelsStatsAction)
                stats.append({"model_id": mid, "deployment_stats": {
                    "deployment_id": did, "model_id": mid, "state": "started",
                    "allocation_status": {"state": "fully_allocated", "allocation_count": 1, "target_allocation_count": 1}}})
            return 200, {"count": len(stats), "trained_model_stats": stats}
        if rest == ["_infer"] and method == "POST":
            req = self._json(body)
            texts = [d.get("text_field", "") for d in req.get("docs", [])]
            return 200, {"inference_results": [{"predicted_value": r} for r in self._expand(mid, texts)]}
        raise EsApiError(400, "illegal_argument_exception", f"no handler for {method} _ml/trained_models/{'/'.join(segs)}")

    @staticmethod
    def _fully_defined(m: dict[str, Any]) -> bool:
        return m["total_parts"] is not None and len(m["parts"]) == m["total_parts"] and m["vocabulary"] is not None

    def _start(self, mid: str, m: dict[str, Any], query: dict) -> tuple[int, Any]:
        if m["state"] in ("started", "starting"):
            raise EsApiError(409, "status_exception", f"Could not start model deployment because an existing deployment "
                             f"with the same id [{mid}] exist")
        if not self._fully_defined(m):
            raise EsApiError(400, "status_exception", f"model [{mid}] must have a fully uploaded definition and vocabulary")
        threads = int(query.get("threads_per_allocation", 1))
        if threads < 1 or threads > 32 or threads & (threads - 1):
            raise EsApiError(400, "action_request_validation_exception",
                             "Validation Failed: 1: [threads_per_allocation] must be a power of 2 less than or equal to 32;")
        m["state"], m["started_at"], m["reason"] = "starting", time.monotonic(), None
        if self.fail_next_start:
            m["state"], m["reason"], self.fail_next_start = "failed", self.fail_next_start, None
        else:
            self._load(mid, m)
        wait_for = query.get("wait_for", "started")
        if wait_for not in ("starting", "started", "fully_allocated"):
            raise EsApiError(400, "illegal_argument_exception", f"Unknown AllocationStatus.State [{wait_for}]")
        if wait_for != "starting":
            # the server holds the request until the deployment is started (or `timeout`): model loading takes
            # start_delay_s here, minutes for a large model on a real ML node
            if m["state"] == "failed":
                raise EsApiError(500, "status_exception", f"Could not start deployment because of [{m['reason']}]")
            time.sleep(self.start_delay_s)
            m["state"] = "started"
        return 200, {"assignment": {"task_parameters": {"model_id": mid, "deployment_id": mid},
                                    "assignment_state": m["state"]}}

    def _load(self, mid: str, m: dict[str, Any]) -> None:
        """Load the definition as pytorch_inference would (length check, TorchScript, graph validation)."""
        from opensearch_lsr.elasticsearch.runtime import EsConformanceError, TextExpansionRuntime

        data = b"".join(m["parts"][i] for i in range(m["total_parts"]))
        if len(data) != m["total_length"]:
            m["state"], m["reason"] = "failed", "model definition length does not match total_definition_length"
            return
        try:
            rt = TextExpansionRuntime.from_parts(data, m["vocabulary"], m["config"]["inference_config"])
            bad = rt.check_graph()
            if bad:
                raise EsConformanceError(f"model contains forbidden or unsupported operations {bad}")
            m["runtime"] = rt
        except EsConformanceError as err:
            m["state"], m["reason"] = "failed", str(err)

    def _advance(self, m: dict[str, Any]) -> None:
        if m["state"] == "starting" and time.monotonic() - m.get("started_at", 0) >= self.start_delay_s:
            m["state"] = "started"

    def _expand(self, mid: str, texts: list[str], deployment: str | None = None) -> list[dict[str, float]]:
        m = self._model(mid)
        self._advance(m)
        own = deployment is None or deployment == mid
        if m["runtime"] is None or (own and m["state"] != "started") or (not own and deployment not in m["extra_deployments"]):
            raise EsApiError(409, "status_exception", f"Trained model deployment [{mid}] is not allocated to any nodes")
        from opensearch_lsr.elasticsearch.runtime import EsConformanceError, EsDuplicateKeyError

        try:
            return m["runtime"].infer(texts, strict=False)  # what ES does with any result tensor
        except EsDuplicateKeyError as err:  # TextExpansionResults.asMap: Collectors.toMap throws
            raise EsApiError(500, "illegal_state_exception", str(err)) from err
        except EsConformanceError as err:
            raise EsApiError(500, "status_exception", str(err)) from err

    # -- inference endpoints ----------------------------------------------------------------------
    def _inference(self, method: str, segs: list[str], body: bytes) -> tuple[int, Any]:
        if len(segs) != 2 or segs[0] != "sparse_embedding":
            raise EsApiError(400, "illegal_argument_exception", "the double serves sparse_embedding endpoints only")
        eid = segs[1]
        if method == "PUT":
            req = self._json(body)
            if eid in self.endpoints:
                raise EsApiError(400, "status_exception", f"Inference endpoint [{eid}] already exists")
            if req.get("service") != "elasticsearch":
                raise EsApiError(400, "status_exception", f"Unknown service [{req.get('service')}]")
            settings = dict(req.get("service_settings") or {})
            model_id, deployment_id = settings.get("model_id"), settings.get("deployment_id")
            if model_id == eid:
                raise EsApiError(400, "status_exception", "Inference endpoint [id] must not match the [model_id]")
            if deployment_id is not None:
                # ElasticsearchInternalService.validateAgainstDeployment: attach to a running deployment; its
                # allocations and threads are taken from it
                owner = next((mid for mid, m in self.models.items() if m["state"] in ("started", "starting")
                              and deployment_id == mid), None)
                if owner is None:
                    raise EsApiError(404, "status_exception", f"Cannot find deployment [{deployment_id}]")
                if model_id is not None and model_id != owner:
                    raise EsApiError(400, "status_exception", f"Deployment [{deployment_id}] uses model [{owner}] "
                                     f"which does not match the model [{model_id}] in the request.")
                settings["model_id"] = owner
            else:
                # customElandCase: a CustomElandModel whose deployment id is the endpoint id; creating the
                # endpoint starts that deployment: a second copy of the model next to any existing one
                m = self._model(model_id)
                if not self._fully_defined(m):
                    raise EsApiError(400, "status_exception", f"model [{model_id}] must have a fully uploaded definition")
                if m["runtime"] is None:
                    self._load(model_id, m)
                m["extra_deployments"].append(eid)
            self.endpoints[eid] = {"inference_id": eid, "task_type": "sparse_embedding", "service": "elasticsearch",
                                   "service_settings": settings}
            return 200, self.endpoints[eid]
        if eid not in self.endpoints:
            raise EsApiError(404, "resource_not_found_exception", f"Inference endpoint not found [{eid}]")
        if method == "GET":
            return 200, {"endpoints": [self.endpoints[eid]]}
        if method == "POST":
            texts = self._json(body).get("input")
            texts = [texts] if isinstance(texts, str) else texts
            return 200, {"sparse_embedding": [{"is_truncated": False, "embedding": e} for e in self._endpoint_expand(eid, texts)]}
        raise EsApiError(405, "method_not_allowed", method)

    def _endpoint_expand(self, eid: str, texts: list[str]) -> list[dict[str, float]]:
        settings = self.endpoints[eid]["service_settings"]
        return self._expand(settings["model_id"], texts, settings.get("deployment_id") or eid)

    def _query_expansion(self, inference_id: str, text: str) -> dict[str, float]:
        if inference_id in self.endpoints:
            return self._endpoint_expand(inference_id, [text])[0]
        return self._expand(inference_id, [text])[0]

    # -- pipelines ------------------------------------------------------------------------------
    def _pipeline(self, method: str, pid: str, body: bytes) -> tuple[int, Any]:
        if method == "PUT":
            req = self._json(body)
            for proc in req.get("processors", []):
                inf = proc.get("inference")
                if inf is not None:
                    self._model(inf["model_id"])
            self.pipelines[pid] = req
            return 200, {"acknowledged": True}
        if pid not in self.pipelines:
            raise EsApiError(404, "resource_not_found_exception", f"pipeline [{pid}] is missing")
        return 200, {pid: self.pipelines[pid]}

    def _run_pipeline(self, pid: str, source: dict[str, Any]) -> dict[str, Any]:
        if pid not in self.pipelines:
            raise EsApiError(400, "illegal_argument_exception", f"pipeline with id [{pid}] does not exist")
        for proc in self.pipelines[pid].get("processors", []):
            inf = proc.get("inference")
            if inf is None:
                continue
            for io in inf.get("input_output", []):
                # InferenceProcessor (input_output): a missing input field fails the document unless
                # ignore_missing; the result is written with IngestDocument.appendFieldValue, so an existing
                # output field becomes a list [old, new]
                if io["input_field"] not in source:
                    if inf.get("ignore_missing"):
                        continue
                    raise EsApiError(400, "illegal_argument_exception",
                                     f"input field [{io['input_field']}] does not exist in the source document")
                value = self._expand(inf["model_id"], [str(source[io["input_field"]])])[0]
                out = io["output_field"]
                if out in source:
                    old = source[out]
                    source[out] = (old if isinstance(old, list) else [old]) + [value]
                else:
                    source[out] = value
        return source

    # -- indices ----------------------------------------------------------------------------------
    def _index(self, name: str) -> dict[str, Any]:
        if name not in self.indices:
            raise EsApiError(404, "index_not_found_exception", f"no such index [{name}]")
        return self.indices[name]

    def _create_index(self, name: str, req: dict[str, Any]) -> tuple[int, Any]:
        if name in self.indices:
            raise EsApiError(400, "resource_already_exists_exception", f"index [{name}/uuid] already exists")
        settings = req.get("settings") or {}
        analysis = settings.get("analysis") or {}
        for aname, spec in (analysis.get("analyzer") or {}).items():
            tok = spec.get("tokenizer", "standard")
            filters = spec.get("filter", [])
            if ("nori" in tok or any("nori" in f for f in filters)) and "analysis-nori" not in self.plugins:
                raise EsApiError(400, "illegal_argument_exception",
                                 f"Custom Analyzer [{aname}] failed to find tokenizer under name [{tok}]")
        props = (req.get("mappings") or {}).get("properties") or {}
        for fname, spec in props.items():
            if spec.get("type") == "sparse_vector":
                if not self.at_least(8, 11):
                    raise EsApiError(400, "mapper_parsing_exception",
                                     "The [sparse_vector] field type is not supported from 8.0 to 8.10 versions.")
                if "index_options" in spec and not (self.at_least(9, 1) or (self.version[0] == 8 and self.at_least(8, 19))):
                    raise EsApiError(400, "mapper_parsing_exception",
                                     f"unknown parameter [index_options] on mapper [{fname}] of type [sparse_vector]")
        index = settings.get("index") or {}
        self.indices[name] = {"props": props, "docs": {}, "visible": {},
                              "default_pipeline": index.get("default_pipeline")}
        return 200, {"acknowledged": True, "shards_acknowledged": True, "index": name}

    def _index_api(self, method: str, segs: list[str], query: dict, body: bytes) -> tuple[int, Any]:
        name = segs[0]
        if len(segs) == 1 and method == "PUT":
            return self._create_index(name, self._json(body))
        if len(segs) == 1 and method == "DELETE":
            self._index(name)
            del self.indices[name]
            return 200, {"acknowledged": True}
        if len(segs) == 1 and method in ("GET", "HEAD"):
            idx = self._index(name)
            return 200, {name: {"mappings": {"properties": idx["props"]}}}
        idx = self._index(name)
        op = segs[1]
        if op == "_bulk":
            return self._bulk(name, query, body)
        if op == "_refresh":
            idx["visible"] = dict(idx["docs"])
            return 200, {"_shards": {"total": 1, "successful": 1, "failed": 0}}
        if op == "_count":
            return 200, {"count": len(idx["visible"]), "_shards": {"total": 1, "successful": 1, "failed": 0}}
        if op == "_search":
            return 200, self._search(idx, self._json(body))
        raise EsApiError(400, "illegal_argument_exception", f"no handler for {method} /{'/'.join(segs)}")

    def _parse_doc(self, idx: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
        parsed: dict[str, Any] = {"source": source, "features": {}, "terms": {}}
        for fname, spec in idx["props"].items():
            value = source.get(fname)
            if value is None:
                continue
            if spec.get("type") == "sparse_vector":
                if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                    # an array of objects: DocumentParser parses each; a feature given twice keeps the max
                    # (SparseVectorFieldMapper.parse, 8.16+) or fails before (elastic/elasticsearch#111981)
                    merged: dict[str, float] = {}
                    for part in value:
                        for feature, w in part.items():
                            if feature in merged and not self.at_least(8, 16):
                                raise EsApiError(400, "document_parsing_exception", "[sparse_vector] fields do not "
                                                 "support indexing multiple values for the same feature [" +
                                                 f"{fname}.{feature}] in the same document")
                            merged[feature] = max(float(w), merged.get(feature, 0.0))
                    value = merged
                if not isinstance(value, dict):
                    raise EsApiError(400, "document_parsing_exception", "[sparse_vector] fields must be json objects, "
                                     "expected a START_OBJECT but got: " + type(value).__name__)
                feats: dict[str, float] = {}
                for feature, w in value.items():
                    if "." in feature and not self.at_least(8, 16):  # allowed since elastic/elasticsearch#111981
                        raise EsApiError(400, "document_parsing_exception", "[sparse_vector] fields do not support dots "
                                         f"in feature names but found [{feature}]")
                    w = float(w)
                    if not (w >= 1.1754943508222875e-38 and math.isfinite(w)):
                        raise EsApiError(400, "document_parsing_exception",
                                         f"featureValue must be a positive normal float, got: {w} for feature {feature} "
                                         f"which is less than Float.MIN_NORMAL")
                    feats[feature] = trunc9(w)
                parsed["features"][fname] = feats
            elif spec.get("type") == "text":
                terms: dict[str, int] = {}
                for t in _WORD.findall(str(value).lower()):
                    terms[t] = terms.get(t, 0) + 1
                parsed["terms"][fname] = terms
        return parsed

    def _bulk(self, default_index: str | None, query: dict, body: bytes) -> tuple[int, Any]:
        lines = [json.loads(line) for line in body.decode("utf-8").splitlines() if line.strip()]
        items, errors = [], False
        for meta, source in zip(lines[0::2], lines[1::2]):
            op, info = next(iter(meta.items()))
            name = info.get("_index") or default_index
            did = str(info["_id"])
            try:
                if did in self.reject_item_ids:
                    raise EsApiError(*self.reject_item_ids[did])
                idx = self._index(name)
                pipeline = query.get("pipeline") or info.get("pipeline") or idx["default_pipeline"]
                if pipeline and pipeline != "_none":
                    source = self._run_pipeline(pipeline, dict(source))
                idx["docs"][did] = self._parse_doc(idx, source)
                if query.get("refresh") in ("true", "wait_for", ""):
                    idx["visible"] = dict(idx["docs"])
                items.append({op: {"_index": name, "_id": did, "status": 201, "result": "created"}})
            except EsApiError as err:
                errors = True
                items.append({op: {"_index": name, "_id": did, "status": err.status,
                                   "error": {"type": err.etype, "reason": err.reason}}})
        return 200, {"took": 1, "errors": errors, "items": items}

    # -- search -----------------------------------------------------------------------------------
    def _scores(self, idx: dict[str, Any], query: dict[str, Any]) -> dict[str, float]:
        (kind, body), = query.items()
        docs = idx["visible"]
        if kind == "sparse_vector" and (("query_vector" in body) == ("query" in body) or
                                        ("query_vector" in body and "inference_id" in body)):
            raise EsApiError(400, "illegal_argument_exception", "[sparse_vector] requires one of [query_vector] or "
                             "[inference_id] for sparse_vector fields")
        if kind == "match_all":
            return {d: 1.0 for d in docs}
        if kind == "sparse_vector":
            field = body["field"]
            if "query_vector" in body:
                qv = body["query_vector"]
            else:
                qv = self._query_expansion(body["inference_id"], body["query"])
            # SparseVectorFieldType.finalizeSparseVectorQuery (8.19 / 9.1): an unset `prune` takes the field's
            # index_options (prune, pruning_config)
            qv = self._prune(idx, field, qv, {"pruning_config": cfg}) if (cfg := self._pruning(idx, field, body)) \
                is not None else qv
            out = {}
            for did, doc in docs.items():
                feats = doc["features"].get(field, {})
                s = sum(float(struct.unpack(">f", struct.pack(">f", w))[0]) * feats[t] for t, w in qv.items() if t in feats)
                if any(t in feats for t in qv):
                    out[did] = struct.unpack(">f", struct.pack(">f", s))[0]
            return out
        if kind == "match":
            (field, text), = body.items()
            text = text["query"] if isinstance(text, dict) else text
            q = _WORD.findall(str(text).lower())
            n = len(docs)
            lens = {d: sum(doc["terms"].get(field, {}).values()) for d, doc in docs.items()}
            avg = (sum(lens.values()) / n) if n else 0.0
            out = {}
            for t in set(q):
                df = sum(1 for doc in docs.values() if t in doc["terms"].get(field, {}))
                if not df:
                    continue
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                for d, doc in docs.items():
                    tf = doc["terms"].get(field, {}).get(t, 0)
                    if tf:
                        out[d] = out.get(d, 0.0) + idf * tf / (tf + 1.2 * (1 - 0.75 + 0.75 * lens[d] / (avg or 1)))
            return out
        raise EsApiError(400, "parsing_exception", f"unknown query [{kind}] (the double serves sparse_vector, match, match_all)")

    def _pruning(self, idx, field, body) -> dict | None:
        """``SparseVectorFieldType.finalizeSparseVectorQuery``: the query's ``prune`` wins; else the field's
        ``index_options`` (``prune: false`` turns it off); else indices created on 8.19+ / 9.1+ prune with the
        default ``TokenPruningConfig`` (``getDefaultPruningConfig``), older ones do not. ``None``: no pruning."""
        if body.get("prune") is not None:
            if not body["prune"]:
                return None
            if body.get("pruning_config") is not None:
                cfg = dict(body["pruning_config"])
                if "tokens_freq_ratio_threshold" in cfg:  # TokenPruningConfig.fromXContent: parser.intValue()
                    cfg["tokens_freq_ratio_threshold"] = int(cfg["tokens_freq_ratio_threshold"])
                return cfg
            # `prune: true` alone: TokenPruningConfig() defaults in SparseVectorQueryBuilder (8.15-8.18); the
            # 8.19 / 9.1 finalizeSparseVectorQuery read (`shouldPruneTokensFromQuery ? tokenPruningConfigFromQuery
            # : null`) prunes nothing
            return None if (self.at_least(9, 1) or (self.version[0] == 8 and self.at_least(8, 19))) else {}
        opts = (idx["props"].get(field) or {}).get("index_options") or {}
        if opts.get("prune") is False:
            return None
        if opts.get("pruning_config") is not None:
            return opts["pruning_config"]
        if self.at_least(9, 1) or (self.version[0] == 8 and self.at_least(8, 19)):
            return {}
        return None

    def _prune(self, idx, field, qv, body) -> dict[str, float]:
        """``WeightedTokensUtils.queryBuilderWithPrunedTokens``: keep a token if ``df/N < ratio * avg`` (avg =
        sumDocFreq / N / unique tokens) or ``w > threshold * best weight``; ``only_score_pruned_tokens`` inverts."""
        cfg = body.get("pruning_config") or {}
        ratio, thr = float(cfg.get("tokens_freq_ratio_threshold", 5)), float(cfg.get("tokens_weight_threshold", 0.4))
        invert = bool(cfg.get("only_score_pruned_tokens", False))
        df: dict[str, int] = {}
        n = 0
        for doc in idx["visible"].values():
            feats = doc["features"].get(field, {})
            n += bool(feats)
            for t in feats:
                df[t] = df.get(t, 0) + 1
        if not df:
            return {}
        avg = sum(df.values()) / n / len(df)
        best = max(qv.values()) if qv else 0.0
        kept = {}
        for t, w in qv.items():
            keep = df.get(t, 0) > 0 and (df[t] / n < ratio * avg or w > thr * best)
            if keep != invert:
                kept[t] = w
        return kept

    def _search(self, idx: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
        size = int(req.get("size", 10))
        if "retriever" in req:
            if "rrf" in req["retriever"] and self.license_type not in ("enterprise", "trial"):
                # RRFRankPlugin.RANK_RRF_FEATURE: License.OperationMode.ENTERPRISE
                raise EsApiError(403, "security_exception",
                                 "current license is non-compliant for [Reciprocal Rank Fusion (RRF)]")
            rrf = req["retriever"]["rrf"]
            k, window = int(rrf.get("rank_constant", 60)), int(rrf.get("rank_window_size", size))
            fused: dict[str, float] = {}
            for child in rrf["retrievers"]:
                ranked = _rank(self._scores(idx, child["standard"]["query"]))[:window]
                for rank, (did, _) in enumerate(ranked, start=1):
                    fused[did] = fused.get(did, 0.0) + 1.0 / (k + rank)
            ranked = _rank(fused)
        else:
            ranked = _rank(self._scores(idx, req.get("query") or {"match_all": {}}))
        hits = [{"_index": "", "_id": did, "_score": score} for did, score in ranked[:size]]
        return {"took": 1, "timed_out": False, "hits": {"total": {"value": len(ranked), "relation": "eq"},
                                                         "max_score": hits[0]["_score"] if hits else None, "hits": hits}}


def _rank(scores: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
