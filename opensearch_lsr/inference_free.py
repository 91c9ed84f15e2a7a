"""Doc-only ("inference-free") sparse encoders as a sentence-transformers ``Router``.

The document route is the masked-LM encoder (``Transformer(fill-mask)`` + ``SpladePooling``); the
query route is a ``SparseStaticEmbedding`` whose weight per token id is the IDF of the token's
ML Commons key (single-id decode), so ``encode_query`` gives exactly what OpenSearch's
``SPARSE_TOKENIZE`` model returns: each distinct token once, weight ``idf.getOrDefault(token, 1.0)``,
special tokens dropped (opensearch-contract.md §2.2, §5). This is the layout of OpenSearch's
``opensearch-neural-sparse-encoding-doc-*`` models (Geng et al. 2024, "Towards Competitive
Search Relevance for Inference-Free Learned Sparse Retrievers").

``SparseEncoder(out_dir)`` loads the result directly.
"""
from __future__ import annotations

import copy
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ArtifactConfig, read_json, write_json
from .contract import decode_keys

__all__ = [
    "InferenceFreeConfig",
    "idf_weight_vector",
    "idf_from_weights",
    "build_inference_free",
    "load_inference_free",
    "is_inference_free",
    "inference_free_parts",
    "ROUTER_QUERY_MAX_LENGTH",
    "transferred_idf",
]

#: DJL truncates at 512 tokens *with* [CLS]/[SEP]; the static route encodes without them.
ROUTER_QUERY_MAX_LENGTH = 510


@dataclass
class InferenceFreeConfig(ArtifactConfig):
    """How an inference-free encoder was assembled (saved as ``inference_free_config.json``)."""

    FILENAME = "inference_free_config.json"

    document_model: str = ""
    idf_source: str = "corpus"  # "corpus" | "file" | "ones"
    idf_docs: int = 0
    idf_entries: int = 0


def idf_weight_vector(tokenizer, idf: Mapping[str, float] | None) -> torch.Tensor:
    """``[V]`` weights: ``idf.get(decode([id]), 1.0)`` per id, 0 for ids whose key is empty (specials)."""
    keys = decode_keys(tokenizer)
    weights = torch.zeros(len(keys), dtype=torch.float32)
    for i, key in enumerate(keys):
        if key:
            weights[i] = float(idf.get(key, 1.0)) if idf is not None else 1.0
    return weights


def idf_from_weights(tokenizer, weights: torch.Tensor) -> dict[str, float]:
    """The inverse of :func:`idf_weight_vector`: ``{decode([id]): weight}`` for every id with a
    non-empty key (what ``idf.json`` holds for ML Commons' query side).

    No token is dropped: ML Commons reads a missing key as 1.0 (``idf.getOrDefault(token, 1.0)``,
    contract 2.2), so a dropped zero-weight token would count fully. Weights are clipped into
    ``[IDF_FLOOR, IDF_MAX]`` = [1e-3, 64] because neural_sparse refuses query weights outside (0, 64].
    """
    from .idf import IDF_FLOOR, IDF_MAX

    values = weights.detach().float().cpu().tolist()
    out = {key: min(max(float(w), IDF_FLOOR), IDF_MAX) for key, w in zip(decode_keys(tokenizer), values) if key}
    clipped = sum(1 for w in values if not IDF_FLOOR <= w <= IDF_MAX)
    if clipped:
        logging.getLogger(__name__).info("idf.json: %d weight(s) clipped into [%g, %g]", clipped, IDF_FLOOR, IDF_MAX)
    return out


def _load_idf(idf: Mapping[str, float] | str | os.PathLike | None) -> tuple[dict[str, float] | None, str]:
    if idf is None:
        return None, "ones"
    if isinstance(idf, Mapping):
        return {str(k): float(v) for k, v in idf.items()}, "dict"
    from .idf import load_idf

    return load_idf(idf), "file"


def build_inference_free(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    idf: Mapping[str, float] | str | os.PathLike | None = None,
    idf_corpus: Iterable[str] | None = None,
):
    """Assemble and save a doc-only encoder; returns the loaded ``SparseEncoder``.

    Args:
        model_dir: the document encoder (a ``SparseEncoder`` dir, e.g. a SemBridge output).
        out_dir: where to save the ``Router`` model (plus ``idf.json`` and its config).
        idf: token -> IDF (a dict, an ``idf.json``, a dir holding one, or a ``sparse_tokenize.zip``).
        idf_corpus: texts to compute the IDF from (``idf.compute_idf``) when ``idf`` is None.
            With neither, every token weighs 1.0 (ML Commons' behaviour without ``idf.json``).
    """
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import Router, SparseStaticEmbedding

    from .transfer.surgery import load_sparse_encoder

    doc_model = load_sparse_encoder(str(model_dir))
    doc_modules = list(doc_model)
    if any(isinstance(m, Router) for m in doc_modules):
        raise ValueError(f"{model_dir} is already a Router model; pass its document encoder")
    tokenizer = doc_model.tokenizer
    n_docs = 0
    if idf is None and idf_corpus is not None:
        from .idf import compute_idf

        texts = list(idf_corpus)
        n_docs = len(texts)
        idf_map, source = compute_idf(texts, tokenizer), "corpus"
    else:
        idf_map, source = _load_idf(idf)
    query_tokenizer = copy.deepcopy(tokenizer)
    query_tokenizer.model_max_length = ROUTER_QUERY_MAX_LENGTH
    static = SparseStaticEmbedding(tokenizer=query_tokenizer, weight=idf_weight_vector(tokenizer, idf_map),
                                   frozen=True)
    router = Router.for_query_document(query_modules=[static], document_modules=doc_modules)
    model = SparseEncoder(modules=[router], similarity_fn_name="dot", device="cpu")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save(str(out))
    if idf_map is not None:
        write_json(out / "idf.json", idf_map)
    InferenceFreeConfig(document_model=str(model_dir), idf_source=source, idf_docs=n_docs,
                        idf_entries=len(idf_map or {})).save(out)
    return model


def load_inference_free(path: str | os.PathLike):
    """Load a doc-only encoder saved by :func:`build_inference_free` (plain ``SparseEncoder(path)``)."""
    from sentence_transformers import SparseEncoder

    if not is_inference_free(path):
        raise ValueError(f"{path} is not an inference-free (Router) sparse encoder")
    return SparseEncoder(str(path), device="cpu")


def is_inference_free(path: str | os.PathLike) -> bool:
    """True for a ``SparseEncoder`` dir whose first module is a query/document ``Router``."""
    modules = Path(path) / "modules.json"
    if not modules.exists():
        return False
    entries = read_json(modules)
    return bool(entries) and entries[0].get("type", "").endswith("Router")


def inference_free_parts(path: str | os.PathLike) -> tuple[Path, dict[str, float]]:
    """``(document Transformer dir, idf)`` of a saved doc-only encoder: what export needs for
    ``sparse_encoding.zip`` (the document route) and ``sparse_tokenize.zip`` (``idf.json``)."""
    root = Path(path)
    router_dir = root / read_json(root / "modules.json")[0]["path"]
    cfg = read_json(router_dir / "router_config.json")
    doc_ids = cfg["structure"]["document"]
    transformer = next(router_dir / m for m in doc_ids if "Transformer" in m)
    idf = read_json(root / "idf.json") if (root / "idf.json").exists() else {}
    return transformer, idf


def transferred_idf(model_dir: str | os.PathLike, source_idf: Mapping[str, float] | str | os.PathLike
                    ) -> dict[str, float]:
    """A source model's IDF carried to a transferred model's vocabulary through its ``alignment.npz``.

    ``model_dir`` is a SemBridge/VT output (``transfer_config.json`` names the source, ``alignment.npz``
    holds the ``[V_t, V_s]`` mixing weights); ``source_idf`` is the source doc-only model's ``idf.json``
    (a dict, a file, a dir holding one, or a ``sparse_tokenize.zip``). See ``idf.transfer_idf``.

    Raises:
        ValueError: ``model_dir`` is not a transfer output, or the IDF table is unreadable.
    """
    import scipy.sparse as sp

    from .idf import load_idf, transfer_idf
    from .transfer.surgery import load_target_tokenizer, resolve_model_path

    root = Path(model_dir)
    cfg_path, align_path = root / "transfer_config.json", root / "alignment.npz"
    if not cfg_path.exists() or not align_path.exists():
        raise ValueError(f"{str(root)!r} is not a transfer output (needs transfer_config.json and alignment.npz)")
    source = read_json(cfg_path).get("source")
    if not source:
        raise ValueError(f"{cfg_path} does not name its source model")
    src_tok = load_target_tokenizer(resolve_model_path(str(source)), what="source tokenizer")
    tgt_tok = load_target_tokenizer(str(root))
    table = dict(source_idf) if isinstance(source_idf, Mapping) else load_idf(source_idf)
    return transfer_idf(table, src_tok, tgt_tok, sp.load_npz(align_path))
