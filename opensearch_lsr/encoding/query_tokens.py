"""Client-side query tokens exactly as ML Commons ``SPARSE_TOKENIZE`` computes them (contract §2.2):
DJL encode with special tokens and the 512 cap, distinct ids in first-occurrence order, WORD keys by
single-id decode (``""`` dropped), weights ``idf.getOrDefault(token, 1.0)`` as float32.
"""
from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..contract import MAX_QUERY_WEIGHT, KeyFormat, check_key_format, decode_key, djl_tokenizer

__all__ = ["tokenize_query", "tokenize_query_ids", "query_tokens_for", "cap_query_weights"]


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


def query_tokens_for(text: str, model: str | os.PathLike, idf: Mapping[str, float] | None = None,
                     key_format: KeyFormat = "word") -> dict[str, float]:
    """Client-side ``query_tokens`` for ``text`` with ``model``, as the cluster would compute them.

    * an export bundle dir (``sparse_tokenize.zip``) or a SPARSE_TOKENIZE zip: ``tokenize_query``
      with its ``tokenizer.json``/``idf.json``;
    * an inference-free encoder dir (``idf.json`` next to a Router) or any model with ``idf``
      given: ``tokenize_query`` with that IDF;
    * otherwise a bi-encoder: its query encoder's weights (must lie in (0, 64]).
    """
    import json
    import zipfile
    from pathlib import Path

    path = Path(model)
    zpath = path / "sparse_tokenize.zip" if path.is_dir() else path
    if zpath.suffix == ".zip" and zpath.exists():
        from tokenizers import Tokenizer

        with zipfile.ZipFile(zpath) as zf:
            tok = Tokenizer.from_str(zf.read("tokenizer.json").decode("utf-8"))
            zidf = json.loads(zf.read("idf.json")) if "idf.json" in zf.namelist() else None
        return tokenize_query(text, djl_tokenizer(tok), idf if idf is not None else zidf, key_format)
    from ..inference_free import inference_free_parts, is_inference_free
    from ..multilingual.milco import is_milco_dir

    if key_format == "word" and is_milco_dir(path):
        # a MILCO vector spans two vocabularies (source ids, then English pivot ids offset by V_src): one
        # tokenizer cannot decode both, so its index holds token-id keys only (multilingual/lexecho.py)
        key_format = "token_id"
    doc_only = is_inference_free(path)
    if idf is None and doc_only and (path / "idf.json").exists():
        idf = json.loads((path / "idf.json").read_text(encoding="utf-8"))
    if idf is not None:
        from transformers import AutoTokenizer

        # a doc-only (Router) dir keeps its tokenizer in the document Transformer's folder, not at the root
        tokenizer_dir = inference_free_parts(path)[0] if doc_only else path
        return tokenize_query(text, AutoTokenizer.from_pretrained(str(tokenizer_dir)), idf, key_format)
    from .keyed import SparseKeyedEncoder

    return cap_query_weights(SparseKeyedEncoder(str(path), key_format=key_format)(text))


def cap_query_weights(tokens: Mapping[str, float], cap: float = MAX_QUERY_WEIGHT) -> dict[str, float]:
    """Clip query weights to Lucene's ``(0, 64]`` (``FeatureField.newLinearQuery``; contract 4.2).

    A max-pooled log1p(relu) SPLADE query stays far below 64, but a sum-pooled encoder adds one term
    per occurrence and can pass it, which OpenSearch answers with HTTP 400 ("weight must be in
    (0, 64.0]"). Clipping keeps every other token's weight and the query valid; it is logged.
    Non-positive weights are dropped (they contribute nothing and Lucene rejects them).
    """
    out: dict[str, float] = {}
    clipped = []
    for key, value in tokens.items():
        w = float(value)
        if not w > 0:
            continue
        if w > cap:
            clipped.append((key, w))
            w = cap
        out[key] = w
    if clipped:
        logging.getLogger(__name__).warning(
            "%d query weight(s) above %g clipped to it (Lucene's limit), e.g. %r=%.2f: the encoder is probably "
            "sum-pooled", len(clipped), cap, clipped[0][0], clipped[0][1])
    return out
