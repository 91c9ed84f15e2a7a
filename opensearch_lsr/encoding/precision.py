"""Which floating-point precision an encoder computes in, when the caller says ``"auto"`` or names one.

``"auto"`` is fp32 on a CPU (bf16 matmuls without AVX512-BF16 / AMX are emulated and slower than fp32). On CUDA,
packed batching (:mod:`.packed_runner`) runs **fp16** on any card with tensor cores (compute capability 7.0 and
up): it has three more significant bits than bf16 at the same tensor-core rate, and a packed batch whose weights
overflow fp16's 65,504 is encoded again in bf16 (or fp32 where the card has no bf16, :func:`overflow_dtype`). On
one H200 (``benchmarks/results/gpu_encode.md``, run 14, BERT-base shape, body compiled) fp16 ran 17,838 docs/s
against 17,306-17,359 for bf16, and its active-set Jaccard to fp32 was 0.9947 against bf16's 0.9836 (with an fp16 head;
0.968 with a bf16 one): within the 0.99 budget where bf16 is not. Text Embeddings Inference serves BERT-family
models in fp16 on CUDA too (``huggingface/text-embeddings-inference``, ``backends/src/dtype.rs``: its candle CUDA
backend has no fp32). The padded reference path has no such re-encoding, so there ``"auto"`` keeps bf16's range
(bf16 where the card has it, else fp32).
"""
from __future__ import annotations

import logging
from typing import Literal

import torch

__all__ = ["Precision", "cpu_has_native_bf16", "overflow_dtype", "resolve_precision"]

logger = logging.getLogger(__name__)

Precision = Literal["auto", "fp32", "bf16", "fp16"]

#: the first compute capability with tensor cores (Volta): fp16 matmuls run there at many times fp32's rate
TENSOR_CORE_CAPABILITY = (7, 0)


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN has native bf16 kernels on this CPU (AVX512-BF16 / AMX); without them bf16
    matmuls are emulated and slower than fp32."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _cuda_capability(device: torch.device) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def _cuda_bf16(device: torch.device) -> bool:
    """Native bf16 (Ampere, compute capability 8.0, and up); ``torch.cuda.is_bf16_supported()`` also says yes where
    bf16 is only emulated, and for the current device rather than ``device``."""
    return _cuda_capability(device) >= (8, 0)


def resolve_precision(precision: Precision, device: torch.device, *, packed: bool) -> Precision:
    """The precision an encoder on ``device`` computes in for ``precision`` (``packed``: whether packed batching,
    with its re-encoding of batches that overflow fp16, will encode). Raises for fp16 on a CPU; warns for bf16 on
    a CPU that emulates it."""
    if precision == "auto":
        if device.type != "cuda":
            return "fp32"
        if packed and _cuda_capability(device) >= TENSOR_CORE_CAPABILITY:
            return "fp16"
        return "bf16" if _cuda_bf16(device) else "fp32"
    if precision == "fp16" and device.type == "cpu":
        raise ValueError("fp16 autocast is for CUDA; use fp32 (default) or bf16 on CPU")
    if precision == "bf16" and device.type == "cpu" and not cpu_has_native_bf16():
        logger.warning("this CPU (%s) has no native bf16 (AVX512-BF16/AMX): bf16 autocast runs emulated "
                       "and is slower than fp32; 'auto' would pick fp32", torch.backends.cpu.get_cpu_capability())
    return precision


def overflow_dtype(device: torch.device) -> torch.dtype:
    """What a packed batch whose fp16 weights came out NaN / inf is encoded again in: bf16 (fp32's range), or fp32
    on a card without bf16."""
    return torch.bfloat16 if device.type != "cuda" or _cuda_bf16(device) else torch.float32
