"""A ``SparseEncoder`` turned into ``text -> {key: weight}`` (query side of the local backend,
evaluation, quickstart, client-side ``query_tokens``), and ``encode_to_csr``.

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
import torch

from ..contract import KeyFormat, check_key_format, key_table, special_token_ids, vector_to_keys
from ..errors import LsrError

__all__ = ["SparseKeyedEncoder", "sparse_encoder_query_fn", "csr_rows_to_dicts", "encode_to_csr", "output_dimension",
           "OutputDimensionError"]

logger = logging.getLogger(__name__)


class OutputDimensionError(LsrError, ValueError):
    """The model's output columns and its key table (tokenizer) disagree: keys would be wrong or dropped."""


def _mlm_head_rows(model) -> int | None:
    """Rows of the masked-LM output layer of the model's first transformer module (its vocabulary width)."""
    modules = list(model) if hasattr(model, "__iter__") else []
    for module in modules:
        auto = getattr(module, "auto_model", None)
        head = auto.get_output_embeddings() if auto is not None and hasattr(auto, "get_output_embeddings") else None
        if head is not None and getattr(head, "weight", None) is not None:
            return int(head.weight.shape[0])
    return None


def output_dimension(model) -> int:
    """Number of columns the model's sparse vectors have, from what the model outputs.

    Not ``get_embedding_dimension()``: sentence-transformers 6.2 answers it with the transformer's hidden
    size (128 for SPLADE-tiny) when the ``SpladePooling`` module was built without ``embedding_dimension``,
    which is how ``SparseEncoder(modules=[MLMTransformer(dir), SpladePooling("max")])`` saves it, while
    ``encode_query`` returns vocabulary-wide vectors. So: one probe encoding of the query side (what the
    index and the keys must cover), checked against the masked-LM head's rows when there is one.

    Raises:
        OutputDimensionError: the MLM head and the encoded vectors disagree.
    """
    probe = None
    if hasattr(model, "encode_query"):
        with torch.no_grad():
            emb = model.encode_query(["probe"], convert_to_sparse_tensor=True, show_progress_bar=False)
        probe = int(emb.shape[-1])
    head = _mlm_head_rows(model)
    if probe is not None and head is not None and probe != head:
        raise OutputDimensionError(f"the model's query vectors have {probe} columns but its masked-LM head has "
                                   f"{head} rows; refusing to guess which ids the keys belong to")
    dim = probe if probe is not None else head
    if dim is None:
        dim = int(model.get_embedding_dimension())
    declared = model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension") else None
    if declared is not None and declared != dim:
        logger.debug("get_embedding_dimension() says %s, the model outputs %s columns: using %s", declared, dim, dim)
    return dim


def csr_rows_to_dicts(mat: sp.csr_matrix, keys: Sequence[str]) -> list[dict[str, float]]:
    """CSR rows -> ``{key: weight}`` dicts by ML Commons' key rule (:func:`~opensearch_lsr.contract.vector_to_keys`:
    empty keys dropped, the later id wins on a shared key), after dropping non-positive weights.

    Raises:
        OutputDimensionError: ``mat`` has more columns than ``keys`` (those ids would be dropped silently).
    """
    mat = mat.tocsr()
    if keys is not None and mat.shape[1] > len(keys):
        raise OutputDimensionError(f"the vectors have {mat.shape[1]} columns but the key table only {len(keys)} "
                                   "keys: the ids past it would be dropped")
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
        dim = output_dimension(model)
        self.keys = key_table(model.tokenizer, key_format, dim)
        if key_format == "word" and dim > len(model.tokenizer):
            raise OutputDimensionError(f"the model outputs {dim} columns but its tokenizer names only "
                                       f"{len(model.tokenizer)} ids; the ids past it have no WORD key "
                                       "(use token_id keys or fix the tokenizer)")

    def to_csr(self, texts: Sequence[str], kind: Literal["query", "document"], batch_size: int = 32,
               show_progress_bar: bool = False) -> sp.csr_matrix:
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
        """The document encoder's ``SparseDocumentEncoder`` (same numbers as the exported model, much faster on
        CPU) for the document side; ``None`` when it cannot load this model (then sentence-transformers)."""
        if self._doc_encoder is None:
            try:
                from .encoder import SparseDocumentEncoder
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


def _to_csr(emb: torch.Tensor) -> sp.csr_matrix:
    emb = emb.detach().cpu()
    if emb.is_sparse:
        emb = emb.coalesce()
        idx = emb.indices().numpy()
        vals = emb.values().float().numpy()
        return sp.csr_matrix((vals, (idx[0], idx[1])), shape=tuple(emb.shape))
    return sp.csr_matrix(emb.float().numpy())


def encode_to_csr(
    encoder,
    texts: Sequence[str],
    kind: Literal["query", "document"] = "document",
    batch_size: int = 32,
    show_progress_bar: bool = False,
) -> sp.csr_matrix:
    """Encode ``texts`` into a CSR matrix ``[n, V]`` with special-token columns zeroed.

    ``encoder`` is a sentence-transformers ``SparseEncoder`` or the toolkit's batch encoder
    (:class:`opensearch_lsr.encoding.encoder.SparseDocumentEncoder`, same vectors, faster on CPU).
    """
    if hasattr(encoder, "encode_dense"):
        rows = []
        for start in range(0, len(texts), 1024):
            dense = encoder.encode_dense(list(texts[start:start + 1024]))
            rows.append(sp.csr_matrix(dense.numpy()))
        mat = sp.vstack(rows).tocsr() if rows else sp.csr_matrix((0, encoder.vocab_size))
        mat.eliminate_zeros()
        return mat
    fn = encoder.encode_query if kind == "query" else encoder.encode_document
    chunks = []
    step = max(batch_size * 32, 1)
    for start in range(0, len(texts), step):
        emb = fn(list(texts[start:start + step]), batch_size=batch_size, convert_to_sparse_tensor=True,
                 show_progress_bar=show_progress_bar)
        chunks.append(_to_csr(emb))
    mat = sp.vstack(chunks).tocsr() if chunks else sp.csr_matrix((0, output_dimension(encoder)))
    specials = special_token_ids(encoder.tokenizer)
    if specials:
        mask = np.ones(mat.shape[1], dtype=np.float32)
        mask[[s for s in specials if s < mat.shape[1]]] = 0.0
        mat = (mat @ sp.diags(mask)).tocsr()
    mat.eliminate_zeros()
    return mat
