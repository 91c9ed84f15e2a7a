"""The read side of ``lsr-os index --engine ray``: a Ray Data source over planned corpus blocks.

:class:`CorpusBlocksDatasource` has one read task per planned block (a line/row range of the corpus,
cut by :func:`opensearch_lsr.encoding.ray_job.plan_blocks`). Each task reads its range with the
single-process job's reader (:func:`~opensearch_lsr.encoding.readers.read_corpus`, seeking to the
block's byte offset) and drops what the plan decided to skip (bad input, later duplicates), so the
actors see exactly the records the single-process job would encode.

This module imports only the reader (no torch, no model code): every Ray worker process that runs a
read task imports it, and a read task must start in milliseconds, not seconds.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .readers import BadRecord, read_corpus

__all__ = ["PlanBlock", "CorpusBlocksDatasource", "read_block"]


@dataclass
class PlanBlock:
    """A line/row range of the corpus: read after ``start`` (with ``offset``, its byte offset) up to and
    including ``end``; ``records`` are encoded, the positions in ``skip`` (duplicate ids) are not."""

    block: int
    start: int
    offset: int | None
    end: int
    records: int
    skip: list[int] = field(default_factory=list)


def read_block(corpus: str, fmt: str | None, reader_kwargs: dict[str, Any], block: PlanBlock) -> list:
    """The records of one block as a one-table list (Ray Data's block format: a pyarrow Table)."""
    import pyarrow as pa

    skip = set(block.skip)
    cols: dict[str, list] = {"block": [], "position": [], "doc_id": [], "text": [], "source": []}
    for item in read_corpus(corpus, fmt, position=block.start, offset=block.offset, **reader_kwargs):  # type: ignore[arg-type]
        if item.position > block.end:
            break
        if isinstance(item, BadRecord) or item.position in skip:
            continue
        cols["block"].append(block.block)
        cols["position"].append(item.position)
        cols["doc_id"].append(item.doc_id)
        cols["text"].append(item.text)
        cols["source"].append(item.source)
    if len(cols["text"]) != block.records:
        raise RuntimeError(f"block {block.block} of {corpus} holds {len(cols['text'])} records, the plan counted "
                           f"{block.records}: the corpus changed since the job was planned")
    schema = pa.schema([("block", pa.int64()), ("position", pa.int64()), ("doc_id", pa.string()),
                        ("text", pa.string()), ("source", pa.string())])
    return [pa.Table.from_pydict(cols, schema=schema)]


try:  # the optional ``ray`` extra; without it this module imports, and the job says what to install
    from ray.data import Datasource as _Datasource
except ImportError:  # pragma: no cover - exercised only without ray
    _Datasource = object  # type: ignore[assignment,misc]


class CorpusBlocksDatasource(_Datasource):  # type: ignore[misc,valid-type]
    """Ray Data source over planned corpus blocks: one read task (and one output block) per block.

    Ray Data has readers for JSON and Parquet, but they cannot report a bad line with its ``file:line``
    and go on, nor resume inside a file; this source keeps the job's own reader and policy.
    """

    def __init__(self, corpus: str, fmt: str | None, blocks: Sequence[PlanBlock], reader_kwargs: dict[str, Any],
                 size_bytes: int | None = None) -> None:
        super().__init__()
        self.corpus, self.fmt, self.blocks, self.reader_kwargs = corpus, fmt, list(blocks), reader_kwargs
        self.size_bytes = size_bytes

    def estimate_inmemory_data_size(self) -> int | None:
        return self.size_bytes

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list:
        """One task per block, whatever ``parallelism`` asks: a block is the unit of completion."""
        import functools

        from ray.data.block import BlockMetadata
        from ray.data.datasource import ReadTask

        per_row = (self.size_bytes or 0) // max(1, sum(b.records for b in self.blocks))
        return [ReadTask(functools.partial(read_block, self.corpus, self.fmt, self.reader_kwargs, b),
                         BlockMetadata(num_rows=b.records, size_bytes=per_row * b.records or None,
                                       input_files=[self.corpus], exec_stats=None))
                for b in self.blocks]
