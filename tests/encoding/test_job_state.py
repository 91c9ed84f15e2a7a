"""The job's durable state: report files."""
from __future__ import annotations

import os

from opensearch_lsr.encoding import job_state
from opensearch_lsr.encoding.job_state import ReportFile


def test_a_report_is_fsynced_when_something_was_added_since_its_last_sync_only(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(job_state.os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    path = tmp_path / "skipped.jsonl"
    report = ReportFile(path, None)
    assert report.sync() == 0 and len(synced) == 1  # a new (or truncated) file is made durable once
    assert report.sync() == 0 and len(synced) == 1  # nothing added: nothing to make durable
    report.add({"reason": "duplicate_id", "_id": "a"})
    size = report.sync()
    assert size == path.stat().st_size > 0 and len(synced) == 2
    assert report.sync() == size and len(synced) == 2
    report.add({"reason": "empty_text", "_id": "b"})
    report.close()
    assert len(synced) == 3 and path.read_text().count("\n") == 2
    reopened = ReportFile(path, size)  # resumed at the checkpoint: truncated back, then made durable
    assert reopened.sync() == size and len(synced) == 4
    reopened.close()
