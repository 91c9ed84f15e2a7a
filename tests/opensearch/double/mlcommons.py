"""ML Commons part of the double: model groups, register meta + chunks, deploy tasks, predict.

Mixed into :class:`~double.server.OpenSearchDouble` (which holds the state); behaviour follows
ml-commons at the tags named next to each rule (``opensearch-contract.md`` section 1).
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from .store import ApiError, eval_query

__all__ = ["MLCommonsMixin", "LOCAL_FILE_GATE", "BREAKER_OPEN", "DISK_BREAKER_OPEN", "NO_ELIGIBLE_NODE",
           "NO_ML_NODE", "default_model_loader", "bytes_of"]

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


def default_model_loader(zip_path: Path, function_name: str):
    """Load a deployed zip with the ML Commons model runtime (``engines.model_runtime``) (cached per content hash)."""
    from opensearch_lsr.opensearch.conformance import MLCommonsRuntime

    digest = hashlib.sha256(Path(zip_path).read_bytes()).hexdigest()
    key = (digest, function_name)
    with _RUNTIME_LOCK:
        if key not in _RUNTIME_CACHE:
            _RUNTIME_CACHE[key] = MLCommonsRuntime.from_zip(zip_path, function_name=function_name)
        return _RUNTIME_CACHE[key]


def bytes_of(value: Any) -> int:
    """``"5gb"`` -> bytes (OpenSearch ByteSizeValue units)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|tb|pb)?\s*", str(value).lower())
    if not match:
        raise ApiError(400, "illegal_argument_exception", f"failed to parse setting value [{value}] as a size in bytes")
    unit = {"b": 1, None: 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40, "pb": 1 << 50}[match.group(2)]
    return int(float(match.group(1)) * unit)


def _truthy(value: Any) -> bool:
    return str(value).lower() == "true"


class MLCommonsMixin:
    """``/_plugins/_ml/...`` handlers; ``self`` is the double."""

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
            if segs[1] not in self.models:  # ml-commons 3.6.0.0 GetModelTransportAction.java:176
                raise ApiError(404, "status_exception", f"Failed to find model with the provided model id: {segs[1]}")
            model = self._model(segs[1])
            return 200, {k: v for k, v in model.items() if not k.startswith("_")}
        if len(segs) == 2 and segs[0] == "models" and method == "DELETE":
            model = self._model(segs[1])
            if model["model_state"] in ("DEPLOYED", "DEPLOYING", "PARTIALLY_DEPLOYED"):
                raise ApiError(400, "illegal_argument_exception",
                               "Model cannot be deleted in deploying or deployed state. Try undeploy model first then delete")
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
            if self.disk_free_bytes < bytes_of(self.setting("plugins.ml_commons.disk_free_space_threshold")):
                raise RuntimeError(DISK_BREAKER_OPEN)  # DiskCircuitBreaker (ml-commons >= 2.16)
            if self.fail_deploy_error:
                error, self.fail_deploy_error = self.fail_deploy_error, None
                raise RuntimeError(error)
            chunks = self.chunks.get(model_id, {})
            data = b"".join(chunks[i] for i in sorted(chunks))
            if len(chunks) != model["total_chunks"] or hashlib.sha256(data).hexdigest() != model["model_content_hash_value"]:
                raise RuntimeError("model content changed")
            if not self.djl_cache_seeded and model["algorithm"] == "SPARSE_ENCODING":
                # DJL's LibUtils.downloadPyTorch throws on the unreachable host; ML Commons reports the root
                # cause's message as the task error: exactly "publish.djl.ai" (observed on OpenSearch 3.6.0).
                # SPARSE_TOKENIZE loads only a HuggingFaceTokenizer (SparseTokenizerModel.doLoadModel), no engine.
                raise RuntimeError("publish.djl.ai")
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
