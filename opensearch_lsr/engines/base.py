"""The engine protocol: what every engine that holds an index does for the toolkit.

An engine creates an index (from the ``mappings/`` layout, field defaults in
:mod:`opensearch_lsr.contract`), takes bulk actions (directly, or through the index job's
:meth:`Engine.document_writer`), answers ``_search`` bodies and deploys an export bundle. Each engine
package implements it in its ``engine.py`` (``local/``, ``opensearch/``, ``elasticsearch/``), registered in
:data:`opensearch_lsr.engines.ENGINES`. Shared rules (token keys, decode, limits) are not part of an
engine: they live in :mod:`opensearch_lsr.contract`.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from ..contract import DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD

__all__ = ["Engine", "BulkOutcome", "IndexKind", "EngineKind", "VectorField", "DocumentWriter", "LongText"]

#: Vector field kinds: ``rank_features`` (exact, WORD keys) or ``sparse_vector`` (SEISMIC, token ids).
IndexKind = Literal["rank_features", "sparse_vector"]
#: Engines the toolkit knows.
EngineKind = Literal["local", "opensearch", "elasticsearch"]
#: Texts over 512 tokens: truncated, or split into nested passages.
LongText = Literal["truncate", "split"]


@dataclass
class BulkOutcome:
    """What happened to one bulk action: ``ok`` or the final ``status`` and ``error`` (reason)."""

    doc_id: str
    ok: bool
    status: int
    error: Any = None


@dataclass(frozen=True)
class VectorField:
    """A sparse field of an index, as a query must address it.

    Attributes:
        name: the field to query (``<nested>.sparse_encoding`` for split documents).
        kind: ``rank_features`` or ``sparse_vector``.
        nested_path: the ``nested`` field the vectors sit under, or ``None``.
    """

    name: str
    kind: IndexKind
    nested_path: str | None = None

    @property
    def key_format(self) -> Literal["word", "token_id"]:
        """``token_id`` keys for ``sparse_vector`` (its mapper takes integer ids only), else ``word``."""
        return "token_id" if self.kind == "sparse_vector" else "word"


class DocumentWriter(Protocol):
    """Where the index job writes: one outcome per action; ``state``/``restore`` for checkpoints."""

    def write(self, actions: Sequence[dict]) -> list[BulkOutcome]: ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


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

    def search(self, index: str, body: dict, *, search_pipeline: str | dict | None = None) -> dict:
        """Run a ``_search`` body (under ``search_pipeline``, a name or what :meth:`put_search_pipeline`
        returned); the response has OpenSearch's shape."""
        ...

    @property
    def version(self) -> tuple[int, int, int] | None:
        """The engine's version (``None``: the local engine, no version gating)."""
        ...

    def vector_field(self, index: str, field: str | None = None) -> VectorField:
        """The sparse field a query of ``index`` addresses (``field``, else the index's only one)."""
        ...

    def put_search_pipeline(self, pipeline_id: str, body: dict) -> str | dict:
        """Store a search pipeline; returns what :meth:`search` takes as ``search_pipeline``."""
        ...

    def check_search(self, index: str, size: int) -> None:
        """Refuse, with one sentence, a search of ``size`` hits the engine would answer wrongly."""
        ...

    def document_writer(self, index: str, *, text_field: str = DEFAULT_TEXT_FIELD,
                        sparse_field: str = DEFAULT_VECTOR_FIELD, key_format: str = "word",
                        long_text: LongText = "truncate") -> DocumentWriter:
        """The index job's writer into ``index``, after checking the index can take these documents."""
        ...

    def deploy_model(self, bundle: str | os.PathLike) -> dict[str, str]:
        """Make an export bundle usable in queries; returns the model ids by function name."""
        ...
