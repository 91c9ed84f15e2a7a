"""Run an exported ``text_expansion`` model the way Elasticsearch's ML plugin does.

The chain (``docs/elasticsearch-contract.md`` sections 2-3), re-implemented because Elasticsearch
and its native ``pytorch_inference`` process (elastic/ml-cpp) cannot run here:

1. Java tokenizes with :class:`~opensearch_lsr.elasticsearch.tokenizer.EsBertTokenizer` and
   sends ``tokens``, ``arg_1`` (attention mask), ``arg_2`` (token types, 0) and ``arg_3``
   (positions), padded with ``[PAD]`` to the longest sequence of the request
   (``BertTokenizationResult.buildRequest``);
2. ml-cpp checks every operation of the TorchScript graph against an allow-list
   (``bin/pytorch_inference/CSupportedOperations.cc``, ``CModelGraphValidator``; released in v8.19.20 and
   v9.4.0, older releases check a deny-list or nothing: :data:`ALLOWED_OPERATIONS`), calls
   ``forward`` with the four int64 tensors as positional arguments, and writes a 2-D result
   ``[batch, V]`` wrapped in an outer array (``CResultWriter::writeInferenceResults``);
3. ``TextExpansionProcessor.processResult`` reads ``inference[0][0]`` (``[0][i]`` per chunk), keeps
   every id whose weight is ``> 0`` and names it ``vocabulary[id]`` with dots replaced by ``__``;
   results are sorted by weight, descending.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import LsrError
from .keys import es_keys
from .tokenizer import EsBertTokenizer

__all__ = ["TextExpansionRuntime", "EsConformanceError", "EsDuplicateKeyError", "ALLOWED_OPERATIONS", "FORBIDDEN_OPERATIONS",
           "graph_operations", "disallowed_operations"]

#: elastic/ml-cpp ``bin/pytorch_inference/CSupportedOperations.cc`` at v9.4.0 (identical at v8.19.20 and v9.5.2),
#: ``ALLOWED_OPERATIONS``: generated against PyTorch 2.7.1 from the reference models (BERT, ELSER v2, splade-v3,
#: e5 ...). Which releases check what (read at every tag of elastic/ml-cpp): the allow-list (+ deny-list) from
#: v8.19.20 and v9.4.0; only a deny-list ``{aten::from_file, aten::save}`` in ``Main.cc`` for v8.17.7-v8.17.10,
#: v8.18.2-v8.19.19 and v9.0.2-v9.3.x; no graph check at all in v8.15.0-v8.17.6, v8.18.0-v8.18.1, v9.0.0-v9.0.1.
ALLOWED_OPERATIONS = frozenset({
    "aten::Int", "aten::IntImplicit", "aten::ScalarImplicit", "aten::__and__", "aten::_convolution", "aten::abs",
    "aten::add", "aten::add_", "aten::arange", "aten::bitwise_not", "aten::bmm", "aten::cat", "aten::ceil",
    "aten::chunk", "aten::clamp", "aten::clamp_min", "aten::clone", "aten::contiguous", "aten::copy_", "aten::cos",
    "aten::cumsum", "aten::detach", "aten::div", "aten::div_", "aten::dropout", "aten::embedding", "aten::eq",
    "aten::expand", "aten::expand_as", "aten::fill_", "aten::floor_divide", "aten::full", "aten::full_like",
    "aten::gather", "aten::ge", "aten::gelu", "aten::gt", "aten::hash", "aten::index", "aten::index_put_",
    "aten::layer_norm", "aten::le", "aten::len", "aten::linalg_vector_norm", "aten::linear", "aten::log", "aten::lt",
    "aten::manual_seed", "aten::masked_fill", "aten::masked_fill_", "aten::matmul", "aten::max", "aten::mean",
    "aten::min", "aten::mul", "aten::mul_", "aten::ne", "aten::neg", "aten::new_ones", "aten::new_zeros",
    "aten::norm", "aten::ones", "aten::pad", "aten::permute", "aten::pow", "aten::rand", "aten::relu",
    "aten::repeat", "aten::reshape", "aten::rsqrt", "aten::rsub", "aten::scaled_dot_product_attention",
    "aten::select", "aten::sign", "aten::silu", "aten::sin", "aten::size", "aten::slice", "aten::softmax",
    "aten::split", "aten::sqrt", "aten::squeeze", "aten::stack", "aten::str", "aten::sub", "aten::sum", "aten::tanh",
    "aten::tensor", "aten::to", "aten::transpose", "aten::triu", "aten::type_as", "aten::unsqueeze", "aten::view",
    "aten::where", "aten::zeros", "prim::Constant", "prim::DictConstruct", "prim::GetAttr", "prim::If",
    "prim::ListConstruct", "prim::ListUnpack", "prim::Loop", "prim::NumToTensor", "prim::TupleConstruct",
    "prim::TupleUnpack", "prim::device", "prim::dtype", "prim::max", "prim::min", "quantized::linear_dynamic",
})
#: ``FORBIDDEN_OPERATIONS`` of the same file at v8.19.20 / v9.5.2 (v9.4.0 lacks ``inductor::_reinterpret_tensor``):
#: memory access, file access, calls that hide a graph; the deny-list releases forbid only ``aten::from_file`` and
#: ``aten::save``.
FORBIDDEN_OPERATIONS = frozenset({
    "aten::as_strided", "aten::from_file", "aten::save", "inductor::_reinterpret_tensor", "prim::CallFunction",
    "prim::CallMethod",
})


class EsConformanceError(LsrError, ValueError):
    """The artifact would fail, or behave differently, inside Elasticsearch: one clear sentence."""


class EsDuplicateKeyError(EsConformanceError):
    """Two ids of one result share a sanitised key: Elasticsearch's ``IllegalStateException`` "Duplicate key".

    ``TextExpansionResults.asMap`` / ``addMapFields`` collect ``weightedTokens`` with
    ``Collectors.toMap(WeightedToken::token, WeightedToken::weight)`` (elastic/elasticsearch
    ``x-pack/plugin/core/src/main/java/org/elasticsearch/xpack/core/ml/inference/results/TextExpansionResults.java``).
    """


def graph_operations(module: Any) -> list[str]:
    """Operation kinds of a TorchScript module's inlined ``forward`` graph (what ml-cpp validates)."""
    graph = module.inlined_graph if hasattr(module, "inlined_graph") else module.graph
    kinds: set[str] = set()

    def walk(g) -> None:
        for node in g.nodes():
            kinds.add(node.kind())
            for block in node.blocks():
                walk(block)

    walk(graph)
    return sorted(kinds)


def disallowed_operations(ops: Sequence[str]) -> list[str]:
    """Operations ml-cpp's graph validator would reject (forbidden or not on the allow-list)."""
    return sorted(op for op in ops if op in FORBIDDEN_OPERATIONS or op not in ALLOWED_OPERATIONS)


@dataclasses.dataclass
class TextExpansionRuntime:
    """A deployed ``text_expansion`` model: TorchScript + vocabulary + inference config."""

    module: Any
    vocabulary: list[str]
    inference_config: dict[str, Any]
    tokenizer: EsBertTokenizer

    @classmethod
    def from_parts(cls, pt_bytes: bytes | str | os.PathLike, vocabulary: Sequence[str],
                   inference_config: dict[str, Any]) -> "TextExpansionRuntime":
        """Load from the uploaded definition bytes (or a ``.pt`` path), vocabulary and config."""
        import io

        import torch

        if "text_expansion" not in inference_config:
            raise EsConformanceError(f"inference_config must hold text_expansion, got {sorted(inference_config)}")
        try:
            source = io.BytesIO(pt_bytes) if isinstance(pt_bytes, bytes) else str(pt_bytes)
            module = torch.jit.load(source, map_location="cpu")
        except Exception as err:  # noqa: BLE001 - pytorch_inference fails to load it too
            raise EsConformanceError(f"the model definition is not loadable TorchScript: {err}") from err
        module.eval()
        try:
            tokenizer = EsBertTokenizer.from_config(list(vocabulary), inference_config)
        except ValueError as err:
            raise EsConformanceError(str(err)) from err
        return cls(module, list(vocabulary), inference_config, tokenizer)

    @classmethod
    def from_export(cls, export_dir: str | os.PathLike) -> "TextExpansionRuntime":
        """Load ``traced_pytorch_model.pt`` + ``vocabulary.json`` + ``config.json`` of an export."""
        d = Path(export_dir)
        config = json.loads((d / "config.json").read_text(encoding="utf-8"))
        vocab = json.loads((d / "vocabulary.json").read_text(encoding="utf-8"))["vocabulary"]
        return cls.from_parts(d / "traced_pytorch_model.pt", vocab, config["inference_config"])

    def check_graph(self) -> list[str]:
        """Operations ml-cpp would refuse (empty when the graph validates)."""
        return disallowed_operations(graph_operations(self.module))

    def raw_output(self, texts: Sequence[str], strict: bool = True) -> np.ndarray:
        """``[batch, V]`` weights for one request (``texts`` padded together), contract-checked.

        ``strict=False`` reads a 3-D ``[batch, seq, V]`` output as Elasticsearch does (position 0 of
        each sequence, silently); ``strict`` refuses it, which is what the conformance check wants.
        """
        import torch

        req = self.tokenizer.request(list(texts))
        args = [torch.tensor(req[k], dtype=torch.int64) for k in ("tokens", "arg_1", "arg_2", "arg_3")]
        with torch.no_grad():
            try:
                out = self.module(*args)
            except Exception as err:  # noqa: BLE001
                raise EsConformanceError(f"the TorchScript failed on a request of {len(texts)} texts: {err}") from err
        if isinstance(out, (tuple, list)):
            out = out[0]
        if not isinstance(out, torch.Tensor) or out.dim() not in (2, 3):
            raise EsConformanceError("the model must return one 2-D or 3-D tensor (CResultWriter)")
        if out.dtype not in (torch.float32, torch.float64, torch.bfloat16):
            raise EsConformanceError(f"Cannot process result tensor of type [{out.dtype}]")
        if out.dim() == 3 and not strict:
            out = out[:, 0, :]
        if out.dim() == 3:
            # a raw masked LM ([batch, seq, V]): Elasticsearch would read the [CLS] position only
            raise EsConformanceError("the model returns [batch, seq, vocab] logits: Elasticsearch reads position 0 "
                                     "only (TextExpansionProcessor), so the SPLADE pooling must be in the graph")
        if out.shape != (len(texts), len(self.vocabulary)):
            raise EsConformanceError(f"output shape {tuple(out.shape)} is not [{len(texts)}, {len(self.vocabulary)}]")
        arr = out.float().numpy()
        if not np.all(np.isfinite(arr)):
            raise EsConformanceError("output holds NaN or infinite weights")
        return arr

    def infer(self, texts: Sequence[str], strict: bool = True) -> list[dict[str, float]]:
        """``TextExpansionResults`` per text (each text is its own request, as the ingest processor sends it)."""
        keys = es_keys(self.vocabulary)
        results = []
        for text in texts:
            vector = self.raw_output([text], strict=strict)[0]
            ids = np.flatnonzero(vector > 0.0)
            weighted = sorted(((keys[i], float(np.float32(vector[i]))) for i in ids), key=lambda kv: -kv[1])
            merged: dict[str, float] = {}
            for key, weight in weighted:
                if key in merged:  # TextExpansionResults.asMap: Collectors.toMap without a merge function
                    raise EsDuplicateKeyError(f"Duplicate key {key} (attempted merging values {merged[key]} and {weight})")
                merged[key] = weight
            results.append(merged)
        return results
