"""Probe: the BERT-base transformer body (no MLM head) in torch, ONNX Runtime (our fused export) and OpenVINO.

Why: sentence-transformers' OpenVINO backend was the fastest of its CPU backends at BERT-base size
(`benchmarks/results/scale/cpu_encoders.md`), but its default CPU precision on AVX512-BF16 machines is bf16
(not equal output). This asks whether OpenVINO at f32 (equal output) beats the ONNX Runtime body that
`lsr-os index --encoder-runtime onnx` runs. Same random batch (32 x 200 tokens, half of it padded to 100),
1 thread, warm-up then the median of 3 runs; ratios against torch fp32 measured in the same run.

Runs in the side venv of `cpu_encoders.py` (openvino next to the same torch):
    runs/venv-st-backends/bin/python benchmarks/openvino_body_probe.py \
        --model runs/cpu_encoders/models/bert-base-random \
        --onnx runs/cpu_encoders/bert-base-random/onnx-lsr/onnx/model.onnx [--out STEM]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from harness import describe, markdown_table, run_info, set_threads, time_call, write_results


def _median_s(fn) -> float:
    """Warm-up, then the median of 3 timed runs."""
    return time_call(fn, repeats=3, warmup=1).median


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="masked-LM directory (BERT)")
    ap.add_argument("--onnx", required=True, help="our fused ONNX body (onnx-lsr/onnx/model.onnx)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=200)
    ap.add_argument("--out", default=None, help="Also write STEM.json and STEM.md with the run's facts.")
    args = ap.parse_args()
    info = run_info()
    import onnxruntime as ort
    import openvino as ov
    from transformers import AutoModelForMaskedLM

    set_threads(1)
    body = AutoModelForMaskedLM.from_pretrained(args.model).eval().base_model

    class Body(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = body

        def forward(self, input_ids, attention_mask):
            return self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, (args.batch, args.length)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[args.batch // 2:, args.length // 2:] = 0
    valid = mask.astype(bool)
    module = Body().eval()
    with torch.inference_mode():
        ref = module(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        rows = [("torch fp32", _median_s(lambda: module(torch.from_numpy(ids), torch.from_numpy(mask))), 0.0)]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(args.onnx, opts, providers=["CPUExecutionProvider"])
    feed = {"input_ids": ids, "attention_mask": mask}
    diff = float(np.abs(sess.run(None, feed)[0] - ref)[valid].max())
    rows.append(("ONNX Runtime, fused fp32 (ours-onnx body)", _median_s(lambda: sess.run(None, feed)), diff))
    converted = ov.convert_model(module, example_input=(torch.from_numpy(ids), torch.from_numpy(mask)))
    for hint in ("f32", "bf16"):
        compiled = ov.Core().compile_model(converted, "CPU", {"INFERENCE_PRECISION_HINT": hint,
                                                              "INFERENCE_NUM_THREADS": 1, "PERFORMANCE_HINT": "LATENCY"})
        diff = float(np.abs(compiled([ids, mask])[0] - ref)[valid].max())
        rows.append((f"OpenVINO {ov.__version__.split('-')[0]}, {hint}", _median_s(lambda: compiled([ids, mask])), diff))
    base = rows[0][1]
    table = markdown_table(["body", "s per batch", "x torch fp32", "max abs diff vs torch (valid tokens)"],
                           [[name, f"{secs:.2f}", f"{base / secs:.2f}", f"{d:.1e}"] for name, secs, d in rows])
    print(f"{info['date']}, commit {info['commit']}; {describe(info['machine'])}; batch {args.batch} x "
          f"{args.length}, 1 thread, median of 3")
    print(table)
    if args.out:
        write_results(args.out, {"batch": args.batch, "length": args.length,
                                 "rows": [{"body": n, "seconds": t, "max_abs_diff": d} for n, t, d in rows]},
                      f"Batch {args.batch} x {args.length}, 1 thread, median of 3.\n\n{table}", info)


if __name__ == "__main__":
    main()
