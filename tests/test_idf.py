"""IDF for the inference-free query side: formula, keys = single-id decode, corpus readers, transfer."""
from __future__ import annotations

import gzip
import json
import math
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp

from opensearch_lsr.corpus import iter_corpus_texts
from opensearch_lsr.idf import bm25_idf, compute_idf, load_idf, transfer_idf

DOCS = ["the cat is in the house", "the dog is in the city", "paris is the capital of france"]


@pytest.fixture(scope="module")
def source_tok(tiny_source_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_source_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def target_tok(tiny_target_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_target_tokenizer_dir))


def _decodes(tok):
    backend = getattr(tok, "backend_tokenizer", tok)
    n = backend.get_vocab_size(with_added_tokens=True)
    return [backend.decode([i], skip_special_tokens=True) for i in range(n)]


def test_compute_idf_formula_and_keys(source_tok):
    idf = compute_idf(iter(DOCS), source_tok, batch_size=2)  # streamed, several batches
    keys = {k for k in _decodes(source_tok) if k}
    assert set(idf) == keys  # every non-special token, keyed by single-id decode
    assert not {"[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"} & set(idf)
    n = len(DOCS)
    assert idf["the"] == pytest.approx(math.log1p((n - 3 + 0.5) / (3 + 0.5)))  # in all 3 docs, once per doc
    assert idf["cat"] == pytest.approx(math.log1p((n - 1 + 0.5) / (1 + 0.5)))
    assert idf["seoul"] == pytest.approx(math.log1p((n + 0.5) / 0.5))  # unseen: smoothed maximum
    assert all(v > 0 for v in idf.values())
    assert idf["seoul"] > idf["cat"] > idf["the"]


def test_bm25_idf_vectorised():
    np.testing.assert_allclose(bm25_idf(np.array([0, 5, 10]), 10),
                               [math.log1p(10.5 / 0.5), math.log1p(5.5 / 5.5), math.log1p(0.5 / 10.5)])


def test_compute_idf_empty_corpus_and_bad_tokenizer(source_tok):
    with pytest.raises(ValueError, match="empty"):
        compute_idf([], source_tok)
    with pytest.raises(TypeError):
        compute_idf(DOCS, object())


def test_compute_idf_from_tokenizer_path(tiny_source_dir, source_tok):
    assert compute_idf(DOCS, tiny_source_dir) == compute_idf(DOCS, source_tok)


def test_corpus_readers(tmp_path):
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in [
        {"_id": "1", "title": "서울", "text": "대한민국의 수도"}, {"_id": "2", "title": "", "text": "강"},
    ]) + "\n\n", encoding="utf-8")
    assert list(iter_corpus_texts(jsonl)) == ["서울 대한민국의 수도", "강"]
    assert list(iter_corpus_texts(tmp_path)) == ["서울 대한민국의 수도", "강"]  # BEIR dir
    txt = tmp_path / "docs.txt"
    txt.write_text("first doc\n\nsecond doc\n", encoding="utf-8")
    assert list(iter_corpus_texts(txt)) == ["first doc", "second doc"]
    gz = tmp_path / "docs.txt.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as fh:
        fh.write("a\nb\n")
    assert list(iter_corpus_texts(gz)) == ["a", "b"]
    with pytest.raises(ValueError, match="does not exist"):
        list(iter_corpus_texts(tmp_path / "missing.txt"))
    (tmp_path / "bad.jsonl").write_text("{nope\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        list(iter_corpus_texts(tmp_path / "bad.jsonl"))
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(ValueError, match="corpus.jsonl"):
        list(iter_corpus_texts(tmp_path / "emptydir"))
    (tmp_path / "notext.jsonl").write_text('{"_id": "3"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="'text' field"):  # reported, not dropped silently
        list(iter_corpus_texts(tmp_path / "notext.jsonl"))


def test_transfer_idf_copies_overlap_and_mixes(source_tok, target_tok):
    src_keys, tgt_keys = _decodes(source_tok), _decodes(target_tok)
    source_idf = compute_idf(DOCS, source_tok)
    s = {k: i for i, k in enumerate(src_keys) if k}
    t = {k: i for i, k in enumerate(tgt_keys) if k}
    A = sp.lil_matrix((len(tgt_keys), len(src_keys)))
    A[t["cat"], s["cat"]] = 1.0                      # overlap row: one-hot, copies
    A[t["고양이"], s["cat"]] = 3.0                    # mixed row: weighted mean
    A[t["고양이"], s["the"]] = 1.0
    A[t["집"], s["house"]] = 0.5
    A[t["집"], 2] = 0.5                               # a source special ([CLS]) carries no IDF: ignored
    out = transfer_idf(source_idf, source_tok, target_tok, A.tocsr(), default=7.0)
    assert set(out) == {k for k in tgt_keys if k}
    assert out["cat"] == pytest.approx(source_idf["cat"])
    assert out["고양이"] == pytest.approx((3 * source_idf["cat"] + source_idf["the"]) / 4)
    assert out["집"] == pytest.approx(source_idf["house"])
    assert out["서울"] == 7.0  # empty row -> default
    median = transfer_idf(source_idf, source_tok, target_tok, A.tocsr())
    assert median["서울"] == pytest.approx(float(np.median(list(source_idf.values()))))


def test_transfer_idf_bad_inputs(source_tok, target_tok):
    v_t, v_s = len(_decodes(target_tok)), len(_decodes(source_tok))
    idf = {"cat": 1.0}
    with pytest.raises(ValueError, match="shape"):
        transfer_idf(idf, source_tok, target_tok, sp.csr_matrix((v_s, v_t)))
    neg = sp.csr_matrix(([-1.0], ([5], [5])), shape=(v_t, v_s))
    with pytest.raises(ValueError, match="non-negative"):
        transfer_idf(idf, source_tok, target_tok, neg)
    with pytest.raises(ValueError, match="empty"):
        transfer_idf({}, source_tok, target_tok, sp.csr_matrix((v_t, v_s)))


def test_load_idf_from_json_zip_and_dir(tmp_path):
    table = {"cat": 1.5, "##s": 0.25}
    (tmp_path / "idf.json").write_text(json.dumps(table), encoding="utf-8")
    assert load_idf(tmp_path / "idf.json") == table
    assert load_idf(tmp_path) == table
    with zipfile.ZipFile(tmp_path / "sparse_tokenize.zip", "w") as zf:
        zf.writestr("tokenizer.json", "{}")
        zf.writestr("idf.json", json.dumps(table))
    assert load_idf(tmp_path / "sparse_tokenize.zip") == table
    with zipfile.ZipFile(tmp_path / "noidf.zip", "w") as zf:
        zf.writestr("tokenizer.json", "{}")
    with pytest.raises(ValueError, match="no idf.json"):
        load_idf(tmp_path / "noidf.zip")
    (tmp_path / "bad.json").write_text('{"cat": "high"}', encoding="utf-8")
    with pytest.raises(ValueError, match="finite number"):
        load_idf(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="does not exist"):
        load_idf(tmp_path / "missing.json")


def test_idf_keys_match_what_the_tokenize_model_looks_up(tmp_path, tiny_source_dir, source_tok):
    """The table is keyed so that ML Commons SPARSE_TOKENIZE finds every query token (no 1.0 fallback)."""
    from opensearch_lsr.opensearch.conformance import MLCommonsRuntime

    idf = compute_idf(DOCS, source_tok)
    with zipfile.ZipFile(tmp_path / "tok.zip", "w") as zf:
        zf.write(tiny_source_dir / "tokenizer.json", "tokenizer.json")
        zf.writestr("idf.json", json.dumps(idf))
    rt = MLCommonsRuntime.from_zip(tmp_path / "tok.zip", "SPARSE_TOKENIZE")
    (q,) = rt.predict(["the cats of paris dogs"])
    assert q and all(q[k] == pytest.approx(idf[k], rel=1e-6) for k in q)
    assert "##s" in q  # subword keys keep their WordPiece marker, like ML Commons' decode
