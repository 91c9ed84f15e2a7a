"""Compiled-body document encoder for CPU: the transformer body in ONNX Runtime or OpenVINO, the SPLADE
head in torch.

:class:`OnnxSparseDocumentEncoder` computes what :class:`~.encoder.SparseDocumentEncoder` computes
(the exported OpenSearch ``SPARSE_ENCODING`` weights ``log(1 + relu(max_i z_ij))``) and reuses all of it
(tokenization, length-sorted micro-batches, the packed head transform, the chunked max-pooled decoder
that never materialises ``[tokens, vocabulary]``) except the transformer body, which runs in ONNX
Runtime:

* the body (embeddings + encoder layers, *not* the MLM head) is exported once with
  ``torch.onnx.export`` and fused with ONNX Runtime's transformer optimizer
  (``onnxruntime.transformers.optimizer.optimize_model``: EmbedLayerNormalization, Attention,
  SkipLayerNormalization, BiasGelu; the fusions of Optimum's O2 level, which wraps the same optimizer);
* ``runtime="onnx-int8"`` additionally quantizes the body's weights to int8 with ONNX Runtime dynamic
  quantization (``onnxruntime.quantization.quantize_dynamic``: int8 weights, per-channel, uint8
  activations; VNNI kernels where the CPU has them). The MLM decoder stays fp32: its logits feed the
  max directly, so int8 there would move weights most. On an x86 CPU without 8-bit dot-product instructions
  (VNNI, AMX) the weights keep 7 bits (``reduce_range``, :func:`int8_weight_bits`): there ONNX Runtime's
  u8 x s8 kernels add pairs of products in 16 bits with ``VPMADDUBSW``, which saturates (its quantization
  guide, "When and why do I need to try U8U8?"; OpenVINO's "Saturation (overflow) issue"). On a 2-core AVX2
  EPYC, SPLADE-tiny over 300 Korean passages kept an active-set Jaccard of 0.725 (min 0.633) to fp32 with 8-bit
  weights, 0.923 (min 0.859) with 7 (``reduce_range``) and 0.927 (min 0.839) with u8 weights, speeds within the
  machine's noise (``benchmarks/onnx_int8_bits.py``, ``benchmarks/results/onnx_int8_bits.md``).

* ``runtime="openvino"`` compiles the plain (unfused) ONNX export with OpenVINO's CPU plugin at f32
  (``INFERENCE_PRECISION_HINT``: its default on AVX512-BF16/AMX CPUs is bf16, which is *not* equal output);
  OpenVINO does its own fusions (ONNX Runtime's contrib ops would not load there). With ``precision="bf16"``
  the same export is compiled at bf16 (OpenVINO's own bf16 kernels: ~2.5x torch fp32 for a BERT-base body on
  an AVX512-BF16 CPU, against ~1.6x for torch's bf16 autocast) -- faster, not equal output.

Why the head is not exported too: ONNX Runtime would run the decoder as one ``[tokens, V]`` MatMul and a
ReduceMax, materialising the logits this package's encoder exists to avoid (see ``encoder.py``).

The export is cached next to the model (``<model>/onnx-lsr/<runtime>/``; a per-user cache dir when the
model dir is read-only) with an :class:`OnnxExportConfig` that records the weights' sha256, so changed
weights re-export. Every export is checked against the torch body on a padded batch before it is used.
CPU only: on GPU the torch encoder (bf16 autocast) is the fast path.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import torch

from ..config import ArtifactConfig, sha256_file
from ..errors import LsrError
from .encoder import SparseDocumentEncoder, _Head

__all__ = [
    "CompiledBody",
    "EncoderRuntime",
    "OnnxBackendError",
    "OnnxExportConfig",
    "OnnxSparseDocumentEncoder",
    "compile_body",
    "export_onnx_body",
    "int8_weight_bits",
    "onnx_body_path",
    "open_document_encoder",
]

logger = logging.getLogger(__name__)

EncoderRuntime = Literal["torch", "onnx", "onnx-int8", "openvino"]
_ONNX_RUNTIMES = ("onnx", "onnx-int8", "openvino")
_OPSET = 17
# fp32 export parity on the check batch (ONNX Runtime's fused kernels reassociate sums: ~1e-6 typical)
_FP32_PARITY = 1e-3
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class OnnxBackendError(LsrError, RuntimeError):
    """The ONNX Runtime encoder cannot run here (package missing, GPU device, unsupported model)."""


@dataclass
class OnnxExportConfig(ArtifactConfig):
    """How a cached ONNX body was made (saved next to ``model.onnx``)."""

    FILENAME = "lsr_onnx.json"

    source: str
    weights_sha256: str
    runtime: str
    architecture: str
    opset: int
    fused: bool
    onnxruntime_version: str
    torch_version: str
    parity_max_abs: float
    openvino_version: str = ""
    #: ``onnx-int8``: the quantized weights' bits (7 where the exporting CPU's int8 kernels saturate)
    int8_weight_bits: int = 8


def int8_weight_bits(cpu_flags: set[str] | None = None, machine: str | None = None) -> int:
    """8 where this CPU multiplies int8 without saturating (not x86, or x86 with AVX512-VNNI, AVX-VNNI or AMX),
    else 7 (``quantize_dynamic(reduce_range=True)``). ``cpu_flags``: ``/proc/cpuinfo``'s (read when ``None``;
    none known counts as no VNNI)."""
    import platform

    if (machine or platform.machine()).lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return 8
    if cpu_flags is None:
        try:
            text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        cpu_flags = {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    return 8 if cpu_flags & {"avx512_vnni", "avx_vnni", "amx_int8"} else 7


def _require_onnxruntime():
    try:
        import onnxruntime
    except ImportError as err:
        raise OnnxBackendError("the onnx encoder runtime needs onnxruntime and onnx: "
                               "pip install 'opensearch-lsr[onnx]' (or use --encoder-runtime torch)") from err
    return onnxruntime


def _require_openvino():
    try:
        import openvino
    except ImportError as err:
        raise OnnxBackendError("the openvino encoder runtime needs openvino: pip install 'opensearch-lsr[openvino]' "
                               "(or use --encoder-runtime torch)") from err
    return openvino


def _require_runtime(runtime: str):
    return _require_openvino() if runtime == "openvino" else _require_onnxruntime()


def _weights_sha256(model_path: str) -> str:
    for name in _WEIGHT_FILES:
        if (Path(model_path) / name).is_file():
            return sha256_file(Path(model_path) / name)
    raise OnnxBackendError(f"{model_path}: no {' or '.join(_WEIGHT_FILES)} to export to ONNX")


def onnx_body_path(model_path: str, runtime: EncoderRuntime, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the ONNX body of ``model_path`` for ``runtime`` is cached: ``<model>/onnx-lsr/<runtime>``
    when the model dir is writable, else ``~/.cache/opensearch-lsr/onnx/<path hash>/<runtime>``."""
    if cache_dir is not None:
        return Path(cache_dir) / runtime
    model_dir = Path(model_path)
    if os.access(model_dir, os.W_OK):
        return model_dir / "onnx-lsr" / runtime
    key = hashlib.sha1(str(model_dir.resolve()).encode()).hexdigest()[:16]
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "opensearch-lsr" / "onnx" / key / runtime


class _BodyForExport(torch.nn.Module):
    """Embeddings + encoder layers with an explicit additive ``[B, 1, L, L]`` mask.

    transformers 5 builds attention masks with data-dependent Python control flow that a trace bakes
    in (a padded example changes every later batch); the explicit additive mask traces cleanly and is
    the pattern ONNX Runtime's Attention fusion recognises.
    """

    def __init__(self, base: torch.nn.Module) -> None:
        super().__init__()
        self.base = base

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # explicit position and token-type ids: the buffered defaults trace to a GatherElements that
        # blocks ONNX Runtime's EmbedLayerNormalization fusion
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0).expand_as(input_ids)
        emb = self.base.embeddings(input_ids=input_ids, position_ids=positions,
                                   token_type_ids=torch.zeros_like(input_ids))
        # transformers 4.x ``_prepare_4d_attention_mask``: ONNX Runtime's Attention fusion matches this
        # Where/Cast/Sub/Cast/Expand/Unsqueeze path (fusion_attention.py); a plain ``(1 - m) * min`` is
        # mistaken for the ``q k^T * scaling`` Mul that transformers 5 puts on the same Add
        b, length = attention_mask.shape
        inverted = 1.0 - attention_mask[:, None, None, :].expand(b, 1, length, length).to(emb.dtype)
        additive = inverted.masked_fill(inverted.to(torch.bool), torch.finfo(emb.dtype).min)
        return self.base.encoder(emb, attention_mask=additive).last_hidden_state


def _body_module(model) -> torch.nn.Module:
    kind = type(model).__name__
    if kind == "BertForMaskedLM":
        return _BodyForExport(model.bert)
    if kind in ("RobertaForMaskedLM", "XLMRobertaForMaskedLM"):
        return _BodyForExport(model.roberta)
    raise OnnxBackendError(f"the onnx encoder runtime supports BERT and (XLM-)RoBERTa masked LMs, not {kind}; "
                           "use --encoder-runtime torch")


def _check_batch(vocab_size: int, special: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """A deterministic padded batch (lengths 23 and 9) of ordinary token ids for the parity check."""
    rng = np.random.default_rng(0)
    low = max(special, default=0) + 1 if max(special, default=0) < vocab_size // 2 else 0
    ids = rng.integers(low, vocab_size, size=(2, 23), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    ids[1, 9:] = 0
    return ids, mask


def _session(path: Path, threads: int):
    ort = _require_onnxruntime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # ORT's worker threads spin after each run by default; here torch's head runs right after the body on the
    # same cores, and the spinning threads take its CPU (2 threads on ko-sembridge: 0.89x torch with spinning)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class CompiledBody:
    """``body(input_ids, attention_mask) -> hidden`` (numpy int64 in, float32 out); ``precision`` is what the
    runtime really computes in (OpenVINO reports it: a CPU without bf16 kernels keeps f32)."""

    def __init__(self, run, precision: str) -> None:
        self._run, self.precision = run, precision

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self._run(ids, mask)


def compile_body(path: Path, runtime: EncoderRuntime, threads: int,
                 precision: Literal["f32", "bf16"] = "f32") -> CompiledBody:
    """The exported body compiled for ``runtime``.

    ``precision`` is OpenVINO's inference precision (``bf16``: its bf16 kernels, where the CPU has them; the
    returned body's ``precision`` says which one it got); ONNX Runtime bodies are always fp32 (or int8).
    """
    if precision not in ("f32", "bf16"):
        raise ValueError(f"body precision {precision!r} is not f32 or bf16")
    if precision == "bf16" and runtime != "openvino":
        raise OnnxBackendError(f"a bf16 body needs --encoder-runtime openvino, not {runtime}")
    if runtime == "openvino":
        ov = _require_openvino()
        compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": precision,
                                                               "INFERENCE_NUM_THREADS": int(threads)})
        effective = "bf16" if compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.bf16 else "f32"
        if effective != precision:
            logger.warning("OpenVINO compiled the body at %s, not %s: this CPU has no %s kernels", effective,
                           precision, precision)
        request = compiled.create_infer_request()
        return CompiledBody(lambda ids, mask: request.infer([ids, mask])[0].copy(), effective)
    session = _session(path, threads)
    return CompiledBody(lambda ids, mask: session.run(None, {"input_ids": ids, "attention_mask": mask})[0],
                        "int8" if runtime == "onnx-int8" else "f32")


def export_onnx_body(model, model_path: str, out_dir: str | os.PathLike, runtime: EncoderRuntime = "onnx",
                     special_ids: Sequence[int] = ()) -> Path:
    """Export, fuse (and for ``onnx-int8`` quantize) the body of masked LM ``model`` into ``out_dir``;
    for ``openvino`` the plain export, which OpenVINO compiles and fuses itself.

    Returns the path of ``model.onnx``; ``out_dir`` also gets an :class:`OnnxExportConfig`. Raises
    :class:`OnnxBackendError` when the fp32 export does not reproduce the torch body.
    """
    if runtime not in _ONNX_RUNTIMES:
        raise ValueError(f"runtime {runtime!r} is not one of {', '.join(_ONNX_RUNTIMES)}")
    backend = _require_runtime(runtime)
    body = _body_module(model).eval()
    out = Path(out_dir)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    raw, fused_path, final = tmp / "raw.onnx", tmp / "fused.onnx", tmp / "model.onnx"
    ids, mask = _check_batch(model.config.vocab_size, special_ids)
    example = (torch.from_numpy(ids), torch.from_numpy(mask))
    axes = {0: "batch", 1: "length"}
    with torch.inference_mode():
        torch.onnx.export(body, example, str(raw), input_names=["input_ids", "attention_mask"],
                          output_names=["hidden"], opset_version=_OPSET, dynamo=False,
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "hidden": axes})
        reference = body(*example).numpy()
    config = model.config
    is_fused = runtime != "openvino"
    if runtime == "openvino":
        raw.rename(final)
    else:
        from onnxruntime.transformers.optimizer import optimize_model

        fused = optimize_model(str(raw), model_type="bert", num_heads=config.num_attention_heads,
                               hidden_size=config.hidden_size)
        fused.save_model_to_file(str(fused_path))
        is_fused = fused.get_fused_operator_statistics().get("Attention", 0) > 0
    if runtime == "onnx-int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # the fused contrib ops (com.microsoft domain) have no ONNX shape inference: their outputs are float
        quantize_dynamic(str(fused_path), str(final), weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=int8_weight_bits() == 7,
                         extra_options={"DefaultTensorType": 1})  # onnx.TensorProto.FLOAT
    elif runtime == "onnx":
        fused_path.rename(final)
    got = compile_body(final, runtime, 1)(ids, mask)
    real = mask.astype(bool)
    parity = float(np.abs(got - reference)[real].max())
    if runtime != "onnx-int8" and not parity <= _FP32_PARITY:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OnnxBackendError(f"{model_path}: the ONNX export of {type(model).__name__} differs from torch by "
                               f"{parity:.3g} (> {_FP32_PARITY}); use --encoder-runtime torch")
    for name in ("raw.onnx", "fused.onnx"):
        (tmp / name).unlink(missing_ok=True)
    OnnxExportConfig(source=str(model_path), weights_sha256=_weights_sha256(model_path), runtime=runtime,
                     architecture=type(model).__name__, opset=_OPSET, fused=is_fused,
                     onnxruntime_version=backend.__version__ if runtime != "openvino" else "",
                     torch_version=torch.__version__, parity_max_abs=parity,
                     openvino_version=backend.__version__ if runtime == "openvino" else "",
                     int8_weight_bits=int8_weight_bits() if runtime == "onnx-int8" else 8).save(tmp)
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    logger.info("exported the %s body of %s to %s (fused=%s, parity %.2e)", runtime, model_path, out, is_fused, parity)
    return out / "model.onnx"


class OnnxSparseDocumentEncoder(SparseDocumentEncoder):
    """:class:`~.encoder.SparseDocumentEncoder` with the transformer body in ONNX Runtime or OpenVINO (CPU).

    Args:
        model: as for :class:`~.encoder.SparseDocumentEncoder`.
        runtime: ``"onnx"`` (ONNX Runtime fp32, fused; same weights within ~1e-5), ``"onnx-int8"`` (int8
            body) or ``"openvino"`` (OpenVINO f32; same weights within ~1e-5).
        precision: ``"auto"``/``"fp32"`` or ``"bf16"`` (not equal output): the torch head under bf16 autocast,
            and with ``runtime="openvino"`` the body compiled at bf16 too.
        cache_dir: where the export is cached (default: next to the model, see :func:`onnx_body_path`).
        num_threads: ONNX Runtime intra-op threads and ``torch.set_num_threads`` for the head
            (default: ``torch.get_num_threads()``).
        **kwargs: ``batch_size``, ``max_length``, ``vocab_chunk``, ``row_block``, ``zero_special_tokens``.
    """

    def __init__(self, model: str | os.PathLike, *, runtime: EncoderRuntime = "onnx", device: str | None = "cpu",
                 precision: str = "auto", cache_dir: str | os.PathLike | None = None,
                 num_threads: int | None = None, **kwargs) -> None:
        if runtime not in _ONNX_RUNTIMES:
            raise ValueError(f"runtime {runtime!r} is not one of {', '.join(_ONNX_RUNTIMES)}")
        if device not in (None, "cpu"):
            raise OnnxBackendError(f"the onnx encoder runtime runs on CPU, not {device!r}; "
                                   "use --encoder-runtime torch on GPUs")
        if precision not in ("auto", "fp32", "bf16"):
            raise OnnxBackendError(f"the onnx encoder runtime's head runs in fp32 or bf16, not {precision!r}")
        _require_runtime(runtime)
        # precision applies to the torch head (bf16 autocast: fast with AVX512-BF16/AMX) and, for openvino, to the
        # body; ONNX Runtime's body stays fp32 (onnx) or int8 (onnx-int8): its CPU provider has no fast bf16 kernels
        kwargs["batching"] = "padded"  # the compiled body replaces the torch body of the padded path
        super().__init__(model, device="cpu", precision="fp32" if precision == "auto" else precision,  # type: ignore[arg-type]
                         num_threads=num_threads, **kwargs)
        if self.head is None:
            raise OnnxBackendError(f"{model}: unknown masked-LM layout {type(self.model).__name__}; "
                                   "use --encoder-runtime torch")
        self.runtime = runtime
        self.onnx_path = self._cached_export(cache_dir)
        self.body = compile_body(self.onnx_path, runtime, int(num_threads or torch.get_num_threads()),
                                 "bf16" if precision == "bf16" and runtime == "openvino" else "f32")
        self.body_precision = self.body.precision
        self.head = _Head(self._run_body, self.head.transform, self.head.weight, self.head.bias)
        base = self.model.base_model
        base.encoder = None  # the torch body is not used any more: free its layers
        base.embeddings = None

    def _cached_export(self, cache_dir) -> Path:
        from filelock import FileLock

        out = onnx_body_path(self.model_path, self.runtime, cache_dir)
        out.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(out) + ".lock"):
            if (out / OnnxExportConfig.FILENAME).exists() and (out / "model.onnx").exists():
                saved = OnnxExportConfig.load(out)
                same = saved.weights_sha256 == _weights_sha256(self.model_path) and saved.runtime == self.runtime
                if same and (self.runtime != "onnx-int8" or saved.int8_weight_bits <= int8_weight_bits()):
                    return out / "model.onnx"
                logger.info("%s: the cached ONNX export is for other weights or for a CPU whose int8 kernels do not "
                            "saturate; exporting again", out)
            return export_onnx_body(self.model, self.model_path, out, self.runtime, self.special_ids)

    def _run_body(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.body(input_ids.numpy(), mask.numpy()))

    def __repr__(self) -> str:
        return (f"OnnxSparseDocumentEncoder({self.model_path!r}, runtime={self.runtime}, body={self.body_precision}, "
                f"onnx={str(self.onnx_path)!r}, "
                f"batch_size={self.batch_size}, max_length={self.max_length}, vocab={self.vocab_size})")


def open_document_encoder(model: str | os.PathLike, *, runtime: EncoderRuntime = "torch",
                          **kwargs) -> SparseDocumentEncoder:
    """The document encoder for ``runtime``: torch (:class:`~.encoder.SparseDocumentEncoder`, any
    device) or a compiled body (:class:`OnnxSparseDocumentEncoder`: ONNX Runtime or OpenVINO, CPU)."""
    if runtime not in get_args(EncoderRuntime):
        raise ValueError(f"encoder runtime {runtime!r} is not one of {', '.join(get_args(EncoderRuntime))}")
    if runtime == "torch":
        return SparseDocumentEncoder(model, **kwargs)
    return OnnxSparseDocumentEncoder(model, runtime=runtime, **kwargs)
