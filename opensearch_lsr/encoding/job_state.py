"""The on-disk state of an index job: its checkpoint, the duplicate-id store and the report files.

Each survives ``kill -9``: the checkpoint is replaced atomically, the id store is SQLite (WAL) and the
report files are append-only, fsynced before a checkpoint names their size and truncated back to it
on resume.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import read_json, write_json

__all__ = ["Checkpoint", "SeenIds", "ReportFile", "CHECKPOINT", "SKIPPED", "DEAD_LETTER", "SUMMARY", "SEEN_DB",
           "warn_nonfinite"]

logger = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.json"
SKIPPED = "skipped.jsonl"
DEAD_LETTER = "dead_letter.jsonl"
SUMMARY = "summary.json"
SEEN_DB = "seen_ids.sqlite"


def warn_nonfinite(encoder: dict[str, Any]) -> None:
    """Warn when a job's summary (its ``encoder`` part) counts non-finite weights dropped from documents.

    NaN / inf weights never reach an index (contract section 4.1), so the documents that had them lost those
    terms. In fp16 the usual cause is an activation past 65,504 (fp16's largest value); bf16 keeps fp32's range.
    """
    dropped = int(encoder.get("nonfinite_dropped") or 0)
    if not dropped:
        return
    hint = ("fp16 overflows past 65,504: --precision bf16 (fp32's range) or fp32 avoids it"
            if encoder.get("precision") == "fp16" else "the model itself outputs NaN / inf for some texts")
    logger.warning("%d non-finite weights (NaN / inf) left the encoder and were dropped from their documents "
                   "(summary: encoder.nonfinite_dropped); %s", dropped, hint)


@dataclass
class Checkpoint:
    """``checkpoint.json``: how far the corpus was read and acknowledged, and what to restore.

    ``position``/``offset``: the last record of the last acknowledged chunk (line/row, byte offset);
    ``skipped_size``/``dead_letter_size``: report file sizes at that point; ``writer``: the writer's
    own state (NDJSON part files); ``counters``: the summary counters so far.
    """

    corpus: str
    index: str
    done: bool = False
    position: int = 0
    offset: int | None = None
    skipped_size: int | None = None
    dead_letter_size: int | None = None
    writer: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    updated: float = 0.0

    @classmethod
    def load(cls, path: Path) -> "Checkpoint":
        """Read a checkpoint (unknown keys of other versions are ignored)."""
        data = read_json(path)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, path: Path) -> None:
        """Write atomically (temp file + rename)."""
        write_json(path, dataclasses.asdict(self))


_SQL_BATCH = 900  # host parameters per statement (SQLite's limit is 999 before 3.32)


class SeenIds:
    """Duplicate-id detection on disk (first occurrence wins), rewindable to a corpus position."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA cache_size=-65536")  # 64 MB of pages: lookups of recent ids stay in memory
        self.db.execute("CREATE TABLE IF NOT EXISTS seen (id TEXT PRIMARY KEY, pos INTEGER, source TEXT)")
        self.db.execute("BEGIN")

    def rewind(self, position: int) -> None:
        self.db.execute("DELETE FROM seen WHERE pos > ?", (position,))
        self.commit()

    def first_seen(self, doc_id: str, pos: int, source: str) -> str | None:
        """``None`` if new (and remember it), else where it was first seen."""
        cur = self.db.execute("INSERT OR IGNORE INTO seen VALUES (?, ?, ?)", (doc_id, pos, source))
        if cur.rowcount == 1:
            return None
        row = self.db.execute("SELECT source FROM seen WHERE id = ?", (doc_id,)).fetchone()
        return row[0] if row else "?"

    def first_seen_many(self, entries: list[tuple[str, int, str]]) -> list[str | None]:
        """:meth:`first_seen` of ``(doc_id, pos, source)`` entries in order, in two statements per
        :data:`_SQL_BATCH` entries (one lookup, one insert) instead of one or two per entry: the job's
        main thread checks a chunk at a time. An id repeated inside ``entries`` is first seen at its first
        occurrence."""
        first: dict[str, str] = {}
        for k in range(0, len(entries), _SQL_BATCH):
            part = [e[0] for e in entries[k:k + _SQL_BATCH]]
            marks = ",".join("?" * len(part))
            first.update(self.db.execute(f"SELECT id, source FROM seen WHERE id IN ({marks})", part).fetchall())
        out: list[str | None] = []
        new = []
        for doc_id, pos, source in entries:
            seen_at = first.get(doc_id)
            out.append(seen_at)
            if seen_at is None:
                first[doc_id] = source
                new.append((doc_id, pos, source))
        self.db.executemany("INSERT INTO seen VALUES (?, ?, ?)", new)
        return out

    def commit(self) -> None:
        self.db.execute("COMMIT")
        self.db.execute("BEGIN")

    def close(self) -> None:
        self.db.execute("COMMIT")
        self.db.close()


class ReportFile:
    """An append-only JSONL report, fsynced on demand and truncatable to a checkpointed size."""

    def __init__(self, path: Path, size: int | None) -> None:
        self.path = path
        if size is not None and path.exists():
            with open(path, "r+b") as fh:
                fh.truncate(size)
        elif size is None and path.exists():
            path.unlink()
        self.fh = open(path, "ab")
        self._unsynced = True  # the truncation above, or a new file

    def add(self, entry: dict) -> None:
        self.fh.write(json.dumps(entry, ensure_ascii=False, default=str).encode("utf-8") + b"\n")
        self._unsynced = True

    def sync(self) -> int:
        """Flush and fsync what was added since the last sync, and return the file's size. With nothing added
        there is nothing to make durable: the job syncs both reports at every chunk, most chunks add to neither,
        and each such fsync took the job's main thread 3.5 ms here (py-spy, 29,116 passages in 114 chunks)."""
        if self._unsynced:
            self.fh.flush()
            os.fsync(self.fh.fileno())
            self._unsynced = False
        return self.fh.tell()

    def close(self) -> None:
        self.sync()
        self.fh.close()
