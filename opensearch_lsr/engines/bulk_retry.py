"""The retry rounds of a bulk write and the writer around them, shared by OpenSearch and Elasticsearch.

Each engine's writer sends one round with its client's ``helpers.streaming_bulk`` (chunking, and the
helper's own retries) and sorts the answers; what is left to retry goes into another round here.
The rounds are tenacity's (``max_retries`` extra rounds, exponential backoff with jitter, a
wall-clock budget), with the guarantees the index job relies on:

* every action gets exactly one :class:`~opensearch_lsr.engines.base.BulkOutcome`, in order; an item
  still failing with a retryable status when the rounds run out is an outcome (dead letter), not a loss;
* a whole request that keeps failing (cluster down, 5xx on ``_bulk``) raises :class:`BulkWriteError`
  without outcomes for the unsent actions, so the job stops on its last checkpoint and can resume;
* a ``write`` never retries for longer than ``max_elapsed_s`` (checked between rounds): then
  :class:`BulkWriteError` too.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import LsrError
from .base import BulkOutcome

__all__ = ["with_cause", "BulkWriteError", "RequestFailed", "BulkRetry", "SendRound", "RetryingBulkWriter", "ClusterDocumentWriter",
           "is_retryable_status", "int_status"]

logger = logging.getLogger(__name__)


class BulkWriteError(LsrError, RuntimeError):
    """The cluster kept refusing whole requests (unreachable, overloaded) after all retries."""


class RequestFailed(LsrError, RuntimeError):
    """Raised by a round when the whole ``_bulk`` request failed (not a document problem).

    Args:
        error: the client's exception.
        retryable: whether another round may help (connection errors, 5xx).
        message: how messages show it (default ``str(error)``).
    """

    def __init__(self, error: BaseException, retryable: bool, message: str | None = None) -> None:
        self.message = message or str(error)
        super().__init__(self.message)
        self.error = error
        self.retryable = retryable


def with_cause(error: Any) -> Any:
    """A bulk item error whose ``reason`` also carries its ``caused_by`` chain.

    OpenSearch answers a document its mapper refuses with ``mapper_parsing_exception`` "failed to parse"
    and puts the useful part in ``caused_by`` (e.g. "featureValue must be a positive normal float ..." for a
    zero ``rank_features`` weight; ``DocumentParser`` wraps what ``RankFeaturesFieldMapper.parse`` throws,
    observed on OpenSearch 3.6.0), so the dead-letter reason joins them: "failed to parse: featureValue ...".
    """
    if not isinstance(error, dict):
        return error
    reasons, node = [], error
    while isinstance(node, dict) and len(reasons) < 4:
        reason = node.get("reason")
        if reason and not any(str(reason) in r for r in reasons):
            reasons.append(str(reason))
        node = node.get("caused_by")
    return {**error, "reason": ": ".join(reasons)} if len(reasons) > 1 else error


def int_status(status: Any) -> int:
    """An item's HTTP status as an int (0 when the client gave none, e.g. ``"N/A"``)."""
    try:
        return int(status)
    except (TypeError, ValueError):
        return 0


def is_retryable_status(status: int | str | None) -> bool:
    """429 (too many requests / rejected execution) and 5xx are worth retrying."""
    try:
        code = int(status)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True  # "N/A": connection-level failure
    return code == 429 or 500 <= code < 600


#: One round: ``send(pending, outcomes, last_status)`` records final outcomes in ``outcomes`` and the
#: last retryable status/error of each item it returns in ``last_status``; returns the actions to send
#: again; raises :class:`RequestFailed` when the whole request failed.
SendRound = Callable[[list[dict], dict[str, BulkOutcome], dict[str, tuple[int, Any]]], list[dict]]


class _Again(LsrError, RuntimeError):
    """Internal: this round left ``pending`` actions to retry (``request``: after a failed request)."""

    def __init__(self, pending: list[dict], request: RequestFailed | None = None) -> None:
        super().__init__(request.message if request else f"{len(pending)} item(s) to retry")
        self.pending = pending
        self.request = request


@dataclass
class BulkRetry:
    """Retry rounds of one writer (its settings and counters).

    Args:
        index: the target index (for messages).
        max_retries: extra rounds after the first.
        initial_backoff / max_backoff: seconds; the wait doubles per round, times a jitter in [0.5, 1].
        max_elapsed_s: wall-clock budget of one :meth:`run`.
        sleep: the wait function (tests pass a recorder).
    """

    index: str
    max_retries: int = 8
    initial_backoff: float = 1.0
    max_backoff: float = 60.0
    max_elapsed_s: float = 600.0
    sleep: Callable[[float], None] = time.sleep
    retried_items: int = field(default=0, init=False)
    retried_requests: int = field(default=0, init=False)
    # run() keeps its state local; only the counters are shared when several chunks are written at once
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def backoff(self, attempt: int) -> float:
        """Wait before round ``attempt + 1`` (``attempt`` 0-based)."""
        return min(self.max_backoff, self.initial_backoff * (2 ** attempt)) * (0.5 + random.random() / 2)

    def run(self, actions: Sequence[dict], send: SendRound) -> list[BulkOutcome]:
        """Send ``actions`` (each with ``_id``) in rounds; one outcome per action, same order.

        Raises:
            BulkWriteError: a whole request still failing after the last round, a request failure that
                retrying cannot fix, or items still pending when ``max_elapsed_s`` has passed.
        """
        from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay

        outcomes: dict[str, BulkOutcome] = {}
        last_status: dict[str, tuple[int, Any]] = {}
        state = {"pending": list(actions)}

        def one_round() -> None:
            try:
                retry = send(state["pending"], outcomes, last_status)
            except RequestFailed as failed:
                if not failed.retryable:
                    raise BulkWriteError(f"bulk request to index {self.index!r} failed: {failed.message}") from failed.error
                state["pending"] = [a for a in state["pending"] if str(a["_id"]) not in outcomes]
                raise _Again(state["pending"], failed) from failed.error
            state["pending"] = retry
            if retry:
                raise _Again(retry)

        def before_sleep(retry_state) -> None:
            again = retry_state.outcome.exception()
            with self._lock:
                if again.request is not None:
                    self.retried_requests += 1
                else:
                    self.retried_items += len(again.pending)
            if again.request is not None:
                logger.warning("bulk request to %s failed (%s); retrying with backoff", self.index, again.request.message)

        retrying = Retrying(retry=retry_if_exception_type(_Again),
                            stop=stop_after_attempt(self.max_retries + 1) | stop_after_delay(self.max_elapsed_s),
                            wait=lambda retry_state: self.backoff(retry_state.attempt_number - 1),
                            sleep=self.sleep, before_sleep=before_sleep)
        try:
            retrying(one_round)
        except RetryError as stopped:
            again = stopped.last_attempt.exception()
            assert isinstance(again, _Again)
            if again.request is not None:
                raise BulkWriteError(f"bulk request to index {self.index!r} failed: {again.request.message}") \
                    from again.request.error
            if stopped.last_attempt.attempt_number <= self.max_retries:  # stopped by the time budget
                raise BulkWriteError(f"bulk write to index {self.index!r} still failing for {len(again.pending)} "
                                     f"document(s) after {self.max_elapsed_s:.0f}s of retries; resume the job "
                                     "later") from None
            for action in again.pending:
                did = str(action["_id"])
                status, error = last_status.get(did, (0, None))
                outcomes.setdefault(did, BulkOutcome(did, False, status, {
                    "reason": f"still failing after {self.max_retries} retries", "last_error": error}))
        return [outcomes[str(a["_id"])] for a in actions]


class RetryingBulkWriter(ABC):
    """A cluster's bulk writer: one target index, :class:`BulkRetry` rounds, per-item outcomes.

    Subclasses send one round with their client's ``streaming_bulk`` (:meth:`_send_round`).

    Args:
        client: the engine's client.
        index: the target index; OpenSearch and Elasticsearch refuse names that are not lowercase or
            start with ``_``, ``-`` or ``+`` (``MetadataCreateIndexService.validateIndexOrAliasName``).
        chunk_size / max_chunk_bytes: request size limits (``streaming_bulk``).
        max_retries / initial_backoff / max_backoff / max_elapsed_s / sleep: see :class:`BulkRetry`.
        refresh: ``refresh`` parameter of ``_bulk`` (``False`` for throughput; the job refreshes once at the end).
        pipeline: ``pipeline`` parameter of ``_bulk``; ``"_none"`` (default) skips the index's default
            ingest pipeline (precomputed vectors must not be re-encoded), ``None`` lets it run.
    """

    def __init__(self, client, index: str, *, chunk_size: int = 500, max_chunk_bytes: int = 10 * 1024 * 1024,
                 max_retries: int = 8, initial_backoff: float = 1.0, max_backoff: float = 60.0,
                 refresh: bool | str = False, sleep: Callable[[float], None] = time.sleep,
                 pipeline: str | None = "_none", max_elapsed_s: float = 600.0) -> None:
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

    def write(self, actions: Sequence[dict]) -> list[BulkOutcome]:
        """Send ``actions`` (``{"_id", "_source"}`` dicts) to the index; one outcome per action, same order.

        Raises:
            BulkWriteError: see :meth:`BulkRetry.run`.
        """
        pending = [dict(a, _index=a.get("_index", self.index), _op_type=a.get("_op_type", "index")) for a in actions]
        return self.retry.run(pending, self._send_round)

    @staticmethod
    def sort_answers(answers, pending: list[dict], outcomes: dict[str, BulkOutcome],
                     last_status: dict[str, tuple[int, Any]], throttling_is_final: bool = False
                     ) -> tuple[list[dict], list[str]]:
        """Sort ``streaming_bulk``'s ``(ok, {op: info})`` answers for one round.

        Successes and errors retrying cannot fix (4xx) become outcomes; items with a retryable status go
        back for another round (their status kept in ``last_status``); with ``throttling_is_final`` an
        item still answered 429 (the helper has already retried it) is listed apart instead.

        Returns:
            ``(actions to retry, ids still throttled)``.

        Raises:
            the client's exception when the whole request failed (the helper marks every action of the
            chunk with it: not a document problem, so never a dead letter).
        """
        by_id = {str(a["_id"]): a for a in pending}
        retry: list[dict] = []
        throttled: list[str] = []
        request_error = None
        seen = 0
        for ok, item in answers:
            seen += 1
            _op, info = next(iter(item.items()))
            did = str(info.get("_id"))
            status = info.get("status", 0)
            if ok:
                outcomes[did] = BulkOutcome(did, True, int(status))
            elif "exception" in info:
                request_error = info["exception"]
            elif throttling_is_final and int_status(status) == 429:
                throttled.append(did)
            elif is_retryable_status(status) and did in by_id:
                last_status[did] = (int_status(status), with_cause(info.get("error") or info))
                retry.append(by_id[did])
            else:
                outcomes[did] = BulkOutcome(did, False, int_status(status), with_cause(info.get("error") or info))
        if request_error is not None:
            raise request_error
        if seen < len(pending):  # pragma: no cover - defensive: the helper yields one per action
            raise BulkWriteError(f"bulk response covered {seen} of {len(pending)} actions")
        return retry, throttled

    @abstractmethod
    def _send_round(self, pending: list[dict], outcomes: dict[str, BulkOutcome],
                    last_status: dict[str, tuple[int, Any]]) -> list[dict]:
        """One ``streaming_bulk`` pass (see :data:`SendRound`)."""

    def refresh_index(self) -> None:
        self.client.indices.refresh(index=self.index)

    def count(self) -> int:
        return int(self.client.count(index=self.index)["count"])


class ClusterDocumentWriter:
    """The index job's ``DocumentWriter`` over a cluster's bulk writer (ids are deterministic and
    re-indexing overwrites, so a checkpoint needs no writer state). ``write`` may be called from several
    threads at once (``concurrent_writes``): each call is its own ``_bulk`` requests and retry rounds, and
    the client's connection pool is thread-safe."""

    concurrent_writes = True

    def __init__(self, bulk_writer: RetryingBulkWriter) -> None:
        self.bulk = bulk_writer

    def write(self, actions: Sequence[dict]) -> list[BulkOutcome]:
        return self.bulk.write(actions)

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
