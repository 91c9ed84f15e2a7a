"""The index job against a cluster that stays down: it stops with a checkpoint (no dead letters), --resume finishes."""
from __future__ import annotations

import pytest

from opensearch_lsr.opensearch.bulk import BulkTargetError, BulkWriteError, OpenSearchBulkWriter


def test_cluster_down_stops_the_job_resumably(tmp_path, fake_bulk, tiny_source_dir):
    """A cluster that keeps refusing whole requests stops the job (no dead letters); --resume finishes."""
    import json

    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
    from opensearch_lsr.encoding.job import IndexJobConfig, run_index_job
    from opensearch_lsr.opensearch.bulk import OpenSearchWriter
    from opensearch_lsr.opensearch.client import make_client

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"house cat {i}"}) + "\n" for i in range(12)))
    target = fake_bulk()
    client = make_client(target.url, max_retries=0)
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="opensearch", index="idx",
                         work_dir=str(tmp_path / "w"), chunk_docs=4, bulk_concurrency=1)  # one request at a time
    enc = SparseDocumentEncoder(tiny_source_dir, device="cpu", batch_size=4)

    class GoesDown(OpenSearchWriter):
        calls = 0

        def write(self, actions):
            GoesDown.calls += 1
            if GoesDown.calls == 2:
                target.request_failures = [503] * 5
            return super().write(actions)

    down = GoesDown(OpenSearchBulkWriter(client, "idx", max_retries=2, sleep=lambda s: None))
    with pytest.raises(BulkWriteError):
        run_index_job(cfg, encoder=enc, writer=down, progress=False)
    assert len(target.docs) == 4 and not (tmp_path / "w" / "dead_letter.jsonl").read_text()
    target.request_failures = []
    healthy = OpenSearchWriter(OpenSearchBulkWriter(client, "idx", sleep=lambda s: None))
    summary = run_index_job(cfg, encoder=enc, writer=healthy, resume=True, progress=False)
    assert summary["indexed"] == 12 and summary["dead_lettered"] == 0 and len(target.docs) == 12
    assert summary["resumed_from_position"] == 4


def test_an_unreachable_cluster_fails_before_the_encoder_warms_up(tmp_path, tiny_source_dir, monkeypatch):
    """The warm-up compiles on CUDA (a minute): a wrong --url or a down cluster is said before it, not after."""
    import json

    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
    from opensearch_lsr.encoding.job import IndexJobConfig, run_index_job
    from opensearch_lsr.opensearch.client import make_client

    warmed, closed = [], []
    monkeypatch.setattr(SparseDocumentEncoder, "warm_up", lambda self, *a, **k: warmed.append(1) or 0.0)
    monkeypatch.setattr(SparseDocumentEncoder, "close", lambda self: closed.append(1))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"_id": "d0", "text": "house cat"}) + "\n")
    cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="opensearch", index="idx",
                         work_dir=str(tmp_path / "w"))
    with pytest.raises(BulkTargetError, match="cannot reach the cluster"):
        run_index_job(cfg, client_factory=lambda: make_client("http://127.0.0.1:1", max_retries=0), progress=False)
    assert warmed == [] and closed == [1]
