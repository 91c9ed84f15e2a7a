"""Bulk-load precomputed vectors into Elasticsearch with the OpenSearch path's guarantees.

:class:`EsBulkWriter` is ``elasticsearch.helpers.streaming_bulk`` (chunking by count and bytes,
backoff on 429 and 5xx items via ``retry_on_status``) plus what the helper does not do, exactly as
:class:`~opensearch_lsr.opensearch.bulk.OpenSearchBulkWriter` does it: a whole request that fails
(connection error, 5xx/429 on ``_bulk``) is retried with backoff and finally raised as
:class:`~opensearch_lsr.opensearch.bulk.BulkWriteError` so the job stops on a checkpoint; every
action gets a :class:`~opensearch_lsr.opensearch.bulk.BulkOutcome`, and 4xx item errors (mapping,
bad values) go to the dead-letter file.

:class:`EsDocumentWriter` is the index job's ``DocumentWriter``: it rewrites each document's
sparse field with :func:`~opensearch_lsr.elasticsearch.keys.sanitize_features` (dots -> ``__``,
weights > 0) so precomputed vectors carry the deployed model's keys. Resume / dead-letter /
nothing-lost come from :func:`opensearch_lsr.encoding.job.run_index_job` (deterministic ``_id``,
checkpoint after acknowledged chunks), reused unchanged.
"""
from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from typing import Any

from ..opensearch.bulk import BulkOutcome, BulkWriteError, is_retryable_status
from .keys import sanitize_features

__all__ = ["EsBulkWriter", "EsDocumentWriter"]

logger = logging.getLogger(__name__)


def _int_status(status: Any) -> int:
    try:
        return int(status)
    except (TypeError, ValueError):
        return 0


class EsBulkWriter:
    """Writes bulk actions to one index; one outcome per action, in order.

    Args:
        client: an ``elasticsearch.Elasticsearch`` client.
        index: target index.
        pipeline: ingest pipeline for the request (``None``: the index default; precomputed vectors
            are sent with ``"_none"`` so a default inference pipeline does not recompute them).
    """

    def __init__(self, client, index: str, *, pipeline: str | None = "_none", chunk_size: int = 500,
                 max_chunk_bytes: int = 10 * 1024 * 1024, max_retries: int = 8, initial_backoff: float = 1.0,
                 max_backoff: float = 60.0, refresh: bool | str = False, sleep=time.sleep) -> None:
        if not index or index.startswith(("_", "-", "+")) or index != index.lower():
            raise ValueError(f"invalid index name {index!r}: lowercase, not starting with _, - or +")
        if chunk_size < 1 or max_retries < 0:
            raise ValueError("chunk_size must be >= 1 and max_retries >= 0")
        self.client = client
        self.index = index
        self.pipeline = pipeline
        self.chunk_size = chunk_size
        self.max_chunk_bytes = max_chunk_bytes
        self.max_retries = max_retries
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.refresh = refresh
        self._sleep = sleep
        self.retried_items = 0
        self.retried_requests = 0

    def _backoff(self, attempt: int) -> float:
        return min(self.max_backoff, self.initial_backoff * (2 ** attempt)) * (0.5 + random.random() / 2)

    def write(self, actions: Sequence[dict]) -> list[BulkOutcome]:
        """Send ``{"_id", "_source"}`` actions.

        Raises:
            BulkWriteError: whole requests still failing after ``max_retries``.
        """
        from elastic_transport import TransportError
        from elasticsearch import ApiError
        from elasticsearch.helpers import streaming_bulk

        pending = [dict(a, _index=a.get("_index", self.index), _op_type=a.get("_op_type", "index")) for a in actions]
        outcomes: dict[str, BulkOutcome] = {}
        last: dict[str, tuple[int, Any]] = {}
        attempt = 0
        extra = {"pipeline": self.pipeline} if self.pipeline else {}
        while pending:
            retry: list[dict] = []
            try:
                by_id = {str(a["_id"]): a for a in pending}
                request_error = None
                for ok, item in streaming_bulk(
                        self.client, pending, chunk_size=self.chunk_size, max_chunk_bytes=self.max_chunk_bytes,
                        raise_on_error=False, raise_on_exception=False, max_retries=self.max_retries,
                        initial_backoff=self.initial_backoff, max_backoff=self.max_backoff, yield_ok=True,
                        retry_on_status=(429, 500, 502, 503, 504), refresh=self.refresh, **extra):
                    _op, info = next(iter(item.items()))
                    did = str(info.get("_id"))
                    status = info.get("status", 0)
                    if ok:
                        outcomes[did] = BulkOutcome(did, True, int(status))
                    elif "exception" in info:  # the whole _bulk request failed: never a dead letter
                        request_error = info["exception"]
                        retry.append(by_id[did])
                    elif is_retryable_status(status) and attempt < self.max_retries and did in by_id:
                        last[did] = (_int_status(status), info.get("error") or info)
                        retry.append(by_id[did])
                    else:
                        outcomes[did] = BulkOutcome(did, False, _int_status(status), info.get("error") or info)
                if request_error is not None:
                    raise request_error
            except (ApiError, TransportError) as err:
                status = getattr(getattr(err, "meta", None), "status", None)
                if not is_retryable_status(status) or attempt >= self.max_retries:
                    raise BulkWriteError(f"bulk request to index {self.index!r} failed: {type(err).__name__} "
                                         f"{status or ''}".strip()) from err
                self.retried_requests += 1
                logger.warning("bulk request failed (%s); retrying with backoff", type(err).__name__)
                retry = [a for a in pending if str(a["_id"]) not in outcomes]
            if retry:
                if attempt >= self.max_retries:
                    for a in retry:
                        did = str(a["_id"])
                        status, error = last.get(did, (0, None))
                        outcomes.setdefault(did, BulkOutcome(did, False, status, {
                            "reason": f"still failing after {self.max_retries} retries", "last_error": error}))
                    break
                self.retried_items += len(retry)
                self._sleep(self._backoff(attempt))
                attempt += 1
            pending = retry
        return [outcomes[str(a["_id"])] for a in actions]

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
