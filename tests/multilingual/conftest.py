"""MILCO fixtures: a tiny random XLM-R encoder with a SentencePiece-unigram tokenizer (the e5 layout:
``<s> <pad> </s> <unk>`` specials, Metaspace), the conftest's tiny English MLM as the sparse head, a
tiny bitext and a built MILCO directory."""
from __future__ import annotations

from pathlib import Path

import pytest

BITEXT = [
    ("seoul is the capital of korea", "서울은 한국의 수도이다"),
    ("the cat is in the house", "고양이는 집에 있다"),
    ("the dog runs on the road", "개가 길을 달린다"),
    ("water of the river", "강의 물"),
    ("the school book", "학교 책"),
    ("paris is the capital of france", "파리는 프랑스의 수도이다"),
    ("a car on the road", "길 위의 자동차"),
    ("the city of seoul", "서울 도시"),
]


def _unigram_vocab(texts: list[str], size: int, specials: list[str]) -> list[tuple[str, float]]:
    """A unigram vocabulary of ``size`` pieces, the same in every process: the specials, every character (alone and
    word-initial, so any text of ``texts`` tokenizes), then the substrings of words covering the most characters
    (ties alphabetical); scores are log frequencies. (``tokenizers``' ``UnigramTrainer`` iterates Rust hash maps,
    whose order changes from one process to the next, and so did the vocabulary and every model built on it.)"""
    import math
    from collections import Counter

    words = Counter("\u2581" + w for t in texts for w in t.split())
    chars = Counter()
    subs = Counter()
    for w, n in words.items():
        for i in range(len(w)):
            chars[w[i]] += n
            for j in range(i + 2, len(w) + 1):
                subs[w[i:j]] += n
    base = sorted(chars)
    ranked = sorted(subs, key=lambda p: (-subs[p] * len(p), p))[:max(0, size - len(specials) - len(base))]
    total = sum(chars.values()) + sum(subs[p] for p in ranked)
    return ([(t, 0.0) for t in specials] + [(c, math.log(chars[c] / total)) for c in base]
            + [(p, math.log(subs[p] / total)) for p in ranked])


@pytest.fixture(scope="session")
def tiny_xlmr_dir(tmp_path_factory) -> Path:
    """Random 2-layer, 32-wide XLMRobertaModel + a unigram tokenizer trained on the bitext."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, XLMRobertaConfig, XLMRobertaModel

    path = tmp_path_factory.mktemp("tiny_xlmr")
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.Unigram(_unigram_vocab([t for pair in BITEXT for t in pair], 120, specials), unk_id=3))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                       special_tokens=[("<s>", 0), ("</s>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", mask_token="<mask>", cls_token="<s>", sep_token="</s>",
                                   model_max_length=64)
    fast.save_pretrained(str(path))
    torch.manual_seed(0)
    cfg = XLMRobertaConfig(vocab_size=len(fast), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=66, pad_token_id=1, bos_token_id=0,
                           eos_token_id=2)
    XLMRobertaModel(cfg, add_pooling_layer=False).save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def tiny_bitext(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bitext") / "bitext.tsv"
    path.write_text("".join(f"{en}\t{ko}\n" for en, ko in BITEXT), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_milco_dir(tiny_xlmr_dir, tiny_source_dir, tmp_path_factory) -> Path:
    """A saved MILCO model (no SAP): tiny XLM-R encoder + the tiny English MLM head."""
    from opensearch_lsr.multilingual.milco import MilcoConfig, milco_transfer

    out = tmp_path_factory.mktemp("milco")
    milco_transfer(MilcoConfig(encoder=str(tiny_xlmr_dir), sparse_head=str(tiny_source_dir), out=str(out),
                               sap=False, max_seq_length=32))
    return out
