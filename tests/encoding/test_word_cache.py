"""Token ids memoised per space-separated chunk (``encoding/word_cache.py``) equal the Rust tokenizer's."""
from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pytest

from opensearch_lsr.encoding.token_ids import OnceTokenizer
from opensearch_lsr.encoding.word_cache import WordIdsCache, splits_at_spaces


def _same(a, b) -> None:
    assert np.array_equal(a.ids, b.ids)
    assert np.array_equal(a.lengths, b.lengths)
    assert np.array_equal(a.full_lengths, b.full_lengths)


@pytest.fixture(scope="module")
def korean_texts(shared_data):
    return [json.loads(line)["text"] for line in open(shared_data / "msmarco-ko" / "corpus.jsonl", encoding="utf-8")]


@pytest.mark.parametrize("which", ["kobigbird", "splade-tiny"])
def test_cached_ids_equal_the_rust_tokenizer_on_the_korean_corpus(which, korean_texts, shared_data, splade_tiny_dir):
    path = str(shared_data / "kobigbird-bert-base-tokenizer") if which == "kobigbird" else str(splade_tiny_dir)
    plain, cached = OnceTokenizer(path, 512, word_cache=0), OnceTokenizer(path, 512, min_ids_per_chunk=0)
    assert plain.word_cache is None and cached.word_cache is not None and cached.probe is None
    texts = korean_texts + [" ".join(korean_texts[:40])]  # one over the cap
    for _ in range(2):  # filling the cache, then from it
        for at in range(0, len(texts), 1024):
            _same(cached(texts[at:at + 1024]), plain(texts[at:at + 1024]))
    cache = cached.word_cache
    assert 0 < len(cache) < cache.lookups / 2
    before = cache.tokenized
    cached(texts[:500])
    assert cache.tokenized == before  # seen texts need no tokenizing


_ALPHABET = list("ab AB  \t\n\r.,!?-'#[]()0123") + [
    "##", "[SEP]", "[UNK]", "[MASK]", "\x00", "\x1c", "\x85", "\u00a0", "\u3000", "\u2028", "\u200b", "\ufeff",
    "\ufffd", "\u0301", "\u0308", "e\u0301", "\u00e9", "\u00b4", "\u212b", "\ufb01", "\u4e2d", "\u6587", "\u1100",
    "\u1161", "\uac00", "\ud55c\uad6d", "\uc5b4", "\U0001f600", "x" * 120, "\uac00" * 60]


@pytest.mark.parametrize("which", ["kobigbird", "splade-tiny"])
def test_cached_ids_equal_on_random_unicode_with_a_tiny_cache(which, shared_data, splade_tiny_dir):
    path = str(shared_data / "kobigbird-bert-base-tokenizer") if which == "kobigbird" else str(splade_tiny_dir)
    rng = random.Random(7)
    texts = ["".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 60))) for _ in range(1500)]
    plain, cached = OnceTokenizer(path, 64, word_cache=0), OnceTokenizer(path, 64, word_cache=50, min_ids_per_chunk=0)
    for at in range(0, len(texts), 100):
        _same(cached(texts[at:at + 100]), plain(texts[at:at + 100]))
        assert len(cached.word_cache) <= 50
    _same(cached(texts), plain(texts))
    _same(cached([]), plain([]))


def test_a_pickled_tokenizer_keeps_its_cache_and_works(splade_tiny_dir):
    once = OnceTokenizer(str(splade_tiny_dir), 128, min_ids_per_chunk=0)
    first = once(["the cat sat", "the dog sat"])
    copy = pickle.loads(pickle.dumps(once))
    assert len(copy.word_cache) == len(once.word_cache) == 4
    _same(copy(["the cat sat", "the dog sat"]), first)
    assert copy.word_cache.tokenized == once.word_cache.tokenized


def test_which_tokenizers_split_at_spaces(splade_tiny_dir, shared_data):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from opensearch_lsr.contract import rust_tokenizer

    assert splits_at_spaces(rust_tokenizer(str(splade_tiny_dir)))
    assert splits_at_spaces(rust_tokenizer(str(shared_data / "kobigbird-bert-base-tokenizer")))

    def make(pre, norm=None, added=()):
        tok = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre
        if norm is not None:
            tok.normalizer = norm
        tok.add_tokens(list(added))
        return tok

    assert splits_at_spaces(make(pre_tokenizers.BertPreTokenizer(), normalizers.BertNormalizer()))
    assert splits_at_spaces(make(pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                          pre_tokenizers.Digits()])))
    assert not splits_at_spaces(make(pre_tokenizers.Metaspace()))  # SentencePiece keeps the space in "▁"
    assert not splits_at_spaces(make(pre_tokenizers.ByteLevel()))  # byte-level BPE keeps it in "Ġ"
    assert not splits_at_spaces(make(pre_tokenizers.Digits()))  # nothing drops the space
    assert not splits_at_spaces(make(pre_tokenizers.Whitespace(), normalizers.Replace("_", " ")))
    assert not splits_at_spaces(make(pre_tokenizers.Whitespace(), added=["new york"]))


def test_a_tokenizer_that_keeps_spaces_is_not_cached(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "▁a": 1, "▁b": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    assert OnceTokenizer(tok, 16).word_cache is None
    with pytest.raises(ValueError, match="max_words"):
        WordIdsCache(0)


def test_the_cache_is_kept_only_where_chunks_average_enough_ids(korean_texts, shared_data, splade_tiny_dir):
    """The first PROBE_CHUNKS chunks go through the Rust tokenizer and decide: Korean through SPLADE-tiny's uncased
    English vocabulary (jamo, 5.8 ids per chunk) keeps the cache, through the Korean kobigbird one (2.2) drops it."""
    from opensearch_lsr.encoding.word_cache import PROBE_CHUNKS

    windows = [korean_texts[at:at + 256] for at in range(0, 2048, 256)]
    for path, kept in ((str(splade_tiny_dir), True), (str(shared_data / "kobigbird-bert-base-tokenizer"), False)):
        plain, once = OnceTokenizer(path, 512, word_cache=0), OnceTokenizer(path, 512)
        chunks = 0
        for part in windows:
            _same(once(part), plain(part))
            chunks += sum(t.count(" ") + 1 for t in part)
            if chunks < PROBE_CHUNKS:  # undecided: every text tokenized in full, nothing remembered yet
                assert once.probe is not None and len(once.word_cache) == 0
        assert once.probe is None and (once.word_cache is not None) == kept
        if kept:
            assert len(once.word_cache) > 0  # the windows after the probe went through the cache


def test_a_cache_whose_chunks_rarely_repeat_is_dropped(splade_tiny_dir, monkeypatch):
    """Identifiers never repeat: once HIT_SHARE_AFTER lookups leave the hit share under MIN_HIT_SHARE the cache
    goes, and the ids stay the Rust tokenizer's."""
    from opensearch_lsr.encoding import word_cache

    monkeypatch.setattr(word_cache, "HIT_SHARE_AFTER", 2_000)
    plain = OnceTokenizer(str(splade_tiny_dir), 64, word_cache=0)
    once = OnceTokenizer(str(splade_tiny_dir), 64, min_ids_per_chunk=0)
    for call in range(10):  # 50 texts of 10 new identifiers and "the": 550 lookups a call, hit share about 0.09
        texts = [" ".join(f"id{call}x{i}x{k}" for k in range(10)) + " the" for i in range(50)]
        _same(once(texts), plain(texts))
        if once.word_cache is None:
            break
    assert once.word_cache is None and call == 3  # dropped on the call that took the lookups past 2,000
    texts = ["the the cat", "the dog"] * 50
    _same(once(texts), plain(texts))

    repeating = OnceTokenizer(str(splade_tiny_dir), 64, min_ids_per_chunk=0)
    for _ in range(10):
        repeating(["the cat sat on the mat"] * 50)
    assert repeating.word_cache is not None and repeating.word_cache.lookups > 2_000  # repeats keep it


def test_index_job_writes_the_same_ndjson_with_the_cache_as_without(splade_tiny_dir, korean_texts, tmp_path,
                                                                    monkeypatch):
    """``lsr-os index --backend ndjson`` on Korean passages: the same bytes with the word cache in use from the
    first window (the probe cut to one chunk) as with no cache."""
    from opensearch_lsr.encoding import token_ids
    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
    from opensearch_lsr.encoding.job import IndexJobConfig, run_index_job

    corpus = tmp_path / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as fh:
        for i, text in enumerate(korean_texts[:160] * 2):  # the second copy comes from the cache
            fh.write(json.dumps({"_id": f"d{i}", "text": text}, ensure_ascii=False) + "\n")
    calls = []
    real_call = WordIdsCache.__call__
    monkeypatch.setattr(WordIdsCache, "__call__", lambda self, texts, tok: calls.append(len(texts)) or
                        real_call(self, texts, tok))
    monkeypatch.setattr(token_ids, "PROBE_CHUNKS", 1)

    def run(name: str) -> bytes:
        cfg = IndexJobConfig(corpus=str(corpus), model=str(splade_tiny_dir), backend="ndjson",
                             index=str(tmp_path / name), batching="packed", chunk_docs=64, window_docs=64, device="cpu")
        assert run_index_job(cfg, restart=True, progress=False)["indexed"] == 320
        return b"".join(p.read_bytes().replace(name.encode(), b"X") for p in sorted((tmp_path / name).glob("*.ndjson")))

    cached = run("cached")
    assert sum(calls) == 320 - 64  # every window after the first (the probe) went through the cache
    monkeypatch.setattr(SparseDocumentEncoder, "tokenizer_word_cache", 0)
    calls.clear()
    plain = run("plain")
    assert not calls and cached == plain


def test_threads_sharing_one_tokenizer_get_the_rust_ids(splade_tiny_dir, korean_texts, monkeypatch):
    """The job's thread and the pipeline's tokenizer thread may call one tokenizer at once (CPU, long-text
    splitting): through the probe's decision and the cache's filling every call returns the Rust tokenizer's ids."""
    from concurrent.futures import ThreadPoolExecutor

    from opensearch_lsr.encoding import token_ids

    monkeypatch.setattr(token_ids, "PROBE_CHUNKS", 3_000)  # decided after a few windows, while others run
    plain, once = OnceTokenizer(str(splade_tiny_dir), 512, word_cache=0), OnceTokenizer(str(splade_tiny_dir), 512)
    windows = [korean_texts[at:at + 32] for at in range(0, 1536, 32)] * 2
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(once, windows))
    for part, got in zip(windows, results):
        _same(got, plain(part))
    assert once.probe is None and once.word_cache is not None and once.word_cache.lookups > 0
