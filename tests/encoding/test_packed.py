"""Packed batching: tokenize once, token-budgeted batches, the packed body and head, device sparsification,
the in-flight pipeline, graph buckets, all against the padded reference path (CPU)."""
from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace
from unittest.mock import patch

import numpy as np
import pytest
import torch

from opensearch_lsr.encoding.device_sparse import sparsify
from opensearch_lsr.encoding.encode_pipeline import PipelinedEncoder
from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
from opensearch_lsr.encoding.graph_buckets import (GRAPH_TOKEN_GRANULARITY, catch_all_buckets, graph_key, graph_max_len, graph_shape,
                                                   padding_lengths)
from opensearch_lsr.encoding.packed import Segments
from opensearch_lsr.encoding.packed_layouts import packed_model
from opensearch_lsr.encoding.packed_runner import PackedRunner
from opensearch_lsr.encoding.token_batches import token_budget_batches
from opensearch_lsr.encoding.token_ids import OnceTokenizer, TokenizedTexts, concat_tokenized

TEXTS = ["the cat is in the house", "seoul is the capital of korea", "a dog", "paris", "",
         "the river water of the city of paris france is a road " * 60, "books school cats dogs"]


# ---------------------------------------------------------------------------------------------- tokenize once
def test_tokenize_once_equals_the_truncating_tokenizer_on_the_korean_corpus(shared_data):
    from opensearch_lsr.transfer.surgery import load_target_tokenizer

    tok = load_target_tokenizer(str(shared_data / "kobigbird-bert-base-tokenizer"), what="tokenizer")
    texts = [json.loads(line)["text"] for line in open(shared_data / "msmarco-ko" / "corpus.jsonl", encoding="utf-8")]
    texts += [" ".join(texts[:40])]  # one text over the cap
    once = OnceTokenizer(tok, 512)(texts)
    expected = tok(texts, truncation=True, max_length=512, return_attention_mask=False,
                   return_token_type_ids=False)["input_ids"]
    assert once.as_lists() == expected
    full = tok(texts, truncation=False, return_attention_mask=False, return_token_type_ids=False,
               verbose=False)["input_ids"]
    assert once.full_lengths.tolist() == [len(x) for x in full]
    assert once.lengths.max() == 512 and once.full_lengths.max() > 512


@pytest.mark.parametrize("side", ["right", "left"])
def test_tokenize_once_truncation_sides_and_template(splade_tiny_dir, side):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(splade_tiny_dir))
    tok.truncation_side = side
    texts = TEXTS + ["word " * 700]
    once = OnceTokenizer(tok, 64, side)(texts)
    assert once.as_lists() == tok(texts, truncation=True, max_length=64)["input_ids"]
    assert once.select(np.array([5, 0])).as_lists() == [once.as_lists()[5], once.as_lists()[0]]
    both = concat_tokenized([once, once.select(np.array([2]))])
    assert both.as_lists() == once.as_lists() + [once.as_lists()[2]]


def _fake_tokens(lengths):
    from opensearch_lsr.encoding.token_ids import TokenizedTexts

    lengths = np.asarray(lengths, np.int64)
    return TokenizedTexts(np.repeat(np.arange(len(lengths)), lengths), lengths.copy(), lengths.copy())


def test_ready_batches_sort_windows_hold_a_part_filled_tail_once_and_flush_it():
    from opensearch_lsr.encoding.packed_runner import FLUSH, ready_batches

    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 90, size=400)
    cuts = np.sort(rng.choice(np.arange(1, 400), size=30, replace=False))
    chunks = [np.arange(a, b) for a, b in zip([0, *cuts], [*cuts, 400])]
    script, window_of = [], np.zeros(400, int)  # windows of one to four chunks, two "nothing queued now"
    k = 0
    while k < len(chunks):
        take = chunks[k:k + int(rng.integers(1, 5))]
        for c in take:
            window_of[c] = len(script)
        script.append([(c, _fake_tokens(lengths[c])) for c in take])
        k += len(take)
        if len(script) in (4, 9):
            script.append([])
    script.append(None)
    calls = []

    def take_window():
        calls.append(1)
        return script[len(calls) - 1]

    out = [(keys, batch, len(calls) - 1) for keys, batch in ready_batches(take_window, 256)]
    batches = [(keys, b, call) for keys, b, call in out if keys is not FLUSH]
    assert sorted(np.concatenate([keys for keys, _, _ in batches]).tolist()) == list(range(400))  # each once
    for keys, b, call in batches:
        assert b.lengths.tolist() == lengths[keys].tolist() == sorted(lengths[keys].tolist())
        assert int(b.lengths.sum()) <= 256 or len(keys) == 1
        assert (call - window_of[keys] <= 2).all()  # held back once at most (a "nothing queued" call between)
    def part_filled(batch_lengths) -> bool:
        return int(batch_lengths.sum()) + 90 <= 256  # the longest document would still have fitted

    short = [i for i, (keys, b, _) in enumerate(out) if keys is not FLUSH and part_filled(b.lengths)]
    unheld = sum(part_filled(lengths[np.concatenate([c for c, _ in w])][b])  # each window cut on its own
                 for w in script if w for b in token_budget_batches(lengths[np.concatenate([c for c, _ in w])], 256))
    assert sum(keys is FLUSH for keys, _, _ in out) == 2
    assert len(short) < unheld / 1.5


def test_run_texts_starts_before_later_chunks_are_tokenized_and_keeps_two_windows_ahead(splade_tiny_dir):
    import time
    from concurrent.futures import Future

    enc = _echo_encoder(splade_tiny_dir)
    words = [w for w in enc.tokenizer.get_vocab() if w.isalpha() and w.islower()][:700]
    texts = [f"{w} " + "words " * 40 for w in words]  # ~43 tokens: batches of 512 tokens fill in a chunk
    once = enc.once_tokenizer
    submitted, finished, launches = [], [], []
    model_call = enc.runner.model.pooled_max

    def pooled_max(ids, seg):
        launches.append(len(finished))  # chunks tokenized when this batch was launched
        return model_call(ids, seg)

    def tokenize_async(chunk):
        submitted.append(len(chunk))
        fut: Future = Future()
        if len(submitted) == 1:
            fut.set_result(once(chunk))
            finished.append(1)
        else:  # later chunks finish 0.6 s later (the first window's batches take ~0.05 s on an idle CPU)
            threading.Timer(0.6, lambda: (fut.set_result(once(chunk)), finished.append(1))).start()
        return fut

    enc.runner.model.pooled_max = pooled_max
    stats = enc.runner.stats
    source0, split0, waits0 = stats.by_stage["source"], stats.by_stage["split"], stats.source_waits_over_1ms
    t0 = time.perf_counter()
    vectors, tokens = enc.runner.run_texts(texts, tokenize_async, window_docs=2048)
    assert time.perf_counter() - t0 < 30
    # the runner waited for the later chunks' ids, and says so (what a GPU profile's idle gaps are set against)
    assert stats.by_stage["source"] - source0 >= 0.3 and stats.source_waits_over_1ms - waits0 >= 1
    assert stats.by_stage["split"] > split0
    assert [int(v.ids[0]) for v in vectors] == [enc.tokenizer.convert_tokens_to_ids(w) for w in words]
    assert tokens == int(once(texts).lengths.sum())
    assert submitted == [256, 256, 188]  # chunks of window / 8 (at least 256), all three ahead (< 2 windows)
    assert launches[0] == 1  # the device started on the first chunk, before the others were tokenized


# ---------------------------------------------------------------------------------------------- batches
@pytest.mark.parametrize("padded", [False, True])
def test_token_budget_batches_take_every_document_once_within_budget(padded):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 600, size=500)
    batches = token_budget_batches(lengths, 2048, padded=padded, max_batch_docs=64)
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(500))
    for b in batches:
        lens = lengths[b]
        assert (np.diff(lens) >= 0).all() and len(b) <= 64
        cost = len(b) * lens.max() if padded else lens.sum()
        assert cost <= 2048 or len(b) == 1
    with pytest.raises(ValueError):
        token_budget_batches(lengths, 0)


# ---------------------------------------------------------------------------------------------- packed body
def _tiny_models():
    from transformers import (BertConfig, BertForMaskedLM, DistilBertConfig, DistilBertForMaskedLM, ModernBertConfig,
                              ModernBertForMaskedLM, RobertaConfig, RobertaForMaskedLM, XLMRobertaConfig,
                              XLMRobertaForMaskedLM)

    torch.manual_seed(0)
    common = dict(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    return {
        "bert": (BertForMaskedLM(BertConfig(max_position_embeddings=64, **common)), 0),
        "roberta": (RobertaForMaskedLM(RobertaConfig(max_position_embeddings=70, pad_token_id=1, **common)), 1),
        "xlm-roberta": (XLMRobertaForMaskedLM(XLMRobertaConfig(max_position_embeddings=70, pad_token_id=1, **common)), 1),
        "distilbert": (DistilBertForMaskedLM(DistilBertConfig(vocab_size=300, dim=32, n_layers=2, n_heads=4,
                                                              hidden_dim=64, max_position_embeddings=64)), 0),
        # global and local (window 4 < the longest document) layers alternate
        "modernbert": (ModernBertForMaskedLM(ModernBertConfig(
            vocab_size=300, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=48,
            local_attention=8, global_attn_every_n_layers=2, max_position_embeddings=128, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)), 0),
    }


@pytest.mark.parametrize("name", ["bert", "roberta", "xlm-roberta", "distilbert", "modernbert"])
@pytest.mark.parametrize("segment_max,row_block", [("reduce", None), ("gather", None), ("rows", None), ("rows", 20)])
def test_packed_body_and_head_equal_the_padded_hugging_face_forward(name, segment_max, row_block):
    model, pad = _tiny_models()[name]
    model.eval()
    lengths = np.array([5, 17, 3, 30, 2, 9])
    ids = [torch.randint(5, 300, (int(n),)) for n in lengths]
    batch = torch.full((len(ids), int(lengths.max())), pad)
    mask = torch.zeros_like(batch)
    for i, x in enumerate(ids):
        batch[i, :len(x)], mask[i, :len(x)] = x, 1
    with torch.no_grad():
        logits = model(input_ids=batch, attention_mask=mask).logits
        expected = logits.masked_fill(~mask.bool()[..., None], float("-inf")).amax(1)
        packed = packed_model(model, torch.float32, vocab_chunk=128, segment_max=segment_max, row_block=row_block)
        got = packed.pooled_max(torch.cat(ids), Segments.from_lengths(lengths, torch.device("cpu")))
    assert (expected[0] - expected[1]).abs().max() > 1e-3  # documents get different vectors
    assert (got - expected).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", ["bert", "roberta", "xlm-roberta", "distilbert", "modernbert"])
def test_a_head_in_float32_beside_a_bf16_body_lies_closer_to_float32(name):
    """``head_dtype``: the transform and the decoder in their own dtype, fed from the body's float32 stream; a
    float32 head beside a bf16 body removes the head's rounding from the bf16 distance (the CUDA default pairs
    bf16 with an fp16 head, ``default_head_dtype``)."""
    from opensearch_lsr.encoding.packed_layouts import default_head_dtype

    model, _ = _tiny_models()[name]
    model.eval()
    lengths = np.array([5, 17, 3, 30, 2, 9])
    ids = torch.randint(5, 300, (int(lengths.sum()),))
    seg = Segments.from_lengths(lengths, torch.device("cpu"))
    with torch.no_grad():
        def pooled(dtype, head_dtype=None):
            packed = packed_model(model, dtype, vocab_chunk=128, head_dtype=head_dtype)
            assert packed.head_dtype == (head_dtype or dtype) and packed.decoder_t[0].dtype == packed.head_dtype
            assert packed.hidden(ids, seg).dtype == packed.head_dtype
            return packed.pooled_max(ids, seg)
        fp32, bf16 = pooled(torch.float32), pooled(torch.bfloat16)
        fp32_head = pooled(torch.bfloat16, torch.float32)
    head_error, all_error = (fp32_head - fp32).abs().mean(), (bf16 - fp32).abs().mean()
    assert 0 < head_error < 0.5 * all_error
    assert default_head_dtype(torch.bfloat16, torch.device("cuda:1")) == torch.float16
    assert default_head_dtype(torch.bfloat16, torch.device("cpu")) == torch.bfloat16  # no fast fp16 on CPU
    assert default_head_dtype(torch.float32, torch.device("cuda")) == torch.float32
    assert default_head_dtype(torch.float16, torch.device("cuda")) == torch.float16


def _packed_pair(compile_):
    model, _ = _tiny_models()["bert"]
    model.eval()
    lengths = np.array([5, 17, 3, 30, 2, 9])
    ids = torch.randint(5, 300, (int(lengths.sum()),))
    with torch.no_grad():
        eager = packed_model(model, torch.float32, vocab_chunk=128, compile=False)
        other = packed_model(model, torch.float32, vocab_chunk=128, compile=compile_)
        seg = Segments.from_lengths(lengths, torch.device("cpu"))
        return eager.pooled_max(ids, seg), other, lambda: other.pooled_max(ids, seg)


@pytest.mark.parametrize("scope", [True, "block", "body"])
def test_compiled_steps_equal_the_eager_ones(scope):
    """torch.compile of the add + LayerNorm steps (``True``, the CUDA bf16 default), of everything after
    attention (``"block"``) or of the whole body (``"body"``), Inductor's C++ kernels here, computes what the
    eager steps do, through both compiles
    (the first shape, then the token count made dynamic)."""
    expected, packed, run = _packed_pair(scope)
    assert packed.compiled and packed.compile_scope == ("norm" if scope is True else scope)
    assert (run() - expected).abs().max().item() <= 1e-5
    model, _ = _tiny_models()["bert"]
    lengths = np.array([4, 11, 7])  # another token count: the dynamic graph
    ids = torch.randint(5, 300, (int(lengths.sum()),))
    seg = Segments.from_lengths(lengths, torch.device("cpu"))
    with torch.no_grad():
        eager = packed_model(model.eval(), torch.float32, vocab_chunk=128, compile=False)
        assert (packed.pooled_max(ids, seg) - eager.pooled_max(ids, seg)).abs().max().item() <= 1e-5
    assert packed.compiled  # no fallback happened


def test_the_whole_body_compiles_with_an_fp16_head_beside_a_bf16_body():
    """What CUDA runs by default in bf16 (``compile="graphs"`` replays this body; the head's transform in fp16
    inside the compiled region): it compiles, with no fallback to eager, and computes what the eager steps do within
    fp16's rounding."""
    model, _ = _tiny_models()["bert"]
    lengths = np.array([5, 17, 3, 30])
    ids = torch.randint(5, 300, (int(lengths.sum()),))
    seg = Segments.from_lengths(lengths, torch.device("cpu"))
    with torch.no_grad():
        eager, compiled = (packed_model(model.eval(), torch.bfloat16, vocab_chunk=128, compile=c,
                                        head_dtype=torch.float16) for c in (False, "body"))
        expected, got = eager.pooled_max(ids, seg).float(), compiled.pooled_max(ids, seg).float()
    assert compiled.compiled and compiled.head_dtype == torch.float16
    assert (got - expected).abs().max().item() <= 4e-3 * max(1.0, expected.abs().max().item())


@pytest.mark.parametrize("scope, step", [(True, "_add_norm"), ("body", "_traced_hidden"), ("graphs", "_traced_hidden")])
def test_a_failing_compile_falls_back_to_eager_steps_with_a_warning(monkeypatch, caplog, scope, step):
    """A compiler failure warns once and the eager steps compute the same from then on (for the body: the
    eager forward with its own attention fallback, not the traced one)."""
    def broken(fn, **options):
        def run(*args):
            raise RuntimeError("backend compiler failed: no C++ compiler\nmore")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    expected, packed, run = _packed_pair(scope)
    with caplog.at_level("WARNING"):
        got = run()
    assert not packed.compiled
    assert step in caplog.text and "no C++ compiler" in caplog.text and "more" not in caplog.text
    assert torch.equal(got, expected)
    assert torch.equal(run(), expected)  # eager from then on


def test_the_body_is_replayed_as_cuda_graphs_by_default_for_cuda_bf16_fp16_only():
    from opensearch_lsr.encoding.packed import default_compile_scope

    assert default_compile_scope(torch.device("cuda"), torch.bfloat16) == "graphs"
    assert default_compile_scope(torch.device("cuda:1"), torch.float16) == "graphs"
    assert default_compile_scope(torch.device("cuda"), torch.float32) is None
    assert default_compile_scope(torch.device("cpu"), torch.bfloat16) is None
    _, packed, _ = _packed_pair(None)  # None: the default for the model's device (CPU here)
    assert not packed.compiled
    with pytest.raises(ValueError, match="compile"):
        _packed_pair("everything")


def test_unknown_layouts_fall_back_to_padded_batching(tiny_source_dir):
    from transformers import BertConfig, BertForMaskedLM, ElectraConfig, ElectraForMaskedLM

    relative = BertForMaskedLM(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=48, position_embedding_type="relative_key"))
    electra = ElectraForMaskedLM(ElectraConfig(vocab_size=100, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                                               num_attention_heads=2, intermediate_size=48))
    assert packed_model(relative, torch.float32, vocab_chunk=64) is None
    assert packed_model(electra, torch.float32, vocab_chunk=64) is None
    enc = SparseDocumentEncoder(tiny_source_dir, device="cpu", batching="padded")
    assert enc.runner is None and enc.batching == "padded"
    with pytest.raises(ValueError, match="batching"):
        SparseDocumentEncoder(tiny_source_dir, device="cpu", batching="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize("model_fixture", ["tiny_source_dir", "splade_tiny_dir"])
def test_packed_encoder_equals_the_padded_reference(model_fixture, request):
    path = request.getfixturevalue(model_fixture)
    ref = SparseDocumentEncoder(path, device="cpu", batching="padded", batch_size=3)
    new = SparseDocumentEncoder(path, device="cpu", batching="packed", max_batch_tokens=600)
    assert new.batching == "packed"
    new.window_docs = 3  # several tokenization windows, batches across them
    a, b = ref.encode(TEXTS), new.encode(TEXTS)
    for x, y in zip(a, b):
        assert np.array_equal(x.ids, y.ids) and x.ids.dtype == y.ids.dtype == np.int64
        assert np.abs(x.weights - y.weights).max(initial=0.0) <= 1e-5 and y.weights.dtype == np.float32
    dense = ref.encode_dense(TEXTS)
    assert new.stats.texts == len(TEXTS) and new.stats.tokens == sum(map(len, ref.tokenize(TEXTS)))
    assert dense.shape[1] == new.vocab_size


def _clean_and_broken_models(model_dir):
    """An encoder of 64-token batches, its packed model, the same model with one id's bias NaN (what an fp16
    overflow gives), that id, and a factory of runners like the encoder's."""
    import copy

    enc = SparseDocumentEncoder(model_dir, device="cpu", batching="packed", max_batch_tokens=64)
    clean = enc.runner.model
    bad = next(i for i, k in enumerate(enc.keys) if k and i not in enc.special_ids)
    broken_hf = copy.deepcopy(enc.model)
    with torch.no_grad():
        broken_hf.get_output_embeddings().bias[bad] = float("nan")
    broken = packed_model(broken_hf, torch.float32, vocab_chunk=clean.vocab_chunk, segment_max=clean.segment_max,
                          row_block=clean.row_block, compile=False)

    def runner(model, fallback=None) -> PackedRunner:
        return PackedRunner(model, activation=enc.activation, special_ids=enc.special_ids, max_batch_tokens=64,
                            fallback=fallback)

    return enc, clean, broken, bad, runner


def test_a_batch_whose_weights_come_out_non_finite_is_encoded_again_by_the_fallback(tiny_source_dir, caplog):
    """fp16 overflows past 65,504: such a batch is encoded again by the fallback model (bf16 on a GPU); a model that
    outputs NaN itself gets one retry, then its non-finite weights are dropped and counted as before."""
    import logging

    enc, clean, broken, bad, runner = _clean_and_broken_models(tiny_source_dir)
    tokens = enc.once_tokenizer(TEXTS)
    expected = runner(clean).run(tokens)
    built = []
    rescued = runner(broken, lambda: built.append(1) or clean)
    with caplog.at_level(logging.WARNING, logger="opensearch_lsr.encoding.packed_runner"):
        got = rescued.run(tokens)
    for x, y in zip(expected, got):
        assert np.array_equal(x.ids, y.ids) and np.array_equal(x.weights, y.weights)
    batches = len(token_budget_batches(tokens.lengths, 64))
    assert rescued.stats.overflow_reruns == rescued.stats.batches == batches > 1 and built == [1]
    assert rescued.stats.nonfinite_dropped == 0 and len(caplog.records) == 1
    hopeless = runner(broken, lambda: broken)  # the model itself outputs NaN: one retry, then dropped and counted
    got = hopeless.run(tokens)
    assert hopeless.stats.overflow_reruns == 1 and hopeless.fallback is None
    assert hopeless.stats.nonfinite_dropped == len(TEXTS) and not any(bad in v.ids for v in got)
    assert all(np.array_equal(x.ids[x.ids != bad], y.ids) for x, y in zip(expected, got))


# ---------------------------------------------------------------------------------------------- sparsify
@pytest.mark.parametrize("static_size", [None, 10_000, 3])
def test_device_sparsify_is_bit_identical_to_to_sparse_with_bad_values(tiny_source_dir, static_size):
    enc = SparseDocumentEncoder(tiny_source_dir, device="cpu", batching="padded")
    dense = enc.encode_dense(TEXTS).clone()
    tiny = float(np.finfo(np.float32).tiny)
    dense[0, 7], dense[1, 3], dense[1, 4] = float("nan"), float("inf"), float("-inf")
    dense[2, 5], dense[2, 6], dense[3, 8] = tiny / 4, tiny, -1.0
    expected = enc.to_sparse(dense.clone())
    got, nonfinite = sparsify(dense.clone(), static_size=static_size).result()
    assert nonfinite == enc.stats.nonfinite_dropped == 3
    for x, y in zip(expected, got):
        assert np.array_equal(x.ids, y.ids) and np.array_equal(x.weights, y.weights)
        assert x.ids.dtype == y.ids.dtype and x.weights.dtype == y.weights.dtype


# ---------------------------------------------------------------------------------------------- pipeline
class _EchoModel:
    """Stands in for the packed masked LM: each document's vector is one-hot at its second token id, so a
    vector shows which document it was computed from."""

    device = torch.device("cpu")
    max_doc_tokens = 512

    def __init__(self, vocab: int, fail_on_batch: int | None = None) -> None:
        self.vocab, self.fail_on_batch, self.calls = vocab, fail_on_batch, 0

    def graph_bucket(self, lengths: np.ndarray) -> None:  # batches are never padded
        return None

    def pooled_max(self, ids: torch.Tensor, seg: Segments) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.fail_on_batch:
            raise RuntimeError("device lost")
        out = torch.full((len(seg.lengths), self.vocab), -1.0)
        starts = (seg.cu_seqlens[:-1]).long()
        out[torch.arange(len(starts)), ids[starts + 1]] = 1.0
        return out


def _echo_encoder(splade_tiny_dir, fail_on_batch=None) -> SparseDocumentEncoder:
    enc = SparseDocumentEncoder(splade_tiny_dir, device="cpu", batching="packed", max_batch_tokens=512)
    enc.runner.model = _EchoModel(enc.vocab_size, fail_on_batch)
    return enc


def test_pipeline_keeps_order_across_windows_and_chunk_sizes(splade_tiny_dir):
    enc = _echo_encoder(splade_tiny_dir)
    words = [w for w in enc.tokenizer.get_vocab() if w.isalpha() and w.islower()][:400]
    first_ids = {w: enc.tokenizer.convert_tokens_to_ids(w) for w in words}
    pipe = PipelinedEncoder(enc, window_docs=37)
    rng = np.random.default_rng(1)
    chunks, pos = [], 0
    while pos < len(words):
        size = int(rng.integers(0, 60))
        chunks.append(words[pos:pos + size])
        pos += size
    futures = []
    for k, chunk in enumerate(chunks):
        futures.append(pipe.submit([f"{w} padding words" for w in chunk]))
        if k % 3 == 0:  # a consumer that waits while the producer is still submitting (the FLUSH path)
            futures[k // 2].result(timeout=30)
    for chunk, fut in zip(chunks, futures):
        vectors = fut.result(timeout=30)
        assert [int(v.ids[0]) for v in vectors] == [first_ids[w] for w in chunk]
        assert len(fut.tokens.lengths) == len(chunk)
    pipe.close()
    assert enc.stats.texts == len(words) and enc.runner.stats.documents == len(words)
    assert enc.runner.stats.batches < len(chunks)  # batches span chunks: sorting windows are not the chunks


def test_pipeline_failure_reaches_every_pending_future_and_later_submits(splade_tiny_dir):
    enc = _echo_encoder(splade_tiny_dir, fail_on_batch=2)
    pipe = PipelinedEncoder(enc, window_docs=4)
    futures = [pipe.submit([f"text number {i} " * 30] * 4) for i in range(6)]  # ~370 tokens a text: full batches
    errors = 0
    for fut in futures:
        try:
            fut.result(timeout=30)
        except RuntimeError as err:
            assert "device lost" in str(err)
            errors += 1
    assert errors >= 1 and all(f.done() for f in futures)  # nobody waits forever
    with pytest.raises(RuntimeError, match="pipeline failed"):
        pipe.submit(["more"])
    pipe.close()


def test_pipeline_resolves_a_lone_chunk_without_more_input(splade_tiny_dir):
    enc = _echo_encoder(splade_tiny_dir)
    pipe = PipelinedEncoder(enc, window_docs=10_000)
    done = threading.Event()
    fut = pipe.submit(["seoul", "paris"])
    fut.add_done_callback(lambda f: done.set())
    assert done.wait(30) and len(fut.result()) == 2
    assert len(pipe.submit([]).result(timeout=30)) == 0
    pipe.close()
    assert pipe.max_inflight(256) >= 2 * (10_000 // 256)


def test_the_device_thread_says_whether_it_waited_for_the_caller_or_for_the_tokenizer(splade_tiny_dir):
    from concurrent.futures import Future

    enc = _echo_encoder(splade_tiny_dir)
    pipe = PipelinedEncoder(enc, window_docs=10_000)
    assert pipe.submit(["seoul"]).result(timeout=30)
    stages = enc.runner.stats.by_stage
    caller0, tokenizer0 = stages["source_caller"], stages["source_tokenizer"]
    time.sleep(0.3)  # nothing queued: the device thread waits for the caller
    slow: Future = Future()
    enc.tokenize_async = lambda texts: slow
    fut = pipe.submit(["paris", "river"])  # queued, its ids not there yet: the device thread waits for the tokenizer
    time.sleep(0.3)
    slow.set_result(enc.once_tokenizer(["paris", "river"]))
    assert len(fut.result(timeout=30)) == 2
    pipe.close()
    stages = enc.runner.stats.by_stage
    assert stages["source_caller"] - caller0 >= 0.25 and stages["source_tokenizer"] - tokenizer0 >= 0.25
    assert stages["source"] >= stages["source_caller"] + stages["source_tokenizer"] - 0.01


# ---------------------------------------------------------------------------------------------- the job
def test_index_job_writes_the_same_ndjson_pipelined_or_not_and_close_to_the_padded_path(splade_tiny_dir, tmp_path):
    from opensearch_lsr.encoding.job import IndexJobConfig, run_index_job

    corpus = tmp_path / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as fh:
        for i, t in enumerate(TEXTS * 5):
            fh.write(json.dumps({"_id": f"d{i}", "text": t}) + "\n")

    def run(batching, window=None):
        out = tmp_path / f"out-{batching}-{window}"
        cfg = IndexJobConfig(corpus=str(corpus), model=str(splade_tiny_dir), backend="ndjson", index=str(out),
                             batching=batching, chunk_docs=8, window_docs=window or 4096, device="cpu")
        summary = run_index_job(cfg, restart=True, progress=False)
        return summary, b"".join(p.read_bytes() for p in sorted(out.glob("*.ndjson")))

    packed_summary, pipelined = run("packed", window=8)  # window = chunk: the same batches as encode(chunk)
    assert packed_summary["encoder"]["batching"] == "packed" and packed_summary["indexed"] == len(TEXTS) * 5 - 5
    assert packed_summary["skipped"] == {"empty_text": 5} and packed_summary["truncated"] == 5
    device_thread = packed_summary["encoder"]["device_thread_s"]  # where the device thread's time went
    assert set(device_thread) == {"launch", "wait", "split", "source", "source_caller", "source_tokenizer"}
    assert device_thread["launch"] > 0 and device_thread["source"] >= device_thread["source_tokenizer"]
    assert packed_summary["encoder"]["batches"] >= 1 and packed_summary["encoder"]["head_precision"] == "float32"
    # the same records through the in-memory path (encode() per chunk of 8, no pipeline): the same bytes
    from opensearch_lsr.encoding.indexing import index_records
    from opensearch_lsr.encoding.writers import NdjsonWriter

    enc = SparseDocumentEncoder(splade_tiny_dir, device="cpu", batching="packed")
    records = [(f"d{i}", t.strip()) for i, t in enumerate(TEXTS * 5) if t]  # the reader strips text
    direct = tmp_path / "direct"
    writer = NdjsonWriter(direct, index="out-packed-8")
    index_records(records, enc, writer, chunk_docs=8)
    writer.close()
    assert b"".join(p.read_bytes() for p in sorted(direct.glob("*.ndjson"))) == pipelined
    workers_out = tmp_path / "workers"  # documents built and serialised in worker processes: the same bytes
    cfg = IndexJobConfig(corpus=str(corpus), model=str(splade_tiny_dir), backend="ndjson", index=str(workers_out),
                         batching="packed", chunk_docs=8, window_docs=8, device="cpu", build_workers=2)
    assert run_index_job(cfg, restart=True, progress=False)["indexed"] == packed_summary["indexed"]
    assert b"".join(p.read_bytes().replace(b"workers", b"out-packed-8") for p in sorted(workers_out.glob("*.ndjson"))) \
        == pipelined
    _, padded = run("padded")
    lines_a, lines_b = pipelined.splitlines(), padded.splitlines()
    assert len(lines_a) == len(lines_b)
    for a, b in zip(lines_a[1::2], lines_b[1::2]):
        da, db = json.loads(a), json.loads(b)
        assert da["id"] == db["id"] and set(da["sparse_embedding"]) == set(db["sparse_embedding"])
        assert max(abs(da["sparse_embedding"][k] - db["sparse_embedding"][k]) for k in da["sparse_embedding"]) <= 1e-5


def test_tokenizer_process_returns_what_the_tokenizer_returns(splade_tiny_dir, shared_data):
    """The spawned tokenizer (the GPU path's) gives the same ids as tokenizing in this process."""
    from opensearch_lsr.encoding.tokenizer_process import TokenizerProcess

    texts = [json.loads(line)["text"] for line in open(shared_data / "msmarco-ko" / "corpus.jsonl", encoding="utf-8")][:300]
    once = OnceTokenizer(str(splade_tiny_dir), 128)
    proc = TokenizerProcess(once, threads=1)
    try:
        futures = [proc.submit(texts[k:k + 100]) for k in range(0, 300, 100)]
        got = concat_tokenized([f.result() for f in futures])
    finally:
        proc.close()
    want = once(texts)
    assert (got.ids == want.ids).all() and (got.lengths == want.lengths).all()
    assert (got.full_lengths == want.full_lengths).all() and (want.full_lengths > 128).any()  # truncation happened


def test_tokenizer_processes_split_a_call_and_join_it_in_order(splade_tiny_dir, shared_data):
    """Two tokenizer processes: each call's texts are split between them and the ids come back in input order."""
    from opensearch_lsr.encoding.tokenizer_process import TokenizerProcess

    texts = [json.loads(line)["text"] for line in open(shared_data / "msmarco-ko" / "corpus.jsonl", encoding="utf-8")][:301]
    once = OnceTokenizer(str(splade_tiny_dir), 128)
    from opensearch_lsr.encoding.tokenizer_process import default_tokenizer_processes

    assert [default_tokenizer_processes(t) for t in (1, 2, 4, 8, 16)] == [1, 1, 2, 4, 4]  # two threads each, <= 4
    from opensearch_lsr.encoding.tokenizer_process import default_tokenizer_threads

    with patch("os.cpu_count", return_value=16):  # half the cores, shared by the devices of a pool
        assert [default_tokenizer_threads(n) for n in (1, 2, 4, 8, 16)] == [8, 4, 2, 1, 1]
    proc = TokenizerProcess(once, threads=2, processes=2)
    try:
        assert proc.processes == 2 and len({pid for pid in proc._pool._processes}) == 2
        got = proc(texts)
        small = proc(texts[:3])  # fewer texts than two per process: one slice
        with pytest.raises(TypeError):
            proc.submit([None, None, None, None]).result()  # a failed slice fails the joined call
    finally:
        proc.close()
    want = once(texts)
    assert (got.ids == want.ids).all() and (got.lengths == want.lengths).all()
    assert (got.full_lengths == want.full_lengths).all() and (small.lengths == want.lengths[:3]).all()


# ---------------------------------------------------------------------------------------------- graph buckets

def test_graph_shapes_are_few_and_their_padding_documents_fit_the_longest_document():
    rng = np.random.default_rng(0)
    shapes = set()
    for _ in range(3000):
        docs = int(rng.integers(1, 2000))
        max_doc = int(rng.choice([64, 512]))
        tokens = int(rng.integers(docs, docs * max_doc + 1))
        total, n = graph_shape(tokens, docs, max_doc)
        shapes.add((total, n))
        assert total % GRAPH_TOKEN_GRANULARITY == 0 and n > docs and n & (n - 1) == 0
        pad = padding_lengths(tokens, docs, (total, n))
        assert len(pad) == n - docs and pad.sum() == total - tokens and pad.min() >= 1 and pad.max() <= max_doc
        assert pad.max() - pad.min() <= 1
        assert total - tokens - (n - docs) < GRAPH_TOKEN_GRANULARITY  # at most a granule's worth beyond one per doc
    budget_shapes = {graph_shape(t, d, 512) for d in range(100, 800, 7) for t in range(60_000, 65_537, 500)}
    assert len(budget_shapes) < 40  # full 64k-token batches of 100-800 documents: a few dozen graphs
    with pytest.raises(ValueError):
        padding_lengths(10, 3, (12, 8))  # 2 padding tokens cannot fill 5 documents


def test_padded_segments_keep_the_real_documents_first():
    lengths = np.array([5, 17, 3, 30])
    shape = graph_shape(int(lengths.sum()), len(lengths), 64)
    padded = Segments.from_lengths(lengths, torch.device("cpu"), pad_to=shape, max_doc=64)
    plain = Segments.from_lengths(lengths, torch.device("cpu"))
    assert len(padded.positions) == shape[0] and len(padded.lengths) == shape[1] and padded.max_len == 64
    assert int(padded.cu_seqlens[-1]) == shape[0] and int(padded.positions.max()) < 64
    real = padded.real()
    for field in ("lengths", "cu_seqlens", "positions"):
        assert torch.equal(getattr(real, field), getattr(plain, field))
    assert real.host_lengths.tolist() == lengths.tolist() and plain.real() is plain
    with pytest.raises(ValueError, match="max_doc"):
        Segments.from_lengths(np.array([70]), torch.device("cpu"), pad_to=graph_shape(70, 1, 64), max_doc=64)


def test_graph_key_is_the_shape_a_padded_batch_is_replayed_under():
    """What a benchmark computes from lengths alone equals what ``GraphReplay`` keys the padded batch by."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        max_doc = int(rng.choice([64, 512]))
        lengths = rng.integers(1, max_doc + 1, int(rng.integers(1, 300)))
        shape = graph_shape(int(lengths.sum()), len(lengths), max_doc)
        ids, seg = Segments.packed_batch(np.zeros(int(lengths.sum()), np.int64), lengths, torch.device("cpu"),
                                         pad_to=shape, max_doc=max_doc)
        assert graph_key(lengths, max_doc) == (len(ids), len(seg.lengths), seg.max_len)


def test_attention_is_told_the_batch_longest_document_rounded_to_a_query_block_not_the_model_longest():
    assert [graph_max_len(n, 512) for n in (1, 128, 129, 300, 511, 512)] == [128, 128, 256, 384, 512, 512]
    assert graph_max_len(40, 64) == 64  # never past the model's longest
    with pytest.raises(ValueError, match="max_doc"):
        graph_max_len(513, 512)
    lengths = np.array([90, 12, 140, 7])
    shape = graph_shape(int(lengths.sum()), len(lengths), 512)
    seg = Segments.from_lengths(lengths, torch.device("cpu"), pad_to=shape, max_doc=512)
    assert seg.max_len == 256 and int(seg.lengths.max()) <= seg.max_len  # padding documents fit it too
    assert int(seg.pad_slots.max()) < len(seg.lengths) * seg.max_len


@pytest.mark.parametrize("name", ["bert", "roberta"])  # positions from 0, and from padding_idx + 1
def test_graph_batches_equal_the_eager_forward(name, caplog):
    """The runner pads each batch to its bucket; the vectors are the eager forward's, batch after batch (the
    second and third shapes run the dynamic graph). On CPU Inductor runs no CUDA graphs, which the model says
    once."""
    model, _ = _tiny_models()[name]
    model.eval()
    rng = np.random.default_rng(1)
    with torch.no_grad():
        graphs = packed_model(model, torch.float32, vocab_chunk=128, compile="graphs")
        eager = packed_model(model, torch.float32, vocab_chunk=128, compile=False)
    assert graphs.compile_scope == "graphs" and graphs.max_doc_tokens == (64 if name == "bert" else 68)
    runners = [PackedRunner(m, activation="relu", special_ids=[0], max_batch_tokens=96) for m in (graphs, eager)]
    for docs in (6, 9, 4):
        lengths = rng.integers(2, 31, docs)
        tokens = TokenizedTexts(rng.integers(5, 300, int(lengths.sum())), lengths, lengths.copy())
        with caplog.at_level("WARNING"):
            got, expected = (r.run(tokens) for r in runners)
        assert len(got) == docs and any(len(v.ids) for v in got)
        for a, b in zip(got, expected):
            assert a.ids.tolist() == b.ids.tolist() and np.abs(a.weights - b.weights).max(initial=0) <= 1e-5
    assert graphs.compiled  # no fallback to eager happened
    assert caplog.text.count("runs without CUDA graphs on cpu") == 1
    shape = graphs.graph_bucket(lengths)
    seg = Segments.from_lengths(lengths, torch.device("cpu"), pad_to=shape, max_doc=graphs.max_doc_tokens)
    ids = torch.cat([torch.from_numpy(tokens.ids), torch.zeros(shape[0] - len(tokens.ids), dtype=torch.long)])
    with torch.inference_mode():
        assert graphs.hidden(ids, seg).shape[0] == int(lengths.sum())  # the padding tokens' rows are dropped
    assert eager.graph_bucket(np.array([4, 6])) is None


def _recording_capture(captured: list):
    """``torch.cuda.graph`` as far as the CPU can show it: a capture records without computing (its output holds
    NaN until replayed) and a replay reruns the recorded call on the captured inputs into that same output."""
    def capture(fn):
        out = fn()
        out.fill_(float("nan"))
        captured.append(out)
        return (lambda: out.copy_(fn())), out
    return capture


def test_graph_replays_equal_the_eager_forward_batch_after_batch(monkeypatch):
    """A warm-up captures each bucket on its first batch; each later batch of a bucket is copied into the captured
    inputs and replayed: the vectors are the eager forward's for every batch, in the same run of batches, so a stale
    input would show."""
    from opensearch_lsr.encoding.graph_replay import GraphReplay
    from opensearch_lsr.encoding.packed_runner import capturing_every_shape

    graphs, _, runners, tokens = _graph_and_eager_runners(monkeypatch)
    captured: list = []
    graphs.graph_replay = GraphReplay(graphs._body, capture=_recording_capture(captured))
    with capturing_every_shape(runners[0]):
        got = runners[0].run(tokens)
    expected = runners[1].run(tokens)
    for a, b in zip(got, expected):
        assert a.ids.tolist() == b.ids.tolist() and np.abs(a.weights - b.weights).max(initial=0) <= 1e-5
    batches = runners[0].stats.batches
    stats = graphs.graph_replay.stats
    catch_alls = set(catch_all_buckets(1000, graphs.max_doc_tokens))  # captured after the warm-up's batches
    assert catch_alls <= set(graphs.graph_replay._graphs)
    assert stats.failed is None and stats.replays == batches
    assert 1 <= stats.captured == len(captured) < batches + len(catch_alls)
    assert stats.uncaptured == 0 and graphs.graph_replay.capture_after == 2  # restored after the warm-up
    # the same again: every bucket is captured already, so these are replays only
    assert [v.ids.tolist() for v in runners[0].run(tokens)] == [v.ids.tolist() for v in got]
    assert stats.captured == len(captured) and stats.replays == 2 * batches
    from opensearch_lsr.encoding.job import _device_thread

    summary = _device_thread(SimpleNamespace(runner=runners[0]))  # what lsr-os index's summary reports
    assert summary["cuda_graphs"]["captured"] == stats.captured and summary["cuda_graphs"]["replays"] == 2 * batches
    assert "cuda_graphs" not in _device_thread(SimpleNamespace(runner=runners[1]))
    runners[0].reset_stats()  # what the encoder's warm-up does: the job's summary counts from there
    assert runners[0].stats.batches == 0 and graphs.graph_replay.stats.captured == graphs.graph_replay.stats.replays == 0


def test_after_the_warm_up_a_new_shape_runs_without_a_graph_until_its_second_batch(monkeypatch):
    """A capture synchronises the device and empties its caches: a shape met once (a part-filled batch) is not
    worth one. Its first batch runs the body as it is, the next ones are captured and replayed; the vectors are the
    eager forward's either way."""
    from opensearch_lsr.encoding.graph_replay import GraphReplay

    graphs, _, runners, tokens = _graph_and_eager_runners(monkeypatch)
    captured: list = []
    replay = graphs.graph_replay = GraphReplay(graphs._body, capture=_recording_capture(captured), borrow_ratio=1)
    got, expected = runners[0].run(tokens), runners[1].run(tokens)
    for a, b in zip(got, expected):
        assert a.ids.tolist() == b.ids.tolist() and np.abs(a.weights - b.weights).max(initial=0) <= 1e-5
    batches, stats = runners[0].stats.batches, replay.stats
    shapes = len(replay._sightings)
    assert stats.uncaptured == shapes  # each shape's first batch
    assert stats.captured == len(captured) == sum(n >= 2 for n in replay._sightings.values()) >= 1
    assert stats.replays == batches - shapes
    again = runners[0].run(tokens)  # every shape met once already: captured at its next batch, then replayed
    assert [v.ids.tolist() for v in again] == [v.ids.tolist() for v in got]
    assert stats.uncaptured == shapes and stats.replays == 2 * batches - shapes and stats.captured == shapes
    with pytest.raises(ValueError, match="capture_after"):
        GraphReplay(graphs._body, capture_after=0)


def test_a_batch_without_a_graph_of_its_own_is_padded_up_to_a_larger_captured_bucket(monkeypatch):
    """After the warm-up, a part-filled batch whose bucket has no graph replays the smallest captured bucket it fits
    within ``borrow_ratio`` of its own tokens, with the eager forward's vectors; one it does not fit runs without a
    graph, as with ``borrow_ratio=1``; the warm-up pads each batch to its own bucket."""
    from opensearch_lsr.encoding.graph_buckets import graph_key
    from opensearch_lsr.encoding.graph_replay import GraphReplay
    from opensearch_lsr.encoding.packed_runner import capturing_every_shape

    graphs, _, runners, _ = _graph_and_eager_runners(monkeypatch)
    captured: list = []
    replay = graphs.graph_replay = GraphReplay(graphs._body, capture=_recording_capture(captured), borrow_ratio=4)
    rng = np.random.default_rng(9)
    warm_up = PackedRunner(graphs, activation="relu", special_ids=[0], max_batch_tokens=3000)
    lengths = np.full(100, 30)
    with capturing_every_shape(warm_up):  # one batch of 3,000 tokens in 100 documents
        warm_up.run(TokenizedTexts(rng.integers(5, 300, 3000), lengths, lengths.copy()))
    keys, stats = set(replay._graphs), replay.stats
    assert stats.borrowed == 0 and keys == {(3072, 128, 64), *catch_all_buckets(3000, graphs.max_doc_tokens)}
    replay.reset_stats()
    stats = replay.stats
    max_doc = graphs.max_doc_tokens
    for docs in (20, 25, 30, 35):  # 400-1,000 tokens: buckets of 1,024 tokens, none captured
        lengths = rng.integers(20, 31, docs)
        batch = TokenizedTexts(rng.integers(5, 300, int(lengths.sum())), lengths, lengths.copy())
        own = graph_key(lengths, max_doc)
        assert own[0] == 1024 and own not in keys
        before = (stats.borrowed, stats.replays, stats.uncaptured)
        got, expected = (r.run(batch) for r in runners)
        for a, b in zip(got, expected):
            assert a.ids.tolist() == b.ids.tolist() and np.abs(a.weights - b.weights).max(initial=0) <= 1e-5
        assert (stats.borrowed, stats.replays, stats.uncaptured) == (before[0] + 1, before[1] + 1, before[2])
    assert stats.captured == 0 and set(replay._graphs) == keys and stats.borrowed_tokens == 4 * (3072 - 1024)
    # a batch with as many documents as every captured bucket cannot be padded up to one: its own bucket, no graph
    lengths = np.full(2048, 1)
    assert replay.bucket_for(lengths, max_doc) == graph_key(lengths, max_doc)
    replay.borrow_ratio = 1  # never beyond the batch's own bucket
    small = np.array([12, 20, 7])
    assert replay.bucket_for(small, max_doc) == graph_key(small, max_doc)
    with pytest.raises(ValueError, match="borrow_ratio"):
        GraphReplay(graphs._body, borrow_ratio=0.5)


def test_larger_bucket_is_the_smallest_captured_one_the_batch_fits():
    from opensearch_lsr.encoding.graph_buckets import larger_bucket, padding_lengths

    lengths = np.array([100, 300, 50])  # 450 tokens, 3 documents, the longest 300
    buckets = [(4096, 64, 512), (1024, 8, 384), (1024, 4, 512), (2048, 8, 384), (1024, 8, 256), (512, 3, 512),
               (456, 8, 512)]
    # (1024, 8, 256): 300 > 256; (512, 3, 512): no room for a padding document; (456, 8, 512): 6 tokens for its 5
    # padding documents, the fewest tokens of those that fit
    assert larger_bucket(lengths, buckets, max_tokens=4096) == (456, 8, 512)
    # (1024, 4, 512) would need one padding document of 574 tokens
    assert larger_bucket(lengths, buckets[:-1], max_tokens=4096) == (1024, 8, 384)
    assert larger_bucket(lengths, buckets[:-1], max_tokens=1000) is None
    # the padding documents share the extra tokens and each must stay within the bucket's longest
    assert larger_bucket(np.array([10]), [(1024, 2, 512)], max_tokens=1e9) is None  # one of 1,014 tokens
    assert larger_bucket(np.array([10]), [(1024, 4, 512)], max_tokens=1e9) == (1024, 4, 512)
    assert padding_lengths(10, 1, (1024, 4)).max() <= 512
    assert larger_bucket(np.array([5, 5]), [(4, 4, 128)], max_tokens=1e9) is None  # fewer tokens than the batch


def test_every_batch_of_the_budget_fits_a_catch_all_bucket():
    from opensearch_lsr.encoding.graph_buckets import CATCH_ALL_MOST_DOCS, larger_bucket

    rng = np.random.default_rng(3)
    for budget, max_doc in ((65536, 512), (65536, 510), (16384, 128), (1000, 64)):
        buckets = catch_all_buckets(budget, max_doc)
        assert len(buckets) <= 6 and all(key[0] > budget and key[2] == max_doc for key in buckets)
        for _ in range(400):
            lengths = rng.integers(1, int(rng.integers(1, max_doc + 1)) + 1, int(rng.integers(1, CATCH_ALL_MOST_DOCS // 2)))
            lengths = lengths[np.cumsum(lengths) <= budget]  # a batch within the budget
            if len(lengths):
                key = larger_bucket(lengths, buckets, float("inf"))
                assert key is not None and key[1] > len(lengths)
    with pytest.raises(ValueError):
        catch_all_buckets(0, 512)


def _graph_and_eager_models(monkeypatch):
    """A tiny BERT packed with ``compile="graphs"`` (Inductor stubbed out: the replay logic is what is tested) and
    eagerly."""
    monkeypatch.setattr(torch, "compile", lambda fn, **options: fn)
    model, _ = _tiny_models()["bert"]
    model.eval()
    with torch.no_grad():
        return (packed_model(model, torch.float32, vocab_chunk=128, compile="graphs"),
                packed_model(model, torch.float32, vocab_chunk=128, compile=False))


def _graph_and_eager_runners(monkeypatch):
    """:func:`_graph_and_eager_models`, their runners, and about 6,200 tokens: six full batches of 1,000 that
    share a bucket or two."""
    graphs, eager = _graph_and_eager_models(monkeypatch)
    runners = [PackedRunner(m, activation="relu", special_ids=[0], max_batch_tokens=1000) for m in (graphs, eager)]
    rng = np.random.default_rng(4)
    lengths = rng.integers(2, 61, 200)
    tokens = TokenizedTexts(rng.integers(5, 300, int(lengths.sum())), lengths, lengths.copy())
    return graphs, eager, runners, tokens


def test_a_failing_graph_capture_warns_once_and_runs_the_body(monkeypatch, caplog):
    from opensearch_lsr.encoding.graph_replay import GraphReplay

    graphs, eager = _graph_and_eager_models(monkeypatch)

    def broken(fn):
        fn()
        raise RuntimeError("operation not permitted when stream is capturing\ndetails")

    graphs.graph_replay = GraphReplay(graphs._body, capture=broken)
    lengths = np.array([7, 30, 12, 4])
    tokens = TokenizedTexts(np.arange(5, 5 + int(lengths.sum())), lengths, lengths.copy())
    with caplog.at_level("WARNING"):
        runner = PackedRunner(graphs, activation="relu", special_ids=[0], max_batch_tokens=40)
        got = runner.run(tokens) + runner.run(tokens)
    expected = PackedRunner(eager, activation="relu", special_ids=[0], max_batch_tokens=40).run(tokens) * 2
    assert [v.ids.tolist() for v in got] == [v.ids.tolist() for v in expected]
    assert caplog.text.count("CUDA graph capture of the packed body failed") == 1 and "details" not in caplog.text
    assert graphs.graph_replay.stats.failed.startswith("RuntimeError: operation not permitted")


def test_graph_batches_tell_attention_the_encoders_longest_document(splade_tiny_dir):
    """Not the position table's length: varlen attention sizes its grid by it."""
    enc = SparseDocumentEncoder(splade_tiny_dir, device="cpu", batching="packed", max_length=128)
    assert enc.runner.model.max_doc_tokens == 128
    assert packed_model(_tiny_models()["roberta"][0], torch.float32, vocab_chunk=128).max_doc_tokens == 68


def test_when_most_batches_overflow_the_fallback_model_encodes_every_batch(tiny_source_dir, caplog):
    """A model whose activations overflow fp16 in every batch would be paid twice per batch: after
    ``OVERFLOWS_BEFORE_SWITCH`` re-encoded batches, more than half of all, the fallback model takes over; the batches
    already in flight on the old one are re-encoded as before, so the vectors are the clean model's throughout."""
    import logging

    enc, clean, broken, _, runner = _clean_and_broken_models(tiny_source_dir)
    tokens = enc.once_tokenizer(TEXTS * 8)
    expected = runner(clean).run(tokens)
    switching = runner(broken, lambda: clean)
    with caplog.at_level(logging.WARNING, logger="opensearch_lsr.encoding.packed_runner"):
        got = switching.run(tokens)
    for x, y in zip(expected, got):
        assert np.array_equal(x.ids, y.ids) and np.array_equal(x.weights, y.weights)
    limit, stats = PackedRunner.OVERFLOWS_BEFORE_SWITCH, switching.stats
    assert switching.model is clean and stats.nonfinite_dropped == 0
    assert limit <= stats.overflow_reruns <= limit + switching.depth < stats.batches
    assert "the fallback model encodes every batch from now on" in caplog.text


def test_no_more_than_max_graphs_shapes_are_captured_and_the_rest_run_without_a_graph(monkeypatch):
    """Each captured shape keeps its output allocated: past ``max_graphs`` shapes, batches of a new shape run the body
    as it is, with the eager forward's vectors."""
    from opensearch_lsr.encoding.graph_replay import GraphReplay
    from opensearch_lsr.encoding.packed_runner import capturing_every_shape

    graphs, _, runners, tokens = _graph_and_eager_runners(monkeypatch)
    captured: list = []
    replay = graphs.graph_replay = GraphReplay(graphs._body, capture=_recording_capture(captured), max_graphs=1,
                                               borrow_ratio=1)
    with capturing_every_shape(runners[0]):
        got = runners[0].run(tokens)
    for a, b in zip(got, runners[1].run(tokens)):
        assert a.ids.tolist() == b.ids.tolist() and np.abs(a.weights - b.weights).max(initial=0) <= 1e-5
    shapes, batches = len(replay._sightings), runners[0].stats.batches
    assert shapes >= 2  # the test needs batches of several shapes
    stats = replay.stats
    assert stats.captured == len(captured) == len(replay._graphs) == 1
    assert stats.uncaptured + stats.replays == batches and stats.uncaptured >= shapes - 1
    with pytest.raises(ValueError, match="max_graphs"):
        GraphReplay(graphs._body, max_graphs=0)
