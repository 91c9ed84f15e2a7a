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
from typing import Any

from ..engines.base import BulkOutcome
from ..engines.bulk_retry import (BulkWriteError, ClusterDocumentWriter, RequestFailed, RetryingBulkWriter, int_status,
                                  is_retryable_status)
from ..errors import LsrError

__all__ = ["BulkOutcome", "BulkWriteError", "BulkTargetError", "OpenSearchBulkWriter", "OpenSearchWriter",
           "is_retryable_status"]

logger = logging.getLogger(__name__)


class BulkTargetError(LsrError, ValueError):
    """The target index is missing or its field is not mapped for these documents (one sentence)."""


class OpenSearchBulkWriter(RetryingBulkWriter):
    """Writes lists of bulk actions to one index and reports per-item outcomes (arguments:
    :class:`~opensearch_lsr.engines.bulk_retry.RetryingBulkWriter`; ``max_retries`` also bounds
    ``streaming_bulk``'s own 429 retries)."""

    def _send_round(self, pending: list[dict], outcomes: dict[str, BulkOutcome],
                    last_status: dict[str, tuple[int, Any]]) -> list[dict]:
        """One ``streaming_bulk`` pass (see :data:`~opensearch_lsr.engines.bulk_retry.SendRound`)."""
        from opensearchpy import TransportError
        from opensearchpy.exceptions import ConnectionError as OSConnectionError
        from opensearchpy.helpers import streaming_bulk

        params: dict[str, Any] = {"refresh": self.refresh}
        if self.pipeline is not None:
            params["pipeline"] = self.pipeline
        try:
            retry, throttled = self.sort_answers(
                streaming_bulk(self.client, pending, chunk_size=self.chunk_size, max_chunk_bytes=self.max_chunk_bytes,
                               raise_on_error=False, raise_on_exception=False, max_retries=self.retry.max_retries,
                               initial_backoff=self.retry.initial_backoff, max_backoff=self.retry.max_backoff,
                               yield_ok=True, **params),
                pending, outcomes, last_status, throttling_is_final=True)  # the helper retried 429s itself
        except (TransportError, OSConnectionError) as err:
            status = getattr(err, "status_code", None)
            # a whole-request 429 was already retried by streaming_bulk: not a second, nested loop
            raise RequestFailed(err, is_retryable_status(status) and int_status(status) != 429) from err
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


class OpenSearchWriter(ClusterDocumentWriter):
    """The index job's ``DocumentWriter`` over an :class:`OpenSearchBulkWriter`."""
