"""The local backend's ``match`` (nori + Lucene BM25) and ``hybrid`` queries, and ``fuse_runs`` equivalence."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mecab_ko")

from opensearch_lsr.lexical import text_index  # noqa: E402
from opensearch_lsr.lexical.bm25 import LuceneBM25  # noqa: E402
from opensearch_lsr.lexical.fusion import HybridFusion, fuse_runs  # noqa: E402
from opensearch_lsr.lexical.nori import NoriAnalyzer  # noqa: E402
from opensearch_lsr.lexical.queries import hybrid_query, match_query  # noqa: E402
from opensearch_lsr.local.index import LocalIndex, LocalIndexError  # noqa: E402

CORPUS = {
    "seoul": "서울은 대한민국의 수도이며 가장 큰 도시이다.",
    "busan": "부산은 대한민국 제2의 도시이고 큰 항구가 있다.",
    "paris": "파리는 프랑스의 수도이다. 파리에는 에펠탑이 있다.",
    "cats": "고양이는 작은 동물이다. 고양이와 개는 사람과 함께 산다.",
    "books": "학교 도서관에서 한국어 책을 읽었다.",
    "empty": "",
}
VECTORS = {
    "seoul": {"서울": 2.0, "수도": 1.5, "도시": 0.5}, "busan": {"부산": 2.0, "도시": 1.0, "항구": 1.2},
    "paris": {"파리": 2.2, "수도": 1.4}, "cats": {"고양이": 2.5, "동물": 1.0}, "books": {"책": 1.8, "학교": 1.0},
    "empty": {"없음": 0.1},
}
NORM = {"phase_results_processors": [{"normalization-processor": {
    "normalization": {"technique": "min_max"},
    "combination": {"technique": "arithmetic_mean", "parameters": {"weights": [0.3, 0.7]}}}}]}


@pytest.fixture()
def index(tmp_path):
    idx = LocalIndex.create(tmp_path / "idx", {"properties": {
        "text": {"type": "text", "analyzer": "nori"}, "emb": {"type": "rank_features"},
        "lang": {"type": "keyword"}}})
    resp = idx.bulk({"_id": d, "_source": {"text": t, "emb": VECTORS[d], "lang": "ko"}} for d, t in CORPUS.items())
    assert not resp["errors"]
    return idx


def _hits(resp):
    return [(h["_id"], h["_score"]) for h in resp["hits"]["hits"]]


def test_match_scores_are_lucene_bm25_over_nori(index):
    reference = LuceneBM25.build(CORPUS, NoriAnalyzer())
    for q in ("대한민국의 수도", "큰 도시", "고양이", "책을 읽다"):
        resp = index.search({"query": match_query("text", q), "size": 10})
        mask, scores = reference.score(q)
        expected = sorted(((d, float(scores[i])) for i, d in enumerate(CORPUS) if mask[i]), key=lambda x: -x[1])
        got = _hits(resp)
        assert [d for d, _ in got] == [d for d, _ in expected], q
        np.testing.assert_allclose([s for _, s in got], [s for _, s in expected], rtol=1e-6)
        assert resp["hits"]["total"]["value"] == int(mask.sum())
    # 수도: in seoul and paris only (idf over 5 documents with text; the empty one does not count)
    assert {d for d, _ in _hits(index.search({"query": match_query("text", "수도")}))} == {"seoul", "paris"}


def test_match_operator_msm_boost_and_errors(index):
    ors = dict(_hits(index.search({"query": match_query("text", "대한민국 항구")})))
    ands = dict(_hits(index.search({"query": match_query("text", "대한민국 항구", operator="and")})))
    assert set(ors) == {"seoul", "busan"} and set(ands) == {"busan"}
    assert dict(_hits(index.search({"query": match_query("text", "대한민국 항구", minimum_should_match="100%")}))) \
        == pytest.approx(ands)
    boosted = dict(_hits(index.search({"query": match_query("text", "대한민국 항구", boost=2.0)})))
    assert boosted["busan"] == pytest.approx(2 * ors["busan"], rel=1e-6)
    # inside bool with a filter, as any other scoring clause
    both = index.search({"query": {"bool": {"must": [match_query("text", "도시")], "filter": [{"term": {"lang": "ko"}}]}}})
    assert {d for d, _ in _hits(both)} == {"seoul", "busan"}
    assert index.search({"query": match_query("text", "은 는 이 가")})["hits"]["total"]["value"] == 0  # particles only
    with pytest.raises(LocalIndexError, match="text fields only"):
        index.search({"query": match_query("lang", "ko")})
    with pytest.raises(LocalIndexError, match="does not support \\[fuzziness\\]"):
        index.search({"query": match_query("text", "도시", fuzziness="AUTO")})


def test_text_postings_are_cached_next_to_the_segments(index):
    first = _hits(index.search({"query": match_query("text", "수도")}))
    files = list((index.path / text_index.CACHE_DIRNAME).glob("text-*.npz"))
    assert len(files) == 1
    text_index._MEMORY.clear()
    assert _hits(LocalIndex.open(index.path).search({"query": match_query("text", "수도")})) == first
    index.bulk([{"_id": "new", "_source": {"text": "수도 이전 계획", "emb": {"수도": 1.0}}}])
    assert "new" in {d for d, _ in _hits(index.search({"query": match_query("text", "수도")}))}
    assert len(list((index.path / text_index.CACHE_DIRNAME).glob("text-*.npz"))) == 1  # the stale one is gone


@pytest.mark.parametrize("technique,weights", [("min_max", (0.3, 0.7)), ("rrf", None)])
def test_hybrid_equals_fuse_runs_of_the_sub_queries(index, technique, weights):
    fusion = HybridFusion(technique, weights, rank_constant=60)
    window = 3
    queries = {"q1": "대한민국의 수도", "q2": "큰 도시 항구", "q3": "고양이와 책"}
    sparse = {"q1": {"수도": 1.0, "서울": 0.5}, "q2": {"도시": 1.0, "항구": 2.0}, "q3": {"고양이": 1.0, "책": 1.0}}
    bm25_run, sparse_run, hybrid_run = {}, {}, {}
    for qid, text in queries.items():
        lexical = match_query("text", text)
        neural = {"neural_sparse": {"emb": {"query_tokens": sparse[qid]}}}
        bm25_run[qid] = dict(_hits(index.search({"query": lexical, "size": window})))
        sparse_run[qid] = dict(_hits(index.search({"query": neural, "size": window})))
        resp = index.search({"query": hybrid_query([lexical, neural]), "size": window}, search_pipeline=fusion.pipeline())
        hybrid_run[qid] = _hits(resp)
    fused = fuse_runs([bm25_run, sparse_run], technique, weights, window=window)
    for qid in queries:
        assert [d for d, _ in hybrid_run[qid]] == list(fused[qid]), qid
        np.testing.assert_allclose([s for _, s in hybrid_run[qid]], list(fused[qid].values()), rtol=1e-6)


def test_hybrid_min_max_by_hand_and_pipeline_lookup(index, tmp_path):
    lexical = match_query("text", "수도")  # seoul, paris
    neural = {"neural_sparse": {"emb": {"query_tokens": {"도시": 1.0}}}}  # busan 1.0, seoul 0.5 (9-bit exact)
    bm = dict(_hits(index.search({"query": lexical})))
    assert bm["seoul"] == bm["paris"]  # same tf, same length: a tie
    resp = index.search({"query": hybrid_query([lexical, neural]), "size": 10}, search_pipeline=NORM)
    got = dict(_hits(resp))
    # bm25: both tied hits score == max == min -> 1.0; sparse: busan 1, seoul (the minimum) 0 -> 0.001
    expected = {"seoul": 0.3 * 1.0 + 0.7 * 0.001, "paris": 0.3 * 1.0, "busan": 0.7 * 1.0}
    assert got == pytest.approx(expected, rel=1e-5)
    assert [d for d, _ in _hits(resp)] == ["busan", "seoul", "paris"]
    assert resp["hits"]["total"]["value"] == 3 and resp["hits"]["max_score"] == pytest.approx(0.7)
    index.put_search_pipeline("hybrid-rrf", {"phase_results_processors": [{"score-ranker-processor": {
        "combination": {"technique": "rrf", "rank_constant": 1}}}]})
    rrf = _hits(index.search({"query": hybrid_query([lexical, neural])}, search_pipeline="hybrid-rrf"))
    # rank constant 1: seoul 1/2 (bm25 rank 1, tie broken by row) + 1/3 (sparse rank 2); busan 1/2; paris 1/3
    assert rrf == [("seoul", pytest.approx(1 / 2 + 1 / 3)), ("busan", pytest.approx(1 / 2)),
                   ("paris", pytest.approx(1 / 3))]
    default = LocalIndex.create(tmp_path / "d", {"properties": {"text": {"type": "text"}}},
                                settings={"index": {"search": {"default_pipeline": "p"}}})
    default.bulk([{"_id": "a", "_source": {"text": "hello world"}}])
    default.put_search_pipeline("p", NORM)
    one = _hits(default.search({"query": hybrid_query([match_query("text", "hello"), match_query("text", "x")])}))
    assert one == [("a", pytest.approx(0.3))]  # a lone hit normalises to 1.0; absent from sub-query 2


def test_hybrid_errors_are_the_servers(index):
    lexical = match_query("text", "수도")
    with pytest.raises(LocalIndexError, match="needs a search pipeline"):
        index.search({"query": hybrid_query([lexical])})
    with pytest.raises(LocalIndexError, match="must be a top level query"):
        index.search({"query": {"bool": {"must": [hybrid_query([lexical])]}}}, search_pipeline=NORM)
    with pytest.raises(LocalIndexError, match="pagination_depth param is missing"):
        index.search({"query": hybrid_query([lexical]), "from": 2}, search_pipeline=NORM)
    with pytest.raises(LocalIndexError, match="Pipeline nope is not defined"):
        index.search({"query": hybrid_query([lexical])}, search_pipeline="nope")
    with pytest.raises(LocalIndexError, match="number of weights"):
        index.search({"query": hybrid_query([lexical, lexical, lexical])}, search_pipeline=NORM)
    two = hybrid_query([lexical, match_query("text", "도시")], pagination_depth=5)
    full = _hits(index.search({"query": two, "size": 3}, search_pipeline=NORM))
    paged = index.search({"query": two, "from": 1, "size": 1}, search_pipeline=NORM)
    assert _hits(paged) == full[1:2] and paged["hits"]["max_score"] == pytest.approx(full[0][1])
