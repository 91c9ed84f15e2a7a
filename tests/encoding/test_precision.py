"""What ``precision="auto"`` resolves to on each kind of device (the CUDA cases with the card's answers faked)."""
from __future__ import annotations

import pytest
import torch

from opensearch_lsr.encoding import precision as prec
from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
from opensearch_lsr.encoding.precision import overflow_dtype, resolve_precision

CUDA = torch.device("cuda:0")


def _card(monkeypatch, capability: tuple[int, int], bf16: bool) -> None:
    monkeypatch.setattr(prec, "_cuda_capability", lambda device: capability)
    monkeypatch.setattr(prec, "_cuda_bf16", lambda device: bf16)


@pytest.mark.parametrize(("capability", "bf16", "packed", "padded"), [
    ((9, 0), True, "fp16", "bf16"),  # H100 / H200
    ((8, 0), True, "fp16", "bf16"),  # A100
    ((7, 5), False, "fp16", "fp32"),  # T4: tensor cores, no bf16
    ((7, 0), False, "fp16", "fp32"),  # V100
    ((6, 1), False, "fp32", "fp32"),  # P40: no tensor cores
])
def test_auto_is_fp16_for_packed_batching_on_tensor_cores_and_keeps_bf16s_range_when_padded(
        monkeypatch, capability, bf16, packed, padded):
    _card(monkeypatch, capability, bf16)
    assert resolve_precision("auto", CUDA, packed=True) == packed
    assert resolve_precision("auto", CUDA, packed=False) == padded
    assert overflow_dtype(CUDA) == (torch.bfloat16 if bf16 else torch.float32)


def test_auto_is_fp32_on_cpu_and_named_precisions_are_kept():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu, packed=True) == "fp32"
    assert resolve_precision("fp32", CUDA, packed=True) == "fp32"
    assert resolve_precision("bf16", CUDA, packed=True) == "bf16"
    assert resolve_precision("bf16", cpu, packed=False) == "bf16"  # with a warning where the CPU emulates it
    assert overflow_dtype(cpu) == torch.bfloat16
    with pytest.raises(ValueError, match="fp16"):
        resolve_precision("fp16", cpu, packed=True)


def test_the_padded_path_keeps_bf16s_range_when_auto_runs_packed_batches_in_fp16(tiny_source_dir, monkeypatch):
    """``encode_dense`` (and ``encode`` where the model's layout has no packed form) computes in what "auto" is for
    padded batches, where nothing re-encodes an fp16 overflow; a named precision is the same on both paths."""
    from opensearch_lsr.encoding import encoder as encoder_module

    def card(precision, device, *, packed):  # what an H200 answers
        return ("fp16" if packed else "bf16") if precision == "auto" else precision

    monkeypatch.setattr(encoder_module, "resolve_precision", card)
    enc = SparseDocumentEncoder(tiny_source_dir, device="cpu")
    assert (enc.batching, enc.precision, enc.padded_precision) == ("packed", "fp16", "bf16")
    assert enc.runner.model.dtype == torch.float16 and enc.runner.fallback is not None
    named = SparseDocumentEncoder(tiny_source_dir, device="cpu", precision="fp32")
    assert (named.precision, named.padded_precision) == ("fp32", "fp32") and named.runner.fallback is None
    monkeypatch.setattr("opensearch_lsr.encoding.packed_layouts.packed_model", lambda *a, **k: None)
    unknown = SparseDocumentEncoder(tiny_source_dir, device="cpu")
    assert (unknown.batching, unknown.precision, unknown.padded_precision) == ("padded", "bf16", "bf16")
