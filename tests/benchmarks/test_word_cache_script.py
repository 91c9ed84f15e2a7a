"""``benchmarks/word_cache.py``: both tokenizers, both passes, the Heaps fit, on a slice of the corpus."""
from __future__ import annotations

import json


def test_word_cache_benchmark_measures_both_passes(shared_data, splade_tiny_dir, tmp_path, load_script):
    module = load_script("word_cache")
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    module.main(["--models", "kobigbird", str(splade_tiny_dir), "--limit", "300", "--window", "100",
                 "--out", str(out), "--md", str(md)])
    result = json.loads(out.read_text())
    assert result["docs"] == 300 and result["run"]["commit"]
    for r in result["models"].values():
        first, last_quarter, replay = r["passes"]
        assert first["docs"] == replay["docs"] == 300 and last_quarter["docs"] == 100
        assert 0 < first["hit_share"] < 1 and replay["hit_share"] == 1.0  # the second pass is all remembered
        assert first["rust_docs_per_s"] > 0 and replay["cached_docs_per_s"] > 0
        assert 0 < r["chunks_remembered"] < 300 * 60 and r["bytes_per_chunk"] > 50
    kobigbird = result["models"]["kobigbird"]
    assert r["tokens_per_doc"] > kobigbird["tokens_per_doc"]  # SPLADE-tiny splits Hangul to jamo
    assert r["on_by_default"] and not kobigbird["on_by_default"] and r["ids_per_chunk"] > 4 > kobigbird["ids_per_chunk"]
    heaps = result["heaps"]
    projected = heaps["projected"]
    assert 0.3 < heaps["beta"] < 1 and projected["1e+06"]["hit_share"] > projected["1e+05"]["hit_share"]
    assert "second (replay)" in md.read_text()


def test_word_cache_benchmark_through_tokenizer_processes(splade_tiny_dir, tmp_path, load_script):
    module = load_script("word_cache")
    result = module.main(["--models", str(splade_tiny_dir), "--limit", "120", "--window", "40", "--threads", "2",
                          "--processes", "2"])
    rows = [p for p in result["models"][str(splade_tiny_dir)]["passes"] if "processes" in p["pass"]]
    assert [p["pass"] for p in rows] == [f"{name}, 2 processes x 2 threads" for name in ("first (filling)",
                                                                                        "second (replay)")]
    assert all(p["docs"] == 120 and p["rust_docs_per_s"] > 0 and p["cached_docs_per_s"] > 0 for p in rows)
