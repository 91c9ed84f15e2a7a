"""Slow: the Korean SemBridge model (32,500-id kobigbird vocabulary) through the whole Elasticsearch chain on the
double, against the local backend, on msmarco-ko passages.

Model: ``$LSR_KO_MODEL`` or ``runs/models/ko-sembridge`` (``lsr-os transfer sembridge`` output); skipped without it
or without the shared data. Run: ``pytest -m slow tests/elasticsearch/test_es_korean.py``."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
N_PASSAGES, N_QUERIES = 300, 50


def _model() -> Path:
    path = Path(os.environ.get("LSR_KO_MODEL", Path(__file__).resolve().parents[2] / "runs/models/ko-sembridge"))
    if not (path / "modules.json").is_file():
        pytest.skip(f"no Korean SparseEncoder at {path} (set LSR_KO_MODEL)")
    return path


def test_korean_chain_matches_local(shared_data, tmp_path):
    import torch

    from es_double import ElasticsearchDouble

    from opensearch_lsr.elasticsearch.client import detect_es_features, make_es_client
    from opensearch_lsr.elasticsearch.bulk import EsBulkWriter, EsDocumentWriter
    from opensearch_lsr.elasticsearch.deploy import ClientTransport, EsDeployConfig, deploy_es_model
    from opensearch_lsr.elasticsearch.export import export_elasticsearch
    from opensearch_lsr.elasticsearch.indices import create_index, index_body
    from opensearch_lsr.elasticsearch.query import search_body, sparse_vector_query
    from opensearch_lsr.encoding.job import IndexJobConfig, run_index_job
    from opensearch_lsr.evaluation.datasets import load_beir
    from opensearch_lsr.evaluation.metrics import evaluate_run
    from opensearch_lsr.local.index import LocalIndex

    torch.set_num_threads(1)
    model = str(_model())
    ds = load_beir(shared_data / "msmarco-ko", "dev")
    passages, qrels = {}, {}
    for qid, rels in ds.qrels.items():
        pos = [d for d, r in rels.items() if r > 0 and d in ds.corpus]
        if pos and len(qrels) < N_QUERIES:
            qrels[qid] = {d: 1 for d in pos}
            passages.update({d: ds.corpus[d] for d in pos})
    for did, text in ds.corpus.items():  # distractors
        if len(passages) >= N_PASSAGES:
            break
        passages.setdefault(did, text)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": k, "text": v}, ensure_ascii=False) + "\n" for k, v in passages.items()),
                      encoding="utf-8")
    t0 = time.perf_counter()
    manifest = export_elasticsearch(model, tmp_path / "bundle", verify_texts=list(passages.values())[:40]
                                    + [ds.queries[q] for q in qrels][:40])
    export_s = time.perf_counter() - t0
    assert manifest["conformance"]["passed"], manifest["conformance"]
    assert manifest["vocabulary"]["size"] == 32500 and manifest["do_lower_case"] is False

    double = ElasticsearchDouble("9.1.0").start()
    try:
        client = make_es_client(double.url, request_timeout=600)
        dep = deploy_es_model(tmp_path / "bundle", ClientTransport(client), EsDeployConfig(), progress=False)
        create_index(ClientTransport(client), "ko", index_body(detect_es_features(client)))
        job = dict(corpus=str(corpus), model=model, batch_size=16, chunk_docs=64)
        es_sum = run_index_job(IndexJobConfig(backend="opensearch", index="ko", work_dir=str(tmp_path / "j1"), **job),
                               writer=EsDocumentWriter(EsBulkWriter(client, "ko")), progress=False)
        run_index_job(IndexJobConfig(backend="local", index=str(tmp_path / "local"), **job), progress=False)
        local = LocalIndex.open(tmp_path / "local")
        local.refresh()
        es_run, local_run = {}, {}
        for qid in qrels:
            text = ds.queries[qid]
            es = client.search(index="ko", body=search_body(sparse_vector_query(
                "sparse_embedding", inference_id=dep["model_id"], query=text), size=100)).body
            lo = local.search({"query": {"sparse_vector": {"field": "sparse_embedding", "inference_id": model,
                                                           "query": text}}, "size": 100})
            es_run[qid] = {h["_id"]: h["_score"] for h in es["hits"]["hits"]}
            local_run[qid] = {h["_id"]: h["_score"] for h in lo["hits"]["hits"]}
            assert list(es_run[qid])[:10] == list(local_run[qid])[:10], qid
        es_m, local_m = evaluate_run(qrels, es_run), evaluate_run(qrels, local_run)
        print(json.dumps({"export_s": round(export_s, 1), "indexed": es_sum["indexed"], "es": es_m, "local": local_m,
                          "tokenizer": manifest["conformance"]["tokenizer"]["identical"],
                          "max_abs_weight_diff": manifest["conformance"]["max_abs_weight_diff"]}))
        assert es_m == pytest.approx(local_m) and double.violations == []
    finally:
        double.stop()
