"""Session-scoped fixtures: tiny models built by the tests, SPLADE-tiny, the shared dev data."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SOURCE_WORDS = ["house", "cat", "cats", "dog", "capital", "city", "paris", "france", "seoul", "korea",
                "water", "river", "car", "road", "book", "school", "the", "a", "is", "of", "##s", "##ing"]
TARGET_WORDS = ["집", "고양이", "개", "수도", "도시", "서울", "한국", "물", "강", "자동차", "책", "학교",
                "house", "cat", "seoul", "##s", "##이", "##의", "는", "은", "를"]


def _write_wordpiece(dirpath: Path, words: list[str], lowercase: bool, save_fast: bool = True) -> None:
    """vocab.txt + tokenizer_config.json (the kobigbird layout); with ``save_fast`` also tokenizer.json."""
    import json

    from transformers import AutoTokenizer

    dirpath.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    (dirpath / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (dirpath / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": lowercase, "strip_accents": None,
        "model_max_length": 512, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
        "cls_token": "[CLS]", "mask_token": "[MASK]"}), encoding="utf-8")
    if save_fast:
        tok = AutoTokenizer.from_pretrained(str(dirpath), use_fast=True)
        assert len(tok) == len(vocab), (len(tok), len(vocab))
        tok.save_pretrained(str(dirpath))


@pytest.fixture(scope="session")
def tiny_source_dir(tmp_path_factory) -> Path:
    """A random tiny BertForMaskedLM (tied decoder) with an English WordPiece vocab."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    path = tmp_path_factory.mktemp("tiny_source")
    _write_wordpiece(path, SOURCE_WORDS, lowercase=True)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=5 + len(SOURCE_WORDS), hidden_size=16, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=64,
                     tie_word_embeddings=True)
    model = BertForMaskedLM(cfg)
    with torch.no_grad():
        model.cls.predictions.bias.normal_(0, 0.5)
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def tiny_target_tokenizer_dir(tmp_path_factory) -> Path:
    """A tiny cased Korean+English WordPiece tokenizer (vocab.txt + tokenizer_config, like kobigbird)."""
    path = tmp_path_factory.mktemp("tiny_target_tok")
    _write_wordpiece(path, TARGET_WORDS, lowercase=False, save_fast=False)
    return path


@pytest.fixture(scope="session")
def splade_tiny_dir() -> Path:
    from opensearch_lsr.resources import splade_tiny_path

    try:
        return splade_tiny_path()
    except FileNotFoundError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    from opensearch_lsr.resources import shared_data_dir

    path = shared_data_dir()
    if path is None:
        pytest.skip("../shared/data is not present")
    return path
