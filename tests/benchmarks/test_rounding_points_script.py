"""``benchmarks/rounding_points.py``: the packed forward in fp32 with chosen tensors rounded to bf16 / fp16."""
from __future__ import annotations

import json

import numpy as np
import torch


def test_the_emulated_forward_with_nothing_rounded_is_the_packed_fp32_forward(splade_tiny_dir, load_script):
    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
    from opensearch_lsr.encoding.packed import Segments

    module = load_script("rounding_points")
    enc = SparseDocumentEncoder(splade_tiny_dir, device="cpu", precision="fp32", batching="packed", compile=False)
    lengths = np.array([7, 30, 3, 12])
    ids = torch.randint(1000, 20000, (int(lengths.sum()),))
    seg = Segments.from_lengths(lengths, torch.device("cpu"))
    with torch.no_grad():
        expected = enc.runner.model.pooled_max(ids, seg)
        same = module.emulated(enc.runner.model, enc.model, {}).pooled_max(ids, seg)
        rounded = module.emulated(enc.runner.model, enc.model, {"head": torch.bfloat16}).pooled_max(ids, seg)
    assert torch.allclose(same, expected, rtol=1e-5, atol=1e-5)  # logits of about 10: fp32's sums, in another order
    assert (rounded - expected).abs().max().item() > 1e-3  # a rounding point changes the logits


def test_rounding_points_measure_each_setting_against_fp32(shared_data, splade_tiny_dir, tmp_path, load_script):
    module = load_script("rounding_points")
    out = tmp_path / "r.json"
    settings = ["bf16 everywhere", "fp16 everywhere", "only attention bf16"]
    result = module.main(["--model", str(splade_tiny_dir), "--data", str(shared_data), "--limit", "3",
                          "--settings", *settings, "--out", str(out)])
    assert json.loads(out.read_text())["run"]["commit"] and "| only attention bf16 |" in out.with_suffix(".md").read_text()
    rows = result["rows"]
    assert list(rows) == settings and result["docs"] == 3
    assert rows["bf16 everywhere"]["rounded"] == dict.fromkeys(module.POINTS, "bfloat16")
    # fp16 has three more significant bits; attention alone is a small part of bf16's distance
    assert rows["fp16 everywhere"]["max_abs_dw"] < rows["bf16 everywhere"]["max_abs_dw"] / 3
    assert rows["only attention bf16"]["max_abs_dw"] < rows["bf16 everywhere"]["max_abs_dw"]
    english = module.main(["--model", str(splade_tiny_dir), "--data", str(shared_data), "--limit", "2",
                           "--dataset", "msmarco-en", "--settings", "fp16 everywhere"])
    assert english["dataset"] == "msmarco-en" and english["docs"] == 2 and "msmarco-en" in module.markdown(english)


def test_rounding_points_report_each_settings_dev_mrr_beside_fp32s(shared_data, splade_tiny_dir, load_script):
    """``--mrr``'s part: the documents retrieved for queries judged on them, in fp32 and in each setting."""
    module = load_script("rounding_points")
    with open(shared_data / "msmarco-ko" / "corpus.jsonl", encoding="utf-8") as fh:
        texts = [json.loads(next(fh))["text"] for _ in range(5)]
    # each passage is the query that finds itself (dot products, not cosines: a longer passage can come first)
    dev = (["q0", "q1", "q2"], texts[:3], [f"d{i}" for i in range(5)], {f"q{i}": {f"d{i}"} for i in range(3)})
    result = module.measure(str(splade_tiny_dir), texts, ["bf16 everywhere"], dev)
    assert result["queries"] == 3 and 0.5 < result["fp32_mrr_at_10"] <= 1.0  # chance among 5: about 0.46
    assert 0 < result["rows"]["bf16 everywhere"]["mrr_at_10"] <= 1.0
    assert "dev MRR@10" in module.markdown({"model": "m", **result})
