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


def test_search_side_of_the_protocol_answers_alike(engine):
    """vector_field, version, put_search_pipeline, check_search and search with a pipeline, on both engines."""
    engine.create_index("ko")
    field = engine.vector_field("ko")
    assert (field.name, field.kind, field.key_format, field.nested_path) == \
        (DEFAULT_VECTOR_FIELD, "rank_features", "word", None)
    assert engine.version is None if engine.kind == "local" else engine.version[:2] == (3, 3)
    engine.check_search("ko", 10)
    engine.bulk("ko", [{"_id": did, "_source": {"text": "집 학교", DEFAULT_VECTOR_FIELD: vec}} for did, vec in DOCS.items()])
    if engine.kind == "opensearch":
        engine.client.indices.refresh(index="ko")
    pipeline = {"phase_results_processors": [{"score-ranker-processor": {"combination": {"technique": "rrf"}}}]}
    ref = engine.put_search_pipeline("p", pipeline)
    assert ref == (pipeline if engine.kind == "local" else "p")
    body = {"query": {"hybrid": {"queries": [
        {"match": {"text": "학교"}},
        {"neural_sparse": {DEFAULT_VECTOR_FIELD: {"query_tokens": {"학교": 1.0}}}}]}}}
    hits = engine.search("ko", body, search_pipeline=ref)["hits"]["hits"]
    assert hits[0]["_id"] == "d3"


def test_document_writer_of_each_engine(engine):
    if engine.kind == "opensearch":
        with pytest.raises(LsrError, match="does not exist"):  # a missing index is refused before loading
            engine.document_writer("missing")
    engine.create_index("ko")
    writer = engine.document_writer("ko")
    outcomes = writer.write([{"_id": "d1", "_source": {"text": "집", DEFAULT_VECTOR_FIELD: DOCS["d1"]}}])
    assert [o.ok for o in outcomes] == [True] and writer.state() == {}
    writer.close()
    body = {"query": {"neural_sparse": {DEFAULT_VECTOR_FIELD: {"query_tokens": {"집": 1.0}}}}}
    assert [h["_id"] for h in engine.search("ko", body)["hits"]["hits"]] == ["d1"]


def test_local_document_writer_refuses_split_passages(tmp_path):
    with pytest.raises(LsrError, match="no nested fields"):
        make_engine("local", tmp_path).document_writer("x", long_text="split")


def test_registry_connects_from_command_options(tmp_path):
    import click
    from click.testing import CliRunner

    from opensearch_lsr.engines import client_factory, connect, connection_options, export

    local = connect("local", url="http://ignored:9200", user=None)
    assert local.kind == "local" and local.version is None
    factory = client_factory("opensearch", url="http://127.0.0.1:9", max_retries=0, unrelated="kept out")
    assert factory() is not factory() and factory().transport.hosts[0]["port"] == 9  # a new client per call
    with pytest.raises(ValueError, match="the local engine has no client from options"):
        client_factory("local")

    @click.command()
    @connection_options("opensearch")
    def show(**kw):
        click.echo(kw["url"])

    assert CliRunner().invoke(show, ["--url", "http://h:1"]).output.strip() == "http://h:1"
    with pytest.raises(ValueError, match="the local engine has no export"):
        export("local", "splade-tiny", tmp_path)
