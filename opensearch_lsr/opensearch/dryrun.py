"""``deploy-model --dry-run``: the exact request sequence of a deploy, without contacting a cluster.

The deploy flow (:func:`opensearch_lsr.opensearch.mlcommons.deploy_bundle`) runs unchanged against
an ``opensearchpy.OpenSearch`` client whose transport records each request instead of sending it
and answers with what a fresh cluster would (no model or group yet, every step succeeding). So the
recorded paths and bodies are the ones opensearch-py builds for the real run, not a re-description.

Each NDJSON line is one request::

    {"seq": 3, "method": "POST", "path": "/_plugins/_ml/models/_register_meta", "query": {},
     "body": {...}, "capture": {"model_id": "{{sparse_encoding.model_id}}"}}

Binary bodies (model chunks) are written as ``{"bytes": N, "sha256": "...", "file": "...",
"offset": K}`` so an operator can review or replay them from the bundle. Ids the cluster assigns
appear as ``{{<key>.<field>}}`` placeholders; ``capture`` says which response field of that request
fills each one on replay.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from .client import ClusterConnectionError, ClusterFeatures

__all__ = ["DryRunTransport", "dry_run_deploy", "write_requests_ndjson", "DRY_RUN_VERSION"]

#: cluster version assumed by a dry run unless told otherwise (the newest the contract covers fully)
DRY_RUN_VERSION = "3.3.0"


def _norm_path(url: str) -> str:
    return unquote(url.split("?", 1)[0])


class DryRunTransport:
    """An opensearch-py ``Transport`` stand-in: records requests and answers like a fresh cluster.

    Hand-written because opensearch-py has no recording transport; only ``perform_request`` (the one
    method every API wrapper calls) and ``close`` are needed.
    """

    def __init__(self, hosts: Any = None, **kwargs: Any) -> None:
        from opensearchpy.serializer import JSONSerializer

        self.serializer = JSONSerializer()
        self.requests: list[dict[str, Any]] = []
        self.version = str(kwargs.get("dry_run_version") or DRY_RUN_VERSION)
        self._registered: list[str] = []
        self._meta_keys: list[str] = []

    def close(self) -> None:
        """Nothing to close."""

    def perform_request(self, method: str, url: str, params: dict | None = None, body: Any = None,
                        timeout: float | None = None, ignore: Any = (), headers: dict | None = None) -> Any:
        path = _norm_path(url)
        entry: dict[str, Any] = {"seq": len(self.requests) + 1, "method": method, "path": path,
                                 "query": {k: str(v) for k, v in (params or {}).items()}}
        if isinstance(body, (bytes, bytearray)):
            entry["body"] = {"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
            entry["content_type"] = (headers or {}).get("Content-Type", "application/json")
        elif isinstance(body, str):
            entry["body"] = json.loads(body)
        elif body is not None:
            entry["body"] = json.loads(self.serializer.dumps(body))
        response = self._answer(method, path, entry)
        self.requests.append(entry)
        return response

    # -- what a fresh cluster answers ----------------------------------------------------------
    def _answer(self, method: str, path: str, entry: dict[str, Any]) -> Any:
        segs = [s for s in path.split("/") if s]
        if path == "/":
            return {"version": {"distribution": "opensearch", "number": self.version}, "tagline": "dry run"}
        if segs[-1:] == ["_search"]:
            return {"hits": {"total": {"value": 0, "relation": "eq"}, "hits": []}}
        if segs[-2:] == ["model_groups", "_register"]:
            placeholder = "{{model_group.model_group_id}}"
            entry["capture"] = {"model_group_id": placeholder}
            return {"model_group_id": placeholder, "status": "CREATED"}
        if segs[-1:] in (["_register_meta"], ["meta"]):
            fn = str((entry.get("body") or {}).get("function_name", "model")).lower()
            placeholder = "{{" + fn + ".model_id}}"
            entry["capture"] = {"model_id": placeholder}
            return {"model_id": placeholder, "status": "CREATED"}
        if len(segs) >= 4 and segs[-2] in ("upload_chunk", "chunk"):
            return {"status": "Uploaded"}
        if segs[-1:] in (["_deploy"], ["_load"]):
            placeholder = "{{" + segs[-2].strip("{}").replace(".model_id", "") + ".deploy_task_id}}"
            entry["capture"] = {"task_id": placeholder}
            return {"task_id": placeholder, "task_type": "DEPLOY_MODEL", "status": "CREATED"}
        if len(segs) >= 3 and segs[-2] == "tasks":
            entry["poll_until"] = {"state": ["COMPLETED", "FAILED", "COMPLETED_WITH_ERROR"]}
            return {"state": "COMPLETED"}
        if "_predict" in segs:
            texts = (entry.get("body") or {}).get("text_docs") or [""]
            return {"inference_results": [{"output": [{"name": "output", "dataAsMap": {"response": [{"dry": 1.0}]}}]}
                                          for _ in texts]}
        if segs[:2] == ["_cluster", "settings"]:
            return {"acknowledged": True}
        return {}


def dry_run_deploy(bundle_dir: str | os.PathLike, config: Any = None, *,
                   version: str = DRY_RUN_VERSION) -> list[dict[str, Any]]:
    """Run :func:`deploy_bundle` against a recording transport; returns the requests in order.

    Args:
        bundle_dir: an export bundle (``manifest.json`` + zips).
        config: a :class:`~opensearch_lsr.opensearch.mlcommons.DeployConfig` (default options).
        version: the cluster version to plan for (paths and options follow it, contract 4.4).
    """
    from opensearchpy import OpenSearch

    from .mlcommons import DeployConfig, deploy_bundle

    config = config or DeployConfig()
    features = ClusterFeatures.from_version(version)
    if not features.sparse_models:
        raise ClusterConnectionError(f"OpenSearch {features.version_string} has no sparse models; plan for 2.11 or newer")
    client = OpenSearch(hosts=["http://dry-run:9200"], transport_class=DryRunTransport, dry_run_version=version)
    transport: DryRunTransport = client.transport  # type: ignore[assignment]
    deploy_bundle(client, bundle_dir, config, features=features)
    _locate_chunks(transport.requests, Path(bundle_dir))
    return transport.requests


def _locate_chunks(requests: list[dict[str, Any]], bundle_dir: Path) -> None:
    """Name the bundle file and byte offset of each binary chunk so a replay can re-read it."""
    from ..config import read_json

    manifest = read_json(bundle_dir / "manifest.json")
    by_fn = {str(v.get("function_name", "")).lower(): v.get("file") for v in manifest.values()
             if isinstance(v, dict) and v.get("file")}
    offsets: dict[str, int] = {}
    for req in requests:
        body = req.get("body")
        if not (isinstance(body, dict) and "bytes" in body and "sha256" in body):
            continue
        owner = req["path"].split("/")[4].strip("{}").replace(".model_id", "") if req["path"].count("/") >= 4 else ""
        fname = by_fn.get(owner)
        if fname:
            body["file"] = fname
            body["offset"] = offsets.get(fname, 0)
            offsets[fname] = body["offset"] + body["bytes"]


def write_requests_ndjson(requests: list[dict[str, Any]], path: str | os.PathLike) -> Path:
    """One JSON object per line, in request order."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        for req in requests:
            fh.write(json.dumps(req, ensure_ascii=False, sort_keys=False) + "\n")
    return out
