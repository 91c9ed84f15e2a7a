"""The whole chain on a real node (marker ``opensearch``): deploy, _predict, indices, pipelines, every
search mode, eval against the local backend, and the one-line errors; figures go to OPENSEARCH_FIGURES.

Data: the first 100 judged msmarco-ko dev queries and 500 passages (their judged ones first), written
as a BEIR folder so the cluster and the local backend see exactly the same corpus. Model: SPLADE-tiny
(an English BertForMaskedLM; its Korean relevance is low, which does not matter for agreement).
"""
from __future__ import annotations

import json
import statistics
import time
import uuid

import pytest

pytestmark = pytest.mark.opensearch

N_QUERIES, N_DOCS = 100, 500


def _name(prefix: str) -> str:
    return f"lsr-real-{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def subset(shared_data, tmp_path_factory):
    from opensearch_lsr.evaluation.datasets import cap_corpus, load_beir

    ds = cap_corpus(load_beir(shared_data / "msmarco-ko", "dev").subset(N_QUERIES), N_DOCS)
    root = tmp_path_factory.mktemp("msmarco_ko_subset")
    (root / "qrels").mkdir()
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for did, text in ds.corpus.items():
            fh.write(json.dumps({"_id": did, "title": "", "text": text}, ensure_ascii=False) + "\n")
    with open(root / "queries.jsonl", "w", encoding="utf-8") as fh:
        for qid, text in ds.queries.items():
            fh.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
    (root / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{r}\n" for q, rels in ds.qrels.items() for d, r in rels.items()), encoding="utf-8")
    return root, ds


@pytest.fixture(scope="module")
def model_ids(run_cli, real_bundle, figures):
    """deploy-model (both models) twice through the CLI: the second run reuses the first's ids."""
    t0 = time.perf_counter()
    _, out = run_cli("deploy-model", real_bundle, "--apply-settings", "--model-group", "lsr-real-suite")
    first = json.loads(out)
    figures["deploy_both_s"] = round(time.perf_counter() - t0, 2)
    _, out = run_cli("deploy-model", real_bundle)
    second = json.loads(out)
    return first, second


@pytest.fixture(scope="module")
def indices(run_cli, real_client, model_ids, subset, tmp_path_factory, figures):
    """One index filled through the ingest pipeline (text only) and one with precomputed vectors (lsr-os index),
    both with a nori text field; deleted at the end."""
    from opensearchpy.helpers import bulk

    root, ds = subset
    enc = model_ids[0]["sparse_encoding"]
    pipeline, piped, pre, raw = _name("ingest"), _name("piped"), _name("pre"), _name("raw")
    run_cli("create-pipeline", "ingest", pipeline, "--model-id", enc)
    run_cli("create-index", piped, "--pipeline", pipeline, "--text-analyzer", "nori")
    run_cli("create-index", pre, "--text-analyzer", "nori")
    run_cli("create-index", raw, "--text-analyzer", "nori")
    try:
        t0 = time.perf_counter()
        ok, errors = bulk(real_client, ({"_index": piped, "_id": d, "_source": {"text": t}} for d, t in ds.corpus.items()),
                          chunk_size=100, raise_on_error=False, request_timeout=600)
        figures["bulk_through_pipeline_docs_per_s"] = round(len(ds.corpus) / (time.perf_counter() - t0), 1)
        assert ok == len(ds.corpus) and not errors, errors[:2]
        t0 = time.perf_counter()
        # one request at a time: Lucene's doc ids then follow the corpus order, as the local backend's rows do, and
        # neural-search orders exact hybrid ties by doc id (the z-score comparison below depends on it)
        _, out = run_cli("index", "--corpus", root / "corpus.jsonl", "--model", "splade-tiny", "--backend", "opensearch",
                         "--index", pre, "--work-dir", tmp_path_factory.mktemp("job"), "--no-progress",
                         "--bulk-concurrency", "1")
        figures["lsr_os_index_encode_and_bulk_docs_per_s"] = round(len(ds.corpus) / (time.perf_counter() - t0), 1)
        assert json.loads(out)["indexed"] == len(ds.corpus)
        real_client.indices.refresh(index=f"{piped},{pre}")
        docs = [{"_index": raw, "_id": h["_id"], "_source": h["_source"]} for h in
                real_client.search(index=pre, body={"size": len(ds.corpus), "query": {"match_all": {}}})["hits"]["hits"]]
        t0 = time.perf_counter()
        ok, _ = bulk(real_client, docs, chunk_size=500, pipeline="_none", request_timeout=600)
        figures["bulk_precomputed_vectors_docs_per_s"] = round(ok / (time.perf_counter() - t0), 1)
        yield {"piped": piped, "pre": pre, "pipeline": pipeline, "enc": enc, "tok": model_ids[0]["sparse_tokenize"]}
    finally:
        for index in (piped, pre, raw):
            real_client.indices.delete(index=index, ignore_unavailable=True)
        real_client.ingest.delete_pipeline(id=pipeline, ignore=[404])


def test_airgap_failure_is_named_and_the_kit_fixes_it(djl_cache_ready):
    from opensearch_lsr.opensearch.djl_cache import check_cache

    if djl_cache_ready is None or djl_cache_ready["seeded_before"]:
        pytest.skip("not a node started by cluster.py with an empty PyTorch cache")
    assert djl_cache_ready["unseeded_deploy"] == "failed"
    assert "publish.djl.ai" in djl_cache_ready["error"] and "lsr-os airgap-kit" in djl_cache_ready["error"]
    assert check_cache(djl_cache_ready["installed"]) == []
    assert djl_cache_ready["model_id"]


def test_deploy_model_twice_is_idempotent(model_ids):
    first, second = model_ids
    for key in ("sparse_encoding", "sparse_tokenize"):
        assert second[key] == first[key]
        assert second["reused"][key] == "deployed"


def test_predict_equals_the_local_encoder(real_client, model_ids, real_bundle, subset, figures):
    from opensearch_lsr.opensearch.conformance import MLCommonsRuntime, _reference_maps
    from opensearch_lsr.opensearch.mlcommons import predict_sparse
    from opensearch_lsr.resources import splade_tiny_path

    _, ds = subset
    texts = list(ds.queries.values())[:4] + list(ds.corpus.values())[:4] + ["the river flows " * 200]
    got = predict_sparse(real_client, model_ids[0]["sparse_encoding"], texts)
    runtime = MLCommonsRuntime.from_zip(real_bundle / "sparse_encoding.zip")
    manifest = json.loads((real_bundle / "manifest.json").read_text())
    expected = _reference_maps(splade_tiny_path(), texts, runtime.decode_table, manifest.get("special_token_ids") or [],
                               None, "word", runtime.max_length)
    worst = 0.0
    for g, e in zip(got, expected):
        assert set(g) == set(e)
        worst = max(worst, max(abs(g[k] - e[k]) for k in g))
    figures["predict_max_abs_diff_vs_local_encoder"] = worst
    assert worst <= 1e-5
    tok_rt = MLCommonsRuntime.from_zip(real_bundle / "sparse_tokenize.zip", "SPARSE_TOKENIZE")
    tok_got = predict_sparse(real_client, model_ids[0]["sparse_tokenize"], texts[:4], algorithm="sparse_tokenize")
    for g, e in zip(tok_got, tok_rt.predict(texts[:4])):
        assert set(g) == set(e) and max(abs(g[k] - e[k]) for k in g) <= 1e-6


def test_create_index_both_kinds(run_cli, real_client):
    names = [_name("rf"), _name("sv")]
    try:
        run_cli("create-index", names[0], "--text-analyzer", "nori")
        run_cli("create-index", names[1], "--kind", "sparse_vector", "--vocab-size", 30522)
        props = [real_client.indices.get_mapping(index=n)[n]["mappings"]["properties"] for n in names]
        assert props[0]["sparse_embedding"]["type"] == "rank_features"
        analyzer = props[0]["text"]["analyzer"]
        analysis = real_client.indices.get_settings(index=names[0])[names[0]]["settings"]["index"]["analysis"]
        assert analysis["tokenizer"][analysis["analyzer"][analyzer]["tokenizer"]]["type"] == "nori_tokenizer"
        tokens = real_client.indices.analyze(index=names[0], body={"field": "text", "text": "서울은 한국의 수도이다"})
        assert [t["token"] for t in tokens["tokens"]][:2] == ["서울", "한국"]  # particles stopped by nori's POS filter
        assert props[1]["sparse_embedding"]["type"] == "sparse_vector"
    finally:
        for n in names:
            real_client.indices.delete(index=n, ignore_unavailable=True)


def test_pipeline_vectors_equal_precomputed_ones(real_client, indices, subset):
    _, ds = subset
    ids = list(ds.corpus)[:20]
    piped = real_client.mget(index=indices["piped"], body={"ids": ids})["docs"]
    pre = real_client.mget(index=indices["pre"], body={"ids": ids})["docs"]
    for a, b in zip(piped, pre):
        va, vb = a["_source"]["sparse_embedding"], b["_source"]["sparse_embedding"]
        assert set(va) == set(vb), a["_id"]
        assert max(abs(va[k] - vb[k]) for k in va) <= 1e-4


def _ids(output: str) -> list[str]:
    return [line.split()[2] for line in output.splitlines() if line.strip()[:1].isdigit() and ". " in line[:6]]


def test_every_search_mode(run_cli, real_client, indices, subset, figures):
    _, ds = subset
    index = indices["pre"]
    queries = list(ds.queries.values())[:5]
    for q in queries:
        _, tokens = run_cli("search", q, "--index", index, "--backend", "opensearch", "--mode", "tokens",
                            "--model", "splade-tiny")
        _, model = run_cli("search", q, "--index", index, "--backend", "opensearch", "--mode", "model",
                           "--model-id", indices["enc"])
        assert _ids(tokens) and _ids(tokens) == _ids(model), (q, tokens, model)
        _, piped = run_cli("search", q, "--index", indices["piped"], "--backend", "opensearch", "--mode", "model",
                           "--model-id", indices["enc"])
        assert _ids(piped) == _ids(model)
    _, analyzer = run_cli("search", queries[0], "--index", index, "--backend", "opensearch", "--mode", "analyzer",
                          "--analyzer", "bert-uncased")
    assert _ids(analyzer)
    _, hybrid = run_cli("search", queries[0], "--index", index, "--backend", "opensearch", "--mode", "hybrid",
                        "--model", "splade-tiny")
    assert _ids(hybrid)
    two_phase = _name("2p")
    run_cli("create-pipeline", "two-phase", two_phase, "--index", indices["piped"])
    try:
        for q in queries:
            _, plain = run_cli("search", q, "--index", index, "--backend", "opensearch", "--mode", "model",
                               "--model-id", indices["enc"])
            _, phased = run_cli("search", q, "--index", indices["piped"], "--backend", "opensearch", "--mode", "model",
                                "--model-id", indices["enc"])
            assert _ids(phased)[:5] == _ids(plain)[:5]
    finally:
        real_client.indices.put_settings(index=indices["piped"], body={"index.search.default_pipeline": "_none"})
        real_client.transport.perform_request("DELETE", f"/_search/pipeline/{two_phase}")
    from opensearch_lsr.opensearch.query import neural_sparse_query, query_tokens_for, search_body

    took, wall = [], []
    for q in ds.queries.values():
        body = search_body(neural_sparse_query("sparse_embedding", query_tokens=query_tokens_for(q, "splade-tiny")),
                           size=10, source=False)
        t0 = time.perf_counter()
        res = real_client.search(index=index, body=body)
        wall.append(1000 * (time.perf_counter() - t0))
        took.append(res["took"])
    figures["query_tokens_latency_ms"] = {"queries": len(wall), "p50_wall": round(statistics.median(wall), 2),
                                          "p50_took": statistics.median(took), "docs": len(ds.corpus)}


def test_eval_through_the_cluster_equals_the_local_backend(run_cli, indices, subset, tmp_path, figures):
    root, _ = subset
    common = ["eval", "--dataset", root, "--model", "splade-tiny", "--prune-levels", "", "--baseline", "bm25-nori",
              "--hybrid", "min_max"]
    _, out = run_cli(*common, "--backend", "opensearch", "--index", indices["pre"], "--out", tmp_path / "os")
    cluster = json.loads(out)
    _, out = run_cli(*common, "--backend", "local", "--out", tmp_path / "local", conn=False)
    local = json.loads(out)
    figures["eval"] = {"queries": N_QUERIES, "docs": N_DOCS, "cluster": cluster["metrics"], "local": local["metrics"],
                       "rows_cluster": cluster.get("rows"), "rows_local": local.get("rows")}
    for metric in ("mrr@10", "ndcg@10", "recall@100"):
        assert cluster["metrics"][metric] == pytest.approx(local["metrics"][metric], abs=5e-5), metric
    # the nori BM25 row and the min-max hybrid: Lucene's nori + BM25 on the node vs the toolkit's NoriAnalyzer + BM25
    for row_c, row_l in zip(cluster["rows"], local["rows"]):
        assert row_c["system"] == row_l["system"]
        for metric in ("mrr@10", "ndcg@10", "recall@100"):
            assert row_c[metric] == pytest.approx(row_l[metric], abs=5e-5), (row_c["system"], metric)


def _one_line_error(code: int, output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and lines[0].startswith("Error: "), output
    return lines[0]


def test_bad_inputs_fail_in_one_line(run_cli, real_client, indices, real_bundle):
    line = _one_line_error(*run_cli("search", "서울", "--index", indices["pre"], "--backend", "opensearch", "--mode",
                                    "model", "--model-id", "no-such-model", ok=False))
    assert "no-such-model" in line or "model" in line.lower()
    line = _one_line_error(*run_cli("search", "서울", "--index", indices["pre"], "--backend", "opensearch",
                                    "--mode", "tokens", "--model", "splade-tiny", "--field", "text", ok=False))
    assert "text" in line
    line = _one_line_error(*run_cli("create-index", indices["pre"], ok=False))
    assert indices["pre"] in line
    setting = "plugins.ml_commons.allow_registering_model_via_local_file"
    real_client.cluster.put_settings(body={"persistent": {setting: False}})
    try:
        other = real_bundle.parent / "other"
        from opensearch_lsr.opensearch.artifacts import export_bundle

        export_bundle("splade-tiny", other, verify=False, prune="max_ratio:0.5")  # another hash: must register
        line = _one_line_error(*run_cli("deploy-model", other, "--which", "encoding", ok=False))
        assert "--apply-settings" in line
    finally:
        real_client.cluster.put_settings(body={"persistent": {setting: True}})
