"""What every transfer writes next to its model: ``alignment.npz`` and the vocabulary facts of
``transfer_config.json`` (shared by SemBridge, VT and the baselines)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .. import __version__

__all__ = ["ALIGNMENT_FILE", "vocab_sha256", "save_alignment", "vocabulary_facts"]

ALIGNMENT_FILE = "alignment.npz"


def vocab_sha256(tokenizer) -> str:
    """sha256 of the vocabulary strings in id order (identifies a vocabulary independent of files)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256("\n".join(t for t, _ in vocab).encode("utf-8")).hexdigest()


def save_alignment(
    out: Path,
    overlap_target: np.ndarray,
    overlap_source: np.ndarray,
    new_ids: np.ndarray,
    new_weights: sp.csr_matrix | None,
    shape: tuple[int, int],
) -> Path:
    """Write CSR ``[V_t, V_s]`` mixing weights: overlap rows one-hot on their source token, new rows
    the transfer's weights (``new_weights`` rows follow ``new_ids``; None leaves them empty)."""
    align = sp.csr_matrix((np.ones(len(overlap_target), np.float32), (overlap_target, overlap_source)), shape=shape)
    if new_weights is not None:
        w = new_weights.tocoo()
        align = align + sp.csr_matrix((w.data, (new_ids[w.row], w.col)), shape=shape)
    path = Path(out) / ALIGNMENT_FILE
    sp.save_npz(path, align.tocsr())
    return path


def vocabulary_facts(source_tok, target_tok, overlap_count: int, new_count: int, tied: bool) -> dict:
    """Ids and hashes of both vocabularies for ``transfer_config.json``."""
    return {
        "toolkit_version": __version__,
        "source_vocab_size": len(source_tok),
        "source_vocab_sha256": vocab_sha256(source_tok),
        "target_vocab_size": len(target_tok),
        "target_vocab_sha256": vocab_sha256(target_tok),
        "overlap_count": int(overlap_count),
        "new_token_count": int(new_count),
        "tied_decoder": bool(tied),
    }
