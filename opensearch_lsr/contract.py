"""The engine contract in code: the numeric rules every engine, the encoder, the export and the
conformance check share (opensearch-contract.md; one place, imported everywhere, never restated).

Limits:
- :data:`MAX_LENGTH` 512: DJL (ML Commons 2.15+, DJL >= 0.28) truncates model inputs at 512 tokens,
  special tokens included, whatever tokenizer.json says (contract §2.1/§2.2).
- :data:`MAX_QUERY_WEIGHT` 64: neural-search rejects query token weights outside (0, 64]
  (``NeuralSparseQueryBuilder``; contract §4.2).
- :data:`FLOAT_MIN_NORMAL`: Lucene ``FeatureField`` rejects document values below Java
  ``Float.MIN_NORMAL`` (contract §6.1).
- 9-bit truncation: ``FeatureField`` stores ``intBitsToFloat((floatToIntBits(v) >>> 15) << 15)``
  (Lucene ``FeatureField.encodeFeatureValue``; contract §6.2), see :func:`truncate_feature_values`.

Token keys (contract §2.1, §6.11; ml-commons ``SparseEncodingTranslator`` / ``HFModelTokenizer``):
- tokenizer access: DJL runs the Rust ``tokenizers`` library from ``tokenizer.json``; so do we
  (:func:`rust_tokenizer`, :func:`djl_tokenizer` with DJL's truncation).
- WORD keys are the single-id decode ``decode([id], skip_special_tokens=True)``; an empty key is
  dropped (:func:`decode_key`, :func:`decode_keys`). TOKEN_ID keys (OpenSearch 3.2+) are ``str(id)``.
- special ids: the HF special ids plus every ``tokenizer.json`` added token marked special
  (:func:`special_token_ids`); the exported model zeroes them.
- vector -> key map: ids in ascending order, and when two ids share a key **the later id wins**
  (a Java ``Map.put`` per id), :func:`vector_to_keys`.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer

__all__ = ["MAX_LENGTH", "MAX_QUERY_WEIGHT", "FLOAT_MIN_NORMAL", "MAX_RESULT_WINDOW",
           "DEFAULT_TEXT_FIELD", "DEFAULT_VECTOR_FIELD", "DEFAULT_TEXT_ANALYZER", "truncate_feature_values", "truncate_feature_value",
           "KeyFormat", "check_key_format", "rust_tokenizer", "djl_tokenizer", "decode_key", "decode_keys",
           "special_token_ids", "key_table", "vector_to_keys"]

#: Token key formats: decoded WORD keys (any OpenSearch) or TOKEN_ID keys (OpenSearch 3.2+, sparse_vector).
KeyFormat = Literal["word", "token_id"]

#: DJL's token cap for model inputs, special tokens included.
MAX_LENGTH = 512
#: Largest query token weight neural_sparse accepts (the range is (0, 64]).
MAX_QUERY_WEIGHT = 64.0
#: Java ``Float.MIN_NORMAL``: smallest document feature value ``rank_features`` accepts.
FLOAT_MIN_NORMAL = float(np.finfo(np.float32).tiny)
#: OpenSearch ``index.max_result_window`` default (from + size).
MAX_RESULT_WINDOW = 10_000

#: Field defaults of every index this toolkit creates, fills, searches and evaluates; the same
#: names as the templates in ``mappings/`` (the ``{{text_field}}`` / ``{{vector_field}}`` defaults in mappings/README.md).
DEFAULT_TEXT_FIELD = "text"
DEFAULT_VECTOR_FIELD = "sparse_embedding"
#: Text analyzer of the indices the toolkit creates without a cluster (local backend: ``lsr-os index``,
#: ``LocalEngine``, ``eval``): OpenSearch's built-in ``nori`` (Lucene ``KoreanAnalyzer``: nori_tokenizer with
#: decompound_mode discard, nori_part_of_speech with the default stop tags, nori_readingform, lowercase), the
#: same chain as the ``korean`` analyzer of ``mappings/*.json``; tests/engines/test_text_analyzer.py fails if
#: they drift apart.
DEFAULT_TEXT_ANALYZER = "nori"


def truncate_feature_values(values: np.ndarray) -> np.ndarray:
    """Lucene ``FeatureField`` storage: ``intBitsToFloat((floatToIntBits(v) >>> 15) << 15)`` (contract §6.2).

    Keeps the top 9 significant bits of a positive float32 (relative error <= 2^-8, by truncation).
    """
    arr = np.ascontiguousarray(values, dtype=np.float32)
    bits = arr.view(np.uint32)
    return ((bits >> np.uint32(15)) << np.uint32(15)).view(np.float32)


def truncate_feature_value(value: float) -> float:
    """Scalar form of :func:`truncate_feature_values`."""
    return float(truncate_feature_values(np.array([value], dtype=np.float32))[0])


def check_key_format(key_format: str) -> KeyFormat:
    """``key_format`` if it is a :data:`KeyFormat`, else a ``ValueError`` listing the allowed ones."""
    if key_format not in get_args(KeyFormat):
        raise ValueError(f"key_format must be one of {', '.join(get_args(KeyFormat))}, got {key_format!r}")
    return key_format  # type: ignore[return-value]


def rust_tokenizer(tokenizer: Any) -> Tokenizer:
    """The Rust ``tokenizers.Tokenizer`` of ``tokenizer``, shared, not copied.

    ``tokenizer``: a fast HF tokenizer, a ``tokenizers.Tokenizer`` (returned as is), or a path to a
    ``tokenizer.json`` or a directory holding one (a ``vocab.txt``-only directory is converted to a
    fast tokenizer, as the export does).
    """
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.fspath(tokenizer)
        if os.path.isdir(path) and not os.path.exists(os.path.join(path, "tokenizer.json")):
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(path, use_fast=True)
            if not hasattr(hf, "backend_tokenizer"):
                raise ValueError(f"{tokenizer!s} holds no tokenizer convertible to tokenizer.json")
            return hf.backend_tokenizer
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.exists(path):
            raise ValueError(f"no tokenizer.json at {tokenizer!s}")
        return Tokenizer.from_file(path)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(f"expected a fast tokenizer, tokenizers.Tokenizer or path, got {type(tokenizer).__name__}")
    return backend


def djl_tokenizer(tokenizer: Any) -> Tokenizer:
    """A private copy of the Rust tokenizer set up as DJL runs it: no padding, truncation at
    ``min(tokenizer.json max_length or 512, 512)`` (DJL >= 0.28; contract §2.1/§2.2).

    A copy, because the HF wrapper changes its backend's truncation/padding state on every call.
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(rust_tokenizer(tokenizer).to_str())
    trunc = tok.truncation
    max_length = min(int(trunc["max_length"]), MAX_LENGTH) if trunc and trunc.get("max_length") else MAX_LENGTH
    tok.no_padding()
    tok.enable_truncation(max_length, strategy="longest_first", direction="right", stride=0)
    return tok


def decode_key(tokenizer: Any, token_id: int) -> str:
    """The WORD key of one id: its single-id decode with special tokens skipped (``""`` = dropped)."""
    return rust_tokenizer(tokenizer).decode([int(token_id)], skip_special_tokens=True)


def decode_keys(tokenizer: Any) -> list[str]:
    """The WORD key of every id (``tokenizer.json`` added tokens included); specials decode to ``""``."""
    tok = rust_tokenizer(tokenizer)
    size = tok.get_vocab_size(with_added_tokens=True)
    return list(tok.decode_batch([[i] for i in range(size)], skip_special_tokens=True))


def special_token_ids(tokenizer: Any) -> list[int]:
    """Ids the exported model zeroes: the HF special ids plus ``tokenizer.json``'s special added tokens."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", ())}
    ids |= {int(i) for i, tok in rust_tokenizer(tokenizer).get_added_tokens_decoder().items() if tok.special}
    return sorted(ids)


def key_table(tokenizer: Any, key_format: KeyFormat = "word", size: int | None = None) -> list[str]:
    """The key of every id in ``key_format`` (``size`` ids: cut or padded with ``""``)."""
    check_key_format(key_format)
    keys = decode_keys(tokenizer)
    size = len(keys) if size is None else size
    if key_format == "token_id":
        return [str(i) for i in range(size)]
    return (keys + [""] * size)[:size]


def vector_to_keys(ids: Iterable[int], weights: Iterable[float], keys: Sequence[str] | None) -> dict[str, float]:
    """ML Commons' vector -> key map (``SparseEncodingTranslator``): ``{key: weight}`` over ``ids``.

    ``keys`` is the WORD table (:func:`decode_keys`), or ``None`` for TOKEN_ID keys (``str(id)``).
    Ids are taken in ascending order; an id whose key is ``""`` (or past the table) is dropped and,
    when ids share a key, the later id's weight wins. Weights are kept as given (callers drop zeros).
    """
    pairs = sorted(zip((int(i) for i in ids), weights), key=lambda p: p[0])
    if keys is None:
        return {str(i): float(w) for i, w in pairs}
    out: dict[str, float] = {}
    n = len(keys)
    for i, w in pairs:
        key = keys[i] if i < n else ""
        if key:
            out[key] = float(w)
    return out
