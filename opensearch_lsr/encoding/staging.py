"""Several host arrays to the device in one copy: one (pinned) byte buffer, one transfer, typed views of it.

A packed batch needs its token ids and four index arrays on the device (:class:`~.packed.Segments`). Moved one by
one, each array costs a pinned allocation, a host copy into it and a transfer, and a captured CUDA graph's inputs
one device copy more each: ``aten::copy_`` was the host's largest operator in the packed path's profile on an H200
(25-30 calls, 11-17 ms of the host's 28-33 ms per 32k-token batch, ``benchmarks/results/gpu_encode_run17_bert.json``,
``host_ops``). Here the arrays are written straight into one buffer (pinned for CUDA), which crosses with one
``cudaMemcpyAsync``; the device tensors are views of it, so a graph's inputs are refreshed by one copy too
(:mod:`.graph_replay`). Why by hand: PyTorch moves tensors one at a time (``pin_memory`` then ``to``), and
``torch.cat`` would copy on the host first.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["is_view_of", "rebase", "stage"]


def stage(arrays: Sequence[np.ndarray], device: torch.device, *, pin: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``arrays`` (1-D) on ``device``: the uint8 buffer they were copied in together, and each one's typed view of it.

    Each array starts at a multiple of its item size. With ``pin`` on CUDA the host buffer is pinned and the copy
    does not block the host (the caching host allocator keeps the buffer until the copy is done); on CPU the views
    are of the host buffer itself, no copy.
    """
    spans, end = [], 0
    for a in arrays:
        if a.ndim != 1:
            raise ValueError(f"stage() takes 1-D arrays, not shape {a.shape}")
        start = -(-end // a.itemsize) * a.itemsize
        spans.append((start, a.nbytes))
        end = start + a.nbytes
    host = torch.empty(end, dtype=torch.uint8, pin_memory=pin and device.type == "cuda")
    flat = host.numpy()
    for a, (start, size) in zip(arrays, spans):
        flat[start:start + size] = np.ascontiguousarray(a).view(np.uint8)
    buffer = host if device.type == "cpu" else host.to(device, non_blocking=pin)
    return buffer, [buffer[start:start + size].view(_torch_dtype(a.dtype)) for a, (start, size) in zip(arrays, spans)]


@functools.cache
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


def is_view_of(t: torch.Tensor, buffer: torch.Tensor) -> bool:
    """Whether ``t`` lies in ``buffer``'s memory (a view :func:`stage` made)."""
    return t.device == buffer.device and t.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()


def rebase(views: Sequence[torch.Tensor], buffer: torch.Tensor, other: torch.Tensor) -> list[torch.Tensor]:
    """The same views (contiguous 1-D, of ``buffer``) on ``other``, a buffer of the same size and layout."""
    if other.shape != buffer.shape or other.dtype != torch.uint8:
        raise ValueError("rebase() needs a uint8 buffer of the same size")
    out = []
    for v in views:
        if not is_view_of(v, buffer) or not v.is_contiguous() or v.dim() != 1:
            raise ValueError("rebase() takes contiguous 1-D views of the buffer")
        start = v.storage_offset() * v.element_size() - buffer.storage_offset()
        out.append(other[start:start + v.numel() * v.element_size()].view(v.dtype))
    return out
