"""Embedding-initialisation baselines of the SemBridge paper's appendix B.

Each initialiser returns rows ``[n_new, H+1]``: embedding and MLM output bias of the new
(non-overlapping) target tokens. Overlapping tokens are always copied by the caller.

- ``random``: N(0, initializer_range) embeddings, zero bias (a freshly initialised model).
- ``mean``: every new token = mean source embedding and mean bias.
- ``univariate``: per-dimension N(mu_d, sigma_d) of the source embeddings (and bias).
- ``multivariate``: N(mu, Sigma) of the source [embedding; bias] (Hewitt 2021).
- ``focus`` (approximation): FOCUS (Dobler & de Melo 2023) mixes *overlapping* tokens with sparsemax
  weights from similarities in an auxiliary fastText space trained on target text. No fastText
  model is available offline, so the bridge space stands in for it: sparsemax over cosines to the
  overlap anchors, mixing the anchors' source rows.
- ``ofa`` (approximation): OFA (Liu et al. 2024) factorises the source embeddings (E ~ C W, low rank),
  gives each new token the similarity-weighted mean of the coordinates of its top-10 neighbours in
  external multilingual word vectors (ColexNet+), and maps back with W. ColexNet+ is not available
  offline: bridge-space neighbours stand in for it.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from entmax import sparsemax

__all__ = ["BASELINES", "Baseline", "init_baseline"]

Baseline = Literal["random", "mean", "univariate", "multivariate", "focus", "ofa"]
BASELINES: tuple[str, ...] = ("random", "mean", "univariate", "multivariate", "focus", "ofa")


def init_baseline(
    method: Baseline,
    source_rows: np.ndarray,
    n_new: int,
    seed: int = 42,
    initializer_range: float = 0.02,
    new_bridge: np.ndarray | None = None,
    source_bridge: np.ndarray | None = None,
    anchor_ids: np.ndarray | None = None,
    ofa_rank: int | None = None,
    ofa_neighbours: int = 10,
) -> np.ndarray:
    """Rows ``[n_new, H+1]`` for the new tokens by one of :data:`BASELINES`.

    Args:
        source_rows: ``[V_s, H+1]`` source embeddings with the MLM bias as last column.
        new_bridge / source_bridge: unit bridge vectors of new target tokens / source tokens
            (``focus`` and ``ofa`` only).
        anchor_ids: source ids of the overlap anchors (``focus`` only).
    """
    if method not in BASELINES:
        raise ValueError(f"init must be one of {', '.join(BASELINES)} or 'sembridge', got {method!r}")
    rng = np.random.default_rng(seed)
    hidden = source_rows.shape[1] - 1
    if method == "random":
        out = np.zeros((n_new, hidden + 1), dtype=np.float32)
        out[:, :hidden] = rng.normal(0.0, initializer_range, size=(n_new, hidden))
        return out
    if method == "mean":
        return np.repeat(source_rows.mean(axis=0, keepdims=True), n_new, axis=0).astype(np.float32)
    if method == "univariate":
        mu, sd = source_rows.mean(axis=0), source_rows.std(axis=0)
        return (mu + sd * rng.standard_normal((n_new, hidden + 1))).astype(np.float32)
    if method == "multivariate":
        mu = source_rows.mean(axis=0)
        cov = np.cov(source_rows, rowvar=False) + 1e-6 * np.eye(hidden + 1)
        return rng.multivariate_normal(mu, cov, size=n_new, method="cholesky").astype(np.float32)
    if new_bridge is None or source_bridge is None:
        raise ValueError(f"init {method!r} needs bridge vectors")
    if method == "focus":
        if anchor_ids is None or len(anchor_ids) == 0:
            raise ValueError("init 'focus' needs overlapping tokens as anchors; none were found")
        anchors = torch.from_numpy(source_bridge[anchor_ids])
        rows = torch.from_numpy(source_rows[anchor_ids])
        out = np.empty((n_new, hidden + 1), dtype=np.float32)
        for start in range(0, n_new, 2048):
            p = sparsemax(torch.from_numpy(new_bridge[start:start + 2048]) @ anchors.T, dim=-1)
            out[start:start + 2048] = (p @ rows).numpy()
        return out
    # ofa
    rank = ofa_rank or max(1, hidden * 3 // 4)
    mu = source_rows.mean(axis=0)
    u, s, vt = np.linalg.svd(source_rows - mu, full_matrices=False)
    coords = u[:, :rank] * s[:rank]  # [V_s, rank]
    basis = vt[:rank]  # [rank, H+1]
    src = torch.from_numpy(source_bridge)
    out = np.empty((n_new, hidden + 1), dtype=np.float32)
    for start in range(0, n_new, 2048):
        sims = torch.from_numpy(new_bridge[start:start + 2048]) @ src.T
        top_v, top_i = torch.topk(sims, ofa_neighbours, dim=-1)
        w = torch.softmax(top_v, dim=-1).numpy()
        mixed = np.einsum("nk,nkr->nr", w, coords[top_i.numpy()])
        out[start:start + 2048] = mixed @ basis + mu
    return out
