"""Engine version numbers: ``"3.3.0-SNAPSHOT"`` -> ``(3, 3, 0)``.

OpenSearch and Elasticsearch both answer ``GET /`` with ``version.number`` in this form (a
``-SNAPSHOT`` or build suffix after ``major.minor[.patch]``); features are then gated on the tuple.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["parse_version", "as_version"]

_VERSION = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str, product: str = "OpenSearch") -> tuple[int, int, int]:
    """``"3.3.0-SNAPSHOT"`` -> ``(3, 3, 0)`` (``product`` names the engine in the error)."""
    match = _VERSION.match(str(text))
    if not match:
        raise ValueError(f"not an {product} version number: {text!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def as_version(version: str | Sequence[int] | None) -> tuple[int, int, int] | None:
    """A version string or sequence as a 3-tuple (missing parts 0); ``None`` stays ``None`` (version
    unknown: no gating)."""
    if version is None:
        return None
    if isinstance(version, str):
        return parse_version(version)
    parts = [int(p) for p in version]
    parts = (parts + [0, 0, 0])[:3]
    return (parts[0], parts[1], parts[2])
