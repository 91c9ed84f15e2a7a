"""Bulk-load precomputed vectors into Elasticsearch with the OpenSearch path's guarantees.

:class:`EsBulkWriter` is ``elasticsearch.helpers.streaming_bulk`` (chunking by count and bytes,
backoff on 429 and 5xx items via ``retry_on_status``) plus what the helper does not do, exactly as
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

import logging
import time
from collections.abc import Sequence
from typing import Any

from ..engines.base import BulkOutcome
from ..engines.bulk_retry import BulkRetry, RequestFailed, int_status, is_retryable_status
from .keys import sanitize_features

__all__ = ["EsBulkWriter", "EsDocumentWriter"]

logger = logging.getLogger(__name__)


class EsBulkWriter:
    """Writes bulk actions to one index; one outcome per action, in order.

    Args:
        client: an ``elasticsearch.Elasticsearch`` client.
        index: target index.
        pipeline: ingest pipeline for the request (``None``: the index default; precomputed vectors
            are sent with ``"_none"`` so a default inference pipeline does not recompute them).
        max_elapsed_s: wall-clock budget of one :meth:`write`, checked between retry rounds.
    """

    def __init__(self, client, index: str, *, pipeline: str | None = "_none", chunk_size: int = 500,
                 max_chunk_bytes: int = 10 * 1024 * 1024, max_retries: int = 8, initial_backoff: float = 1.0,
                 max_backoff: float = 60.0, refresh: bool | str = False, sleep=time.sleep,
                 max_elapsed_s: float = 600.0) -> None:
        if not index or index.startswith(("_", "-", "+")) or index != index.lower():
            raise ValueError(f"invalid index name {index!r}: lowercase, not starting with _, - or +")
        if chunk_size < 1 or max_retries < 0:
            raise ValueError("chunk_size must be >= 1 and max_retries >= 0")
        self.client = client
        self.index = index
        self.pipeline = pipeline
        self.chunk_size = chunk_size
        self.max_chunk_bytes = max_chunk_bytes
        self.refresh = refresh
        self.retry = BulkRetry(index, max_retries=max_retries, initial_backoff=initial_backoff,
                               max_backoff=max_backoff, max_elapsed_s=float(max_elapsed_s), sleep=sleep)

    @property
    def retried_items(self) -> int:
        return self.retry.retried_items

    @property
    def retried_requests(self) -> int:
        return self.retry.retried_requests

    def write(self, actions: Sequence[dict]) -> list[BulkOutcome]:
        """Send ``{"_id", "_source"}`` actions.

        Raises:
            BulkWriteError: whole requests still failing after ``max_retries``.
        """
        pending = [dict(a, _index=a.get("_index", self.index), _op_type=a.get("_op_type", "index")) for a in actions]
        return self.retry.run(pending, self._send_round)

    def _send_round(self, pending: list[dict], outcomes: dict[str, BulkOutcome],
                    last_status: dict[str, tuple[int, Any]]) -> list[dict]:
        """One ``streaming_bulk`` pass (see :data:`~opensearch_lsr.engines.bulk_retry.SendRound`)."""
        from elastic_transport import TransportError
        from elasticsearch import ApiError
        from elasticsearch.helpers import streaming_bulk

        extra = {"pipeline": self.pipeline} if self.pipeline else {}
        retry: list[dict] = []
        by_id = {str(a["_id"]): a for a in pending}
        try:
            request_error = None
            for ok, item in streaming_bulk(
                    self.client, pending, chunk_size=self.chunk_size, max_chunk_bytes=self.max_chunk_bytes,
                    raise_on_error=False, raise_on_exception=False, max_retries=self.retry.max_retries,
                    initial_backoff=self.retry.initial_backoff, max_backoff=self.retry.max_backoff, yield_ok=True,
                    retry_on_status=(429, 500, 502, 503, 504), refresh=self.refresh, **extra):
                _op, info = next(iter(item.items()))
                did = str(info.get("_id"))
                status = info.get("status", 0)
                if ok:
                    outcomes[did] = BulkOutcome(did, True, int(status))
                elif "exception" in info:  # the whole _bulk request failed: never a dead letter
                    request_error = info["exception"]
                elif is_retryable_status(status) and did in by_id:
                    last_status[did] = (int_status(status), info.get("error") or info)
                    retry.append(by_id[did])
                else:
                    outcomes[did] = BulkOutcome(did, False, int_status(status), info.get("error") or info)
            if request_error is not None:
                raise request_error
        except (ApiError, TransportError) as err:
            status = getattr(getattr(err, "meta", None), "status", None)
            raise RequestFailed(err, is_retryable_status(status),
                                message=f"{type(err).__name__} {status or ''}".strip()) from err
        return retry

    def refresh_index(self) -> None:
        self.client.indices.refresh(index=self.index)

    def count(self) -> int:
        return int(self.client.count(index=self.index)["count"])


class EsDocumentWriter:
    """The index job's writer for Elasticsearch: sanitised keys, then :class:`EsBulkWriter`."""

    def __init__(self, bulk: EsBulkWriter, sparse_field: str = "sparse_embedding") -> None:
        self.bulk = bulk
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

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        return None

    def count(self) -> int:
        self.bulk.refresh_index()
        return self.bulk.count()

    def close(self) -> None:
        try:
            self.bulk.refresh_index()
        except Exception:  # noqa: BLE001 - a courtesy refresh at the end
            logger.info("final refresh of %s failed", self.bulk.index)
