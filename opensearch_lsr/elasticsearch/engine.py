"""The Elasticsearch engine: an ``elasticsearch-py`` client behind the engine protocol
(:class:`opensearch_lsr.engines.base.Engine`).

Index set-up :func:`~opensearch_lsr.elasticsearch.indices.index_body` (``sparse_vector`` + nori),
bulk :class:`~opensearch_lsr.elasticsearch.bulk.EsBulkWriter` with keys made valid
(:func:`~opensearch_lsr.elasticsearch.keys.sanitize_features`), deployment
:func:`~opensearch_lsr.elasticsearch.deploy.deploy_es_model` (idempotent by content hash).
Elasticsearch has one exact sparse field type for learned-sparse vectors, ``sparse_vector``
(Lucene ``FeatureField``, like OpenSearch's ``rank_features``), so both index kinds map onto it.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..contract import DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD
from ..engines.base import BulkOutcome, EngineKind, IndexKind, LongText, VectorField

__all__ = ["ElasticsearchEngine"]


class ElasticsearchEngine:
    """An Elasticsearch 8.15+ / 9.x cluster.

    Args:
        client: an ``elasticsearch.Elasticsearch`` client (:func:`~opensearch_lsr.elasticsearch.client.make_es_client`).
        features: the cluster's :class:`~opensearch_lsr.elasticsearch.client.EsFeatures` (detected when omitted).
        deploy_options: :class:`~opensearch_lsr.elasticsearch.deploy.EsDeployConfig` fields.
    """

    kind: EngineKind = "elasticsearch"

    def __init__(self, client: Any, features: Any = None, **deploy_options: Any) -> None:
        self.client = client
        self._features = features
        self.deploy_options = deploy_options
        self._vector_fields: dict[str, str] = {}

    @staticmethod
    def export(model_dir: str | os.PathLike, out_dir: str | os.PathLike, **options: Any) -> dict[str, Any]:
        """The ``text_expansion`` trained model of an encoder (:func:`~.export.export_elasticsearch`)."""
        from .export import export_elasticsearch

        return export_elasticsearch(model_dir, out_dir, **options)

    @property
    def features(self) -> Any:
        if self._features is None:
            from .client import detect_es_features

            self._features = detect_es_features(self.client)
        return self._features

    @property
    def version(self) -> tuple[int, int, int]:
        """The cluster's version."""
        return tuple(self.features.version)  # type: ignore[return-value]

    @property
    def transport(self):
        from .deploy import ClientTransport

        return ClientTransport(self.client)

    def create_index(self, index: str, *, kind: IndexKind = "rank_features", text_field: str = DEFAULT_TEXT_FIELD,
                     vector_field: str = DEFAULT_VECTOR_FIELD, exist_ok: bool = False) -> dict[str, Any]:
        """Create ``index`` (``sparse_vector`` field, nori text field) from ``mappings/elasticsearch/``."""
        from .indices import EsIndexError, create_index, index_body

        if kind not in ("rank_features", "sparse_vector"):
            raise EsIndexError(f"index kind must be one of rank_features, sparse_vector, got {kind!r}")
        body = index_body(self.features, text_field=text_field, sparse_field=vector_field)
        out = create_index(self.transport, index, body, exist_ok=exist_ok)
        self._vector_fields[index] = vector_field
        return {"index": index, "kind": "sparse_vector", "text_field": text_field, "vector_field": vector_field,
                "existed": bool(out.get("existed"))}

    def bulk(self, index: str, actions: Sequence[dict]) -> list[BulkOutcome]:
        """Bulk-load ``actions`` with valid keys (dots -> ``__``); one outcome per action."""
        from .bulk import EsBulkWriter, EsDocumentWriter

        field = self._vector_fields.get(index, DEFAULT_VECTOR_FIELD)
        return EsDocumentWriter(EsBulkWriter(self.client, index), sparse_field=field).write(list(actions))

    def search(self, index: str, body: dict, *, search_pipeline: str | dict | None = None) -> dict:
        """``POST <index>/_search`` (the response has the same shape as OpenSearch's). Elasticsearch fuses
        hybrid queries with an ``rrf`` retriever in the body, not a search pipeline."""
        from .deploy import _reason
        from .indices import EsIndexError

        if search_pipeline:
            raise EsIndexError("Elasticsearch has no search pipelines: hybrid search uses an rrf retriever")
        status, resp = self.transport.request("POST", f"/{index}/_search", None, body)
        if status >= 300:
            raise EsIndexError(f"search on {index} failed with HTTP {status}: {_reason(resp)}")
        return resp

    def vector_field(self, index: str, field: str | None = None) -> VectorField:
        """``field``, else the field this engine created ``index`` with, else ``sparse_embedding``."""
        return VectorField(field or self._vector_fields.get(index, DEFAULT_VECTOR_FIELD), "rank_features")

    def put_search_pipeline(self, pipeline_id: str, body: dict) -> str:
        """Refused: Elasticsearch fuses with ``rrf`` retrievers (:func:`~.query.rrf_body`)."""
        from .indices import EsIndexError

        raise EsIndexError("Elasticsearch has no search pipelines: hybrid search uses an rrf retriever")

    def check_search(self, index: str, size: int) -> None:
        """Nothing to refuse: ``sparse_vector`` queries score exactly at any ``size``."""
        return None

    def document_writer(self, index: str, *, text_field: str = DEFAULT_TEXT_FIELD,
                        sparse_field: str = DEFAULT_VECTOR_FIELD, key_format: str = "word",
                        long_text: LongText = "truncate"):
        """:class:`~.bulk.EsDocumentWriter` into ``index`` (token keys made valid field names)."""
        from .bulk import EsBulkWriter, EsDocumentWriter
        from .indices import EsIndexError

        if key_format != "word" or long_text != "truncate":
            raise EsIndexError("the elasticsearch backend indexes token keys (--key-format word) of truncated "
                               "texts (--long-text truncate)")
        return EsDocumentWriter(EsBulkWriter(self.client, index), sparse_field=sparse_field)

    def deploy_model(self, bundle: str | os.PathLike) -> dict[str, str]:
        """Upload and start the bundle's ``text_expansion`` model; ``{"text_expansion": model_id}``
        (plus ``"sparse_embedding"``: the inference endpoint, when one was asked for)."""
        from .deploy import EsDeployConfig, deploy_es_model

        res = deploy_es_model(bundle, self.transport, EsDeployConfig(**self.deploy_options), progress=False)
        out = {"text_expansion": res["model_id"]}
        if res.get("inference_endpoint"):
            out["sparse_embedding"] = res["inference_endpoint"]
        return out
