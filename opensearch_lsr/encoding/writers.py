"""Where encoded documents go besides an engine: NDJSON ``_bulk`` files for offline loading.

Each engine gives its own writer (:meth:`opensearch_lsr.engines.base.Engine.document_writer`: the local
index, OpenSearch, Elasticsearch); every writer takes a list of bulk actions (``{"_id", "_source"}``) and returns one
:class:`~opensearch_lsr.engines.base.BulkOutcome` per action; failed outcomes go to the
dead-letter file. ``state()`` is what a checkpoint must remember to resume without duplicates, and
``restore(state)`` rewinds to it (NDJSON files are truncated back to the checkpointed size; index
backends need nothing because ``_id``\\ s are deterministic and re-indexing overwrites).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from ..engines.base import BulkOutcome, DocumentWriter
from .document_workers import NdjsonLines

__all__ = ["DocumentWriter", "NdjsonLines", "NdjsonWriter", "read_ndjson_documents"]


class NdjsonWriter:
    """Writes ``_bulk`` NDJSON files (``bulk-00000.ndjson`` ...) for offline loading with curl.

    Each file holds at most ``docs_per_file`` documents (action line + source line each), so that
    each file is one ``POST _bulk`` request of bounded size. Data is flushed and fsynced before a
    checkpoint records the file sizes.
    """

    def __init__(self, directory: str | os.PathLike, index: str, docs_per_file: int = 10_000) -> None:
        if docs_per_file < 1:
            raise ValueError("docs_per_file must be >= 1")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.index = index
        self.docs_per_file = docs_per_file
        self.part = 0
        self.docs_in_part = 0
        self._fh = None

    def _path(self, part: int) -> Path:
        return self.dir / f"bulk-{part:05d}.ndjson"

    def _open(self):
        if self._fh is None:
            self._fh = open(self._path(self.part), "ab")
        return self._fh

    def write(self, actions: Sequence[dict] | NdjsonLines) -> list[BulkOutcome]:
        """Append bulk actions (``{"_id", "_source"}``), or a chunk the document workers serialised."""
        if isinstance(actions, NdjsonLines):
            return self._write_lines(actions)
        out = []
        for action in actions:
            self._next_part_if_full()
            meta = {"index": {"_index": self.index, "_id": action["_id"]}}
            self._open().write(orjson.dumps(meta) + b"\n" + orjson.dumps(action["_source"]) + b"\n")
            self.docs_in_part += 1
            out.append(BulkOutcome(str(action["_id"]), True, 201))
        return out

    def _write_lines(self, lines: NdjsonLines) -> list[BulkOutcome]:
        """The documents of ``lines``, as many to a slice as the current part file takes."""
        data, ends, done = memoryview(lines.data), lines.ends, 0
        while done < len(lines):
            self._next_part_if_full()
            take = min(len(lines) - done, self.docs_per_file - self.docs_in_part)
            self._open().write(data[int(ends[done - 1]) if done else 0:int(ends[done + take - 1])])
            self.docs_in_part += take
            done += take
        return [BulkOutcome(str(doc_id), True, 201) for doc_id in lines.ids]

    def _next_part_if_full(self) -> None:
        if self.docs_in_part >= self.docs_per_file:
            self._close_part()
            self.part += 1
            self.docs_in_part = 0

    def _close_part(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None

    def state(self) -> dict[str, Any]:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
        path = self._path(self.part)
        return {"part": self.part, "docs_in_part": self.docs_in_part,
                "size": path.stat().st_size if path.exists() else 0}

    def start(self, replace: bool) -> None:
        """Begin a run with no checkpoint to continue from. Files an earlier run left in the directory are emptied with
        ``replace`` (a restart); without it they are an error, since appending would mix two runs' documents."""
        parts = sorted(self.dir.glob("bulk-*.ndjson"))
        if parts and not replace:
            raise FileExistsError(f"{self.dir} already holds {len(parts)} bulk-*.ndjson file(s) from an earlier run: "
                                  "pass --restart to replace them, or write to another directory")
        self.restore({})

    def restore(self, state: dict[str, Any]) -> None:
        """Truncate back to the checkpoint: drop later parts and bytes written after it."""
        self._close_part()
        part, size = int(state.get("part", 0)), int(state.get("size", 0))
        for extra in sorted(self.dir.glob("bulk-*.ndjson")):
            if int(extra.stem.split("-")[1]) > part:
                extra.unlink()
        path = self._path(part)
        if path.exists():
            with open(path, "r+b") as fh:
                fh.truncate(size)
        self.part, self.docs_in_part = part, int(state.get("docs_in_part", 0))

    def close(self) -> None:
        self._close_part()


def read_ndjson_documents(directory: str | os.PathLike) -> tuple[dict[str, dict], int]:
    """What :class:`NdjsonWriter` wrote to ``directory`` (every ``bulk-*.ndjson`` file, the Ray job's per-block
    files too): ``{_id: _source}`` (a later line wins) and the number of documents, repeated ids counted."""
    docs, n = {}, 0
    for path in sorted(Path(directory).glob("bulk-*.ndjson")):
        lines = path.read_bytes().splitlines()
        for meta, src in zip(lines[::2], lines[1::2]):
            docs[orjson.loads(meta)["index"]["_id"]] = orjson.loads(src)
            n += 1
    return docs, n
