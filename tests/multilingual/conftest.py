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


@pytest.fixture(scope="session")
def tiny_xlmr_dir(tmp_path_factory) -> Path:
    """Random 2-layer, 32-wide XLMRobertaModel + a unigram tokenizer trained on the bitext."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, XLMRobertaConfig, XLMRobertaModel

    path = tmp_path_factory.mktemp("tiny_xlmr")
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=120, special_tokens=specials, unk_token="<unk>")
    tok.train_from_iterator([t for pair in BITEXT for t in pair] * 4, trainer=trainer)
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
