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


def test_an_actor_takes_two_blocks_at_once_and_writes_what_it_writes_one_at_a_time(tiny_source_dir, tmp_path):
    """Ray Data runs two calls of an actor at once: with packed batching they share one device pipeline, each
    thread writes with a writer of its own, and the files are those of one block at a time (padded batching)."""
    import json
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from opensearch_lsr.encoding.ray_workers import BlockEncoder, NdjsonBlockWriter

    def batch(block):
        texts = [f"house cat dog {block} {i} " * (1 + i % 5) for i in range(10)]
        texts[block % 10] = "river bank " * 400  # one text over the cap per block
        return {"block": np.full(10, block), "doc_id": np.array([f"b{block}d{i}" for i in range(10)], dtype=object),
                "text": np.array(texts, dtype=object), "source": np.array([f"c.jsonl:{i}" for i in range(10)], dtype=object),
                "position": np.arange(10 * block, 10 * block + 10)}

    made = []

    def writer_in(directory):
        def factory():
            made.append(threading.get_ident())
            return NdjsonBlockWriter(directory, "idx")
        return factory

    kwargs = {"device": "cpu", "precision": "fp32"}
    two = BlockEncoder(str(tiny_source_dir), encoder_kwargs={**kwargs, "batching": "packed"}, builder_kwargs={},
                       writer_factory=writer_in(tmp_path / "two"))
    one = BlockEncoder(str(tiny_source_dir), encoder_kwargs={**kwargs, "batching": "padded"}, builder_kwargs={},
                       writer_factory=writer_in(tmp_path / "one"))
    assert two.pipeline is not None and one.pipeline is None
    with ThreadPoolExecutor(2) as calls:
        rows = list(calls.map(two, [batch(b) for b in range(6)]))
    want = [one(batch(b)) for b in range(6)]
    assert len(made) == len(set(made)) >= 2  # one writer per calling thread (the pool's, then the test's own)
    for got, ref in zip(rows, want):
        assert got["indexed"].tolist() == ref["indexed"].tolist() == [10]
        assert got["truncated"].tolist() == ref["truncated"].tolist() == [1]
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "two").iterdir()) and len(names) == 6
    for name in names:
        a = [json.loads(line) for line in (tmp_path / "two" / name).read_text().splitlines()]
        b = [json.loads(line) for line in (tmp_path / "one" / name).read_text().splitlines()]
        assert [x.get("index") for x in a[::2]] == [x.get("index") for x in b[::2]]
        for x, y in zip(a[1::2], b[1::2]):
            assert x["sparse_embedding"].keys() == y["sparse_embedding"].keys()
