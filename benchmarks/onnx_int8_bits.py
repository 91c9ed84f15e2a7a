"""``--encoder-runtime onnx-int8`` with 8-bit and with 7-bit weights, against the fp32 torch encoder, on this CPU.

ONNX Runtime's u8 x s8 kernels on x86 without VNNI / AMX add pairs of products in 16 bits (``VPMADDUBSW``), which
can saturate; ``quantize_dynamic(reduce_range=True)`` keeps the weights to 7 bits so that they cannot (ONNX
Runtime's quantization guide, "When and why do I need to try U8U8?"). This measures what each choice does to the
vectors here (active-set Jaccard to fp32, max |dw| over shared ids) and its speed; ``u8u8`` (unsigned weights) is
the guide's other remedy. The toolkit picks 7 bits where :func:`~opensearch_lsr.encoding.onnx_backend.int8_weight_bits`
says so.

    python benchmarks/onnx_int8_bits.py --limit 300 --out benchmarks/results/onnx_int8_bits
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from harness import markdown_table, write_results  # noqa: E402 - benchmarks/harness.py: results files
from opensearch_lsr.encoding.encoder import SparseDocumentEncoder  # noqa: E402
from opensearch_lsr.encoding.onnx_backend import OnnxSparseDocumentEncoder, int8_weight_bits  # noqa: E402
from opensearch_lsr.resources import shared_data_dir, splade_tiny_path  # noqa: E402

__all__ = ["SETTINGS", "distance", "main"]

#: ``quantize_dynamic`` options of each setting, on top of the toolkit's own (QInt8 weights, per channel)
SETTINGS = {"8-bit weights (u8 x s8)": {"reduce_range": False}, "7-bit weights (reduce_range)": {"reduce_range": True},
            "u8 weights (u8 x u8)": {"reduce_range": False, "weight_type": "QUInt8"}}


def distance(ref: list, got: list) -> dict:
    """Mean / min active-set Jaccard and the largest weight difference over shared ids."""
    jacc, dw = [], 0.0
    for a, b in zip(ref, got):
        ids_a, ids_b = set(a.ids.tolist()), set(b.ids.tolist())
        jacc.append(len(ids_a & ids_b) / max(1, len(ids_a | ids_b)))
        shared, ia, ib = np.intersect1d(a.ids, b.ids, return_indices=True)
        if len(shared):
            dw = max(dw, float(np.abs(a.weights[ia] - b.weights[ib]).max()))
    return {"jaccard_mean": float(np.mean(jacc)), "jaccard_min": float(min(jacc)), "max_abs_dw_shared": dw}


def _encode_with(model: str, texts: list[str], options: dict, threads: int) -> tuple[list, float]:
    from onnxruntime import quantization

    real = quantization.quantize_dynamic
    opts = {k: getattr(quantization.QuantType, v) if k == "weight_type" else v for k, v in options.items()}

    def quantize(model_input, model_output, **kwargs):
        return real(model_input, model_output, **{**kwargs, **opts})

    with mock.patch.object(quantization, "quantize_dynamic", quantize), tempfile.TemporaryDirectory() as cache:
        enc = OnnxSparseDocumentEncoder(model, runtime="onnx-int8", cache_dir=cache, num_threads=threads)
        enc.encode(texts[:16])
        t0 = time.perf_counter()
        vectors = enc.encode(texts)
        return vectors, len(texts) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="Model dir [default: SPLADE-tiny].")
    p.add_argument("--corpus", default=None, help="JSONL corpus [default: the shared msmarco-ko corpus].")
    p.add_argument("--limit", type=int, default=300, help="Passages.")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="Results stem (writes .json and .md).")
    args = p.parse_args(argv)
    model = args.model or str(splade_tiny_path())
    corpus = Path(args.corpus) if args.corpus else shared_data_dir() / "msmarco-ko" / "corpus.jsonl"
    with corpus.open(encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line, _ in zip(fh, range(args.limit))]
    ref = SparseDocumentEncoder(model, device="cpu").encode(texts)
    rows = {}
    for name, options in SETTINGS.items():
        got, rate = _encode_with(model, texts, options, args.threads)
        rows[name] = {**distance(ref, got), "docs_per_s": round(rate, 1)}
    result = {"model": model, "passages": len(texts), "toolkit_weight_bits_here": int8_weight_bits(), "rows": rows}
    table = markdown_table(["int8 setting", "Jaccard to fp32 (mean)", "min", "max abs dw (shared ids)", "docs/s"],
                           [[k, r["jaccard_mean"], r["jaccard_min"], r["max_abs_dw_shared"], r["docs_per_s"]]
                            for k, r in rows.items()], floats=".4f")
    md = (f"# onnx-int8: 8-bit against 7-bit weights on this CPU\n\n{len(texts)} passages, model `{model}`; the "
          f"toolkit uses {int8_weight_bits()}-bit weights here.\n\n{table}")
    print(md)
    if args.out:
        write_results(args.out, result, md)
    return result


if __name__ == "__main__":
    main()
