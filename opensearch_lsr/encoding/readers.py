"""Streaming corpus readers (JSONL, TSV, Parquet) with an explicit bad-input policy.

Readers yield one item per source line/row, in file order, without holding the corpus in memory:
either a :class:`CorpusRecord` or a :class:`BadRecord` (never a silent drop). Every item carries its
``position`` (lines or rows consumed so far) and, for text files, the byte ``offset`` just past it,
so an interrupted job can resume exactly where its checkpoint says.

Bad-input policy (counted in the job summary and listed in its ``skipped.jsonl`` report):

==================  ==============================================================================
``malformed``       a JSONL line that is not a JSON object, a TSV row with too few columns, a
                    non-string id/text: skipped, reported with ``file:line`` and the parse error.
``invalid_utf8``    bytes that are not UTF-8: skipped (``invalid_utf8="skip"``, the default), or
                    decoded with U+FFFD replacement and indexed (``"replace"``, counted as
                    ``utf8_replaced``).
``empty_text``      title and text both empty after stripping whitespace: skipped.
``blank_line``      an empty line in a JSONL/TSV file: skipped, counted (no report entry).
``duplicate_id``    decided by the job, not the reader: the first occurrence wins, later ones are
                    skipped and reported with the line of the first one.
==================  ==============================================================================

A record without an id is not bad input: the job gives it the sha1 of its text.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import orjson

__all__ = [
    "CorpusFormat",
    "InvalidUtf8Policy",
    "CorpusRecord",
    "BadRecord",
    "detect_format",
    "read_corpus",
    "count_records",
]

CorpusFormat = Literal["jsonl", "tsv", "parquet"]
InvalidUtf8Policy = Literal["skip", "replace"]
BadReason = Literal["malformed", "invalid_utf8", "empty_text", "blank_line"]

_ID_NAMES = ("_id", "id", "docid", "doc_id", "pid")
_TEXT_NAMES = ("text", "passage", "contents", "body")
_TITLE_NAMES = ("title",)


@dataclass
class CorpusRecord:
    """One document read from the corpus.

    Attributes:
        doc_id: the corpus id (``None`` when the corpus has none: the job assigns sha1(text)).
        text: what gets encoded and indexed: ``title`` and ``text`` joined as BEIR does.
        title: the title alone ("" when absent).
        source: ``file:line`` (or ``file:row``) for reports.
        position: lines/rows consumed once this record is read.
        offset: byte offset just past this record (text files), else ``None``.
        utf8_replaced: invalid UTF-8 was replaced by U+FFFD (policy ``replace``).
    """

    doc_id: str | None
    text: str
    title: str
    source: str
    position: int
    offset: int | None = None
    utf8_replaced: bool = False


@dataclass
class BadRecord:
    """A line/row that is not indexed, with the reason and where it is."""

    reason: BadReason
    source: str
    detail: str
    position: int
    offset: int | None = None
    doc_id: str | None = None


def detect_format(path: str | os.PathLike) -> CorpusFormat:
    """Corpus format from the file name (``.jsonl``/``.json``, ``.tsv``/``.txt``, ``.parquet``)."""
    name = str(path).lower()
    for suffix in (".gz", ".zst"):
        if name.endswith(suffix):
            raise ValueError(f"compressed corpora are not supported: decompress {path} first")
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if name.endswith((".tsv", ".txt", ".tab")):
        return "tsv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    raise ValueError(f"cannot tell the format of {path}: use .jsonl, .tsv or .parquet, or pass the format")


def _join(title: str, text: str) -> str:
    # Same joining as evaluation.datasets.doc_text (BEIR): "title text".
    title = title.strip()
    text = text.strip()
    return f"{title} {text}".strip() if title else text


def _decode(raw: bytes, policy: InvalidUtf8Policy) -> tuple[str | None, bool, str]:
    try:
        return raw.decode("utf-8"), False, ""
    except UnicodeDecodeError as err:
        detail = f"invalid UTF-8 at byte {err.start}"
        if policy == "replace":
            return raw.decode("utf-8", errors="replace"), True, detail
        return None, False, detail


def _field(row: dict, explicit: str | None, names: tuple[str, ...]):
    if explicit is not None:
        return row.get(explicit)
    for name in names:
        if name in row:
            return row[name]
    return None


def _make(doc_id, title, text, source, position, offset, replaced) -> CorpusRecord | BadRecord:
    if doc_id is not None and not isinstance(doc_id, (str, int)):
        return BadRecord("malformed", source, f"id is a {type(doc_id).__name__}, not a string", position, offset)
    if text is not None and not isinstance(text, str) or title is not None and not isinstance(title, str):
        return BadRecord("malformed", source, "text/title is not a string", position, offset,
                         None if doc_id is None else str(doc_id))
    doc_id = None if doc_id is None or str(doc_id) == "" else str(doc_id)
    joined = _join(title or "", text or "")
    if not joined:
        return BadRecord("empty_text", source, "title and text are empty", position, offset, doc_id)
    return CorpusRecord(doc_id, joined, (title or "").strip(), source, position, offset, replaced)


def _iter_lines(path: Path, position: int, offset: int | None) -> Iterator[tuple[int, int, bytes]]:
    """(line number, offset after the line, raw line without newline), starting after ``position``."""
    with open(path, "rb") as fh:
        lineno, end = 0, 0
        if offset:
            fh.seek(offset)
            lineno, end = position, offset
        elif position:
            for _ in range(position):
                line = fh.readline()
                if not line:
                    break
                end += len(line)
            lineno = position
        for raw in fh:  # the offset is summed, not asked of the file: tell() per line costs a third of reading
            lineno += 1
            end += len(raw)
            yield lineno, end, raw.rstrip(b"\r\n")


def _read_jsonl(path: Path, position: int, offset: int | None, policy: InvalidUtf8Policy,
                id_field: str | None, text_field: str | None, title_field: str | None):
    name = path.name
    for lineno, end, raw in _iter_lines(path, position, offset):
        source = f"{name}:{lineno}"
        if not raw.strip():
            yield BadRecord("blank_line", source, "empty line", lineno, end)
            continue
        try:  # orjson parses valid UTF-8 JSON in one call; anything else takes the checked path below
            row, replaced = orjson.loads(raw), False
        except orjson.JSONDecodeError:
            line, replaced, detail = _decode(raw, policy)
            if line is None:
                yield BadRecord("invalid_utf8", source, detail, lineno, end)
                continue
            try:
                row = json.loads(line)  # also what orjson refuses and json reads (NaN, ints past 64 bits)
            except json.JSONDecodeError as err:
                yield BadRecord("malformed", source, f"invalid JSON: {err.msg} at column {err.colno}", lineno, end)
                continue
        if not isinstance(row, dict):
            yield BadRecord("malformed", source, f"a JSON {type(row).__name__}, not an object", lineno, end)
            continue
        yield _make(_field(row, id_field, _ID_NAMES), _field(row, title_field, _TITLE_NAMES),
                    _field(row, text_field, _TEXT_NAMES), source, lineno, end, replaced)


def _tsv_header(path: Path) -> list[str] | None:
    with open(path, "rb") as fh:
        first = fh.readline().decode("utf-8", errors="replace").rstrip("\r\n").split("\t")
    names = [c.strip().lower() for c in first]
    known = set(_ID_NAMES) | set(_TEXT_NAMES) | set(_TITLE_NAMES)
    return names if names and all(n in known for n in names) and any(n in _TEXT_NAMES for n in names) else None


def _read_tsv(path: Path, position: int, offset: int | None, policy: InvalidUtf8Policy,
              id_field: str | None, text_field: str | None, title_field: str | None):
    """TSV without quoting (MS MARCO ``collection.tsv`` style): ``id<TAB>text[<TAB>title]``, or a
    header row naming the columns (``_id``/``id``, ``text``, ``title``)."""
    name = path.name
    header = _tsv_header(path)
    if header is None and any(f is not None for f in (id_field, text_field, title_field)):
        raise ValueError(f"{path} has no header row, so --id-field/--text-field/--title-field cannot apply")
    for lineno, end, raw in _iter_lines(path, position, offset):
        source = f"{name}:{lineno}"
        if header is not None and lineno == 1:
            continue  # the header itself
        if not raw.strip():
            yield BadRecord("blank_line", source, "empty line", lineno, end)
            continue
        line, replaced, detail = _decode(raw, policy)
        if line is None:
            yield BadRecord("invalid_utf8", source, detail, lineno, end)
            continue
        cols = line.split("\t")
        if header is not None:
            if len(cols) != len(header):
                yield BadRecord("malformed", source, f"{len(cols)} columns, header has {len(header)}", lineno, end)
                continue
            row = dict(zip(header, cols))
            yield _make(_field(row, id_field, _ID_NAMES), _field(row, title_field, _TITLE_NAMES),
                        _field(row, text_field, _TEXT_NAMES), source, lineno, end, replaced)
        else:
            if len(cols) not in (2, 3):
                yield BadRecord("malformed", source, f"{len(cols)} columns, expected id<TAB>text[<TAB>title]",
                                lineno, end)
                continue
            yield _make(cols[0], cols[2] if len(cols) == 3 else "", cols[1], source, lineno, end, replaced)


def _read_parquet(path: Path, position: int, policy: InvalidUtf8Policy, id_field: str | None,
                  text_field: str | None, title_field: str | None, batch_rows: int):
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names

    def pick(explicit, candidates):
        if explicit is not None:
            if explicit not in names:
                raise ValueError(f"{path} has no column {explicit!r} (columns: {', '.join(names)})")
            return explicit
        return next((c for c in candidates if c in names), None)

    id_col, text_col, title_col = pick(id_field, _ID_NAMES), pick(text_field, _TEXT_NAMES), pick(title_field, _TITLE_NAMES)
    if text_col is None:
        raise ValueError(f"{path} has no text column (columns: {', '.join(names)}); pass --text-field")
    columns = [c for c in (id_col, text_col, title_col) if c is not None]
    # Skip whole row groups before the resume position, then slice inside the first one.
    groups, skipped_rows = [], 0
    for g in range(pf.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if skipped_rows + n <= position and not groups:
            skipped_rows += n
            continue
        groups.append(g)
    row = skipped_rows
    if not groups:
        return
    for batch in pf.iter_batches(batch_size=batch_rows, row_groups=groups, columns=columns):
        cols = {c: batch.column(c).to_pylist() for c in columns}
        for i in range(batch.num_rows):
            row += 1
            if row <= position:
                continue
            source = f"{path.name}:row {row}"
            values, replaced, bad = {}, False, None
            for c in columns:
                v = cols[c][i]
                if isinstance(v, (bytes, bytearray)):
                    v, rep, detail = _decode(bytes(v), policy)
                    replaced |= rep
                    if v is None:
                        bad = detail
                values[c] = v
            if bad is not None:
                yield BadRecord("invalid_utf8", source, f"column value has {bad}", row)
                continue
            yield _make(values.get(id_col) if id_col else None, values.get(title_col) if title_col else None,
                        values.get(text_col), source, row, None, replaced)


def read_corpus(
    path: str | os.PathLike,
    fmt: CorpusFormat | None = None,
    *,
    position: int = 0,
    offset: int | None = None,
    invalid_utf8: InvalidUtf8Policy = "skip",
    id_field: str | None = None,
    text_field: str | None = None,
    title_field: str | None = None,
    batch_rows: int = 4096,
) -> Iterator[CorpusRecord | BadRecord]:
    """Stream a corpus as :class:`CorpusRecord` / :class:`BadRecord` items, in file order.

    Args:
        path: a ``.jsonl`` (BEIR ``_id``, ``title``, ``text``), ``.tsv`` or ``.parquet`` file.
        fmt: force a format instead of guessing it from the suffix.
        position: lines/rows already consumed (resume); items start after them.
        offset: byte offset matching ``position`` for text files (fast resume by seeking).
        invalid_utf8: what to do with lines that are not UTF-8 (see the module docstring).
        id_field, text_field, title_field: column/key names when they are not the usual ones.
        batch_rows: Parquet rows decoded at a time (memory stays bounded by this).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"corpus file {p} does not exist")
    if invalid_utf8 not in get_args(InvalidUtf8Policy):
        raise ValueError(f"invalid_utf8 must be one of {', '.join(get_args(InvalidUtf8Policy))}")
    fmt = fmt or detect_format(p)
    if fmt == "jsonl":
        return _read_jsonl(p, position, offset, invalid_utf8, id_field, text_field, title_field)
    if fmt == "tsv":
        return _read_tsv(p, position, offset, invalid_utf8, id_field, text_field, title_field)
    if fmt == "parquet":
        return _read_parquet(p, position, invalid_utf8, id_field, text_field, title_field, batch_rows)
    raise ValueError(f"format {fmt!r} is not one of {', '.join(get_args(CorpusFormat))}")


def count_records(path: str | os.PathLike, fmt: CorpusFormat | None = None) -> int:
    """Lines (text files, header excluded) or rows (Parquet), for the progress bar's total."""
    p = Path(path)
    fmt = fmt or detect_format(p)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(p).metadata.num_rows
    n, last = 0, b"\n"
    with open(p, "rb") as fh:
        while chunk := fh.read(1 << 20):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    if last != b"\n":
        n += 1
    if fmt == "tsv" and _tsv_header(p) is not None:
        n -= 1
    return n
