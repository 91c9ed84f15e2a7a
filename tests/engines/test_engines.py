"""The engine protocol: the local engine and OpenSearch (the HTTP double) answer the same calls alike."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "opensearch"))

from double.fixtures import fake_bundle, make_double  # noqa: E402

from opensearch_lsr.contract import DEFAULT_VECTOR_FIELD, truncate_feature_value  # noqa: E402
from opensearch_lsr.engines import ENGINES, Engine, engine_class, make_engine  # noqa: E402
from opensearch_lsr.errors import LsrError  # noqa: E402

DOCS = {"d1": {"집": 1.3, "가격": 0.7}, "d2": {"집": 0.2}, "d3": {"학교": 2.0}}


@pytest.fixture(params=["local", "opensearch"])
def engine(request, tmp_path):
    if request.param == "local":
        yield make_engine("local", tmp_path)
        return
    from opensearch_lsr.opensearch.client import client_from_options

    double = make_double("3.3.0")
    try:
        yield make_engine("opensearch", client_from_options(url=double.url, max_retries=1), apply_settings=True)
    finally:
        double.stop()


def test_engine_round_trip_gives_the_same_hits(engine, tmp_path):
    assert isinstance(engine, Engine)
    engine.create_index("ko")
    actions = [{"_op_type": "index", "_id": did, "_source": {"text": did, DEFAULT_VECTOR_FIELD: vec}}
               for did, vec in DOCS.items()]
    actions.append({"_op_type": "index", "_id": "bad", "_source": {"text": "x", DEFAULT_VECTOR_FIELD: {"집": -1.0}}})
    outcomes = engine.bulk("ko", actions)
    assert [o.doc_id for o in outcomes] == ["d1", "d2", "d3", "bad"]
    assert [o.ok for o in outcomes] == [True, True, True, False]
    assert outcomes[-1].status == 400
    if engine.kind == "opensearch":
        engine.client.indices.refresh(index="ko")
    body = {"query": {"neural_sparse": {DEFAULT_VECTOR_FIELD: {"query_tokens": {"집": 2.0, "가격": 1.0}}}}}
    hits = engine.search("ko", body)["hits"]["hits"]
    assert [h["_id"] for h in hits] == ["d1", "d2"]
    want = 2.0 * truncate_feature_value(1.3) + 1.0 * truncate_feature_value(0.7)
    assert hits[0]["_score"] == pytest.approx(want, rel=1e-6)


def test_engine_deploys_a_bundle(engine, tmp_path):
    ids = engine.deploy_model(fake_bundle(tmp_path / "bundle"))
    assert set(ids) == {"sparse_encoding", "sparse_tokenize"} and all(ids.values())


def test_local_engine_refuses_sparse_vector_in_one_sentence(tmp_path):
    with pytest.raises(LsrError, match="rank_features"):
        make_engine("local", tmp_path).create_index("x", kind="sparse_vector")


def test_engine_registry_lists_importable_classes():
    for kind in ENGINES:
        assert engine_class(kind).kind == kind
    with pytest.raises(ValueError, match="local, opensearch"):
        engine_class("solr")
