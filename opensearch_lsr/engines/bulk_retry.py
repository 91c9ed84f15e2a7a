"""The retry rounds of a bulk write, shared by the OpenSearch and Elasticsearch writers.

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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import LsrError
from .base import BulkOutcome

__all__ = ["BulkWriteError", "RequestFailed", "BulkRetry", "SendRound", "is_retryable_status", "int_status"]

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
            if again.request is not None:
                self.retried_requests += 1
                logger.warning("bulk request to %s failed (%s); retrying with backoff", self.index, again.request.message)
            else:
                self.retried_items += len(again.pending)

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
