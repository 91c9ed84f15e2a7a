"""Probabilistic structured queries (PSQ) through a transfer's alignment: SPLADE-X (a), no training.

An English query is encoded by the English source SPLADE (the model a transfer started from, e.g.
``splade-tiny``) into a sparse vector ``w_q`` over the English vocabulary, then mapped into the
target (Korean) vocabulary with translation probabilities (Darwish & Oard 2003, "Probabilistic
Structured Query Methods", SIGIR; the PSQ baseline of SPLADE-X, Nair et al. 2022):

    score(q, d) = sum_e w_q(e) * sum_f P(f|e) w_d(f) = sum_f w_d(f) * q_f,   q_f = sum_e w_q(e) P(f|e)

so the translated query ``q = P^T w_q`` is an ordinary ``neural_sparse`` query against documents
encoded by the transferred model. ``P(f|e)`` comes from the transfer's ``alignment.npz`` (CSR
``[V_t, V_s]``: row ``f`` holds the SemBridge/VT mixing weights of the English tokens target token
``f`` was built from; overlap tokens one-hot), normalised per English token:
``P(f|e) = A[f, e] / sum_f' A[f', e]``, so each English token's weight is distributed over the
Korean tokens built from it. English tokens no Korean token was built from have no translation and
drop out. ``min_prob`` prunes translations below a probability and renormalises, as PSQ
implementations prune their translation tables.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import scipy.sparse as sp

from ..config import read_json
from ..contract import KeyFormat, check_key_format, key_table, special_token_ids
from ..errors import LsrError
from ..transfer.outputs import ALIGNMENT_FILE
from .keyed import csr_rows_to_dicts

__all__ = ["PsqError", "PsqConfig", "PsqQueryEncoder", "translation_matrix", "load_alignment", "QueryEncoderChoice",
           "QUERY_ENCODERS", "resolve_query_encoder", "has_alignment"]

QueryEncoderChoice = Literal["auto", "model", "psq"]
QUERY_ENCODERS: tuple[str, ...] = ("auto", "model", "psq")
TRANSFER_CONFIG = "transfer_config.json"


class PsqError(LsrError, ValueError):
    """PSQ cannot run on this model (no alignment, no source model, mismatched vocabularies)."""


def has_alignment(model: str | os.PathLike) -> bool:
    """True when ``model`` is a transfer output (holds ``alignment.npz``)."""
    return (Path(model) / ALIGNMENT_FILE).is_file()


def load_alignment(path: str | os.PathLike) -> sp.csr_matrix:
    """``alignment.npz`` (or a directory holding it) as CSR ``[V_t, V_s]``."""
    p = Path(path)
    if p.is_dir():
        p = p / ALIGNMENT_FILE
    if not p.is_file():
        raise PsqError(f"no {ALIGNMENT_FILE} at {p.parent}: PSQ needs the alignment a `lsr-os transfer sembridge|vt` "
                       "output saves (pass --psq-alignment DIR for a model fine-tuned from one)")
    return sp.load_npz(p).tocsr()


def translation_matrix(alignment: sp.spmatrix, min_prob: float = 0.0) -> sp.csr_matrix:
    """``P^T`` as CSR ``[V_s, V_t]``: row ``e`` = ``P(. | e)`` (sums to 1, or 0 for an untranslated token)."""
    if not 0.0 <= min_prob < 1.0:
        raise ValueError(f"min_prob must be in [0, 1), got {min_prob}")
    pt = sp.csr_matrix(alignment, dtype=np.float64).T.tocsr()
    pt.data[pt.data < 0] = 0.0
    for _ in range(2 if min_prob > 0 else 1):  # normalise; with pruning: prune, then renormalise
        sums = np.asarray(pt.sum(axis=1)).ravel()
        inv = np.divide(1.0, sums, out=np.zeros_like(sums), where=sums > 0)
        pt = (sp.diags(inv) @ pt).tocsr()
        if min_prob > 0:
            pt.data[pt.data < min_prob] = 0.0
        pt.eliminate_zeros()
    return pt.astype(np.float32)


@dataclass
class PsqConfig:
    """Where PSQ's parts come from.

    Attributes:
        model: the transferred model whose documents are searched (its tokenizer gives the target keys).
        source: the English source SPLADE (default: ``source`` of the model's ``transfer_config.json``).
        alignment: directory or ``alignment.npz`` (default: the model's; give the transfer output's for a
            model fine-tuned from it).
        min_prob: drop translations with ``P(f|e)`` below this, then renormalise (0 keeps all).
        source_language: the language the source model reads (English SPLADE: ``en``).
    """

    model: str
    source: str | None = None
    alignment: str | None = None
    min_prob: float = 0.0
    source_language: str = "en"

    def resolved_source(self) -> str:
        if self.source:
            return self.source
        cfg = Path(self.alignment or self.model)
        cfg = (cfg if cfg.is_dir() else cfg.parent) / TRANSFER_CONFIG
        if not cfg.is_file():
            raise PsqError(f"no {TRANSFER_CONFIG} next to the alignment ({cfg.parent}): pass the English source model "
                           "with --psq-source")
        source = read_json(cfg).get("source")
        if not source:
            raise PsqError(f"{cfg} names no source model: pass it with --psq-source")
        return str(source)


class PsqQueryEncoder:
    """English text -> translated target-vocabulary query (``{key: weight}`` or CSR ``[n, V_t]``)."""

    def __init__(self, config: PsqConfig):
        from ..transfer.surgery import load_target_tokenizer, resolve_model_path
        from .keyed import SparseKeyedEncoder

        self.config = config
        alignment = load_alignment(config.alignment or config.model)
        self.source = SparseKeyedEncoder(config.resolved_source())
        self.target_tokenizer = load_target_tokenizer(resolve_model_path(config.model), what="model tokenizer")
        v_t, v_s = alignment.shape
        if v_s != len(self.source.keys):
            raise PsqError(f"the alignment maps {v_s} source tokens but the source model "
                           f"{config.resolved_source()!r} has {len(self.source.keys)}: not the transfer's source")
        if v_t < len(self.target_tokenizer):
            raise PsqError(f"the alignment covers {v_t} target tokens but the model's tokenizer has "
                           f"{len(self.target_tokenizer)}: not this model's alignment")
        self.translation = translation_matrix(alignment, config.min_prob)
        specials = [i for i in special_token_ids(self.target_tokenizer) if i < v_t]
        if specials:  # the exported model zeroes special ids; a query must not weigh them either
            mask = np.ones(v_t, np.float32)
            mask[specials] = 0.0
            self.translation = (self.translation @ sp.diags(mask)).tocsr()
            self.translation.eliminate_zeros()
        self.keys = key_table(self.target_tokenizer, "word", v_t)

    def to_csr(self, texts: Sequence[str], batch_size: int = 32) -> sp.csr_matrix:
        """Translated queries ``[len(texts), V_t]`` (ids of the target vocabulary)."""
        english = self.source.to_csr(list(texts), "query", batch_size)
        out = (english @ self.translation).tocsr()
        out.eliminate_zeros()
        return out

    def encode(self, texts: Sequence[str], kind: Literal["query"] = "query", batch_size: int = 32,
               key_format: KeyFormat = "word") -> list[dict[str, float]]:
        """``{target key: weight}`` per text (ML Commons WORD keys of the transferred model, or token ids)."""
        if kind != "query":
            raise ValueError("PSQ translates queries only; documents are encoded by the transferred model")
        check_key_format(key_format)
        return csr_rows_to_dicts(self.to_csr(texts, batch_size), self.keys if key_format == "word" else None)

    def __call__(self, text: str) -> dict[str, float]:
        return self.encode([text])[0]


def resolve_query_encoder(model: str | os.PathLike | None, query_language: str | None,
                          choice: str = "auto", source_language: str = "en") -> Literal["model", "psq"]:
    """``auto`` -> ``psq`` when the query is in the PSQ source language and ``model`` is a transfer output
    (holds ``alignment.npz``), else ``model`` (the model's own query encoder)."""
    if choice not in QUERY_ENCODERS:
        raise ValueError(f"query encoder must be one of {', '.join(QUERY_ENCODERS)}, got {choice!r}")
    if choice == "auto":
        psq = bool(model) and query_language == source_language and has_alignment(model)  # type: ignore[arg-type]
        return "psq" if psq else "model"
    return choice  # type: ignore[return-value]
