"""Field analyzers from index settings (the repository's mapping templates) and MIXED graph queries."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mecab_ko")

from opensearch_lsr.lexical.analysis import StandardAnalyzer, analyzer_for_field  # noqa: E402
from opensearch_lsr.lexical.bm25 import LuceneBM25  # noqa: E402
from opensearch_lsr.lexical.nori import DEFAULT_STOP_TAGS, NoriAnalyzer, NoriConfigError  # noqa: E402
from opensearch_lsr.lexical.queries import MatchQuery, match_clause, query_graph  # noqa: E402

MAPPINGS = Path(__file__).resolve().parents[2] / "mappings"


def test_the_mapping_templates_korean_analyzer_is_mixed_nori():
    template = json.loads((MAPPINGS / "rank_features.json").read_text())
    props = {"text": {"type": "text", "analyzer": "korean"}}
    an = analyzer_for_field(props, template["settings"], "text")
    assert an == NoriAnalyzer(decompound_mode="mixed", stop_tags=DEFAULT_STOP_TAGS, reading_form=True, lowercase=True)
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
    assert query_graph(mixed.tokens("분석기를 사용")) == [[["분석기"], ["분석", "기"]], [["사용"]]]
    assert query_graph(NoriAnalyzer().tokens("분석기를 사용")) is None  # DISCARD: flat term clauses


def test_mixed_match_scores_by_hand():
    mixed = NoriAnalyzer(decompound_mode="mixed")
    docs = {"a": "형태소 분석기", "b": "분석 결과", "c": "기 분석 방법", "d": "사용 설명"}
    bm = LuceneBM25.build(docs, mixed)

    def s(term):
        rows, scores = bm.term_scores(term)
        out = np.zeros(len(docs))
        out[rows] = scores
        return out

    mask, score = match_clause(bm, MatchQuery("text", "분석기"))
    # a: the compound and both parts match (both alternatives); b: 분석 alone completes no path;
    # c: 분석 + 기 complete the parts path; d: nothing
    assert mask.tolist() == [True, False, True, False]
    assert score[0] == pytest.approx(s("분석기")[0] + s("분석")[0] + s("기")[0], rel=1e-6)
    assert score[2] == pytest.approx(s("분석")[2] + s("기")[2], rel=1e-6)
    mask, _ = match_clause(bm, MatchQuery("text", "분석기 사용", operator="and"))
    assert not mask.any()
    mask, _ = match_clause(bm, MatchQuery("text", "분석기 사용"))
    assert mask.tolist() == [True, False, True, True]
