"""The ONNX Runtime encoder (encoding/onnx_backend.py) gives the torch encoder's vectors and keys."""
from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")

from opensearch_lsr.encoding.encoder import SparseDocumentEncoder  # noqa: E402
from opensearch_lsr.encoding.onnx_backend import (OnnxBackendError, OnnxExportConfig,  # noqa: E402
                                                  OnnxSparseDocumentEncoder, open_document_encoder)

TEXTS = ["the cat is in the house", "seoul is the capital of korea", "a dog", "paris",
         "the river water of the city of paris france is a road " * 3, "books school cats dogs"]
KO = ["서울은 한국의 수도입니다. 한강이 도시를 가로질러 흐릅니다.", "손바닥에 작은 돌기가 생기는 가장 흔한 원인은 습진입니다. " * 4,
      "파리", "what is the capital of france? " * 12]


def _assert_same_vectors(a, b, atol: float) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert np.array_equal(x.ids, y.ids), "the ONNX path must activate exactly the same keys"
        np.testing.assert_allclose(x.weights, y.weights, atol=atol, rtol=0)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_onnx_equals_torch_tiny(tiny_source_dir, tmp_path, batch_size):
    torch_enc = SparseDocumentEncoder(tiny_source_dir, device="cpu", batch_size=batch_size)
    onnx_enc = OnnxSparseDocumentEncoder(tiny_source_dir, cache_dir=tmp_path, batch_size=batch_size, num_threads=1)
    assert onnx_enc.special_ids == torch_enc.special_ids
    _assert_same_vectors(torch_enc.encode(TEXTS), onnx_enc.encode(TEXTS), atol=1e-5)
    config = OnnxExportConfig.load(tmp_path / "onnx")
    assert config.fused and config.parity_max_abs <= 1e-4 and config.runtime == "onnx"


def test_onnx_equals_torch_splade_tiny_korean(splade_tiny_dir, tmp_path):
    texts = KO + TEXTS
    ref = SparseDocumentEncoder(splade_tiny_dir, device="cpu", batch_size=3).encode(texts)
    got = open_document_encoder(splade_tiny_dir, runtime="onnx", cache_dir=tmp_path, batch_size=3).encode(texts)
    _assert_same_vectors(ref, got, atol=1e-4)


def test_export_is_cached_and_redone_for_new_weights(tiny_source_dir, tmp_path, monkeypatch):
    import opensearch_lsr.encoding.onnx_backend as ob

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_source_dir, model_dir)
    calls = []
    real = ob.export_onnx_body
    monkeypatch.setattr(ob, "export_onnx_body", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = OnnxSparseDocumentEncoder(model_dir, num_threads=1)
    assert first.onnx_path == model_dir / "onnx-lsr" / "onnx" / "model.onnx" and len(calls) == 1
    OnnxSparseDocumentEncoder(model_dir, num_threads=1)
    assert len(calls) == 1, "an up-to-date export must be reused"
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(str(model_dir))
    with torch.no_grad():
        model.cls.predictions.bias.add_(0.25)
    model.save_pretrained(str(model_dir))
    changed = OnnxSparseDocumentEncoder(model_dir, num_threads=1)
    assert len(calls) == 2, "changed weights must be exported again"
    _assert_same_vectors(SparseDocumentEncoder(model_dir, device="cpu").encode(TEXTS), changed.encode(TEXTS), 1e-5)


def test_int8_weights_keep_7_bits_where_the_cpu_int8_kernels_saturate():
    from opensearch_lsr.encoding.onnx_backend import int8_weight_bits

    assert int8_weight_bits({"avx2", "fma"}, "x86_64") == 7  # VPMADDUBSW: 16-bit pair sums saturate
    assert int8_weight_bits({"avx2", "avx512f", "avx512_vnni"}, "x86_64") == 8
    assert int8_weight_bits({"avx2", "avx_vnni"}, "AMD64") == 8 and int8_weight_bits({"amx_int8"}, "x86_64") == 8
    assert int8_weight_bits(set(), "aarch64") == 8  # no such kernel there
    assert int8_weight_bits() in (7, 8)  # this machine, from /proc/cpuinfo


def test_an_8_bit_int8_export_is_made_again_on_a_cpu_that_needs_7_bits(tiny_source_dir, tmp_path, monkeypatch):
    """The export is cached next to the model, which may move between machines: an export with 8-bit weights
    made where int8 does not saturate is made again on a CPU where it does; a 7-bit one serves everywhere."""
    import opensearch_lsr.encoding.onnx_backend as ob

    calls, bits = [], [8]
    real = ob.export_onnx_body
    monkeypatch.setattr(ob, "export_onnx_body", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(ob, "int8_weight_bits", lambda *a: bits[0])
    OnnxSparseDocumentEncoder(tiny_source_dir, runtime="onnx-int8", cache_dir=tmp_path, num_threads=1)
    assert OnnxExportConfig.load(tmp_path / "onnx-int8").int8_weight_bits == 8 and len(calls) == 1
    bits[0] = 7
    OnnxSparseDocumentEncoder(tiny_source_dir, runtime="onnx-int8", cache_dir=tmp_path, num_threads=1)
    assert OnnxExportConfig.load(tmp_path / "onnx-int8").int8_weight_bits == 7 and len(calls) == 2
    bits[0] = 8
    OnnxSparseDocumentEncoder(tiny_source_dir, runtime="onnx-int8", cache_dir=tmp_path, num_threads=1)
    assert len(calls) == 2  # the 7-bit export is kept


def test_int8_is_quantized_and_close(splade_tiny_dir, tmp_path):
    import onnx

    enc = OnnxSparseDocumentEncoder(splade_tiny_dir, runtime="onnx-int8", cache_dir=tmp_path, num_threads=1)
    ops = {n.op_type for n in onnx.load(str(enc.onnx_path)).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} & ops or "QAttention" in ops, ops
    texts = KO + TEXTS
    ref = SparseDocumentEncoder(splade_tiny_dir, device="cpu").encode(texts)
    got = enc.encode(texts)
    jacc = [len(set(a.ids) & set(b.ids)) / len(set(a.ids) | set(b.ids)) for a, b in zip(ref, got)]
    assert min(jacc) > 0.5 and np.mean(jacc) > 0.8
    for v in got:
        assert (v.weights > 0).all() and np.isfinite(v.weights).all() and (np.diff(v.ids) > 0).all()
    assert not np.array_equal(ref[0].weights, got[0].weights), "int8 must actually change the computation"


def test_bf16_head_is_close(splade_tiny_dir, tmp_path):
    enc = OnnxSparseDocumentEncoder(splade_tiny_dir, precision="bf16", cache_dir=tmp_path, num_threads=1)
    assert enc.precision == "bf16"
    ref = SparseDocumentEncoder(splade_tiny_dir, device="cpu").encode(KO)
    got = enc.encode(KO)
    for a, b in zip(ref, got):
        assert len(set(a.ids) ^ set(b.ids)) <= 0.1 * len(a.ids)
        assert a.weights.max() == pytest.approx(b.weights.max(), rel=0.05)


def test_clear_errors(tiny_source_dir, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="torch, onnx, onnx-int8"):
        open_document_encoder(tiny_source_dir, runtime="tensorrt")
    with pytest.raises(OnnxBackendError, match="CPU"):
        OnnxSparseDocumentEncoder(tiny_source_dir, device="cuda", cache_dir=tmp_path)
    with pytest.raises(OnnxBackendError, match="fp32 or bf16"):
        OnnxSparseDocumentEncoder(tiny_source_dir, precision="fp16", cache_dir=tmp_path)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    with pytest.raises(OnnxBackendError, match=r"pip install 'opensearch-lsr\[onnx\]'"):
        OnnxSparseDocumentEncoder(tiny_source_dir, cache_dir=tmp_path)


def test_index_job_with_onnx_runtime_writes_the_same_documents(tmp_path, tiny_source_dir, small_corpus):
    from opensearch_lsr.encoding.job import IndexJobConfig, IndexJobError, run_index_job

    docs = {}
    for runtime in ("torch", "onnx"):
        out = tmp_path / f"out_{runtime}"
        cfg = IndexJobConfig(corpus=str(small_corpus), model=str(tiny_source_dir), backend="ndjson", index=str(out),
                             encoder_runtime=runtime, batch_size=8, threads=1)
        summary = run_index_job(cfg, progress=False)
        assert summary["indexed"] == 40 and summary["encoder"]["runtime"] == runtime
        lines = [json.loads(x) for f in sorted(out.glob("*.ndjson")) for x in f.read_text().splitlines()]
        docs[runtime] = {lines[i]["index"]["_id"]: lines[i + 1]["sparse_embedding"] for i in range(0, len(lines), 2)}
    assert docs["torch"].keys() == docs["onnx"].keys()
    for key, vec in docs["torch"].items():
        other = docs["onnx"][key]
        assert vec.keys() == other.keys()
        assert max(abs(vec[k] - other[k]) for k in vec) <= 1e-5
    with pytest.raises(ValueError, match="encoder_runtime"):
        IndexJobConfig(corpus=str(small_corpus), model="x", backend="local", index="i", encoder_runtime="fast")
    with pytest.raises(IndexJobError, match="CPU only"):
        run_index_job(IndexJobConfig(corpus=str(small_corpus), model=str(tiny_source_dir), backend="ndjson",
                                     index=str(tmp_path / "gpu"), encoder_runtime="onnx", device="cuda:0"),
                      progress=False)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_openvino_equals_torch(splade_tiny_dir, tmp_path, batch_size):
    """``--encoder-runtime openvino``: the plain ONNX body compiled by OpenVINO at f32 (its CPU default on
    AVX512-BF16 machines is bf16, which would move weights ~1e-2), same keys and weights as torch."""
    pytest.importorskip("openvino")
    texts = KO + TEXTS
    ref = SparseDocumentEncoder(splade_tiny_dir, device="cpu", batch_size=batch_size).encode(texts)
    enc = open_document_encoder(splade_tiny_dir, runtime="openvino", cache_dir=tmp_path, batch_size=batch_size,
                                num_threads=1)
    _assert_same_vectors(ref, enc.encode(texts), atol=1e-4)
    config = OnnxExportConfig.load(tmp_path / "openvino")
    assert config.runtime == "openvino" and not config.fused and config.openvino_version
    assert config.parity_max_abs <= 1e-4


def test_openvino_bf16_body(splade_tiny_dir, tmp_path):
    """``--encoder-runtime openvino --precision bf16``: the same export compiled at bf16 (not equal output, close)."""
    ov = pytest.importorskip("openvino")
    from opensearch_lsr.encoding.onnx_backend import compile_body

    texts = KO + TEXTS
    f32 = open_document_encoder(splade_tiny_dir, runtime="openvino", cache_dir=tmp_path, num_threads=1)
    bf16 = open_document_encoder(splade_tiny_dir, runtime="openvino", cache_dir=tmp_path, num_threads=1,
                                 precision="bf16")
    has_bf16 = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    # the precision OpenVINO really compiled to: a CPU without bf16 kernels keeps f32 (and says so)
    assert (f32.body_precision, bf16.body_precision) == ("f32", "bf16" if has_bf16 else "f32")
    assert bf16.onnx_path == f32.onnx_path
    ids = np.array([[2, 40, 41, 42, 3]], dtype=np.int64)
    mask = np.ones_like(ids)
    hidden = {p: compile_body(f32.onnx_path, "openvino", 1, p)(ids, mask) for p in ("f32", "bf16")}
    gap = float(np.abs(hidden["bf16"] - hidden["f32"]).max())
    assert gap < 0.1 * float(np.abs(hidden["f32"]).max())
    if has_bf16:
        assert gap > 0, "the bf16 hint must reach OpenVINO's bf16 kernels on a CPU that has them"
    overlap = []
    for a, b in zip(f32.encode(texts), bf16.encode(texts)):
        keys_a, keys_b = set(a.ids.tolist()), set(b.ids.tolist())
        overlap.append(len(keys_a & keys_b) / max(1, len(keys_a | keys_b)))
        shared = {k: w for k, w in zip(a.ids.tolist(), a.weights.tolist()) if k in keys_b}
        other = dict(zip(b.ids.tolist(), b.weights.tolist()))
        assert all(abs(w - other[k]) <= 0.1 for k, w in shared.items())  # measured max 0.05, as torch's bf16 autocast
    assert np.mean(overlap) > 0.9
    with pytest.raises(OnnxBackendError, match="needs --encoder-runtime openvino"):
        compile_body(f32.onnx_path, "onnx", 1, "bf16")


def test_index_cli_openvino_bf16_reaches_the_body(tmp_path, splade_tiny_dir, small_corpus):
    """`lsr-os index --encoder-runtime openvino --precision bf16`: the job hands the precision to the compiled
    body (summary: body_precision), and an ONNX Runtime body refuses fp16 with a clear message."""
    ov = pytest.importorskip("openvino")
    from click.testing import CliRunner

    from opensearch_lsr.cli import cli

    model = shutil.copytree(splade_tiny_dir, tmp_path / "model", ignore=shutil.ignore_patterns("onnx-lsr"))

    def index(out, *extra):
        return CliRunner().invoke(cli, ["index", "--corpus", str(small_corpus), "--model", str(model),
                                        "--backend", "ndjson", "--index", str(tmp_path / out), "--threads", "1",
                                        "--no-progress", *extra])

    done = index("bf16", "--encoder-runtime", "openvino", "--precision", "bf16")
    assert done.exit_code == 0, done.output
    summary = json.loads(done.output[done.output.index("{"):])
    expected = "bf16" if "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES") else "f32"
    assert summary["indexed"] == 40 and summary["encoder"]["body_precision"] == expected
    assert (model / "onnx-lsr" / "openvino" / "model.onnx").exists()  # the f32 export, compiled at bf16
    refused = index("fp16", "--encoder-runtime", "onnx", "--precision", "fp16")
    assert refused.exit_code != 0 and "fp32 or bf16" in refused.output
