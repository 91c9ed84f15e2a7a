"""The ``lsr-os index`` job: stream a corpus, encode it, bulk-load it; resumable, nothing lost.

Pipeline: reader (file order) -> bad-input policy + duplicate-id check -> chunks of ``chunk_docs``
records -> :class:`~opensearch_lsr.encoding.encoder.SparseDocumentEncoder` (length-sorted batches)
-> bulk actions -> a bounded queue -> one writer thread (so encoding and uploading overlap, and a
slow cluster slows the encoder instead of filling memory) -> checkpoint.

Exactly-once, after ``kill -9`` and ``--resume``:

* ``_id`` is the corpus id (or sha1 of the text), so writing a document twice overwrites it;
* the writer thread writes the checkpoint (atomically: temp file + rename) only after a chunk's
  documents are acknowledged by the backend and its dead letters are fsynced. It records the corpus
  position (line/row and byte offset), the sizes of the report files and the writer's own state;
* on resume the reader seeks to that position, the report files (``skipped.jsonl``,
  ``dead_letter.jsonl``) and NDJSON output are truncated back to the recorded sizes, and ids seen
  after the checkpoint are forgotten (the duplicate-id store is an on-disk SQLite table, so memory
  stays flat whatever the corpus size). The chunk that was in flight is encoded and written again.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import resource
import sqlite3
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from ..config import ArtifactConfig, read_json, write_json
from ..contract import DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD, MAX_LENGTH, KeyFormat, check_key_format
from ..errors import LsrError
from .documents import DocumentBuilder, LongTextPolicy, doc_id_for, flat_mapping, split_passages
from .indexing import build_actions
from ..pruning import parse_prune
from .readers import BadRecord, CorpusRecord, count_records, read_corpus

__all__ = ["Backend", "IndexJobConfig", "IndexJobError", "run_index_job", "default_work_dir"]

logger = logging.getLogger(__name__)

Backend = Literal["local", "opensearch", "ndjson"]
CHECKPOINT = "checkpoint.json"
SKIPPED = "skipped.jsonl"
DEAD_LETTER = "dead_letter.jsonl"
SUMMARY = "summary.json"
SEEN_DB = "seen_ids.sqlite"


class IndexJobError(LsrError, RuntimeError):
    """A job-level failure with one clear sentence (bad options, cluster down, stale checkpoint)."""


@dataclass
class IndexJobConfig(ArtifactConfig):
    """Options of one ``lsr-os index`` run (saved as ``index_job.json`` in the work dir)."""

    FILENAME = "index_job.json"

    corpus: str
    model: str
    backend: Backend
    index: str
    work_dir: str | None = None
    corpus_format: str | None = None
    id_field: str | None = None
    corpus_text_field: str | None = None
    corpus_title_field: str | None = None
    invalid_utf8: str = "skip"
    key_format: KeyFormat = "word"
    prune: str = "none"
    long_text: LongTextPolicy = "truncate"
    max_length: int = MAX_LENGTH
    batch_size: int = 32
    chunk_docs: int = 256
    queue_size: int = 4
    device: str | None = None
    precision: str = "auto"
    text_field: str = DEFAULT_TEXT_FIELD
    sparse_field: str = DEFAULT_VECTOR_FIELD
    ndjson_docs_per_file: int = 10_000
    limit: int | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.backend not in get_args(Backend):
            raise ValueError(f"backend {self.backend!r} is not one of {', '.join(get_args(Backend))}")
        if self.long_text not in get_args(LongTextPolicy):
            raise ValueError(f"long_text {self.long_text!r} is not one of {', '.join(get_args(LongTextPolicy))}")
        check_key_format(self.key_format)
        if self.chunk_docs < 1 or self.queue_size < 1 or self.batch_size < 1:
            raise ValueError("chunk_docs, queue_size and batch_size must be >= 1")
        parse_prune(self.prune)  # validates


def default_work_dir(config: IndexJobConfig) -> Path:
    """Checkpoint/report dir: ``<index path>.job`` for local/ndjson, ``lsr-os-jobs/<index>`` otherwise."""
    if config.work_dir:
        return Path(config.work_dir)
    if config.backend in ("local", "ndjson"):
        p = Path(config.index)
        return p.parent / f"{p.name}.job"
    return Path("lsr-os-jobs") / config.index


class _SeenIds:
    """Duplicate-id detection on disk (first occurrence wins), rewindable to a corpus position."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
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

    def commit(self) -> None:
        self.db.execute("COMMIT")
        self.db.execute("BEGIN")

    def close(self) -> None:
        self.db.execute("COMMIT")
        self.db.close()


class _Report:
    """An append-only JSONL report, fsynced on demand and truncatable to a checkpointed size."""

    def __init__(self, path: Path, size: int | None) -> None:
        self.path = path
        if size is not None and path.exists():
            with open(path, "r+b") as fh:
                fh.truncate(size)
        elif size is None and path.exists():
            path.unlink()
        self.fh = open(path, "ab")

    def add(self, entry: dict) -> None:
        self.fh.write(json.dumps(entry, ensure_ascii=False, default=str).encode("utf-8") + b"\n")

    def sync(self) -> int:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        return self.fh.tell()

    def close(self) -> None:
        self.sync()
        self.fh.close()


def _make_writer(config: IndexJobConfig, client_factory=None):
    from .writers import LocalIndexWriter, NdjsonWriter, OpenSearchWriter

    if config.backend == "local":
        if config.long_text == "split":
            raise IndexJobError("the local backend has no nested fields: use --long-text truncate, "
                                "or the opensearch/ndjson backend for split passages")
        return LocalIndexWriter(config.index, mappings=flat_mapping(config.text_field, config.sparse_field,
                                                                    config.key_format)
                                if config.key_format == "word" else None)
    if config.backend == "ndjson":
        return NdjsonWriter(config.index, index=Path(config.index).name.lower() or "index",
                            docs_per_file=config.ndjson_docs_per_file)
    if client_factory is None:
        raise IndexJobError("the opensearch backend needs a client (--url)")
    from ..opensearch.bulk import OpenSearchBulkWriter

    bulk = OpenSearchBulkWriter(client_factory(), config.index)
    # the index must exist with the field mapped for these documents (H-os, issue 13 item 6)
    bulk.check_target(config.sparse_field, key_format=config.key_format, long_text=config.long_text)
    return OpenSearchWriter(bulk)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_index_job(
    config: IndexJobConfig,
    *,
    resume: bool = False,
    restart: bool = False,
    writer=None,
    client_factory=None,
    encoder=None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run (or resume) an index job; returns the summary (also saved as ``summary.json``).

    Args:
        config: the job options.
        resume: continue from the checkpoint in the work dir (fresh start when there is none).
        restart: discard a previous checkpoint and reports and start over.
        writer: a ready :class:`~opensearch_lsr.encoding.writers.DocumentWriter` (tests, custom
            backends); by default one is made from ``config.backend``.
        client_factory: zero-argument callable returning an ``OpenSearchBulkWriter`` (opensearch backend).
        encoder: a ready :class:`SparseDocumentEncoder` (reuse across runs); built from the config otherwise.
        progress: show a tqdm bar.

    Raises:
        IndexJobError: a stale checkpoint without ``resume``/``restart``, or the backend failing.
    """
    from tqdm.auto import tqdm

    from .encoder import SparseDocumentEncoder
    from .parallel import DevicePool, resolve_devices

    work = default_work_dir(config)
    work.mkdir(parents=True, exist_ok=True)
    ckpt_path = work / CHECKPOINT
    checkpoint: dict[str, Any] | None = None
    if ckpt_path.exists():
        if restart:
            for name in (CHECKPOINT, SKIPPED, DEAD_LETTER, SUMMARY, SEEN_DB, SEEN_DB + "-wal", SEEN_DB + "-shm"):
                (work / name).unlink(missing_ok=True)
        elif resume:
            checkpoint = read_json(ckpt_path)
            if checkpoint.get("corpus") != str(config.corpus) or checkpoint.get("index") != str(config.index):
                raise IndexJobError(f"the checkpoint in {work} is for another corpus/index "
                                    f"({checkpoint.get('corpus')} -> {checkpoint.get('index')})")
            if checkpoint.get("done"):
                logger.info("checkpoint says the job is complete; nothing to resume")
        else:
            raise IndexJobError(f"{work} holds a checkpoint from an earlier run: pass --resume to continue "
                                "it or --restart to start over")
    elif not restart and not resume and (work / SEEN_DB).exists():
        (work / SEEN_DB).unlink()
    config.save(work)
    prune = parse_prune(config.prune)

    own_pool = None
    if encoder is None:
        devices = resolve_devices(config.device)
        if len(devices) > 1:  # several GPUs (or an explicit list): one encoder process per device
            encoder = own_pool = DevicePool(config.model, devices, precision=config.precision,
                                            batch_size=config.batch_size, max_length=config.max_length,
                                            num_threads=config.threads)
        else:
            encoder = SparseDocumentEncoder(config.model, device=devices[0], precision=config.precision,  # type: ignore[arg-type]
                                            batch_size=config.batch_size, max_length=config.max_length)
    builder = DocumentBuilder(encoder.keys if config.key_format == "word" else None, config.key_format, prune,
                              config.text_field, config.sparse_field)
    if writer is None:
        writer = _make_writer(config, client_factory)

    position = int(checkpoint["position"]) if checkpoint else 0
    offset = checkpoint.get("offset") if checkpoint else None
    counters: Counter = Counter(checkpoint.get("counters", {}) if checkpoint else {})
    if checkpoint:
        writer.restore(checkpoint.get("writer", {}))
    skipped = _Report(work / SKIPPED, checkpoint.get("skipped_size") if checkpoint else None)
    dead = _Report(work / DEAD_LETTER, checkpoint.get("dead_letter_size") if checkpoint else None)
    seen = _SeenIds(work / SEEN_DB)
    seen.rewind(position)

    total = None
    try:
        total = count_records(config.corpus, config.corpus_format)  # type: ignore[arg-type]
        if config.limit:
            total = min(total, config.limit)
    except (OSError, ValueError):
        total = None

    work_q: queue.Queue = queue.Queue(maxsize=config.queue_size)
    failure: list[BaseException] = []
    timing = {"encode": 0.0, "write": 0.0}
    lock = threading.Lock()

    def checkpoint_now(state: dict[str, Any], done: bool = False) -> None:
        payload = {"corpus": str(config.corpus), "index": str(config.index), "done": done,
                   "position": state["position"], "offset": state["offset"],
                   "skipped_size": state["skipped_size"], "dead_letter_size": dead.sync(),
                   "writer": writer.state(), "counters": dict(state["counters"]), "updated": time.time()}
        write_json(ckpt_path, payload)

    writer_counters: Counter = Counter({k: v for k, v in counters.items() if k in ("indexed", "dead_lettered")})

    def writer_loop() -> None:
        while True:
            item = work_q.get()
            if item is None:
                return
            if failure:
                continue  # drain after a failure so the producer never blocks
            actions, sources, state = item
            try:
                t0 = time.perf_counter()
                outcomes = writer.write(actions) if actions else []
                timing["write"] += time.perf_counter() - t0
                for out in outcomes:
                    if out.ok:
                        writer_counters["indexed"] += 1
                    else:
                        writer_counters["dead_lettered"] += 1
                        reason = out.error.get("reason") if isinstance(out.error, dict) else str(out.error)
                        dead.add({"_id": out.doc_id, "source": sources.get(out.doc_id), "status": out.status,
                                  "reason": reason, "error": out.error})
                with lock:
                    merged = Counter(state["counters"])
                    merged.update(writer_counters)
                    state = dict(state, counters=merged)
                checkpoint_now(state)
            except BaseException as err:  # noqa: BLE001 - handed to the main thread
                failure.append(err)

    thread = threading.Thread(target=writer_loop, name="lsr-os-index-writer", daemon=True)
    thread.start()
    main_counters: Counter = Counter({k: v for k, v in counters.items() if k not in ("indexed", "dead_lettered")})
    bar = tqdm(total=total, initial=min(position, total or position), unit="doc", disable=not progress,
               dynamic_ncols=True, desc=f"index -> {config.backend}:{Path(config.index).name}", smoothing=0.1)
    t_start = time.perf_counter()
    start_indexed = counters.get("indexed", 0)

    # Chunks are encoded in order; with a device pool (several GPUs) up to ``inflight`` chunks are
    # encoded at once and finished (documents built, queued for the writer) in submission order, so
    # checkpoints stay sequential. Reader counters are snapshotted when a chunk is submitted,
    # encode counters (truncated/split/passages) are added when it is finished.
    submit = getattr(encoder, "submit", None)
    inflight = 2 * int(getattr(encoder, "num_workers", 1)) if submit is not None else 0
    pending: deque = deque()
    encode_counters: Counter = Counter()

    def encode_async(texts: list[str]):
        if not texts:
            return None
        if submit is not None:
            return submit(texts)
        t0 = time.perf_counter()
        vectors = encoder.encode(texts)
        timing["encode"] += time.perf_counter() - t0
        return vectors

    def flush_chunk(records: list[CorpusRecord], last_pos: int, last_off: int | None) -> None:
        seen.commit()
        skipped_size = skipped.sync()
        texts = [r.text for r in records]
        over = [n > encoder.max_length for n in encoder.count_tokens(texts)] if records else []
        pieces: list[list[str]] | None = None
        if config.long_text == "split" and any(over):
            pieces = [split_passages(t, encoder.tokenizer, encoder.max_length) if o else [t]
                      for t, o in zip(texts, over)]
            job = encode_async([p for ps in pieces for p in ps])
        else:
            job = encode_async(texts)
        state = {"position": last_pos, "offset": last_off, "skipped_size": skipped_size,
                 "counters": Counter(main_counters)}
        pending.append((records, over, pieces, job, state))
        while len(pending) > inflight:
            finish_chunk(*pending.popleft())

    def finish_chunk(records, over, pieces, job, state) -> None:
        actions, sources = [], {}
        if records:
            t0 = time.perf_counter()
            vectors = job.result() if hasattr(job, "result") else job
            if submit is not None:
                timing["encode"] += time.perf_counter() - t0  # time spent waiting for the pool
            if pieces is not None:
                k = 0
                for rec, ps in zip(records, pieces):
                    did = doc_id_for(rec.doc_id, rec.text)
                    actions.append({"_id": did, "_source": builder.nested_source(did, rec.text, ps,
                                                                                 vectors[k:k + len(ps)])})
                    sources[did] = rec.source
                    k += len(ps)
                encode_counters["split_docs"] += sum(over)
                encode_counters["passages"] += k
            elif config.long_text == "split":
                for rec, vec in zip(records, vectors):
                    did = doc_id_for(rec.doc_id, rec.text)
                    actions.append({"_id": did, "_source": builder.nested_source(did, rec.text, [rec.text], [vec])})
                    sources[did] = rec.source
                encode_counters["passages"] += len(records)
            else:
                encode_counters["truncated"] += sum(over)
                actions = build_actions([(rec.doc_id, rec.text) for rec in records], vectors, builder)
                sources = {action["_id"]: rec.source for action, rec in zip(actions, records)}
        counters_now = Counter(state["counters"])
        counters_now.update(encode_counters)
        state = dict(state, counters=counters_now)
        while True:
            if failure:
                return
            try:
                work_q.put((actions, sources, state), timeout=0.5)
                return
            except queue.Full:
                continue

    last_pos, last_off = position, offset
    try:
        if not (checkpoint and checkpoint.get("done")):
            records: list[CorpusRecord] = []
            consumed = position
            reader = read_corpus(config.corpus, config.corpus_format, position=position, offset=offset,  # type: ignore[arg-type]
                                 invalid_utf8=config.invalid_utf8, id_field=config.id_field,  # type: ignore[arg-type]
                                 text_field=config.corpus_text_field, title_field=config.corpus_title_field)
            for item in reader:
                if config.limit and item.position > config.limit:
                    break
                consumed += 1
                last_pos, last_off = item.position, item.offset
                if isinstance(item, BadRecord):
                    main_counters[f"skipped.{item.reason}"] += 1
                    if item.reason != "blank_line":
                        skipped.add({"source": item.source, "reason": item.reason, "detail": item.detail,
                                     "_id": item.doc_id})
                else:
                    if item.utf8_replaced:
                        main_counters["utf8_replaced"] += 1
                    if item.doc_id is None:
                        main_counters["generated_ids"] += 1
                    did = doc_id_for(item.doc_id, item.text)
                    first = seen.first_seen(did, item.position, item.source)
                    if first is not None:
                        main_counters["skipped.duplicate_id"] += 1
                        skipped.add({"source": item.source, "reason": "duplicate_id",
                                     "detail": f"id already seen at {first} (first occurrence wins)", "_id": did})
                    else:
                        records.append(item)
                if len(records) >= config.chunk_docs:
                    flush_chunk(records, last_pos, last_off)
                    bar.update(max(0, consumed - bar.n))
                    records = []
                    _postfix(bar, writer_counters, start_indexed, t_start)
                if failure:
                    break
            if not failure:
                flush_chunk(records, last_pos, last_off)
            while pending and not failure:
                finish_chunk(*pending.popleft())
            bar.update(max(0, consumed - bar.n))
        work_q.put(None)
        thread.join()
        if failure:
            raise failure[0]
        writer.close()
    except BaseException:
        if thread.is_alive():
            failure.append(RuntimeError("stopped"))
            try:
                work_q.put_nowait(None)
            except queue.Full:
                pass
        raise
    finally:
        bar.close()
        seen.close()
        skipped.close()
        if own_pool is not None:
            own_pool.close()

    elapsed = time.perf_counter() - t_start
    final = Counter(main_counters)
    final.update(encode_counters)
    final.update(writer_counters)
    state = {"position": last_pos, "offset": last_off, "skipped_size": skipped.path.stat().st_size,
             "counters": final}
    checkpoint_now(state, done=True)
    dead.close()
    indexed_now = final.get("indexed", 0) - start_indexed
    summary = {
        "corpus": str(config.corpus), "backend": config.backend, "index": str(config.index),
        "indexed": final.get("indexed", 0),
        "dead_lettered": final.get("dead_lettered", 0),
        "skipped": {k.split(".", 1)[1]: v for k, v in sorted(final.items()) if k.startswith("skipped.")},
        "truncated": final.get("truncated", 0), "split_docs": final.get("split_docs", 0),
        "passages": final.get("passages", 0), "utf8_replaced": final.get("utf8_replaced", 0),
        "generated_ids": final.get("generated_ids", 0),
        "resumed_from_position": position if checkpoint else None,
        "this_run": {"indexed": indexed_now, "elapsed_s": round(elapsed, 3),
                     "docs_per_s": round(indexed_now / elapsed, 2) if elapsed > 0 else None,
                     "encode_s": round(timing["encode"], 3), "write_s": round(timing["write"], 3)},
        "encoder": {"model": str(config.model), "device": str(encoder.device), "precision": encoder.precision,
                    "batch_size": encoder.batch_size, "nonfinite_dropped": encoder.stats.nonfinite_dropped},
        "prune": str(prune), "key_format": config.key_format, "long_text": config.long_text,
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "work_dir": str(work), "skipped_file": str(work / SKIPPED), "dead_letter_file": str(work / DEAD_LETTER),
    }
    write_json(work / SUMMARY, summary)
    return summary


def _postfix(bar, writer_counters: Counter, start_indexed: int, t_start: float) -> None:
    elapsed = time.perf_counter() - t_start
    done = writer_counters.get("indexed", 0) - start_indexed
    bar.set_postfix(indexed=writer_counters.get("indexed", 0), dead=writer_counters.get("dead_lettered", 0),
                    docs_s=f"{done / elapsed:.1f}" if elapsed > 0 else "-", refresh=False)
