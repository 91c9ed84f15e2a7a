"""The chain against a real Elasticsearch (8.15+ / 9.x): export -> deploy -> ingest pipeline and bulk -> queries.

Checks what the double cannot: that Elasticsearch loads the TorchScript (ml-cpp's graph validator),
that its tokenizer + the model give the same tokens as the toolkit's encoder, that nori exists."""
from __future__ import annotations

import json
import uuid

import pytest

pytestmark = pytest.mark.elasticsearch

TEXTS = {"d1": "서울은 대한민국의 수도이다.", "d2": "고양이가 집에서 잔다.", "d3": "Seoul is the capital of South Korea."}


@pytest.fixture(scope="module")
def deployed(real_es, tmp_path_factory, splade_tiny_dir):
    from opensearch_lsr.elasticsearch.client import detect_es_features
    from opensearch_lsr.elasticsearch.deploy import ClientTransport, EsDeployConfig, deploy_es_model
    from opensearch_lsr.elasticsearch.export import export_elasticsearch

    out = tmp_path_factory.mktemp("es_real")
    export_elasticsearch(str(splade_tiny_dir), out, model_id="lsr-real-test")
    res = deploy_es_model(out, ClientTransport(real_es), EsDeployConfig(inference_endpoint="lsr-real-test-ep",
                                                                        replace=True), progress=False)
    return {"bundle": out, "features": detect_es_features(real_es), **res}


def test_model_side_tokens_equal_the_encoder(real_es, deployed):
    from opensearch_lsr.elasticsearch.runtime import TextExpansionRuntime

    runtime = TextExpansionRuntime.from_export(deployed["bundle"] / "elasticsearch")
    resp = real_es.perform_request("POST", f"/_ml/trained_models/{deployed['model_id']}/_infer",
                                   body={"docs": [{"text_field": t} for t in TEXTS.values()]},
                                   headers={"content-type": "application/json", "accept": "application/json"}).body
    for result, want in zip(resp["inference_results"], runtime.infer(list(TEXTS.values()))):
        got = result["predicted_value"]
        assert set(got) == set(want)
        assert max(abs(got[k] - want[k]) for k in want) < 1e-3


def test_index_pipeline_bulk_and_queries(real_es, deployed):
    from opensearch_lsr.elasticsearch.deploy import ClientTransport
    from opensearch_lsr.elasticsearch.indices import create_index, index_body, pipeline_body, put_pipeline
    from opensearch_lsr.elasticsearch.query import rrf_body, search_body, sparse_vector_query

    feats = deployed["features"]
    name = f"lsr-real-{uuid.uuid4().hex[:8]}"
    t = ClientTransport(real_es)
    put_pipeline(t, name, pipeline_body(deployed["model_id"]))
    create_index(t, name, index_body(feats, default_pipeline=name))
    try:
        ops = "".join(json.dumps({"index": {"_index": name, "_id": k}}) + "\n" + json.dumps({"text": v}) + "\n"
                      for k, v in TEXTS.items())
        assert not real_es.bulk(operations=ops, refresh=True)["errors"]
        body = search_body(sparse_vector_query("sparse_embedding", inference_id=deployed["model_id"],
                                               query="capital of Korea"))
        hits = real_es.search(index=name, body=body)["hits"]["hits"]
        assert hits and hits[0]["_id"] in ("d1", "d3")
        if feats.rrf_retriever:
            clause = sparse_vector_query("sparse_embedding", inference_id=deployed["model_id"], query="수도")
            assert real_es.search(index=name, body=rrf_body("text", "수도", clause))["hits"]["hits"]
    finally:
        real_es.options(ignore_status=404).indices.delete(index=name)
