"""SemBridge mixing weights p = entmax_alpha(cos(B(x_t), B(x_s)) / T), fast and exact.

SemBridge (Hong et al. 2026, "Language Transfer in Sparse Encoders via Multilingual Semantic
Bridges", §3): every non-overlapping target token t gets ``e_t = sum_i p_i e_{s_i}`` with
``p = entmax_alpha(z)``, ``z_i = cos(B(x_t), B(x_{s_i})) / T``.

Why hand-written: the ``entmax`` package computes the transform on a dense row; a 29.5k x 30.5k
problem then costs minutes. For alpha > 1, entmax is sparse: ``p_i = [(alpha-1) z_i - tau]_+^(1/(alpha-1))``
and only entries above the threshold matter. Solving entmax on a row's top-k entries gives the exact
full-row solution whenever the (k+1)-th score lies at or below the threshold found on the top k
(the support, hence tau, cannot change). Rows that fail the check are redone with a larger k and,
at the end, on the full row. Softmax (alpha = 1) is dense: its mix is computed block-wise without
materialising the weight matrix.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from entmax import entmax15, entmax_bisect, sparsemax

__all__ = ["MixingResult", "entmax_rows", "entmax_mixing", "entmax_mixing_full", "prepare_space"]

logger = logging.getLogger(__name__)


def entmax_rows(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha-entmax along the last dim (exact sort-based for 1.5 and 2, bisection otherwise)."""
    if alpha == 1.0:
        return torch.softmax(z, dim=-1)
    if alpha == 2.0:
        return sparsemax(z, dim=-1)
    if alpha == 1.5:
        return entmax15(z, dim=-1)
    # bisection in float64: the threshold is then exact to ~1e-15, so the fast (top-k) and the full
    # computation agree far below 1e-6 although their bisection brackets differ
    return entmax_bisect(z.double(), alpha=alpha, dim=-1, n_iter=80).to(z.dtype)


def _threshold(z_top: torch.Tensor, p_top: torch.Tensor, alpha: float) -> torch.Tensor:
    """tau per row from the largest entry: p_max^(alpha-1) = (alpha-1) z_max - tau."""
    return (alpha - 1.0) * z_top[:, 0] - p_top[:, 0].clamp_min(0) ** (alpha - 1.0)


def prepare_space(
    target: np.ndarray,
    source: np.ndarray,
    centering: str = "per-vocab",
    whiten_dims: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Re-centre (and optionally whiten) bridge vectors, then re-normalise rows.

    ``none``: raw unit vectors; ``joint``: subtract the mean of both vocabularies; ``per-vocab``:
    subtract each vocabulary's own mean (removes the shared anisotropic direction and the
    language offset); ``whiten``: per-vocab centring followed by PCA whitening of the pooled vectors
    (keeping ``whiten_dims`` components).
    """
    if centering not in ("none", "joint", "per-vocab", "whiten"):
        raise ValueError(f"centering must be one of 'none', 'joint', 'per-vocab', 'whiten', got {centering!r}")
    t = target.astype(np.float32, copy=True)
    s = source.astype(np.float32, copy=True)
    if centering == "joint":
        mu = np.concatenate([t, s]).mean(axis=0)
        t -= mu
        s -= mu
    elif centering in ("per-vocab", "whiten"):
        t -= t.mean(axis=0)
        s -= s.mean(axis=0)
    if centering == "whiten":
        pooled = np.concatenate([t, s])
        cov = pooled.T @ pooled / len(pooled)
        vals, vecs = np.linalg.eigh(cov)
        order = np.argsort(vals)[::-1][: whiten_dims or len(vals)]
        w = vecs[:, order] / np.sqrt(vals[order] + 1e-6)
        t, s = t @ w, s @ w
    t /= np.maximum(np.linalg.norm(t, axis=1, keepdims=True), 1e-12)
    s /= np.maximum(np.linalg.norm(s, axis=1, keepdims=True), 1e-12)
    return t, s


@dataclass
class MixingResult:
    """Mixed values for each target row plus the (sparse) weights that produced them."""

    mixed: np.ndarray  # [n_t, c]  = P @ values
    weights: sp.csr_matrix  # [n_t, n_s]; for alpha=1 only the top entries, for inspection
    support_sizes: np.ndarray  # [n_t] number of nonzero weights (alpha=1: n_s)
    fallback_rows: int  # rows whose top-k check failed at the first k
    exact_weights: bool  # False when ``weights`` is a truncated view (alpha = 1)


def entmax_mixing(
    target: np.ndarray,
    source: np.ndarray,
    values: np.ndarray,
    alpha: float,
    temperature: float = 1.0,
    top_k: int = 64,
    block_size: int = 2048,
    score_mask: Callable[[slice], torch.Tensor | None] | None = None,
    progress: Callable[[int], None] | None = None,
    value_rows: np.ndarray | None = None,
    max_block_bytes: int = 256 << 20,
) -> MixingResult:
    """Compute ``P @ values`` with ``P = entmax_alpha(target @ source.T / T)`` in memory-bounded blocks.

    Args:
        target: ``[n_t, d]`` unit vectors of the tokens to initialise.
        source: ``[n_s, d]`` unit vectors of the candidate source tokens.
        values: ``[n_s, c]`` what to mix (source embeddings with the MLM bias as an extra column).
        alpha: entmax alpha >= 1 (1 softmax, 2 sparsemax).
        temperature: similarities are divided by it before entmax.
        top_k: first candidate count per row for the sparse fast path (alpha > 1).
        block_size: target rows per block (peak memory ~ block_size x n_s x 4 bytes).
        score_mask: optional ``rows -> additive [rows, n_s] mask`` (-inf forbids a pair).
        progress: called with the number of rows finished after each block.
        value_rows: ``[n_s]`` row of ``values`` for each source vector, so ``values`` can be the whole
            source matrix instead of a ``values[candidates]`` copy (XLM-R: 250k x 769 floats, 0.7 GB).
        max_block_bytes: cap on the score block (``rows x n_s x 4`` bytes): fewer rows per block when
            ``n_s`` is large (2048 x 250k candidates would be a 2 GB block). Rows are independent,
            so the result does not depend on the block size.
    """
    if alpha < 1.0:
        raise ValueError(f"alpha must be >= 1 (1 = softmax, 2 = sparsemax), got {alpha}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    t_all = torch.from_numpy(np.ascontiguousarray(target, dtype=np.float32))
    s_all = torch.from_numpy(np.ascontiguousarray(source, dtype=np.float32))
    values = np.ascontiguousarray(values, dtype=np.float32)
    n_t, n_s = t_all.shape[0], s_all.shape[0]
    if value_rows is not None and len(value_rows) != n_s:
        raise ValueError(f"value_rows has {len(value_rows)} entries for {n_s} source vectors")
    n_v = values.shape[0] if value_rows is not None else n_s
    block_size = max(1, min(block_size, max_block_bytes // max(1, 4 * n_s)))
    k0 = max(1, min(top_k, n_s - 1)) if n_s > 1 else 1
    mixed = np.empty((n_t, values.shape[1]), dtype=np.float32)
    rows_idx, cols_idx, data = [], [], []
    support = np.empty(n_t, dtype=np.int64)
    fallback = 0
    # one score buffer reused across blocks: a fresh block-sized tensor per block is mmap'ed and
    # page-faulted anew every time (measured ~20% of the init time on 2 cores)
    buffer = torch.empty(min(block_size, n_t), n_s)
    # softmax mixes every candidate: it needs the candidate rows densely (the sparse path does not)
    dense_vals = torch.from_numpy(values if value_rows is None else values[value_rows]) if alpha == 1.0 else None
    with torch.inference_mode():
        for start in range(0, n_t, block_size):
            rows = slice(start, min(start + block_size, n_t))
            z = buffer[: rows.stop - rows.start]
            torch.matmul(t_all[rows], s_all.T, out=z)  # 1/T is applied to the top-k only (topk commutes)
            if score_mask is not None:
                mask = score_mask(rows)
                if mask is not None:
                    z.add_(mask)
            if alpha == 1.0:
                p = torch.softmax(z / temperature, dim=-1)
                mixed[rows] = (p @ dense_vals).numpy()
                top_v, top_i = torch.topk(p, min(32, n_s), dim=-1)
                _collect(rows.start, top_i, top_v, rows_idx, cols_idx, data)
                support[rows] = n_s
            else:
                r_idx, c_idx, p_val, n_fb = _sparse_entmax_block(z, alpha, k0, temperature)
                fallback += n_fb
                v_idx = c_idx if value_rows is None else value_rows[c_idx]
                block = sp.csr_matrix((p_val, (r_idx, v_idx)), shape=(z.shape[0], n_v))
                mixed[rows] = block @ values
                support[rows] = np.diff(block.indptr)
                rows_idx.append(r_idx.astype(np.int64) + rows.start)
                cols_idx.append(c_idx.astype(np.int64))
                data.append(p_val)
            if progress is not None:
                progress(rows.stop - rows.start)
    weights = sp.csr_matrix(
        (np.concatenate(data) if data else np.zeros(0, np.float32),
         (np.concatenate(rows_idx) if rows_idx else np.zeros(0, np.int64),
          np.concatenate(cols_idx) if cols_idx else np.zeros(0, np.int64))),
        shape=(n_t, n_s), dtype=np.float32,
    )
    return MixingResult(mixed, weights, support, fallback, alpha != 1.0)


def _collect(start: int, idx: torch.Tensor, val: torch.Tensor, rows_idx, cols_idx, data) -> None:
    n, k = idx.shape
    rows_idx.append(np.repeat(np.arange(start, start + n), k))
    cols_idx.append(idx.reshape(-1).numpy())
    data.append(val.reshape(-1).numpy())


def _sparse_entmax_block(
    z: torch.Tensor, alpha: float, k0: int, temperature: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Exact sparse entmax of each row of ``z / temperature`` as COO triplets (row, col, weight), plus the
    number of rows that needed a larger k."""
    n, n_s = z.shape
    r_parts, c_parts, v_parts = [], [], []
    pending = torch.arange(n)
    k = k0
    fallback = None
    while pending.numel():
        zz = z if fallback is None else z[pending]  # no copy of the whole block on the first pass
        if k >= n_s:  # full rows: the reference computation, a few rows at a time (float64 bisection
            # keeps several [rows, n_s] temporaries alive: bounded to ~64 MB each)
            step = max(1, (64 << 20) // (8 * n_s))
            for lo in range(0, len(pending), step):
                p = entmax_rows(zz[lo:lo + step] / temperature, alpha)
                nz = torch.nonzero(p > 0)
                r_parts.append(pending[lo:lo + step][nz[:, 0]])
                c_parts.append(nz[:, 1])
                v_parts.append(p[nz[:, 0], nz[:, 1]])
            break
        top_v, top_i = torch.topk(zz, k + 1, dim=-1)  # sorted descending
        top_v = top_v / temperature
        p_top = entmax_rows(top_v[:, :k], alpha)
        tau = _threshold(top_v, p_top, alpha)
        ok = (alpha - 1.0) * top_v[:, k] <= tau
        keep = (p_top > 0) & ok[:, None]
        nz = torch.nonzero(keep)
        r_parts.append(pending[nz[:, 0]])
        c_parts.append(top_i[nz[:, 0], nz[:, 1]])
        v_parts.append(p_top[nz[:, 0], nz[:, 1]])
        if fallback is None:
            fallback = int((~ok).sum())
        pending = pending[~ok]
        k = min(n_s, k * 4)
    return (torch.cat(r_parts).numpy(), torch.cat(c_parts).numpy(),
            torch.cat(v_parts).numpy().astype(np.float32), fallback or 0)


def entmax_mixing_full(
    target: np.ndarray,
    source: np.ndarray,
    values: np.ndarray,
    alpha: float,
    temperature: float = 1.0,
    block_size: int = 512,
) -> tuple[np.ndarray, sp.csr_matrix]:
    """Reference (naive) computation: dense entmax over every full row. Used to check the fast path."""
    t_all = torch.from_numpy(np.ascontiguousarray(target, dtype=np.float32))
    s_all = torch.from_numpy(np.ascontiguousarray(source, dtype=np.float32))
    vals = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    mixed, blocks = [], []
    with torch.inference_mode():
        for start in range(0, t_all.shape[0], block_size):
            p = entmax_rows((t_all[start:start + block_size] @ s_all.T) / temperature, alpha)
            mixed.append((p @ vals).numpy())
            blocks.append(sp.csr_matrix(p.numpy()))
    return np.concatenate(mixed), sp.vstack(blocks).tocsr()
