"""Local index at scale: memory that does not grow with the index, merges that change no result,
memory-mapped segments, exact liveness under hash collisions, format-1 upgrade."""
from __future__ import annotations

import io
import json
import tracemalloc

import numpy as np
import pytest

import opensearch_lsr.local.merge as merge_mod
import opensearch_lsr.local.storage as storage_mod
from opensearch_lsr.contract import truncate_feature_values
from opensearch_lsr.local.index import LocalIndex

MAPPINGS = {"properties": {"emb": {"type": "rank_features"}, "lang": {"type": "keyword"}}}


def batch(start: int, n: int, seed: int, vocab: int = 400, terms: int = 30) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(start, start + n):
        toks = rng.choice(vocab, size=terms, replace=False)
        out.append({"_id": f"d{i}", "_source": {"emb": {f"t{t}": float(w) for t, w in
                                                         zip(toks, rng.lognormal(-0.5, 0.8, terms))},
                                                "lang": "ko" if i % 3 else "en"}})
    return out


def queries(n: int = 12, seed: int = 5) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"query": {"neural_sparse": {"emb": {"query_tokens": {f"t{t}": float(rng.uniform(0.1, 3)) for t in
                                                                  rng.choice(420, size=8, replace=False)}}}},
             "size": 50, "track_total_hits": True} for _ in range(n)]


def results(idx: LocalIndex) -> list:
    out = [[(h["_id"], h["_score"]) for h in idx.search(q)["hits"]["hits"]] + [idx.search(q)["hits"]["total"]]
           for q in queries()]
    hits = idx.search({"query": {"bool": {"filter": [{"term": {"lang": "en"}}], "must": [queries(1)[0]["query"]]}},
                       "size": 20})["hits"]["hits"]
    out.append([(h["_id"], h["_score"], h["_source"]) for h in hits])
    out.append([h["_id"] for h in idx.search({"query": {"match_all": {}}, "size": 10_000, "_source": False})
                ["hits"]["hits"]])
    return out


def write_history(idx: LocalIndex) -> None:
    """Batches with overwrites (moved to their new position) and deletions spread over segments."""
    for b in range(12):
        idx.bulk(batch(b * 60, 60, seed=b))
        if b % 3 == 2:
            idx.bulk(batch(b * 60 - 100, 30, seed=100 + b))  # overwrite 30 earlier documents
            idx.bulk([{"_op_type": "delete", "_id": f"d{b * 60 - 10 + k}"} for k in range(5)]
                     + [{"_op_type": "delete", "_id": "never-indexed"}])


def test_merges_change_no_result(tmp_path, monkeypatch):
    monkeypatch.setattr(merge_mod, "MERGE_FACTOR", 1_000)  # reference: no merge at all
    ref = LocalIndex.create(tmp_path / "ref", MAPPINGS)
    write_history(ref)
    assert len(json.loads((tmp_path / "ref" / "manifest.json").read_text())["segments"]) == 20
    expected = results(ref)

    monkeypatch.setattr(merge_mod, "MERGE_FACTOR", 3)  # tail merges, carried deletions
    monkeypatch.setattr(merge_mod, "MIN_MERGE_DOCS", 50)
    idx = LocalIndex.create(tmp_path / "idx", MAPPINGS)
    write_history(idx)
    segs = json.loads((tmp_path / "idx" / "manifest.json").read_text())["segments"]
    assert 1 < len(segs) < 20
    assert results(idx) == expected
    assert idx.count() == ref.count() == 12 * 60 - 4 * 5
    assert idx.get("d5") == ref.get("d5") and idx.get("d110") is None
    idx.force_merge()
    assert len(json.loads((tmp_path / "idx" / "manifest.json").read_text())["segments"]) == 1
    assert results(LocalIndex.open(tmp_path / "idx")) == expected
    body = dict(queries(1)[0], explain=True, size=3)
    assert ([(h["_id"], h["_explanation"]) for h in idx.search(body)["hits"]["hits"]]
            == [(h["_id"], h["_explanation"]) for h in ref.search(body)["hits"]["hits"]])


def test_bulk_memory_does_not_grow_with_the_index(tmp_path, monkeypatch):
    """What one bulk allocates at its peak is the same at 1k and at 5k documents, and what stays
    allocated between bulks is per-segment metadata (feature names), not per document. The format-1
    index kept every id in a set and the whole view in memory: ~4 MB here (3 float32 CSR copies of
    156k postings), growing with every bulk."""
    monkeypatch.setattr(merge_mod, "MIN_MERGE_DOCS", 100)
    idx = LocalIndex.create(tmp_path / "idx", MAPPINGS)
    tracemalloc.start()
    try:
        peaks, current = [], []
        for b in range(26):
            docs = batch(b * 200, 200, seed=b)
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            idx.bulk(docs)
            del docs
            now, peak = tracemalloc.get_traced_memory()
            peaks.append(peak - before)
            current.append(now)
    finally:
        tracemalloc.stop()
    # peak of one bulk: the batch and, on merging bulks, chunks of the run; never the whole index
    assert max(peaks[15:]) < 2.0 * max(peaks[3:10]), (peaks[3:10], peaks[15:])
    assert current[-1] - current[9] < 1 << 20, (current[9], current[-1])


def test_merge_memory_is_a_fraction_of_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(merge_mod, "MERGE_FACTOR", 1_000)
    monkeypatch.setattr(merge_mod, "_CHUNK_ROWS", 256)
    monkeypatch.setattr(merge_mod, "_FLUSH_POSTINGS", 1 << 14)
    idx = LocalIndex.create(tmp_path / "idx", MAPPINGS)
    for b in range(10):
        idx.bulk(batch(b * 600, 600, seed=b, vocab=2000, terms=60))
    expected = results(idx)[:-1]
    postings_bytes = 10 * 600 * 60 * (4 + 4 + 4 + 2)  # cols, vals, docs, codes
    tracemalloc.start()
    try:
        idx.force_merge()
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.3 * postings_bytes, (peak, postings_bytes)  # per-document arrays (~150 B), no postings
    assert results(idx)[:-1] == expected


def test_segments_are_memory_mapped_and_codes_are_lucene_values(tmp_path):
    idx = LocalIndex.create(tmp_path / "idx", MAPPINGS)
    idx.bulk(batch(0, 50, seed=1))
    view = idx._get_view()
    fp = view.segments[0].field("emb")
    assert isinstance(fp.docs.base, np.memmap) and isinstance(fp.codes.base, np.memmap)
    assert fp.docs.dtype == np.int32 and fp.codes.dtype == np.uint16
    vals = np.asarray(fp.vals)
    assert np.array_equal(storage_mod.DECODE[storage_mod.encode_codes(vals)], truncate_feature_values(vals))


def test_liveness_is_exact_when_all_id_hashes_collide(tmp_path, monkeypatch):
    monkeypatch.setattr(storage_mod, "id_hashes", lambda ids: np.full(len(ids), 7, dtype=np.uint64))
    import opensearch_lsr.local.view as view_mod
    monkeypatch.setattr(view_mod, "id_hashes", storage_mod.id_hashes)
    idx = LocalIndex.create(tmp_path / "idx", MAPPINGS)
    r = idx.bulk([{"_id": i, "_source": {"emb": {"x": 1.0 + k}}} for k, i in enumerate("abc")])
    assert [it["index"]["status"] for it in r["items"]] == [201, 201, 201]
    r = idx.bulk([{"_id": "b", "_source": {"emb": {"x": 9.0}}}, {"_op_type": "delete", "_id": "a"},
                  {"_op_type": "delete", "_id": "zz"}])
    assert [next(iter(it.values()))["status"] for it in r["items"]] == [200, 200, 404]
    assert idx.count() == 2 and idx.get("a") is None and idx.get("b") == {"emb": {"x": 9.0}}
    hits = idx.search({"query": {"neural_sparse": {"emb": {"query_tokens": {"x": 1.0}}}}})["hits"]["hits"]
    assert [h["_id"] for h in hits] == ["b", "c"]
    idx.force_merge()
    assert [h["_id"] for h in idx.search({"query": {"match_all": {}}})["hits"]["hits"]] == ["c", "b"]


def test_format_1_index_is_upgraded_on_open(tmp_path):
    """An index written before memory-mapped segments (one .npz per segment) opens and answers."""
    root = tmp_path / "old"
    root.mkdir()
    ids, terms = ["a", "b"], ["x", "y"]
    buf = io.BytesIO()
    np.savez(buf, ids=np.array(ids), deleted=np.zeros(0, dtype="U1"),
             source_offsets=np.array([0, 2, 4], np.int64), sources=np.frombuffer(b"{}{}", np.uint8),
             fields=np.array(["emb"]), f0_indptr=np.array([0, 1, 3], np.int64), f0_indices=np.array([0, 0, 1], np.int32),
             f0_data=np.array([1.5, 2.0, 0.7], np.float32),
             f0_terms=np.frombuffer(json.dumps(terms).encode(), np.uint8))
    (root / "seg-000001.npz").write_bytes(buf.getvalue())
    (root / "manifest.json").write_text(json.dumps({"format": 1, "name": "old", "mappings": MAPPINGS, "settings": {},
                                                    "segments": ["seg-000001.npz"], "next_segment": 2,
                                                    "models": {}, "analyzers": {}}))
    idx = LocalIndex.open(root)
    assert json.loads((root / "manifest.json").read_text())["format"] == storage_mod.FORMAT_VERSION
    assert not (root / "seg-000001.npz").exists()
    assert idx.get("b") == {"emb": {"x": 2.0, "y": 0.7}}
    hits = idx.search({"query": {"neural_sparse": {"emb": {"query_tokens": {"x": 1.0}}}}})["hits"]["hits"]
    assert [(h["_id"], h["_score"]) for h in hits] == [("b", 2.0), ("a", 1.5)]


@pytest.mark.parametrize("counts, want", [([5] * 9, None), ([5] * 10, 0), ([50_000] + [1_500] * 10, 1),
                                         ([50_000] * 3 + [20_000] + [1_500] * 9, None)])
def test_log_merge_plan(counts, want):
    assert merge_mod.plan_merge(counts, factor=10, min_docs=1_000, max_segments=48) == want
