"""``benchmarks/gc_pauses.py``: both settings, their pauses, and what a full collection walks in each."""
from __future__ import annotations

import json


def test_gc_pauses_benchmark_compares_the_frozen_heap_with_the_plain_one(shared_data, splade_tiny_dir, tmp_path,
                                                                         load_script):
    module = load_script("gc_pauses")
    out = tmp_path / "r.json"
    result = module.main(["--model", str(splade_tiny_dir), "--data", str(shared_data), "--limit", "200",
                          "--repeat", "1", "--passes", "1", "--survivors", "1000", "--out", str(out)])
    assert json.loads(out.read_text())["run"]["commit"] and "| frozen |" in out.with_suffix(".md").read_text()
    frozen, plain = result["summary"]["frozen"], result["summary"]["not frozen"]
    assert frozen["passes"] == plain["passes"] == 1 and frozen["docs_per_s_median"] > 0 < plain["docs_per_s_median"]
    # with the heap frozen a full collection walks almost nothing; without, everything torch and the model left
    assert frozen["full_collection_now"]["objects_walked"] < 1000
    assert plain["full_collection_now"]["objects_walked"] > 100_000
    assert result["survivors_per_pass"] == 1000 and len(result["passes"]["frozen"]) == 1
