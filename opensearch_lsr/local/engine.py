"""The local engine: :class:`~opensearch_lsr.local.index.LocalIndex` behind the engine protocol.

An index is a directory: ``index`` is a path (absolute or relative), resolved against ``root``.
Deploying a bundle needs no server: the local backend runs a model given by its path, so the
model ids are the paths of the bundle's ML Commons zips.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..contract import DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD
from ..engines.base import BulkOutcome, EngineKind, IndexKind, LongText, VectorField
from .errors import LocalIndexError
from .index import LocalIndex

__all__ = ["LocalEngine", "LocalIndexWriter", "bulk_outcomes"]

#: Bundle files and the ML Commons function each one is deployed as.
BUNDLE_MODELS = {"sparse_encoding": "sparse_encoding.zip", "sparse_tokenize": "sparse_tokenize.zip"}


def bulk_outcomes(actions: Sequence[dict], response: dict) -> list[BulkOutcome]:
    """Per-action outcomes of a ``_bulk``-shaped response (items in action order)."""
    out = []
    for action, item in zip(actions, response["items"]):
        info = next(iter(item.values()))
        ok = "error" not in info
        out.append(BulkOutcome(str(action.get("_id", info.get("_id"))), ok, int(info.get("status", 0)),
                               None if ok else info.get("error")))
    return out


class LocalIndexWriter:
    """The index job's ``DocumentWriter`` into a :class:`LocalIndex` (durable per call; ``_id``\\ s are
    deterministic and re-indexing overwrites, so a checkpoint needs no writer state)."""

    def __init__(self, path: str | os.PathLike, mappings: dict | None = None) -> None:
        self.index = LocalIndex.create(path, mappings=mappings, exist_ok=True)

    def write(self, actions: Sequence[dict]) -> list[BulkOutcome]:
        return bulk_outcomes(actions, self.index.bulk(actions, refresh=False))

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        return None

    def count(self) -> int:
        self.index.refresh()
        return self.index.count()

    def close(self) -> None:
        self.index.refresh()


class LocalEngine:
    """The embedded engine (one machine, no server).

    Args:
        root: directory that relative index paths are resolved against.
    """

    kind: EngineKind = "local"

    def __init__(self, root: str | os.PathLike = ".") -> None:
        self.root = Path(root)
        self._open: dict[Path, LocalIndex] = {}

    @classmethod
    def from_options(cls, root: str | os.PathLike = ".", **_: Any) -> "LocalEngine":
        """The engine for command options (connection options do not apply: no server)."""
        return cls(root)

    @property
    def version(self) -> None:
        """No version: every feature of the query language is there."""
        return None

    def path(self, index: str | os.PathLike) -> Path:
        """The directory of ``index``."""
        return self.root / index

    def exists(self, index: str | os.PathLike) -> bool:
        """Whether ``index`` is a local index directory."""
        return LocalIndex.exists(self.path(index))

    def create(self, index: str | os.PathLike, mappings: dict, *, exist_ok: bool = False) -> LocalIndex:
        """A :class:`LocalIndex` with these ``mappings`` (``{"properties": ...}``, OpenSearch's layout)."""
        idx = LocalIndex.create(self.path(index), mappings, exist_ok=exist_ok)
        self._open[self.path(index)] = idx
        return idx

    def open(self, index: str | os.PathLike) -> LocalIndex:
        """The :class:`LocalIndex` of ``index`` (kept open between calls)."""
        path = self.path(index)
        if path not in self._open:
            self._open[path] = LocalIndex.open(path)
        return self._open[path]

    def create_index(self, index: str, *, kind: IndexKind = "rank_features", text_field: str = DEFAULT_TEXT_FIELD,
                     vector_field: str = DEFAULT_VECTOR_FIELD, exist_ok: bool = False) -> dict[str, Any]:
        """Create ``index`` as ``mappings/rank_features.json`` lays it out: the text field analysed with
        ``nori`` (``contract.DEFAULT_TEXT_ANALYZER``), the vector field ``rank_features`` (``sparse_vector``
        is OpenSearch-only)."""
        from ..encoding.documents import flat_mapping

        if kind != "rank_features":
            raise LocalIndexError(f"the local engine has rank_features fields only, not {kind!r} (allowed: "
                                  "rank_features)")
        mappings = flat_mapping(text_field=text_field, sparse_field=vector_field)
        idx = LocalIndex.create(self.path(index), mappings=mappings, exist_ok=exist_ok)
        self._open[self.path(index)] = idx
        return {"index": str(idx.path), "kind": kind, "text_field": text_field, "vector_field": vector_field}

    def bulk(self, index: str, actions: Sequence[dict]) -> list[BulkOutcome]:
        """Apply ``actions``; durable on disk when it returns."""
        actions = list(actions)
        return bulk_outcomes(actions, self.open(index).bulk(actions, refresh=False))

    def search(self, index: str, body: dict, *, search_pipeline: str | dict | None = None) -> dict:
        """Run a ``_search`` body against ``index`` (a hybrid query fused by ``search_pipeline``: a
        pipeline body, or the name of one stored in the index)."""
        idx = self.open(index)
        idx.refresh()
        return idx.search(body, search_pipeline=search_pipeline) if search_pipeline else idx.search(body)

    def vector_field(self, index: str, field: str | None = None) -> VectorField:
        """``field``, else the index's only ``rank_features`` field, else ``sparse_embedding``."""
        if field is None:
            fields = self.open(index).vector_fields
            field = fields[0] if len(fields) == 1 else DEFAULT_VECTOR_FIELD
        return VectorField(field, "rank_features")

    def put_search_pipeline(self, pipeline_id: str, body: dict) -> dict:
        """The pipeline body itself: the local engine takes it with each search (nothing is stored)."""
        return body

    def check_search(self, index: str, size: int) -> None:
        """Nothing to refuse: scoring is exact at any ``size``."""
        return None

    def document_writer(self, index: str, *, text_field: str = DEFAULT_TEXT_FIELD,
                        sparse_field: str = DEFAULT_VECTOR_FIELD, key_format: str = "word",
                        long_text: LongText = "truncate") -> LocalIndexWriter:
        """A :class:`LocalIndexWriter` into ``index`` (created when missing: ``rank_features`` field for WORD
        keys; token-id keys get no mapping). Split passages need nested fields, which it has not."""
        from ..encoding.documents import flat_mapping

        if long_text == "split":
            raise LocalIndexError("the local backend has no nested fields: use --long-text truncate, "
                                  "or the opensearch/ndjson backend for split passages")
        mappings = flat_mapping(text_field, sparse_field, key_format) if key_format == "word" else None
        return LocalIndexWriter(self.path(index), mappings=mappings)

    def deploy_model(self, bundle: str | os.PathLike) -> dict[str, str]:
        """Model ids of an export bundle: the absolute paths of its zips (usable as ``model_id``)."""
        root = Path(bundle)
        ids = {fn: str((root / name).resolve()) for fn, name in BUNDLE_MODELS.items() if (root / name).is_file()}
        if not ids:
            raise LocalIndexError(f"{bundle} holds no {' or '.join(BUNDLE_MODELS.values())}: not an export bundle "
                                  "(lsr-os export writes one)")
        return ids
