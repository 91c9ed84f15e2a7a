"""``benchmarks/cpu_batching.py``: both batchings take turns on every block, and its CPU run reports equal vectors."""
from __future__ import annotations

import json


class _Recorder:
    def __init__(self, name: str, calls: list) -> None:
        self.name, self.calls = name, calls

    def encode(self, texts: list[str]) -> list[str]:
        self.calls.append((self.name, texts[0]))
        return [f"{self.name}:{t}" for t in texts]


def test_every_block_by_both_in_alternating_order(load_script):
    module = load_script("cpu_batching")
    calls: list = []
    encoders = {"padded": _Recorder("padded", calls), "packed": _Recorder("packed", calls)}
    turns = module.take_turns(encoders, [f"t{i}" for i in range(5)], block=2, rounds=2)
    assert calls == [("padded", "t0"), ("packed", "t0"), ("packed", "t2"), ("padded", "t2"), ("padded", "t4"),
                     ("packed", "t4"),  # round 2 starts the other way round
                     ("packed", "t0"), ("padded", "t0"), ("padded", "t2"), ("packed", "t2"), ("packed", "t4"),
                     ("padded", "t4")]
    assert turns["first_round"]["packed"] == [f"packed:t{i}" for i in range(5)]  # the first round only, in order
    assert [len(s) for s in turns["seconds"].values()] == [2, 2]


def test_runs_on_cpu_and_both_paths_give_the_same_vectors(shared_data, splade_tiny_dir, tmp_path, load_script):
    module = load_script("cpu_batching")
    out = tmp_path / "r.json"
    module.main(["--models", str(splade_tiny_dir), "--data", str(shared_data), "--limit", "24", "--block", "8",
                 "--rounds", "2", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["docs"] == 24 and row["packed_batching"] == "packed" and len(row["per_round"]) == 2
    assert row["padded_docs_per_s"] > 0 and row["packed_docs_per_s"] > 0
    assert row["exactness"]["identical_id_sets"] == 24 and row["exactness"]["max_abs_dw"] <= 1e-5
    assert "packed / padded" in out.with_suffix(".md").read_text()
