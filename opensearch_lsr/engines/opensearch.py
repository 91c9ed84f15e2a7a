"""The OpenSearch engine: an ``opensearch-py`` client behind the engine protocol.

Index set-up follows :func:`opensearch_lsr.opensearch.indices.create_index` (templates in
``mappings/``, adapted to the cluster version), bulk loading :class:`~opensearch_lsr.opensearch.bulk.OpenSearchBulkWriter`
(retries, per-item outcomes), deployment :func:`~opensearch_lsr.opensearch.mlcommons.deploy_bundle`
(ML Commons, idempotent by content hash).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..contract import DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD
from .base import BulkOutcome, EngineKind, IndexKind

__all__ = ["OpenSearchEngine"]


class OpenSearchEngine:
    """An OpenSearch cluster.

    Args:
        client: an ``opensearchpy.OpenSearch`` client (``opensearch.client.client_from_options``).
        features: the cluster's features; detected on first use when not given.
        deploy_options: :class:`~opensearch_lsr.opensearch.mlcommons.DeployConfig` fields for :meth:`deploy_model`.
    """

    kind: EngineKind = "opensearch"

    def __init__(self, client: Any, features: Any = None, **deploy_options: Any) -> None:
        self.client = client
        self._features = features
        self.deploy_options = deploy_options

    @property
    def features(self) -> Any:
        """The cluster's :class:`~opensearch_lsr.opensearch.client.ClusterFeatures`."""
        if self._features is None:
            from ..opensearch.client import detect_features

            self._features = detect_features(self.client)
        return self._features

    def create_index(self, index: str, *, kind: IndexKind = "rank_features", text_field: str = DEFAULT_TEXT_FIELD,
                     vector_field: str = DEFAULT_VECTOR_FIELD, exist_ok: bool = False) -> dict[str, Any]:
        """Create ``index`` from ``mappings/<kind>.json``; with ``exist_ok`` an existing index is kept."""
        from ..opensearch.indices import create_index

        if exist_ok and self.client.indices.exists(index=index):
            return {"index": index, "kind": kind, "existed": True}
        out = create_index(self.client, index, kind, self.features, text_field=text_field, vector_field=vector_field)
        out.pop("body", None)
        return out

    def bulk(self, index: str, actions: Sequence[dict]) -> list[BulkOutcome]:
        """Bulk-load ``actions`` (429/5xx retried); one outcome per action."""
        from ..opensearch.bulk import OpenSearchBulkWriter

        return OpenSearchBulkWriter(self.client, index).write(list(actions))

    def search(self, index: str, body: dict) -> dict:
        """``POST <index>/_search``."""
        return self.client.search(index=index, body=body)

    def deploy_model(self, bundle: str | os.PathLike) -> dict[str, str]:
        """Register and deploy the bundle in ML Commons; the model ids by function name."""
        from ..opensearch.mlcommons import DeployConfig, deploy_bundle

        result = deploy_bundle(self.client, bundle, DeployConfig(**self.deploy_options), features=self.features)
        return {k: v for k, v in result.items() if k in ("sparse_encoding", "sparse_tokenize")}
