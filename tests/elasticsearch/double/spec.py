"""Validate requests against ``../shared/spec/elasticsearch-serverless-openapi.json`` (OpenAPI 3.0).

The spec's quirk (``../shared/README.md``): "exactly one of these keys" is written as an ``allOf``
member with ``minProperties``/``maxProperties`` 1, which a JSON Schema validator applies to the
whole object (so ``{"field", "query_vector"}`` of a ``sparse_vector`` query would fail). The
validator rewrites every such member into ``oneOf: [{"required": [k]} ...]`` over its declared
keys, the meaning the generator intended (``x-variant``/container semantics of
elastic/elasticsearch-specification).

Documented deviations (the server accepts what the serverless spec does not describe), listed in
:data:`ALLOWED_DEVIATIONS` and in ``docs/elasticsearch-contract.md`` section 8.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from openapi_support import ValidationResult, compile_routes, deref, find_shared_spec

__all__ = ["EsSpecValidator", "EsValidationResult", "default_es_spec_path", "ALLOWED_DEVIATIONS"]

ALLOWED_DEVIATIONS = {
    "bulk_lines_pairwise": "the _bulk body is `items: oneOf [OperationContainer, UpdateAction, {type: object}]`, "
                           "which every action line matches twice; lines are validated pairwise instead (action line "
                           "against OperationContainer, the next line against UpdateAction for update, object otherwise)",
    "cat_plugins_stateful_only": "GET /_cat/plugins exists on stateful clusters only (serverless has no plugins); "
                                 "the toolkit reads it to know whether analysis-nori is installed",
}
#: operations the serverless spec lacks but stateful Elasticsearch serves: (method, path regex) -> deviation
_STATEFUL_ONLY = {("GET", r"^/_cat/plugins$"): "cat_plugins_stateful_only"}

_CACHE: dict[str, "EsSpecValidator"] = {}


def default_es_spec_path() -> Path | None:
    return find_shared_spec("elasticsearch-serverless-openapi.json", Path(__file__))


EsValidationResult = ValidationResult


def _fix_exactly_one(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _fix_exactly_one(v) for k, v in node.items()}
        members = out.get("allOf")
        if isinstance(members, list):
            for m in members:
                if isinstance(m, dict) and m.get("maxProperties") == 1 and isinstance(m.get("properties"), dict):
                    m.pop("maxProperties", None)
                    m.pop("minProperties", None)
                    m["oneOf"] = [{"required": [k]} for k in m["properties"]]
        return out
    if isinstance(node, list):
        return [_fix_exactly_one(v) for v in node]
    return node


class EsSpecValidator:
    """Resolve ``(method, path)`` to an operation of the spec and validate query parameters and body."""

    @classmethod
    def shared(cls, path: str | Path | None = None) -> "EsSpecValidator":
        path = Path(path) if path else default_es_spec_path()
        if path is None:
            raise FileNotFoundError("../shared/spec/elasticsearch-serverless-openapi.json is missing")
        key = str(path.resolve())
        if key not in _CACHE:
            _CACHE[key] = cls(json.loads(path.read_text(encoding="utf-8")))
        return _CACHE[key]

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = _fix_exactly_one(spec)
        self._routes = compile_routes(self.spec["paths"])
        self._validators: dict[str, Any] = {}

    def _deref(self, obj: Any) -> Any:
        return deref(self.spec, obj)

    def resolve(self, method: str, path: str, body: Any = None) -> tuple[str, dict] | None:
        """The operation; for the per-service ``PUT _inference`` templates, the one named after ``service``."""
        candidates = [(t, lit) for pat, t, lit in self._routes
                      if pat.match(path) and method.lower() in self.spec["paths"][t]]
        if not candidates:
            return None
        best = max(lit for _, lit in candidates)
        tops = [t for t, lit in candidates if lit == best]
        if len(tops) > 1 and isinstance(body, dict) and body.get("service"):
            named = [t for t in tops if t.endswith("{" + str(body["service"]) + "_inference_id}")]
            tops = named or tops
        generic = [t for t in tops if t.endswith("{inference_id}") or t.endswith("{model_id}")]
        template = tops[0] if len(tops) == 1 else (generic[0] if generic and not (isinstance(body, dict) and body.get("service")) else tops[0])
        return template, self.spec["paths"][template][method.lower()]

    def validate(self, method: str, path: str, query: dict[str, Any], body: bytes | None) -> EsValidationResult:
        from openapi_schema_validator import OAS30Validator

        instance: Any = None
        ndjson = path.endswith("/_bulk")
        if body:
            try:
                instance = ([json.loads(l) for l in body.decode("utf-8").splitlines() if l.strip()] if ndjson
                            else json.loads(body))
            except ValueError as err:
                return EsValidationResult(None, [f"{method} {path}: body is not JSON ({err})"])
        resolved = self.resolve(method, path, instance)
        for (m, pattern), name in _STATEFUL_ONLY.items():
            if resolved is None and m == method and re.match(pattern, path):
                return EsValidationResult(f"{method} {path}", deviations=[name])
        if resolved is None:
            return EsValidationResult(None, [f"{method} {path}: no such operation in the API spec"])
        template, op = resolved
        name = f"{method.upper()} {template}"
        result = EsValidationResult(name)
        params = [self._deref(p) for p in op.get("parameters", [])]
        declared = {p["name"]: p for p in params if p.get("in") == "query"}
        for key, value in query.items():
            if key not in declared:
                result.errors.append(f"{name}: query parameter {key!r} is not in the spec")
        rb = self._deref(op.get("requestBody")) if op.get("requestBody") else None
        if not body:
            if rb and rb.get("required"):
                result.errors.append(f"{name}: the spec requires a request body")
            return result
        if rb is None:
            result.errors.append(f"{name}: a body was sent but the operation takes none")
            return result
        content = rb.get("content", {})
        media = "application/x-ndjson" if ndjson and "application/x-ndjson" in content else "application/json"
        schema = content.get(media, {}).get("schema")
        if schema is None:
            result.errors.append(f"{name}: the spec has no {media} body")
            return result
        if ndjson and isinstance(instance, list):
            result.deviations.append("bulk_lines_pairwise")
            self._validate_bulk(name, instance, result)
            return result
        key = f"{name}|{media}"
        if key not in self._validators:
            wrapped = dict(copy.deepcopy(schema), components=self.spec["components"])
            self._validators[key] = OAS30Validator(wrapped)
        self._collect(name, self._validators[key], instance, result)
        return result

    @staticmethod
    def _collect(name: str, validator: Any, instance: Any, result: EsValidationResult, prefix: str = "") -> None:
        for error in validator.iter_errors(instance):
            loc = prefix + "/".join(str(p) for p in error.absolute_path)
            result.errors.append(f"{name}: {loc or '<root>'}: {error.message[:300]}")

    def _schema_validator(self, ref: str):
        from openapi_schema_validator import OAS30Validator

        if ref not in self._validators:
            self._validators[ref] = OAS30Validator({"$ref": ref, "components": self.spec["components"]})
        return self._validators[ref]

    def _validate_bulk(self, name: str, lines: list, result: EsValidationResult) -> None:
        action_v = self._schema_validator("#/components/schemas/_global.bulk.OperationContainer")
        update_v = self._schema_validator("#/components/schemas/_global.bulk.UpdateAction")
        i = 0
        while i < len(lines):
            action = lines[i]
            self._collect(name, action_v, action, result, f"line {i}: ")
            op = next(iter(action), None) if isinstance(action, dict) else None
            if op in ("index", "create", "update"):
                if i + 1 >= len(lines):
                    result.errors.append(f"{name}: line {i}: {op} action without a source line")
                    return
                if op == "update":
                    self._collect(name, update_v, lines[i + 1], result, f"line {i + 1}: ")
                elif not isinstance(lines[i + 1], dict):
                    result.errors.append(f"{name}: line {i + 1}: the source must be an object")
                i += 2
            else:
                i += 1
