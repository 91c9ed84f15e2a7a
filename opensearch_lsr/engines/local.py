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
from ..local.errors import LocalIndexError
from ..local.index import LocalIndex
from .base import BulkOutcome, EngineKind, IndexKind

__all__ = ["LocalEngine", "bulk_outcomes"]

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


class LocalEngine:
    """The embedded engine (one machine, no server).

    Args:
        root: directory that relative index paths are resolved against.
    """

    kind: EngineKind = "local"

    def __init__(self, root: str | os.PathLike = ".") -> None:
        self.root = Path(root)
        self._open: dict[Path, LocalIndex] = {}

    def path(self, index: str) -> Path:
        """The directory of ``index``."""
        return self.root / index

    def open(self, index: str) -> LocalIndex:
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

    def search(self, index: str, body: dict) -> dict:
        """Run a ``_search`` body against ``index``."""
        idx = self.open(index)
        idx.refresh()
        return idx.search(body)

    def deploy_model(self, bundle: str | os.PathLike) -> dict[str, str]:
        """Model ids of an export bundle: the absolute paths of its zips (usable as ``model_id``)."""
        root = Path(bundle)
        ids = {fn: str((root / name).resolve()) for fn, name in BUNDLE_MODELS.items() if (root / name).is_file()}
        if not ids:
            raise LocalIndexError(f"{bundle} holds no {' or '.join(BUNDLE_MODELS.values())}: not an export bundle "
                                  "(lsr-os export writes one)")
        return ids
