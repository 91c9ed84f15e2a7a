"""Deploy an exported bundle to ML Commons: register from local file, upload chunks, deploy.

The request sequence is the one ``opensearch-contract.md`` sections 1.2-1.7 derive from ML Commons
source (and the one opensearch-py-ml's ``ModelUploader`` sends):

1. optional ``PUT _cluster/settings`` (:data:`ML_SETTINGS`, opt-in);
2. optional model group (``model_groups/_register``, reused by name);
3. idempotency: ``models/_search`` by ``model_content_hash_value`` -> reuse a DEPLOYED model,
   deploy a REGISTERED one;
4. ``models/_register_meta`` with ``function_name`` SPARSE_ENCODING / SPARSE_TOKENIZE,
   ``model_format`` TORCH_SCRIPT, sha256, size and ``total_chunks`` and **no** ``model_config``
   (contract 2.4);
5. ``models/<id>/upload_chunk/<n>``: raw bytes (not the JSON the API spec describes, contract 1.4),
   <= 10,000,000 bytes each, in order, last chunk last (the model flips to REGISTERED on it);
6. ``models/<id>/_deploy`` and ``tasks/<task_id>`` polling until COMPLETED or FAILED.

Clusters older than 2.7 get the deprecated ``meta`` / ``chunk`` / ``_load`` paths. opensearch-py's
``plugins.ml`` wraps every call except the deprecated paths, which go through
``transport.perform_request``. Any failure raises :class:`DeployError`, whose message says which
model ids are left in which state and how to clean up.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from pathlib import Path
from typing import Any, Callable, Literal

from ..config import ArtifactConfig, read_json, sha256_file
from .client import ClusterFeatures, detect_features
from .client import error_reason as _reason
from .client import error_status as _status
from .client import retry_429 as _retry_429
from .djl_cache import DJL_DOWNLOAD_MARKERS as _DJL_DOWNLOAD_MARKERS
from ..errors import LsrError

__all__ = [
    "DeployConfig",
    "DeployError",
    "ML_SETTINGS",
    "CHUNK_SIZE",
    "apply_ml_settings",
    "ensure_model_group",
    "find_models_by_hash",
    "register_model_file",
    "deploy_model",
    "wait_for_task",
    "predict_sparse",
    "deploy_bundle",
    "deploy_hint",
]

logger = logging.getLogger(__name__)

Which = Literal["encoding", "tokenize", "both"]
WHICH_CHOICES = ("encoding", "tokenize", "both")

#: ML Commons' maximum chunk (``ModelHelper.CHUNK_SIZE``); larger chunks fail "Chunk size exceeds 10MB".
CHUNK_SIZE = 10_000_000
#: PYML's ``MODEL_MAX_SIZE``.
MODEL_MAX_SIZE = 4_000_000_000

#: Cluster settings this flow needs (contract 1.2). ``jvm_heap_memory_threshold`` 100 disables the
#: memory circuit breaker (2.15+); ``native_memory_threshold`` is not enforced by ML Commons.
ML_SETTINGS = {
    "plugins.ml_commons.allow_registering_model_via_local_file": True,
    "plugins.ml_commons.only_run_on_ml_node": False,
    "plugins.ml_commons.jvm_heap_memory_threshold": 100,
}

_BUNDLE_KEYS = {"encoding": "sparse_encoding", "tokenize": "sparse_tokenize"}
_FUNCTION_NAMES = {"encoding": "SPARSE_ENCODING", "tokenize": "SPARSE_TOKENIZE"}
_TERMINAL = {"COMPLETED", "FAILED", "COMPLETED_WITH_ERROR", "CANCELLED", "EXPIRED", "UNREACHABLE"}
_DEPLOYABLE = {"REGISTERED", "UNDEPLOYED", "DEPLOY_FAILED", "PARTIALLY_DEPLOYED", "DEPLOYING",
               "UPLOADED", "UNLOADED", "LOAD_FAILED", "PARTIALLY_LOADED", "LOADING"}
_DEPLOYED = {"DEPLOYED", "LOADED"}
ML = "/_plugins/_ml"


class DeployError(LsrError, RuntimeError):
    """A deploy step failed; the message names the state left behind and the clean-up."""

    def __init__(self, message: str, *, model_ids: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.model_ids = dict(model_ids or {})


@dataclasses.dataclass
class DeployConfig(ArtifactConfig):
    """Options of :func:`deploy_bundle` (saved as ``deploy_config.json`` when asked)."""

    FILENAME = "deploy_config.json"

    which: Which = "both"
    model_group: str | None = None
    apply_settings: bool = False
    timeout_s: float = 600.0
    poll_interval_s: float = 1.0
    chunk_size: int = CHUNK_SIZE
    verify: bool = True
    retries_429: int = 5
    backoff_s: float = 1.0

    def __post_init__(self) -> None:
        if self.which not in WHICH_CHOICES:
            raise ValueError(f"which must be one of {', '.join(WHICH_CHOICES)}, got {self.which!r}")
        if not 0 < self.chunk_size <= CHUNK_SIZE:
            raise ValueError(f"chunk_size must be in (0, {CHUNK_SIZE}], got {self.chunk_size}")
        if self.timeout_s <= 0 or self.poll_interval_s <= 0:
            raise ValueError("timeout_s and poll_interval_s must be positive")


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

#: the ``plugins.ml`` methods the deploy flow calls (all present from opensearch-py 3.0).
_ML_METHODS = ("register_model_meta", "upload_chunk", "search_models", "search_model_group",
               "register_model_group", "deploy_model", "get_task", "get_model", "predict")


def _ml(client):
    """``client.plugins.ml``, refusing (one sentence) a client that lacks the methods this flow calls."""
    ml = getattr(getattr(client, "plugins", None), "ml", None)
    missing = [m for m in _ML_METHODS if not callable(getattr(ml, m, None))]
    if missing:
        import opensearchpy

        version = getattr(opensearchpy, "__versionstr__", "?")
        raise DeployError(f"opensearch-py {version} lacks plugins.ml.{', '.join(missing)}; deploy-model needs "
                          f"opensearch-py>=3.0: pip install -U 'opensearch-py>=3.0'")
    return ml


def _cleanup_hint(client_url: str, model_id: str) -> str:
    return (f"delete it with `curl -X DELETE {client_url}{ML}/models/{model_id}` "
            f"(undeploy first if it is deployed: POST {ML}/models/{model_id}/_undeploy)")


def _base_url(client) -> str:
    try:
        conn = client.transport.connection_pool.connections[0]
        return conn.host
    except (AttributeError, IndexError):  # pragma: no cover
        return "<cluster>"


# ----------------------------------------------------------------------------------------------
# steps
# ----------------------------------------------------------------------------------------------

def apply_ml_settings(client, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """``PUT _cluster/settings`` with :data:`ML_SETTINGS` (persistent). Returns what was sent."""
    body = {"persistent": dict(settings or ML_SETTINGS)}
    client.cluster.put_settings(body=body)
    return body["persistent"]


def ensure_model_group(client, name: str, description: str = "opensearch-lsr sparse models") -> str:
    """Return the id of the model group ``name``, registering it if it does not exist."""
    from opensearchpy.exceptions import TransportError

    try:
        res = _ml(client).search_model_group(body={"query": {"term": {"name.keyword": name}}, "size": 10})
        for hit in res.get("hits", {}).get("hits", []):
            if hit.get("_source", {}).get("name") == name:
                return hit["_id"]
    except TransportError as err:
        if _status(err) != 404:  # 404: the model-group index does not exist yet
            raise
    try:
        res = _ml(client).register_model_group(body={"name": name, "description": description})
    except TransportError as err:
        match = re.search(r"model group with ID:?\s*([\w-]+)", _reason(err))
        if match:  # created concurrently
            return match.group(1)
        raise
    return res["model_group_id"]


def find_models_by_hash(client, sha256: str, function_name: str) -> list[dict[str, Any]]:
    """Models (not chunk documents) registered with this content hash and function name.

    ML Commons stores the function name of a model in the ``algorithm`` field of its document, not
    in ``function_name`` (ml-commons ``common/.../MLModel.java`` ``toXContent`` writes
    ``ALGORITHM_FIELD = "algorithm"``; ``index-mappings/ml_model.json`` maps ``algorithm`` and
    ``model_content_hash_value`` as keywords; tags 2.11.0.0 to 3.8.0.0), so the filter is on
    ``algorithm``: a ``function_name`` term never matches and every run would register a new copy.
    """
    from opensearchpy.exceptions import TransportError

    body = {"query": {"bool": {
        "filter": [{"term": {"model_content_hash_value": sha256}},
                   {"term": {"algorithm": function_name}}],
        "must_not": [{"exists": {"field": "chunk_number"}}]}},
        "size": 100}
    try:
        res = _ml(client).search_models(body=body)
    except TransportError as err:
        if _status(err) == 404:  # no model index yet: nothing registered
            return []
        raise
    out = []
    for hit in res.get("hits", {}).get("hits", []):
        src = hit.get("_source", {})
        out.append({"model_id": hit["_id"], "model_state": src.get("model_state"), "name": src.get("name"),
                    "version": src.get("model_version") or src.get("version")})
    return out


def register_model_file(client, zip_path: Path, *, name: str, version: str, function_name: str,
                        sha256: str, size: int, model_group_id: str | None = None,
                        description: str = "", chunk_size: int = CHUNK_SIZE,
                        legacy_paths: bool = False, retries_429: int = 5, backoff_s: float = 1.0,
                        on_chunk: Callable[[int, int], None] | None = None) -> str:
    """``_register_meta`` then the raw chunks in order, last chunk last. Returns the model id.

    Raises:
        DeployError: registration refused (e.g. settings gate) or an upload failed; in the second
            case the message names the half-registered model id and how to delete it.
    """
    from opensearchpy.exceptions import TransportError

    if size > MODEL_MAX_SIZE:
        raise DeployError(f"{zip_path.name} is {size:,} bytes; ML Commons tooling refuses models over "
                          f"{MODEL_MAX_SIZE:,} bytes")
    total_chunks = max(1, math.ceil(size / chunk_size))
    meta: dict[str, Any] = {
        "name": name,
        "version": version,
        "description": description,
        "function_name": function_name,
        "model_format": "TORCH_SCRIPT",
        "model_content_size_in_bytes": size,
        "model_content_hash_value": sha256,
        "total_chunks": total_chunks,
    }
    if model_group_id:
        meta["model_group_id"] = model_group_id
    ml = _ml(client)
    try:
        if legacy_paths:
            res = _retry_429(lambda: client.transport.perform_request("POST", f"{ML}/models/meta", body=meta),
                             retries=retries_429, backoff_s=backoff_s, what="register model meta")
        else:
            res = _retry_429(lambda: ml.register_model_meta(body=meta), retries=retries_429,
                             backoff_s=backoff_s, what="register model meta")
    except TransportError as err:
        reason = _reason(err)
        hint = ""
        if "allow_registering_model_via_local_file" in reason:
            hint = (" Enable it with --apply-settings, or PUT _cluster/settings "
                    "{\"persistent\":{\"plugins.ml_commons.allow_registering_model_via_local_file\":true}}.")
        raise DeployError(f"registering {function_name} model {name!r} failed (HTTP {_status(err)}): "
                          f"{reason}.{hint} Nothing was registered.") from err
    model_id = res["model_id"]
    logger.info("registered %s meta as %s; uploading %d chunk(s)", function_name, model_id, total_chunks)
    with open(zip_path, "rb") as fh:
        for n in range(total_chunks):
            chunk = fh.read(chunk_size)
            try:
                if legacy_paths:
                    _retry_429(lambda: client.transport.perform_request(
                        "POST", f"{ML}/models/{model_id}/chunk/{n}", body=chunk,
                        headers={"Content-Type": "application/json"}),
                        retries=retries_429, backoff_s=backoff_s, what=f"chunk {n}")
                else:
                    # Raw bytes with Content-Type application/json, exactly as opensearch-py-ml
                    # sends them (contract 1.4); opensearch-py passes bytes through untouched.
                    _retry_429(lambda: ml.upload_chunk(model_id=model_id, chunk_number=n, body=chunk,
                                                       headers={"Content-Type": "application/json"}),
                               retries=retries_429, backoff_s=backoff_s, what=f"chunk {n}")
            except TransportError as err:
                raise DeployError(
                    f"uploading chunk {n} of {total_chunks} for model {model_id} failed (HTTP {_status(err)}): "
                    f"{_reason(err)}. Model {model_id} is left half-registered (chunks 0..{n - 1} of "
                    f"{total_chunks} stored) and cannot be deployed; {_cleanup_hint(_base_url(client), model_id)}"
                    f", then rerun deploy-model.", model_ids={function_name: model_id}) from err
            if on_chunk:
                on_chunk(n + 1, total_chunks)
    return model_id


def wait_for_task(client, task_id: str, *, timeout_s: float, poll_interval_s: float = 1.0) -> dict[str, Any]:
    """Poll ``GET tasks/<id>`` until a terminal state; returns the task document.

    Raises:
        TimeoutError: the task did not finish within ``timeout_s``.
    """
    from opensearchpy.exceptions import TransportError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            task = _ml(client).get_task(task_id=task_id)
        except TransportError as err:
            if _status(err) not in (429, 502, 503, 504):
                raise
            task = {"state": "UNKNOWN"}
        state = task.get("state")
        if state in _TERMINAL:
            return task
        if time.monotonic() >= deadline:
            raise TimeoutError(f"task {task_id} still {state} after {timeout_s:.0f}s")
        time.sleep(poll_interval_s)


def _get_model(client, model_id: str) -> dict[str, Any]:
    return _ml(client).get_model(model_id=model_id)


def deploy_model(client, model_id: str, *, timeout_s: float = 600.0, poll_interval_s: float = 1.0,
                 legacy_paths: bool = False, retries_429: int = 5, backoff_s: float = 1.0) -> dict[str, Any]:
    """``_deploy`` (``_load`` before 2.7) and wait for the task; returns the finished task.

    Raises:
        DeployError: the deploy request or task failed or timed out; the model stays REGISTERED.
    """
    from opensearchpy.exceptions import TransportError

    base = _base_url(client)
    left = (f"Model {model_id} stays registered but not deployed: rerun deploy-model once the cause is "
            f"fixed (it reuses the registered model), or {_cleanup_hint(base, model_id)}.")
    try:
        if legacy_paths:
            res = _retry_429(lambda: client.transport.perform_request("POST", f"{ML}/models/{model_id}/_load"),
                             retries=retries_429, backoff_s=backoff_s, what="deploy")
        else:
            res = _retry_429(lambda: _ml(client).deploy_model(model_id=model_id),
                             retries=retries_429, backoff_s=backoff_s, what="deploy")
    except TransportError as err:
        reason = _reason(err)
        raise DeployError(f"deploy request for model {model_id} failed (HTTP {_status(err)}): {reason}."
                          f"{deploy_hint(reason)} " + left) from err
    task_id = res.get("task_id")
    if not task_id:
        raise DeployError(f"deploy of model {model_id} returned no task id: {res!r}. " + left)
    try:
        task = wait_for_task(client, task_id, timeout_s=timeout_s, poll_interval_s=poll_interval_s)
    except TimeoutError as err:
        raise DeployError(f"deploy task {task_id} of model {model_id} did not finish in {timeout_s:.0f}s; it may "
                          f"still complete: check GET {ML}/tasks/{task_id} and GET {ML}/models/{model_id}. "
                          f"Raise --timeout or rerun deploy-model later (it reuses the model).") from err
    state = task.get("state")
    if state != "COMPLETED":
        error = task.get("error") or "no error message"
        raise DeployError(f"deploy task {task_id} of model {model_id} ended {state}: {error}.{deploy_hint(str(error))} "
                          + left)
    return task


def deploy_hint(error: str) -> str:
    """A one-sentence remedy for the deploy errors ML Commons is known to give ('' when none applies).

    * "no eligible node found" comes back synchronously (HTTP 400) from ``_deploy`` when no node
      may run the model (ml-commons ``TransportDeployModelAction.deployModel``; the longer "No
      eligible node found to execute this request ..." is ``MLTaskDispatcher``'s);
    * "Memory Circuit Breaker is open" / "Disk Circuit Breaker is open" come from
      ``MLNodeUtils.checkOpenCircuitBreaker``: the memory one follows ``jvm_heap_memory_threshold``
      (100 disables it), the disk one ``disk_free_space_threshold`` (free bytes below it; default 5gb);
    * "model content changed": the stored chunks do not hash to the registered sha256;
    * "publish.djl.ai" (the ``UnknownHostException`` ML Commons reports as the task error) or "Failed to save
      pytorch index file": DJL could not download libtorch (ml-commons#3670); the fix is the seeded cache of
      :mod:`.djl_cache` (proven on OpenSearch 3.6.0: the task error is exactly ``publish.djl.ai``);
    * "Failed to deploy model": DJL could not load or warm up the TorchScript; a bundle whose
      manifest says ``"ml_node_devices": ["cpu"]`` (exported before the device-agnostic trace)
      fails here on a GPU ML node (see ``lsr-os export --help``).
    """
    low = error.lower()
    if "no eligible node" in low:
        return (" No node may run the model: set plugins.ml_commons.only_run_on_ml_node=false "
                "(--apply-settings does) or add a node with the ml role.")
    if "disk circuit breaker" in low:
        return (" The ML node's free disk is below plugins.ml_commons.disk_free_space_threshold (default 5gb): "
                "free disk space on the node, or lower that threshold (e.g. PUT _cluster/settings "
                "{\"persistent\":{\"plugins.ml_commons.disk_free_space_threshold\":\"1gb\"}}).")
    if "circuit breaker is open" in low:
        return (" The ML node's JVM heap is above plugins.ml_commons.jvm_heap_memory_threshold: free heap, or set "
                "the threshold to 100 to disable the memory breaker (--apply-settings does).")
    if "model content changed" in low:
        return (" The stored chunks do not hash to the registered sha256, so this model can never deploy;"
                " delete it and rerun.")
    if any(marker in low for marker in _DJL_DOWNLOAD_MARKERS):
        return (" The ML node tried to download the PyTorch native libraries from publish.djl.ai and could not reach"
                " it (an air-gapped node): seed <path.data>/ml_cache/pytorch/ on every ML node with the files of"
                " `lsr-os airgap-kit --opensearch-version <version> --fetch --out DIR`, then rerun deploy-model"
                " (no restart needed).")
    if "failed to deploy model" in low:
        return (" The node could not load or warm up the TorchScript (the node logs have the cause). On a GPU ML "
                "node, check manifest.json: \"ml_node_devices\": [\"cpu\"] means an older export pinned to CPU; "
                "re-export it, or deploy to a CPU ML node.")
    return ""


def predict_sparse(client, model_id: str, texts: list[str], *, algorithm: str = "sparse_encoding",
                   embedding_format: str | None = None) -> list[dict[str, float]]:
    """``_predict`` and unwrap ``inference_results[i].output[0].dataAsMap.response[0]`` per text."""
    body: dict[str, Any] = {"text_docs": list(texts)}
    if embedding_format:
        body["parameters"] = {"sparse_embedding_format": embedding_format}
    res = _ml(client).predict(algorithm_name=algorithm, model_id=model_id, body=body)
    out = []
    for item in res.get("inference_results", []):
        out.append(item["output"][0]["dataAsMap"]["response"][0])
    if len(out) != len(texts):
        raise DeployError(f"_predict on {model_id} returned {len(out)} results for {len(texts)} texts")
    return out


def _read_bundle(bundle_dir: Path, which: Which) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    manifest_path = bundle_dir / "manifest.json"
    if not manifest_path.is_file():
        raise DeployError(f"{bundle_dir} is not an export bundle: manifest.json is missing (run `lsr-os export`)")
    manifest = read_json(manifest_path)
    parts = {}
    for kind in (("encoding", "tokenize") if which == "both" else (which,)):
        entry = manifest.get(_BUNDLE_KEYS[kind])
        if not entry:
            raise DeployError(f"manifest.json has no {_BUNDLE_KEYS[kind]!r} entry")
        path = bundle_dir / entry["file"]
        if not path.is_file():
            raise DeployError(f"{path} is missing from the bundle")
        size = path.stat().st_size
        digest = sha256_file(path)
        if digest != entry.get("sha256") or size != entry.get("size_bytes", size):
            raise DeployError(f"{path.name} does not match manifest.json (sha256 {digest[:12]}... vs "
                              f"{str(entry.get('sha256'))[:12]}...): the bundle was modified; re-export it")
        expected_fn = _FUNCTION_NAMES[kind]
        if entry.get("function_name", expected_fn) != expected_fn:
            raise DeployError(f"manifest entry {_BUNDLE_KEYS[kind]} has function_name "
                              f"{entry.get('function_name')!r}, expected {expected_fn}")
        parts[kind] = {"path": path, "sha256": digest, "size": size, "function_name": expected_fn}
    return manifest, parts


def deploy_bundle(client, bundle_dir: str | Path, config: DeployConfig | None = None, *,
                  features: ClusterFeatures | None = None) -> dict[str, Any]:
    """Register and deploy the bundle's models; idempotent by content hash.

    Returns:
        ``{"sparse_encoding": model_id, "sparse_tokenize": model_id, "model_group_id": ...,
        "reused": {...}, "cluster_version": ...}`` (only the models asked for by ``which``).

    Raises:
        DeployError: with the state left behind (ids registered, not deployed ...) and the clean-up.
    """
    from opensearchpy.exceptions import TransportError

    config = config or DeployConfig()
    bundle_dir = Path(bundle_dir)
    manifest, parts = _read_bundle(bundle_dir, config.which)
    features = features or detect_features(client)
    legacy = not features.register_meta_path
    result: dict[str, Any] = {"cluster_version": features.version_string, "reused": {}}
    try:
        if config.apply_settings:
            result["settings_applied"] = apply_ml_settings(client)
        group_id = ensure_model_group(client, config.model_group) if config.model_group else None
    except TransportError as err:
        raise DeployError(f"cluster set-up failed (HTTP {_status(err)}): {_reason(err)}. Nothing was "
                          f"registered.") from err
    if group_id:
        result["model_group_id"] = group_id
    name = str(manifest.get("name") or bundle_dir.name)
    version = str(manifest.get("version") or "1.0.0")
    done: dict[str, str] = {}
    for kind, part in parts.items():
        fn = part["function_name"]
        key = _BUNDLE_KEYS[kind]
        try:
            existing = find_models_by_hash(client, part["sha256"], fn)
        except TransportError as err:
            raise DeployError(f"searching for an existing {fn} model failed (HTTP {_status(err)}): {_reason(err)}"
                              + _left_summary(done), model_ids=done) from err
        deployed = [m for m in existing if m["model_state"] in _DEPLOYED]
        deployable = [m for m in existing if m["model_state"] in _DEPLOYABLE]
        stale = [m["model_id"] for m in existing if m not in deployed and m not in deployable]
        if stale:
            logger.warning("ignoring %s model(s) with the same hash in state REGISTERING/other: %s "
                           "(half-uploaded; delete them)", fn, ", ".join(stale))
            result.setdefault("stale", {})[key] = stale
        if deployed:
            model_id = deployed[0]["model_id"]
            result["reused"][key] = "deployed"
            logger.info("%s already deployed as %s (same sha256): reusing it", fn, model_id)
        else:
            if deployable:
                model_id = deployable[0]["model_id"]
                result["reused"][key] = "registered"
                logger.info("%s registered as %s (state %s): deploying it", fn, model_id,
                            deployable[0]["model_state"])
            else:
                suffix = "" if kind == "encoding" else "-tokenizer"
                try:
                    model_id = register_model_file(
                        client, part["path"], name=f"{name}{suffix}", version=version, function_name=fn,
                        sha256=part["sha256"], size=part["size"], model_group_id=group_id,
                        description=f"opensearch-lsr {fn} model from {bundle_dir.name} "
                                    f"(vocab {manifest.get('vocab_size', '?')}, keys {manifest.get('key_format', 'word')})",
                        chunk_size=config.chunk_size, legacy_paths=legacy,
                        retries_429=config.retries_429, backoff_s=config.backoff_s)
                except DeployError as err:
                    raise DeployError(str(err) + _left_summary(done), model_ids={**done, **err.model_ids}) from err
            try:
                deploy_model(client, model_id, timeout_s=config.timeout_s, poll_interval_s=config.poll_interval_s,
                             legacy_paths=legacy, retries_429=config.retries_429, backoff_s=config.backoff_s)
            except DeployError as err:
                raise DeployError(str(err) + _left_summary(done), model_ids={**done, key: model_id}) from err
        done[key] = model_id
        if config.verify:
            _verify_prediction(client, model_id, fn, done)
    result.update(done)
    return result


def _left_summary(done: dict[str, str]) -> str:
    if not done:
        return ""
    return " Already deployed before the failure (kept, reused on rerun): " + ", ".join(
        f"{k}={v}" for k, v in done.items()) + "."


def _verify_prediction(client, model_id: str, function_name: str, done: dict[str, str]) -> None:
    """One ``_predict`` call: the response must be a non-empty map of non-negative weights."""
    from opensearchpy.exceptions import TransportError

    algorithm = function_name.lower()
    try:
        [weights] = predict_sparse(client, model_id, ["warm up sentence"], algorithm=algorithm)
    except (TransportError, KeyError, IndexError, TypeError, ValueError) as err:
        raise DeployError(f"model {model_id} deployed but _predict failed: {err}. The model is deployed;"
                          f" check it with POST {ML}/_predict/{algorithm}/{model_id}." + _left_summary(done),
                          model_ids=done) from err
    if not isinstance(weights, dict) or not weights:
        raise DeployError(f"model {model_id} deployed but _predict returned no tokens ({weights!r})"
                          + _left_summary(done), model_ids=done)
    bad = [k for k, v in weights.items() if not isinstance(v, (int, float)) or v < 0]
    if bad:
        raise DeployError(f"model {model_id} returned negative or non-numeric weights for {bad[:5]}; "
                          f"neural-search rejects them at ingest" + _left_summary(done), model_ids=done)
