"""Query-side encoders for the local backend: a ``SparseEncoder`` turned into ``text -> {key: weight}``.

Keys are ML Commons WORD keys (single-id decode with special tokens skipped, contract §2.1/§6.11),
so the output equals what the exported SPARSE_ENCODING model returns for the same text.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import scipy.sparse as sp

from ..contract import KeyFormat, check_key_format, key_table, vector_to_keys

__all__ = ["SparseKeyedEncoder", "sparse_encoder_query_fn", "csr_rows_to_dicts"]

logger = logging.getLogger(__name__)


def csr_rows_to_dicts(mat: sp.csr_matrix, keys: Sequence[str]) -> list[dict[str, float]]:
    """CSR rows -> ``{key: weight}`` dicts by ML Commons' key rule (:func:`~opensearch_lsr.contract.vector_to_keys`:
    empty keys dropped, the later id wins on a shared key), after dropping non-positive weights."""
    mat = mat.tocsr()
    out = []
    for i in range(mat.shape[0]):
        start, end = mat.indptr[i], mat.indptr[i + 1]
        ids, weights = mat.indices[start:end], mat.data[start:end]
        positive = weights > 0
        out.append(vector_to_keys(ids[positive].tolist(), weights[positive].tolist(), keys))
    return out


class SparseKeyedEncoder:
    """Wraps a sentence-transformers ``SparseEncoder``: encodes texts into decode-keyed dicts.

    Args:
        model: a ``SparseEncoder`` or a path/alias loadable by ``surgery.load_sparse_encoder``.
        key_format: ``"word"`` (decoded token) or ``"token_id"``.
    """

    def __init__(self, model, key_format: KeyFormat = "word"):
        check_key_format(key_format)
        self.path: str | None = None
        if isinstance(model, (str, os.PathLike)):
            from ..transfer.surgery import load_sparse_encoder

            self.path = os.fspath(model)
            model = load_sparse_encoder(self.path)
        self.model = model
        self._doc_encoder = None
        dim = model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension") else None
        self.keys = key_table(model.tokenizer, key_format, dim)

    def to_csr(self, texts: Sequence[str], kind: Literal["query", "document"], batch_size: int = 32,
               show_progress_bar: bool = False) -> sp.csr_matrix:
        from ..evaluation.retrieval import encode_to_csr

        if kind == "document" and self.path is not None:
            fast = self._fast_document_encoder(batch_size)
            if fast is not None:
                vecs = fast.encode(list(texts))
                dim = len(self.keys)
                indptr = np.cumsum([0] + [len(v.ids) for v in vecs])
                indices = np.concatenate([v.ids for v in vecs]) if vecs else np.zeros(0, np.int64)
                data = np.concatenate([v.weights for v in vecs]) if vecs else np.zeros(0, np.float32)
                return sp.csr_matrix((data, indices, indptr), shape=(len(vecs), dim))
        return encode_to_csr(self.model, list(texts), kind, batch_size, show_progress_bar)

    def _fast_document_encoder(self, batch_size: int):
        """H-encode's ``SparseDocumentEncoder`` (same numbers as the exported model, much faster on
        CPU) for the document side; ``None`` when it cannot load this model (then sentence-transformers)."""
        if self._doc_encoder is None:
            try:
                from ..encoding.encoder import SparseDocumentEncoder
                from ..inference_free import inference_free_parts, is_inference_free

                path = str(inference_free_parts(self.path)[0]) if is_inference_free(self.path) else self.path
                self._doc_encoder = SparseDocumentEncoder(path, device="cpu", batch_size=batch_size)
            except Exception as err:  # noqa: BLE001 - optional accelerator; the reference path stays
                logger.info("fast document encoder unavailable (%s); using sentence-transformers", err)
                self._doc_encoder = False
        return self._doc_encoder or None

    def encode(self, texts: Sequence[str], kind: Literal["query", "document"] = "query",
               batch_size: int = 32, show_progress_bar: bool = False) -> list[dict[str, float]]:
        return csr_rows_to_dicts(self.to_csr(texts, kind, batch_size, show_progress_bar), self.keys)

    def __call__(self, text: str) -> dict[str, float]:
        return self.encode([text], "query")[0]


def sparse_encoder_query_fn(path: str) -> Callable[[str], dict[str, float]]:
    """``text -> {token: weight}`` with the model's query side (``encode_query``)."""
    return SparseKeyedEncoder(path)
