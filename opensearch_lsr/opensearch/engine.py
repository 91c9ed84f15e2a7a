"""The OpenSearch engine: an ``opensearch-py`` client behind the engine protocol
(:class:`opensearch_lsr.engines.base.Engine`).

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
from ..engines.base import BulkOutcome, EngineKind, IndexKind, LongText, VectorField
from .client import client_from_options, connection_options, retry_429

__all__ = ["OpenSearchEngine"]


class OpenSearchEngine:
    """An OpenSearch cluster.

    Args:
        client: an ``opensearchpy.OpenSearch`` client (``opensearch.client.client_from_options``).
        features: the cluster's features; detected on first use when not given.
        deploy_options: :class:`~opensearch_lsr.opensearch.mlcommons.DeployConfig` fields for :meth:`deploy_model`.
    """

    kind: EngineKind = "opensearch"
    #: The click options a command needs to connect (``--url``, auth, TLS, SigV4, timeouts).
    connection_options = staticmethod(connection_options)
    #: ``client_from_options(**command kwargs)``: a client from those options.
    client_from_options = staticmethod(client_from_options)

    def __init__(self, client: Any, features: Any = None, **deploy_options: Any) -> None:
        self.client = client
        self._features = features
        self._version: tuple[int, int, int] | None = None
        self.deploy_options = deploy_options

    @staticmethod
    def export(model_dir: str | os.PathLike, out_dir: str | os.PathLike, **options: Any) -> dict[str, Any]:
        """The ML Commons bundle of an encoder (:func:`~opensearch_lsr.opensearch.artifacts.export_bundle`)."""
        from .artifacts import export_bundle

        return export_bundle(model_dir, out_dir, **options)

    @classmethod
    def from_options(cls, **options: Any) -> "OpenSearchEngine":
        """An engine on the cluster the connection options name (other keys are ignored)."""
        return cls(client_from_options(**options))

    @property
    def features(self) -> Any:
        """The cluster's :class:`~opensearch_lsr.opensearch.client.ClusterFeatures`."""
        if self._features is None:
            from .client import detect_features

            self._features = detect_features(self.client)
        return self._features

    @property
    def version(self) -> tuple[int, int, int]:
        """The cluster's version (``GET /`` only: no plugin listing). Raises one sentence when the cluster is
        unreachable or not OpenSearch."""
        if self._features is not None:
            return tuple(self._features.version)  # type: ignore[return-value]
        if self._version is None:
            from .client import detect_features

            self._version = tuple(detect_features(self.client, detect_plugins=False).version)  # type: ignore[assignment]
        return self._version  # type: ignore[return-value]

    def create_index(self, index: str, *, kind: IndexKind = "rank_features", text_field: str = DEFAULT_TEXT_FIELD,
                     vector_field: str = DEFAULT_VECTOR_FIELD, exist_ok: bool = False) -> dict[str, Any]:
        """Create ``index`` from ``mappings/<kind>.json``; with ``exist_ok`` an existing index is kept."""
        from .indices import create_index

        if exist_ok and self.client.indices.exists(index=index):
            return {"index": index, "kind": kind, "existed": True}
        out = create_index(self.client, index, kind, self.features, text_field=text_field, vector_field=vector_field)
        out.pop("body", None)
        return out

    def bulk(self, index: str, actions: Sequence[dict]) -> list[BulkOutcome]:
        """Bulk-load ``actions`` (429/5xx retried); one outcome per action."""
        from .bulk import OpenSearchBulkWriter

        return OpenSearchBulkWriter(self.client, index).write(list(actions))

    def search(self, index: str, body: dict, *, search_pipeline: str | dict | None = None) -> dict:
        """``POST <index>/_search`` (``?search_pipeline=`` when given); a 429 (search queue full, a circuit
        breaker) is retried with backoff."""
        params = {"search_pipeline": search_pipeline} if search_pipeline else None
        return retry_429(lambda: self.client.search(index=index, body=body, params=params), what=f"search {index}")

    def vector_field(self, index: str, field: str | None = None) -> VectorField:
        """The index's sparse field (from its mapping): name, kind, key format, nesting."""
        from .indices import vector_field_of

        return vector_field_of(self.client, index, field)

    def put_search_pipeline(self, pipeline_id: str, body: dict) -> str:
        """``PUT _search/pipeline/<id>``; searches name it."""
        from .indices import put_search_pipeline

        put_search_pipeline(self.client, pipeline_id, body)
        return pipeline_id

    def check_search(self, index: str, size: int) -> None:
        """Refuse a ``size`` the index's two-phase pipeline would answer wrongly (its window is too small)."""
        from .indices import check_two_phase

        check_two_phase(self.client, index, size)

    def document_writer(self, index: str, *, text_field: str = DEFAULT_TEXT_FIELD,
                        sparse_field: str = DEFAULT_VECTOR_FIELD, key_format: str = "word",
                        long_text: LongText = "truncate"):
        """:class:`~opensearch_lsr.opensearch.bulk.OpenSearchWriter` into ``index``, after
        :meth:`~opensearch_lsr.opensearch.bulk.OpenSearchBulkWriter.check_target` (the index must exist
        with the field mapped for these documents)."""
        from .bulk import OpenSearchBulkWriter, OpenSearchWriter

        bulk = OpenSearchBulkWriter(self.client, index)
        bulk.check_target(sparse_field, key_format=key_format, long_text=long_text)
        return OpenSearchWriter(bulk)

    def deploy_model(self, bundle: str | os.PathLike) -> dict[str, str]:
        """Register and deploy the bundle in ML Commons; the model ids by function name."""
        from .mlcommons import DeployConfig, deploy_bundle

        result = deploy_bundle(self.client, bundle, DeployConfig(**self.deploy_options), features=self.features)
        return {k: v for k, v in result.items() if k in ("sparse_encoding", "sparse_tokenize")}
