"""``benchmarks/tokenizer_scaling.py`` runs both ways (in process, through ``TokenizerProcess``) on CPU."""
from __future__ import annotations

import json


def test_tokenizer_scaling_measures_both_paths_on_the_same_tokens(shared_data, splade_tiny_dir, tmp_path, load_script):
    module = load_script("tokenizer_scaling")
    out = tmp_path / "r.json"
    module.main(["--model", str(splade_tiny_dir), "--corpus", str(shared_data / "msmarco-ko" / "corpus.jsonl"),
                 "--threads", "1", "2", "--processes", "2", "--limit", "40", "--repeat", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    row, two = result["rows"]
    assert two["processes_2"] > 0 and two["processes_2_tokens"] == row["in_process_tokens"]  # split and joined
    assert "processes_2" not in row  # one thread cannot be spread over two processes
    assert row["threads"] == 1 and row["in_process"] > 0 and row["process"] > 0 and row["in_process_x"] == 1.0
    assert row["in_process_tokens"] == row["process_tokens"] > 40  # the same ids both ways
    assert result["cores"]["os_cpu_count"] >= 1 and result["run"]["commit"]
