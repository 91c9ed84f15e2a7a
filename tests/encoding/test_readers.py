from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opensearch_lsr.encoding.readers import BadRecord, CorpusRecord, count_records, read_corpus



def write_jsonl(path, rows):
    with open(path, "wb") as fh:
        for row in rows:
            fh.write(row if isinstance(row, bytes) else (json.dumps(row, ensure_ascii=False) + "\n").encode())
    return path


def test_jsonl_bad_input_policy(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [
        {"_id": "a", "title": "T", "text": "hello"},
        b"{not json\n",
        b"\n",
        {"_id": "b", "title": "", "text": "   "},
        b'{"_id": "c", "text": "caf\xff"}\n',
        b"[1, 2]\n",
        {"text": "no id here"},
        {"_id": 7, "text": "int id"},
    ])
    items = list(read_corpus(path))
    kinds = [(type(i).__name__, getattr(i, "reason", None), i.source) for i in items]
    assert kinds == [("CorpusRecord", None, "c.jsonl:1"), ("BadRecord", "malformed", "c.jsonl:2"),
                     ("BadRecord", "blank_line", "c.jsonl:3"), ("BadRecord", "empty_text", "c.jsonl:4"),
                     ("BadRecord", "invalid_utf8", "c.jsonl:5"), ("BadRecord", "malformed", "c.jsonl:6"),
                     ("CorpusRecord", None, "c.jsonl:7"), ("CorpusRecord", None, "c.jsonl:8")]
    assert items[0].text == "T hello" and items[6].doc_id is None and items[7].doc_id == "7"
    replaced = list(read_corpus(path, invalid_utf8="replace"))[4]
    assert isinstance(replaced, CorpusRecord) and replaced.utf8_replaced and "\ufffd" in replaced.text
    assert count_records(path) == 8


def test_resume_from_offset_and_position(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"_id": str(i), "text": f"t{i}"} for i in range(10)])
    items = list(read_corpus(path))
    mid = items[3]
    by_offset = [i.doc_id for i in read_corpus(path, position=mid.position, offset=mid.offset)]
    by_position = [i.doc_id for i in read_corpus(path, position=mid.position)]
    assert by_offset == by_position == [str(i) for i in range(4, 10)]


def test_tsv_with_and_without_header(tmp_path):
    plain = tmp_path / "c.tsv"
    plain.write_bytes(b"1\thello world\n2\tonly\ttitle\n3\n4\t\n")
    items = list(read_corpus(plain))
    assert [(type(i).__name__, getattr(i, "reason", None)) for i in items] == [
        ("CorpusRecord", None), ("CorpusRecord", None), ("BadRecord", "malformed"), ("BadRecord", "empty_text")]
    assert items[1].text == "title only"
    headed = tmp_path / "h.tsv"
    headed.write_text("id\ttitle\ttext\nx\tT\tbody\n", encoding="utf-8")
    (rec,) = list(read_corpus(headed))
    assert rec.doc_id == "x" and rec.text == "T body" and rec.source == "h.tsv:2"
    assert count_records(headed) == 1


def test_parquet_row_batches_and_resume(tmp_path):
    path = tmp_path / "c.parquet"
    table = pa.table({"_id": [f"p{i}" for i in range(25)], "text": [f"text {i}" if i != 5 else "" for i in range(25)]})
    pq.write_table(table, path, row_group_size=7)
    items = list(read_corpus(path, batch_rows=4))
    assert len(items) == 25 and isinstance(items[5], BadRecord) and items[5].reason == "empty_text"
    assert items[5].source == "c.parquet:row 6"
    rest = [i.doc_id for i in read_corpus(path, position=16, batch_rows=4)]
    assert rest == [f"p{i}" for i in range(16, 25)]
    assert count_records(path) == 25


def test_unknown_format(tmp_path):
    p = tmp_path / "c.xml"
    p.write_text("<x/>")
    with pytest.raises(ValueError, match="cannot tell the format"):
        read_corpus(p)


@pytest.mark.parametrize("fmt", ["jsonl", "tsv", "parquet"])
def test_streaming_memory_is_flat(tmp_path, fmt):
    """Peak Python memory while streaming does not grow with the corpus (4x the rows, same peak)."""
    import tracemalloc

    def make(n):
        path = tmp_path / f"c{n}.{fmt}"
        text = "서울은 한국의 수도이다 " * 20
        if fmt == "jsonl":
            path.write_text("".join(json.dumps({"_id": str(i), "text": text}, ensure_ascii=False) + "\n"
                                    for i in range(n)), encoding="utf-8")
        elif fmt == "tsv":
            path.write_text("".join(f"{i}\t{text}\n" for i in range(n)), encoding="utf-8")
        else:
            pq.write_table(pa.table({"_id": [str(i) for i in range(n)], "text": [text] * n}), path,
                           row_group_size=1000)
        return path

    peaks = []
    for n in (2_000, 8_000):
        path = make(n)
        tracemalloc.start()
        count = sum(1 for item in read_corpus(path, batch_rows=500) if isinstance(item, CorpusRecord))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert count == n
    assert peaks[1] < 1.5 * peaks[0] + 256 * 1024, peaks
