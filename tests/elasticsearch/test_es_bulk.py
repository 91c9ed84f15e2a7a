"""Bulk + the index job on the double: dead letters, retries, a cluster that goes away, resume, nothing lost."""
from __future__ import annotations

import json

import pytest

from opensearch_lsr.elasticsearch.bulk import EsBulkWriter, EsDocumentWriter
from opensearch_lsr.elasticsearch.engine import ElasticsearchEngine
from opensearch_lsr.encoding.job import IndexJobConfig, run_index_job
from opensearch_lsr.engines import Engine, make_engine

TEXTS = [f"서울 문서 {i} 한국 capital {i}" for i in range(12)]


def _corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}, ensure_ascii=False) + "\n"
                            for i, t in enumerate(TEXTS)), encoding="utf-8")
    return path


def _config(tmp_path, corpus):
    # one request at a time: the fault below is injected between two chunks' writes
    return IndexJobConfig(corpus=str(corpus), model="splade-tiny", backend="opensearch", index="docs",
                          work_dir=str(tmp_path / "job"), batch_size=4, chunk_docs=4, bulk_concurrency=1)


def test_engine_protocol_round_trip(es_double, es_client):
    engine = make_engine("elasticsearch", es_client)
    assert isinstance(engine, Engine) and isinstance(engine, ElasticsearchEngine)
    engine.create_index("ko")
    out = engine.bulk("ko", [{"_id": "d1", "_source": {"text": "집", "sparse_embedding": {"집": 1.3, "u.s": 0.7}}},
                             {"_id": "d2", "_source": {"text": "집", "sparse_embedding": {"집": 0.2}}}])
    assert [o.ok for o in out] == [True, True]
    es_client.indices.refresh(index="ko")
    hits = engine.search("ko", {"query": {"sparse_vector": {"field": "sparse_embedding",
                                                            "query_vector": {"집": 2.0, "u__s": 1.0}}}})["hits"]["hits"]
    from es_double import trunc9

    assert [h["_id"] for h in hits] == ["d1", "d2"]
    assert hits[0]["_score"] == pytest.approx(2 * trunc9(1.3) + trunc9(0.7), rel=1e-6)
    assert es_double.violations == []


def test_dead_letters_and_retried_items(es_double, es_client, tmp_path):
    engine = ElasticsearchEngine(es_client)
    engine.create_index("docs")
    es_double.reject_item_ids["d3"] = (400, "document_parsing_exception", "failed to parse field [text]")
    es_double.faults.append(["PUT", r"/_bulk$", 503, 1])
    es_double.faults.append(["POST", r"/_bulk$", 503, 1])
    writer = EsDocumentWriter(EsBulkWriter(es_client, "docs", initial_backoff=0.01, max_backoff=0.02))
    summary = run_index_job(_config(tmp_path, _corpus(tmp_path)), writer=writer, progress=False)
    assert summary["indexed"] == 11 and summary["dead_lettered"] == 1
    dead = [json.loads(l) for l in open(summary["dead_letter_file"], encoding="utf-8")]
    assert dead[0]["_id"] == "d3" and "failed to parse" in dead[0]["reason"]
    assert es_client.count(index="docs")["count"] == 11


def test_cluster_down_stops_with_a_checkpoint_and_resume_loses_nothing(es_double, es_client, tmp_path):
    from opensearch_lsr.opensearch.bulk import BulkWriteError

    ElasticsearchEngine(es_client).create_index("docs")
    corpus = _corpus(tmp_path)
    writer = EsDocumentWriter(EsBulkWriter(es_client, "docs", max_retries=1, initial_backoff=0.01, max_backoff=0.02))
    calls = {"n": 0}
    original = writer.write

    def flaky(actions):
        calls["n"] += 1
        if calls["n"] == 2:
            es_double.faults.extend([["PUT", r"/_bulk$", 503, 50], ["POST", r"/_bulk$", 503, 50]])
        return original(actions)

    writer.write = flaky
    with pytest.raises(BulkWriteError):
        run_index_job(_config(tmp_path, corpus), writer=writer, progress=False)
    es_double.faults.clear()
    es_client.indices.refresh(index="docs")
    assert es_client.count(index="docs")["count"] == 4  # the first chunk was acknowledged and checkpointed
    writer2 = EsDocumentWriter(EsBulkWriter(es_client, "docs"))
    summary = run_index_job(_config(tmp_path, corpus), writer=writer2, resume=True, progress=False)
    assert summary["indexed"] == 12 and summary["dead_lettered"] == 0
    assert es_client.count(index="docs")["count"] == 12


def test_index_options_pruning_applies_when_the_query_does_not_say(es_double, es_client):
    """8.19 / 9.1: a sparse_vector query without `prune` takes the field's index_options; `prune: false` opts out."""
    from opensearch_lsr.elasticsearch.client import detect_es_features
    from opensearch_lsr.elasticsearch.deploy import ClientTransport
    from opensearch_lsr.elasticsearch.indices import create_index, index_body, index_options

    feats = detect_es_features(es_client)
    opts = index_options(feats, prune=True, tokens_freq_ratio_threshold=1, tokens_weight_threshold=0.9)
    create_index(ClientTransport(es_client), "pruned", index_body(feats, options=opts))
    engine = ElasticsearchEngine(es_client, feats)
    docs = {f"d{i}": {"common": 1.0, f"rare{i}": 0.5} for i in range(4)}
    engine.bulk("pruned", [{"_id": k, "_source": {"text": k, "sparse_embedding": v}} for k, v in docs.items()])
    es_client.indices.refresh(index="pruned")
    qv = {"common": 0.5, "rare1": 1.0}
    default = engine.search("pruned", {"query": {"sparse_vector": {"field": "sparse_embedding", "query_vector": qv}}})
    off = engine.search("pruned", {"query": {"sparse_vector": {"field": "sparse_embedding", "query_vector": qv,
                                                               "prune": False}}})
    assert [h["_id"] for h in default["hits"]["hits"]] == ["d1"]  # "common" is frequent and light: pruned
    assert len(off["hits"]["hits"]) == 4
    assert es_double.violations == []


def test_default_pruning_of_new_indices_and_the_toolkits_exact_default(es_double, es_client):
    """Indices created on 9.1+ prune sparse_vector queries by default (getDefaultPruningConfig); the toolkit's
    mapping writes index_options.prune=false so scoring stays exact (= the local backend)."""
    from opensearch_lsr.elasticsearch.indices import index_body

    engine = ElasticsearchEngine(es_client)
    assert index_body(engine.features)["mappings"]["properties"]["sparse_embedding"]["index_options"] == {"prune": False}
    es_client.indices.create(index="raw", mappings={"properties": {"sparse_embedding": {"type": "sparse_vector"}}})
    engine.create_index("exact")
    # 12 docs: "common" has df/N = 1 >= 5 * (24 / 12 / 13), a frequent token; 0.3 <= 0.4 * 1.0 makes it light
    docs = [{"_id": f"d{i}", "_source": {"sparse_embedding": {"common": 1.0, f"rare{i}": 0.5}}} for i in range(12)]
    for name in ("raw", "exact"):
        engine.bulk(name, docs)
        es_client.indices.refresh(index=name)
    body = {"query": {"sparse_vector": {"field": "sparse_embedding", "query_vector": {"common": 0.3, "rare1": 1.0}}}}
    assert [h["_id"] for h in engine.search("raw", body)["hits"]["hits"]] == ["d1"]
    assert len(engine.search("exact", body)["hits"]["hits"]) == 10  # default size, every document matches


def test_dots_refused_before_8_16_accepted_after(monkeypatch):
    from elasticsearch._sync.client import _base
    from es_double import ElasticsearchDouble

    from opensearch_lsr.elasticsearch.client import make_es_client

    # an 8.x server serves an 8.x client only: send its compatible-with=8 headers
    monkeypatch.setattr(_base, "_COMPAT_MIMETYPE_SUB", "application/vnd.elasticsearch+\\g<1>; compatible-with=8")

    for version, ok in (("8.15.0", False), ("9.1.0", True)):
        double = ElasticsearchDouble(version).start()
        try:
            client = make_es_client(double.url, max_retries=0)
            client.indices.create(index="x", mappings={"properties": {"v": {"type": "sparse_vector"}}})
            resp = client.bulk(operations=[{"index": {"_index": "x", "_id": "1"}}, {"v": {"u.s": 1.0}}])
            assert resp["errors"] is (not ok)
            if not ok:
                assert "do not support dots" in resp["items"][0]["index"]["error"]["reason"]
        finally:
            double.stop()
