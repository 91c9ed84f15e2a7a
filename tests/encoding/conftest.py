"""Fixtures for the encoding tests: small corpora and the fake ``_bulk`` target (``tests/fake_bulk.py``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_bulk import fake_bulk  # noqa: F401 - the fixture, re-exported


def write_jsonl(path: Path, rows) -> Path:
    with open(path, "wb") as fh:
        for row in rows:
            fh.write(row if isinstance(row, bytes) else (json.dumps(row, ensure_ascii=False) + "\n").encode())
    return path


@pytest.fixture
def small_corpus(tmp_path) -> Path:
    words = ["house", "cat", "dog", "capital", "city", "paris", "france", "seoul", "korea", "water", "river"]
    rows = [{"_id": f"d{i}", "title": "", "text": " ".join(words[(i + k) % len(words)] for k in range(3 + i % 5))}
            for i in range(40)]
    return write_jsonl(tmp_path / "corpus.jsonl", rows)
