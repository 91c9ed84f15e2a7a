"""Validate request bodies against the vendored OpenSearch OpenAPI spec, with only the documented deviations.

The 2.8 MB YAML takes ~5 s to parse, so it is parsed once and cached as a pickle keyed by the file's
sha256 (in ``opensearch_lsr.resources.cache_dir()``); later runs load it in ~0.1 s.

Deviations (``opensearch-contract.md`` sections 7, 2.4 and 6.12; the server code wins over the spec):
each is a named rewrite of the body that removes exactly the construct the spec does not describe,
recorded in ``ValidationResult.deviations`` so tests can see which ones were used.
"""
from __future__ import annotations

import copy
import hashlib
import json
import pickle
import threading
from pathlib import Path
from typing import Any

from openapi_support import ValidationResult, compile_routes, deref, find_shared_spec

__all__ = ["SpecValidator", "ValidationResult", "default_spec_path", "ALLOWED_DEVIATIONS"]

#: name -> contract reference; the only deviations from the spec the double accepts.
ALLOWED_DEVIATIONS = {
    "upload_chunk_raw_bytes": "contract 1.4/7: upload_chunk body is the raw chunk bytes, not {'chunk': str}",
    "sparse_model_without_model_config": "contract 2.4/6.12: model_config is optional (and must be omitted) for SPARSE_*",
    "sparse_vector_mapping": "contract 4.3/7: sparse_vector field type and index.sparse are not in the spec",
    "neural_sparse_method_parameters": "contract 4.3/7: neural_sparse.method_parameters is not in the spec",
    "two_phase_processor": "contract 4.2/7: neural_sparse_two_phase_processor is not in the spec",
    "sparse_encoding_prune_skip_existing": "contract 4.1/7: prune_type/prune_ratio/skip_existing are not in the spec",
}

_LOCK = threading.Lock()
_CACHE: dict[str, "SpecValidator"] = {}


def default_spec_path() -> Path | None:
    from opensearch_lsr.resources import shared_data_dir

    data = shared_data_dir()
    if data is not None and (data.parent / "spec" / "opensearch-openapi.yaml").is_file():
        return data.parent / "spec" / "opensearch-openapi.yaml"
    return find_shared_spec("opensearch-openapi.yaml", Path(__file__))


def _load_spec(path: Path) -> dict[str, Any]:
    from opensearch_lsr.resources import cache_dir

    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()[:16]
    cached = cache_dir() / f"openapi-{digest}.pickle"
    if cached.is_file():
        try:
            with open(cached, "rb") as fh:
                return pickle.load(fh)
        except Exception:  # corrupt cache: rebuild
            pass
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    spec = yaml.load(raw, Loader=loader)
    tmp = cached.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(spec, fh, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(cached)
    return spec


class SpecValidator:
    """Resolve ``(method, path)`` to a spec operation and validate its request body."""

    @classmethod
    def shared(cls, path: str | Path | None = None) -> "SpecValidator":
        """One validator per spec file per process (the spec is parsed once per test run)."""
        path = Path(path) if path else default_spec_path()
        if path is None:
            raise FileNotFoundError("the vendored OpenSearch API spec (../shared/spec/opensearch-openapi.yaml) is missing")
        key = str(path.resolve())
        with _LOCK:
            if key not in _CACHE:
                _CACHE[key] = cls(_load_spec(path))
            return _CACHE[key]

    def __init__(self, spec: dict[str, Any]) -> None:
        from referencing import Registry, Resource
        from referencing.jsonschema import DRAFT202012

        self.spec = spec
        self._routes = compile_routes(spec["paths"])
        self._registry = Registry().with_resource(
            "urn:opensearch-spec", Resource.from_contents(spec, default_specification=DRAFT202012))
        self._validators: dict[str, Any] = {}
        self._global_params = {p.get("name") for p in self._iter_params(
            [{"$ref": "#/components/parameters/" + k} for k in spec.get("components", {}).get("parameters", {})
             if k.startswith("_global")])}

    # -- resolution --------------------------------------------------------------------------
    def _deref(self, obj: Any) -> Any:
        return deref(self.spec, obj)

    def _iter_params(self, params: list) -> list[dict]:
        return [self._deref(p) for p in params or []]

    def resolve(self, method: str, path: str) -> tuple[str, dict] | None:
        """The spec path template and operation for a concrete request, or None."""
        for pattern, template, _ in self._routes:
            if pattern.match(path):
                op = self.spec["paths"][template].get(method.lower())
                if op is not None:
                    return template, op
        return None

    def _validator(self, key: str, schema_pointer: str):
        if key not in self._validators:
            from openapi_schema_validator import OAS31Validator

            self._validators[key] = OAS31Validator({"$ref": "urn:opensearch-spec#" + schema_pointer},
                                                   registry=self._registry)
        return self._validators[key]

    # -- validation --------------------------------------------------------------------------
    def validate(self, method: str, path: str, query: dict[str, Any], body: bytes | None,
                 content_type: str | None) -> ValidationResult:
        resolved = self.resolve(method, path)
        if resolved is None:
            return ValidationResult(None, [f"{method} {path}: no such operation in the API spec"])
        template, op = resolved
        opname = f"{method.upper()} {template}"
        result = ValidationResult(opname)
        # query parameters must be declared by the operation or be global ones
        declared = {p.get("name") for p in self._iter_params(op.get("parameters", [])) if p.get("in") == "query"}
        for name in query:
            if name not in declared and name not in self._global_params:
                result.errors.append(f"{opname}: query parameter {name!r} is not in the spec")
        request_body = self._deref(op.get("requestBody")) if op.get("requestBody") else None
        if not body:
            if request_body and request_body.get("required"):
                result.errors.append(f"{opname}: the spec requires a request body")
            return result
        if request_body is None:
            result.errors.append(f"{opname}: a body was sent but the operation takes none")
            return result
        if template.endswith(("/upload_chunk/{chunk_number}", "/chunk/{chunk_number}")):
            result.deviations.append("upload_chunk_raw_bytes")
            return result
        content = request_body.get("content", {})
        if "application/x-ndjson" in content:
            media = "application/x-ndjson"
            try:
                instance: Any = [json.loads(line) for line in body.decode("utf-8").splitlines() if line.strip()]
            except ValueError as err:
                result.errors.append(f"{opname}: body is not NDJSON ({err})")
                return result
        else:
            media = "application/json"
            if media not in content:
                result.errors.append(f"{opname}: spec has no application/json body")
                return result
            try:
                instance = json.loads(body)
            except ValueError as err:
                result.errors.append(f"{opname}: body is not JSON ({err})")
                return result
        instance = self._apply_deviations(template, method.upper(), instance, result)
        pointer = self._schema_pointer(op, media)
        validator = self._validator(f"{opname}|{media}", pointer)
        for error in validator.iter_errors(instance):
            msg = error.message
            if (template in ("/_plugins/_ml/models/_register_meta", "/_plugins/_ml/models/meta")
                    and error.validator == "required" and "'model_config'" in msg
                    and str(instance.get("function_name", "")).upper() in ("SPARSE_ENCODING", "SPARSE_TOKENIZE")):
                result.deviations.append("sparse_model_without_model_config")
                continue
            loc = "/".join(str(p) for p in error.absolute_path)
            result.errors.append(f"{opname}: {loc or '<root>'}: {msg[:300]}")
        return result

    def _schema_pointer(self, op: dict, media: str) -> str:
        ref = op["requestBody"].get("$ref") if "$ref" in op["requestBody"] else None
        if ref:
            base = ref.lstrip("#")
        else:  # inline request body: find its JSON pointer
            raise ValueError("inline request bodies are not used by the operations the double serves")
        return base + "/content/" + media.replace("/", "~1") + "/schema"

    # -- documented deviations ----------------------------------------------------------------
    def _apply_deviations(self, template: str, method: str, body: Any, result: ValidationResult) -> Any:
        body = copy.deepcopy(body)
        if template == "/{index}" and method == "PUT" and isinstance(body, dict):
            props = (body.get("mappings") or {}).get("properties") or {}
            for name in [n for n, p in props.items() if isinstance(p, dict) and p.get("type") == "sparse_vector"]:
                del props[name]
                result.deviations.append("sparse_vector_mapping")
            settings = body.get("settings") or {}
            index = settings.get("index") if isinstance(settings.get("index"), dict) else None
            if index is not None and "sparse" in index:
                del index["sparse"]
                result.deviations.append("sparse_vector_mapping")
            if "index.sparse" in settings:
                del settings["index.sparse"]
                result.deviations.append("sparse_vector_mapping")
        if template in ("/_ingest/pipeline/{id}",) and isinstance(body, dict):
            for proc in body.get("processors", []) or []:
                enc = proc.get("sparse_encoding") if isinstance(proc, dict) else None
                if isinstance(enc, dict):
                    for key in ("prune_type", "prune_ratio", "skip_existing"):
                        if key in enc:
                            del enc[key]
                            result.deviations.append("sparse_encoding_prune_skip_existing")
        if template == "/_search/pipeline/{id}" and isinstance(body, dict):
            procs = body.get("request_processors")
            if isinstance(procs, list):
                kept = [p for p in procs if not (isinstance(p, dict) and "neural_sparse_two_phase_processor" in p)]
                if len(kept) != len(procs):
                    result.deviations.append("two_phase_processor")
                    body["request_processors"] = kept
        if template.endswith("/_search") and isinstance(body, dict):
            self._strip_method_parameters(body, result)
        return body

    def _strip_method_parameters(self, node: Any, result: ValidationResult) -> None:
        if isinstance(node, dict):
            ns = node.get("neural_sparse")
            if isinstance(ns, dict):
                for clause in ns.values():
                    if isinstance(clause, dict) and "method_parameters" in clause:
                        del clause["method_parameters"]
                        result.deviations.append("neural_sparse_method_parameters")
            for value in node.values():
                self._strip_method_parameters(value, result)
        elif isinstance(node, list):
            for value in node:
                self._strip_method_parameters(value, result)
