"""The end-to-end flow of tests/opensearch/test_e2e.py against a real OpenSearch (marker ``opensearch``)."""
from __future__ import annotations

import json
import uuid
import zipfile

import pytest

pytestmark = pytest.mark.opensearch


def test_real_flow(real_client, shared_data, tmp_path):
    from opensearchpy.helpers import bulk
    from tokenizers import Tokenizer

    from opensearch_lsr.evaluation.datasets import load_beir
    from opensearch_lsr.opensearch import indices as ix
    from opensearch_lsr.opensearch.artifacts import export_bundle
    from opensearch_lsr.opensearch.client import detect_features
    from opensearch_lsr.opensearch.mlcommons import DeployConfig, deploy_bundle, predict_sparse
    from opensearch_lsr.opensearch.query import tokenize_query

    client = real_client
    features = detect_features(client)
    assert features.sparse_models
    ds = load_beir(shared_data / "msmarco-ko", "dev")
    answers = {}
    passages = {}
    for qid, rels in ds.qrels.items():
        pos = [d for d, r in rels.items() if r > 0 and d in ds.corpus]
        if pos and len(passages) < 200:
            answers[qid] = pos[0]
            passages.update({d: ds.corpus[d] for d in pos})
    passages = dict(list(passages.items())[:200])
    answers = {q: d for q, d in answers.items() if d in passages}

    bundle = tmp_path / "bundle"
    export_bundle("splade-tiny", bundle, verify=False)
    ids = deploy_bundle(client, bundle, DeployConfig(apply_settings=True, model_group="lsr-real-suite"),
                        features=features)
    again = deploy_bundle(client, bundle, DeployConfig(), features=features)  # idempotent
    assert again["sparse_encoding"] == ids["sparse_encoding"]
    enc, tok = ids["sparse_encoding"], ids["sparse_tokenize"]
    [weights] = predict_sparse(client, enc, ["서울은 한국의 수도이다"])
    assert weights and all(v > 0 for v in weights.values())

    suffix = uuid.uuid4().hex[:8]
    index, ingest = f"lsr-real-{suffix}", f"lsr-real-ingest-{suffix}"
    ix.put_ingest_pipeline(client, ingest, ix.ingest_pipeline_body(enc, features))
    try:
        created = ix.create_index(client, index, "rank_features", features, ingest_pipeline=ingest)
        ok, errors = bulk(client, ({"_index": index, "_id": p, "_source": {"id": p, "text": t}}
                                   for p, t in passages.items()), chunk_size=20, raise_on_error=False,
                          request_timeout=600)
        assert ok == len(passages) and not errors, errors[:2]
        client.indices.refresh(index=index)
        with zipfile.ZipFile(bundle / "sparse_tokenize.zip") as zf:
            idf = json.loads(zf.read("idf.json")) if "idf.json" in zf.namelist() else None
            (tmp_path / "tok.json").write_bytes(zf.read("tokenizer.json"))
        tokenizer = Tokenizer.from_file(str(tmp_path / "tok.json"))
        rr = []
        for qid, doc in list(answers.items())[:20]:
            q = ds.queries[qid]
            res = client.search(index=index, body={"size": 10, "query": {"neural_sparse": {"sparse_embedding": {
                "query_text": q, "model_id": enc}}}})
            ranked = [h["_id"] for h in res["hits"]["hits"]]
            rr.append(1 / (ranked.index(doc) + 1) if doc in ranked else 0.0)
            if features.query_tokens:
                tokens = {k: min(v, 64.0) for k, v in tokenize_query(q, tokenizer, idf).items() if v > 0}
                via_tokens = client.search(index=index, body={"size": 10, "query": {"neural_sparse": {
                    "sparse_embedding": {"query_tokens": tokens}}}})
                via_model = client.search(index=index, body={"size": 10, "query": {"neural_sparse": {
                    "sparse_embedding": {"query_text": q, "model_id": tok}}}})
                assert [h["_id"] for h in via_tokens["hits"]["hits"]] == [h["_id"] for h in via_model["hits"]["hits"]]
        assert sum(rr) / len(rr) > 0.05, created
    finally:
        client.indices.delete(index=index, ignore_unavailable=True)
        client.ingest.delete_pipeline(id=ingest, ignore=[404])
