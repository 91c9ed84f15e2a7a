"""The shared retry rounds of the bulk writers: nothing lost, dead letters on exhaustion, bounded time."""
from __future__ import annotations

import pytest

from opensearch_lsr.engines.base import BulkOutcome
from opensearch_lsr.engines.bulk_retry import BulkRetry, BulkWriteError, RequestFailed

ACTIONS = [{"_id": f"d{i}"} for i in range(4)]


def _sender(script):
    """``send`` following ``script``: per round, ``"down"`` (request fails, retryable), ``"bad"`` (request
    fails, not retryable) or a set of ids answering 503 (the others succeed)."""
    rounds = []

    def send(pending, outcomes, last_status):
        step = script[min(len(rounds), len(script) - 1)]
        rounds.append([a["_id"] for a in pending])
        if step in ("down", "bad"):
            raise RequestFailed(ConnectionError("refused"), retryable=step == "down")
        retry = []
        for a in pending:
            if a["_id"] in step:
                last_status[a["_id"]] = (503, {"type": "unavailable"})
                retry.append(a)
            else:
                outcomes[a["_id"]] = BulkOutcome(a["_id"], True, 201)
        return retry

    return send, rounds


def test_items_are_retried_until_they_succeed_then_dead_lettered_when_rounds_run_out():
    sleeps = []
    retry = BulkRetry("idx", max_retries=2, initial_backoff=1.0, sleep=sleeps.append)
    send, rounds = _sender([{"d1", "d2"}, {"d2"}])
    out = retry.run(ACTIONS, send)
    assert [o.doc_id for o in out] == ["d0", "d1", "d2", "d3"]
    assert [o.ok for o in out] == [True, True, False, True]
    assert out[2].status == 503 and out[2].error["last_error"] == {"type": "unavailable"}
    assert rounds == [["d0", "d1", "d2", "d3"], ["d1", "d2"], ["d2"]]
    assert retry.retried_items == 3 and retry.retried_requests == 0
    assert len(sleeps) == 2 and 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0


def test_a_failing_request_is_retried_then_raised_without_outcomes():
    retry = BulkRetry("idx", max_retries=2, sleep=lambda s: None)
    send, rounds = _sender(["down", set()])
    assert all(o.ok for o in retry.run(ACTIONS, send)) and retry.retried_requests == 1
    send, rounds = _sender(["down"])
    with pytest.raises(BulkWriteError, match="refused"):
        retry.run(ACTIONS, send)
    assert len(rounds) == 3
    send, rounds = _sender(["bad"])
    with pytest.raises(BulkWriteError, match="refused"):
        retry.run(ACTIONS, send)
    assert len(rounds) == 1  # not retryable: no second round


def test_the_time_budget_stops_the_rounds():
    send, rounds = _sender([{"d0"}])
    retry = BulkRetry("idx", max_retries=50, max_elapsed_s=0.0, sleep=lambda s: None)
    with pytest.raises(BulkWriteError, match="still failing for 1 document"):
        retry.run(ACTIONS, send)
    assert len(rounds) == 1
