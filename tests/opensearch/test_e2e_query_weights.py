"""Query weights OpenSearch accepts : idf.json keeps every token, stays in (0, 64];
client-side query weights above 64 (sum pooling) are clipped instead of drawing an HTTP 400."""
from __future__ import annotations

import json
import logging

import pytest
import torch
from double.fixtures import make_double

from opensearch_lsr.inference_free import idf_from_weights
from opensearch_lsr.opensearch.client import client_from_options
from opensearch_lsr.idf import IDF_FLOOR, load_idf
from opensearch_lsr.opensearch.query import cap_query_weights, neural_sparse_query, search_body, tokenize_query


def test_idf_json_never_drops_a_token(tiny_target_tokenizer_dir):
    """ML Commons reads a missing idf.json key as 1.0: a learned weight <= 0 must stay in the file."""
    from opensearch_lsr.contract import decode_keys, djl_tokenizer

    tok = djl_tokenizer(tiny_target_tokenizer_dir)
    keys = decode_keys(tok)
    weights = torch.full((len(keys),), 2.0)
    target = next(i for i, k in enumerate(keys) if k and k.isalpha())
    weights[target] = -0.5           # learned "ignore this token"
    weights[target + 1] = 100.0      # would be refused by Lucene
    idf = idf_from_weights(tok, weights)
    assert set(idf) == {k for k in keys if k}
    assert idf[keys[target]] == IDF_FLOOR and idf[keys[target + 1]] == 64.0
    # what ML Commons' SPARSE_TOKENIZE then returns for that token: the floor, not 1.0
    text = keys[target]
    assert tokenize_query(text, tok, idf)[keys[target]] == pytest.approx(IDF_FLOOR)


@pytest.mark.parametrize("value", [0.0, -1.0, 64.5])
def test_user_idf_json_outside_the_range_is_refused(tmp_path, value):
    path = tmp_path / "idf.json"
    path.write_text(json.dumps({"a": 1.0, "b": value}))
    with pytest.raises(ValueError, match=r"outside \(0, 64\].*'b'"):
        load_idf(path)
    path.write_text(json.dumps({"a": 1e-3, "b": 64.0}))
    assert load_idf(path) == {"a": 1e-3, "b": 64.0}


def test_query_weights_above_64_are_clipped_not_sent(caplog):
    """A sum-pooled encoder can produce weights > 64; OpenSearch answers those with HTTP 400."""
    from opensearchpy.exceptions import RequestError

    double = make_double("3.3.0")
    try:
        client = client_from_options(url=double.url, max_retries=0)
        client.indices.create(index="p", body={"mappings": {"properties": {"e": {"type": "rank_features"}}}})
        client.index(index="p", id="a", body={"e": {"x": 1.0, "y": 1.0}}, refresh=True)
        raw = {"x": 80.0, "y": 2.0, "z": 0.0}
        with pytest.raises(RequestError, match=r"weight must be in \(0, 64.0\]"):
            client.search(index="p", body={"query": {"neural_sparse": {"e": {"query_tokens": raw}}}})
        with caplog.at_level(logging.WARNING, logger="opensearch_lsr.opensearch.query"):
            capped = cap_query_weights(raw)
        assert capped == {"x": 64.0, "y": 2.0} and "sum-pooled" in caplog.text
        hits = client.search(index="p", body=search_body(neural_sparse_query("e", query_tokens=capped)))["hits"]["hits"]
        assert hits[0]["_score"] == pytest.approx(66.0)
    finally:
        double.stop()
