"""One encoder process per device: the pool gives the same vectors and the job the same documents."""
from __future__ import annotations

import json

import numpy as np
import pytest

from opensearch_lsr.encoding.parallel import DevicePool, resolve_devices


def test_resolve_devices_lists_and_cpu_fallback(monkeypatch):
    import torch

    assert resolve_devices("cuda:0,cuda:1") == ["cuda:0", "cuda:1"]
    assert resolve_devices("cpu, cpu") == ["cpu", "cpu"]
    assert resolve_devices("cuda:1") == ["cuda:1"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert resolve_devices(None) == resolve_devices("cuda") == [f"cuda:{i}" for i in range(4)]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_devices(None) == ["cuda"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert resolve_devices(None) == ["cpu"]
    with pytest.raises(ValueError, match="no CUDA"):
        resolve_devices("cuda")


@pytest.mark.slow  # spawns two worker processes (torch import + model load each)
def test_two_worker_pool_matches_single_encoder_and_job(tmp_path, tiny_source_dir, monkeypatch):
    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
    from opensearch_lsr.encoding.job import IndexJobConfig, run_index_job

    texts = [f"house cat dog {i} " * (1 + i % 7) for i in range(40)]
    texts[5] = texts[17] = "river bank " * 400  # over the 512-token cap: truncated, and counted so
    single = SparseDocumentEncoder(tiny_source_dir, device="cpu", batch_size=8)
    want = single.encode(texts)
    with DevicePool(tiny_source_dir, ["cpu", "cpu"], batch_size=8, num_threads=1) as pool:
        futures = [pool.submit(texts[i:i + 10]) for i in range(0, 40, 10)]  # in flight together
        got = [v for f in futures for v in f.result()]
        assert pool.keys == single.keys and pool.count_tokens(texts[:3]) == single.count_tokens(texts[:3])
        # each worker counts what it tokenized: the job reads the counts from the future
        assert [int(n) for f in futures for n in f.tokens.full_lengths] == single.count_tokens(texts)
    for a, b in zip(want, got):
        assert np.array_equal(a.ids, b.ids) and np.allclose(a.weights, b.weights, atol=1e-6)

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts))
                      + "{bad\n", encoding="utf-8")
    docs = {}

    def no_parent_count(self, texts):
        raise AssertionError("the parent tokenized a chunk the workers tokenize")

    monkeypatch.setattr(DevicePool, "count_tokens", no_parent_count)
    for name, device in (("one", "cpu"), ("two", "cpu,cpu")):
        cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="ndjson",
                             index=str(tmp_path / name), chunk_docs=6, batch_size=8, device=device, threads=1)
        summary = run_index_job(cfg, progress=False)
        assert summary["indexed"] == 40 and summary["skipped"] == {"malformed": 1} and summary["truncated"] == 2
        lines = (tmp_path / name / "bulk-00000.ndjson").read_text().splitlines()
        docs[name] = [json.loads(l) for l in lines]
    assert [d.get("index", {}).get("_id") for d in docs["one"]] == [d.get("index", {}).get("_id") for d in docs["two"]]
    for a, b in zip(docs["one"][1::2], docs["two"][1::2]):
        assert a["id"] == b["id"] and a["sparse_embedding"].keys() == b["sparse_embedding"].keys()


def test_encoder_process_on_one_device_writes_the_same_documents(tmp_path, tiny_source_dir):
    """``encoder_process``: the one-device job encodes in a worker process and writes what the in-process job does."""
    from opensearch_lsr.encoding.job import IndexJobConfig, IndexJobError, run_index_job

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"house cat dog {i} " * (1 + i % 5)}) + "\n"
                              for i in range(30)), encoding="utf-8")
    written = {}
    for name, process in (("inline", False), ("process", True)):
        cfg = IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="ndjson",
                             index=str(tmp_path / name), chunk_docs=8, device="cpu", threads=1,
                             encoder_process=process)
        summary = run_index_job(cfg, progress=False)
        assert summary["indexed"] == 30
        written[name] = [json.loads(line) for line in (tmp_path / name / "bulk-00000.ndjson").read_text().splitlines()]
    assert summary["encoder"]["device"] == "cpu"
    for a, b in zip(written["inline"], written["process"]):
        if "index" in a:
            assert a["index"]["_id"] == b["index"]["_id"]
        else:
            assert a["sparse_embedding"].keys() == b["sparse_embedding"].keys()
            assert all(abs(a["sparse_embedding"][k] - b["sparse_embedding"][k]) < 1e-5 for k in a["sparse_embedding"])
    with pytest.raises(IndexJobError, match="--encoder-process runs the torch encoder"):
        run_index_job(IndexJobConfig(corpus=str(corpus), model=str(tiny_source_dir), backend="ndjson",
                                     index=str(tmp_path / "onnx"), encoder_runtime="onnx", encoder_process=True),
                      progress=False)
