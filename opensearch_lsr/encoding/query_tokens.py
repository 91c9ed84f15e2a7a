"""Client-side query tokens exactly as ML Commons ``SPARSE_TOKENIZE`` computes them (contract §2.2):
DJL encode with special tokens and the 512 cap, distinct ids in first-occurrence order, WORD keys by
single-id decode (``""`` dropped), weights ``idf.getOrDefault(token, 1.0)`` as float32.
"""
from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..contract import KeyFormat, check_key_format, decode_key, djl_tokenizer

__all__ = ["tokenize_query", "tokenize_query_ids"]


def _is_rust(obj: Any) -> bool:
    from tokenizers import Tokenizer

    return isinstance(obj, Tokenizer)


_BACKENDS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _rust(tokenizer: Any):
    """A private copy of the Rust tokenizer (cached per HF tokenizer object): the HF wrapper
    changes its backend's truncation/padding state on every call, so it is not used directly."""
    if _is_rust(tokenizer):
        return tokenizer
    if hasattr(tokenizer, "backend_tokenizer"):
        try:
            cached = _BACKENDS.get(tokenizer)
        except TypeError:  # not weak-referenceable
            cached = None
        if cached is None:
            cached = djl_tokenizer(tokenizer)
            try:
                _BACKENDS[tokenizer] = cached
            except TypeError:
                pass
        return cached
    return djl_tokenizer(tokenizer)


def tokenize_query_ids(text: str, tokenizer: Any) -> list[int]:
    """Distinct token ids of ``text`` in first-occurrence order (DJL encode with special tokens)."""
    ids = _rust(tokenizer).encode(text, add_special_tokens=True).ids
    return list(dict.fromkeys(ids))


def tokenize_query(
    text: str,
    tokenizer: Any,
    idf: Mapping[str, float] | None = None,
    key_format: KeyFormat = "word",
) -> dict[str, float]:
    """Query tokens exactly as ML Commons ``SPARSE_TOKENIZE`` returns them (contract §2.2).

    Args:
        text: the query.
        tokenizer: the model's tokenizer (fast HF tokenizer, ``tokenizers.Tokenizer`` or path).
        idf: ``idf.json`` contents keyed by decoded token; ``None`` gives every token weight 1.0.
        key_format: ``"word"`` (decoded token) or ``"token_id"`` (the id as a string, OpenSearch >= 3.2).

    Returns:
        ``{key: weight}`` in first-occurrence order.
    """
    check_key_format(key_format)
    tok = _rust(tokenizer)
    out: dict[str, float] = {}
    for tid in tokenize_query_ids(text, tok):
        token = decode_key(tok, tid)
        if token == "":
            continue
        # Java: idf.getOrDefault(token, 1.0f) on a Gson Map<String, Float>: float32 values
        weight = float(np.float32(idf.get(token, 1.0))) if idf is not None else 1.0
        out[str(tid) if key_format == "token_id" else token] = weight
    return out
