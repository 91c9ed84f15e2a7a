"""Local backend scores equal those of the OpenSearch test double (tests/opensearch/double)
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


def test_many_queries_identical_top10_rankings_and_scores(tmp_path):
    """50 random multi-token queries x top-10 over 400 documents with SPLADE-like weights
    (log-normal, up to ~200 active tokens of a 3,000-token vocabulary, Korean and ## keys):
    identical rankings and totals, max |score diff| below 1e-4 (float32 sums in another order)."""
    from opensearchpy import helpers

    from opensearch_lsr.opensearch.client import client_from_options

    rng = np.random.default_rng(11)
    syll = "가나다라마바사아자차카타파하서울수도한국집강학교도시의는을를"
    vocab = sorted({("##" if i % 4 == 0 else "") + "".join(rng.choice(list(syll), size=int(rng.integers(1, 4))))
                    for i in range(3000)})
    docs = {}
    for i in range(400):
        toks = rng.choice(len(vocab), size=int(rng.integers(5, 200)), replace=False)
        docs[f"d{i}"] = {"emb": {vocab[t]: float(min(rng.lognormal(-0.5, 0.8), 20.0)) for t in toks}}
    double = double_fixtures.make_double("3.1.0")
    try:
        client = client_from_options(url=double.url, max_retries=1)
        client.indices.create(index="many", body={"mappings": MAPPINGS})
        helpers.bulk(client, ({"_index": "many", "_id": d, "_source": s} for d, s in docs.items()), refresh=True)
        local = LocalIndex.create(tmp_path / "many", MAPPINGS)
        local.bulk({"_id": d, "_source": s} for d, s in docs.items())
        max_diff, same = 0.0, 0
        for _ in range(50):
            toks = rng.choice(len(vocab), size=int(rng.integers(2, 30)), replace=False)
            body = {"query": {"neural_sparse": {"emb": {"query_tokens": {
                vocab[t]: float(rng.uniform(0.05, 3.0)) for t in toks}}}}, "size": 10, "_source": False}
            remote = client.search(index="many", body=body)["hits"]
            mine = local.search(body)["hits"]
            assert mine["total"] == remote["total"]
            r, m = remote["hits"], mine["hits"]
            assert len(r) == len(m) == 10
            same += [h["_id"] for h in r] == [h["_id"] for h in m]
            max_diff = max(max_diff, *(abs(a["_score"] - b["_score"]) for a, b in zip(r, m)))
    finally:
        double.stop()
    assert same == 50
    assert max_diff < 1e-4
