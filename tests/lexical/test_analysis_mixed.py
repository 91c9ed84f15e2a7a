"""Field analyzers from index settings (the repository's mapping templates) and MIXED graph queries."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mecab_ko")

from opensearch_lsr.lexical.analysis import StandardAnalyzer, analyzer_for_field  # noqa: E402
from opensearch_lsr.lexical.bm25 import LuceneBM25  # noqa: E402
from opensearch_lsr.lexical.nori import DEFAULT_STOP_TAGS, NoriAnalyzer, NoriConfigError  # noqa: E402
from opensearch_lsr.lexical.queries import MatchQuery, match_clause, query_graph  # noqa: E402

MAPPINGS = Path(__file__).resolve().parents[2] / "mappings"


def test_the_mapping_templates_korean_analyzer_resolves_to_nori():
    template = json.loads((MAPPINGS / "rank_features.json").read_text())
    props = {"text": {"type": "text", "analyzer": "korean"}}
    an = analyzer_for_field(props, template["settings"], "text")
    mode = template["settings"]["index"]["analysis"]["tokenizer"]["korean_nori"].get("decompound_mode", "discard")
    assert an == NoriAnalyzer(decompound_mode=mode, stop_tags=DEFAULT_STOP_TAGS, reading_form=True, lowercase=True)
    custom = {"analysis": {"tokenizer": {"k": {"type": "nori_tokenizer", "decompound_mode": "mixed"}},
                           "analyzer": {"a": {"type": "custom", "tokenizer": "k", "filter": ["lowercase"]}}}}
    assert analyzer_for_field({"text": {"analyzer": "a"}}, custom, "text") == NoriAnalyzer(
        decompound_mode="mixed", stop_tags=None, reading_form=False, lowercase=True)
    assert analyzer_for_field({"text": {"type": "text"}}, None, "text") == StandardAnalyzer()
    assert analyzer_for_field({"text": {"type": "text", "analyzer": "nori"}}, {}, "text") == NoriAnalyzer()
    custom = {"analysis": {"tokenizer": {"t": {"type": "nori_tokenizer", "user_dictionary": "u.txt"}},
                           "analyzer": {"a": {"type": "custom", "tokenizer": "t"}}}}
    with pytest.raises(NoriConfigError, match="user_dictionary"):
        analyzer_for_field({"text": {"analyzer": "a"}}, custom, "text")
    custom["analysis"]["tokenizer"]["t"] = {"type": "nori_tokenizer"}
    custom["analysis"]["analyzer"]["a"]["filter"] = ["nori_number"]
    with pytest.raises(NoriConfigError, match="nori_number"):
        analyzer_for_field({"text": {"analyzer": "a"}}, custom, "text")
    with pytest.raises(NoriConfigError, match="has not been configured"):
        analyzer_for_field({"text": {"analyzer": "nope"}}, {}, "text")


def test_mixed_query_is_a_graph_of_the_compound_and_its_parts():
    mixed = NoriAnalyzer(decompound_mode="mixed")
    assert query_graph(mixed.tokens("분석기를 사용")) == [[[("분석기", 0)], [("분석", 0), ("기", 1)]], [[("사용", 3)]]]
    assert query_graph(NoriAnalyzer().tokens("분석기를 사용")) is None  # DISCARD: flat term clauses


def test_mixed_match_scores_by_hand():
    mixed = NoriAnalyzer(decompound_mode="mixed")
    docs = {"a": "형태소 분석기", "b": "분석 결과", "c": "기 분석 방법", "d": "사용 설명", "e": "분석 기법 분석 기"}
    ids = list(docs)
    bm = LuceneBM25.from_tokens(ids, [mixed.tokens(t) for t in docs.values()], mixed, positions=True)
    k1, b = 1.2, 0.75
    n = 5  # every document has tokens
    avgdl = bm.sum_total_term_freq / n

    def idf(term):
        df = sum(term in mixed.analyze(t) for t in docs.values())
        return math.log(1 + (n - df + 0.5) / (df + 0.5))

    def bm25(freq, row, idf_value):  # OpenSearch's LegacyBM25Similarity; lengths < 24 are exact norms
        dl = bm.lengths[row]
        return (1 + k1) * idf_value * freq / (freq + k1 * (1 - b + b * dl / avgdl))

    mask, score = match_clause(bm, MatchQuery("text", "분석기"))
    # SHOULD(term 분석기, phrase "분석 기"): a has the compound (and its parts, adjacent); b has 분석 only;
    # c has 기 then 분석 (wrong order: no phrase); e has "분석 기" once as adjacent words
    assert mask.tolist() == [True, False, False, False, True]
    phrase_idf = idf("분석") + idf("기")
    assert score[0] == pytest.approx(bm25(1, 0, idf("분석기")) + bm25(1, 0, phrase_idf), rel=1e-5)
    assert score[4] == pytest.approx(bm25(1, 4, phrase_idf), rel=1e-5)
    mask, _ = match_clause(bm, MatchQuery("text", "분석기 사용", operator="and"))
    assert not mask.any()
    mask, _ = match_clause(bm, MatchQuery("text", "분석기 사용"))
    assert mask.tolist() == [True, False, False, True, True]
    # the flat index cannot answer phrases
    with pytest.raises(Exception, match="positions=True"):
        match_clause(LuceneBM25.build(docs, mixed), MatchQuery("text", "분석기"))
