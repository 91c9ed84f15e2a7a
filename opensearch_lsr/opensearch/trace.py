"""The ``SPARSE_ENCODING`` archive: the TorchScript module ML Commons calls, its trace, and the
deterministic zip (the trace step of :func:`opensearch_lsr.opensearch.artifacts.export_bundle`).

``forward(input: Dict[str, Tensor]) -> Dict[str, Tensor]`` takes ``{"input_ids", "attention_mask"}``
(what DJL feeds) and returns ``{"output": float32 [batch, V]}``: SPLADE max pooling of
``log(1 + relu(logits))`` (Formal et al. 2021, arXiv:2109.10086), special ids zeroed, optional
in-graph ``max_ratio`` pruning. Traced with eager attention, ``strict=False`` on a dict input, on
CPU, without freezing (opensearch-py-ml's recipe; old ML Commons runtimes ship torch 1.13.1). The
attention mask is built inside the graph from the input, so the graph holds no device constant
(``facts["devices"]`` is empty): it follows the device DJL puts the inputs and weights on.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Dict

__all__ = ["TORCH_113_MAX_FILE_FORMAT", "trace_encoding_zip", "write_zip", "safe_name"]  # + SparseEncodingModule (lazy)

#: ``kMaxSupportedFileFormatVersion`` of torch 1.13 (caffe2/serialize/versions.h): 0xA.
TORCH_113_MAX_FILE_FORMAT = 10
#: A text with Latin and Hangul to trace the graph with.
WARM_UP_TEXT = "OpenSearch sparse export warm up sentence 서울 한국"


def _torch_module_class():
    import torch

    class SparseEncodingModule(torch.nn.Module):
        """MLM + SPLADE pooling as ML Commons calls it: one dict in, ``{"output": [B, V]}`` out."""

        def __init__(self, mlm, vocab_size: int, special_ids: list[int], pooling: str = "max",
                     activation: str = "relu", prune_ratio: float | None = None) -> None:
            super().__init__()
            if pooling not in ("max", "sum"):
                raise ValueError(f"pooling must be 'max' or 'sum', got {pooling!r}")
            if activation not in ("relu", "log1p_relu"):
                raise ValueError(f"activation must be 'relu' or 'log1p_relu', got {activation!r}")
            self.mlm = mlm
            keep = torch.ones(vocab_size, dtype=torch.float32)
            if special_ids:
                keep[torch.tensor(sorted(special_ids), dtype=torch.long)] = 0.0
            self.register_buffer("keep", keep)
            self.pooling = pooling
            self.activation = activation
            self.prune_ratio = float(prune_ratio or 0.0)

        def forward(self, input: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:  # noqa: A002 - DJL's name
            input_ids = input["input_ids"]
            attention_mask = input["attention_mask"]
            # The additive [B, 1, 1, S] mask eager attention adds to its scores, built here from the input
            # so that it lives on the input's device. Handing transformers the 2-D mask instead makes its
            # mask utilities record torch.device("cpu") constants (aten::arange/zeros/to in
            # masking_utils), which pin the traced graph to CPU: DJL warms the model up on every device
            # of an ML node and a GPU node would fail to deploy it. Same outputs.
            extended = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min
            logits = self.mlm(input_ids=input_ids, attention_mask=extended, return_dict=False)[0]
            mask = attention_mask.unsqueeze(-1).to(logits.dtype)
            values = torch.log1p(torch.relu(logits * mask))  # SpladePooling: relu(masked) then log1p
            if self.activation == "log1p_relu":
                values = torch.log1p(values)
            if self.pooling == "max":
                values = torch.max(values, dim=1)[0]
            else:
                values = torch.sum(values, dim=1)
            values = values * self.keep
            if self.prune_ratio > 0:
                threshold = torch.max(values, dim=1, keepdim=True)[0] * self.prune_ratio
                values = values * (values >= threshold).to(values.dtype)
            return {"output": values.to(torch.float32)}

    return SparseEncodingModule


def __getattr__(name: str):
    # ``SparseEncodingModule`` is built lazily so importing this module does not import torch.
    if name == "SparseEncodingModule":
        return _torch_module_class()
    raise AttributeError(name)


def write_zip(path: Path, members: dict[str, Path | bytes]) -> None:
    """Deterministic zip (fixed timestamps, sorted names) so equal content gives equal sha256."""
    tmp = path.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            data = members[name]
            if isinstance(data, Path):
                # streamed in 1 MiB blocks: a BERT-base .pt is ~440 MB, read_bytes() held all of it.
                # writestr() itself writes through open(info, "w") with file_size preset: same bytes.
                info.file_size = data.stat().st_size
                with open(data, "rb") as src, zf.open(info, "w") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            else:
                zf.writestr(info, data)
    os.replace(tmp, path)


def _torchscript_facts(pt_path: Path, traced) -> dict[str, Any]:
    """The archive's file-format version and the graph's operator set."""
    with zipfile.ZipFile(pt_path) as zf:
        version_entry = next((n for n in zf.namelist() if n.endswith(("/.data/version", "/version"))), None)
        file_version = int(zf.read(version_entry).decode().strip()) if version_entry else None
    ops = sorted({node.kind() for node in traced.inlined_graph.nodes()})
    # device constants recorded by the trace (transformers' mask construction records torch.device("cpu")):
    # such a graph runs on that device only, whatever device DJL moves the inputs to
    devices = sorted({str(node.output().toIValue()) for node in traced.inlined_graph.nodes()
                      if node.kind() == "prim::Constant" and node.output().type().kind() == "DeviceObjType"})
    return {"file_format_version": file_version, "ops": ops, "devices": devices}


def safe_name(name: str) -> str:
    """``name`` as a safe file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "model"




def trace_encoding_zip(mlm: Any, tokenizer_text: str, out_zip: Path, *, model_name: str, vocab_size: int,
                       special_ids: list[int], pooling: str, activation: str,
                       prune_ratio: float | None) -> tuple[str, dict[str, Any]]:
    """Trace ``mlm`` wrapped in :class:`SparseEncodingModule` and write ``out_zip`` (``<name>.pt`` +
    ``tokenizer.json``). Returns ``(pt file name, {"file_format_version", "ops"})``; ``mlm`` is not changed."""
    import torch
    from tokenizers import Tokenizer

    # Traced in place (no deepcopy: a second copy of the weights, 0.4-1.1 GB at base size) as float32 on CPU
    # with eager attention; the model's dtype, device, attention implementation and train/eval mode are
    # restored afterwards (a trace reads the weights, it does not change them).
    param = next(mlm.parameters())
    dtype, device, training = param.dtype, param.device, mlm.training
    attn = getattr(mlm.config, "_attn_implementation", None)
    try:
        mlm_export = mlm.to("cpu").float().eval()
        mlm_export.set_attn_implementation("eager")
        wrapper = _torch_module_class()(mlm_export, vocab_size, special_ids, pooling, activation, prune_ratio).eval()
        runtime_tok = Tokenizer.from_str(tokenizer_text)
        runtime_tok.no_padding()
        example = runtime_tok.encode(WARM_UP_TEXT, add_special_tokens=True)
        example_input = {
            "input_ids": torch.tensor([example.ids], dtype=torch.int64),
            "attention_mask": torch.tensor([example.attention_mask], dtype=torch.int64),
        }
        with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
            traced = torch.jit.trace(wrapper, (example_input,), strict=False, check_trace=False)
            pt_name = f"{safe_name(model_name)}.pt"
            pt_path = Path(tmp) / pt_name
            torch.jit.save(traced, str(pt_path))
            facts = _torchscript_facts(pt_path, traced)
            del traced, wrapper
            write_zip(out_zip, {pt_name: pt_path, "tokenizer.json": tokenizer_text.encode("utf-8")})
    finally:
        if attn is not None and attn != "eager":
            mlm.set_attn_implementation(attn)
        if dtype != torch.float32 or device.type != "cpu":
            mlm.to(device=device, dtype=dtype)
        mlm.train(training)
    return pt_name, facts
