"""Mapping and document validation of the local index, with OpenSearch's rules and error strings.

Field types are those of OpenSearch mappings; ``rank_features`` values follow Lucene ``FeatureField``
(finite, >= ``Float.MIN_NORMAL``; contract §6.1).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..contract import FLOAT_MIN_NORMAL
from .errors import LocalIndexError

__all__ = ["FIELD_TYPES", "validate_mappings", "validate_document"]

#: Field types the local backend maps.
FIELD_TYPES = {"rank_features", "text", "keyword", "integer", "long", "float", "double", "boolean", "date",
                "object", "match_only_text"}


def validate_mappings(mappings: dict) -> dict:
    """The ``properties`` of a ``PUT <index>`` mappings body (or its ``mappings`` member), validated."""
    if not isinstance(mappings, dict):
        raise LocalIndexError("mappings must be an object")
    props = mappings.get("properties", {} if "mappings" not in mappings else None)
    if props is None:
        props = mappings["mappings"].get("properties", {})
    if not isinstance(props, dict):
        raise LocalIndexError("[properties] must be an object")
    out = {}
    for field, spec in props.items():
        if not isinstance(spec, dict):
            raise LocalIndexError(f"Expected map for property [fields] on field [{field}] but got a {type(spec).__name__}",
                                  "mapper_parsing_exception")
        ftype = spec.get("type", "object")
        if ftype not in FIELD_TYPES:
            raise LocalIndexError(f"No handler for type [{ftype}] declared on field [{field}] (local backend "
                                  f"supports {sorted(FIELD_TYPES)})", "mapper_parsing_exception")
        out[field] = dict(spec, type=ftype)
    return out


def validate_document(did: str, source: Any, props: dict) -> dict:
    """Validate one document like OpenSearch's mappers would; maps new token->weight fields as
    ``rank_features`` (a local convenience; always map vector fields explicitly on a cluster)."""
    if not isinstance(source, dict):
        raise LocalIndexError("The bulk request must be terminated by a newline [\\n]" if source is None else
                              f"failed to parse document [{did}]: _source must be an object", "mapper_parsing_exception")
    for field, value in source.items():
        spec = props.get(field)
        if spec is None and isinstance(value, dict) and value and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
            spec = props[field] = {"type": "rank_features"}
        if spec is None or spec.get("type") != "rank_features" or value is None:
            continue
        if not isinstance(value, dict):
            raise LocalIndexError(
                f"failed to parse field [{field}] of type [rank_features] in document with id '{did}'. "
                "Preview of field's value: '" + str(value)[:64] + "'", "mapper_parsing_exception")
        positive = spec.get("positive_score_impact", True)
        if _all_valid(value, positive):
            continue
        for key, weight in value.items():
            if not isinstance(key, str) or key == "":
                raise LocalIndexError(
                    f"failed to parse field [{field}] of type [rank_features] in document with id '{did}'. "
                    "feature names must be non-empty strings", "mapper_parsing_exception")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise LocalIndexError(
                    f"failed to parse field [{field}] of type [rank_features] in document with id '{did}'. "
                    "[rank_features] fields take hashes that map a feature to a strictly positive float, but got "
                    f"unexpected token {'VALUE_STRING' if isinstance(weight, str) else 'START_OBJECT'}",
                    "mapper_parsing_exception")
            w = float(np.float32(weight))
            if not positive and w != 0.0:
                w = float(np.float32(1.0 / w))
            if not math.isfinite(w):
                raise LocalIndexError(
                    f"failed to parse field [{field}] of type [rank_features] in document with id '{did}'. "
                    f"featureValue must be finite, got: {weight} for feature {key} on field {field}",
                    "mapper_parsing_exception")
            if w < FLOAT_MIN_NORMAL:
                raise LocalIndexError(
                    f"failed to parse field [{field}] of type [rank_features] in document with id '{did}'. "
                    f"featureValue must be a positive normal float, got: {weight} for feature {key} on field "
                    f"{field} which is less than the minimum positive normal float: {FLOAT_MIN_NORMAL}",
                    "mapper_parsing_exception")
    return source


def _all_valid(value: dict, positive: bool) -> bool:
    """Vectorised check of a token->weight map (the common case at bulk scale); ``False`` sends the
    caller to the per-feature loop that names the first bad feature with OpenSearch's message."""
    weights = list(value.values())
    if set(map(type, value)) != {str} or "" in value or not set(map(type, weights)) <= {float, int}:
        return False
    try:
        w = np.asarray(weights, dtype=np.float32)
    except (OverflowError, ValueError):
        return False
    if not positive:
        with np.errstate(divide="ignore", over="ignore"):
            w = np.where(w != 0, (1.0 / w.astype(np.float64)).astype(np.float32), w)
    return bool(np.all(np.isfinite(w) & (w >= FLOAT_MIN_NORMAL)))
