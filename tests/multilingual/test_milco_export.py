"""A MILCO model exports as an ML Commons sparse model (TOKEN_ID keys) and passes the conformance check."""
from __future__ import annotations

import json

import pytest

from opensearch_lsr.opensearch.artifacts import ExportError, export_bundle
from opensearch_lsr.opensearch.conformance import MLCommonsRuntime

TEXTS = ["서울은 한국의 수도이다", "the cat is in the house", "고양이 cat 서울 seoul"]


def test_milco_export_passes_conformance(tiny_milco_dir, tmp_path):
    bundle = tmp_path / "bundle"
    manifest = export_bundle(tiny_milco_dir, bundle, verify_texts=TEXTS)
    head = json.loads((tiny_milco_dir / "1_LexEchoHead" / "lexecho_config.json").read_text())
    v_src, v_en = head["source_vocab_size"], head["pivot_vocab_size"]
    assert manifest["key_format"] == "token_id" and manifest["min_opensearch_version"] == "3.2.0"
    assert manifest["output_dim"] == v_src + v_en and manifest["views"]["pivot"] == [v_src, v_src + v_en]
    report = manifest["conformance"]
    assert report["passed"], report
    assert report["max_abs_weight_diff"] <= 1e-4 and report["key_mismatches_above_atol"] == 0
    assert not manifest["torchscript"]["devices"]  # no device constant: deployable on any ML node

    encoding = MLCommonsRuntime.from_zip(bundle / "sparse_encoding.zip", "SPARSE_ENCODING")
    encoding.output_dim = manifest["output_dim"]
    tokenize = MLCommonsRuntime.from_zip(bundle / "sparse_tokenize.zip", "SPARSE_TOKENIZE")
    for text, doc, query in zip(TEXTS, encoding.predict(TEXTS, "token_id"), tokenize.predict(TEXTS, "token_id")):
        ids = {int(k) for k in doc}
        assert any(i >= v_src for i in ids) and any(i < v_src for i in ids), text  # both views arrive
        # the inference-free query side (SPARSE_TOKENIZE, encoder tokenizer) hits the source view's keys
        assert set(query) and set(query) <= {k for k in doc if int(k) < v_src}


def test_milco_export_refuses_word_keys(tiny_milco_dir, tmp_path):
    with pytest.raises(ExportError, match="token_id"):
        export_bundle(tiny_milco_dir, tmp_path / "b", key_format="word", verify=False)


def test_document_encoder_routes_milco(tiny_milco_dir, tmp_path):
    """SparseDocumentEncoder(milco dir) -> MilcoDocumentEncoder: the SparseEncoder's vectors, token_id keys only,
    and the keyed (local index / eval) path gives the exported graph's TOKEN_ID maps."""
    import torch

    from opensearch_lsr.encoding.encoder import MilcoDocumentEncoder, SparseDocumentEncoder
    from opensearch_lsr.encoding.keyed import SparseKeyedEncoder
    from opensearch_lsr.multilingual.milco import load_milco

    enc = SparseDocumentEncoder(str(tiny_milco_dir), device="cpu", batch_size=2)
    assert isinstance(enc, MilcoDocumentEncoder)
    reference = load_milco(tiny_milco_dir).encode(TEXTS, convert_to_tensor=True).to_dense()
    assert torch.allclose(enc.encode_dense(TEXTS), reference, atol=1e-5)
    vectors = enc.encode(TEXTS)
    assert [v.ids.tolist() for v in vectors] == [torch.nonzero(r).flatten().tolist() for r in reference]
    with pytest.raises(ValueError, match="token_id"):
        enc.keys
    bundle = tmp_path / "bundle"
    manifest = export_bundle(tiny_milco_dir, bundle, verify=False)
    runtime = MLCommonsRuntime.from_zip(bundle / "sparse_encoding.zip", "SPARSE_ENCODING")
    runtime.output_dim = manifest["output_dim"]
    keyed = SparseKeyedEncoder(str(tiny_milco_dir), key_format="token_id").encode(TEXTS, "document")
    for mine, served in zip(keyed, runtime.predict(TEXTS, "token_id")):
        assert set(mine) == set(served)
        assert max(abs(mine[k] - served[k]) for k in mine) <= 1e-4


def test_elasticsearch_export_refuses_milco_in_one_sentence(tiny_milco_dir, tmp_path):
    from opensearch_lsr.elasticsearch.export import EsExportError, export_elasticsearch

    with pytest.raises(EsExportError, match="MLM \\+ SpladePooling"):
        export_elasticsearch(tiny_milco_dir, tmp_path / "es", verify=False)
