"""The double's spec validation: real violations are caught, only the documented deviations pass."""
from __future__ import annotations

import json
import time

from double import ALLOWED_DEVIATIONS, SpecValidator
from double.fixtures import make_double


def _v(method, path, body=None, query=None):
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    return SpecValidator.shared().validate(method, path, query or {}, data, "application/json")


def test_spec_loads_once_and_fast():
    SpecValidator.shared()
    t0 = time.perf_counter()
    assert SpecValidator.shared() is SpecValidator.shared()
    assert time.perf_counter() - t0 < 0.01
    assert len(SpecValidator.shared().spec["paths"]) > 500


def test_violations_are_caught():
    res = _v("POST", "/docs/_search", {"query": {"neural_sparse": {"emb": {"query_tokens": {"a": "high"}}}}})
    assert res.errors and "is not of type 'number'" in res.errors[0]
    res = _v("PUT", "/_ingest/pipeline/p", {"processors": [{"sparse_encoding": {"field_map": {"a": "b"}}}]})
    assert any("'model_id' is a required property" in e for e in res.errors)
    res = _v("POST", "/_plugins/_ml/models/_register_meta", {"name": "m", "version": "1", "function_name": "TEXT_EMBEDDING",
                                                             "model_format": "TORCH_SCRIPT", "total_chunks": 1,
                                                             "model_content_hash_value": "x"})
    assert any("'model_config' is a required property" in e for e in res.errors)  # only SPARSE_* may omit it
    assert _v("GET", "/_cat/plugins", query={"format": "json", "bogus": "1"}).errors
    assert _v("POST", "/_plugins/_ml/no/such/api", {}).errors
    assert "takes none" in _v("POST", "/_plugins/_ml/models/abc/_deploy", {"node_ids": ["n"]}).errors[0]
    res = _v("PUT", "/docs", {"mappings": {"properties": {"v": {"type": "rank_features"}, "t": {"type": "txet"}}}})
    assert res.errors  # unknown field type is a violation; sparse_vector is not (documented deviation)


def test_only_documented_deviations_are_allowed():
    cases = {
        "sparse_vector_mapping": ("PUT", "/ann", {"settings": {"index": {"sparse": True}}, "mappings": {"properties": {
            "v": {"type": "sparse_vector", "method": {"name": "seismic"}}}}}),
        "neural_sparse_method_parameters": ("POST", "/ann/_search", {"query": {"neural_sparse": {"v": {
            "query_tokens": {"1": 1.0}, "method_parameters": {"k": 10}}}}}),
        "two_phase_processor": ("PUT", "/_search/pipeline/tp", {"request_processors": [
            {"neural_sparse_two_phase_processor": {"enabled": True}}]}),
        "sparse_encoding_prune_skip_existing": ("PUT", "/_ingest/pipeline/p", {"processors": [{"sparse_encoding": {
            "model_id": "m", "field_map": {"a": "b"}, "prune_type": "max_ratio", "prune_ratio": 0.1,
            "skip_existing": True}}]}),
        "sparse_model_without_model_config": ("POST", "/_plugins/_ml/models/_register_meta", {
            "name": "m", "version": "1", "function_name": "SPARSE_ENCODING", "model_format": "TORCH_SCRIPT",
            "total_chunks": 1, "model_content_hash_value": "x"}),
        "upload_chunk_raw_bytes": ("POST", "/_plugins/_ml/models/abc/upload_chunk/0", b"PK\x03\x04 raw zip bytes"),
    }
    assert set(cases) == set(ALLOWED_DEVIATIONS)
    for name, (method, path, body) in cases.items():
        res = _v(method, path, body)
        assert res.errors == [] and name in res.deviations, (name, res)
    # a deviation outside the documented construct is still a violation
    res = _v("POST", "/ann/_search", {"query": {"neural_sparse": {"v": {"query_tokens": {"1": 1.0}}}}, "size": "ten"})
    assert res.errors


def test_double_records_violations():
    double = make_double("3.3.0")
    try:
        import urllib.request
        req = urllib.request.Request(double.url + "/docs/_search", method="POST", data=b'{"size": "ten"}',
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req)
        except Exception:  # noqa: BLE001 - the index does not exist; only the log matters here
            pass
        assert double.violations and double.violations[0]["path"] == "/docs/_search"
        assert double.request_log[-1]["violations"]
    finally:
        double.stop()
