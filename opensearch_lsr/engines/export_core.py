"""What every engine's TorchScript export starts from: the encoder loaded for tracing, one error type, the
texts each export's conformance check runs.

The OpenSearch export (:mod:`opensearch_lsr.opensearch.artifacts`: an ML Commons ``TORCH_SCRIPT`` zip) and
the Elasticsearch export (:mod:`opensearch_lsr.elasticsearch.export`: an eland-style ``text_expansion``
model) both trace the MLM + SPLADE pooling that :func:`resolve_encoder` returns; each then writes its
engine's own calling convention and archive.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import LsrError

__all__ = ["ExportError", "DEFAULT_VERIFY_TEXTS", "resolve_encoder", "is_lexecho"]

#: Texts an export's conformance check encodes with the artifact and with the encoder (English, Korean,
#: punctuation and symbols).
DEFAULT_VERIFY_TEXTS: tuple[str, ...] = (
    "what is the capital of south korea",
    "Seoul is the capital and largest city of South Korea.",
    "대한민국의 수도는 서울이다.",
    "서울은 한강을 따라 자리 잡은 대도시이며 인구는 약 천만 명이다.",
    "OpenSearch neural sparse search with learned sparse retrieval (SPLADE).",
    "12.5% of 3,000 km²; email: a.b@example.com — “quotes” & <tags>",
)


class ExportError(LsrError, ValueError):
    """Bad export input (missing dir, not a sparse encoder, colliding keys...): one clear sentence."""


def is_lexecho(module: Any) -> bool:
    return type(module).__name__ == "LexEchoHead"


def resolve_encoder(model_dir: str, allow_milco: bool = False):
    """Load a SparseEncoder for tracing: ``(encoder, transformer module, pooling, static IDF or None)``.

    A Router (doc-only, inference-free) model gives its document route and the query route's static IDF
    module; anything but an MLM + ``SpladePooling`` encoder is refused with one sentence. With
    ``allow_milco`` a MILCO model's ``LexEchoHead`` comes back in the pooling slot (the OpenSearch export).
    """
    from ..transfer.surgery import TransferInputError, load_sparse_encoder, resolve_model_path

    path = resolve_model_path(str(model_dir))
    if not os.path.isdir(path):
        raise ExportError(f"model directory {str(model_dir)!r} does not exist")
    if not (Path(path) / "config.json").exists() and not (Path(path) / "modules.json").exists():
        raise ExportError(f"{str(model_dir)!r} is not a SparseEncoder directory (no modules.json or config.json)")
    root_config = Path(path) / "config.json"
    if root_config.exists() and not (Path(path) / "modules.json").exists():
        try:
            archs = json.loads(root_config.read_text(encoding="utf-8")).get("architectures") or []
        except (OSError, json.JSONDecodeError) as err:
            raise ExportError(f"{root_config} is not valid JSON: {err}") from err
        if archs and not any(str(a).endswith("ForMaskedLM") for a in archs):
            # loading it as fill-mask would silently attach a random MLM head
            raise ExportError(f"{str(model_dir)!r} holds a {archs[0]}, not a masked-LM sparse encoder")
    try:
        encoder = load_sparse_encoder(path)
    except TransferInputError as err:
        raise ExportError(str(err)) from err
    except Exception as err:  # noqa: BLE001 - translated into one sentence
        raise ExportError(f"{str(model_dir)!r} could not be loaded as a SparseEncoder: {type(err).__name__}: {err}") from err
    modules = list(encoder)
    static_idf = None
    if modules and hasattr(modules[0], "sub_modules"):  # Router: doc-only (inference-free) model
        routes = modules[0].sub_modules
        doc_key = next((k for k in ("document", "doc", "passage", "corpus") if k in routes), None)
        if doc_key is None:
            raise ExportError(f"Router model {str(model_dir)!r} has no document route (routes: {list(routes)})")
        query_key = next((k for k in ("query", "queries") if k in routes), None)
        if query_key is not None:
            static_idf = next((m for m in routes[query_key] if hasattr(m, "weight") and hasattr(m, "tokenizer")), None)
        modules = list(routes[doc_key])
    transformer = next((m for m in modules if hasattr(m, "auto_model")), None)
    pooling = next((m for m in modules if type(m).__name__ == "SpladePooling"), None)
    if allow_milco and transformer is not None and pooling is None and is_lexecho(modules[-1]):
        return encoder, transformer, modules[-1], static_idf  # MILCO: the LexEcho head pools both views
    if transformer is None or pooling is None:
        names = [type(m).__name__ for m in modules]
        raise ExportError(f"{str(model_dir)!r} is not an MLM + SpladePooling sparse encoder (modules: {names})")
    if transformer.auto_model.get_output_embeddings() is None:
        raise ExportError(f"{str(model_dir)!r} has no masked-LM head to export")
    return encoder, transformer, pooling, static_idf
