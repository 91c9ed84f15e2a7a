"""Corpus texts for the steps that need only the texts (IDF tables, tokenizer training, VT's MLM).

The ``lsr-os index`` job reads records with ids, offsets and a bad-input report instead
(:mod:`opensearch_lsr.encoding.readers`); both join a BEIR ``title`` and ``text`` the same way
(:func:`doc_text`).
"""
from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CorpusTexts", "doc_text", "iter_corpus_texts"]


def doc_text(row: dict) -> str:
    """BEIR document text: ``title`` and ``text`` joined, as BEIR evaluations do."""
    title = (row.get("title") or "").strip()
    text = (row.get("text") or "").strip()
    return f"{title} {text}".strip() if title else text


def iter_corpus_texts(path: str | os.PathLike) -> Iterator[str]:
    """Stream the texts of a corpus: JSONL (BEIR ``corpus.jsonl``: ``title`` + ``text``; or ``{"text": ...}``),
    a BEIR dataset directory (its ``corpus.jsonl[.gz]``), or plain text with one document per line.
    ``.gz`` files are read transparently; blank lines and empty documents are skipped.

    Raises:
        ValueError: the file does not exist, or a JSONL line is not valid JSON or not an object with a
            ``text`` string (bad input is reported, never dropped silently).
    """
    p = Path(path)
    if p.is_dir():
        found = next((c for c in (p / "corpus.jsonl", p / "corpus.jsonl.gz") if c.exists()), None)
        if found is None:
            raise ValueError(f"directory {str(path)!r} holds no BEIR corpus.jsonl")
        p = found
    if not p.is_file():
        raise ValueError(f"corpus file {str(path)!r} does not exist")
    opener = gzip.open if p.suffix == ".gz" else open
    jsonl = ".jsonl" in p.suffixes or ".json" in p.suffixes
    with opener(p, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            if not jsonl:
                yield line
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{p}:{lineno} is not valid JSON ({err.msg})") from err
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f"{p}:{lineno}: expected a JSON object with a 'text' field")
            text = doc_text(row)
            if text:
                yield text


@dataclass(frozen=True)
class CorpusTexts:
    """A corpus file's texts, read again on every ``iter()`` (:func:`iter_corpus_texts`), for steps that take
    more than one pass, such as tokenizer training, without holding the corpus in memory."""

    path: str | os.PathLike

    def __iter__(self) -> Iterator[str]:
        return iter_corpus_texts(self.path)
