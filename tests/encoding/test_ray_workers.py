"""What the Ray actors run on each block, without Ray: the 512-token policy and the documents."""
from __future__ import annotations

import pytest

from opensearch_lsr.encoding.documents import DocumentBuilder
from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
from opensearch_lsr.encoding.ray_workers import encode_records


def test_a_packed_actor_tokenizes_a_block_once_for_the_count_and_the_encode(tiny_source_dir, monkeypatch):
    records = [(f"d{i}", f"house cat dog {i} " * (1 + i % 7)) for i in range(20)]
    records[3] = ("d3", "river bank " * 400)  # over the cap: truncated, and counted so
    padded = SparseDocumentEncoder(tiny_source_dir, device="cpu", precision="fp32", batching="padded")
    packed = SparseDocumentEncoder(tiny_source_dir, device="cpu", precision="fp32", batching="packed")

    def second_tokenization(texts):
        raise AssertionError("the block was tokenized a second time to count its tokens")

    monkeypatch.setattr(packed, "count_tokens", second_tokenization)
    want, want_counts = encode_records(padded, DocumentBuilder(padded.keys), records, "truncate")
    got, counts = encode_records(packed, DocumentBuilder(packed.keys), records, "truncate")
    assert counts == want_counts and counts["truncated"] == 1
    assert [a["_id"] for a in got] == [a["_id"] for a in want]
    for a, b in zip(got, want):
        sa, sb = a["_source"]["sparse_embedding"], b["_source"]["sparse_embedding"]
        assert sa.keys() == sb.keys() and all(sa[k] == pytest.approx(sb[k], abs=1e-5) for k in sa)
    # split: the same count finds the text to cut into passages
    split, split_counts = encode_records(packed, DocumentBuilder(packed.keys), records, "split")
    packed.close()
    assert split_counts["split_docs"] == 1 and split_counts["passages"] > len(records)
    assert [a["_id"] for a in split] == [a["_id"] for a in want]
