"""Local backend scores equal those of the OpenSearch test double (H-cluster's, tests/opensearch/double)
on the same documents and query bodies: same hits, same order, same scores."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "opensearch"))
double_fixtures = pytest.importorskip("double.fixtures")

from opensearch_lsr.local.index import LocalIndex, LocalIndexError  # noqa: E402

MAPPINGS = {"properties": {"text": {"type": "text"}, "emb": {"type": "rank_features"}, "lang": {"type": "keyword"}}}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    from opensearch_lsr.opensearch.client import client_from_options

    rng = np.random.default_rng(7)
    vocab = ["서울", "수도", "한국", "##의", "집", "고양이", "강", "u.s", "the", "#", "도시", "학교"]
    docs = {}
    for i in range(150):
        toks = rng.choice(len(vocab), size=int(rng.integers(1, 8)), replace=False)
        docs[f"d{i}"] = {"text": f"문서 {i}", "lang": "ko" if i % 3 else "en",
                         "emb": {vocab[t]: float(rng.uniform(0.001, 4.0)) for t in toks}}
    double = double_fixtures.make_double("3.1.0")
    client = client_from_options(url=double.url, max_retries=1)
    client.indices.create(index="parity", body={"mappings": MAPPINGS})
    from opensearchpy import helpers

    helpers.bulk(client, ({"_index": "parity", "_id": d, "_source": s} for d, s in docs.items()), refresh=True)
    local = LocalIndex.create(tmp_path_factory.mktemp("parity") / "parity", MAPPINGS)
    local.bulk({"_id": d, "_source": s} for d, s in docs.items())
    yield client, local, vocab
    double.stop()


QUERIES = [
    {"query": {"neural_sparse": {"emb": {"query_tokens": {"서울": 1.3, "수도": 0.7, "##의": 2.0}}}}, "size": 50},
    {"query": {"neural_sparse": {"emb": {"query_tokens": {"u.s": 63.9, "the": 0.01, "없음": 5.0}}}}, "size": 20},
    {"query": {"bool": {"must": [{"neural_sparse": {"emb": {"query_tokens": {"집": 1.0, "강": 3.0}}}}],
                        "filter": [{"term": {"lang": "ko"}}]}}, "size": 30},
    {"query": {"neural_sparse": {"emb": {"query_tokens": {"고양이": 2.5}, "boost": 2.0}}}, "size": 10, "from": 3},
]


@pytest.mark.parametrize("body", QUERIES)
def test_same_hits_and_scores(both, body):
    client, local, _ = both
    remote = client.search(index="parity", body=body)["hits"]
    mine = local.search(body)["hits"]
    assert mine["total"]["value"] == remote["total"]["value"]
    r = [(h["_id"], h["_score"]) for h in remote["hits"]]
    m = [(h["_id"], h["_score"]) for h in mine["hits"]]
    assert sorted(s for _, s in m) == pytest.approx(sorted(s for _, s in r), rel=1e-6)
    # same order up to ties
    assert {d: pytest.approx(s, rel=1e-6) for d, s in m} == {d: s for d, s in r} or \
        [round(s, 5) for _, s in m] == [round(s, 5) for _, s in r]


def test_same_errors(both):
    client, local, _ = both
    from opensearchpy.exceptions import RequestError

    for q, msg in [({"emb": {"query_tokens": {"서울": 65.0}}}, "weight must be in"),
                   ({"text": {"query_tokens": {"서울": 1.0}}}, "rank_features")]:
        with pytest.raises(RequestError) as remote_err:
            client.search(index="parity", body={"query": {"neural_sparse": q}})
        with pytest.raises(LocalIndexError, match=msg):
            local.search({"query": {"neural_sparse": q}})
        assert msg in str(remote_err.value.info)
