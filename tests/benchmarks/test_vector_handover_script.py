"""``benchmarks/vector_handover.py``: the list and the flat hand-over of a corpus's vectors to chunks."""
from __future__ import annotations

import numpy as np


def test_both_hand_overs_give_every_chunk_its_vectors(load_script, tmp_path):
    module = load_script("vector_handover")
    data = module.batches(docs=300, window=128, batch_tokens=2048, chunk=50, seed=3)
    keys = np.concatenate([k for k, _ in data])
    assert sorted(map(tuple, keys.tolist())) == [(d // 50, d % 50) for d in range(300)]  # each document once
    total = sum(len(flat[0]) for _, flat in data)
    assert module.by_list(data, 50, 300) == module.by_flat(data, 50, 300) == module.by_csr(data, 50, 300) == total
    payload = module.main(["--docs", "300", "--window", "128", "--batch-tokens", "2048", "--chunk", "50",
                           "--repeat", "1", "--md", str(tmp_path / "h.md")])
    assert payload["ids_handed"] > 0 and payload["speedup"] > 0
    assert "| flat |" in (tmp_path / "h.md").read_text() and payload["csr_speedup"] > 0

