"""Deploy to the double: upload, start, wait, idempotency by content hash, endpoint, failures, dry run."""
from __future__ import annotations

import json

import pytest

from opensearch_lsr.elasticsearch.client import detect_es_features
from opensearch_lsr.elasticsearch.deploy import (ClientTransport, EsDeployConfig, EsDeployError, RecordingTransport,
                                                 deploy_es_model)


def test_deploy_then_redeploy_is_idempotent(es_double, es_client, es_bundle):
    feats = detect_es_features(es_client)
    assert feats.version == (9, 1, 0) and feats.nori is True and feats.index_pruning
    cfg = EsDeployConfig(inference_endpoint="lsr-ep")
    first = deploy_es_model(es_bundle, ClientTransport(es_client), cfg, progress=False)
    assert first["uploaded"] and first["started"] and first["state"] == "started"
    parts = [r for r in es_double.request_log if "/definition/" in r["path"]]
    manifest = json.loads((es_bundle / "elasticsearch" / "manifest.json").read_text())
    assert len(parts) == -(-manifest["definition"]["size_bytes"] // (1024 * 1024))
    n = len(es_double.request_log)
    again = deploy_es_model(es_bundle, ClientTransport(es_client), cfg, progress=False)
    assert not again["uploaded"] and not again["started"] and again["state"] == "started"
    new = es_double.request_log[n:]
    assert not any(r["method"] == "PUT" for r in new), new  # nothing uploaded or created twice
    resp = es_client.perform_request("POST", "/_inference/sparse_embedding/lsr-ep", body={"input": ["서울은 한국의 수도"]},
                                     headers={"content-type": "application/json", "accept": "application/json"})
    emb = resp.body["sparse_embedding"][0]["embedding"]
    assert emb and all(w > 0 and "." not in k for k, w in emb.items())
    assert es_double.violations == []


def test_other_content_under_the_id_is_refused_unless_replace(es_double, es_client, es_bundle):
    t = ClientTransport(es_client)
    mid = deploy_es_model(es_bundle, t, EsDeployConfig(), progress=False)["model_id"]
    es_double.models[mid]["config"]["metadata"]["lsr_content_hash"] = "0" * 64
    with pytest.raises(EsDeployError, match="different model already exists"):
        deploy_es_model(es_bundle, t, EsDeployConfig(), progress=False)
    out = deploy_es_model(es_bundle, t, EsDeployConfig(replace=True), progress=False)
    assert out["uploaded"] and out["state"] == "started"


def test_failed_deployment_and_failed_part_raise_one_sentence(es_double, es_client, es_bundle):
    t = ClientTransport(es_client)
    es_double.fail_next_start = "out of memory"
    with pytest.raises(EsDeployError, match="out of memory"):
        deploy_es_model(es_bundle, t, EsDeployConfig(model_id="m2"), progress=False)
    again = deploy_es_model(es_bundle, t, EsDeployConfig(model_id="m2"), progress=False)  # failed -> stop, start
    assert not again["uploaded"] and again["state"] == "started"
    assert [r["path"] for r in es_double.request_log if r["path"].endswith("/_stop")] == [
        "/_ml/trained_models/m2/deployment/_stop"]
    es_double.faults.append(["PUT", r"/definition/1$", 503, 5])
    with pytest.raises(EsDeployError, match="definition part 1"):
        deploy_es_model(es_bundle, t, EsDeployConfig(model_id="m3"), progress=False)


def test_a_raw_masked_lm_definition_fails_to_start(es_double, es_client, es_bundle, tmp_path):
    """A model without in-graph pooling returns [batch, seq, V]: the double (ES) refuses it at inference."""
    import shutil

    import torch

    bad = tmp_path / "bad"
    shutil.copytree(es_bundle, bad)

    class Raw(torch.nn.Module):
        def forward(self, a, b, c, d):
            return torch.zeros(a.shape[0], a.shape[1], 30522) + b.unsqueeze(-1)

    traced = torch.jit.trace(Raw(), tuple(torch.ones(1, 3, dtype=torch.int64) for _ in range(4)))
    torch.jit.save(traced, str(bad / "elasticsearch" / "traced_pytorch_model.pt"))
    m = json.loads((bad / "elasticsearch" / "manifest.json").read_text())
    m["content_hash"] = "f" * 64
    (bad / "elasticsearch" / "manifest.json").write_text(json.dumps(m))
    deploy_es_model(bad, ClientTransport(es_client), EsDeployConfig(model_id="raw"), progress=False)
    resp = es_client.perform_request("POST", "/_ml/trained_models/raw/_infer", body={"docs": [{"text_field": "x"}]},
                                     headers={"content-type": "application/json", "accept": "application/json"})
    tokens = resp.body["inference_results"][0]["predicted_value"]
    assert len(tokens) == 30522 and set(tokens.values()) == {1.0}  # the [CLS] row, silently (eland#827)
    from opensearch_lsr.elasticsearch.conformance import verify_export
    from opensearch_lsr.elasticsearch.runtime import EsConformanceError

    with pytest.raises(EsConformanceError, match="position 0"):
        verify_export(bad / "elasticsearch", "splade-tiny", ["x"])


def test_dry_run_requests_are_valid_against_the_spec(es_bundle, tmp_path):
    from es_double import EsSpecValidator

    rec = RecordingTransport()
    out = deploy_es_model(es_bundle, rec, EsDeployConfig(inference_endpoint="lsr-ep"), progress=False)
    path = rec.write_ndjson(tmp_path / "requests.ndjson")
    lines = [json.loads(l) for l in path.read_text().splitlines()]
    assert [l["method"] for l in lines[:3]] == ["GET", "PUT", "PUT"]
    parts = [l for l in lines if "/definition/" in l["path"]]
    assert parts and all(l["binary"]["size"] > 0 and len(l["binary"]["sha256"]) == 64 for l in parts)
    assert sum(l["binary"]["size"] for l in parts) == json.loads(
        (es_bundle / "elasticsearch" / "manifest.json").read_text())["definition"]["size_bytes"]
    assert any(l["path"] == "/_inference/sparse_embedding/lsr-ep" and l["method"] == "PUT" for l in lines)
    validator = EsSpecValidator.shared()
    for line in lines:
        body = json.dumps(line["body"]).encode() if "body" in line else None
        res = validator.validate(line["method"], line["path"], {k: str(v) for k, v in line.get("query", {}).items()}, body)
        assert res.errors == [], (line["method"], line["path"], res.errors)
    assert out["model_id"].startswith("lsr-")
