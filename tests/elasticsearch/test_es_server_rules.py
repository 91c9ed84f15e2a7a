"""Elasticsearch behaviours read from the server, client and ml-cpp sources at release tags, each checked
against the toolkit and the double (references in ``docs/elasticsearch-contract.md``)."""
from __future__ import annotations

import json
import time

import pytest
import torch

from opensearch_lsr.elasticsearch.client import EsConnectionError, detect_es_features, make_es_client
from opensearch_lsr.elasticsearch.deploy import ClientTransport, EsDeployConfig, EsDeployError, deploy_es_model
from opensearch_lsr.elasticsearch.query import rrf_body, sparse_vector_query

JSON = {"content-type": "application/json", "accept": "application/json"}


@pytest.fixture
def client_major_8(monkeypatch):
    """Make the installed client send an 8.x client's ``compatible-with=8`` headers."""
    from elasticsearch._sync.client import _base

    monkeypatch.setattr(_base, "_COMPAT_MIMETYPE_SUB", "application/vnd.elasticsearch+\\g<1>; compatible-with=8")


def _double(version="9.1.0", **kw):
    from es_double import ElasticsearchDouble

    return ElasticsearchDouble(version, **kw).start()


# 1 -------------------------------------------------------------------------------------------------
def test_a_partial_upload_is_not_taken_for_a_complete_one(es_double, es_client, es_bundle):
    t = ClientTransport(es_client)
    es_double.faults.append(["PUT", r"/definition/1$", 503, 2])  # both tries of the first run (max_retries=1)
    with pytest.raises(EsDeployError, match="definition part 1"):
        deploy_es_model(es_bundle, t, EsDeployConfig(model_id="part"), progress=False)
    plain = es_client.perform_request("GET", "/_ml/trained_models/part", headers=JSON).body
    assert "fully_defined" not in plain["trained_model_configs"][0]  # only with include=definition_status
    out = deploy_es_model(es_bundle, t, EsDeployConfig(model_id="part"), progress=False)
    assert out["uploaded"] and out["state"] == "started"
    assert any(r["query"].get("include") == "definition_status" for r in es_double.request_log
               if r["method"] == "GET" and r["path"] == "/_ml/trained_models/part")


# 2 -------------------------------------------------------------------------------------------------
def test_bulk_works_with_a_helper_that_has_no_retry_on_status(es_double, es_client, monkeypatch):
    """elasticsearch-py 8.11-8.15 ``streaming_bulk`` has no ``retry_on_status``; unknown keywords reach
    ``client.bulk()``, which raises TypeError (run against the real 8.11.0 / 8.15.1 helpers: see the notes)."""
    import elasticsearch.helpers as helpers

    from opensearch_lsr.elasticsearch import bulk as es_bulk
    from opensearch_lsr.elasticsearch.engine import ElasticsearchEngine

    real = helpers.streaming_bulk

    def streaming_bulk_8_15(client, actions, chunk_size=500, max_chunk_bytes=100 * 1024 * 1024, raise_on_error=True,
                            expand_action_callback=helpers.expand_action, raise_on_exception=True, max_retries=0,
                            initial_backoff=2, max_backoff=600, yield_ok=True, ignore_status=(), *args, **kwargs):
        if "retry_on_status" in kwargs:  # 8.15.1 hands **kwargs to client.bulk()
            raise TypeError("bulk() got an unexpected keyword argument 'retry_on_status'")
        return real(client, actions, chunk_size=chunk_size, max_chunk_bytes=max_chunk_bytes,
                    raise_on_error=raise_on_error, raise_on_exception=raise_on_exception, max_retries=max_retries,
                    initial_backoff=initial_backoff, max_backoff=max_backoff, yield_ok=yield_ok, **kwargs)

    monkeypatch.setattr(helpers, "streaming_bulk", streaming_bulk_8_15)
    es_bulk._helper_retries_on_status.cache_clear()
    try:
        engine = ElasticsearchEngine(es_client)
        engine.create_index("old-client")
        out = engine.bulk("old-client", [{"_id": "1", "_source": {"text": "x", "sparse_embedding": {"a": 1.0}}}])
        assert [o.ok for o in out] == [True]
    finally:
        es_bulk._helper_retries_on_status.cache_clear()


# 3 -------------------------------------------------------------------------------------------------
def test_the_inference_endpoint_attaches_to_the_running_deployment(es_double, es_client, es_bundle):
    deploy_es_model(es_bundle, ClientTransport(es_client), EsDeployConfig(model_id="att", inference_endpoint="att-ep"),
                    progress=False)
    put = next(r for r in es_double.request_log if r["method"] == "PUT" and r["path"].endswith("/att-ep"))
    assert put["status"] == 200
    stats = es_client.perform_request("GET", "/_ml/trained_models/att/_stats", headers=JSON).body
    assert [s["deployment_stats"]["deployment_id"] for s in stats["trained_model_stats"]] == ["att"]
    settings = es_double.endpoints["att-ep"]["service_settings"]
    assert settings["deployment_id"] == "att" and settings["model_id"] == "att"


def test_the_deployment_state_is_the_models_own():
    from opensearch_lsr.elasticsearch.deploy import _deployment_state

    body = {"count": 2, "trained_model_stats": [
        {"model_id": "m", "deployment_stats": {"deployment_id": "ep", "model_id": "m", "state": "starting"}},
        {"model_id": "m", "deployment_stats": {"deployment_id": "m", "model_id": "m", "state": "started"}}]}
    assert _deployment_state(lambda *a: (200, body), "m") == "started"


def test_without_deployment_id_an_endpoint_starts_a_second_deployment(es_double, es_client, es_bundle):
    """What the double models for the old request shape (ElasticsearchInternalService.customElandCase)."""
    deploy_es_model(es_bundle, ClientTransport(es_client), EsDeployConfig(model_id="two"), progress=False)
    es_client.perform_request("PUT", "/_inference/sparse_embedding/two-ep", headers=JSON, body={
        "service": "elasticsearch", "service_settings": {"model_id": "two", "num_allocations": 1, "num_threads": 1}})
    stats = es_client.perform_request("GET", "/_ml/trained_models/two/_stats", headers=JSON).body
    assert sorted(s["deployment_stats"]["deployment_id"] for s in stats["trained_model_stats"]) == ["two", "two-ep"]


# 4 -------------------------------------------------------------------------------------------------
def test_a_start_slower_than_the_request_timeout_is_waited_for(es_double, es_bundle):
    es_double.start_delay_s = 2.5  # the double holds `wait_for=started` requests this long, as a loading node does
    client = make_es_client(es_double.url, request_timeout=1.0, max_retries=0)
    t0 = time.monotonic()
    out = deploy_es_model(es_bundle, ClientTransport(client), EsDeployConfig(model_id="slow", poll_interval_s=0.2),
                          progress=False)
    assert out["state"] == "started" and time.monotonic() - t0 >= 2.0
    start = next(r for r in es_double.request_log if r["path"].endswith("/deployment/_start"))
    assert start["query"]["wait_for"] == "starting"


# 5 -------------------------------------------------------------------------------------------------
def test_the_rrf_retriever_needs_an_enterprise_or_trial_licence():
    clause = sparse_vector_query("v", query_vector={"a": 1.0})
    basic = _double(license_type="basic")
    try:
        client = make_es_client(basic.url, max_retries=0)
        features = detect_es_features(client)
        assert features.license == ("basic", "active") and features.rrf_licensed is False
        with pytest.raises(ValueError, match="Enterprise or trial licence"):
            rrf_body("text", "q", clause, features=features)
        body = rrf_body("text", "q", clause)  # without the check the server answers 403
        client.indices.create(index="h", mappings={"properties": {"text": {"type": "text"},
                                                                  "v": {"type": "sparse_vector"}}})
        status, resp = ClientTransport(client).request("POST", "/h/_search", None, body)
        assert status == 403 and resp["error"]["type"] == "security_exception"
    finally:
        basic.stop()
    trial = _double()
    try:
        assert detect_es_features(make_es_client(trial.url, max_retries=0)).rrf_licensed is True
    finally:
        trial.stop()


# 6 -------------------------------------------------------------------------------------------------
def test_two_ids_sharing_a_key_fail_as_the_ingest_processor_does():
    from opensearch_lsr.elasticsearch.runtime import EsDuplicateKeyError, TextExpansionRuntime
    from opensearch_lsr.elasticsearch.tokenizer import EsBertTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a.b", "a__b", "c"]

    class Both(torch.nn.Module):
        def forward(self, ids, mask, types, pos):
            out = torch.zeros(ids.shape[0], len(vocab))
            out[:, 4] = 1.0
            out[:, 5] = 0.5
            return out

    cfg = {"text_expansion": {"tokenization": {"bert": {"do_lower_case": True, "with_special_tokens": True,
                                                        "max_sequence_length": 16, "truncate": "first"}}}}
    rt = TextExpansionRuntime(Both(), vocab, cfg, EsBertTokenizer.from_config(vocab, cfg))
    with pytest.raises(EsDuplicateKeyError, match="Duplicate key a__b"):
        rt.infer(["c"])


# 7 -------------------------------------------------------------------------------------------------
def test_the_operation_lists_are_the_released_ones():
    from opensearch_lsr.elasticsearch.runtime import ALLOWED_OPERATIONS, disallowed_operations

    assert len(ALLOWED_OPERATIONS) == 111
    assert disallowed_operations(["aten::max", "aten::bmm", "aten::sum", "quantized::linear_dynamic",
                                  "prim::Loop"]) == []
    assert disallowed_operations(["aten::as_strided", "aten::log1p", "aten::save"]) == [
        "aten::as_strided", "aten::log1p", "aten::save"]


# 8, 9 ----------------------------------------------------------------------------------------------
def test_query_pruning_is_explicit_and_its_ratio_a_whole_number():
    with pytest.raises(ValueError, match="whole number"):
        sparse_vector_query("v", query_vector={"a": 1.0}, tokens_freq_ratio_threshold=2.5)
    body = sparse_vector_query("v", query_vector={"a": 1.0}, tokens_freq_ratio_threshold=7)["sparse_vector"]
    assert body["pruning_config"] == {"tokens_freq_ratio_threshold": 7, "tokens_weight_threshold": 0.4}
    assert isinstance(body["pruning_config"]["tokens_freq_ratio_threshold"], int)
    body = sparse_vector_query("v", query_vector={"a": 1.0}, prune=True)["sparse_vector"]
    assert body["prune"] is True and body["pruning_config"] == {"tokens_freq_ratio_threshold": 5,
                                                                "tokens_weight_threshold": 0.4}


def test_the_double_prunes_prune_true_alone_by_version():
    from es_double import ElasticsearchDouble

    idx = {"props": {"v": {"type": "sparse_vector"}}}
    assert ElasticsearchDouble("9.1.0", validate=False)._pruning(idx, "v", {"prune": True}) is None
    assert ElasticsearchDouble("8.17.0", validate=False)._pruning(idx, "v", {"prune": True}) == {}
    cfg = ElasticsearchDouble("9.1.0", validate=False)._pruning(
        idx, "v", {"prune": True, "pruning_config": {"tokens_freq_ratio_threshold": 2.5}})
    assert cfg == {"tokens_freq_ratio_threshold": 2}  # TokenPruningConfig.fromXContent: parser.intValue()


# 10 ------------------------------------------------------------------------------------------------
def test_the_ingest_processor_needs_its_input_and_appends_its_output(es_double, es_client, es_bundle):
    from opensearch_lsr.elasticsearch.indices import pipeline_body, put_pipeline

    mid = deploy_es_model(es_bundle, ClientTransport(es_client), EsDeployConfig(), progress=False)["model_id"]
    put_pipeline(ClientTransport(es_client), "p", pipeline_body(mid))
    es_client.indices.create(index="ing", mappings={"properties": {"text": {"type": "text"},
                                                                   "sparse_embedding": {"type": "sparse_vector"}}})
    resp = es_client.bulk(pipeline="p", operations=[
        {"index": {"_index": "ing", "_id": "no-text"}}, {"title": "no text field"},
        {"index": {"_index": "ing", "_id": "has-output"}}, {"text": "seoul", "sparse_embedding": {"zzz": 3.0}}])
    first, second = (i["index"] for i in resp["items"])
    assert first["status"] == 400 and "does not exist" in first["error"]["reason"]
    assert second["status"] == 201
    source = es_double.indices["ing"]["docs"]["has-output"]["source"]
    assert isinstance(source["sparse_embedding"], list) and source["sparse_embedding"][0] == {"zzz": 3.0}


# 11, 12 --------------------------------------------------------------------------------------------
def test_the_oldest_supported_server_is_8_15(es_bundle, client_major_8):
    manifest = json.loads((es_bundle / "elasticsearch" / "manifest.json").read_text())
    assert manifest["min_elasticsearch_version"] == "8.15.0"
    old = _double("8.14.3")
    try:
        with pytest.raises(EsConnectionError, match="8.15 or newer"):
            detect_es_features(make_es_client(old.url, max_retries=0))
    finally:
        old.stop()


def test_a_client_of_a_newer_major_is_named_with_the_one_to_install():
    server = _double("8.18.0")
    try:
        with pytest.raises(EsConnectionError) as err:
            detect_es_features(make_es_client(server.url, max_retries=0))
        assert "pip install 'elasticsearch>=8.16,<9'" in str(err.value) and "HTTP 400" not in str(err.value)
    finally:
        server.stop()


# 13 ------------------------------------------------------------------------------------------------
def test_index_against_nothing_listening_fails_at_once_in_one_sentence(tmp_path, tiny_source_dir):
    from click.testing import CliRunner

    from opensearch_lsr.cli import cli

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"_id": "1", "text": "hello"}) + "\n")
    t0 = time.monotonic()
    res = CliRunner().invoke(cli, ["index", "--backend", "elasticsearch", "--url", "http://127.0.0.1:1",
                                   "--corpus", str(corpus), "--model", str(tiny_source_dir), "--index", "x",
                                   "--work-dir", str(tmp_path / "job"), "--no-progress"])
    assert res.exit_code != 0
    assert time.monotonic() - t0 < 20
    assert "cannot reach the cluster at http://127.0.0.1:1: connection refused" in res.output, res.output
    assert "Traceback" not in res.output and "opensearch:" not in res.output


# 429 -----------------------------------------------------------------------------------------------
def test_a_request_turned_away_with_429_is_sent_again_after_a_pause_and_reported_when_it_persists(es_double,
                                                                                                  es_client):
    """A full thread pool or a circuit breaker answers 429 before running the request: ``ClientTransport`` waits and
    sends it again (index creation, searches, every deploy step), and gives the 429 back once its retries are spent."""
    from opensearch_lsr.elasticsearch.indices import EsIndexError, create_index

    body = {"mappings": {"properties": {"text": {"type": "text"}}}}

    def statuses(method: str, path: str) -> list[int]:
        return [r["status"] for r in es_double.request_log if r["method"] == method and r["path"] == path]

    quick = ClientTransport(es_client, backoff_s=0.01)
    es_double.faults.extend([["PUT", r"^/docs$", 429, 1], ["POST", r"^/docs/_search$", 429, 2]])
    assert create_index(quick, "docs", body)["acknowledged"]
    assert quick.request("POST", "/docs/_search", None, {"query": {"match_all": {}}})[0] == 200
    assert statuses("PUT", "/docs") == [429, 200] and statuses("POST", "/docs/_search") == [429, 429, 200]
    es_double.faults.append(["PUT", r"^/busy$", 429, 10])
    with pytest.raises(EsIndexError, match="HTTP 429"):
        create_index(ClientTransport(es_client, retries_429=2, backoff_s=0.01), "busy", body)
    assert statuses("PUT", "/busy") == [429, 429, 429]
