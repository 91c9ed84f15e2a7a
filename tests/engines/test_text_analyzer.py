"""Local indices analyse their text field as the ``mappings/`` templates do (nori), so ``match`` and
hybrid queries on an index made by ``lsr-os index --backend local`` or ``LocalEngine`` are nori BM25."""
from __future__ import annotations

import pytest

from opensearch_lsr.contract import DEFAULT_TEXT_ANALYZER, DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD
from opensearch_lsr.encoding.documents import flat_mapping, nested_mapping
from opensearch_lsr.lexical.analysis import analyzer_for_field
from opensearch_lsr.opensearch.indices import load_template, render

DOC = "대한민국의 수도는 서울이다"
QUERY = "서울"  # nori splits 서울이다 -> 서울 + 이 (dropped VCP) + 다 (dropped EF); standard keeps 서울이다


@pytest.mark.parametrize("kind", ["rank_features", "sparse_vector"])
def test_the_local_default_analyses_like_the_templates(kind):
    body = render(load_template("mappings", kind), {"text_field": DEFAULT_TEXT_FIELD,
                                                    "vector_field": DEFAULT_VECTOR_FIELD, "ingest_pipeline": None})
    template = analyzer_for_field(body["mappings"]["properties"], body["settings"], DEFAULT_TEXT_FIELD)
    for mapping in (flat_mapping(), nested_mapping()):
        local = analyzer_for_field(mapping["properties"], None, DEFAULT_TEXT_FIELD)
        assert local.settings() == template.settings()
    assert template.analyze(DOC) == analyzer_for_field(flat_mapping()["properties"], None, "text").analyze(DOC)
    assert QUERY in template.analyze(DOC)
    assert flat_mapping(text_analyzer=None)["properties"][DEFAULT_TEXT_FIELD] == {"type": "text"}


def _match(search) -> list[str]:
    body = {"query": {"match": {DEFAULT_TEXT_FIELD: QUERY}}, "size": 10}
    return [h["_id"] for h in search(body)["hits"]["hits"]]


def test_local_engine_index_answers_match_with_nori(tmp_path):
    from opensearch_lsr.local.engine import LocalEngine

    engine = LocalEngine(tmp_path)
    engine.create_index("idx")
    engine.bulk("idx", [{"_id": "d1", "_source": {DEFAULT_TEXT_FIELD: DOC}},
                        {"_id": "d2", "_source": {DEFAULT_TEXT_FIELD: "파리는 프랑스의 수도"}}])
    assert _match(lambda body: engine.search("idx", body)) == ["d1"]


def test_index_job_local_writer_answers_match_with_nori(tmp_path):
    from opensearch_lsr.encoding.job import IndexJobConfig, make_writer

    writer = make_writer(IndexJobConfig(corpus=str(tmp_path / "c.jsonl"), model="unused", backend="local",
                                        index=str(tmp_path / "idx")))
    assert writer.index.mappings["properties"][DEFAULT_TEXT_FIELD]["analyzer"] == DEFAULT_TEXT_ANALYZER
    writer.write([{"_id": "d1", "_source": {DEFAULT_TEXT_FIELD: DOC}}])
    writer.close()
    assert _match(writer.index.search) == ["d1"]
