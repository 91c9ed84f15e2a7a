"""Concurrent ``_bulk`` requests in the index job: chunks overlap on the wire, checkpoints stay in chunk order."""
from __future__ import annotations

import json
import threading
import time

import pytest

from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
from opensearch_lsr.encoding.job import IndexJobConfig, IndexJobError, run_index_job
from opensearch_lsr.engines.base import BulkOutcome
from opensearch_lsr.encoding.job_state import Checkpoint


@pytest.fixture(scope="module")
def encoder(tiny_source_dir):
    return SparseDocumentEncoder(tiny_source_dir, device="cpu", batch_size=8)


def _corpus(path, n: int):
    path.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"house cat river {i}"}) + "\n" for i in range(n)))
    return path


class _SlowFirstWriter:
    """A cluster-like writer whose earlier chunks take longer, so chunks finish out of order; it records
    which chunks were acknowledged before each checkpoint and can fail one chunk."""

    concurrent_writes = True

    def __init__(self, fail_chunk: int | None = None) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.done: list[int] = []  # chunk numbers in completion order
        self.docs: dict[str, int] = {}
        self.in_flight = self.max_in_flight = 0
        self.fail_chunk = fail_chunk

    def write(self, actions):
        with self.lock:
            chunk = self.calls
            self.calls += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        time.sleep(0.15 if chunk % 3 == 0 else 0.02)  # every third chunk is slow: later ones overtake it
        with self.lock:
            self.in_flight -= 1
            if chunk == self.fail_chunk:
                raise ConnectionError(f"chunk {chunk}: cluster unreachable")
            for a in actions:
                self.docs[a["_id"]] = self.docs.get(a["_id"], 0) + 1
            self.done.append(chunk)
        return [BulkOutcome(a["_id"], a["_id"] != "d5", 201 if a["_id"] != "d5" else 400,
                            None if a["_id"] != "d5" else {"reason": "injected"}) for a in actions]

    def state(self):
        return {}

    def restore(self, state):
        return None

    def close(self):
        return None


def _record_checkpoints(monkeypatch, writer):
    """Each saved checkpoint's position, with the chunks the writer had completed by then."""
    saved = []
    original = Checkpoint.save

    def save(self, path):
        with writer.lock:
            saved.append((self.position, self.done, sorted(writer.done)))
        return original(self, path)

    monkeypatch.setattr(Checkpoint, "save", save)
    return saved


@pytest.mark.parametrize("interval", [0.0, 1.0])
def test_chunks_overlap_and_checkpoints_stay_in_order(tmp_path, tiny_source_dir, encoder, monkeypatch, interval):
    corpus = _corpus(tmp_path / "c.jsonl", 40)
    writer = _SlowFirstWriter()
    saved = _record_checkpoints(monkeypatch, writer)
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="opensearch", index="idx",
                         work_dir=str(tmp_path / "w"), chunk_docs=4, bulk_concurrency=4, checkpoint_interval_s=interval)
    summary = run_index_job(cfg, encoder=encoder, writer=writer, progress=False)
    assert writer.max_in_flight >= 2  # chunks really were written at once
    assert writer.done != sorted(writer.done)  # and finished out of order
    positions = [p for p, done, _ in saved if not done]
    assert positions == sorted(positions) and set(positions) <= {4 * (k + 1) for k in range(10)}
    if not interval:  # every chunk; with an interval, chunks written while others wait may share one
        assert sorted(set(positions)) == [4 * (k + 1) for k in range(10)]
    for position, _, completed in saved:  # never ahead of a chunk the writer has not finished
        assert set(range(position // 4)) <= set(completed)
    assert summary["indexed"] == 39 and summary["dead_lettered"] == 1
    assert summary["this_run"]["bulk_concurrency"] == 4
    assert all(n == 1 for n in writer.docs.values()) and len(writer.docs) == 40
    dead = [json.loads(line) for line in (tmp_path / "w" / "dead_letter.jsonl").read_text().splitlines()]
    assert [d["_id"] for d in dead] == ["d5"]


def test_a_failed_chunk_stops_the_job_at_the_last_acknowledged_one_and_resume_finishes(
        tmp_path, tiny_source_dir, encoder, monkeypatch):
    corpus = _corpus(tmp_path / "c.jsonl", 40)
    writer = _SlowFirstWriter(fail_chunk=4)  # chunk 4 (docs 16-19) fails while later ones are in flight
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="opensearch", index="idx",
                         work_dir=str(tmp_path / "w"), chunk_docs=4, bulk_concurrency=3, checkpoint_interval_s=0)
    with pytest.raises(ConnectionError, match="chunk 4"):
        run_index_job(cfg, encoder=encoder, writer=writer, progress=False)
    stopped = Checkpoint.load(tmp_path / "w" / "checkpoint.json")
    assert stopped.position == 16 and not stopped.done  # chunks 0-3, not the failed one nor later ones
    healthy = _SlowFirstWriter()
    summary = run_index_job(cfg, encoder=encoder, writer=healthy, resume=True, progress=False)
    assert set(writer.docs) | set(healthy.docs) == {f"d{i}" for i in range(40)}  # nothing lost
    assert {f"d{i}" for i in range(16, 40)} <= set(healthy.docs)  # everything after the checkpoint rewritten
    assert summary["indexed"] == 39 and summary["dead_lettered"] == 1  # d5 once: its chunk was checkpointed


def test_concurrent_requests_reach_the_cluster(tmp_path, tiny_source_dir, encoder, fake_bulk):
    """Through opensearch-py's client to an HTTP ``_bulk`` target: requests overlap, every doc arrives once."""
    from opensearch_lsr.opensearch.client import make_client

    corpus = _corpus(tmp_path / "c.jsonl", 24)
    target = fake_bulk(delay=0.2, flaky_ids={"d9"})
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="opensearch", index="idx",
                         work_dir=str(tmp_path / "w"), chunk_docs=4, bulk_concurrency=3)
    summary = run_index_job(cfg, encoder=encoder, client_factory=lambda: make_client(target.url), progress=False)
    assert target.max_in_flight >= 2
    assert summary["indexed"] == 24 and set(target.docs) == {f"d{i}" for i in range(24)}
    assert target.writes["d9"] == 1  # the 429 retried once, in its own request


def test_bulk_concurrency_is_refused_where_it_cannot_apply(tmp_path):
    with pytest.raises(ValueError, match="cluster backends"):
        IndexJobConfig(corpus="c.jsonl", model="m", backend="ndjson", index=str(tmp_path / "o"), bulk_concurrency=2)
    with pytest.raises(ValueError, match="1-8"):
        IndexJobConfig(corpus="c.jsonl", model="m", backend="opensearch", index="idx", bulk_concurrency=0)
    from opensearch_lsr.encoding.job_config import write_concurrency as _write_concurrency

    class OneAtATime:
        pass

    cfg = IndexJobConfig(corpus="c.jsonl", model="m", backend="opensearch", index="idx", bulk_concurrency=3)
    with pytest.raises(IndexJobError, match="one chunk at a time"):
        _write_concurrency(cfg, OneAtATime())
    assert _write_concurrency(IndexJobConfig(corpus="c", model="m", backend="ndjson", index="o"), OneAtATime()) == 1
