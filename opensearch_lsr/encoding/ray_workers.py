"""What runs in the encoder actors of ``lsr-os index --engine ray`` (the read tasks are in :mod:`.ray_source`).

* :class:`BlockEncoder` is the stateful ``map_batches`` callable: one model load per actor
  (:class:`~opensearch_lsr.encoding.encoder.SparseDocumentEncoder` on CPU or on the actor's GPU), the
  512-token policy and documents as :mod:`opensearch_lsr.encoding.job` builds them, then the write
  from the worker (OpenSearch/Elasticsearch ``_bulk`` through the job's writers, or an NDJSON file per
  block). It returns one small row per block: counts and dead letters, or, for the local backend (one
  writer process only), the documents for the driver to write.
* :class:`NdjsonBlockWriter`: ``_bulk`` NDJSON, one file per block, written to a temp name and renamed,
  so a retried task replaces the file instead of appending a second copy.

Idempotence is what makes Ray's retries safe: ``_id`` is deterministic (corpus id or sha1 of the text),
so a block written twice (an actor killed after its ``_bulk`` call, the task retried) overwrites itself.
"""
from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..engines.base import BulkOutcome
from .documents import DocumentBuilder, LongTextPolicy, doc_id_for, split_passages
from .indexing import build_actions

__all__ = ["encode_records", "BlockEncoder", "NdjsonBlockWriter", "dead_letter_entry", "RESULT_COLUMNS",
           "CALLS_PER_ACTOR"]

#: Calls of one actor Ray Data runs at once by default: one block built and written while the next is encoded.
CALLS_PER_ACTOR = 2

#: Integer columns of the per-block rows :class:`BlockEncoder` returns.
RESULT_COLUMNS = ("block", "first_position", "records", "indexed", "dead_lettered", "truncated", "split_docs", "passages",
                  "nonfinite_dropped")


def encode_records(encoder, builder: DocumentBuilder, records: Sequence[tuple[str | None, str]],
                   long_text: LongTextPolicy) -> tuple[list[dict], Counter]:
    """Bulk actions for ``(doc_id, text)`` records, with the single-process job's 512-token policy
    (``truncate``: count texts over the cap; ``split``: nested passages) and counters. With packed batching
    the texts are tokenized once (the encoder's background tokenizer), for both the count and the encode; an
    ``encoder`` with ``submit`` (a :class:`~.encode_pipeline.PipelinedEncoder`) takes the block into its device
    pipeline, beside the blocks other calls submitted."""
    texts = [t for _, t in records]
    tokens = None
    counters: Counter = Counter()
    if texts and long_text != "split" and hasattr(encoder, "submit"):  # a device pipeline shared by block calls
        future = encoder.submit(texts)
        vectors = future.result()
        counters["truncated"] += int((future.tokens.full_lengths > encoder.max_length).sum())
        return build_actions(records, vectors, builder), counters
    if texts and getattr(encoder, "runner", None) is not None:
        tokens = encoder.tokenize_async(texts).result()
        over = (tokens.full_lengths > encoder.max_length).tolist()
    else:
        over = [n > encoder.max_length for n in encoder.count_tokens(texts)] if texts else []
    if long_text != "split":
        counters["truncated"] += sum(over)
        vectors = encoder.encode_tokenized(tokens) if tokens is not None else encoder.encode(texts) if texts else []
        return build_actions(records, vectors, builder), counters
    pieces = [split_passages(t, encoder.tokenizer, encoder.max_length) if o else [t] for t, o in zip(texts, over)]
    vectors = encoder.encode([p for ps in pieces for p in ps]) if texts else []
    actions, k = [], 0
    for (doc_id, text), ps in zip(records, pieces):
        did = doc_id_for(doc_id, text)
        actions.append({"_id": did, "_source": builder.nested_source(did, text, ps, vectors[k:k + len(ps)])})
        k += len(ps)
    counters["split_docs"] += sum(over)
    counters["passages"] += k
    return actions, counters


def dead_letter_entry(outcome: BulkOutcome, source: str | None) -> dict[str, Any]:
    """A ``dead_letter.jsonl`` entry, as the single-process job writes it."""
    reason = outcome.error.get("reason") if isinstance(outcome.error, dict) else str(outcome.error)
    return {"_id": outcome.doc_id, "source": source, "status": outcome.status, "reason": reason,
            "error": outcome.error}


class NdjsonBlockWriter:
    """``_bulk`` NDJSON for one block per file (``bulk-b<block>-<first position>.ndjson``).

    The lines are those of :class:`~opensearch_lsr.encoding.writers.NdjsonWriter`; the file appears
    under its final name only when complete (temp file, fsync, rename), so a retry or a re-run of the
    block replaces it.
    """

    def __init__(self, directory: str | os.PathLike, index: str) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.index = index

    @staticmethod
    def file_name(block: int, first_position: int) -> str:
        return f"bulk-b{block:07d}-{first_position:010d}.ndjson"

    def write_block(self, block: int, first_position: int, actions: Sequence[dict]) -> list[BulkOutcome]:
        final = self.dir / self.file_name(block, first_position)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            for action in actions:
                meta = {"index": {"_index": self.index, "_id": action["_id"]}}
                fh.write(json.dumps(meta, ensure_ascii=False).encode("utf-8") + b"\n")
                fh.write(json.dumps(action["_source"], ensure_ascii=False).encode("utf-8") + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        return [BulkOutcome(str(a["_id"]), True, 201) for a in actions]

    def close(self) -> None:
        return None


def _groups(blocks: np.ndarray) -> list[tuple[int, int]]:
    """``(start, stop)`` row ranges of consecutive equal block numbers."""
    cuts = [0] + [i for i in range(1, len(blocks)) if blocks[i] != blocks[i - 1]] + [len(blocks)]
    return list(zip(cuts[:-1], cuts[1:]))


class BlockEncoder:
    """The ``map_batches`` callable class: one encoder per actor, one result row per block in a batch.

    Ray Data runs several calls of an actor at once (``RayOptions.calls_per_worker``, default
    :data:`CALLS_PER_ACTOR`; ``ActorPoolStrategy(..., enable_true_multi_threading=True)``), so one block is
    built and written while the next is on the device.
    With packed batching the calls share one device pipeline (:class:`~.encode_pipeline.PipelinedEncoder`:
    a device thread, the next block tokenized while one is encoded); other encoders take one block at a time.
    Each calling thread has its own writer.

    Args:
        model: the SparseEncoder dir (as ``lsr-os index --model``).
        encoder_kwargs: :func:`~opensearch_lsr.encoding.onnx_backend.open_document_encoder` options
            (``runtime`` torch/onnx/onnx-int8; ``device`` is the actor's: ``cuda`` when it was given a GPU,
            else ``cpu``).
        builder_kwargs: :class:`~opensearch_lsr.encoding.documents.DocumentBuilder` options except ``keys``.
        long_text: the 512-token policy.
        writer_factory: makes a writer (``write(actions) -> outcomes``, or :class:`NdjsonBlockWriter`);
            ``None``: return the documents to the driver (local backend).
        threads: torch CPU threads of this actor.
    """

    def __init__(self, model: str, *, encoder_kwargs: dict[str, Any], builder_kwargs: dict[str, Any],
                 long_text: LongTextPolicy = "truncate", writer_factory: Callable[[], Any] | None = None,
                 threads: int | None = None) -> None:
        import torch

        from .encode_pipeline import PipelinedEncoder
        from .onnx_backend import open_document_encoder

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        if threads:
            torch.set_num_threads(int(threads))
        kwargs = dict(encoder_kwargs)
        device = kwargs.pop("device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
        runtime = kwargs.pop("runtime", "torch")
        if runtime != "torch":
            kwargs["num_threads"] = threads
        self.encoder = open_document_encoder(model, runtime=runtime, device=device, **kwargs)
        self.pipeline = PipelinedEncoder(self.encoder) if getattr(self.encoder, "runner", None) is not None else None
        keys = self.encoder.keys if builder_kwargs.get("key_format", "word") == "word" else None
        self.builder = DocumentBuilder(keys, **builder_kwargs)
        self.long_text = long_text
        self.writer_factory = writer_factory
        self._writers = threading.local()
        self._one_block = threading.Lock()  # an encoder without a device pipeline: one block at a time
        self._counted = threading.Lock()
        self._dropped_reported = 0

    def _write(self, block: int, first_position: int, actions: list[dict]) -> list[BulkOutcome]:
        writer = getattr(self._writers, "writer", None)
        if writer is None:
            writer = self._writers.writer = self.writer_factory()  # type: ignore[misc]
        if isinstance(writer, NdjsonBlockWriter):
            return writer.write_block(block, first_position, actions)
        return writer.write(actions) if actions else []

    def _encode(self, records: list[tuple[str | None, str]]) -> tuple[list[dict], Counter]:
        if self.pipeline is not None:
            actions, counters = encode_records(self.pipeline, self.builder, records, self.long_text)
        else:
            with self._one_block:
                actions, counters = encode_records(self.encoder, self.builder, records, self.long_text)
        with self._counted:  # the encoder's running count: each block reports what it grew by since the last
            now = self.encoder.stats.nonfinite_dropped
            counters["nonfinite_dropped"] += now - self._dropped_reported
            self._dropped_reported = now
        return actions, counters

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows: dict[str, list] = {c: [] for c in (*RESULT_COLUMNS, "dead", "actions", "sources")}
        for start, stop in _groups(batch["block"]):
            block = int(batch["block"][start])
            records = [(None if d is None else str(d), str(t))
                       for d, t in zip(batch["doc_id"][start:stop], batch["text"][start:stop])]
            sources = [str(s) for s in batch["source"][start:stop]]
            actions, counters = self._encode(records)
            dead: list[dict] = []
            if self.writer_factory is None:  # the driver writes (local backend: one writer process)
                rows["actions"].append(json.dumps(actions, ensure_ascii=False))
                rows["sources"].append(json.dumps(sources, ensure_ascii=False))
            else:
                by_id = {a["_id"]: s for a, s in zip(actions, sources)}
                for out in self._write(block, int(batch["position"][start]), actions):
                    if out.ok:
                        counters["indexed"] += 1
                    else:
                        counters["dead_lettered"] += 1
                        dead.append(dead_letter_entry(out, by_id.get(out.doc_id)))
                rows["actions"].append("")
                rows["sources"].append("")
            rows["dead"].append(json.dumps(dead, ensure_ascii=False, default=str))
            counters["block"], counters["records"] = block, stop - start
            counters["first_position"] = int(batch["position"][start])
            for c in RESULT_COLUMNS:
                rows[c].append(int(counters.get(c, 0)))
        out = {c: np.asarray(rows[c], dtype=np.int64) for c in RESULT_COLUMNS}
        out.update({c: np.asarray(rows[c], dtype=object) for c in ("dead", "actions", "sources")})
        return out
