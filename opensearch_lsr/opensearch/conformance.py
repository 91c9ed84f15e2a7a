"""Verify an export bundle: run its zips the way OpenSearch ML Commons does and compare with the encoder.

The runtime (zip layout rules, DJL tokenization, the TorchScript call, key decoding) is
:mod:`opensearch_lsr.engines.model_runtime`, which the local engine uses too; its names are re-exported here.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..engines.model_runtime import (EMBEDDING_FORMATS, FORBIDDEN_SUFFIXES, FUNCTION_NAMES, ConformanceError,
                                     MLCommonsRuntime, check_zip_layout, vector_to_map)

__all__ = [
    "ConformanceError",
    "MLCommonsRuntime",
    "FUNCTION_NAMES",
    "EMBEDDING_FORMATS",
    "FORBIDDEN_SUFFIXES",
    "check_zip_layout",
    "vector_to_map",
    "verify_bundle",
]

logger = logging.getLogger(__name__)


def _reference_maps(model_dir: str | os.PathLike, texts: list[str], decode_table: Sequence[str],
                    special_ids: Iterable[int], prune_ratio: float | None, fmt: str,
                    max_length: int) -> list[dict[str, float]]:
    """The in-Python encoder's output, mapped to keys the ML Commons way (the expected maps)."""
    import torch

    from ..transfer.surgery import load_sparse_encoder

    encoder = load_sparse_encoder(str(model_dir))
    encoder.max_seq_length = min(int(encoder.max_seq_length or max_length), max_length)
    modules = list(encoder)
    is_router = bool(modules) and hasattr(modules[0], "sub_modules")
    encode = encoder.encode_document if is_router else encoder.encode  # doc-only: the document route
    with torch.no_grad():
        emb = encode(texts, convert_to_tensor=True, convert_to_sparse_tensor=False, batch_size=8)
    dense = emb.to_dense().float().cpu().numpy() if emb.is_sparse else emb.float().cpu().numpy()
    dense = np.array(dense, dtype=np.float32, copy=True)
    dense[:, list(special_ids)] = 0.0
    if prune_ratio:
        keep = dense >= prune_ratio * dense.max(axis=1, keepdims=True)
        dense = np.where(keep, dense, 0.0).astype(np.float32)
    return [vector_to_map(row, decode_table, fmt) for row in dense]


def verify_bundle(
    bundle_dir: str | os.PathLike,
    model_dir: str | os.PathLike,
    texts: list[str],
    atol: float = 1e-4,
) -> dict[str, Any]:
    """Run the bundle's zips like ML Commons and compare with the in-Python encoder.

    Checks the zip layouts, runs ``sparse_encoding.zip`` on each text and compares the maps with
    ``load_sparse_encoder(model_dir)`` (same key sets, max abs weight difference <= ``atol``; a key
    present on one side only counts as a mismatch unless its weight is <= ``atol``, i.e. a value
    that rounds across zero), and checks that ``sparse_tokenize.zip`` uses the same tokenizer and
    an ``idf.json`` keyed by the single-id decode.

    Returns:
        A JSON-able report; ``report["passed"]`` is the verdict.
    """
    bundle = Path(bundle_dir)
    manifest_path = bundle / "manifest.json"
    if not manifest_path.exists():
        raise ConformanceError(f"{bundle} holds no manifest.json (not an export bundle)")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    fmt = manifest.get("key_format", "word")
    enc_zip = bundle / manifest.get("sparse_encoding", {}).get("file", "sparse_encoding.zip")
    tok_zip = bundle / manifest.get("sparse_tokenize", {}).get("file", "sparse_tokenize.zip")
    report: dict[str, Any] = {
        "bundle": str(bundle),
        "key_format": fmt,
        "layout_problems": {
            "sparse_encoding": check_zip_layout(enc_zip, "SPARSE_ENCODING"),
            "sparse_tokenize": check_zip_layout(tok_zip, "SPARSE_TOKENIZE"),
        },
        "texts": len(texts),
        "atol": atol,
    }
    if any(report["layout_problems"].values()):
        report["passed"] = False
        return report
    runtime = MLCommonsRuntime.from_zip(enc_zip, "SPARSE_ENCODING")
    runtime.output_dim = manifest.get("output_dim")  # MILCO (token_id only): source + pivot views
    got = runtime.predict(list(texts), fmt)
    specials = manifest.get("special_token_ids") or [
        i for i, tok in enumerate(runtime.decode_table) if tok == ""
    ]
    prune = manifest.get("prune_ratio")
    expected = _reference_maps(model_dir, list(texts), runtime.decode_table, specials, prune, fmt,
                               runtime.max_length)
    max_diff = 0.0
    strict_mismatch = 0
    mismatch_above = 0
    for g, e in zip(got, expected):
        for key in set(g) | set(e):
            a, b = g.get(key), e.get(key)
            if a is None or b is None:
                strict_mismatch += 1
                if max(a or 0.0, b or 0.0) > atol:
                    mismatch_above += 1
                continue
            max_diff = max(max_diff, abs(a - b))
    report.update(
        max_abs_weight_diff=max_diff,
        key_mismatches=strict_mismatch,
        key_mismatches_above_atol=mismatch_above,
        avg_active_keys=float(np.mean([len(g) for g in got])) if got else 0.0,
        vocab_size=runtime.vocab_size,
        max_length=runtime.max_length,
    )
    tok_rt = MLCommonsRuntime.from_zip(tok_zip, "SPARSE_TOKENIZE")
    same_tok = tok_rt.decode_table == runtime.decode_table
    idf_keys_ok = set(tok_rt.idf) <= {t for t in runtime.decode_table if t}
    report.update(tokenize_same_tokenizer=same_tok, idf_entries=len(tok_rt.idf), idf_keys_are_decode=idf_keys_ok)
    report["passed"] = bool(max_diff <= atol and mismatch_above == 0 and same_tok and idf_keys_ok)
    return report
