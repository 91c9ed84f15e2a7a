"""``NdjsonWriter``: bulk actions, or chunks the document workers serialised, into the same part files."""
from __future__ import annotations

import numpy as np
import orjson

from opensearch_lsr.encoding.document_workers import NdjsonLines
from opensearch_lsr.encoding.writers import NdjsonWriter


def _actions(n: int) -> list[dict]:
    return [{"_id": f"d{i}", "_source": {"text": "가" * (i % 7), "sparse_embedding": {"w": i / 10}}} for i in range(n)]


def _lines(actions: list[dict]) -> NdjsonLines:
    """What a document worker returns for these actions: their lines in one buffer."""
    parts = [orjson.dumps({"index": {"_index": "idx", "_id": a["_id"]}}) + b"\n" + orjson.dumps(a["_source"]) + b"\n"
             for a in actions]
    return NdjsonLines([a["_id"] for a in actions], b"".join(parts), np.cumsum([len(p) for p in parts]))


def test_serialised_chunks_fill_the_part_files_as_actions_do(tmp_path):
    actions = _actions(13)
    by_action, by_lines = NdjsonWriter(tmp_path / "a", "idx", 3), NdjsonWriter(tmp_path / "b", "idx", 3)
    for k in range(0, 13, 5):  # chunks of 5 across parts of 3 documents
        chunk = actions[k:k + 5]
        a, b = by_action.write(chunk), by_lines.write(_lines(chunk))
        assert [(o.doc_id, o.ok) for o in a] == [(o.doc_id, o.ok) for o in b] == [(x["_id"], True) for x in chunk]
        assert by_action.state() == by_lines.state()
    by_action.close(), by_lines.close()
    files_a, files_b = sorted((tmp_path / "a").glob("*.ndjson")), sorted((tmp_path / "b").glob("*.ndjson"))
    assert [p.name for p in files_a] == [p.name for p in files_b] and len(files_a) == 5
    assert [p.read_bytes() for p in files_a] == [p.read_bytes() for p in files_b]
    assert all(p.read_bytes().count(b"\n") == 6 for p in files_b[:-1])  # 3 documents, 2 lines each
    assert by_lines.write(_lines([])) == [] and len(_lines(actions)) == 13
