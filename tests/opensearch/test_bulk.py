"""OpenSearchBulkWriter against the fake ``_bulk`` target: retries on 429/5xx, dead letters on 4xx."""
from __future__ import annotations

import pytest

from opensearch_lsr.opensearch.bulk import BulkWriteError, OpenSearchBulkWriter, is_retryable_status


def _actions(n):
    return [{"_id": f"d{i}", "_source": {"text": f"doc {i}", "sparse_embedding": {"a": 1.0}}} for i in range(n)]


def _writer(target, **kw):
    from opensearch_lsr.opensearch.client import make_client

    sleeps = []
    w = OpenSearchBulkWriter(make_client(target.url, max_retries=0), "idx", sleep=sleeps.append, **kw)
    return w, sleeps


def test_item_429_and_503_are_retried_with_backoff_4xx_dead_lettered(fake_bulk):
    target = fake_bulk(fail_ids={"d3"}, flaky_ids={"d1"}, unavailable_ids={"d5", "d6"})
    w, sleeps = _writer(target, initial_backoff=0.5, max_backoff=0.5)
    out = w.write(_actions(8))
    assert [o.doc_id for o in out] == [f"d{i}" for i in range(8)]  # one outcome per action, same order
    assert [o.ok for o in out] == [True, True, True, False, True, True, True, True]
    assert out[3].status == 400 and "injected failure" in out[3].error["reason"]
    assert set(target.docs) == {f"d{i}" for i in range(8)} - {"d3"} and target.writes["d5"] == 1
    # the 429 is retried inside streaming_bulk (its own backoff); the 503s by our writer, after one sleep
    assert target.writes["d1"] == 1 and w.retried_items == 2 and len(sleeps) == 1 and 0.25 <= sleeps[0] <= 0.5


def test_whole_request_failures_are_retried_then_raised(fake_bulk):
    target = fake_bulk(request_failures=[500, 503])  # (a whole-request 429 streaming_bulk retries itself)
    w, sleeps = _writer(target, initial_backoff=1.0)
    out = w.write(_actions(3))
    assert all(o.ok for o in out) and len(target.docs) == 3
    assert len(sleeps) == 2 and sleeps[1] >= sleeps[0] * 0.5  # exponential backoff with jitter
    down = fake_bulk(request_failures=[503] * 10)
    w, _ = _writer(down, max_retries=2)
    with pytest.raises(BulkWriteError, match="failed"):
        w.write(_actions(2))


def test_retry_exhaustion_is_an_outcome_not_a_loss(fake_bulk):
    target = fake_bulk(unavailable_ids={"d0"})
    w, _ = _writer(target, max_retries=0)
    out = w.write(_actions(2))
    assert not out[0].ok and out[0].status == 503 and out[1].ok


@pytest.mark.parametrize("status,retry", [(429, True), (500, True), (503, True), (400, False), (409, False),
                                          ("N/A", True), (None, True)])
def test_retryable_statuses(status, retry):
    assert is_retryable_status(status) is retry
