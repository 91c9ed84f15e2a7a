"""One encoder process per device: the pool gives the same vectors and the job the same documents."""
from __future__ import annotations

import json

import numpy as np
import pytest

from opensearch_lsr.encoding.parallel import DevicePool, resolve_devices
from opensearch_lsr.errors import LsrError


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
        # what the encoder resolved "auto" to, and (packed batching) its device thread's times, in or out of process
        assert summary["encoder"]["precision"] == "fp32" and summary["encoder"]["batching"] == "packed"
        assert summary["encoder"]["batches"] >= 1 and set(summary["encoder"]["device_thread_s"]) == {
            "launch", "wait", "split", "source", "source_caller", "source_tokenizer"}
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


class _HeldPipeline:
    """A pipeline whose futures resolve only when the test says so; records what was submitted, and when."""

    def __init__(self):
        import threading

        self.submitted, self.futures, self.closed = [], [], False
        self.changed = threading.Condition()

    def submit(self, texts):
        from concurrent.futures import Future

        if texts == ["refuse"]:
            raise ValueError("the pipeline failed earlier")
        future = Future()
        future.tokens = type("Tokens", (), {"full_lengths": np.array([len(t) for t in texts])})()
        with self.changed:
            self.submitted.append(list(texts))
            self.futures.append(future)
            self.changed.notify_all()
        return future

    def wait_submitted(self, n):
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.submitted) >= n, timeout=10)

    def close(self):
        self.closed = True


def test_a_worker_takes_the_next_chunks_while_one_is_encoding_and_answers_in_order():
    """:func:`serve` (a worker's loop): a chunk goes into the pipeline when it arrives, not when the one
    before it is done, so the device has the next chunks queued; answers keep submission order whatever
    order the chunks finish in, carry the token counts and the growth of the non-finite count, and a failed
    chunk fails alone."""
    import queue
    import threading

    from opensearch_lsr.encoding.parallel import serve
    from opensearch_lsr.encoding.sparse_vector import SparseVector

    def vector(ids):
        return SparseVector(np.array(ids, np.int64), np.ones(len(ids), np.float32))

    pipeline, requests, replies = _HeldPipeline(), queue.Queue(), queue.Queue()
    dropped = iter([1, 1, 3])  # when serving starts, then at each answer
    worker = threading.Thread(target=serve, args=(pipeline, requests, lambda *r: replies.put(r), lambda: next(dropped)))
    worker.start()
    for seq, texts in enumerate((["a", "bb"], ["ccc"], ["refuse"], ["dddd"])):
        requests.put((seq, texts))
    pipeline.wait_submitted(3)  # the three pipeline chunks are all in while none has finished
    assert pipeline.submitted == [["a", "bb"], ["ccc"], ["dddd"]] and replies.empty()
    pipeline.futures[2].set_result([vector([7])])
    pipeline.futures[1].set_exception(RuntimeError("device error"))
    assert replies.empty()  # the first chunk is still encoding: nothing may overtake it
    pipeline.futures[0].set_result([vector([1]), vector([2, 3])])
    requests.put(None)
    worker.join(timeout=10)
    assert not worker.is_alive() and pipeline.closed
    got = [replies.get_nowait() for _ in range(4)]
    assert [(kind, seq) for kind, seq, _ in got] == [("done", 0), ("failed", 1), ("failed", 2), ("done", 3)]
    (ids, _weights, counts), grew, lengths = got[0][2]
    assert ids.tolist() == [1, 2, 3] and counts.tolist() == [1, 2] and grew == 0 and lengths.tolist() == [1, 2]
    assert "device error" in str(got[1][2]) and "failed earlier" in str(got[2][2])
    assert got[3][2][0][0].tolist() == [7] and got[3][2][1] == 2 and got[3][2][2].tolist() == [4]


def test_a_pool_reports_a_worker_that_cannot_start_or_that_dies(tiny_source_dir):
    """A worker's start-up error reaches ``warm_up`` (the job calls it first) as the cause; a worker killed
    with chunks outstanding fails their futures instead of leaving the job waiting, and the pool still closes."""
    import os
    import signal

    with DevicePool(tiny_source_dir, ["cpu"], precision="fp4") as pool:
        with pytest.raises(RuntimeError, match="failed to start") as failed:
            pool.warm_up()
        assert "fp4" in str(failed.value.__cause__)
        assert "fp4" in str(failed.value) and isinstance(failed.value, LsrError)  # the CLI prints it as one line
        with pytest.raises(RuntimeError, match="ended"):
            pool.submit(["house cat"])

    pool = DevicePool(tiny_source_dir, ["cpu"], num_threads=1)
    pool.warm_up()
    assert pool.encode(["house cat"])[0].ids.size > 0 and pool.precision != "auto"
    worker = pool._workers[0].process
    os.kill(worker.pid, signal.SIGKILL)
    worker.join()
    try:
        future = pool.submit(["house cat dog"])
    except RuntimeError as err:  # the pool saw the worker end first
        assert "ended" in str(err)
    else:
        with pytest.raises(RuntimeError, match="ended"):
            future.result(timeout=30)
    pool.close()


def test_vectors_cross_processes_as_three_flat_arrays_and_come_back_the_same():
    from opensearch_lsr.encoding.sparse_vector import SparseVector, SparseVectors, flat_vectors

    vectors = [SparseVector(np.array([3, 9], np.int64), np.array([0.5, 1.5], np.float32)),
               SparseVector(np.zeros(0, np.int64), np.zeros(0, np.float32)),
               SparseVector(np.array([1], np.int64), np.array([2.0], np.float32))]
    ids, weights, counts = flat_vectors(vectors)
    assert ids.tolist() == [3, 9, 1] and counts.tolist() == [2, 0, 1]
    back = SparseVectors(ids, weights, counts)
    assert [(v.ids.tolist(), v.weights.tolist()) for v in back] == [(v.ids.tolist(), v.weights.tolist()) for v in vectors]
    assert list(SparseVectors(*flat_vectors([]))) == []
