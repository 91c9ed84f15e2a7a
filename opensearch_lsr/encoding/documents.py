"""From encoded vectors to index documents: ids, sparse fields, the 512-token policy.

* ``_id``: the corpus id when there is one, else ``sha1(text)`` (deterministic, so a re-run or a
  resume overwrites instead of duplicating).
* Sparse field: ``rank_features`` with WORD keys (ML Commons' single-id ``decode``; specials decode
  to "" and are dropped; when two ids decode to the same key the later id overwrites, as the
  ``SparseEncodingTranslator`` map does) or ``sparse_vector`` TOKEN_ID keys (``str(id)``); then the
  neural-search prune type, applied to that map as the ingest processor does (contract section 4.1).
* Long texts (more than 512 tokens with specials, the DJL cap): ``truncate`` (what OpenSearch's own
  ingest does), or ``split`` into consecutive passages of at most 512 tokens that are indexed as a
  ``nested`` field, the shape the ``sparse_encoding`` processor gives a list input
  (``<sparse_field>: [{"sparse_encoding": {...}, "text": passage}, ...]``, mapped by
  :func:`nested_mapping`).
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..contract import DEFAULT_TEXT_ANALYZER, DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD, MAX_LENGTH, KeyFormat, check_key_format
from .sparse_vector import SparseVector
from ..pruning import PruneConfig, prune_arrays

__all__ = [
    "LongTextPolicy",
    "doc_id_for",
    "DocumentBuilder",
    "split_passages",
    "nested_mapping",
    "flat_mapping",
]

LongTextPolicy = Literal["truncate", "split"]


def doc_id_for(doc_id: str | None, text: str) -> str:
    """The document ``_id``: the corpus id, or the sha1 of the text when the corpus has none."""
    if doc_id is not None and doc_id != "":
        return str(doc_id)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def split_passages(text: str, tokenizer, max_length: int = MAX_LENGTH) -> list[str]:
    """Split ``text`` into consecutive passages of at most ``max_length`` tokens (specials included).

    Cuts fall on word starts where possible (a WordPiece continuation ``##x`` or a token glued to the
    previous one stays with its word), and passages are substrings of ``text`` (character offsets),
    so each passage is what a ``text_chunking`` step would hand to the model.
    """
    budget = max_length - tokenizer.num_special_tokens_to_add(pair=False)
    if budget < 1:
        raise ValueError(f"max_length {max_length} leaves no room for tokens")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, truncation=False, verbose=False)
    offsets = enc["offset_mapping"]
    if len(offsets) <= budget:
        return [text]
    # A token starts a word when there is a gap (whitespace) before it or it is the first token.
    word_start = [i == 0 or offsets[i][0] > offsets[i - 1][1] for i in range(len(offsets))]
    passages, start = [], 0
    while start < len(offsets):
        end = min(start + budget, len(offsets))
        if end < len(offsets):
            cut = end
            while cut > start + budget // 2 and not word_start[cut]:
                cut -= 1
            end = cut if word_start[cut] and cut > start else end
        piece = text[offsets[start][0]:offsets[end - 1][1]].strip()
        if piece:
            passages.append(piece)
        start = end
    return passages


@dataclass
class DocumentBuilder:
    """Builds ``_source`` documents from vectors.

    Args:
        keys: WORD key per vocabulary id (``encoder.keys``); unused for ``token_id``.
        key_format: ``"word"`` (``rank_features``) or ``"token_id"`` (``sparse_vector``).
        prune: the neural-search prune setting applied to each vector.
        text_field / sparse_field / id_field: field names (templates in ``mappings/``).
    """

    keys: Sequence[str] | None
    key_format: KeyFormat = "word"
    prune: PruneConfig = PruneConfig()
    text_field: str = DEFAULT_TEXT_FIELD
    sparse_field: str = DEFAULT_VECTOR_FIELD
    id_field: str | None = "id"

    def __post_init__(self) -> None:
        check_key_format(self.key_format)
        if self.key_format == "word" and self.keys is None:
            raise ValueError("key_format 'word' needs the tokenizer's keys")
        if self.text_field == self.sparse_field:
            raise ValueError("text_field and sparse_field must differ")

    def features(self, vector: SparseVector) -> dict[str, float]:
        """The sparse field value for one vector: keys per ``key_format``, pruned, weights > 0."""
        ids, weights = vector.ids, vector.weights
        if self.key_format == "token_id":
            ids, weights = prune_arrays(ids, weights, self.prune)
            return {str(int(i)): float(w) for i, w in zip(ids.tolist(), weights.tolist())}
        merged = self._word_features(ids, weights)
        if self.prune.prune_type == "none" or not merged:
            return merged
        names = list(merged)
        vals = np.fromiter(merged.values(), dtype=np.float32, count=len(names))
        kept, _ = prune_arrays(np.arange(len(names)), vals, self.prune)
        return {names[k]: merged[names[k]] for k in kept.tolist()}

    def _word_features(self, ids: np.ndarray, weights: np.ndarray) -> dict[str, float]:
        """:func:`~opensearch_lsr.contract.vector_to_keys` for ascending ids (every encoder's output), vectorised: the key table as a
        numpy object array, ids with an empty key dropped, ``dict(zip())`` keeping the later id's weight."""
        if getattr(self, "_key_array", None) is None:
            self._key_array = np.array(list(self.keys) + [""], dtype=object)  # type: ignore[arg-type]
            self._has_key = self._key_array != ""
        ids = np.minimum(ids, len(self._key_array) - 1)  # past the table: the empty key, dropped
        keep = self._has_key[ids]
        return dict(zip(self._key_array[ids[keep]].tolist(), weights[keep].tolist()))

    def source(self, doc_id: str | None, text: str, vector: SparseVector) -> dict:
        """A flat document: ``{id, text, sparse}``."""
        doc = {self.text_field: text, self.sparse_field: self.features(vector)}
        if self.id_field and doc_id is not None:
            doc = {self.id_field: doc_id, **doc}
        return doc

    def nested_source(self, doc_id: str | None, text: str, passages: Sequence[str],
                      vectors: Sequence[SparseVector]) -> dict:
        """A split document: the full text plus one nested ``{"sparse_encoding", "text"}`` per passage."""
        nested = [{"sparse_encoding": self.features(v), "text": p} for p, v in zip(passages, vectors)]
        doc = {self.text_field: text, self.sparse_field: nested}
        if self.id_field and doc_id is not None:
            doc = {self.id_field: doc_id, **doc}
        return doc


def flat_mapping(text_field: str = DEFAULT_TEXT_FIELD, sparse_field: str = DEFAULT_VECTOR_FIELD,
                 key_format: KeyFormat = "word", text_analyzer: str | None = DEFAULT_TEXT_ANALYZER) -> dict:
    """Minimal mapping for flat documents (the full templates live in ``mappings/``); ``text_analyzer``
    names the text field's analyzer (default ``nori``, as the templates analyse it; ``None``: the
    engine's ``standard``)."""
    sparse = {"type": "rank_features"} if key_format == "word" else {
        "type": "sparse_vector", "method": {"name": "seismic"}}
    text = {"type": "text", **({"analyzer": text_analyzer} if text_analyzer else {})}
    return {"properties": {"id": {"type": "keyword"}, text_field: text, sparse_field: sparse}}


def nested_mapping(text_field: str = DEFAULT_TEXT_FIELD, sparse_field: str = DEFAULT_VECTOR_FIELD,
                   key_format: KeyFormat = "word", text_analyzer: str | None = DEFAULT_TEXT_ANALYZER) -> dict:
    """Mapping for ``split`` documents: ``<sparse_field>`` nested, ``.sparse_encoding`` sparse; both text
    fields analysed with ``text_analyzer`` (as :func:`flat_mapping`)."""
    text = {"type": "text", **({"analyzer": text_analyzer} if text_analyzer else {})}
    sparse = {"type": "rank_features"} if key_format == "word" else {
        "type": "sparse_vector", "method": {"name": "seismic"}}
    return {"properties": {
        "id": {"type": "keyword"},
        text_field: text,
        sparse_field: {"type": "nested", "properties": {"sparse_encoding": sparse, "text": dict(text)}},
    }}
