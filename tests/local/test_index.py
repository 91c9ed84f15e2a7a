"""LocalIndex: Lucene FeatureField storage, exact neural_sparse scoring, filters, errors, durability."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from opensearch_lsr.contract import truncate_feature_value, truncate_feature_values
from opensearch_lsr.local.index import LocalIndex, LocalIndexError

MAPPINGS = {"properties": {"text": {"type": "text"}, "emb": {"type": "rank_features"},
                           "lang": {"type": "keyword"}, "year": {"type": "integer"}}}


def java_truncate(v: float) -> float:
    """Reference: Float.intBitsToFloat((Float.floatToIntBits(v) >>> 15) << 15)."""
    bits = struct.unpack(">I", struct.pack(">f", v))[0]
    return struct.unpack(">f", struct.pack(">I", (bits >> 15) << 15))[0]


def random_docs(n=200, vocab=60, seed=0):
    rng = np.random.default_rng(seed)
    docs = {}
    for i in range(n):
        toks = rng.choice(vocab, size=rng.integers(1, 15), replace=False)
        docs[f"d{i}"] = {f"t{t}": float(rng.uniform(0.01, 5.0)) for t in toks}
    return docs


@pytest.fixture()
def index(tmp_path):
    return LocalIndex.create(tmp_path / "idx", MAPPINGS)


def test_nine_bit_truncation_matches_java_bits():
    rng = np.random.default_rng(1)
    vals = np.concatenate([rng.uniform(1e-3, 10, 500), [1.0, 1.7, 3.14159, 0.1, 63.99, 1e-30]]).astype(np.float32)
    got = truncate_feature_values(vals)
    want = np.array([java_truncate(float(v)) for v in vals], dtype=np.float32)
    assert np.array_equal(got, want)
    assert truncate_feature_value(1.7) == 1.69921875
    rel = (vals - got) / vals
    assert rel.min() >= 0 and rel.max() <= 2 ** -8


def test_scores_equal_brute_force_dot_product_of_truncated_weights(index):
    docs = random_docs()
    resp = index.bulk({"_id": d, "_source": {"emb": v, "lang": "ko"}} for d, v in docs.items())
    assert not resp["errors"] and index.count() == len(docs)
    rng = np.random.default_rng(2)
    for _ in range(20):
        q = {f"t{t}": float(rng.uniform(0.1, 3.0)) for t in rng.choice(70, size=5, replace=False)}
        expected = {}
        for d, vec in docs.items():
            s = sum(np.float32(w) * java_truncate(vec[t]) for t, w in q.items() if t in vec)
            if s > 0:
                expected[d] = s
        hits = index.search({"query": {"neural_sparse": {"emb": {"query_tokens": q}}}, "size": 1000})["hits"]
        assert hits["total"]["value"] == len(expected)
        got = {h["_id"]: h["_score"] for h in hits["hits"]}
        assert got.keys() == expected.keys()
        for d, s in expected.items():
            assert got[d] == pytest.approx(float(s), rel=1e-6)
        scores = [h["_score"] for h in hits["hits"]]
        assert scores == sorted(scores, reverse=True)


def test_batch_scoring_equals_search(index):
    import scipy.sparse as sp

    docs = random_docs(80)
    index.bulk({"_id": d, "_source": {"emb": v}} for d, v in docs.items())
    terms = [f"t{i}" for i in range(70)]
    q = sp.random(6, 70, density=0.1, random_state=3, format="csr", dtype=np.float32)
    q.data = q.data + 0.1
    rows, scores, ids = index.score_matrix("emb", q, terms, k=10)
    for i in range(q.shape[0]):
        row = q[i]
        tokens = {terms[j]: float(w) for j, w in zip(row.indices, row.data)}
        if not tokens:
            assert rows[i] == []
            continue
        hits = index.search({"query": {"neural_sparse": {"emb": {"query_tokens": tokens}}}, "size": 10})["hits"]["hits"]
        assert [h["_id"] for h in hits] == [ids[r] for r in rows[i]]
        assert [h["_score"] for h in hits] == pytest.approx(scores[i], rel=1e-6)


def test_overwrite_delete_and_reopen(tmp_path):
    path = tmp_path / "idx"
    idx = LocalIndex.create(path, MAPPINGS)
    r = idx.bulk([{"_id": "a", "_source": {"emb": {"x": 1.0}, "lang": "ko"}},
                  {"_id": "b", "_source": {"emb": {"x": 2.0}, "lang": "en"}}])
    assert [i["index"]["status"] for i in r["items"]] == [201, 201]
    r = idx.bulk([{"_id": "a", "_source": {"emb": {"y": 3.0}, "lang": "ko"}}])
    assert r["items"][0]["index"]["result"] == "updated"
    r = idx.bulk([{"_op_type": "delete", "_id": "b"}, {"_op_type": "delete", "_id": "zz"}])
    assert [i["delete"]["status"] for i in r["items"]] == [200, 404]
    again = LocalIndex.open(path)
    assert again.count() == 1
    assert again.get("a") == {"lang": "ko", "emb": {"y": 3.0}}
    hits = again.search({"query": {"neural_sparse": {"emb": {"query_tokens": {"x": 1.0, "y": 1.0}}}}})["hits"]["hits"]
    assert [(h["_id"], h["_score"]) for h in hits] == [("a", 3.0)]
    again.force_merge()
    assert len(json.loads((path / "manifest.json").read_text())["segments"]) == 1
    assert LocalIndex.open(path).count() == 1


def test_crash_leftovers_are_ignored(tmp_path):
    path = tmp_path / "idx"
    idx = LocalIndex.create(path, MAPPINGS)
    idx.bulk([{"_id": "a", "_source": {"emb": {"x": 1.0}}}])
    # a segment written but never committed, and a half-written manifest temp file
    (path / "seg-000099.npz").write_bytes(b"garbage")
    (path / "manifest.json.tmp").write_text("{not json")
    again = LocalIndex.open(path)
    assert again.count() == 1
    again.bulk([{"_id": "b", "_source": {"emb": {"x": 1.0}}}])
    assert LocalIndex.open(path).count() == 2


def test_filters_and_source_and_paging(index):
    index.bulk([{"_id": f"d{i}", "_source": {"text": f"doc {i}", "emb": {"x": 1.0 + i}, "lang": "ko" if i % 2 else "en",
                                             "year": 2000 + i}} for i in range(10)])
    ns = {"neural_sparse": {"emb": {"query_tokens": {"x": 1.0}}}}
    body = {"query": {"bool": {"must": [ns], "filter": [{"term": {"lang": "ko"}}]}}, "_source": ["text"], "size": 3}
    resp = index.search(body)
    assert resp["hits"]["total"]["value"] == 5
    assert [h["_id"] for h in resp["hits"]["hits"]] == ["d9", "d7", "d5"]
    assert resp["hits"]["hits"][0]["_source"] == {"text": "doc 9"}
    resp = index.search({**body, "from": 3})
    assert [h["_id"] for h in resp["hits"]["hits"]] == ["d3", "d1"]
    resp = index.search({"query": {"bool": {"must": [ns], "filter": {"terms": {"year": [2001, 2002]}},
                                            "must_not": [{"ids": {"values": ["d2"]}}]}}, "_source": False})
    assert [h["_id"] for h in resp["hits"]["hits"]] == ["d1"] and "_source" not in resp["hits"]["hits"][0]
    resp = index.search({"query": {"bool": {"filter": [{"term": {"lang": "en"}}]}}, "size": 0})
    assert resp["hits"]["total"]["value"] == 5 and resp["hits"]["hits"] == []
    excl = index.search({"query": ns, "_source": {"excludes": ["emb"]}, "size": 1})["hits"]["hits"][0]["_source"]
    assert "emb" not in excl and excl["text"] == "doc 9"


def test_empty_index_and_bad_queries(tmp_path, index):
    ns = {"neural_sparse": {"emb": {"query_tokens": {"x": 1.0}}}}
    empty = index.search({"query": ns})
    assert empty["hits"]["total"] == {"value": 0, "relation": "eq"} and empty["hits"]["hits"] == []
    with pytest.raises(LocalIndexError, match="no such index") as err:
        LocalIndex.open(tmp_path / "missing")
    assert err.value.status == 404 and err.value.to_response()["error"]["type"] == "index_not_found_exception"
    with pytest.raises(LocalIndexError, match="already exists"):
        LocalIndex.create(index.path, MAPPINGS)
    bad = [
        ({"neural_sparse": {"emb": {"query_tokens": {"x": 65.0}}}}, r"weight must be in \(0, 64.0\]"),
        ({"neural_sparse": {"emb": {"query_tokens": {"x": 0.0}}}}, r"weight must be in \(0, 64.0\]"),
        ({"neural_sparse": {"emb": {"query_tokens": {"x": -1}}}}, r"weight must be in \(0, 64.0\]"),
        ({"neural_sparse": {"text": {"query_tokens": {"x": 1.0}}}}, r"only works on \[rank_features\] fields"),
        ({"neural_sparse": {"emb": {"query_tokens": {"x": 1.0}, "k": 3}}}, r"does not support \[k\] field"),
        ({"neural_sparse": {"emb": {"query_text": "hi", "model_id": "m", "analyzer": "a"}}}, "model_id"),
        ({"neural_sparse": {"emb": {"query_text": "hi", "model_id": "nope"}}}, "Failed to find model"),
        ({"neural_sparse": {"emb": {"query_text": "hi"}}}, r"analyzer \[bert-uncased\] is not available"),
        ({"neural_sparse": {"emb": {}}}, "query_text or query_tokens"),
        ({"match": {"lang": "x"}}, r"\[match\] on text fields only"),
        ({"hybrid": {"queries": [{"match_all": {}}]}}, "needs a search pipeline"),
        ({"term": {"lang": "ko"}}, "bool.filter"),
    ]
    for query, msg in bad:
        with pytest.raises(LocalIndexError, match=msg):
            index.search({"query": query})
    with pytest.raises(LocalIndexError, match="Result window is too large"):
        index.search({"query": ns, "from": 9995, "size": 10})
    with pytest.raises(LocalIndexError, match="Unknown key"):
        index.search({"query": ns, "aggs": {}})


def test_bulk_validates_document_weights(index):
    resp = index.bulk([
        {"_id": "ok", "_source": {"emb": {"x": 1.0}}},
        {"_id": "neg", "_source": {"emb": {"x": -0.5}}},
        {"_id": "zero", "_source": {"emb": {"x": 0.0}}},
        {"_id": "subnormal", "_source": {"emb": {"x": 1e-40}}},
        {"_id": "nan", "_source": {"emb": {"x": float("nan")}}},
        {"_id": "str", "_source": {"emb": {"x": "1"}}},
        {"_id": "emptykey", "_source": {"emb": {"": 1.0}}},
    ])
    assert resp["errors"]
    status = {next(iter(i.values()))["_id"]: next(iter(i.values())) for i in resp["items"]}
    assert status["ok"]["status"] == 201
    for bad in ("neg", "zero", "subnormal"):
        assert status[bad]["status"] == 400
        assert "featureValue must be a positive normal float" in status[bad]["error"]["reason"]
    assert "must be finite" in status["nan"]["error"]["reason"]
    assert "strictly positive float" in status["str"]["error"]["reason"]
    assert "non-empty" in status["emptykey"]["error"]["reason"]
    assert index.count() == 1


def test_dynamic_rank_features_mapping_and_query_text_with_registered_encoder(tmp_path):
    idx = LocalIndex.create(tmp_path / "dyn")
    idx.bulk([{"_id": "a", "_source": {"vec": {"서울": 2.0, "도시": 1.0}, "title": "서울"}}])
    assert idx.vector_fields == ["vec"]
    idx.register_model("enc", lambda text: {tok: 1.5 for tok in text.split()})
    hits = idx.search({"query": {"neural_sparse": {"vec": {"query_text": "서울 도시", "model_id": "enc"}}}})
    assert hits["hits"]["hits"][0]["_score"] == pytest.approx(4.5)
