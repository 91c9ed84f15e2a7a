"""Lucene/OpenSearch BM25 against a hand-computed case, including the one-byte length norm."""
from __future__ import annotations

import math

import numpy as np
import pytest

from opensearch_lsr.lexical.bm25 import (LENGTH_TABLE, BM25Error, LuceneBM25, byte4_to_int, int_to_byte4,
                                         top_rows)
from opensearch_lsr.lexical.nori import NoriAnalyzer, NoriToken


def _doc(**counts: int) -> list[NoriToken]:
    return [NoriToken(term, "NNG") for term, c in counts.items() for _ in range(c)]


def test_smallfloat_byte4_by_hand():
    # lengths below NUM_FREE_VALUES (24) are exact
    assert [int_to_byte4(i) for i in (0, 1, 23)] == [0, 1, 23]
    # 100: 100 - 24 = 76 = 0b1001100 -> 7 bits, shift 3, 76 >> 3 = 0b1001 -> low bits 001 | (3+1) << 3 = 33
    assert int_to_byte4(100) == 24 + 33
    # decoding 57: 33 -> bits 001, shift 3 -> (0b1001) << 3 = 72, + 24 = 96
    assert byte4_to_int(57) == 96
    assert LENGTH_TABLE[57] == 96.0
    # monotone, covering int range, each byte a fixed point of encode(decode(.))
    decoded = [byte4_to_int(b) for b in range(256)]
    assert decoded == sorted(decoded) and decoded[-1] > 2**30
    assert all(int_to_byte4(d) == b for b, d in enumerate(decoded))


@pytest.fixture()
def three_docs() -> tuple[list[str], list[list[NoriToken]]]:
    # d0: length 100 (norm decodes to 96), d1: length 10, d2: length 5; sumTotalTermFreq 115
    return ["d0", "d1", "d2"], [_doc(x=2, y=98), _doc(x=1, z=9), _doc(z=5)]


def _hand_bm25(tf: float, dl: float, df: int, n: int = 3, avgdl: float = 115 / 3, k1: float = 1.2,
               b: float = 0.75) -> float:
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    return idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))


def test_scores_match_the_hand_computed_formula(three_docs):
    ids, docs = three_docs
    bm = LuceneBM25.from_tokens(ids, docs, NoriAnalyzer(), similarity="lucene")
    rows, s = bm.term_scores("x")
    got = dict(zip((ids[r] for r in rows), s.tolist()))
    # idf(x) = ln(1 + 1.5 / 2.5) = ln 1.6 = 0.470004; avgdl = 38.3333
    # d0: dl quantised to 96: 0.470004 * 2 / (2 + 1.2 * (0.25 + 0.75 * 96 / 38.3333)) = 0.206418
    # d1: dl 10 (exact):      0.470004 * 1 / (1 + 1.2 * (0.25 + 0.75 * 10 / 38.3333)) = 0.306235
    assert got["d0"] == pytest.approx(_hand_bm25(2, 96, 2), rel=1e-6)
    assert got["d0"] == pytest.approx(0.206418, abs=2e-6)
    assert got["d1"] == pytest.approx(_hand_bm25(1, 10, 2), rel=1e-6)
    assert got["d1"] == pytest.approx(0.306235, abs=2e-6)
    # the exact length 100 would give a different score: the norm quantisation is in effect
    assert abs(got["d0"] - _hand_bm25(2, 100, 2)) > 1e-3


def test_opensearch_legacy_similarity_scales_by_k1_plus_1(three_docs):
    ids, docs = three_docs
    lucene = LuceneBM25.from_tokens(ids, docs, NoriAnalyzer(), similarity="lucene")
    legacy = LuceneBM25.from_tokens(ids, docs, NoriAnalyzer())  # default: OpenSearch's LegacyBM25Similarity
    np.testing.assert_allclose(legacy.term_scores("x")[1], 2.2 * lucene.term_scores("x")[1], rtol=1e-6)


def test_repeated_query_terms_add_up_and_ranking(three_docs):
    ids, docs = three_docs
    bm = LuceneBM25.from_tokens(ids, docs, NoriAnalyzer(), similarity="lucene")
    bm.analyzer = type("A", (), {"analyze": staticmethod(lambda text: text.split())})()
    once, twice = bm.score("x")[1], bm.score("x x")[1]
    np.testing.assert_allclose(twice, 2 * once, rtol=1e-6)
    run = bm.search({"q1": "x z", "q2": "nothing"}, k=2)
    assert list(run["q1"]) == ["d1", "d2"]  # d1 has both terms; d2 (short, z x5) beats d0 (long, x x2)
    assert run["q2"] == {}
    with pytest.raises(BM25Error):
        bm.search({"q": "x"}, k=0)


def test_exact_lengths_reproduce_bm25s_lucene():
    bm25s = pytest.importorskip("bm25s")
    pytest.importorskip("mecab_ko")
    corpus = {"a": "서울은 한국의 수도이다.", "b": "파리는 프랑스의 수도이며 큰 도시이다.",
              "c": "한국의 고양이와 개에 관한 책", "d": "학교 도서관에서 책을 읽었다. 책은 재미있었다."}
    an = NoriAnalyzer()
    ours = LuceneBM25.build(corpus, an, similarity="lucene", length_norm="exact")
    ref = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
    ref.index([an.analyze(t) for t in corpus.values()], show_progress=False)
    for query in ("한국의 수도", "책"):
        expected = ref.get_scores(an.analyze(query))
        np.testing.assert_allclose(ours.score(query)[1], expected, rtol=1e-5, atol=1e-7)


def test_top_rows_breaks_ties_by_row():
    scores = np.array([1.0, 3.0, 3.0, 2.0, 3.0], np.float32)
    assert top_rows(np.arange(5), scores, 2).tolist() == [1, 2]
    assert top_rows(np.array([4, 3, 0]), scores, 5).tolist() == [4, 3, 0]


def test_bad_parameters_are_one_sentence(three_docs):
    ids, docs = three_docs
    with pytest.raises(BM25Error, match="illegal b value"):
        LuceneBM25.from_tokens(ids, docs, NoriAnalyzer(), b=1.5)
    with pytest.raises(BM25Error, match="similarity must be one of"):
        LuceneBM25.from_tokens(ids, docs, NoriAnalyzer(), similarity="bm25")
