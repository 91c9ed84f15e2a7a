"""benchmarks/onnx_int8_bits.py: each int8 setting's distance to fp32, on a few passages."""
from __future__ import annotations

import numpy as np
import pytest

from opensearch_lsr.encoding.sparse_vector import SparseVector

pytest.importorskip("onnxruntime")


def test_distance_reads_the_active_sets_and_the_shared_weights(load_script):
    bits = load_script("onnx_int8_bits")
    ref = [SparseVector(np.array([1, 4, 9]), np.array([0.5, 1.0, 2.0], np.float32))]
    got = [SparseVector(np.array([1, 9, 12]), np.array([0.75, 2.0, 0.1], np.float32))]
    d = bits.distance(ref, got)
    assert d["jaccard_mean"] == d["jaccard_min"] == 0.5 and d["max_abs_dw_shared"] == 0.25


def test_every_setting_is_measured_and_the_results_say_what_the_toolkit_uses_here(load_script, splade_tiny_dir,
                                                                                 tmp_path):
    bits = load_script("onnx_int8_bits")
    out = bits.main(["--model", str(splade_tiny_dir), "--limit", "6", "--threads", "1", "--out", str(tmp_path / "r")])
    assert set(out["rows"]) == set(bits.SETTINGS) and out["passages"] == 6
    for row in out["rows"].values():
        assert 0.0 < row["jaccard_min"] <= row["jaccard_mean"] <= 1.0 and row["docs_per_s"] > 0
    assert out["toolkit_weight_bits_here"] in (7, 8)
    assert (tmp_path / "r.json").exists() and "7-bit weights" in (tmp_path / "r.md").read_text()
