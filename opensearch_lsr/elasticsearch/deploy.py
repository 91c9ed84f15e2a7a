"""Deploy an exported ``text_expansion`` model to Elasticsearch; idempotent by content hash.

The request sequence is eland's ``PyTorchModel.import_model`` + ``start``
(elastic/eland ``eland/ml/pytorch/_pytorch_model.py``) plus the checks that make it repeatable
(``docs/elasticsearch-contract.md`` section 1):

1. ``GET _ml/trained_models/<id>?include=definition_status``: a model whose ``metadata.lsr_content_hash``
   equals the bundle's and whose ``fully_defined`` is true is reused (no upload); a partial upload of the
   same bundle is deleted and uploaded again; a model with another hash is refused unless ``replace``
   (then ``_stop`` + ``DELETE``);
2. ``PUT _ml/trained_models/<id>`` with ``config.json`` (+ the content hash in ``metadata``);
3. ``PUT _ml/trained_models/<id>/definition/<n>``: ``{"definition": base64, "total_definition_length",
   "total_parts"}``, 1 MiB of raw bytes per part (eland ``DEFAULT_CHUNK_SIZE``), in order;
4. ``PUT _ml/trained_models/<id>/vocabulary`` with ``vocabulary.json``;
5. ``POST .../deployment/_start?wait_for=starting`` unless ``_stats`` shows it started, then poll
   ``GET .../_stats`` until the model's own deployment is ``started`` (``failed`` raises), so no request
   waits longer than the client's request timeout;
6. optionally ``PUT _inference/sparse_embedding/<endpoint>`` with the ``elasticsearch`` service,
   this ``model_id`` and ``deployment_id`` (attached to the running deployment, not a second one; for
   ``semantic_text`` users), skipped when it already exists.

Every request goes through a :class:`Transport`; :class:`RecordingTransport` writes them as NDJSON
without a cluster (``lsr-os deploy-model --backend elasticsearch --dry-run --requests FILE``),
definition parts as size + sha256 of their raw bytes.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Protocol

from ..config import ArtifactConfig, read_json
from ..errors import LsrError

__all__ = ["EsDeployConfig", "EsDeployError", "Transport", "ClientTransport", "RecordingTransport",
           "deploy_es_model", "DEFINITION_CHUNK_SIZE"]

logger = logging.getLogger(__name__)

#: eland ``DEFAULT_CHUNK_SIZE`` (1 MiB of raw bytes per definition part).
DEFINITION_CHUNK_SIZE = 1024 * 1024
ML = "/_ml/trained_models"


class EsDeployError(LsrError, RuntimeError):
    """A deploy step failed; the message names the state left behind."""


class Transport(Protocol):
    """One HTTP request: returns ``(status, body)``; 4xx/5xx come back as a status, not an exception."""

    def request(self, method: str, path: str, params: dict[str, Any] | None = None,
                body: dict[str, Any] | None = None) -> tuple[int, Any]: ...


class ClientTransport:
    """:class:`Transport` over an ``elasticsearch.Elasticsearch`` client (``perform_request``).

    A 429 (a full thread pool, a circuit breaker: the request was turned away before it ran; Elasticsearch
    ``CircuitBreakingException`` and ``EsRejectedExecutionException`` answer ``TOO_MANY_REQUESTS``) is sent again after
    a pause, ``backoff_s * 2**n`` capped at 30 s, up to ``retries_429`` times (tenacity); the client itself
    retries 502/503/504 only (``client.py``), and ``_bulk`` goes through the bulk helper, which has its own."""

    def __init__(self, client, *, retries_429: int = 5, backoff_s: float = 1.0) -> None:
        self.client, self.retries_429, self.backoff_s = client, retries_429, backoff_s

    def request(self, method, path, params=None, body=None):
        from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_exponential

        def log(state) -> None:
            logger.warning("%s %s: HTTP 429 (%s); retry %d of %d", method, path, _reason(state.outcome.result()[1]),
                           state.attempt_number, self.retries_429)

        retrying = Retrying(retry=retry_if_result(lambda answer: answer[0] == 429),
                            stop=stop_after_attempt(self.retries_429 + 1),
                            wait=wait_exponential(multiplier=self.backoff_s, min=self.backoff_s, max=30.0),
                            before_sleep=log, retry_error_callback=lambda state: state.outcome.result())
        return retrying(self._send, method, path, params, body)

    def _send(self, method, path, params, body) -> tuple[int, Any]:
        from elastic_transport import TransportError
        from elasticsearch import ApiError

        from .client import EsConnectionError

        headers = {"accept": "application/json"}
        if body is not None:
            headers["content-type"] = "application/json"
        try:
            resp = self.client.perform_request(method, path, params=params or None, headers=headers, body=body)
            return resp.meta.status, resp.body
        except ApiError as err:
            return err.meta.status, err.body
        except TransportError as err:  # connection refused, TLS failure, timeout: no status, no body
            # the message names the error class only: elastic_transport's text can carry the node URL
            raise EsConnectionError(f"{method} {path} did not reach the cluster ({type(err).__name__}); check --url "
                                    "/ --cloud-id, TLS options and that the cluster is up") from err


class RecordingTransport:
    """Records requests (the dry run) and answers as an empty cluster would."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def request(self, method, path, params=None, body=None):
        entry: dict[str, Any] = {"method": method, "path": path}
        if params:
            entry["query"] = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in params.items()}
        if body is not None:
            body = dict(body)
            if isinstance(body.get("definition"), str) and "/definition/" in path:
                raw = base64.b64decode(body["definition"])
                entry["binary"] = {"field": "definition", "encoding": "base64", "size": len(raw),
                                   "sha256": hashlib.sha256(raw).hexdigest()}
                body["definition"] = f"<base64 of {len(raw)} bytes, sha256 {entry['binary']['sha256']}>"
            entry["body"] = body
        self.requests.append(entry)
        if method == "GET" and path.endswith("/_stats"):
            return 200, {"count": 1, "trained_model_stats": [{"deployment_stats": {"state": "started"}}]}
        if method == "GET":
            return 404, {"error": {"type": "resource_not_found_exception", "reason": "dry run"}, "status": 404}
        return 200, {"acknowledged": True}

    def write_ndjson(self, path: str | Path) -> Path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", encoding="utf-8") as fh:
            for entry in self.requests:
                fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
        return out


@dataclasses.dataclass
class EsDeployConfig(ArtifactConfig):
    """Options of :func:`deploy_es_model`."""

    FILENAME = "es_deploy_config.json"

    model_id: str | None = None
    replace: bool = False
    inference_endpoint: str | None = None
    number_of_allocations: int = 1
    threads_per_allocation: int = 1
    timeout_s: float = 600.0
    poll_interval_s: float = 1.0
    chunk_size: int = DEFINITION_CHUNK_SIZE

    def __post_init__(self) -> None:
        if self.number_of_allocations < 1 or self.threads_per_allocation < 1:
            raise ValueError("number_of_allocations and threads_per_allocation must be >= 1")
        if self.threads_per_allocation > 32 or self.threads_per_allocation & (self.threads_per_allocation - 1):
            raise ValueError("threads_per_allocation must be a power of 2 less than or equal to 32 "
                             "(StartTrainedModelDeploymentAction.Request.validate)")
        if not 0 < self.chunk_size <= 64 * 1024 * 1024:
            raise ValueError("chunk_size must be in (0, 64 MiB]")
        if self.timeout_s <= 0 or self.poll_interval_s <= 0:
            raise ValueError("timeout_s and poll_interval_s must be positive")
        if self.inference_endpoint is not None and self.inference_endpoint == self.model_id:
            raise ValueError("the inference endpoint id must differ from the model id")


def _reason(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        root = err.get("root_cause") or [{}]
        return str(root[0].get("reason") or err.get("reason") or err)
    return str(body)[:300]


def _check(status: int, body: Any, what: str) -> Any:
    if status >= 300:
        raise EsDeployError(f"{what} failed with HTTP {status}: {_reason(body)}")
    return body


def _export_dir(bundle: str | Path) -> Path:
    p = Path(bundle)
    for cand in (p / "elasticsearch", p):
        if (cand / "manifest.json").is_file() and (cand / "traced_pytorch_model.pt").is_file():
            return cand
    raise EsDeployError(f"{str(bundle)!r} holds no Elasticsearch export (run `lsr-os export --target elasticsearch`)")


def _deployment_state(call, model_id: str) -> str | None:
    return _own_deployment(call, model_id).get("state")


def _own_deployment(call, model_id: str) -> dict[str, Any]:
    """State of the deployment whose id is ``model_id`` (the one ``_start`` creates by default).

    ``GET _ml/trained_models/<id>/_stats`` lists one entry per deployment of the model
    (``GetTrainedModelsStatsAction``): an inference endpoint created without ``deployment_id`` adds a
    second deployment named after the endpoint, so the first entry is not necessarily ours.
    """
    status, body = call("GET", f"{ML}/{model_id}/_stats")
    if status >= 300 or not isinstance(body, dict):
        return {}
    entries = body.get("trained_model_stats") or []
    deps = [e.get("deployment_stats") or {} for e in entries]
    own = [d for d in deps if d.get("deployment_id", model_id) == model_id]
    return own[0] if own else {}


def deploy_es_model(bundle: str | Path, transport: Transport, config: EsDeployConfig | None = None,
                    progress: bool = True) -> dict[str, Any]:
    """Upload (if needed), start and wait for the bundle's ``text_expansion`` model.

    Returns:
        ``{"model_id", "content_hash", "uploaded", "started", "state", "inference_endpoint", "requests"}``.

    Raises:
        EsDeployError: a failing request, another model under the id, a failed deployment or a timeout.
    """
    from tqdm.auto import tqdm

    cfg = config or EsDeployConfig()
    export = _export_dir(bundle)
    manifest = read_json(export / "manifest.json")
    model_id = cfg.model_id or manifest["model_id"]
    content_hash = manifest["content_hash"]
    count = 0

    def call(method: str, path: str, params=None, body=None) -> tuple[int, Any]:
        nonlocal count
        count += 1
        return transport.request(method, path, params, body)

    # `fully_defined` is written only when asked for: TrainedModelConfig.toXContent writes it when the
    # `definition_status` param is set (elastic/elasticsearch x-pack/plugin/core/src/main/java/org/elasticsearch/
    # xpack/core/ml/inference/TrainedModelConfig.java, 8.8+; `include=definition_status` in elasticsearch-py
    # 8.11.0 `ml.get_trained_models`); a missing field means "not known to be complete".
    status, body = call("GET", f"{ML}/{model_id}", {"include": "definition_status"})
    uploaded = False
    existing = (body.get("trained_model_configs") or [None])[0] if status == 200 and isinstance(body, dict) else None
    if existing is not None:
        found_hash = (existing.get("metadata") or {}).get("lsr_content_hash")
        complete = existing.get("fully_defined") is True
        if found_hash == content_hash and not complete:
            # our own interrupted upload of the same content: nothing to lose, upload it again
            logger.warning("model %s holds a partial upload of this bundle: deleting it and uploading again", model_id)
            call("POST", f"{ML}/{model_id}/deployment/_stop", {"force": True})
            _check(*call("DELETE", f"{ML}/{model_id}", {"force": True}), f"deleting partial model {model_id}")
            existing = None
        elif found_hash != content_hash:
            if not cfg.replace:
                raise EsDeployError(f"a different model already exists under id {model_id!r} (content hash "
                                    f"{str(found_hash)[:12]} vs {content_hash[:12]}); pass --replace to delete it "
                                    "or choose another --model-id")
            call("POST", f"{ML}/{model_id}/deployment/_stop", {"force": True})
            _check(*call("DELETE", f"{ML}/{model_id}", {"force": True}), f"deleting model {model_id}")
            existing = None
        else:
            logger.info("model %s already holds content %s: upload skipped", model_id, content_hash[:12])
    elif status != 404:
        _check(status, body, f"GET {ML}/{model_id}")
    if existing is None:
        put = json.loads((export / "config.json").read_text(encoding="utf-8"))
        put["metadata"] = dict(put.get("metadata") or {}, lsr_content_hash=content_hash)
        _check(*call("PUT", f"{ML}/{model_id}", None, put), f"PUT {ML}/{model_id}")
        pt = export / manifest["definition"]["file"]
        size = pt.stat().st_size
        parts = math.ceil(size / cfg.chunk_size)
        with open(pt, "rb") as fh:
            for part in tqdm(range(parts), unit="part", disable=not progress, desc=f"upload {model_id}"):
                chunk = fh.read(cfg.chunk_size)
                body = {"definition": base64.b64encode(chunk).decode("ascii"), "total_definition_length": size,
                        "total_parts": parts}
                _check(*call("PUT", f"{ML}/{model_id}/definition/{part}", None, body),
                       f"uploading definition part {part}/{parts} of {model_id} (delete the partial model with "
                       f"DELETE {ML}/{model_id} or re-run with --replace)")
        vocab = json.loads((export / "vocabulary.json").read_text(encoding="utf-8"))
        _check(*call("PUT", f"{ML}/{model_id}/vocabulary", None, vocab), f"PUT vocabulary of {model_id}")
        uploaded = True

    state = _deployment_state(call, model_id) if not uploaded else None
    started = False
    if state == "failed":  # a failed deployment must be stopped before it can start again
        logger.info("deployment of %s is failed: stopping it before starting again", model_id)
        _check(*call("POST", f"{ML}/{model_id}/deployment/_stop", {"force": True}), f"stopping {model_id}")
    if state != "started":
        # `wait_for=starting` answers once the assignment exists; the wait for `started` is the `_stats` poll below.
        # A server-side `wait_for=started` would hold this request open up to `timeout`, longer than the
        # client's request timeout (60 s): the start would carry on while the call is reported as failed.
        # (StartTrainedModelDeploymentAction.Request: wait_for one of starting, started, fully_allocated.)
        params = {"wait_for": "starting", "timeout": f"{int(cfg.timeout_s)}s",
                  "number_of_allocations": cfg.number_of_allocations,
                  "threads_per_allocation": cfg.threads_per_allocation}
        status, body = call("POST", f"{ML}/{model_id}/deployment/_start", params)
        if status == 409:  # started concurrently: "Could not start model deployment because an existing deployment ..."
            logger.info("deployment of %s already exists: %s", model_id, _reason(body))
        else:
            _check(status, body, f"starting the deployment of {model_id}")
            started = True
        deadline = time.monotonic() + cfg.timeout_s
        while True:
            dep = _own_deployment(call, model_id)
            state = dep.get("state")
            if state == "started":
                break
            if state == "failed":
                reason = f": {dep['reason']}" if dep.get("reason") else f" (see GET {ML}/{model_id}/_stats)"
                raise EsDeployError(f"the deployment of {model_id} failed{reason}; the model stays uploaded, stop it "
                                    "with POST .../deployment/_stop")
            if time.monotonic() > deadline:
                raise EsDeployError(f"the deployment of {model_id} is still {state!r} after {cfg.timeout_s:.0f}s")
            time.sleep(cfg.poll_interval_s)

    endpoint = None
    if cfg.inference_endpoint:
        endpoint = cfg.inference_endpoint
        status, body = call("GET", f"/_inference/sparse_embedding/{endpoint}")
        if status == 404:
            # `deployment_id` attaches the endpoint to the deployment started above
            # (ElasticsearchInternalService.parseRequestConfig -> validateAgainstDeployment: the deployment must
            # exist and run `model_id`; allocations and threads are read from it). Without it the endpoint is a
            # CustomElandModel whose deployment id is the endpoint id, i.e. a second deployment of the model
            # (elastic/elasticsearch x-pack/plugin/inference/.../services/elasticsearch/ElasticsearchInternalService.java,
            # ElasticsearchInternalServiceSettings.java: DEPLOYMENT_ID; see also elastic/elasticsearch#142693).
            settings = {"service": "elasticsearch", "service_settings": {
                "model_id": model_id, "deployment_id": model_id, "num_allocations": cfg.number_of_allocations,
                "num_threads": cfg.threads_per_allocation}}
            _check(*call("PUT", f"/_inference/sparse_embedding/{endpoint}", None, settings),
                   f"creating inference endpoint {endpoint}")
        else:
            _check(status, body, f"GET inference endpoint {endpoint}")
    return {"model_id": model_id, "content_hash": content_hash, "uploaded": uploaded, "started": started,
            "state": state, "inference_endpoint": endpoint, "requests": count}
