"""The ``lsr-os index`` job: stream a corpus, encode it, bulk-load it; resumable, nothing lost.

Pipeline: reader (file order) -> bad-input policy -> chunks of ``chunk_docs`` records -> duplicate-id
check -> :class:`~opensearch_lsr.encoding.encoder.SparseDocumentEncoder` (length-sorted batches)
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

import logging
import queue
import resource
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..config import write_json
from ..pruning import parse_prune
from .document_workers import NdjsonDocumentPool, default_build_workers
from .documents import DocumentBuilder, doc_id_for, split_passages
from .indexing import build_actions
from .job_config import (DEFAULT_BULK_CONCURRENCY, MAX_BULK_CONCURRENCY, Backend, IndexJobConfig, IndexJobError,
                         check_resumable, default_work_dir, make_writer, write_concurrency)
from .job_state import (CHECKPOINT, DEAD_LETTER, SEEN_DB, SKIPPED, SUMMARY, Checkpoint, ReportFile, SeenIds,
                        warn_nonfinite)
from .packed_runner import device_thread_report
from .readers import BadRecord, CorpusRecord, count_records, read_corpus

__all__ = ["Backend", "IndexJobConfig", "IndexJobError", "IndexJob", "run_index_job", "default_work_dir",
           "make_writer", "DEFAULT_BULK_CONCURRENCY", "MAX_BULK_CONCURRENCY"]

logger = logging.getLogger(__name__)


@dataclass
class _Progress:
    """Where a chunk leaves the reader: position/offset of its last record, skipped-file size, counters."""

    position: int
    offset: int | None
    skipped_size: int
    counters: Counter


class IndexJob:
    """One run (or resumption) of an index job: reader -> encoder -> documents -> writer thread -> checkpoint.

    Args:
        config: the job options.
        writer: a ready :class:`~opensearch_lsr.encoding.writers.DocumentWriter` (tests, custom
            backends); by default one is made from ``config.backend``.
        client_factory: zero-argument callable returning an ``opensearch-py`` client (opensearch backend).
        encoder: a ready :class:`~.encoder.SparseDocumentEncoder` (reuse across runs); built from the config otherwise.
        progress: show a tqdm bar.
    """

    def __init__(self, config: IndexJobConfig, *, writer=None, client_factory=None, encoder=None,
                 progress: bool = True) -> None:
        self.config = config
        self.writer = writer
        self.client_factory = client_factory
        self.encoder = encoder
        self.progress = progress
        self.work = default_work_dir(config)
        #: seconds by stage. Main thread: duplicates (id store), encode (waiting for vectors), build, queue_wait (for
        #: the writer's queue); writer: documents_wait (for the document workers), write, checkpoint (fsyncs and file)
        self.timing = dict.fromkeys(("duplicates", "encode", "build", "queue_wait", "documents_wait", "write",
                                     "checkpoint"), 0.0)
        self.failure: list[BaseException] = []
        self._checkpointed_at = float("-inf")  # perf_counter of the last checkpoint (the writer thread's)
        self._in_flight: deque = deque()  # chunks being written besides the one acknowledged (bulk_concurrency > 1)
        self.doc_pool = None
        self.write_concurrency = 1
        self.setup_s = 0.0
        self.lock = threading.Lock()
        self.queue: queue.Queue = queue.Queue(maxsize=config.queue_size)
        self.pending: deque = deque()
        self.skips: list[tuple[int, dict]] = []  # (position, entry) of the chunk being read, for the report
        self.main_counters: Counter = Counter()
        self.encode_counters: Counter = Counter()
        self.writer_counters: Counter = Counter()

    # ------------------------------------------------------------------ set-up
    def _load_checkpoint(self, resume: bool, restart: bool) -> Checkpoint | None:
        """The checkpoint to continue from; clears the work dir on ``restart``; refuses a stale one."""
        config, work = self.config, self.work
        ckpt_path = work / CHECKPOINT
        checkpoint = None
        if ckpt_path.exists():
            if restart:
                for name in (CHECKPOINT, SKIPPED, DEAD_LETTER, SUMMARY, SEEN_DB, SEEN_DB + "-wal", SEEN_DB + "-shm"):
                    (work / name).unlink(missing_ok=True)
            elif resume:
                checkpoint = Checkpoint.load(ckpt_path)
                if checkpoint.corpus != str(config.corpus) or checkpoint.index != str(config.index):
                    raise IndexJobError(f"the checkpoint in {work} is for another corpus/index "
                                        f"({checkpoint.corpus} -> {checkpoint.index})")
                saved = check_resumable(work, config)
                if checkpoint.done and saved is not None and _limit_raised(saved.limit, config.limit):  # read on
                    checkpoint = replace(checkpoint, done=False)
                elif checkpoint.done:
                    logger.info("checkpoint says the job is complete; nothing to resume")
            else:
                raise IndexJobError(f"{work} holds a checkpoint from an earlier run: pass --resume to continue "
                                    "it or --restart to start over")
        elif not restart and not resume and (work / SEEN_DB).exists():
            (work / SEEN_DB).unlink()
        return checkpoint

    def _start_writer(self, restart: bool) -> None:
        """A run without a checkpoint: NDJSON files left by an earlier run are replaced on ``restart``, else refused."""
        from .writers import NdjsonWriter

        if isinstance(self.writer, NdjsonWriter):
            try:
                self.writer.start(replace=restart)
            except FileExistsError as err:
                raise IndexJobError(str(err)) from None

    def _open_encoder(self):
        """The encoder: the given one, one process per device (several GPUs), or one in-process."""
        from .encoder import SparseDocumentEncoder
        from .parallel import DevicePool, resolve_devices

        config = self.config
        devices = resolve_devices(config.device)
        if config.encoder_runtime != "torch":
            if config.encoder_process:
                raise IndexJobError(f"--encoder-process runs the torch encoder; --encoder-runtime "
                                    f"{config.encoder_runtime} encodes in this process")
            if len(devices) > 1 or str(devices[0]) != "cpu":
                raise IndexJobError(f"--encoder-runtime {config.encoder_runtime} runs on CPU only (device "
                                    f"{config.device or devices[0]}); use --encoder-runtime torch on GPUs")
            from .onnx_backend import open_document_encoder

            return open_document_encoder(config.model, runtime=config.encoder_runtime,  # type: ignore[arg-type]
                                         precision=config.precision, batch_size=config.batch_size,
                                         max_length=config.max_length, num_threads=config.threads)
        if len(devices) > 1 or config.encoder_process:
            return DevicePool(config.model, devices, precision=config.precision, batch_size=config.batch_size,
                              max_length=config.max_length, num_threads=config.threads, batching=config.batching,
                              max_batch_tokens=config.max_batch_tokens, compile=config.compile,
                              window_docs=config.window_docs)
        return SparseDocumentEncoder(config.model, device=devices[0], precision=config.precision,  # type: ignore[arg-type]
                                     batch_size=config.batch_size, max_length=config.max_length,
                                     batching=config.batching, max_batch_tokens=config.max_batch_tokens,  # type: ignore[arg-type]
                                     compile=config.compile)

    def _save_checkpoint(self, progress: _Progress, done: bool = False) -> None:
        Checkpoint(corpus=str(self.config.corpus), index=str(self.config.index), done=done,
                   position=progress.position, offset=progress.offset, skipped_size=progress.skipped_size,
                   dead_letter_size=self.dead.sync(), writer=self.writer.state(), counters=dict(progress.counters),
                   updated=time.time()).save(self.work / CHECKPOINT)

    # ------------------------------------------------------------------ writer thread
    def _writer_loop(self) -> None:
        """Write queued chunks; dead-letter refused documents; checkpoint (:meth:`_acknowledged`).

        With ``bulk_concurrency`` N > 1 (cluster writers only) up to N chunks are being written at once, each
        its own ``_bulk`` requests in a thread of a pool; they are finished (dead letters, checkpoint) in
        chunk order, so a checkpoint never covers a chunk the cluster has not acknowledged.
        """
        from concurrent.futures import ThreadPoolExecutor

        width = self.write_concurrency
        pool = ThreadPoolExecutor(width, thread_name_prefix="lsr-os-bulk") if width > 1 else None
        in_flight = self._in_flight  # (future of outcomes, sources, progress), oldest first
        try:
            while True:
                item = self.queue.get()
                if item is None:
                    break
                if self.failure:
                    continue  # drain after a failure so the producer never blocks
                actions, sources, progress = item
                try:
                    if hasattr(actions, "result"):  # a chunk's lines from the document workers (NdjsonLines)
                        t0 = time.perf_counter()
                        actions = actions.result()
                        self.timing["documents_wait"] += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    if pool is None:
                        outcomes = self.writer.write(actions) if actions else []
                        self.timing["write"] += time.perf_counter() - t0
                        self._acknowledged(outcomes, sources, progress)
                        continue
                    in_flight.append((pool.submit(self.writer.write, actions) if actions else None, sources,
                                      progress))
                    self.timing["write"] += time.perf_counter() - t0
                    while len(in_flight) >= width:
                        self._finish_write(*in_flight.popleft())
                except BaseException as err:  # noqa: BLE001 - handed to the main thread
                    self.failure.append(err)
            while in_flight and not self.failure:
                try:
                    self._finish_write(*in_flight.popleft())
                except BaseException as err:  # noqa: BLE001
                    self.failure.append(err)
        finally:
            if pool is not None:
                pool.shutdown(wait=True)  # requests still running finish (idempotent ids); none is checkpointed

    def _finish_write(self, future, sources: dict, progress: _Progress) -> None:
        """Wait for the oldest chunk being written, then record it (in chunk order)."""
        t0 = time.perf_counter()
        outcomes = future.result() if future is not None else []
        self.timing["write"] += time.perf_counter() - t0
        self._acknowledged(outcomes, sources, progress)

    def _acknowledged(self, outcomes, sources: dict, progress: _Progress) -> None:
        """Count a written chunk's outcomes, dead-letter the refused documents, checkpoint: after every chunk, but
        while more chunks wait in the writer's queue at most every ``checkpoint_interval_s`` (each checkpoint fsyncs
        the output and the reports; a later checkpoint covers the chunks before it, and a resume rewinds to the last
        one, so nothing is written twice or lost)."""
        t0 = time.perf_counter()
        for out in outcomes:
            if out.ok:
                self.writer_counters["indexed"] += 1
            else:
                self.writer_counters["dead_lettered"] += 1
                reason = out.error.get("reason") if isinstance(out.error, dict) else str(out.error)
                self.dead.add({"_id": out.doc_id, "source": sources.get(out.doc_id), "status": out.status,
                               "reason": reason, "error": out.error})
        with self.lock:
            merged = Counter(progress.counters)
            merged.update(self.writer_counters)
            progress = replace(progress, counters=merged)
        behind = self.queue.qsize() > 0 or len(self._in_flight) > 0
        if not behind or t0 - self._checkpointed_at >= self.config.checkpoint_interval_s:
            self._save_checkpoint(progress)
            self._checkpointed_at = time.perf_counter()
        self.timing["checkpoint"] += time.perf_counter() - t0

    # ------------------------------------------------------------------ chunks
    # Chunks are encoded in order; with a device pool (several GPUs) up to ``inflight`` chunks are
    # encoded at once and finished (documents built, queued for the writer) in submission order, so
    # checkpoints stay sequential. Reader counters are snapshotted when a chunk is submitted,
    # encode counters (truncated/split/passages) are added when it is finished.
    def _encode_async(self, texts):
        """Vectors of ``texts`` (a list, or texts tokenized once), or a future of them (pools, pipelines)."""
        if len(texts) == 0:
            return None
        submit = getattr(self.encoder, "submit", None)
        if submit is not None:
            return submit(texts)
        t0 = time.perf_counter()
        vectors = self.encoder.encode(texts) if isinstance(texts, list) else self.encoder.encode_tokenized(texts)
        self.timing["encode"] += time.perf_counter() - t0
        return vectors

    def _drop_duplicates(self, records: list[CorpusRecord]) -> list[CorpusRecord]:
        """The records whose id is seen for the first time (across the whole corpus, resumes included);
        the others go to the skipped report with the chunk's bad records, in file order. One lookup and one
        insert per chunk in the id store."""
        kept = []
        if records:
            ids = [doc_id_for(r.doc_id, r.text) for r in records]
            firsts = self.seen.first_seen_many([(did, r.position, r.source) for did, r in zip(ids, records)])
            for rec, did, first in zip(records, ids, firsts):
                if first is None:
                    kept.append(rec)
                    continue
                self.main_counters["skipped.duplicate_id"] += 1
                self.skips.append((rec.position, {"source": rec.source, "reason": "duplicate_id",
                                                  "detail": f"id already seen at {first} (first occurrence wins)",
                                                  "_id": did}))
        self.skips.sort(key=lambda s: s[0])
        for _, entry in self.skips:
            self.skipped.add(entry)
        self.skips = []
        return kept

    def _flush_chunk(self, records: list[CorpusRecord], last_pos: int, last_off: int | None) -> None:
        """Submit a chunk for encoding (texts over the token cap split into passages under ``split``).
        With packed batching the chunk is tokenized once, here, and the ids go to the encoder."""
        encoder = self.encoder
        t0 = time.perf_counter()
        records = self._drop_duplicates(records)
        self.seen.commit()
        skipped_size = self.skipped.sync()
        self.timing["duplicates"] += time.perf_counter() - t0
        texts = [r.text for r in records]
        tokens, over = None, None  # over: texts past the token cap (None: known once the pipeline tokenized them)
        counted_later = getattr(encoder, "runner", None) is not None or getattr(encoder, "counts_tokens", False)
        if not counted_later or self.config.long_text == "split":
            if getattr(encoder, "runner", None) is not None and records:
                tokens = encoder.once_tokenizer(texts)
                over = (tokens.full_lengths > encoder.max_length).tolist()
            else:
                over = [n > encoder.max_length for n in encoder.count_tokens(texts)] if records else []
        pieces: list[list[str]] | None = None
        if self.config.long_text == "split" and any(over or ()):
            pieces = [split_passages(t, encoder.tokenizer, encoder.max_length) if o else [t]
                      for t, o in zip(texts, over)]
            job = self._encode_async([p for ps in pieces for p in ps])
        else:
            job = self._encode_async(tokens if tokens is not None else texts)
        progress = _Progress(last_pos, last_off, skipped_size, Counter(self.main_counters))
        self.pending.append((records, over, pieces, job, progress))
        while len(self.pending) > self.inflight:
            self._finish_chunk(*self.pending.popleft())

    def _finish_chunk(self, records, over, pieces, job, progress: _Progress) -> None:
        """Build the chunk's documents from its vectors and queue them for the writer thread."""
        actions, sources = [], {}
        builder = self.builder
        if records:
            t0 = time.perf_counter()
            vectors = job.result() if hasattr(job, "result") else job
            if over is None:  # the pipeline (or a pool worker) tokenized the chunk: its future carries the counts
                over = (job.tokens.full_lengths > self.encoder.max_length).tolist()
            if getattr(self.encoder, "submit", None) is not None:
                self.timing["encode"] += time.perf_counter() - t0  # time spent waiting for the pool
            t0 = time.perf_counter()
            if pieces is not None:
                k = 0
                for rec, ps in zip(records, pieces):
                    did = doc_id_for(rec.doc_id, rec.text)
                    actions.append({"_id": did, "_source": builder.nested_source(did, rec.text, ps,
                                                                                 vectors[k:k + len(ps)])})
                    sources[did] = rec.source
                    k += len(ps)
                self.encode_counters["split_docs"] += sum(over)
                self.encode_counters["passages"] += k
            elif self.config.long_text == "split":
                for rec, vec in zip(records, vectors):
                    did = doc_id_for(rec.doc_id, rec.text)
                    actions.append({"_id": did, "_source": builder.nested_source(did, rec.text, [rec.text], [vec])})
                    sources[did] = rec.source
                self.encode_counters["passages"] += len(records)
            elif self.doc_pool is not None:  # built and serialised in worker processes; the writer waits
                self.encode_counters["truncated"] += sum(over)
                actions = self.doc_pool.submit([(rec.doc_id, rec.text) for rec in records], vectors)
                sources = {doc_id_for(rec.doc_id, rec.text): rec.source for rec in records}
            else:
                self.encode_counters["truncated"] += sum(over)
                actions = build_actions([(rec.doc_id, rec.text) for rec in records], vectors, builder)
                sources = {action["_id"]: rec.source for action, rec in zip(actions, records)}
            self.timing["build"] += time.perf_counter() - t0
        counters_now = Counter(progress.counters)
        counters_now.update(self.encode_counters)
        progress = replace(progress, counters=counters_now)
        t0 = time.perf_counter()
        while not self.failure:
            try:
                self.queue.put((actions, sources, progress), timeout=0.5)
                break
            except queue.Full:
                continue
        self.timing["queue_wait"] += time.perf_counter() - t0

    def _records(self, checkpoint: Checkpoint | None):
        """The corpus's records (and bad lines) from the checkpoint on."""
        config = self.config
        return read_corpus(config.corpus, config.corpus_format, position=checkpoint.position if checkpoint else 0,  # type: ignore[arg-type]
                           offset=checkpoint.offset if checkpoint else None, invalid_utf8=config.invalid_utf8,  # type: ignore[arg-type]
                           id_field=config.id_field, text_field=config.corpus_text_field,
                           title_field=config.corpus_title_field)

    def _first_texts(self, checkpoint: Checkpoint | None, n: int) -> list[str]:
        """The texts of the next ``n`` good records from the checkpoint on (read again by the job): what the
        warm-up encodes, so that it meets the batch shapes of this corpus (CUDA graphs capture one per shape)."""
        texts: list[str] = []
        for item in self._records(checkpoint):
            if len(texts) >= n:
                break
            if not isinstance(item, BadRecord):
                texts.append(item.text)
        return texts

    def _read(self, checkpoint: Checkpoint | None, bar) -> tuple[int, int | None]:
        """Read the corpus from the checkpoint on: bad input and duplicate ids to the skipped report,
        records in chunks to :meth:`_flush_chunk`. Returns the last position and offset read."""
        config = self.config
        position = checkpoint.position if checkpoint else 0
        last_pos, last_off = position, checkpoint.offset if checkpoint else None
        records: list[CorpusRecord] = []
        consumed = position
        for item in self._records(checkpoint):
            if config.limit and item.position > config.limit:
                break
            consumed += 1
            last_pos, last_off = item.position, item.offset
            if isinstance(item, BadRecord):
                self.main_counters[f"skipped.{item.reason}"] += 1
                if item.reason != "blank_line":  # reported with the chunk's duplicates, in file order
                    self.skips.append((item.position, {"source": item.source, "reason": item.reason,
                                                       "detail": item.detail, "_id": item.doc_id}))
            else:
                if item.utf8_replaced:
                    self.main_counters["utf8_replaced"] += 1
                if item.doc_id is None:
                    self.main_counters["generated_ids"] += 1
                records.append(item)  # duplicate ids are checked a chunk at a time (_drop_duplicates)
            if len(records) >= config.chunk_docs:
                self._flush_chunk(records, last_pos, last_off)
                bar.update(max(0, consumed - bar.n))
                records = []
                _postfix(bar, self.writer_counters, self.start_indexed, self.t_start)
            if self.failure:
                break
        if not self.failure:
            self._flush_chunk(records, last_pos, last_off)
        while self.pending and not self.failure:
            self._finish_chunk(*self.pending.popleft())
        bar.update(max(0, consumed - bar.n))
        return last_pos, last_off

    # ------------------------------------------------------------------ the run
    def run(self, *, resume: bool = False, restart: bool = False) -> dict[str, Any]:
        """Run (or resume) the job; returns the summary (also saved as ``summary.json``).

        Raises:
            IndexJobError: a stale checkpoint without ``resume``/``restart``, or the backend failing.
        """
        from tqdm.auto import tqdm

        config, work = self.config, self.work
        work.mkdir(parents=True, exist_ok=True)
        checkpoint = self._load_checkpoint(resume, restart)
        config.save(work)
        prune = parse_prune(config.prune)
        own_encoder = self.encoder is None
        t_setup = time.perf_counter()
        if own_encoder:
            self.encoder = self._open_encoder()
        self.setup_s = time.perf_counter() - t_setup
        try:
            if self.writer is None:  # before the warm-up (compiling, on CUDA): a bad --url or index fails at once
                self.writer = make_writer(config, self.client_factory)
            if checkpoint is None:
                self._start_writer(restart)
            t_setup = time.perf_counter()
            if own_encoder and hasattr(self.encoder, "warm_up"):  # CUDA's one-off costs before the clock
                self.encoder.warm_up(**({"sample": self._first_texts(checkpoint, 2 * config.window_docs),
                                         "window_docs": config.window_docs} if _packed_on_cuda(self.encoder) else {}))
            self.setup_s += time.perf_counter() - t_setup
        except BaseException:
            if own_encoder and hasattr(self.encoder, "close"):  # the encoder processes, where there are some
                self.encoder.close()
            raise
        encoder = self.encoder
        own_pool = encoder if own_encoder and hasattr(encoder, "submit") else None
        if getattr(encoder, "runner", None) is not None and not hasattr(encoder, "submit"):
            from .encode_pipeline import PipelinedEncoder

            # the device thread takes queued chunks a window at a time; this job keeps two windows submitted
            self.encoder = encoder = own_pool = PipelinedEncoder(encoder, window_docs=config.window_docs)
        if hasattr(encoder, "max_inflight"):
            self.inflight = encoder.max_inflight(config.chunk_docs)
        else:
            self.inflight = 2 * int(getattr(encoder, "num_workers", 1)) if hasattr(encoder, "submit") else 0
        self.builder = DocumentBuilder(encoder.keys if config.key_format == "word" else None, config.key_format,
                                       prune, config.text_field, config.sparse_field)
        self.write_concurrency = write_concurrency(config, self.writer)
        self.doc_pool = None
        workers = config.build_workers if config.build_workers is not None else default_build_workers(
            str(encoder.device))
        from .writers import NdjsonWriter

        if workers and config.long_text == "truncate" and isinstance(self.writer, NdjsonWriter):
            self.doc_pool = NdjsonDocumentPool(self.builder, self.writer.index, workers)
        counters: Counter = Counter(checkpoint.counters if checkpoint else {})
        if checkpoint:
            self.writer.restore(checkpoint.writer)
        self.skipped = ReportFile(work / SKIPPED, checkpoint.skipped_size if checkpoint else None)
        self.dead = ReportFile(work / DEAD_LETTER, checkpoint.dead_letter_size if checkpoint else None)
        self.seen = SeenIds(work / SEEN_DB)
        position = checkpoint.position if checkpoint else 0
        self.seen.rewind(position)
        total = None
        try:
            total = count_records(config.corpus, config.corpus_format)  # type: ignore[arg-type]
            if config.limit:
                total = min(total, config.limit)
        except (OSError, ValueError):
            total = None

        self.writer_counters = Counter({k: v for k, v in counters.items() if k in ("indexed", "dead_lettered")})
        self.main_counters = Counter({k: v for k, v in counters.items() if k not in ("indexed", "dead_lettered")})
        thread = threading.Thread(target=self._writer_loop, name="lsr-os-index-writer", daemon=True)
        thread.start()
        bar = tqdm(total=total, initial=min(position, total or position), unit="doc", disable=not self.progress,
                   dynamic_ncols=True, desc=f"index -> {config.backend}:{Path(config.index).name}", smoothing=0.1)
        self.t_start = time.perf_counter()
        self.start_indexed = counters.get("indexed", 0)
        last_pos, last_off = position, checkpoint.offset if checkpoint else None
        try:
            if not (checkpoint and checkpoint.done):
                last_pos, last_off = self._read(checkpoint, bar)
            self.queue.put(None)
            thread.join()
            if self.failure:
                raise self.failure[0]
            self.writer.close()
        except BaseException:
            if thread.is_alive():
                self.failure.append(RuntimeError("stopped"))
                try:
                    self.queue.put_nowait(None)
                except queue.Full:
                    pass
            raise
        finally:
            bar.close()
            self.seen.close()
            self.skipped.close()
            if own_pool is not None:
                own_pool.close()
            if self.doc_pool is not None:
                self.doc_pool.close()

        elapsed = time.perf_counter() - self.t_start
        final = Counter(self.main_counters)
        final.update(self.encode_counters)
        final.update(self.writer_counters)
        self._save_checkpoint(_Progress(last_pos, last_off, self.skipped.path.stat().st_size, final), done=True)
        self.dead.close()
        summary = self._summary(final, elapsed, position if checkpoint else None, prune)
        write_json(work / SUMMARY, summary)
        warn_nonfinite(summary["encoder"])
        return summary

    def _summary(self, final: Counter, elapsed: float, resumed_from: int | None, prune) -> dict[str, Any]:
        config, encoder, work = self.config, self.encoder, self.work
        indexed_now = final.get("indexed", 0) - self.start_indexed
        return {
            "corpus": str(config.corpus), "backend": config.backend, "index": str(config.index),
            "indexed": final.get("indexed", 0),
            "dead_lettered": final.get("dead_lettered", 0),
            "skipped": {k.split(".", 1)[1]: v for k, v in sorted(final.items()) if k.startswith("skipped.")},
            "truncated": final.get("truncated", 0), "split_docs": final.get("split_docs", 0),
            "passages": final.get("passages", 0), "utf8_replaced": final.get("utf8_replaced", 0),
            "generated_ids": final.get("generated_ids", 0),
            "resumed_from_position": resumed_from,
            "this_run": {"indexed": indexed_now, "elapsed_s": round(elapsed, 3),
                         "docs_per_s": round(indexed_now / elapsed, 2) if elapsed > 0 else None,
                         **{f"{k}_s": round(v, 3) for k, v in self.timing.items()},  # IndexJob.timing
                         "setup_s": round(self.setup_s, 3), "bulk_concurrency": self.write_concurrency},
            "encoder": {"model": str(config.model), "runtime": config.encoder_runtime,
                        "device": str(encoder.device), "precision": encoder.precision,
                        "body_precision": getattr(encoder, "body_precision", encoder.precision),
                        "batch_size": encoder.batch_size, "batching": getattr(encoder, "batching", "padded"),
                        "nonfinite_dropped": encoder.stats.nonfinite_dropped, **_device_thread(encoder)},
            "prune": str(prune), "key_format": config.key_format, "long_text": config.long_text,
            "peak_rss_mb": round(_peak_rss_mb(), 1),
            "work_dir": str(work), "skipped_file": str(work / SKIPPED), "dead_letter_file": str(work / DEAD_LETTER),
        }


def _packed_on_cuda(encoder: Any) -> bool:
    """Whether ``encoder`` runs packed batches on a GPU (its warm-up then encodes the corpus's first passages)."""
    return getattr(encoder, "runner", None) is not None and str(getattr(encoder, "device", "cpu")).startswith("cuda")


def _limit_raised(before: int | None, now: int | None) -> bool:
    """Whether a finished run stopped at a ``--limit`` (``before``) that this run raises or drops: it reads on."""
    return before is not None and (now is None or now > before)


def run_index_job(config: IndexJobConfig, *, resume: bool = False, restart: bool = False, writer=None,
                  client_factory=None, encoder=None, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) an index job: :class:`IndexJob` ``(config, ...).run(resume=, restart=)``."""
    return IndexJob(config, writer=writer, client_factory=client_factory, encoder=encoder,
                    progress=progress).run(resume=resume, restart=restart)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _device_thread(encoder: Any) -> dict[str, Any]:
    """:func:`~.packed_runner.device_thread_report` of the encoder in this process, or of the pool's one worker
    (under ``workers``, one each, with several devices)."""
    reports = getattr(encoder, "device_reports", None)
    if reports is None:
        return device_thread_report(encoder)
    return reports[0] if len(reports) == 1 else {"workers": reports} if reports else {}


def _postfix(bar, writer_counters: Counter, start_indexed: int, t_start: float) -> None:
    elapsed = time.perf_counter() - t_start
    done = writer_counters.get("indexed", 0) - start_indexed
    bar.set_postfix(indexed=writer_counters.get("indexed", 0), dead=writer_counters.get("dead_lettered", 0),
                    docs_s=f"{done / elapsed:.1f}" if elapsed > 0 else "-", refresh=False)
