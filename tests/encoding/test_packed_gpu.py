"""Packed batching on a CUDA device: the varlen kernels, device sparsification without host syncs, bf16 vs the
padded path (``pytest -m gpu``; the default suite deselects these, and they skip without CUDA)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
from opensearch_lsr.encoding.packed import Segments, padded_attention

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TEXTS = ["the cat is in the house", "seoul is the capital of korea", "a dog", "paris",
         "the river water of the city of paris france is a road " * 60, "books school cats dogs"] * 20


def _jaccard(a, b) -> float:
    return float(np.mean([len(np.intersect1d(x.ids, y.ids)) / max(1, len(np.union1d(x.ids, y.ids)))
                          for x, y in zip(a, b)]))


def test_packed_fp32_on_cuda_equals_the_padded_path(splade_tiny_dir):
    ref = SparseDocumentEncoder(splade_tiny_dir, device="cuda", precision="fp32", batching="padded")
    new = SparseDocumentEncoder(splade_tiny_dir, device="cuda", precision="fp32", batching="packed")
    for x, y in zip(ref.encode(TEXTS), new.encode(TEXTS)):
        assert np.array_equal(x.ids, y.ids) and np.abs(x.weights - y.weights).max(initial=0.0) <= 1e-5


def test_packed_bf16_uses_varlen_and_is_as_close_to_fp32_as_the_padded_bf16(splade_tiny_dir):
    fp32 = SparseDocumentEncoder(splade_tiny_dir, device="cuda", precision="fp32", batching="padded").encode(TEXTS)
    new = SparseDocumentEncoder(splade_tiny_dir, device="cuda", precision="bf16", batching="packed")
    ref = SparseDocumentEncoder(splade_tiny_dir, device="cuda", precision="bf16", batching="padded")
    packed, padded = new.encode(TEXTS), ref.encode(TEXTS)
    assert new.runner.model.use_varlen
    assert _jaccard(packed, fp32) >= _jaccard(padded, fp32) - 0.01


def test_launching_a_packed_batch_does_not_synchronise(splade_tiny_dir):
    enc = SparseDocumentEncoder(splade_tiny_dir, device="cuda", batching="packed")
    tokens = enc.once_tokenizer(TEXTS)
    enc.runner.launch(tokens).result()  # warm-up (allocator, kernels)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pending = enc.runner.launch(tokens)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert not [w for w in caught if "synchroniz" in str(w.message).lower()]
    vectors, _ = pending.result()
    assert len(vectors) == len(TEXTS)


def test_a_packed_batch_crosses_in_one_pinned_copy_and_equals_the_cpu_staging():
    lengths = np.array([5, 40, 17, 90])
    ids = np.arange(int(lengths.sum())) + 7
    cuda_ids, seg = Segments.packed_batch(ids, lengths, torch.device("cuda"), pin=True, pad_to=(256, 8), max_doc=128)
    cpu_ids, cpu_seg = Segments.packed_batch(ids, lengths, torch.device("cpu"), pad_to=(256, 8), max_doc=128)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        Segments.packed_batch(ids, lengths, torch.device("cuda"), pin=True, pad_to=(256, 8), max_doc=128)
    names = [e.name for e in prof.events()]
    assert names.count("aten::copy_") == 1 and names.count("cudaMemcpyAsync") == 1
    assert seg.staged.is_cuda and cuda_ids.cpu().tolist() == cpu_ids.tolist()
    for name in ("lengths", "cu_seqlens", "positions", "pad_slots"):
        assert getattr(seg, name).cpu().tolist() == getattr(cpu_seg, name).tolist(), name


def test_varlen_window_equals_the_padded_band_mask():
    torch.manual_seed(0)
    lengths = np.array([5, 40, 17, 90])
    seg = Segments.from_lengths(lengths, torch.device("cuda"))
    q, k, v = (torch.randn(int(lengths.sum()), 4, 32, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    from torch.nn.attention.varlen import varlen_attn

    got = varlen_attn(q, k, v, seg.cu_seqlens, seg.cu_seqlens, seg.max_len, seg.max_len, window_size=(8, 8))
    expected = padded_attention(q, k, v, seg, window=8)
    assert (got.float() - expected.float()).abs().max().item() < 2e-2


def test_warm_up_changes_neither_counters_nor_outputs(splade_tiny_dir):
    enc = SparseDocumentEncoder(splade_tiny_dir, device="cuda", precision="fp32")
    cold = enc.encode(TEXTS)
    fresh = SparseDocumentEncoder(splade_tiny_dir, device="cuda", precision="fp32")
    assert fresh.warm_up(64) > 0
    assert fresh.stats.texts == 0 and fresh.stats.tokens == 0 and fresh.runner.stats.batches == 0
    warm = fresh.encode(TEXTS)
    assert all(np.array_equal(a.ids, b.ids) and np.allclose(a.weights, b.weights, atol=1e-5) for a, b in zip(cold, warm))
    assert SparseDocumentEncoder(splade_tiny_dir, device="cpu").warm_up() == 0.0


def test_fp16_is_closer_to_fp32_than_bf16_and_keeps_a_bf16_fallback_for_overflows(splade_tiny_dir):
    fp32 = SparseDocumentEncoder(splade_tiny_dir, device="cuda", precision="fp32", batching="packed").encode(TEXTS)
    bf16 = SparseDocumentEncoder(splade_tiny_dir, device="cuda", precision="bf16", batching="packed").encode(TEXTS)
    enc = SparseDocumentEncoder(splade_tiny_dir, device="cuda", precision="fp16", batching="packed")
    fp16 = enc.encode(TEXTS)
    assert _jaccard(fp16, fp32) > _jaccard(bf16, fp32) and enc.stats.nonfinite_dropped == 0
    assert enc.runner.stats.overflow_reruns == 0 and enc.runner.fallback().dtype == torch.bfloat16


def test_auto_is_fp16_with_packed_batching_and_keeps_bf16s_range_when_padded(splade_tiny_dir):
    packed = SparseDocumentEncoder(splade_tiny_dir, device="cuda")
    padded = SparseDocumentEncoder(splade_tiny_dir, device="cuda", batching="padded")
    assert packed.batching == "packed" and packed.precision == "fp16" and packed.runner.fallback is not None
    assert padded.precision == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")


def test_the_default_captures_cuda_graphs_and_replays_what_the_compiled_body_computes(splade_tiny_dir):
    """The default on CUDA replays one CUDA graph per batch shape (a shape is captured on its second batch): no
    capture failed (which would fall back to the body without graphs, with a warning only)."""
    graphs = SparseDocumentEncoder(splade_tiny_dir, device="cuda")
    body = SparseDocumentEncoder(splade_tiny_dir, device="cuda", compile="body")
    graphs.encode(TEXTS)
    replayed = graphs.encode(TEXTS)
    stats = graphs.runner.model.graph_replay.stats
    assert stats.failed is None and stats.captured >= 1 and stats.replays >= 1
    reference = body.encode(TEXTS)
    assert _jaccard(replayed, reference) > 0.99
    assert max(np.abs(x.weights[np.isin(x.ids, y.ids)] - y.weights[np.isin(y.ids, x.ids)]).max(initial=0.0)
               for x, y in zip(replayed, reference)) <= 1e-2


def test_batches_padded_up_to_the_warm_ups_catch_all_graphs_give_what_the_compiled_body_computes(splade_tiny_dir):
    """The warm-up records the catch-all buckets without replaying them; later batches whose own bucket has no graph
    are padded up to one and replayed (its captured inputs refreshed each time): the vectors are the body's."""
    from opensearch_lsr.encoding.graph_buckets import catch_all_buckets

    enc = SparseDocumentEncoder(splade_tiny_dir, device="cuda")
    body = SparseDocumentEncoder(splade_tiny_dir, device="cuda", compile="body")
    assert enc.warm_up(8) > 0
    replay, runner = enc.runner.model.graph_replay, enc.runner
    assert set(catch_all_buckets(runner.max_batch_tokens, runner.model.max_doc_tokens)) <= set(replay._graphs)
    replay.borrow_ratio = float("inf")  # these small batches too
    reference = body.encode(TEXTS)
    for texts in (TEXTS, TEXTS[:7], TEXTS):
        got = enc.encode(texts)
        assert _jaccard(got, reference[:len(texts)]) > 0.99
        assert max(np.abs(x.weights[np.isin(x.ids, y.ids)] - y.weights[np.isin(y.ids, x.ids)]).max(initial=0.0)
                   for x, y in zip(got, reference)) <= 1e-2
    stats = replay.stats
    assert stats.failed is None and stats.borrowed >= 2 and stats.uncaptured == 0 and stats.captured == 0


def test_bf16_packs_an_fp16_head_that_lies_closer_to_fp32_than_a_bf16_one(splade_tiny_dir):
    """On CUDA bf16 runs the MLM head in fp16 (``default_head_dtype``): the same speed on tensor cores, three
    more significant bits where the sign of a logit decides whether an id is kept."""
    from opensearch_lsr.encoding.packed_layouts import packed_model

    fp32 = SparseDocumentEncoder(splade_tiny_dir, device="cuda", precision="fp32", batching="packed").encode(TEXTS)
    enc = SparseDocumentEncoder(splade_tiny_dir, device="cuda", precision="bf16", batching="packed")
    assert enc.runner.model.head_dtype == torch.float16 and enc.runner.model.dtype == torch.bfloat16
    fp16_head = enc.encode(TEXTS)
    model = enc.runner.model
    enc.runner.model = packed_model(enc.model, torch.bfloat16, vocab_chunk=model.vocab_chunk, compile=False,
                                    head_dtype=torch.bfloat16)
    bf16_head = enc.encode(TEXTS)
    assert _jaccard(fp16_head, fp32) >= _jaccard(bf16_head, fp32) and enc.stats.nonfinite_dropped == 0
    assert enc.runner.fallback().head_dtype == torch.bfloat16  # the overflow fallback: bf16 throughout
