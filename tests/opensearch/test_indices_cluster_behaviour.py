"""Index/search behaviour a real cluster has and the double shares.

Each test names the upstream source the behaviour comes from; each pins one behaviour the toolkit relies on.
"""
from __future__ import annotations

import pytest
from double.fixtures import make_double
from opensearchpy.exceptions import RequestError

from opensearch_lsr.opensearch import indices as ix
from opensearch_lsr.opensearch.bulk import BulkTargetError, OpenSearchBulkWriter
from opensearch_lsr.opensearch.client import ClusterFeatures, client_from_options
from opensearch_lsr.opensearch.query import bool_query, method_parameters, neural_sparse_query, search_body


def V(version: str, plugins=None) -> ClusterFeatures:
    return ClusterFeatures.from_version(version, plugins if plugins is not None else {"analysis-nori"})


@pytest.fixture
def cluster(request):
    version = getattr(request, "param", "3.3.0")
    double = make_double(version)
    yield double, client_from_options(url=double.url, max_retries=0), V(version)
    double.stop()
    # every request the toolkit (and these tests) sent is valid against the vendored OpenAPI spec,
    # up to the documented deviations (double/spec.py ALLOWED_DEVIATIONS)
    assert double.violations == [], double.violations


def _docs(client, index, docs):
    from opensearchpy.helpers import bulk

    bulk(client, [{"_index": index, "_id": k, "_source": v} for k, v in docs.items()], refresh=True)


# ---- item 9: RRF rank_constant placement ---------------------------------------------------------

def test_rrf_rank_constant_placement_follows_the_version():
    """neural-search RRFProcessorFactory: combination.parameters.rank_constant up to 3.0.0.0,
    combination.rank_constant from 3.1.0.0."""
    old = ix.hybrid_pipeline_body(V("3.0.0"), technique="rrf", rank_constant=7)
    new = ix.hybrid_pipeline_body(V("3.1.0"), technique="rrf", rank_constant=7)
    comb_old = old["phase_results_processors"][0]["score-ranker-processor"]["combination"]
    comb_new = new["phase_results_processors"][0]["score-ranker-processor"]["combination"]
    assert comb_old == {"technique": "rrf", "parameters": {"rank_constant": 7}}
    assert comb_new == {"technique": "rrf", "rank_constant": 7}
    with pytest.raises(ix.IndexSetupError, match=r"\[1, 10000\]"):
        ix.hybrid_pipeline_body(V("3.3.0"), technique="rrf", rank_constant=10001)


@pytest.mark.parametrize("version", ["2.19.0", "3.0.0", "3.1.0", "3.3.0"])
def test_rrf_pipeline_is_accepted_and_uses_the_constant(version):
    double = make_double(version)
    try:
        client = client_from_options(url=double.url, max_retries=0)
        features = V(version)
        ix.put_search_pipeline(client, "rrf", ix.hybrid_pipeline_body(features, technique="rrf", rank_constant=5))
        client.indices.create(index="h", body={"mappings": {"properties": {
            "text": {"type": "text"}, "sparse_embedding": {"type": "rank_features"}}}})
        _docs(client, "h", {"a": {"text": "x y", "sparse_embedding": {"x": 2.0}}, "b": {"text": "y", "sparse_embedding": {"x": 1.0}}})
        body = {"query": {"hybrid": {"queries": [{"match": {"text": "x"}},
                                                 neural_sparse_query("sparse_embedding", query_tokens={"x": 1.0})]}}}
        hits = client.search(index="h", body=body, params={"search_pipeline": "rrf"})["hits"]["hits"]
        assert hits[0]["_id"] == "a" and hits[0]["_score"] == pytest.approx(2 / (5 + 1))  # k=5 used, not 60
    finally:
        double.stop()


def test_double_rejects_or_ignores_the_wrong_placement():
    new, old = make_double("3.1.0"), make_double("3.0.0")
    try:
        wrong_for_new = {"phase_results_processors": [{"score-ranker-processor": {"combination": {
            "technique": "rrf", "parameters": {"rank_constant": 5}}}}]}
        with pytest.raises(RequestError, match="supported parameters are \\[weights\\]"):
            client_from_options(url=new.url).search_pipeline.put(id="p", body=wrong_for_new)
        wrong_for_old = {"phase_results_processors": [{"score-ranker-processor": {"combination": {
            "technique": "rrf", "rank_constant": 5}}}]}
        client_from_options(url=old.url).search_pipeline.put(id="p", body=wrong_for_old)  # accepted, ignored
        from double.search import rrf_rank_constant

        assert rrf_rank_constant(wrong_for_old["phase_results_processors"][0]["score-ranker-processor"], (3, 0, 0)) == 60
    finally:
        new.stop()
        old.stop()


# ---- item 5: two-phase ------------------------------------------------------------------------------

def test_filtered_query_keeps_two_phase(cluster):
    """NeuralSparseTwoPhaseProcessor.collectNeuralQueryBuilderWithSparseEmbedding only looks at the query
    itself and bool.should: bool_query puts the neural_sparse clause there (it used to sit in must)."""
    double, client, features = cluster
    ix.create_index(client, "p", "rank_features", features)
    ix.put_search_pipeline(client, "tp", ix.two_phase_pipeline_body(features))
    ix.attach_search_pipeline(client, "p", "tp")
    _docs(client, "p", {"a": {"text": "x", "lang": "ko", "sparse_embedding": {"x": 2.0, "y": 0.1}},
                        "b": {"text": "x", "lang": "en", "sparse_embedding": {"x": 3.0}}})
    ns = neural_sparse_query("sparse_embedding", query_tokens={"x": 1.0, "y": 0.2})
    res = client.search(index="p", body=search_body(bool_query(ns, {"lang": "ko"})))
    assert [h["_id"] for h in res["hits"]["hits"]] == ["a"]
    assert double.two_phase_log[-1]["applied"] is True
    client.search(index="p", body={"query": {"bool": {"must": [ns], "filter": [{"term": {"lang": "ko"}}]}}})
    assert double.two_phase_log[-1]["applied"] is False  # the old shape: silently not two-phased


def test_two_phase_window_is_validated_before_sending(cluster):
    double, client, features = cluster
    ix.create_index(client, "p", "rank_features", features)
    ix.put_search_pipeline(client, "tp", ix.two_phase_pipeline_body(features, expansion_rate=5.0, max_window_size=100))
    ix.attach_search_pipeline(client, "p", "tp")
    ix.check_two_phase(client, "p", 20)  # 20 x 5 = 100: allowed
    with pytest.raises(ix.IndexSetupError, match=r"size 21 x expansion_rate 5 = 105 exceeds .* at most 20 hits"):
        ix.check_two_phase(client, "p", 21)
    body = search_body(neural_sparse_query("sparse_embedding", query_tokens={"x": 1.0}), size=21)
    with pytest.raises(RequestError, match="should be \\[0,100\\], but get the value of 105"):
        client.search(index="p", body=body)  # what the cluster would answer without the check


def test_two_phase_is_refused_on_a_sparse_vector_index(cluster):
    double, client, features = cluster
    ix.create_index(client, "ann", "sparse_vector", features, vocab_size=30522)
    ix.put_search_pipeline(client, "tp", ix.two_phase_pipeline_body(features))
    with pytest.raises(ix.IndexSetupError, match="refuses on sparse_vector"):
        ix.attach_search_pipeline(client, "ann", "tp")
    # the cluster's answer once it is attached anyway (NeuralSparseTwoPhaseProcessor.validateSeismicQuery)
    client.indices.put_settings(index="ann", body={"index.search.default_pipeline": "tp"})
    with pytest.raises(RequestError, match="not compatible with \\[seismic\\]"):
        client.search(index="ann", body=search_body(neural_sparse_query("sparse_embedding", query_tokens={"1": 1.0})))


# ---- item 4: sparse_vector / SEISMIC ---------------------------------------------------------------

def test_method_parameters_are_built_and_validated():
    ns = neural_sparse_query("v", query_tokens={"1": 1.0}, version="3.3.0",
                             method_params={"k": 50, "top_n": 20, "heap_factor": 1.2, "filter": {"term": {"lang": "ko"}}})
    assert ns["neural_sparse"]["v"]["method_parameters"] == {"k": 50, "top_n": 20, "heap_factor": 1.2,
                                                             "filter": {"term": {"lang": "ko"}}}
    with pytest.raises(ValueError, match="OpenSearch >= 3.3"):
        neural_sparse_query("v", query_tokens={"1": 1.0}, version="3.2.0", method_params={"k": 5})
    for bad, msg in (({"k": 0}, "k must be a positive integer"), ({"top_n": 2.5}, "top_n must be"),
                     ({"heap_factor": -1}, "heap_factor must be"), ({"filter": "lang:ko"}, "filter must be")):
        with pytest.raises(ValueError, match=msg):
            method_parameters(**bad)
    with pytest.raises(TypeError):
        method_parameters(unknown=1)  # type: ignore[call-arg]


@pytest.mark.parametrize("cluster", ["3.3.0"], indirect=True)
def test_sparse_vector_exact_vs_ann_on_3_3(cluster):
    """NeuralSparseQueryBuilder.doToQuery (3.3.0.0): no method_parameters -> exact FeatureField query
    (word keys match nothing, no error); with them -> SparseAnnQueryBuilder (integer ids only, k cap)."""
    double, client, features = cluster
    ix.create_index(client, "ann", "sparse_vector", features, vocab_size=30522)
    _docs(client, "ann", {f"d{i}": {"text": "t", "sparse_embedding": {"7": 1.0 + i, "9": 0.5}} for i in range(15)})
    word = client.search(index="ann", body=search_body(neural_sparse_query("sparse_embedding",
                                                                           query_tokens={"hello": 1.0})))
    assert word["hits"]["total"]["value"] == 0  # 3.3: zero hits, not a 400
    exact = client.search(index="ann", body=search_body(neural_sparse_query("sparse_embedding", query_tokens={"7": 1.0}),
                                                        size=20))
    assert exact["hits"]["total"]["value"] == 15  # exact: every match, no k cap
    ann = client.search(index="ann", body=search_body(neural_sparse_query(
        "sparse_embedding", query_tokens={"7": 1.0}, method_params={"k": 3}, version="3.3.0"), size=20))
    assert len(ann["hits"]["hits"]) == 3
    with pytest.raises(RequestError, match="Query tokens should be valid integer"):
        client.search(index="ann", body=search_body(neural_sparse_query(
            "sparse_embedding", query_tokens={"hello": 1.0}, method_params={"k": 3}, version="3.3.0")))


@pytest.mark.parametrize("cluster", ["3.4.0"], indirect=True)
def test_sparse_vector_defaults_cap_hits_from_3_4(cluster):
    double, client, features = cluster
    ix.create_index(client, "ann", "sparse_vector", V("3.4.0"), vocab_size=30522)
    _docs(client, "ann", {f"d{i}": {"text": "t", "sparse_embedding": {"7": 1.0 + i}} for i in range(15)})
    res = client.search(index="ann", body=search_body(neural_sparse_query("sparse_embedding", query_tokens={"7": 1.0}),
                                                      size=20))
    assert len(res["hits"]["hits"]) == 10  # SparseAnnQueryBuilder default k
    res = client.search(index="ann", body=search_body(neural_sparse_query(
        "sparse_embedding", query_tokens={"7": 1.0}, method_params={"k": 15}, version="3.4.0"), size=20))
    assert len(res["hits"]["hits"]) == 15


def test_vector_field_of_reads_the_mapping(cluster):
    double, client, features = cluster
    ix.create_index(client, "ann", "sparse_vector", features, vocab_size=30522)
    ix.create_index(client, "rf", "rank_features", features, vector_field="emb")
    ix.create_index(client, "split", "rank_features", features, long_text="split")
    assert ix.vector_field_of(client, "ann") == ix.VectorField("sparse_embedding", "sparse_vector")
    assert ix.vector_field_of(client, "ann").key_format == "token_id"
    assert ix.vector_field_of(client, "rf") == ix.VectorField("emb", "rank_features")
    nested = ix.vector_field_of(client, "split")
    assert nested == ix.VectorField("sparse_embedding.sparse_encoding", "rank_features", "sparse_embedding")
    with pytest.raises(ix.IndexSetupError, match="not a rank_features/sparse_vector field"):
        ix.vector_field_of(client, "rf", "text")
    with pytest.raises(ix.IndexSetupError, match="does not exist"):
        ix.vector_field_of(client, "nope")


# ---- item 6: bulk of precomputed vectors ------------------------------------------------------------

def test_bulk_skips_the_default_ingest_pipeline(cluster):
    """A default sparse_encoding pipeline would re-encode the text and overwrite the client's vectors."""
    double, client, features = cluster
    from opensearch_lsr.opensearch.mlcommons import apply_ml_settings

    apply_ml_settings(client)
    mid = client.plugins.ml.register_model_meta(body={
        "name": "m", "version": "1", "function_name": "SPARSE_ENCODING", "model_format": "TORCH_SCRIPT",
        "model_content_hash_value": "0" * 64, "total_chunks": 1})["model_id"]
    double.models[mid]["model_state"] = "DEPLOYED"
    double.runtimes[mid] = __import__("double.fixtures", fromlist=["FakeRuntime"]).FakeRuntime("SPARSE_ENCODING")
    ix.put_ingest_pipeline(client, "enc", ix.ingest_pipeline_body(mid, features))
    ix.create_index(client, "p", "rank_features", features, ingest_pipeline="enc")
    writer = OpenSearchBulkWriter(client, "p", sleep=lambda s: None)
    writer.check_target("sparse_embedding")
    out = writer.write([{"_id": "a", "_source": {"text": "x", "sparse_embedding": {"mine": 2.5}}}])
    assert out[0].ok
    assert client.get(index="p", id="a")["_source"]["sparse_embedding"] == {"mine": 2.5}
    assert double.requests_to("/_bulk$")[-1]["query"].get("pipeline") == "_none"
    legacy = OpenSearchBulkWriter(client, "p", sleep=lambda s: None, pipeline=None)  # the old behaviour
    legacy.write([{"_id": "b", "_source": {"text": "x", "sparse_embedding": {"mine": 2.5}}}])
    assert client.get(index="p", id="b")["_source"]["sparse_embedding"] == {"hello": 1.5, "world": 0.5}


def test_bulk_target_is_checked_before_loading(cluster):
    double, client, features = cluster
    writer = OpenSearchBulkWriter(client, "missing")
    with pytest.raises(BulkTargetError, match="does not exist; create it first \\(lsr-os create-index missing"):
        writer.check_target("sparse_embedding")
    ix.create_index(client, "rf", "rank_features", features)
    OpenSearchBulkWriter(client, "rf").check_target("sparse_embedding")
    with pytest.raises(BulkTargetError, match="need sparse_vector \\(token_id keys\\)"):
        OpenSearchBulkWriter(client, "rf").check_target("sparse_embedding", key_format="token_id")
    with pytest.raises(BulkTargetError, match="maps other as nothing"):
        OpenSearchBulkWriter(client, "rf").check_target("other")
    with pytest.raises(BulkTargetError, match="--long-text split writes .* recreate it with .*--long-text split"):
        OpenSearchBulkWriter(client, "rf").check_target("sparse_embedding", long_text="split")
    ix.create_index(client, "split", "rank_features", features, long_text="split")
    OpenSearchBulkWriter(client, "split").check_target("sparse_embedding", long_text="split")
    assert not double.requests_to("/_bulk")  # nothing was sent


def test_split_documents_index_and_search_nested(cluster):
    from opensearch_lsr.opensearch.query import nested_query

    double, client, features = cluster
    ix.create_index(client, "split", "rank_features", features, long_text="split")
    writer = OpenSearchBulkWriter(client, "split", refresh="true")
    out = writer.write([{"_id": "a", "_source": {"text": "long", "sparse_embedding": [
        {"sparse_encoding": {"x": 1.0}, "text": "p1"}, {"sparse_encoding": {"x": 3.0, "y": 1.0}, "text": "p2"}]}}])
    assert out[0].ok, out
    field = ix.vector_field_of(client, "split")
    q = nested_query(field.nested_path, neural_sparse_query(field.name, query_tokens={"x": 1.0}))
    hits = client.search(index="split", body=search_body(q))["hits"]["hits"]
    assert hits[0]["_id"] == "a" and hits[0]["_score"] == pytest.approx(3.0)  # best passage (score_mode max)
    with pytest.raises(ix.IndexSetupError, match="needs --kind rank_features"):
        ix.index_body("sparse_vector", features, vocab_size=30522, long_text="split")


def test_bulk_429_is_not_retried_in_nested_loops(cluster):
    """streaming_bulk retries 429 items itself; the writer used to retry them again, multiplying waits."""
    double, client, features = cluster
    ix.create_index(client, "p", "rank_features", features)
    double.reject_bulk_items = 1000
    writer = OpenSearchBulkWriter(client, "p", max_retries=2, initial_backoff=0.001, max_backoff=0.001,
                                  sleep=lambda s: None)
    from opensearch_lsr.opensearch.bulk import BulkWriteError

    with pytest.raises(BulkWriteError, match="still rejects 1 document\\(s\\) with HTTP 429 after 2 retries"):
        writer.write([{"_id": "a", "_source": {"text": "x", "sparse_embedding": {"x": 1.0}}}])
    assert len(double.requests_to("/_bulk$")) == 3  # 1 + 2 retries (was (1 + 2) x (1 + 2) = 9)


def test_rank_features_parsing_matches_the_mapper(cluster):
    """OpenSearch RankFeaturesFieldMapper: VALUE_NULL ignored, numeric strings coerced (floatValue(true))."""
    double, client, features = cluster
    ix.create_index(client, "p", "rank_features", features)
    _docs(client, "p", {"a": {"text": "x", "sparse_embedding": {"x": "2.5", "y": None}}})
    res = client.search(index="p", body=search_body(neural_sparse_query("sparse_embedding", query_tokens={"x": 1.0})))
    assert res["hits"]["hits"][0]["_score"] == pytest.approx(2.5)
    from opensearchpy.helpers import BulkIndexError

    with pytest.raises(BulkIndexError):
        _docs(client, "p", {"b": {"text": "x", "sparse_embedding": {"x": "high"}}})
