"""Bulk-load documents into OpenSearch: backpressure, retries with backoff, per-item outcomes.

Built on ``opensearchpy.helpers.streaming_bulk`` (chunking by count and bytes, retry of items
rejected with 429 and exponential backoff). What it adds, because the helper does not:

* items that fail with a 5xx status (shard failures, node restarts) are retried with the same
  backoff (the helper only retries 429);
* a whole request that fails (connection error, 429/5xx on ``_bulk`` itself after the transport's
  own retries) is retried with backoff up to ``max_retries`` and then raised as
  :class:`BulkWriteError`, so the job stops with a checkpoint and can be resumed;
* every action gets an outcome ``(doc_id, ok, status, error)``; errors that retrying cannot fix
  (4xx: mapping errors, bad values) go back to the caller for the dead-letter file.
"""
from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence

from ..engines.base import BulkOutcome
from ..errors import LsrError

__all__ = ["BulkOutcome", "BulkWriteError", "OpenSearchBulkWriter", "is_retryable_status"]

logger = logging.getLogger(__name__)


class BulkWriteError(LsrError, RuntimeError):
    """The cluster kept refusing whole requests (unreachable, overloaded) after all retries."""


def is_retryable_status(status: int | str | None) -> bool:
    """429 (too many requests / rejected execution) and 5xx are worth retrying."""
    try:
        code = int(status)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True  # "N/A": connection-level failure
    return code == 429 or 500 <= code < 600


class OpenSearchBulkWriter:
    """Writes lists of bulk actions to one index and reports per-item outcomes.

    Args:
        client: an ``opensearchpy.OpenSearch`` client (``opensearch.client.client_from_options``).
        index: the target index name.
        chunk_size / max_chunk_bytes: request size limits (``streaming_bulk``).
        max_retries: retries for 429/5xx items and failed requests.
        initial_backoff / max_backoff: seconds; the wait doubles per attempt (with jitter).
        refresh: ``refresh`` parameter of ``_bulk`` (``False`` for throughput; the job refreshes
            once at the end).
    """

    def __init__(self, client, index: str, *, chunk_size: int = 500, max_chunk_bytes: int = 10 * 1024 * 1024,
                 max_retries: int = 8, initial_backoff: float = 1.0, max_backoff: float = 60.0,
                 refresh: bool | str = False, sleep=time.sleep) -> None:
        if not index or index.startswith(("_", "-", "+")) or index != index.lower():
            raise ValueError(f"invalid index name {index!r}: lowercase, not starting with _, - or +")
        if chunk_size < 1 or max_retries < 0:
            raise ValueError("chunk_size must be >= 1 and max_retries >= 0")
        self.client = client
        self.index = index
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
        base = min(self.max_backoff, self.initial_backoff * (2 ** attempt))
        return base * (0.5 + random.random() / 2)

    def _action(self, action: dict) -> dict:
        out = dict(action)
        out.setdefault("_index", self.index)
        out.setdefault("_op_type", "index")
        return out

    def write(self, actions: Sequence[dict]) -> list[BulkOutcome]:
        """Send ``actions`` (``{"_id", "_source"}`` dicts); one outcome per action, same order.

        Raises:
            BulkWriteError: whole requests still failing after ``max_retries`` attempts.
        """
        from opensearchpy import TransportError
        from opensearchpy.exceptions import ConnectionError as OSConnectionError
        from opensearchpy.helpers import streaming_bulk

        pending = [self._action(a) for a in actions]
        outcomes: dict[str, BulkOutcome] = {}
        last_status: dict[str, tuple[int, object]] = {}
        attempt = 0
        while pending:
            retry: list[dict] = []
            try:
                results = streaming_bulk(
                    self.client, pending, chunk_size=self.chunk_size, max_chunk_bytes=self.max_chunk_bytes,
                    raise_on_error=False, raise_on_exception=False, max_retries=self.max_retries,
                    initial_backoff=self.initial_backoff, max_backoff=self.max_backoff, yield_ok=True,
                    refresh=self.refresh,
                )
                by_id = {str(a["_id"]): a for a in pending}
                seen = 0
                request_error = None
                for ok, item in results:
                    seen += 1
                    op, info = next(iter(item.items()))
                    did = str(info.get("_id"))
                    status = info.get("status", 0)
                    if ok:
                        outcomes[did] = BulkOutcome(did, True, int(status))
                    elif "exception" in info:
                        # The whole _bulk request failed (streaming_bulk marks every action of the chunk
                        # with the exception): not a document problem, so never a dead letter.
                        request_error = info["exception"]
                        retry.append(by_id[did])
                    elif is_retryable_status(status) and attempt < self.max_retries and did in by_id:
                        last_status[did] = (_int_status(status), info.get("error") or info)
                        retry.append(by_id[did])
                    else:
                        outcomes[did] = BulkOutcome(did, False, _int_status(status), info.get("error") or info)
                if request_error is not None:
                    raise request_error
                if seen < len(pending):  # pragma: no cover - defensive: the helper yields one per action
                    raise BulkWriteError(f"bulk response covered {seen} of {len(pending)} actions")
            except (TransportError, OSConnectionError) as err:
                status = getattr(err, "status_code", None)
                if not is_retryable_status(status) or attempt >= self.max_retries:
                    raise BulkWriteError(f"bulk request to index {self.index!r} failed: {err}") from err
                self.retried_requests += 1
                logger.warning("bulk request failed (%s); retrying in backoff", err)
                retry = [a for a in pending if str(a["_id"]) not in outcomes]
            if retry:
                if attempt >= self.max_retries:
                    for a in retry:
                        did = str(a["_id"])
                        status, error = last_status.get(did, (0, None))
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


def _int_status(status) -> int:
    try:
        return int(status)
    except (TypeError, ValueError):
        return 0
