"""Bulk-load precomputed vectors into Elasticsearch with the OpenSearch path's guarantees.

:class:`EsBulkWriter` is ``elasticsearch.helpers.streaming_bulk`` (chunking by count and bytes,
backoff on 429 and, from elasticsearch-py 8.16, 5xx items via ``retry_on_status``) plus what the helper does not do, exactly as
:class:`~opensearch_lsr.opensearch.bulk.OpenSearchBulkWriter` does it: a whole request that fails
(connection error, 5xx/429 on ``_bulk``) is retried with backoff and finally raised as
:class:`~opensearch_lsr.engines.bulk_retry.BulkWriteError` so the job stops on a checkpoint; every
action gets a :class:`~opensearch_lsr.engines.base.BulkOutcome`, and 4xx item errors (mapping,
bad values) go to the dead-letter file. The retry rounds (and a wall-clock budget per write) are
:class:`~opensearch_lsr.engines.bulk_retry.BulkRetry`'s, the same as OpenSearch's.

:class:`EsDocumentWriter` is the index job's ``DocumentWriter``: it rewrites each document's
sparse field with :func:`~opensearch_lsr.elasticsearch.keys.sanitize_features` (dots -> ``__``,
weights > 0) so precomputed vectors carry the deployed model's keys. Resume / dead-letter /
nothing-lost come from :func:`opensearch_lsr.encoding.job.run_index_job` (deterministic ``_id``,
checkpoint after acknowledged chunks), reused unchanged.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..contract import DEFAULT_VECTOR_FIELD
from ..engines.base import BulkOutcome
from ..engines.bulk_retry import ClusterDocumentWriter, RequestFailed, RetryingBulkWriter, is_retryable_status
from .keys import sanitize_features

__all__ = ["EsBulkWriter", "EsDocumentWriter", "EsWriterFactory"]

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _helper_retries_on_status() -> bool:
    """Whether ``streaming_bulk`` takes ``retry_on_status`` (elasticsearch-py 8.16.0+,
    ``elasticsearch/helpers/actions.py``; 8.11-8.15 pass unknown keywords on to ``client.bulk()``, which raises
    ``TypeError``). Without it the helper retries 429 items only and the 5xx items go to the next round of
    :class:`~opensearch_lsr.engines.bulk_retry.BulkRetry`."""
    import inspect

    from elasticsearch.helpers import streaming_bulk

    return "retry_on_status" in inspect.signature(streaming_bulk).parameters


class EsBulkWriter(RetryingBulkWriter):
    """Writes bulk actions to one index; one outcome per action, in order (arguments:
    :class:`~opensearch_lsr.engines.bulk_retry.RetryingBulkWriter`)."""

    def _send_round(self, pending: list[dict], outcomes: dict[str, BulkOutcome],
                    last_status: dict[str, tuple[int, Any]]) -> list[dict]:
        """One ``streaming_bulk`` pass (see :data:`~opensearch_lsr.engines.bulk_retry.SendRound`)."""
        from elastic_transport import TransportError
        from elasticsearch import ApiError
        from elasticsearch.helpers import streaming_bulk

        extra = {"pipeline": self.pipeline} if self.pipeline else {}
        if _helper_retries_on_status():
            extra["retry_on_status"] = (429, 500, 502, 503, 504)
        try:
            retry, _ = self.sort_answers(
                streaming_bulk(self.client, pending, chunk_size=self.chunk_size, max_chunk_bytes=self.max_chunk_bytes,
                               raise_on_error=False, raise_on_exception=False, max_retries=self.retry.max_retries,
                               initial_backoff=self.retry.initial_backoff, max_backoff=self.retry.max_backoff,
                               yield_ok=True, refresh=self.refresh,
                               **extra),
                pending, outcomes, last_status)
        except (ApiError, TransportError) as err:
            status = getattr(getattr(err, "meta", None), "status", None)
            raise RequestFailed(err, is_retryable_status(status),
                                message=f"{type(err).__name__} {status or ''}".strip()) from err
        return retry


class EsDocumentWriter(ClusterDocumentWriter):
    """The index job's writer for Elasticsearch: sanitised keys, then :class:`EsBulkWriter`."""

    def __init__(self, bulk: EsBulkWriter, sparse_field: str = DEFAULT_VECTOR_FIELD) -> None:
        super().__init__(bulk)
        self.sparse_field = sparse_field

    def _fix(self, action: dict) -> dict:
        source = dict(action["_source"])
        value = source.get(self.sparse_field)
        if isinstance(value, dict):
            source[self.sparse_field] = sanitize_features(value)
        elif isinstance(value, list):  # split passages: [{"sparse_encoding": {...}, "text": ...}]
            source[self.sparse_field] = [dict(p, sparse_encoding=sanitize_features(p.get("sparse_encoding", {})))
                                         for p in value]
        return dict(action, _source=source)

    def write(self, actions: Sequence[dict]) -> list[BulkOutcome]:
        return self.bulk.write([self._fix(a) for a in actions])


@dataclass(frozen=True)
class EsWriterFactory:
    """A picklable zero-argument factory of :class:`EsDocumentWriter` for ``lsr-os index --engine ray``.

    Each Ray encoder actor calls it once to build its own client and writer (a client cannot be shipped
    to another process). ``connection``: the keyword arguments of
    :func:`~opensearch_lsr.elasticsearch.client.make_es_client`, resolved on the driver.
    """

    connection: dict[str, Any] = field(repr=False)
    index: str
    sparse_field: str = DEFAULT_VECTOR_FIELD

    def __call__(self) -> EsDocumentWriter:
        from .client import make_es_client

        return EsDocumentWriter(EsBulkWriter(make_es_client(**self.connection), self.index),
                                sparse_field=self.sparse_field)
