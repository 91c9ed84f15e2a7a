"""Bulk-load documents into OpenSearch: backpressure, retries with backoff, per-item outcomes.

Built on ``opensearchpy.helpers.streaming_bulk`` (chunking by count and bytes, retry of items
rejected with 429 and exponential backoff). What it adds, because the helper does not:

* items that fail with a 5xx status (shard failures, node restarts) are retried with the same
  backoff (the helper only retries 429);
* a whole request that fails (connection error, 5xx on ``_bulk`` itself after the transport's
  own retries) is retried with backoff up to ``max_retries`` and then raised as
  :class:`BulkWriteError`, so the job stops with a checkpoint and can be resumed (the rounds are
  :class:`~opensearch_lsr.engines.bulk_retry.BulkRetry`'s, shared with Elasticsearch: tenacity);
* 429 is retried by the helper alone (items and whole requests): what is still rejected after its
  ``max_retries`` stops the job (:class:`BulkWriteError`) instead of entering a second, nested retry
  loop (the two loops multiplied could hold one document for over an hour); every ``write`` also
  has a wall-clock budget ``max_elapsed_s`` checked between attempts;
* every action gets an outcome ``(doc_id, ok, status, error)``; errors that retrying cannot fix
  (4xx: mapping errors, bad values) go back to the caller for the dead-letter file;
* vectors are computed by the client, so ``_bulk`` goes with ``pipeline=_none``: an index's
  ``default_pipeline`` (a ``sparse_encoding`` processor) would otherwise re-encode the text and
  overwrite them (OpenSearch ``IngestService``: ``_none`` is the no-op pipeline and a request
  pipeline replaces ``index.default_pipeline``);
* :meth:`OpenSearchBulkWriter.check_target` refuses, before anything is sent, an index that does
  not exist (it would be auto-created with dynamic mappings: one float sub-field per token) or
  whose target field is not mapped for the documents' shape.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from ..engines.base import BulkOutcome
from ..engines.bulk_retry import BulkRetry, BulkWriteError, RequestFailed, int_status, is_retryable_status
from ..errors import LsrError

__all__ = ["BulkOutcome", "BulkWriteError", "BulkTargetError", "OpenSearchBulkWriter", "is_retryable_status"]

logger = logging.getLogger(__name__)


class BulkTargetError(LsrError, ValueError):
    """The target index is missing or its field is not mapped for these documents (one sentence)."""


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
        pipeline: ``pipeline`` parameter of ``_bulk``; ``"_none"`` (default) skips the index's default
            ingest pipeline, ``None`` lets it run (text-only documents encoded by the cluster).
        max_elapsed_s: wall-clock budget of one :meth:`write`, checked between retry rounds.
    """

    def __init__(self, client, index: str, *, chunk_size: int = 500, max_chunk_bytes: int = 10 * 1024 * 1024,
                 max_retries: int = 8, initial_backoff: float = 1.0, max_backoff: float = 60.0,
                 refresh: bool | str = False, sleep=time.sleep, pipeline: str | None = "_none",
                 max_elapsed_s: float = 600.0) -> None:
        if not index or index.startswith(("_", "-", "+")) or index != index.lower():
            raise ValueError(f"invalid index name {index!r}: lowercase, not starting with _, - or +")
        if chunk_size < 1 or max_retries < 0:
            raise ValueError("chunk_size must be >= 1 and max_retries >= 0")
        self.client = client
        self.index = index
        self.chunk_size = chunk_size
        self.max_chunk_bytes = max_chunk_bytes
        self.refresh = refresh
        self.pipeline = pipeline
        self.retry = BulkRetry(index, max_retries=max_retries, initial_backoff=initial_backoff,
                               max_backoff=max_backoff, max_elapsed_s=float(max_elapsed_s), sleep=sleep)

    @property
    def retried_items(self) -> int:
        return self.retry.retried_items

    @property
    def retried_requests(self) -> int:
        return self.retry.retried_requests

    def _action(self, action: dict) -> dict:
        out = dict(action)
        out.setdefault("_index", self.index)
        out.setdefault("_op_type", "index")
        return out

    def write(self, actions: Sequence[dict]) -> list[BulkOutcome]:
        """Send ``actions`` (``{"_id", "_source"}`` dicts); one outcome per action, same order.

        Raises:
            BulkWriteError: whole requests still failing after ``max_retries`` attempts, or items still
                rejected with 429 after ``streaming_bulk``'s own retries.
        """
        return self.retry.run([self._action(a) for a in actions], self._send_round)

    def _send_round(self, pending: list[dict], outcomes: dict[str, BulkOutcome],
                    last_status: dict[str, tuple[int, Any]]) -> list[dict]:
        """One ``streaming_bulk`` pass (see :data:`~opensearch_lsr.engines.bulk_retry.SendRound`)."""
        from opensearchpy import TransportError
        from opensearchpy.exceptions import ConnectionError as OSConnectionError
        from opensearchpy.helpers import streaming_bulk

        params: dict[str, Any] = {"refresh": self.refresh}
        if self.pipeline is not None:
            params["pipeline"] = self.pipeline
        retry: list[dict] = []
        throttled: list[str] = []
        by_id = {str(a["_id"]): a for a in pending}
        try:
            seen = 0
            request_error = None
            for ok, item in streaming_bulk(
                    self.client, pending, chunk_size=self.chunk_size, max_chunk_bytes=self.max_chunk_bytes,
                    raise_on_error=False, raise_on_exception=False, max_retries=self.retry.max_retries,
                    initial_backoff=self.retry.initial_backoff, max_backoff=self.retry.max_backoff, yield_ok=True,
                    **params):
                seen += 1
                _op, info = next(iter(item.items()))
                did = str(info.get("_id"))
                status = info.get("status", 0)
                if ok:
                    outcomes[did] = BulkOutcome(did, True, int(status))
                elif "exception" in info:
                    # The whole _bulk request failed (streaming_bulk marks every action of the chunk
                    # with the exception): not a document problem, so never a dead letter.
                    request_error = info["exception"]
                elif int_status(status) == 429:
                    throttled.append(did)  # streaming_bulk already retried it max_retries times
                elif is_retryable_status(status) and did in by_id:
                    last_status[did] = (int_status(status), info.get("error") or info)
                    retry.append(by_id[did])
                else:
                    outcomes[did] = BulkOutcome(did, False, int_status(status), info.get("error") or info)
            if request_error is not None:
                raise request_error
        except (TransportError, OSConnectionError) as err:
            status = getattr(err, "status_code", None)
            # a whole-request 429 was already retried by streaming_bulk: not a second, nested loop
            raise RequestFailed(err, is_retryable_status(status) and int_status(status) != 429) from err
        if seen < len(pending):  # pragma: no cover - defensive: the helper yields one per action
            raise BulkWriteError(f"bulk response covered {seen} of {len(pending)} actions")
        if throttled:
            raise BulkWriteError(
                f"the cluster still rejects {len(throttled)} document(s) with HTTP 429 after "
                f"{self.retry.max_retries} retries (e.g. {throttled[0]}): it is overloaded; resume the job later")
        return retry

    def check_target(self, field: str, *, key_format: str = "word", long_text: str = "truncate") -> None:
        """Refuse, before loading, an index that cannot take these documents.

        The index must exist, and ``field`` must be mapped as ``rank_features`` (WORD keys) or
        ``sparse_vector`` (TOKEN_ID keys); for ``long_text="split"`` documents it must be ``nested``
        with a ``sparse_encoding`` sub-field of that type (``lsr-os create-index --long-text split``).

        Raises:
            BulkTargetError: with the create-index command that fixes it.
        """
        from opensearchpy.exceptions import ConnectionError as OSConnectionError
        from opensearchpy.exceptions import NotFoundError, TransportError

        from .client import _connection_reason, _host_of

        want = "sparse_vector" if key_format == "token_id" else "rank_features"
        fix = (f"lsr-os create-index {self.index}" + (" --kind sparse_vector" if want == "sparse_vector" else "")
               + (" --long-text split" if long_text == "split" else "") + f" --vector-field {field}")
        try:
            res = self.client.indices.get_mapping(index=self.index)
        except NotFoundError as err:
            raise BulkTargetError(f"index {self.index} does not exist; create it first ({fix}): a missing index "
                                  f"would be created with dynamic mappings, one float field per token") from err
        except OSConnectionError as err:
            raise BulkTargetError(f"cannot reach the cluster at {_host_of(self.client)}: "
                                  f"{_connection_reason(err)}") from err
        except TransportError as err:
            raise BulkTargetError(f"reading the mapping of {self.index} failed (HTTP {err.status_code})") from err
        entries = [v for v in res.values() if isinstance(v, dict)] if isinstance(res, dict) else []
        props = (entries[0].get("mappings") or {}).get("properties", {}) if entries else {}
        prop = props.get(field) or {}
        if long_text == "split":
            sub = (prop.get("properties") or {}).get("sparse_encoding") or {}
            if prop.get("type") != "nested" or sub.get("type") != want:
                raise BulkTargetError(
                    f"--long-text split writes {field} as nested passages with a {field}.sparse_encoding {want} "
                    f"field, but index {self.index} maps {field} as {prop.get('type', 'nothing')}: recreate it "
                    f"with {fix}, or index with --long-text truncate")
            return
        if prop.get("type") != want:
            raise BulkTargetError(f"index {self.index} maps {field} as {prop.get('type', 'nothing')}, but these "
                                  f"documents need {want} ({key_format} keys): recreate it with {fix}, or pass the "
                                  f"field it has")

    def refresh_index(self) -> None:
        self.client.indices.refresh(index=self.index)

    def count(self) -> int:
        return int(self.client.count(index=self.index)["count"])
