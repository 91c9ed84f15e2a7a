"""Frequency-truncated source vocabularies (the fast SemBridge candidates of the notebook and quickstart)."""
from __future__ import annotations

import json

import pytest
import torch

from opensearch_lsr.source_vocab import SourceVocabConfig, select_frequent_ids, truncate_source_vocabulary


def test_select_frequent_ids_keeps_specials_ascii_chars_then_lowest_ids():
    vocab = {"[PAD]": 0, "[unused0]": 1, "[UNK]": 2, "a": 3, "##a": 4, "é": 5, "the": 6, "of": 7, "##s": 8, "cat": 9}
    # forced: specials 0, 2 and ASCII single characters a, ##a, ##s; then "the" (lowest free id)
    assert select_frequent_ids(vocab, {0, 2}, 6) == [0, 2, 3, 4, 6, 8]
    assert select_frequent_ids(vocab, {0, 2}, 7) == [0, 2, 3, 4, 6, 7, 8]  # [unused0] and "é" skipped
    assert select_frequent_ids(vocab, {0, 2}, 1) == [0, 2, 3, 4, 8]  # forced groups exceed keep
    with pytest.raises(ValueError, match="keep must be >= 1"):
        select_frequent_ids(vocab, set(), 0)


def test_truncated_source_is_a_restriction_of_the_original(tiny_source_dir, tmp_path):
    from opensearch_lsr.transfer.surgery import load_source_model, load_sparse_encoder

    _, tok = load_source_model(str(tiny_source_dir))
    out = truncate_source_vocabulary(str(tiny_source_dir), 12, tmp_path / "src")
    model, small = load_source_model(str(out))
    kept = [t for t, _ in sorted(small.get_vocab().items(), key=lambda kv: kv[1])]
    assert len(kept) == 12 and kept[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    # the ASCII single characters "a" and "##s" are always kept, then the lowest ids
    assert kept[5:] == ["house", "cat", "cats", "dog", "capital", "a", "##s"]
    assert model.config.vocab_size == 12 and SourceVocabConfig.load(out).kept == 12
    # special ids are remapped consistently (post-processor adds the new [CLS]/[SEP] ids)
    ids = small("cat house")["input_ids"]
    assert ids[0] == small.cls_token_id and ids[-1] == small.sep_token_id and small.cls_token_id < 12
    # document vectors on the kept tokens equal the full model's
    full, cut = load_sparse_encoder(str(tiny_source_dir)), load_sparse_encoder(str(out))
    texts = ["cat house", "a dog capital cats"]  # only kept tokens: identical inputs
    a = full.encode_document(texts, convert_to_tensor=True).to_dense()
    b = cut.encode_document(texts, convert_to_tensor=True).to_dense()
    cols = [tok.convert_tokens_to_ids(t) for t in kept]
    torch.testing.assert_close(b, a[:, cols], atol=1e-5, rtol=1e-5)
    # a second call reuses the directory; another size rebuilds it
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert truncate_source_vocabulary(str(tiny_source_dir), 12, out) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime
    truncate_source_vocabulary(str(tiny_source_dir), 10, out)
    assert json.loads((out / "source_vocab_config.json").read_text())["kept"] == 10


def test_truncate_rejects_bad_keep(tiny_source_dir, tmp_path):
    with pytest.raises(ValueError, match="keep must be >= 1"):
        truncate_source_vocabulary(str(tiny_source_dir), 0, tmp_path / "x")
