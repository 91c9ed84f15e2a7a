"""``benchmarks/index_host_path.py``: the job's host path with vectors ready, by workers and checkpoint interval."""
from __future__ import annotations

import json
import os


def test_rows_by_checkpoint_interval_on_a_slower_disk_write_the_same_bytes(tmp_path, load_script, splade_tiny_dir):
    module = load_script("index_host_path")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"seoul river number {i}"}) + "\n"
                              for i in range(40)), encoding="utf-8")
    md = tmp_path / "host.md"
    payload = module.main(["--corpus", str(corpus), "--model", str(splade_tiny_dir), "--repeat", "2", "--workers", "0",
                           "--checkpoint-intervals", "0", "1", "--fsync-ms", "0", "20", "--md", str(md)])
    runs = payload["runs"]
    assert set(runs) == {f"fsync+{f}ms/interval={i}/workers=0" for f in (0.0, 20.0) for i in (0.0, 1.0)}
    assert all(r["same_bytes_as_no_workers"] and r["indexed"] == 80 for r in runs.values())
    # one chunk: its checkpoint fsyncs the NDJSON part, 20 ms slower on the slower disk
    assert runs["fsync+20.0ms/interval=0.0/workers=0"]["checkpoint_s"] >= 0.02
    assert os.fsync.__module__ in ("os", "posix", "nt")  # the real fsync is back
    assert "checkpoint_interval_s" in md.read_text()
