"""Index/pipeline set-up per cluster version, against the double; index-side behaviour of the double."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from double import trunc9
from double.fixtures import make_double

from opensearch_lsr.cli import cli
from opensearch_lsr.opensearch import indices as ix
from opensearch_lsr.opensearch.client import ClusterFeatures, client_from_options, detect_features

V = ClusterFeatures.from_version


def test_templates_render_and_placeholders():
    body = ix.index_body("rank_features", V("3.0.0", {"analysis-nori"}), ingest_pipeline="p",
                         text_field="body", vector_field="vec")
    assert body["settings"]["index"]["default_pipeline"] == "p"
    assert body["mappings"]["properties"]["body"]["analyzer"] == "korean"
    assert body["mappings"]["properties"]["vec"] == {"type": "rank_features"}
    no_pipe = ix.index_body("rank_features", V("3.0.0", {"analysis-nori"}))
    assert "default_pipeline" not in no_pipe["settings"]["index"]      # None removes the key
    assert "{{" not in json.dumps(no_pipe)
    with pytest.raises(ix.IndexSetupError, match="has no value"):
        ix.render({"a": "{{missing}}"}, {})


def test_nori_fallback_and_choice():
    no_nori = ix.index_body("rank_features", V("3.0.0", set()))
    assert no_nori["mappings"]["properties"]["text"]["analyzer"] == "cjk" and "analysis" not in no_nori["settings"]["index"]
    std = ix.index_body("rank_features", V("3.0.0", {"analysis-nori"}), text_analyzer="standard")
    assert std["mappings"]["properties"]["text"]["analyzer"] == "standard"
    with pytest.raises(ix.IndexSetupError, match="analysis-nori plugin"):
        ix.index_body("rank_features", V("3.0.0", set()), text_analyzer="nori")
    with pytest.raises(ix.IndexSetupError, match="text analyzer must be one of"):
        ix.index_body("rank_features", V("3.0.0"), text_analyzer="kuromoji")


def test_sparse_vector_version_and_vocab_limits():
    with pytest.raises(ix.IndexSetupError, match="3.3"):
        ix.index_body("sparse_vector", V("3.2.0"), vocab_size=30522)
    with pytest.raises(ix.IndexSetupError, match="32768"):
        ix.index_body("sparse_vector", V("3.3.0"), vocab_size=32500 + 300)
    with pytest.raises(ix.IndexSetupError, match="vocabulary size"):
        ix.index_body("sparse_vector", V("3.3.0"))
    body = ix.index_body("sparse_vector", V("3.3.0", {"analysis-nori"}), vocab_size=32500,
                         seismic_parameters={"n_postings": 160})
    assert body["settings"]["index"]["sparse"] is True
    method = body["mappings"]["properties"]["sparse_embedding"]["method"]
    assert method["name"] == "seismic" and method["parameters"]["n_postings"] == 160


@pytest.mark.parametrize("ptype,ratio,message", [
    ("max_ratio", 1.5, "Illegal prune_ratio 1.500000 for prune_type: max_ratio. prune_ratio should be in the range [0, 1)."),
    ("alpha_mass", -0.1, "Illegal prune_ratio -0.100000 for prune_type: alpha_mass. prune_ratio should be in the range [0, 1)."),
    ("top_k", 2.5, "Illegal prune_ratio 2.500000 for prune_type: top_k. prune_ratio should be positive integer."),
    ("abs_value", -1.0, "Illegal prune_ratio -1.000000 for prune_type: abs_value. prune_ratio should be non-negative."),
    ("none", 0.1, "prune_ratio field is not supported when prune_type is not provided"),
    ("bogus", 0.1, "Unknown prune type: bogus"),
])
def test_prune_validation_matches_neural_search(ptype, ratio, message):
    with pytest.raises(ix.IndexSetupError) as err:
        ix.validate_prune(ptype, ratio)
    assert message in str(err.value)
    # the double rejects the same pipeline with the same neural-search string
    double = make_double("3.3.0")
    try:
        client = client_from_options(url=double.url)
        body = {"processors": [{"sparse_encoding": {"model_id": "m", "field_map": {"text": "v"},
                                                    "prune_type": ptype, "prune_ratio": ratio}}]}
        if ptype == "none":
            del body["processors"][0]["sparse_encoding"]["prune_type"]
        from opensearchpy.exceptions import RequestError
        with pytest.raises(RequestError) as err2:
            client.ingest.put_pipeline(id="p", body=body)
        assert message.split(" (")[0] in str(err2.value.info)
    finally:
        double.stop()


def test_ingest_pipeline_options_follow_the_version():
    assert ix.validate_prune("top_k", 64) == ("top_k", 64)
    old = V("2.18.0")
    with pytest.raises(ix.IndexSetupError, match="2.19"):
        ix.ingest_pipeline_body("m", old, prune_type="max_ratio", prune_ratio=0.1)
    with pytest.raises(ix.IndexSetupError, match="3.0"):
        ix.ingest_pipeline_body("m", old, skip_existing=True)
    with pytest.raises(ix.IndexSetupError, match="2.16"):
        ix.ingest_pipeline_body("m", V("2.15.0"), batch_size=8)
    body = ix.ingest_pipeline_body("m", V("3.0.0"), prune_type="max_ratio", prune_ratio=0.1, batch_size=8,
                                   skip_existing=True)
    assert body["processors"][0]["sparse_encoding"] == {
        "model_id": "m", "field_map": {"text": "sparse_embedding"}, "prune_type": "max_ratio", "prune_ratio": 0.1,
        "batch_size": 8, "skip_existing": True}


def test_search_pipelines_follow_the_version():
    with pytest.raises(ix.IndexSetupError, match="2.15"):
        ix.two_phase_pipeline_body(V("2.14.0"))
    params = ix.two_phase_pipeline_body(V("2.16.0"))["request_processors"][0]["neural_sparse_two_phase_processor"]
    assert "prune_type" not in params["two_phase_parameter"]
    assert "prune_type" in json.dumps(ix.two_phase_pipeline_body(V("2.19.0")))
    with pytest.raises(ix.IndexSetupError, match="expansion_rate"):
        ix.two_phase_pipeline_body(V("3.0.0"), expansion_rate=0.5)
    assert "score-ranker-processor" in json.dumps(ix.hybrid_pipeline_body(V("2.19.0")))
    assert "normalization-processor" in json.dumps(ix.hybrid_pipeline_body(V("2.18.0")))
    with pytest.raises(ix.IndexSetupError, match="2.19"):
        ix.hybrid_pipeline_body(V("2.18.0"), technique="rrf")
    with pytest.raises(ix.IndexSetupError, match="summing to 1"):
        ix.hybrid_pipeline_body(V("3.0.0"), technique="normalization", weights=(0.5, 0.6))
    with pytest.raises(ix.IndexSetupError, match="z_score normalization needs OpenSearch 3.0"):
        ix.hybrid_pipeline_body(V("2.19.0"), technique="normalization", normalization="z_score")
    with pytest.raises(ix.IndexSetupError, match="normalization must be one of"):
        ix.hybrid_pipeline_body(V("3.0.0"), technique="normalization", normalization="max")
    for version, normalization in (("3.0.0", "z_score"), ("2.10.0", "l2")):
        body = ix.hybrid_pipeline_body(V(version), technique="normalization", normalization=normalization,
                                       weights=(0.4, 0.6))
        proc = body["phase_results_processors"][0]["normalization-processor"]
        assert proc["normalization"] == {"technique": normalization}
        assert proc["combination"] == {"technique": "arithmetic_mean", "parameters": {"weights": [0.4, 0.6]}}


@pytest.mark.parametrize("version,plugins,kind,expect_analyzer", [
    ("2.11.0", {"opensearch-ml", "opensearch-neural-search"}, "rank_features", "cjk"),
    ("2.19.0", {"opensearch-ml", "opensearch-neural-search", "analysis-nori"}, "rank_features", "nori"),
    ("3.3.0", {"opensearch-ml", "opensearch-neural-search", "analysis-nori"}, "sparse_vector", "nori"),
])
def test_create_index_and_pipelines_on_the_double(version, plugins, kind, expect_analyzer):
    double = make_double(version, plugins=plugins)
    try:
        client = client_from_options(url=double.url)
        features = detect_features(client)
        ix.put_ingest_pipeline(client, "ingest", ix.ingest_pipeline_body("model", features))
        out = ix.create_index(client, "docs", kind, features, ingest_pipeline="ingest", vocab_size=30522)
        assert out["text_analyzer"] == expect_analyzer
        assert double.indices["docs"].settings["index.default_pipeline"] == "ingest"
        if features.two_phase:
            ix.put_search_pipeline(client, "two", ix.two_phase_pipeline_body(features))
        ix.put_search_pipeline(client, "hyb", ix.hybrid_pipeline_body(features))
        ix.attach_search_pipeline(client, "docs", "hyb")
        assert double.indices["docs"].settings["index.search.default_pipeline"] == "hyb"
        with pytest.raises(ix.IndexSetupError, match="already exists"):
            ix.create_index(client, "docs", kind, features, vocab_size=30522)
        assert double.violations == []
    finally:
        double.stop()


def test_a_node_turning_requests_away_with_429_gets_them_again_after_a_pause():
    """A small node's circuit breaker ("[parent] Data too large", HTTP 429) rejects a request before running it:
    index and pipeline creation, attaching a pipeline, reading a mapping or a pipeline back and searches wait and
    send it again instead of failing the command."""
    from opensearch_lsr.opensearch.engine import OpenSearchEngine

    double = make_double("3.3.0")
    try:
        client = client_from_options(url=double.url)
        features = detect_features(client)
        breaker = {"status": 429, "type": "circuit_breaking_exception", "reason": "[parent] Data too large"}
        turned_away = [(r"^/docs$", "PUT"), (r"^/_search/pipeline/hyb$", "PUT"), (r"^/_search/pipeline/hyb$", "GET"),
                       (r"^/docs/_settings$", "PUT"), (r"^/docs/_mapping$", "GET"), (r"^/docs/_search$", "POST")]
        for path, method in turned_away:
            double.inject(path, breaker["status"], method=method, type=breaker["type"], reason=breaker["reason"])
        ix.create_index(client, "docs", "rank_features", features)
        ix.put_search_pipeline(client, "hyb", ix.hybrid_pipeline_body(features))
        ix.attach_search_pipeline(client, "docs", "hyb")  # reads the pipeline back first
        client.index(index="docs", id="a", body={"text": "서울", "sparse_embedding": {"서울": 1.5}}, refresh=True)
        engine = OpenSearchEngine(client)
        assert engine.vector_field("docs").name == "sparse_embedding"
        hits = engine.search("docs", {"query": {"neural_sparse": {"sparse_embedding": {"query_tokens": {"서울": 1.0}}}}})
        assert [h["_id"] for h in hits["hits"]["hits"]] == ["a"]
        for path, method in turned_away:
            assert [e["status"] for e in double.requests_to(path, method)][:2] == [429, 200], (path, method)
    finally:
        double.stop()


def test_unknown_plugins_try_nori_then_fall_back():
    """With _cat/plugins forbidden the toolkit tries nori and falls back to cjk on the server's error."""
    double = make_double("3.0.0", plugins={"opensearch-ml", "opensearch-neural-search"})
    try:
        double.inject(r"^/_cat/plugins$", 403, times=5, type="security_exception", reason="no permissions")
        client = client_from_options(url=double.url)
        features = detect_features(client)
        assert features.plugins is None
        out = ix.create_index(client, "docs", "rank_features", features)
        assert out["text_analyzer"] == "cjk"
        assert [e["status"] for e in double.requests_to("^/docs$", "PUT")] == [400, 200]
    finally:
        double.stop()


def test_rank_features_truncation_scoring_and_errors():
    double = make_double("3.3.0")
    try:
        client = client_from_options(url=double.url)
        features = detect_features(client)
        ix.create_index(client, "docs", "rank_features", features)
        client.index(index="docs", id="a", body={"text": "서울 한국", "sparse_embedding": {"서울": 1.2345678, "한국": 0.3}},
                     refresh=True)
        client.index(index="docs", id="b", body={"text": "강", "sparse_embedding": {"강": 2.0}}, refresh=True)
        res = client.search(index="docs", body={"query": {"neural_sparse": {"sparse_embedding": {
            "query_tokens": {"서울": 2.0, "한국": 1.0}}}}})
        hit = res["hits"]["hits"][0]
        assert hit["_id"] == "a" and res["hits"]["total"]["value"] == 1
        assert hit["_score"] == pytest.approx(2.0 * trunc9(1.2345678) + trunc9(0.3), rel=1e-6)
        assert trunc9(1.2345678) != pytest.approx(1.2345678, rel=1e-4)  # 9-bit truncation is visible
        assert abs(trunc9(1.2345678) - 1.2345678) / 1.2345678 <= 2 ** -8
        from opensearchpy.exceptions import RequestError
        cases = [
            ({"query_tokens": {"서울": 65.0}}, "weight must be in (0, 64.0], got: 65.0"),
            ({"query_tokens": {"서울": 0.0}}, "weight must be in (0, 64.0], got: 0.0"),
            ({"query_text": "서울", "analyzer": "bert-uncased", "model_id": "m"}, "Cannot use both [model_id: m]"),
            ({"query_text": "서울", "max_tokens": 3}, "[neural_sparse] query does not support [max_tokens] field"),
            ({"model_id": "m"}, "either query_text field or query_tokens field must be provided"),
        ]
        for clause, message in cases:
            with pytest.raises(RequestError) as err:
                client.search(index="docs", body={"query": {"neural_sparse": {"sparse_embedding": clause}}})
            assert message in json.dumps(err.value.info, ensure_ascii=False), clause
        with pytest.raises(RequestError, match="only works on \\[rank_features\\] fields"):
            client.search(index="docs", body={"query": {"neural_sparse": {"text": {"query_tokens": {"a": 1.0}}}}})
        # bulk with per-item errors: a zero weight and a non-object vector fail, the rest succeed
        from opensearchpy.helpers import bulk
        ok, errors = bulk(client, [
            {"_index": "docs", "_id": "c", "_source": {"text": "물", "sparse_embedding": {"물": 1.0}}},
            {"_index": "docs", "_id": "d", "_source": {"text": "x", "sparse_embedding": {"물": 0.0}}},
            {"_index": "docs", "_id": "e", "_source": {"text": "x", "sparse_embedding": [1, 2]}},
        ], raise_on_error=False)
        assert ok == 1 and {e["index"]["_id"] for e in errors} == {"d", "e"}
        assert "featureValue must be a positive normal float" in json.dumps(errors)
        double.reject_bulk_items = 1
        ok, errors = bulk(client, [{"_index": "docs", "_id": "f", "_source": {"text": "x"}}], raise_on_error=False)
        assert errors[0]["index"]["status"] == 429
        assert double.violations == []
    finally:
        double.stop()


def test_older_clusters_reject_newer_query_fields():
    double = make_double("2.13.0")
    try:
        client = client_from_options(url=double.url)
        features = detect_features(client)
        ix.create_index(client, "docs", "rank_features", features)
        from opensearchpy.exceptions import RequestError
        with pytest.raises(RequestError, match="unknown token \\[START_OBJECT\\] after \\[query_tokens\\]"):
            client.search(index="docs", body={"query": {"neural_sparse": {"sparse_embedding": {"query_tokens": {"a": 1.0}}}}})
        with pytest.raises(RequestError, match="does not support \\[analyzer\\] field"):
            client.search(index="docs", body={"query": {"neural_sparse": {"sparse_embedding": {"query_text": "a", "analyzer": "x"}}}})
    finally:
        double.stop()


def test_cli_create_index_and_pipelines(tmp_path):
    double = make_double("3.3.0")
    try:
        runner = CliRunner()
        url = ["--url", double.url]
        res = runner.invoke(cli, ["create-pipeline", "ingest", "ing", "--model-id", "abc", "--prune", "max_ratio:0.1", *url])
        assert res.exit_code == 0, res.output
        res = runner.invoke(cli, ["create-pipeline", "ingest", "ing2", "--model-id", "abc", "--prune", "max_ratio:1.5", *url])
        assert res.exit_code == 1 and "Illegal prune_ratio 1.500000" in res.output and "Traceback" not in res.output
        res = runner.invoke(cli, ["create-index", "docs", "--pipeline", "ing", *url])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["text_analyzer"] == "nori"
        res = runner.invoke(cli, ["create-index", "ann", "--kind", "sparse_vector", "--vocab-size", "40000", *url])
        assert res.exit_code == 1 and "32768" in res.output
        res = runner.invoke(cli, ["create-pipeline", "hybrid", "hyb", "--index", "docs", *url])
        assert res.exit_code == 0 and json.loads(res.output)["attached_to"] == "docs"
        res = runner.invoke(cli, ["create-pipeline", "two-phase", "tp", "--expansion-rate", "0.5", *url])
        assert res.exit_code == 1 and "expansion_rate" in res.output
        # weights typed with the default technique (auto): score normalization, not RRF without them
        res = runner.invoke(cli, ["create-pipeline", "hybrid", "hyb-w", "--weights", "0.2,0.8", *url])
        assert res.exit_code == 0, res.output
        body = json.dumps(json.loads(res.output)["body"])
        assert "normalization-processor" in body and "[0.2, 0.8]" in body
        for args, msg in [(["ingest", "i3", "--model-id", "abc", "--index", "docs"], "create-index --pipeline"),
                          (["ingest", "i4", "--model-id", "abc", "--weights", "0.5,0.5"],
                           "--weights does not apply to an ingest pipeline"),
                          (["hybrid", "h2", "--prune-ratio", "0.3"], "--prune-ratio does not apply"),
                          (["hybrid", "h3", "--technique", "rrf", "--weights", "0.5,0.5"], "not both"),
                          (["hybrid", "h4", "--weights", "0.5,0.5", "--rank-constant", "20"], "not both")]:
            res = runner.invoke(cli, ["create-pipeline", *args, *url])
            assert res.exit_code != 0 and msg in res.output and "Traceback" not in res.output, (args, res.output)
        assert double.violations == []
    finally:
        double.stop()
