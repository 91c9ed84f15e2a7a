"""Cluster behaviour the test double follows, checked on a real cluster (marker ``opensearch``; ``docker compose
up`` then ``pytest -m opensearch``):
- model documents carry the function name in ``algorithm`` (deploy-model is idempotent);
- create-index -> index -> search -> eval work with no field flags;
- sparse_vector (3.3+): token-id documents are found by ``search --mode tokens``; word keys without
   method_parameters give zero hits on 3.3 (not a 400); ``method_parameters.k`` caps the hits;
- bulk of precomputed vectors bypasses a default ingest pipeline; a missing index is refused before
   loading; ``--long-text split`` documents index into the nested mapping and are found;
- ``--engine ray``: actors writing their own ``_bulk`` requests, stopped and resumed, load every document once.
"""
from __future__ import annotations

import json
import uuid

import pytest

pytestmark = pytest.mark.opensearch

DOCS = {
    "d1": "the river flows past the old stone bridge near the town",
    "d2": "a recipe for baking sourdough bread with a crisp crust",
    "d3": "stock markets fell sharply after the interest rate decision",
    "d4": "the museum displays ancient pottery and bronze statues",
}


@pytest.fixture
def cli_out(run_cli):
    """``lsr-os`` with the cluster's connection flags: its stdout (exit code 0 asserted)."""
    return lambda *args: run_cli(*args)[1]


def _top(output: str) -> str:
    return next(line for line in output.splitlines() if line.strip().startswith("1.")).split()[2]


@pytest.fixture
def names(real_client):
    made: list[str] = []

    def name(prefix: str) -> str:
        made.append(f"lsr-real-{prefix}-{uuid.uuid4().hex[:8]}")
        return made[-1]

    yield name
    for index in made:
        real_client.indices.delete(index=index, ignore_unavailable=True)


def _corpus(tmp_path, long: bool = False):
    path = tmp_path / ("long.jsonl" if long else "corpus.jsonl")
    with open(path, "w", encoding="utf-8") as fh:
        for did, text in DOCS.items():
            fh.write(json.dumps({"_id": did, "title": "", "text": (text + " ") * (60 if long else 1)}) + "\n")
    return path


def test_model_documents_use_algorithm_and_deploy_is_idempotent(real_client, tmp_path):
    from opensearch_lsr.opensearch.artifacts import export_bundle
    from opensearch_lsr.opensearch.mlcommons import DeployConfig, deploy_bundle

    bundle = tmp_path / "bundle"
    manifest = export_bundle("splade-tiny", bundle, verify=False)
    first = deploy_bundle(real_client, bundle, DeployConfig(apply_settings=True, which="encoding"))
    second = deploy_bundle(real_client, bundle, DeployConfig(which="encoding"))
    assert second["sparse_encoding"] == first["sparse_encoding"] and second["reused"] == {"sparse_encoding": "deployed"}
    sha = manifest["sparse_encoding"]["sha256"]
    ml = real_client.plugins.ml

    def hits(field: str) -> set[str]:
        body = {"query": {"bool": {"filter": [{"term": {"model_content_hash_value": sha}},
                                              {"term": {field: "SPARSE_ENCODING"}}],
                                   "must_not": [{"exists": {"field": "chunk_number"}}]}}, "size": 100}
        return {h["_id"] for h in ml.search_models(body=body)["hits"]["hits"]}

    assert first["sparse_encoding"] in hits("algorithm")
    assert hits("function_name") == set()  # the field the old look-up used: never matches
    doc = ml.get_model(model_id=first["sparse_encoding"])
    assert doc.get("algorithm") == "SPARSE_ENCODING"


def test_default_chain_needs_no_field_flags(real_client, tmp_path, names, cli_out):
    index = names("chain")
    cli_out("create-index", index)
    out = json.loads(cli_out("index", "--corpus", _corpus(tmp_path), "--model", "splade-tiny", "--backend", "opensearch",
                          "--index", index, "--work-dir", tmp_path / "job", "--no-progress"))
    assert out["indexed"] == len(DOCS)
    found = cli_out("search", "sourdough bread recipe", "--index", index, "--backend", "opensearch", "--mode", "tokens",
                 "--model", "splade-tiny")
    assert _top(found) == "d2"
    data = tmp_path / "beir"
    (data / "qrels").mkdir(parents=True)
    (data / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n"
                                               for d, t in DOCS.items()))
    queries = {"q1": "sourdough bread recipe", "q2": "bronze statues in the museum"}
    (data / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    (data / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\nq2\td4\t1\n")
    report = json.loads(cli_out("eval", "--dataset", data, "--model", "splade-tiny", "--backend", "opensearch",
                             "--index", index, "--prune-levels", "", "--out", tmp_path / "eval"))
    assert report["metrics"]["mrr@10"] == pytest.approx(1.0)


def test_sparse_vector_token_ids(real_client, tmp_path, names, cli_out):
    from opensearchpy.exceptions import RequestError

    from opensearch_lsr.opensearch.client import detect_features

    features = detect_features(real_client)
    if not features.sparse_vector:
        pytest.skip(f"sparse_vector needs OpenSearch 3.3+, the cluster runs {features.version_string}")
    index = names("ann")
    cli_out("create-index", index, "--kind", "sparse_vector", "--vocab-size", 30522)
    cli_out("index", "--corpus", _corpus(tmp_path), "--model", "splade-tiny", "--backend", "opensearch", "--index", index,
         "--key-format", "token_id", "--work-dir", tmp_path / "job", "--no-progress")
    found = cli_out("search", "ancient bronze statues in a museum", "--index", index, "--backend", "opensearch", "--mode",
                 "tokens", "--model", "splade-tiny", "--ann-k", 2)
    assert _top(found) == "d4"
    word = {"query": {"neural_sparse": {"sparse_embedding": {"query_tokens": {"museum": 1.0}}}}}
    if features.version[:2] == (3, 3):
        assert real_client.search(index=index, body=word)["hits"]["total"]["value"] == 0
    else:  # 3.4+: the ANN builder is always on and wants integer ids
        with pytest.raises(RequestError):
            real_client.search(index=index, body=word)
    ids = {"query": {"neural_sparse": {"sparse_embedding": {"query_tokens": {"1996": 1.0},  # "the"
                                                            "method_parameters": {"k": 1}}}}, "size": 10}
    assert len(real_client.search(index=index, body=ids)["hits"]["hits"]) <= 1


def test_bulk_bypasses_the_default_pipeline_and_checks_the_target(real_client, tmp_path, names, cli_out):
    from opensearch_lsr.opensearch import indices as ix
    from opensearch_lsr.opensearch.artifacts import export_bundle
    from opensearch_lsr.opensearch.bulk import BulkTargetError, OpenSearchBulkWriter
    from opensearch_lsr.opensearch.client import detect_features
    from opensearch_lsr.opensearch.mlcommons import DeployConfig, deploy_bundle

    features = detect_features(real_client)
    with pytest.raises(BulkTargetError, match="does not exist"):
        OpenSearchBulkWriter(real_client, names("missing")).check_target("sparse_embedding")
    bundle = tmp_path / "bundle"
    export_bundle("splade-tiny", bundle, verify=False)
    enc = deploy_bundle(real_client, bundle, DeployConfig(apply_settings=True, which="encoding"))["sparse_encoding"]
    pipeline = names("ingest")
    ix.put_ingest_pipeline(real_client, pipeline, ix.ingest_pipeline_body(enc, features))
    index = names("piped")
    try:
        ix.create_index(real_client, index, "rank_features", features, ingest_pipeline=pipeline)
        writer = OpenSearchBulkWriter(real_client, index, refresh="true")
        writer.check_target("sparse_embedding")
        assert writer.write([{"_id": "a", "_source": {"text": "river", "sparse_embedding": {"mine": 2.5}}}])[0].ok
        assert real_client.get(index=index, id="a")["_source"]["sparse_embedding"] == {"mine": 2.5}
    finally:
        real_client.ingest.delete_pipeline(id=pipeline, ignore=[404])
    split = names("split")
    cli_out("create-index", split, "--long-text", "split")
    out = json.loads(cli_out("index", "--corpus", _corpus(tmp_path, long=True), "--model", "splade-tiny", "--backend",
                          "opensearch", "--index", split, "--long-text", "split", "--work-dir", tmp_path / "job",
                          "--no-progress"))
    assert out["indexed"] == len(DOCS)
    found = cli_out("search", "stock markets and interest rates", "--index", split, "--backend", "opensearch",
                 "--mode", "tokens", "--model", "splade-tiny")
    assert _top(found) == "d3"


def test_concurrent_bulk_requests_load_every_document_once(real_client, tmp_path, names, cli_out):
    """``--bulk-concurrency 4`` with one-document chunks: four ``_bulk`` requests at a time, each chunk
    checkpointed once acknowledged; the index holds every document, each written once (version 1)."""
    corpus = tmp_path / "many.jsonl"
    ids = [f"m{i}" for i in range(40)]
    corpus.write_text("".join(json.dumps({"_id": d, "text": f"{DOCS['d1']} {d}"}) + "\n" for d in ids))
    index = names("concurrent")
    cli_out("create-index", index)
    out = json.loads(cli_out("index", "--corpus", corpus, "--model", "splade-tiny", "--backend", "opensearch",
                             "--index", index, "--chunk-docs", "1", "--bulk-concurrency", "4",
                             "--work-dir", tmp_path / "job", "--no-progress"))
    assert out["indexed"] == 40 and out["dead_lettered"] == 0 and out["this_run"]["bulk_concurrency"] == 4
    real_client.indices.refresh(index=index)
    assert real_client.count(index=index)["count"] == 40
    hits = real_client.search(index=index, body={"size": 40, "version": True, "_source": False})["hits"]["hits"]
    assert sorted(h["_id"] for h in hits) == sorted(ids) and {h["_version"] for h in hits} == {1}
    checkpoint = json.loads((tmp_path / "job" / "checkpoint.json").read_text())
    assert checkpoint["done"] and checkpoint["position"] == 40


@pytest.mark.parametrize("technique", ["min_max", "z_score", "l2", "rrf"])
def test_hybrid_fusion_equals_the_local_engine(real_client, tmp_path, names, technique):
    """The node's normalization-processor / score-ranker-processor and the local engine fuse the same
    sub-query results into the same hits and scores, exact ties included (neural-search orders them by Lucene
    doc id through a HashMap; the local engine's rows are those ids for an index loaded in order)."""
    import random

    from opensearch_lsr.engines import make_engine
    from opensearch_lsr.lexical.fusion import HybridFusion

    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    rng = random.Random(0)
    docs = [{"_id": f"d{i}", "_source": {"text": " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))),
                                         "v": {w: round(rng.random() * 3 + 0.1, 3) for w in rng.sample(words, 3)}}}
            for i in range(60)]
    mappings = {"properties": {"text": {"type": "text"}, "v": {"type": "rank_features"}}}
    index, pipeline = names(f"fusion-{technique.replace('_', '')}"), names("pipeline")
    real_client.indices.create(index=index, body={"settings": {"number_of_shards": 1}, "mappings": mappings})
    for d in docs:  # one at a time: Lucene doc ids follow this order
        real_client.index(index=index, id=d["_id"], body=d["_source"])
    real_client.indices.refresh(index=index)
    local = make_engine("local").create(tmp_path / "local", mappings)
    local.bulk(docs)
    fusion = HybridFusion(technique, (0.4, 0.6) if technique != "rrf" else None)  # type: ignore[arg-type]
    real_client.transport.perform_request("PUT", f"/_search/pipeline/{pipeline}", body=fusion.pipeline())
    try:
        for k in range(6):
            text = " ".join(rng.sample(words, 3))
            tokens = {w: round(rng.random() * 2 + 0.1, 2) for w in rng.sample(words, 3)}
            body = {"query": {"hybrid": {"queries": [{"match": {"text": text}},
                                                     {"neural_sparse": {"v": {"query_tokens": tokens}}}],
                                         "pagination_depth": 20}}, "size": 20}
            node = real_client.search(index=index, body=body, params={"search_pipeline": pipeline})["hits"]["hits"]
            mine = local.search(body, search_pipeline=fusion.pipeline())["hits"]["hits"]
            assert [h["_id"] for h in node] == [h["_id"] for h in mine], (technique, text, tokens)
            assert [h["_score"] for h in node] == pytest.approx([h["_score"] for h in mine], rel=1e-5, abs=1e-6)
    finally:
        real_client.transport.perform_request("DELETE", f"/_search/pipeline/{pipeline}")


def test_ray_engine_stopped_then_resumed_loads_every_document_once(real_client, client_options, tmp_path, names,
                                                                 cli_out):
    """``--engine ray`` on the node: two actors writing their own ``_bulk`` requests, the driver stopped after
    two blocks, then ``lsr-os index --engine ray --resume``: every document in the index once with its text, the
    two ledgered blocks not sent again (``_version`` 1), the summary's counts those of the whole corpus."""
    ray = pytest.importorskip("ray")
    from opensearch_lsr.encoding.job import IndexJobConfig
    from opensearch_lsr.encoding.ray_job import LEDGER, RayOptions, run_ray_index_job
    from opensearch_lsr.engines import client_factory

    corpus = tmp_path / "ray.jsonl"
    texts = {f"r{i:02d}": f"{list(DOCS.values())[i % 4]} number {i}" for i in range(40)}
    corpus.write_text("".join(json.dumps({"_id": d, "text": t}) + "\n" for d, t in texts.items()))
    index, work = names("ray"), tmp_path / "job"
    cli_out("create-index", index)
    cfg = IndexJobConfig(corpus=str(corpus), model="splade-tiny", backend="opensearch", index=index,
                         work_dir=str(work), chunk_docs=8, threads=1)

    class Stop(Exception):
        pass

    done: list[int] = []

    def stop_after_two(block: int) -> None:
        done.append(block)
        if len(done) == 2:
            raise Stop()

    assert not ray.is_initialized()  # the job starts Ray and shuts it down, as the CLI does
    with pytest.raises(Stop):
        run_ray_index_job(cfg, RayOptions(workers=2, calls_per_worker=1), progress=False, on_block=stop_after_two,
                          client_factory=client_factory("opensearch", **client_options))
    first = [json.loads(line) for line in (work / LEDGER).read_text().splitlines()]
    assert sorted(e["block"] for e in first) == sorted(done)
    out = json.loads(cli_out("index", "--engine", "ray", "--workers", "2", "--corpus", corpus, "--model", "splade-tiny",
                             "--backend", "opensearch", "--index", index, "--work-dir", work, "--chunk-docs", "8",
                             "--threads", "1", "--resume", "--no-progress"))
    assert out["blocks"] == {"total": 5, "done_before": 2, "this_run": 3, "docs_per_block": 8}
    assert out["indexed"] == 40 and out["dead_lettered"] == 0
    assert out["this_run"]["indexed"] == 40 - sum(e["counters"]["indexed"] for e in first)
    real_client.indices.refresh(index=index)
    assert real_client.count(index=index)["count"] == 40
    hits = real_client.search(index=index, body={"size": 50, "version": True})["hits"]["hits"]
    assert {h["_id"]: h["_source"]["text"] for h in hits} == texts
    ledgered = {f"r{i:02d}" for e in first for i in range(8 * e["block"], 8 * e["block"] + 8)}
    assert {h["_version"] for h in hits if h["_id"] in ledgered} == {1}
    found = cli_out("search", "sourdough bread recipe", "--index", index, "--backend", "opensearch", "--mode", "tokens",
                    "--model", "splade-tiny")
    assert "sourdough" in texts[_top(found)]
