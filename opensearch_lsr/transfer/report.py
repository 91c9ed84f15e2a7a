"""Alignment report: which source tokens each target token was built from (SemBridge paper, Table 3)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..config import read_json
from .outputs import ALIGNMENT_FILE
from .sembridge import SemBridgeConfig
from .surgery import TransferInputError, load_target_tokenizer

__all__ = ["TokenAlignment", "inspect_alignment"]


@dataclass
class TokenAlignment:
    """The top source tokens (with weights) of one target token."""

    query: str
    target_token: str
    target_id: int
    overlap: bool
    sources: list[tuple[str, float]]


def inspect_alignment(model_dir: str | Path, tokens: list[str], top: int = 5) -> list[TokenAlignment]:
    """Top source tokens and mixing weights for each requested target token.

    A requested string that the target tokenizer splits into several pieces is reported piece by piece.
    """
    model_dir = Path(model_dir)
    path = model_dir / ALIGNMENT_FILE
    if not path.exists():
        raise TransferInputError(f"{model_dir} has no {ALIGNMENT_FILE}: it was not made by `lsr-os transfer`")
    cfg = read_json(model_dir / SemBridgeConfig.FILENAME)
    weights = sp.load_npz(path).tocsr()
    target_tok = load_target_tokenizer(str(model_dir), what="transferred model tokenizer")
    source_tok = load_target_tokenizer(cfg["source"], what="source tokenizer")
    vocab = target_tok.get_vocab()
    out: list[TokenAlignment] = []
    for text in tokens:
        ids = [vocab[text]] if text in vocab else target_tok.encode(text, add_special_tokens=False)
        if not ids:
            raise TransferInputError(f"{text!r} produces no target token")
        for tid in ids:
            row = weights.getrow(tid)
            order = np.argsort(-row.data)[:top]
            sources = [(source_tok.convert_ids_to_tokens(int(row.indices[j])), float(row.data[j])) for j in order]
            is_overlap = row.nnz == 1 and abs(row.data[0] - 1.0) < 1e-6
            out.append(TokenAlignment(text, target_tok.convert_ids_to_tokens(tid), int(tid), is_overlap, sources))
    return out
