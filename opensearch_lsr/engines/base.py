"""The engine protocol: what every engine that holds an index does for the toolkit.

An engine creates an index (from the ``mappings/`` layout, field defaults in
:mod:`opensearch_lsr.contract`), takes bulk actions, answers ``_search`` bodies and deploys an
export bundle. The local backend and OpenSearch implement it (:mod:`.local`, :mod:`.opensearch`);
a new engine (Elasticsearch next) is one added module registered in :data:`opensearch_lsr.engines.ENGINES`.
Shared rules (token keys, decode, limits) are not part of an engine: they live in :mod:`opensearch_lsr.contract`.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from ..contract import DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD

__all__ = ["Engine", "BulkOutcome", "IndexKind", "EngineKind"]

#: Vector field kinds: ``rank_features`` (exact, WORD keys) or ``sparse_vector`` (SEISMIC, token ids).
IndexKind = Literal["rank_features", "sparse_vector"]
#: Engines the toolkit knows.
EngineKind = Literal["local", "opensearch", "elasticsearch"]


@dataclass
class BulkOutcome:
    """What happened to one bulk action: ``ok`` or the final ``status`` and ``error`` (reason)."""

    doc_id: str
    ok: bool
    status: int
    error: Any = None


@runtime_checkable
class Engine(Protocol):
    """An engine that holds indices: create, bulk, search, deploy.

    ``index`` is an index name (a directory for the local engine). Errors are
    :class:`opensearch_lsr.errors.LsrError` subclasses with one clear sentence.
    """

    #: Which engine this is.
    kind: EngineKind

    def create_index(self, index: str, *, kind: IndexKind = "rank_features", text_field: str = DEFAULT_TEXT_FIELD,
                     vector_field: str = DEFAULT_VECTOR_FIELD, exist_ok: bool = False) -> dict[str, Any]:
        """Create ``index`` with a text field and a sparse vector field; returns a summary."""
        ...

    def bulk(self, index: str, actions: Sequence[dict]) -> list[BulkOutcome]:
        """Apply bulk actions (``{"_op_type", "_id", "_source"}``); one outcome per action."""
        ...

    def search(self, index: str, body: dict) -> dict:
        """Run a ``_search`` body; the response has OpenSearch's shape."""
        ...

    def deploy_model(self, bundle: str | os.PathLike) -> dict[str, str]:
        """Make an export bundle usable in queries; returns the model ids by function name."""
        ...
