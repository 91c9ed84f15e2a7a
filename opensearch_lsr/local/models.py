"""Models and analyzers of the local backend: what ``neural_sparse`` ``model_id`` / ``analyzer`` run.

A model is a ``SparseEncoder`` dir, an export bundle dir or an ML Commons zip (SPARSE_ENCODING runs
through the conformance runtime, SPARSE_TOKENIZE through the tokenizer + ``idf.json``); an analyzer
is a dir/zip with ``tokenizer.json`` and optional ``idf.json``.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..config import read_json
from ..contract import djl_tokenizer, rust_tokenizer
from ..idf import load_idf
from .query_evaluator import QueryEncoder

__all__ = ["load_query_encoder", "load_analyzer"]


def load_query_encoder(path: str) -> QueryEncoder:
    """``text -> {token: weight}`` from a path: a SPARSE_* zip, an export bundle dir (its
    ``sparse_encoding.zip``/``sparse_tokenize.zip``), or a ``SparseEncoder`` dir."""
    from ..encoding.query_tokens import tokenize_query

    p = Path(path)
    if p.is_dir() and (p / "manifest.json").exists() and not (p / "modules.json").exists():
        for name in ("sparse_tokenize.zip", "sparse_encoding.zip"):
            if (p / name).exists():
                p = p / name
                break
    if p.suffix == ".zip":
        import zipfile

        with zipfile.ZipFile(p) as zf:
            names = set(zf.namelist())
            if not any(n.endswith((".pt", ".onnx")) for n in names):  # SPARSE_TOKENIZE: tokenizer (+ idf)
                from tokenizers import Tokenizer

                tok = Tokenizer.from_str(zf.read("tokenizer.json").decode("utf-8"))
                idf = load_idf(p) if "idf.json" in names else None
                tok = djl_tokenizer(tok)
                return lambda text: tokenize_query(text, tok, idf)
        from ..engines.model_runtime import MLCommonsRuntime

        rt = MLCommonsRuntime.from_zip(str(p), function_name="SPARSE_ENCODING")
        return lambda text: rt.predict([text])[0]
    from ..encoding.keyed import sparse_encoder_query_fn

    return sparse_encoder_query_fn(str(p))


def load_analyzer(path: str) -> QueryEncoder:
    """``text -> {token: idf or 1.0}`` as neural-search analyzers do (HFModelTokenizer, no specials, no truncation)."""
    p = Path(path)
    idf = None
    if p.suffix == ".zip":
        import zipfile

        from tokenizers import Tokenizer

        with zipfile.ZipFile(p) as zf:
            tok = Tokenizer.from_str(zf.read("tokenizer.json").decode("utf-8"))
            if "idf.json" in zf.namelist():
                idf = json.loads(zf.read("idf.json"))
    else:
        tok = rust_tokenizer(p)
        if (p / "idf.json").exists():
            idf = read_json(p / "idf.json")
    tok = djl_tokenizer(tok)
    tok.no_truncation()  # analyzers cover long text with overflow segments instead of truncating

    def analyze(text: str) -> dict[str, float]:
        # HFModelTokenizer: encode without special tokens; terms are raw tokens; idf.getOrDefault(term, 1)
        enc = tok.encode(text, add_special_tokens=False)
        return {t: float(idf.get(t, 1.0)) if idf is not None else 1.0 for t in enc.tokens}

    return analyze
