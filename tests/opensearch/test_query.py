"""tokenize_query equals ML Commons SPARSE_TOKENIZE (via the ML Commons model runtime); DSL builder."""
from __future__ import annotations

import json
import zipfile

import pytest

from opensearch_lsr.contract import decode_keys
from opensearch_lsr.encoding.query_tokens import tokenize_query
from opensearch_lsr.opensearch.query import bool_query, neural_sparse_query, search_body

TEXTS = ["서울은 한국의 수도", "the cat and the cats", "고양이 고양이 고양이 집", "", "   ", "집" * 700,
         "unknown 단어 [MASK] [CLS]", "House of the CAT"]


def make_tokenize_zip(tokenizer, idf, path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer)) if not hasattr(tokenizer, "backend_tokenizer") else tokenizer
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("tokenizer.json", tok.backend_tokenizer.to_str())
        if idf is not None:
            zf.writestr("idf.json", json.dumps(idf, ensure_ascii=False))
    return path, tok


@pytest.mark.parametrize("with_idf", [True, False])
def test_tokenize_query_equals_mlcommons_runtime(tiny_target_tokenizer_dir, tmp_path, with_idf):
    conformance = pytest.importorskip("opensearch_lsr.opensearch.conformance")
    idf = {"서울": 3.25, "고양이": 2.5, "##의": 0.125, "cat": 7.0, "the": 0.33333334} if with_idf else None
    zpath, tok = make_tokenize_zip(tiny_target_tokenizer_dir, idf, tmp_path / "tok.zip")
    rt = conformance.MLCommonsRuntime.from_zip(zpath, "SPARSE_TOKENIZE")
    for fmt in ("word", "token_id"):
        expected = rt.predict(TEXTS, embedding_format=fmt)
        got = [tokenize_query(t, tok, idf, key_format=fmt) for t in TEXTS]
        assert got == expected
        # the path form (a dir with tokenizer.json) gives the same
        assert [tokenize_query(t, tiny_target_tokenizer_dir, idf, key_format=fmt) for t in TEXTS] == expected


def test_tokenize_query_semantics(tiny_target_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_target_tokenizer_dir))
    idf = {"고양이": 2.0}
    out = tokenize_query("고양이 고양이 집 zzz", tok, idf)
    # distinct ids (no term frequency), missing idf -> 1.0, [UNK]/[CLS]/[SEP] dropped (empty decode)
    assert out == {"고양이": 2.0, "집": 1.0}
    assert tokenize_query("", tok, idf) == {}
    keys = decode_keys(tok)
    assert keys[tok.cls_token_id] == "" and keys[tok.convert_tokens_to_ids("##이")] == "##이"
    with pytest.raises(ValueError, match="key_format"):
        tokenize_query("x", tok, idf, key_format="ids")


def test_tokenize_query_kobigbird_equals_runtime(shared_data, tmp_path):
    conformance = pytest.importorskip("opensearch_lsr.opensearch.conformance")
    from opensearch_lsr.evaluation.datasets import load_beir

    tokdir = shared_data / "kobigbird-bert-base-tokenizer"
    queries = list(load_beir(shared_data / "msmarco-ko", "dev").queries.values())[:200]
    zpath, tok = make_tokenize_zip(tokdir, {"서울": 4.0}, tmp_path / "tok.zip")
    rt = conformance.MLCommonsRuntime.from_zip(zpath, "SPARSE_TOKENIZE")
    assert [tokenize_query(q, tok, {"서울": 4.0}) for q in queries] == rt.predict(queries)


def test_neural_sparse_query_builder():
    assert neural_sparse_query("emb", query_tokens={"a": 1, "b": 2.5}) == {
        "neural_sparse": {"emb": {"query_tokens": {"a": 1.0, "b": 2.5}}}}
    assert neural_sparse_query("emb", query_text="서울", model_id="m1", boost=2) == {
        "neural_sparse": {"emb": {"query_text": "서울", "model_id": "m1", "boost": 2.0}}}
    assert neural_sparse_query("emb", query_text="hi", analyzer="bert-uncased", version="3.1.0")[
        "neural_sparse"]["emb"]["analyzer"] == "bert-uncased"
    bad = [
        (dict(query_text="x", query_tokens={"a": 1}), "exactly one"),
        (dict(), "exactly one"),
        (dict(query_text="x", model_id="m", analyzer="a"), "together"),
        (dict(query_tokens={"a": 65}), r"\(0, 64.0\]"),
        (dict(query_tokens={"a": 0}), r"\(0, 64.0\]"),
        (dict(query_tokens={}), "empty"),
        (dict(query_tokens={"": 1.0}), "non-empty"),
        (dict(query_tokens={"a": 1}, version="2.13.0"), "2.14"),
        (dict(query_text="x", analyzer="bert-uncased", version="2.19.0"), "3.1"),
        (dict(query_text="x", version="2.12.0"), "2.13"),
        (dict(query_text="  "), "non-empty"),
    ]
    for kwargs, msg in bad:
        with pytest.raises(ValueError, match=msg):
            neural_sparse_query("emb", **kwargs)


def test_bool_query_and_search_body():
    ns = neural_sparse_query("emb", query_tokens={"a": 1})
    assert bool_query(ns) == ns
    q = bool_query(ns, {"lang": "ko", "tag": ["x", "y"]})
    # should + minimum_should_match, not must: neural-search's two-phase processor only looks under should
    assert q == {"bool": {"should": [ns], "minimum_should_match": 1,
                          "filter": [{"term": {"lang": "ko"}}, {"terms": {"tag": ["x", "y"]}}]}}
    assert search_body(q, size=5, from_=10, source=["text"], explain=True) == {
        "query": q, "size": 5, "from": 10, "_source": ["text"], "explain": True}
