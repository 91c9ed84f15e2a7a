"""What both HTTP test doubles' spec validators share: finding the spec in ``../shared/spec``, matching a
concrete request path to the spec's path templates, and resolving ``$ref`` JSON pointers."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ValidationResult", "find_shared_spec", "compile_routes", "deref"]


@dataclass
class ValidationResult:
    """The operation a request resolved to, the schema errors, and the documented deviations used."""

    operation: str | None
    errors: list[str] = field(default_factory=list)
    deviations: list[str] = field(default_factory=list)


def find_shared_spec(filename: str, start: Path | None = None) -> Path | None:
    """``<ancestor>/../shared/spec/<filename>`` for the first ancestor of ``start`` (this file) that has it."""
    here = (start or Path(__file__)).resolve()
    for parent in here.parents:
        cand = parent.parent / "shared" / "spec" / filename
        if cand.is_file():
            return cand
    return None


def compile_routes(templates: Any) -> list[tuple[re.Pattern, str, int]]:
    """``(regex, template, literal segment count)`` per path template, most literal segments first, so
    ``/_plugins/_ml/models/_search`` wins over ``/_plugins/_ml/models/{model_id}``."""
    routes = []
    for template in templates:
        parts, literals = [], 0
        for seg in template.strip("/").split("/"):
            if seg.startswith("{") and seg.endswith("}"):
                parts.append(r"[^/]+")
            else:
                literals += 1
                parts.append(re.escape(seg))
        pattern = re.compile("^/" + "/".join(parts) + "$") if template != "/" else re.compile("^/$")
        routes.append((pattern, template, literals))
    routes.sort(key=lambda r: -r[2])
    return routes


def deref(spec: dict[str, Any], obj: Any) -> Any:
    """Follow local ``$ref`` pointers (RFC 6901 escapes ``~1`` and ``~0``) until a non-reference node."""
    while isinstance(obj, dict) and "$ref" in obj:
        node: Any = spec
        for part in obj["$ref"].lstrip("#/").split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        obj = node
    return obj
