"""Doc-only encoders: Router(query=SparseStaticEmbedding(IDF), document=MLM+SpladePooling) save/load."""
from __future__ import annotations

import pytest
import torch

from opensearch_lsr.inference_free import (build_inference_free, idf_weight_vector, inference_free_parts,
                                           is_inference_free, load_inference_free)
from opensearch_lsr.encoding.query_tokens import tokenize_query


def test_router_build_save_load_and_query_side_equals_sparse_tokenize(tiny_source_dir, tmp_path):
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import Router, SparseStaticEmbedding

    idf = {"cat": 4.0, "house": 2.5, "the": 0.1, "##s": 0.75}
    out = tmp_path / "ifree"
    built = build_inference_free(tiny_source_dir, out, idf=idf)
    assert is_inference_free(out) and not is_inference_free(tiny_source_dir)
    model = SparseEncoder(str(out), device="cpu")  # plain sentence-transformers load
    assert isinstance(model[0], Router)
    assert isinstance(model[0].sub_modules["query"][0], SparseStaticEmbedding)
    assert load_inference_free(out).get_embedding_dimension() == built.get_embedding_dimension()

    texts = ["the cat in the house", "cats cats the", "paris france road", "unknownword"]
    q = model.encode_query(texts, convert_to_sparse_tensor=False)
    keys = [model.tokenizer.convert_ids_to_tokens(i) for i in range(q.shape[1])]
    for text, row in zip(texts, q):
        got = {keys[i]: float(row[i]) for i in torch.nonzero(row).ravel().tolist()}
        assert got == tokenize_query(text, model.tokenizer, idf)

    # the document route is the original MLM + SpladePooling: same vectors as the source model
    from opensearch_lsr.transfer.surgery import load_sparse_encoder

    src = load_sparse_encoder(str(tiny_source_dir))
    d_src = src.encode_document(texts, convert_to_tensor=True)
    d_new = model.encode_document(texts, convert_to_tensor=True)
    assert torch.allclose(d_src.to_dense() if d_src.is_sparse else d_src,
                          d_new.to_dense() if d_new.is_sparse else d_new, atol=1e-6)

    transformer_dir, idf_back = inference_free_parts(out)
    assert (transformer_dir / "config.json").exists() and idf_back == idf


def test_idf_weight_vector_defaults_and_specials(tiny_source_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_source_dir))
    w = idf_weight_vector(tok, {"cat": 3.0})
    assert w[tok.convert_tokens_to_ids("cat")] == 3.0
    assert w[tok.convert_tokens_to_ids("dog")] == 1.0
    assert all(w[i] == 0.0 for i in tok.all_special_ids)
    assert torch.all(idf_weight_vector(tok, None)[[tok.convert_tokens_to_ids("dog")]] == 1.0)


def test_transferred_idf_and_cli(tiny_source_dir, tmp_path):
    """``lsr-os inference-free`` with a corpus IDF, an idf.json, and a source IDF carried through
    ``alignment.npz`` (here a permutation: each target token takes exactly one source token's IDF)."""
    import json
    import shutil

    import numpy as np
    import scipy.sparse as sp
    from click.testing import CliRunner
    from transformers import AutoTokenizer

    from opensearch_lsr.cli import cli
    from opensearch_lsr.inference_free import transferred_idf

    model = tmp_path / "model"
    shutil.copytree(tiny_source_dir, model)
    tok = AutoTokenizer.from_pretrained(str(model))
    v = len(tok)
    cat, dog = tok.convert_tokens_to_ids("cat"), tok.convert_tokens_to_ids("dog")
    perm = np.arange(v)
    perm[[cat, dog]] = [dog, cat]  # target "cat" was built from source "dog" and vice versa
    sp.save_npz(model / "alignment.npz", sp.csr_matrix((np.ones(v, np.float32), (np.arange(v), perm)), shape=(v, v)))
    (model / "transfer_config.json").write_text(json.dumps({"source": str(tiny_source_dir)}))
    src_idf = {"cat": 1.5, "dog": 4.0, "house": 2.0}
    (tmp_path / "src_idf.json").write_text(json.dumps(src_idf))
    got = transferred_idf(model, tmp_path / "src_idf.json")
    assert got["cat"] == 4.0 and got["dog"] == 1.5 and got["house"] == 2.0
    assert got["river"] == 1.0  # ML Commons' default for a source token the table lacks
    with pytest.raises(ValueError, match="not a transfer output"):
        transferred_idf(tiny_source_dir, src_idf)

    runner = CliRunner()
    res = runner.invoke(cli, ["inference-free", "--model", str(model), "--out", str(tmp_path / "t"),
                              "--source-idf", str(tmp_path / "src_idf.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "t" / "idf.json").read_text())["cat"] == 4.0 and is_inference_free(tmp_path / "t")
    (tmp_path / "c.txt").write_text("the cat\nthe dog\nthe house\n")
    res = runner.invoke(cli, ["inference-free", "--model", str(model), "--out", str(tmp_path / "c"),
                              "--idf-corpus", str(tmp_path / "c.txt")])
    assert res.exit_code == 0, res.output
    corpus_idf = json.loads((tmp_path / "c" / "idf.json").read_text())
    assert corpus_idf["cat"] > corpus_idf["the"]  # df 1 of 3 vs 3 of 3
    res = runner.invoke(cli, ["inference-free", "--model", str(model), "--out", str(tmp_path / "j"),
                              "--idf-json", str(tmp_path / "src_idf.json")])
    assert res.exit_code == 0 and json.loads((tmp_path / "j" / "idf.json").read_text()) == src_idf
    bad = runner.invoke(cli, ["inference-free", "--model", str(model), "--out", str(tmp_path / "x")])
    assert bad.exit_code != 0 and "exactly one of" in bad.output
    bad = runner.invoke(cli, ["inference-free", "--model", str(tiny_source_dir), "--out", str(tmp_path / "x"),
                              "--source-idf", str(tmp_path / "src_idf.json")])
    assert bad.exit_code != 0 and "not a transfer output" in bad.output and "Traceback" not in bad.output


def test_query_tokens_for_a_doc_only_dir(tiny_source_dir, tmp_path):
    """`lsr-os search --mode tokens|hybrid --model DIR` with a doc-only (Router) dir: the tokenizer lives in the
    document Transformer's folder, not at the root; the tokens equal SPARSE_TOKENIZE's with the dir's idf.json."""
    from opensearch_lsr.opensearch.query import query_tokens_for

    idf = {"cat": 4.0, "house": 2.5, "the": 0.1}
    out = tmp_path / "ifree"
    model = build_inference_free(tiny_source_dir, out, idf=idf)
    assert not (out / "tokenizer.json").exists()
    text = "the cat in the house"
    assert query_tokens_for(text, out) == tokenize_query(text, model.tokenizer, idf)
