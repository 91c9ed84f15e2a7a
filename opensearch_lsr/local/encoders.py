"""Query-side encoders for the local backend: a ``SparseEncoder`` turned into ``text -> {key: weight}``.

Keys are ML Commons WORD keys (single-id decode with special tokens skipped, contract §2.1/§6.11),
so the output equals what the exported SPARSE_ENCODING model returns for the same text.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import scipy.sparse as sp

__all__ = ["SparseKeyedEncoder", "sparse_encoder_query_fn", "csr_rows_to_dicts"]


def csr_rows_to_dicts(mat: sp.csr_matrix, keys: Sequence[str]) -> list[dict[str, float]]:
    """CSR rows -> ``{key: weight}`` dicts, dropping empty keys and non-positive weights."""
    mat = mat.tocsr()
    out = []
    for i in range(mat.shape[0]):
        start, end = mat.indptr[i], mat.indptr[i + 1]
        row: dict[str, float] = {}
        for j, w in zip(mat.indices[start:end], mat.data[start:end]):
            key = keys[j]
            if key and w > 0:
                row[key] = max(float(w), row.get(key, 0.0))
        out.append(row)
    return out


class SparseKeyedEncoder:
    """Wraps a sentence-transformers ``SparseEncoder``: encodes texts into decode-keyed dicts.

    Args:
        model: a ``SparseEncoder`` or a path/alias loadable by ``surgery.load_sparse_encoder``.
        key_format: ``"word"`` (decoded token) or ``"token_id"``.
    """

    def __init__(self, model, key_format: Literal["word", "token_id"] = "word"):
        if key_format not in ("word", "token_id"):
            raise ValueError(f"key_format must be one of ['word', 'token_id'], got {key_format!r}")
        if isinstance(model, (str, os.PathLike)):
            from ..transfer.surgery import load_sparse_encoder

            model = load_sparse_encoder(os.fspath(model))
        self.model = model
        from ..opensearch.query import decode_keys

        words = decode_keys(model.tokenizer)
        dim = model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension") else len(words)
        words = (words + [""] * dim)[:dim]
        self.keys = words if key_format == "word" else [str(i) if w else "" for i, w in enumerate(words)]

    def to_csr(self, texts: Sequence[str], kind: Literal["query", "document"], batch_size: int = 32,
               show_progress_bar: bool = False) -> sp.csr_matrix:
        from ..evaluation.retrieval import encode_to_csr

        return encode_to_csr(self.model, list(texts), kind, batch_size, show_progress_bar)

    def encode(self, texts: Sequence[str], kind: Literal["query", "document"] = "query",
               batch_size: int = 32, show_progress_bar: bool = False) -> list[dict[str, float]]:
        return csr_rows_to_dicts(self.to_csr(texts, kind, batch_size, show_progress_bar), self.keys)

    def __call__(self, text: str) -> dict[str, float]:
        return self.encode([text], "query")[0]


def sparse_encoder_query_fn(path: str) -> Callable[[str], dict[str, float]]:
    """``text -> {token: weight}`` with the model's query side (``encode_query``)."""
    return SparseKeyedEncoder(path)
