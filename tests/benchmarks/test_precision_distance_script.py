"""``benchmarks/precision_distance.py``: bf16 and fp16 packed vectors against fp32 on a few Korean passages."""
from __future__ import annotations

import json

import pytest


@pytest.mark.slow  # 22 s on 2 cores: bf16 and fp16 matmuls are emulated on this CPU
def test_precision_distance_measures_bf16_an_fp16_head_and_fp16_against_fp32(shared_data, splade_tiny_dir, tmp_path, load_script):
    module = load_script("precision_distance")
    out = tmp_path / "r.json"
    result = module.main(["--model", str(splade_tiny_dir), "--data", str(shared_data), "--limit", "1",
                          "--out", str(out)])
    assert json.loads(out.read_text())["run"]["commit"] and "| fp16 |" in out.with_suffix(".md").read_text()
    assert "largest weight one side lacks" in out.with_suffix(".md").read_text()
    assert "within 0.01 of zero" in out.with_suffix(".md").read_text() and result["fp32_logits_near_zero_per_doc"] >= 0
    rows = result["rows"]
    assert list(rows) == ["fp32", "bf16", "bf16-fp16-head", "fp16"] and result["docs"] == 1
    assert all(r["nonfinite_dropped"] == 0 and r["mean_nonzeros"] > 20 for r in rows.values())
    bf16, mixed, fp16 = (rows[k]["vs_fp32"] for k in ("bf16", "bf16-fp16-head", "fp16"))
    assert 0.9 < bf16["jaccard_mean"] < 1 and bf16["max_abs_dw"] < 0.1
    # three more significant bits: an eighth of bf16's rounding, so the weights and the active sets move less
    assert fp16["max_abs_dw"] < bf16["max_abs_dw"] / 3 and fp16["jaccard_mean"] > bf16["jaccard_mean"]
    # the head's share of it: an fp16 head beside the bf16 body lands in between (about a third of bf16's |dw| here)
    assert fp16["max_abs_dw"] < mixed["max_abs_dw"] < bf16["max_abs_dw"] / 1.5
    assert mixed["jaccard_mean"] >= bf16["jaccard_mean"]
