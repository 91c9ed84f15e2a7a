"""The hybrid evaluation row sends its bodies and search pipeline to a cluster (the OpenSearch test double)
and gets the local backend's RRF fusion back."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "opensearch"))
double_fixtures = pytest.importorskip("double.fixtures")

from opensearch_lsr.evaluation.baselines import (baseline_row, hybrid_row, local_pipeline_search,  # noqa: E402
                                                 opensearch_pipeline_search)
from opensearch_lsr.lexical.fusion import HybridFusion  # noqa: E402
from opensearch_lsr.local.index import LocalIndex  # noqa: E402

MAPPINGS = {"properties": {"text": {"type": "text"}, "emb": {"type": "rank_features"}}}
WORDS = ["seoul", "capital", "korea", "paris", "france", "river", "city", "cat", "dog", "book", "school", "road"]


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    from opensearchpy import helpers

    from opensearch_lsr.opensearch.client import client_from_options

    docs = {}
    for i in range(40):  # short texts: lengths < 24 make Lucene's norm exact, so BM25 agrees to float rounding
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(2 + i % 5)]
        # ids sort like rows: the double and the local backend break sub-query ties the same way
        docs[f"d{i:02d}"] = {"text": " ".join(words),
                             "emb": {w: 0.5 + ((i + j) % 4) for j, w in enumerate(words[::-1])}}
    double = double_fixtures.make_double("3.1.0")
    client = client_from_options(url=double.url, max_retries=1)
    client.indices.create(index="hy", body={"mappings": MAPPINGS})
    helpers.bulk(client, ({"_index": "hy", "_id": d, "_source": s} for d, s in docs.items()), refresh=True)
    local = LocalIndex.create(tmp_path_factory.mktemp("hy") / "hy", MAPPINGS)
    local.bulk({"_id": d, "_source": s} for d, s in docs.items())
    yield client, local
    double.stop()


QUERIES = {"q1": "seoul capital", "q2": "paris france river", "q3": "school book", "q4": "nothing here"}
QRELS = {"q1": {"d00": 1}, "q2": {"d03": 1}, "q3": {"d05": 1}, "q4": {"d01": 1}}
SPARSE = {"q1": {"neural_sparse": {"emb": {"query_tokens": {"seoul": 1.0, "korea": 0.5}}}},
          "q2": {"neural_sparse": {"emb": {"query_tokens": {"river": 2.0}}}},
          "q3": {"neural_sparse": {"emb": {"query_tokens": {"book": 1.0, "school": 1.0}}}}, "q4": None}


def test_hybrid_row_on_a_cluster_matches_the_local_backend(both):
    client, local = both
    fusion = HybridFusion("rrf", rank_constant=60)
    remote = hybrid_row(opensearch_pipeline_search(client, "hy", fusion.pipeline()).search, QUERIES, SPARSE, QRELS,
                        "text", fusion, k=40)
    here = hybrid_row(local_pipeline_search(local, fusion.pipeline()).search, QUERIES, SPARSE, QRELS, "text",
                      fusion, k=40)
    assert client.search_pipeline.get(id="lsr-os-eval-hybrid")  # the row created its pipeline on the cluster
    for qid in QUERIES:
        assert remote.run[qid] == pytest.approx(here.run[qid], rel=1e-6), qid
    # (k = every document, so equal fused scores cannot fall on different sides of the cut)
    lexical_remote = baseline_row(lambda b: client.search(index="hy", body=b), QUERIES, QRELS, "text", k=10)
    lexical_here = baseline_row(local.search, QUERIES, QRELS, "text", k=10)
    for qid in QUERIES:
        assert lexical_remote.run[qid] == pytest.approx(lexical_here.run[qid], rel=1e-5), qid


def test_cli_search_mode_hybrid_on_a_cluster(both):
    from click.testing import CliRunner

    from opensearch_lsr.cli import cli

    client, _ = both
    url = client.transport.hosts[0]
    url = f"http://{url['host']}:{url['port']}"
    res = CliRunner().invoke(cli, ["search", "--backend", "opensearch", "--url", url, "--index", "hy", "seoul capital",
                                   "--mode", "hybrid", "--model-id", "nope", "--field", "emb", "--max-retries", "1"])
    # the pipeline is created, the body reaches the cluster, and its refusal of the unknown model is one line
    assert client.search_pipeline.get(id="lsr-os-hybrid")
    assert res.exit_code != 0 and "Failed to find model" in res.output and "Traceback" not in res.output, res.output
    res = CliRunner().invoke(cli, ["search", "--backend", "opensearch", "--url", url, "--index", "hy", "x",
                                   "--mode", "hybrid", "--field", "emb", "--max-retries", "1"])
    assert res.exit_code != 0 and "--mode hybrid needs --model" in res.output
