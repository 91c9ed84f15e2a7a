"""deploy-model against the double: request sequence, chunk rules, idempotency, every fault's message."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from double import BREAKER_OPEN, DISK_BREAKER_OPEN, LOCAL_FILE_GATE, NO_ELIGIBLE_NODE
from double.fixtures import fake_bundle, fake_bundle_dir, make_double, os_client, os_double  # noqa: F401

from opensearch_lsr.cli import cli
from opensearch_lsr.opensearch.client import client_from_options, detect_features
from opensearch_lsr.opensearch.mlcommons import (DeployConfig, DeployError, deploy_bundle, deploy_model,
                                                 register_model_file)

FAST = dict(poll_interval_s=0.01, backoff_s=0.01, chunk_size=1000)


def _deploy(client, bundle, **kw):
    return deploy_bundle(client, bundle, DeployConfig(**{**FAST, **kw}))


def test_settings_gate_then_apply_settings(os_double, os_client, fake_bundle_dir):
    with pytest.raises(DeployError) as err:
        _deploy(os_client, fake_bundle_dir)
    assert LOCAL_FILE_GATE in str(err.value) and "--apply-settings" in str(err.value)
    assert "Nothing was registered" in str(err.value) and not os_double.models
    out = _deploy(os_client, fake_bundle_dir, apply_settings=True, model_group="lsr")
    enc, tok = out["sparse_encoding"], out["sparse_tokenize"]
    assert os_double.models[enc]["model_state"] == "DEPLOYED" and os_double.models[enc]["algorithm"] == "SPARSE_ENCODING"
    assert os_double.models[tok]["algorithm"] == "SPARSE_TOKENIZE"
    assert os_double.models[enc]["model_config"] is None            # never sent for SPARSE_* (contract 2.4)
    assert os_double.model_groups[out["model_group_id"]]["name"] == "lsr"
    # 2,500 bytes in 1,000-byte raw chunks: 0, 1, 2 in order, the last one last
    chunks = [e["path"].rsplit("/", 1)[1] for e in os_double.requests_to(rf"/models/{enc}/upload_chunk/")]
    assert chunks == ["0", "1", "2"]
    assert all(e["content_type"] == "application/json" for e in os_double.requests_to("/upload_chunk/"))
    assert os_double.violations == []


def test_idempotent_rerun_reuses_deployed_models(os_double, os_client, fake_bundle_dir):
    first = _deploy(os_client, fake_bundle_dir, apply_settings=True)
    n_meta = len(os_double.requests_to("_register_meta"))
    second = _deploy(os_client, fake_bundle_dir)
    assert (second["sparse_encoding"], second["sparse_tokenize"]) == (first["sparse_encoding"], first["sparse_tokenize"])
    assert second["reused"] == {"sparse_encoding": "deployed", "sparse_tokenize": "deployed"}
    assert len(os_double.requests_to("_register_meta")) == n_meta  # nothing new registered
    assert len(os_double.models) == 2


def test_registered_but_not_deployed_is_deployed_on_rerun(os_double, os_client, fake_bundle_dir):
    os_double.fail_deploy_error = "Failed to deploy model (injected)"
    with pytest.raises(DeployError) as err:
        _deploy(os_client, fake_bundle_dir, apply_settings=True, which="encoding")
    msg = str(err.value)
    model_id = err.value.model_ids["sparse_encoding"]
    assert "ended FAILED" in msg and "injected" in msg and f"Model {model_id} stays registered but not deployed" in msg
    assert "DELETE" in msg
    out = _deploy(os_client, fake_bundle_dir, which="encoding")
    assert out["sparse_encoding"] == model_id and out["reused"] == {"sparse_encoding": "registered"}
    assert os_double.models[model_id]["model_state"] == "DEPLOYED"


def test_deprecated_paths(os_double, os_client, fake_bundle_dir):
    from opensearch_lsr.opensearch.mlcommons import apply_ml_settings

    apply_ml_settings(os_client)
    meta = json.loads((fake_bundle_dir / "manifest.json").read_text())["sparse_encoding"]
    model_id = register_model_file(os_client, fake_bundle_dir / "sparse_encoding.zip", name="old", version="1",
                                   function_name="SPARSE_ENCODING", sha256=meta["sha256"], size=meta["size_bytes"],
                                   chunk_size=1000, legacy_paths=True)
    deploy_model(os_client, model_id, legacy_paths=True, poll_interval_s=0.01)
    paths = [e["path"] for e in os_double.request_log]
    assert "/_plugins/_ml/models/meta" in paths and f"/_plugins/_ml/models/{model_id}/chunk/2" in paths
    assert f"/_plugins/_ml/models/{model_id}/_load" in paths
    assert os_double.models[model_id]["model_state"] == "DEPLOYED" and os_double.violations == []


def test_chunk_rules_of_the_double(os_double, os_client, fake_bundle_dir):
    """The double enforces ML Commons' chunk rules (so the client's compliance is actually tested)."""
    from opensearchpy.exceptions import TransportError

    from opensearch_lsr.opensearch.mlcommons import apply_ml_settings

    apply_ml_settings(os_client)
    ml = os_client.plugins.ml
    res = ml.register_model_meta(body={"name": "m", "version": "1", "function_name": "SPARSE_ENCODING",
                                       "model_format": "TORCH_SCRIPT", "model_content_hash_value": "0" * 64,
                                       "total_chunks": 2})
    mid = res["model_id"]
    # MLModelChunkUploader throws plain Exceptions: the real server answers 500, not 400
    with pytest.raises(TransportError, match="Chunk size exceeds 10MB") as err:
        ml.upload_chunk(model_id=mid, chunk_number=0, body=b"x" * 10_000_001, headers={"Content-Type": "application/json"})
    assert err.value.status_code == 500
    with pytest.raises(TransportError, match="Chunk number exceeds total chunks") as err:
        ml.upload_chunk(model_id=mid, chunk_number=2, body=b"x", headers={"Content-Type": "application/json"})
    assert err.value.status_code == 500
    ml.upload_chunk(model_id=mid, chunk_number=1, body=b"x", headers={"Content-Type": "application/json"})
    # REGISTERED as soon as the last chunk arrives, although chunk 0 is missing
    assert os_double.models[mid]["model_state"] == "REGISTERED"
    with pytest.raises(DeployError, match="model content changed"):
        deploy_model(os_client, mid, poll_interval_s=0.01)


def test_chunk_size_over_10mb_rejected_by_config():
    with pytest.raises(ValueError, match="chunk_size"):
        DeployConfig(chunk_size=10_000_001)
    with pytest.raises(ValueError, match="which must be one of"):
        DeployConfig(which="all")  # type: ignore[arg-type]


def test_fault_429_is_retried(os_double, os_client, fake_bundle_dir):
    os_double.inject(r"/_register_meta$", 429, times=2, reason="rejected", type="rejected_execution_exception")
    out = _deploy(os_client, fake_bundle_dir, apply_settings=True, which="encoding")
    assert os_double.models[out["sparse_encoding"]]["model_state"] == "DEPLOYED"
    assert [e["status"] for e in os_double.requests_to("_register_meta")] == [429, 429, 200]


def test_fault_503_is_retried_by_the_transport(os_double, os_client, fake_bundle_dir):
    os_double.inject(r"/upload_chunk/1$", 503, times=1)
    out = _deploy(os_client, fake_bundle_dir, apply_settings=True, which="encoding")
    assert os_double.models[out["sparse_encoding"]]["model_state"] == "DEPLOYED"


def test_fault_5xx_during_upload_names_the_half_registered_model(os_double, os_client, fake_bundle_dir):
    os_double.inject(r"/upload_chunk/1$", 500, times=1, reason="node crashed")
    with pytest.raises(DeployError) as err:
        _deploy(os_client, fake_bundle_dir, apply_settings=True, which="encoding")
    msg = str(err.value)
    mid = err.value.model_ids["SPARSE_ENCODING"]
    assert "node crashed" in msg and f"Model {mid} is left half-registered" in msg and "chunks 0..0 of 3" in msg
    assert f"curl -X DELETE {os_double.url}/_plugins/_ml/models/{mid}" in msg
    assert os_double.models[mid]["model_state"] == "REGISTERING"
    # a rerun ignores the half-registered model (REGISTERING) and registers a fresh one
    out = _deploy(os_client, fake_bundle_dir, which="encoding")
    assert out["sparse_encoding"] != mid and out["stale"]["sparse_encoding"] == [mid]


def test_fault_hash_mismatch(os_double, os_client, fake_bundle_dir):
    os_double.corrupt_chunks = 1
    with pytest.raises(DeployError) as err:
        _deploy(os_client, fake_bundle_dir, apply_settings=True, which="encoding")
    assert "model content changed" in str(err.value) and "delete it and rerun" in str(err.value)


def test_fault_breaker_open_and_fix(os_double, os_client, fake_bundle_dir):
    from opensearch_lsr.opensearch.mlcommons import apply_ml_settings

    apply_ml_settings(os_client, {"plugins.ml_commons.allow_registering_model_via_local_file": True,
                                  "plugins.ml_commons.only_run_on_ml_node": False})
    os_double.heap_used_percent = 95
    with pytest.raises(DeployError) as err:
        _deploy(os_client, fake_bundle_dir, which="encoding")
    assert BREAKER_OPEN in str(err.value) and "jvm_heap_memory_threshold" in str(err.value)
    out = _deploy(os_client, fake_bundle_dir, which="encoding", apply_settings=True)  # threshold 100: breaker off
    assert out["reused"] == {"sparse_encoding": "registered"}


def test_fault_no_ml_node(os_double, os_client, fake_bundle_dir):
    os_client.cluster.put_settings(body={"persistent": {"plugins.ml_commons.allow_registering_model_via_local_file": True}})
    with pytest.raises(DeployError) as err:
        _deploy(os_client, fake_bundle_dir, which="encoding")
    msg = str(err.value)
    # the synchronous 400 of _deploy (TransportDeployModelAction) carries the short text; the hint still applies
    assert NO_ELIGIBLE_NODE in msg and "stays registered but not deployed" in msg
    assert "only_run_on_ml_node=false" in msg and "(HTTP 400)" in msg


def test_fault_task_timeout(os_client, fake_bundle_dir):
    double = make_double(task_delay_s=1.0)
    try:
        client = client_from_options(url=double.url)
        with pytest.raises(DeployError) as err:
            deploy_bundle(client, fake_bundle_dir, DeployConfig(**FAST, apply_settings=True, which="encoding",
                                                                timeout_s=0.2))
        assert "did not finish in 0s" in str(err.value) or "did not finish" in str(err.value)
        assert "/_plugins/_ml/tasks/" in str(err.value)
    finally:
        double.stop()


def test_bundle_drift_is_refused(os_client, fake_bundle_dir):
    (fake_bundle_dir / "sparse_encoding.zip").write_bytes(b"tampered")
    with pytest.raises(DeployError, match="does not match manifest.json"):
        _deploy(os_client, fake_bundle_dir, apply_settings=True)


def test_unreachable_and_old_cluster(tmp_path):
    from opensearch_lsr.opensearch.client import ClusterConnectionError

    client = client_from_options(url="http://127.0.0.1:9", max_retries=0, request_timeout=2)
    with pytest.raises(ClusterConnectionError, match="cannot reach the cluster"):
        detect_features(client)
    double = make_double("2.10.0")
    try:
        with pytest.raises(ClusterConnectionError, match="2.11 or newer"):
            detect_features(client_from_options(url=double.url))
    finally:
        double.stop()


def test_cli_deploy_model_prints_ids_and_fails_cleanly(os_double, fake_bundle_dir):
    runner = CliRunner()
    res = runner.invoke(cli, ["deploy-model", str(fake_bundle_dir), "--url", os_double.url, "--chunk-size", "1000"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "allow_registering_model_via_local_file" in res.output
    res = runner.invoke(cli, ["deploy-model", str(fake_bundle_dir), "--url", os_double.url, "--apply-settings",
                              "--chunk-size", "1000", "--model-group", "g"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out) >= {"sparse_encoding", "sparse_tokenize", "model_group_id"}
    res = runner.invoke(cli, ["deploy-model", str(fake_bundle_dir), "--url", "ftp://x"])
    assert res.exit_code == 1 and "--url must look like" in res.output
    assert os_double.violations == []


def test_lookup_filters_on_algorithm_not_function_name(os_double, os_client, fake_bundle_dir):
    """ML Commons indexes the function name as ``algorithm`` (MLModel.toXContent); a lookup on
    ``function_name`` never matches, so a rerun would register a second copy."""
    _deploy(os_client, fake_bundle_dir, apply_settings=True, which="encoding")
    search = os_double.requests_to(r"/models/_search$")[-1]
    assert search["status"] == 200
    doc = next(iter(os_double.models.values()))
    assert "algorithm" in doc and "function_name" not in doc
    _deploy(os_client, fake_bundle_dir, which="encoding")
    assert len(os_double.models) == 1 and len(os_double.requests_to("_register_meta")) == 1


def test_old_opensearch_py_is_refused_in_one_sentence(os_client):
    from opensearch_lsr.opensearch.client import ClusterConnectionError, require_client_version
    from opensearch_lsr.opensearch.mlcommons import find_models_by_hash

    with pytest.raises(ClusterConnectionError, match=r"opensearch-py 2\.8\.0 is installed .* opensearch-py>=3\.0"):
        require_client_version("2.8.0")
    require_client_version("3.0.0")

    class OldPlugins:  # what opensearch-py 2.8 offers: no register_model_meta/upload_chunk/get_model/predict
        class ml:  # noqa: N801
            search_models = register_model = deploy_model = get_task = staticmethod(lambda **kw: {})

    class OldClient:
        plugins = OldPlugins()

    with pytest.raises(DeployError, match=r"lacks plugins\.ml\.register_model_meta.*opensearch-py>=3\.0"):
        find_models_by_hash(OldClient(), "0" * 64, "SPARSE_ENCODING")


def test_deploy_of_a_registering_model_fails_in_its_task(os_double, os_client, fake_bundle_dir):
    """ML Commons has no state check at _deploy: a half-uploaded model gets a task that fails."""
    from opensearch_lsr.opensearch.mlcommons import apply_ml_settings

    apply_ml_settings(os_client)
    res = os_client.plugins.ml.register_model_meta(body={
        "name": "m", "version": "1", "function_name": "SPARSE_ENCODING", "model_format": "TORCH_SCRIPT",
        "model_content_hash_value": "0" * 64, "total_chunks": 3})
    assert os_double.models[res["model_id"]]["model_state"] == "REGISTERING"
    with pytest.raises(DeployError, match="ended FAILED"):
        deploy_model(os_client, res["model_id"], poll_interval_s=0.01)
    assert os_double.requests_to(rf"/models/{res['model_id']}/_deploy$")[0]["status"] == 200


def test_disk_breaker_hint_names_the_disk_setting(os_double, os_client, fake_bundle_dir):
    os_double.disk_free_bytes = 1 << 30  # 1 GB free, threshold 5gb
    with pytest.raises(DeployError) as err:
        _deploy(os_client, fake_bundle_dir, apply_settings=True, which="encoding")
    msg = str(err.value)
    assert DISK_BREAKER_OPEN in msg and "disk_free_space_threshold" in msg and "jvm_heap" not in msg


def test_unknown_cluster_setting_is_rejected(os_client):
    from opensearchpy.exceptions import RequestError

    with pytest.raises(RequestError, match=r"persistent setting \[plugins.ml_commons.no_such_setting\], not recognized"):
        os_client.cluster.put_settings(body={"persistent": {"plugins.ml_commons.no_such_setting": True}})


def test_429_retries_are_bounded(os_double, os_client, fake_bundle_dir):
    os_double.inject(r"/_register_meta$", 429, times=50, reason="rejected", type="rejected_execution_exception")
    with pytest.raises(DeployError, match="HTTP 429"):
        _deploy(os_client, fake_bundle_dir, apply_settings=True, which="encoding", retries_429=3)
    assert len(os_double.requests_to("_register_meta")) == 4  # 1 + 3 retries, then one clear error


def test_elasticsearch_is_not_taken_for_opensearch():
    from opensearch_lsr.opensearch.client import ClusterConnectionError, check_distribution

    es7 = {"name": "n", "version": {"number": "7.17.0", "build_flavor": "default", "build_type": "docker"},
           "tagline": "You Know, for Search"}
    es8 = {"name": "n", "version": {"number": "8.15.0", "build_flavor": "default"}, "tagline": "You Know, for Search"}
    for info in (es7, es8):
        with pytest.raises(ClusterConnectionError, match="Elasticsearch"):
            check_distribution(info)
    with pytest.raises(ClusterConnectionError, match="not an OpenSearch cluster"):
        check_distribution({"version": {"number": "7.10.2"}})
    check_distribution({"version": {"distribution": "opensearch", "number": "7.10.2"}})  # override_main_response_version
    double = make_double("8.15.0", product="elasticsearch")
    try:
        with pytest.raises(ClusterConnectionError, match="Elasticsearch 8"):
            detect_features(client_from_options(url=double.url))
    finally:
        double.stop()


def test_connection_failure_prints_one_line():
    res = CliRunner().invoke(cli, ["deploy-model", ".", "--url", "http://127.0.0.1:9", "--max-retries", "0"])
    assert res.exit_code == 1
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    assert "cannot reach the cluster at http://127.0.0.1:9: connection refused" in lines[0]
    assert "Traceback" not in res.output
