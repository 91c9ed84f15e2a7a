"""The JSON templates in ``mappings/`` and ``pipelines/``: where they are, loading, ``{{placeholder}}`` rendering.

The templates are the single source of truth for index and pipeline bodies (also usable with curl, see
their READMEs). Every engine renders its own templates with :func:`render`: OpenSearch
(``mappings/*.json``, ``pipelines/*.json``), Elasticsearch (``mappings/elasticsearch/``).
"""
from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Literal

from ..errors import LsrError

__all__ = ["IndexSetupError", "templates_root", "load_template", "render"]

_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")


class IndexSetupError(LsrError, ValueError):
    """Bad index/pipeline options or a feature the cluster does not have (one clear sentence)."""


#: a source checkout keeps the templates at the repository root
_REPO_ROOT = Path(__file__).resolve().parents[2]


def templates_root() -> Path:
    """Folder holding ``mappings/`` and ``pipelines/``.

    ``$LSR_TEMPLATES_DIR`` when set; else the repository root of a source checkout; else
    ``<prefix>/share/opensearch-lsr``, where a wheel install puts them (setup.cfg ``data_files``).
    """
    env = os.environ.get("LSR_TEMPLATES_DIR")
    candidates = [Path(env)] if env else [_REPO_ROOT, Path(sys.prefix) / "share" / "opensearch-lsr"]
    for root in candidates:
        if (root / "mappings").is_dir() and (root / "pipelines").is_dir():
            return root
    raise IndexSetupError("template folders mappings/ and pipelines/ not found under "
                          f"{' or '.join(map(str, candidates))} (set LSR_TEMPLATES_DIR)")


def load_template(kind: Literal["mappings", "pipelines"], name: str) -> dict[str, Any]:
    """Parse ``<root>/<kind>/<name>.json``."""
    path = templates_root() / kind / f"{name}.json"
    if not path.is_file():
        available = sorted(p.stem for p in (templates_root() / kind).glob("*.json"))
        raise IndexSetupError(f"no template {kind}/{name}.json; available: {', '.join(available)}")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def render(template: Any, values: dict[str, Any]) -> Any:
    """Replace ``{{name}}`` in keys and string values.

    A string that is exactly one placeholder takes the value's type (numbers, objects); a value of
    ``None`` removes that key (or list item). Unknown placeholders raise :class:`IndexSetupError`.
    """
    _drop = object()

    def sub_str(text: str) -> Any:
        whole = _PLACEHOLDER.fullmatch(text)
        if whole:
            name = whole.group(1)
            if name not in values:
                raise IndexSetupError(f"template placeholder {{{{{name}}}}} has no value")
            return _drop if values[name] is None else copy.deepcopy(values[name])

        def repl(match: re.Match) -> str:
            name = match.group(1)
            if name not in values or values[name] is None:
                raise IndexSetupError(f"template placeholder {{{{{name}}}}} has no value")
            return str(values[name])

        return _PLACEHOLDER.sub(repl, text)

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                new_key = sub_str(key) if isinstance(key, str) else key
                new_value = walk(value)
                if new_key is _drop or new_value is _drop:
                    continue
                out[str(new_key)] = new_value
            return out
        if isinstance(node, list):
            return [v for v in (walk(x) for x in node) if v is not _drop]
        if isinstance(node, str):
            return sub_str(node)
        return node

    return walk(template)
