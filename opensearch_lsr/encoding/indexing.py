"""The one indexing path: records -> sparse vectors -> ``_source`` documents -> a writer.

``lsr-os index`` (the resumable job in :mod:`.job`), ``lsr-os eval``, ``lsr-os quickstart`` and the
notebook all build documents with :func:`build_actions` (keys by the contract's rule, pruning,
field names from :mod:`opensearch_lsr.contract`) and write them through a
:class:`~opensearch_lsr.encoding.writers.DocumentWriter`; :func:`index_records` is the whole path
for callers that need no checkpoints (an in-memory corpus).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .documents import DocumentBuilder, doc_id_for
from .encoder import SparseVector

__all__ = ["VectorEncoder", "IndexCounts", "build_actions", "index_records"]


class VectorEncoder(Protocol):
    """What the indexing path needs from an encoder (:class:`~.encoder.SparseDocumentEncoder`)."""

    @property
    def keys(self) -> list[str]:
        """WORD key per vocabulary id."""

    def encode(self, texts: Sequence[str]) -> list[SparseVector]:
        """One vector per text (ascending ids, positive weights)."""


@dataclass
class IndexCounts:
    """What :func:`index_records` did: documents written, and those the writer refused (with why)."""

    indexed: int = 0
    failed: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)


def build_actions(records: Sequence[tuple[str | None, str]], vectors: Sequence[SparseVector],
                  builder: DocumentBuilder) -> list[dict]:
    """Bulk ``index`` actions for ``(doc_id, text)`` records and their vectors (``_id``: the corpus
    id, or the sha1 of the text when there is none)."""
    actions = []
    for (doc_id, text), vector in zip(records, vectors):
        did = doc_id_for(doc_id, text)
        actions.append({"_id": did, "_source": builder.source(did, text, vector)})
    return actions


def index_records(records: Iterable[tuple[str | None, str]], encoder: VectorEncoder, writer: Any,
                  builder: DocumentBuilder | None = None, *, chunk_docs: int = 256) -> IndexCounts:
    """Encode ``(doc_id, text)`` records and write them in chunks of ``chunk_docs``.

    Args:
        records: ``(doc_id, text)`` pairs (any iterable; consumed once).
        encoder: the document encoder (same vectors as the exported model).
        writer: a :class:`~opensearch_lsr.encoding.writers.DocumentWriter` (local index, NDJSON, OpenSearch).
        builder: how documents look (default: WORD keys, no pruning, the contract's field defaults).
        chunk_docs: records encoded and written per step.
    """
    builder = builder or DocumentBuilder(encoder.keys)
    counts = IndexCounts()
    chunk: list[tuple[str | None, str]] = []

    def flush() -> None:
        if not chunk:
            return
        for outcome in writer.write(build_actions(chunk, encoder.encode([t for _, t in chunk]), builder)):
            if outcome.ok:
                counts.indexed += 1
            else:
                counts.failed += 1
                counts.errors.append({"_id": outcome.doc_id, "status": outcome.status, "error": outcome.error})
        chunk.clear()

    for record in records:
        chunk.append(record)
        if len(chunk) >= chunk_docs:
            flush()
    flush()
    return counts
