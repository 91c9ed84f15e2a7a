from __future__ import annotations

import json

import pytest

from opensearch_lsr.training.data import TrainingDataError, load_training_data, read_jsonl_pairs


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_beir_pairs(tiny_beir):
    data = load_training_data(tiny_beir, "train")
    assert data.kind == "beir" and len(data.rows) == 18
    ds = data.to_dataset()
    assert ds.column_names == ["query", "positive"]
    assert ds[0]["query"] == "house city" and "house" in ds[0]["positive"]


def test_jsonl_shapes(tmp_path):
    path = _write(tmp_path / "t.jsonl", [
        json.dumps({"query": "q1", "positive": "p1", "negative": "n1", "scores": [3.0, 1.0]}),
        json.dumps({"query": "q2", "positive": "p2", "negative": ["n2"], "scores": [2, 0.5]}),
    ])
    data = read_jsonl_pairs(path)
    assert data.label_kind == "scores" and data.num_negatives == 1
    ds = data.to_dataset()
    assert ds.column_names == ["query", "positive", "negative", "label"]
    assert ds[1]["label"] == [2.0, 0.5]


def test_jsonl_bad_rows_are_reported_with_file_and_line(tmp_path):
    path = _write(tmp_path / "bad.jsonl", [
        json.dumps({"query": "q1", "positive": "p1"}),
        "{not json",
        json.dumps({"query": "", "positive": "p"}),
        json.dumps({"query": "q", "positive": "p", "negative": "n"}),  # shape differs from row 1
        json.dumps({"query": "q", "positive": "p", "score": "high"}),
        "",
        json.dumps({"query": "q4", "positive": "p4"}),
    ])
    with pytest.raises(TrainingDataError) as err:
        read_jsonl_pairs(path)
    msg = str(err.value)
    assert msg.startswith("4 bad row(s)")
    for line in (2, 3, 4, 5):
        assert f"bad.jsonl:{line}:" in msg
    assert "bad.jsonl:1:" not in msg and "bad.jsonl:7:" not in msg
    assert "invalid JSON" in msg and "'query' must be a non-empty string" in msg
    kept = read_jsonl_pairs(path, skip_bad_rows=True)
    assert [r["query"] for r in kept.rows] == ["q1", "q4"] and len(kept.skipped) == 4


def test_scores_must_match_negatives(tmp_path):
    path = _write(tmp_path / "s.jsonl", [json.dumps({"query": "q", "positive": "p", "negative": "n",
                                                     "scores": [1.0, 2.0, 3.0]})])
    with pytest.raises(TrainingDataError, match=r"s.jsonl:1: 'scores' needs 1 \+ number of negatives = 2"):
        read_jsonl_pairs(path)


def test_beir_bad_qrels(tiny_beir, tmp_path):
    import shutil

    root = tmp_path / "beir"
    shutil.copytree(tiny_beir, root)
    with open(root / "qrels" / "train.tsv", "a", encoding="utf-8") as fh:
        fh.write("q0\tmissing-doc\t1\nq-nope\td0\t1\nq0\td0\n")
    with pytest.raises(TrainingDataError) as err:
        load_training_data(root, "train")
    msg = str(err.value)
    assert "train.tsv:20: corpus id 'missing-doc' is not in corpus.jsonl" in msg
    assert "train.tsv:21: query id 'q-nope'" in msg
    assert "train.tsv:22: expected query-id, corpus-id, score" in msg


def test_missing_dataset(tmp_path):
    with pytest.raises(TrainingDataError, match="does not exist"):
        load_training_data(tmp_path / "nope")
