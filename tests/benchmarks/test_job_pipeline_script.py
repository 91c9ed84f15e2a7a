"""``benchmarks/job_pipeline.py``: the job against an emulated device, by window."""
from __future__ import annotations

import time

import numpy as np
import pytest

from opensearch_lsr.encoding.graph_buckets import catch_all_buckets, graph_key
from opensearch_lsr.encoding.sparse_vector import SparseVector
from opensearch_lsr.encoding.token_ids import TokenizedTexts


def test_the_emulated_device_queues_each_batch_after_the_last_and_holds_the_host_while_launching(load_script):
    module = load_script("job_pipeline")
    vector = SparseVector(np.array([3, 9]), np.array([0.5, 1.0], np.float32))
    device = module.EmulatedDevice(docs_per_s=100.0, launch_us_per_doc=2000.0, vector=vector)
    batch = TokenizedTexts(np.arange(6), np.array([2, 4]), np.array([2, 4]))
    t0 = time.perf_counter()
    first, second = device.launch(batch), device.launch(batch)
    assert time.perf_counter() - t0 >= 2 * 2 * 0.002  # 2 documents x 2 ms of launching, twice
    assert second.end - first.end == pytest.approx(0.02)  # 2 documents at 100/s, after the first batch
    vectors, nonfinite = second.result()
    assert time.perf_counter() >= second.end and nonfinite == 0 and len(vectors) == 2
    for got in vectors:  # the batch's flat host results, taken by the real PendingSparse.result
        assert np.array_equal(got.ids, vector.ids) and np.array_equal(got.weights, vector.weights)
    with pytest.raises(ValueError):
        module.EmulatedDevice(docs_per_s=0, launch_us_per_doc=1, vector=vector)


def test_an_emulated_capture_waits_for_the_device_to_drain_then_holds_the_host(load_script):
    module = load_script("job_pipeline")
    vector = SparseVector(np.array([3]), np.array([1.0], np.float32))
    device = module.EmulatedDevice(docs_per_s=100.0, launch_us_per_doc=0.0, vector=vector, capture_after=2,
                                   capture_ms=30.0, replay_launch_ms=25.0, max_doc=128)
    small, other, third = (TokenizedTexts(np.arange(100 * n), np.full(n, 100), np.full(n, 100)) for n in (2, 12, 30))
    first = device.launch(small)  # the shape's first batch: no graph yet, launched per document (here in no time)
    assert time.perf_counter() < first.end and device.graphs.stats.uncaptured == 1
    second = device.launch(small)  # its second: captured once the two batches' 40 ms of device time are done
    assert time.perf_counter() >= first.end + 0.03 and second.end >= first.end + 0.03 + 0.02
    t0 = time.perf_counter()
    device.launch(small)  # a replay: its launch takes replay_launch_ms
    assert time.perf_counter() - t0 >= 0.025
    device.launch(other)  # another shape (1,200 tokens: 2,048 with padding): its first batch, no graph
    stats = device.graphs.stats
    assert (stats.captured, stats.replays, stats.uncaptured) == (1, 2, 2)
    with device.capturing_every_shape():  # a warm-up captures each shape on its first batch, then the catch-alls
        device.launch(third)
    assert device.graphs.stats.captured == 2 + len(catch_all_buckets(device.max_batch_tokens, 128))
    device.warmed_up()
    assert device.graphs.stats.captured == device.graphs.stats.replays == 0
    assert module.EmulatedDevice(100.0, 0.0, vector).graphs is None  # no graphs unless asked


def test_an_emulated_batch_padded_up_to_a_larger_graph_replays_it_and_takes_its_device_time(load_script):

    module = load_script("job_pipeline")
    vector = SparseVector(np.array([3]), np.array([1.0], np.float32))
    big, small = (TokenizedTexts(np.arange(100 * n), np.full(n, 100), np.full(n, 100)) for n in (30, 5))
    big_tokens, own_tokens = graph_key(big.lengths, 128)[0], graph_key(small.lengths, 128)[0]
    assert big_tokens <= 4 * own_tokens and own_tokens < big_tokens
    for ratio in (4.0, 1.0):
        device = module.EmulatedDevice(docs_per_s=1000.0, launch_us_per_doc=10_000.0, vector=vector, capture_after=2,
                                       replay_launch_ms=1.0, max_doc=128, borrow_ratio=ratio)
        with device.capturing_every_shape():
            device.launch(big)
        device.warmed_up()
        free, t0 = device.free_at, time.perf_counter()
        second = device.launch(small)  # its own bucket has no graph
        t1 = time.perf_counter()
        stats = device.graphs.stats
        # its device time starts when the device is free and the launch is done: 5 documents' time x the tokens it is
        # padded to (the big batch's bucket, or its own) / its real ones
        padded = big_tokens if ratio > 1 else own_tokens
        assert max(free, t0) + 0.005 * padded / 500 <= second.end <= max(free, t1) + 0.005 * padded / 500
        if ratio > 1:  # a replay of the big batch's graph, launched in one go
            assert (stats.borrowed, stats.replays, stats.uncaptured) == (1, 1, 0)
            assert stats.borrowed_tokens == big_tokens - own_tokens and t1 - t0 < 0.05
        else:  # launched per document: 50 ms
            assert (stats.borrowed, stats.replays, stats.uncaptured) == (0, 0, 1) and t1 - t0 >= 0.05



def test_job_pipeline_runs_each_window_against_the_default(shared_data, tmp_path, load_script):
    module = load_script("job_pipeline")
    md = tmp_path / "job_pipeline.md"
    payload = module.main(["--windows", "64", "--repeat", "1", "--copies", "2", "--limit", "60",
                           "--device-docs-per-s", "20000", "--launch-us-per-doc", "5", "--md", str(md)])
    assert payload["documents"] == 120 and set(payload["runs"]) == {str(module.DEFAULT_WINDOW), "64"}
    for runs in payload["runs"].values():
        assert len(runs) == 1 and runs[0]["docs_per_s"] > 0
    text = md.read_text()
    assert "| 64 |" in text and "x window 4096" in text and md.with_suffix(".json").exists()


def test_job_pipeline_counts_the_captures_each_capture_after_makes(shared_data, tmp_path, load_script):
    module = load_script("job_pipeline")
    payload = module.main(["--windows", "64", "--capture-after", "1", "--repeat", "1", "--copies", "2", "--limit",
                           "60", "--max-batch-tokens", "2048", "--device-docs-per-s", "20000",
                           "--launch-us-per-doc", "5", "--capture-ms", "1"])
    default = module.DEFAULT_CAPTURE_AFTER
    ratio = module.DEFAULT_BORROW_RATIO
    assert set(payload["runs"]) == {f"{w}/capture_after={c}/borrow_ratio={ratio:g}" for w in (module.DEFAULT_WINDOW, 64)
                                    for c in (default, 1)}
    for key, (run,) in payload["runs"].items():
        assert run["docs_per_s"] > 0 and run["captured"] + run["replays"] + run["uncaptured"] > 0
        if "capture_after=1/" in key:
            assert run["uncaptured"] == 0  # every shape the warm-up missed is captured on its first batch
