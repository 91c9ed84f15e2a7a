"""IDF tables for the inference-free query side (ML Commons ``SPARSE_TOKENIZE`` ``idf.json``).

At query time ML Commons weighs each distinct query token by ``idf.getOrDefault(token, 1.0)``
where ``token`` is the single-id decode ``decode([id], skip_special_tokens=True)``
(``opensearch-contract.md`` 2.2). So every table here is keyed exactly that way, holds every
non-special vocabulary token (a missing token would silently fall back to 1.0), and excludes
special tokens (ML Commons never looks them up: they decode to ``""``).

Formula (BM25 / Robertson-Sparck Jones IDF with the +1 of Lucene's ``BM25Similarity``):

    idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

with ``N`` the number of documents and ``df(t)`` the number of documents whose tokenization
contains ``t`` at least once (Robertson & Zaragoza 2009, "The Probabilistic Relevance Framework:
BM25 and Beyond"). The +0.5 terms smooth unseen tokens (``df = 0`` gives the finite maximum
``ln(1 + (N + 0.5) / 0.5)``), and the +1 inside the log keeps every weight strictly positive,
which Lucene requires of query weights (``(0, 64]``; a weight reaches 64 only when
``N > 3e27``). Ids whose decodes coincide share one key; their document frequencies are
pooled (a document counts once), because ML Commons cannot tell them apart either.
"""
from __future__ import annotations

import json
import logging
import math
import os
import zipfile
from pathlib import Path
from typing import Iterable

import numpy as np

from .contract import decode_keys, rust_tokenizer, special_token_ids

__all__ = ["compute_idf", "transfer_idf", "load_idf", "bm25_idf", "check_idf_range",
           "IDF_MAX", "IDF_FLOOR"]

logger = logging.getLogger(__name__)

#: Lucene ``FeatureField.newLinearQuery`` accepts query weights in (0, 64] (contract 4.2).
IDF_MAX = 64.0
#: the weight written for a token the query side should (nearly) ignore: ML Commons reads a missing
#: key as 1.0 and Lucene refuses 0, so such tokens are kept at this floor instead of being dropped
IDF_FLOOR = 1e-3


def bm25_idf(df: np.ndarray, n_docs: int) -> np.ndarray:
    """``ln(1 + (N - df + 0.5) / (df + 0.5))`` elementwise (see the module docstring)."""
    df = np.asarray(df, dtype=np.float64)
    return np.log1p((n_docs - df + 0.5) / (df + 0.5))


def compute_idf(texts: Iterable[str], tokenizer, batch_size: int = 1000) -> dict[str, float]:
    """Document-frequency IDF through ``tokenizer`` over ``texts`` (streamed in batches).

    Args:
        texts: documents (any iterable; consumed once).
        tokenizer: the target tokenizer (HF fast tokenizer, ``tokenizers.Tokenizer`` or path).
        batch_size: documents tokenized per ``encode_batch`` call.

    Returns:
        ``{single-id decode: idf}`` for every non-special vocabulary id (formula in the module
        docstring). Whole documents are counted (no 512 truncation: it would bias df towards
        document beginnings).

    Raises:
        ValueError: the corpus is empty.
    """
    backend = rust_tokenizer(tokenizer)
    keys, specials = decode_keys(backend), set(special_token_ids(backend))
    size = len(keys)
    # key -> index of its pooled df counter (colliding decodes share one)
    key_index: dict[str, int] = {}
    id_to_key = np.full(size, -1, dtype=np.int64)
    for idx, key in enumerate(keys):
        if idx in specials or key == "":
            continue
        id_to_key[idx] = key_index.setdefault(key, len(key_index))
    df = np.zeros(len(key_index), dtype=np.int64)
    n_docs = 0
    batch: list[str] = []

    def flush() -> None:
        nonlocal n_docs
        if not batch:
            return
        for enc in backend.encode_batch(batch, add_special_tokens=False):
            ids = np.asarray(enc.ids, dtype=np.int64)
            ids = ids[(ids >= 0) & (ids < size)]
            k = np.unique(id_to_key[ids])
            df[k[k >= 0]] += 1
        n_docs += len(batch)
        batch.clear()

    was_truncating = backend.truncation
    backend.no_truncation()
    try:
        for text in texts:
            batch.append(text)
            if len(batch) >= batch_size:
                flush()
        flush()
    finally:
        if was_truncating:
            backend.enable_truncation(**{k: v for k, v in was_truncating.items() if k in
                                         ("max_length", "stride", "strategy", "direction")})
    if n_docs == 0:
        raise ValueError("the IDF corpus is empty")
    values = bm25_idf(df, n_docs)
    logger.info("IDF over %d documents, %d keys (%d seen)", n_docs, len(key_index), int((df > 0).sum()))
    return {key: float(values[i]) for key, i in key_index.items()}


def transfer_idf(
    source_idf: dict[str, float],
    source_tokenizer,
    target_tokenizer,
    alignment,
    default: float | None = None,
) -> dict[str, float]:
    """Carry a source model's IDF to a target vocabulary through SemBridge mixing weights.

    ``idf_t(j) = sum_i A[j, i] * idf_s(i) / sum_i A[j, i]`` for target id ``j`` and source ids
    ``i`` (``A`` = the alignment CSR ``[V_t, V_s]`` that built the target embeddings), i.e. the
    same convex combination SemBridge uses for embeddings (Zhang et al. 2025, SemBridge). Overlap
    rows are one-hot, so they copy the source value. ``idf_s(i)`` is looked up by the source
    single-id decode, with 1.0 (ML Commons' default) for source tokens the table lacks.

    Args:
        source_idf: ``{source decode: idf}`` (a source model's ``idf.json``).
        source_tokenizer, target_tokenizer: fast tokenizers / ``tokenizers.Tokenizer`` / paths.
        alignment: scipy sparse ``[V_t, V_s]`` with non-negative weights.
        default: value for target tokens with an all-zero row (default: the median source IDF).

    Returns:
        ``{target decode: idf}`` for every non-special target token.
    """
    import scipy.sparse as sp

    src, tgt = rust_tokenizer(source_tokenizer), rust_tokenizer(target_tokenizer)
    src_keys, src_specials = decode_keys(src), set(special_token_ids(src))
    tgt_keys, tgt_specials = decode_keys(tgt), set(special_token_ids(tgt))
    A = sp.csr_matrix(alignment, dtype=np.float64)
    if A.shape != (len(tgt_keys), len(src_keys)):
        raise ValueError(f"alignment has shape {A.shape}, expected [V_t, V_s] = [{len(tgt_keys)}, {len(src_keys)}]")
    if A.nnz and A.data.min() < 0:
        raise ValueError("alignment weights must be non-negative to mix IDF values")
    if not source_idf:
        raise ValueError("source_idf is empty")
    src_values = np.array([source_idf.get(k, 1.0) if k else 0.0 for k in src_keys], dtype=np.float64)
    # source specials (decode "") carry no IDF: drop their columns from numerator and denominator
    valid = np.array([bool(k) and i not in src_specials for i, k in enumerate(src_keys)], dtype=np.float64)
    A = A @ sp.diags(valid)
    row_sums = np.asarray(A.sum(axis=1)).ravel()
    mixed = A @ src_values
    fill = float(np.median(list(source_idf.values()))) if default is None else float(default)
    out: dict[str, float] = {}
    for j, key in enumerate(tgt_keys):
        if j in tgt_specials or key == "":
            continue
        value = mixed[j] / row_sums[j] if row_sums[j] > 0 else fill
        out[key] = float(value) if key not in out else max(out[key], float(value))
    return out


def load_idf(path: str | os.PathLike) -> dict[str, float]:
    """Read an IDF table from ``idf.json``, a ``sparse_tokenize.zip`` or a bundle directory."""
    path = Path(path)
    if path.is_dir():
        for cand in (path / "idf.json", path / "sparse_tokenize.zip"):
            if cand.exists():
                return load_idf(cand)
        raise ValueError(f"{str(path)!r} holds neither idf.json nor sparse_tokenize.zip")
    if not path.is_file():
        raise ValueError(f"IDF file {str(path)!r} does not exist")
    try:
        if path.suffix == ".zip":
            with zipfile.ZipFile(path) as zf:
                if "idf.json" not in zf.namelist():
                    raise ValueError(f"{path.name} holds no idf.json (every query token would weigh 1.0)")
                data = json.loads(zf.read("idf.json").decode("utf-8"))
        else:
            data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, zipfile.BadZipFile, UnicodeDecodeError) as err:
        raise ValueError(f"{str(path)!r} is not a valid IDF table: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} must hold a JSON object {{token: weight}}")
    out: dict[str, float] = {}
    for key, value in data.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"{str(path)!r}: weight of {key!r} is not a finite number")
        out[str(key)] = float(value)
    check_idf_range(out, str(path))
    return out


def check_idf_range(idf: dict[str, float], source: str = "idf.json") -> None:
    """Refuse weights outside ``(0, 64]`` in one sentence.

    ML Commons' SPARSE_TOKENIZE returns ``idf.getOrDefault(token, 1.0)`` as the query weight
    (``SparseTokenizerModel``; contract 2.2) and neural_sparse builds ``FeatureField.newLinearQuery``
    with it, which throws for weights outside ``(0, 64]`` (contract 4.2): a zero or negative entry
    fails every query containing that token with HTTP 400, a weight above 64 likewise. (Dropping
    the token from the file is no fix either: a missing key weighs 1.0.)
    """
    bad = [(k, v) for k, v in idf.items() if not 0.0 < v <= IDF_MAX]
    if bad:
        key, value = bad[0]
        raise ValueError(f"{source}: {len(bad)} weight(s) outside (0, {IDF_MAX:g}], e.g. {key!r}={value:g}; OpenSearch "
                         f"rejects such query weights (keep tiny positive weights for tokens to ignore, e.g. 1e-3)")
