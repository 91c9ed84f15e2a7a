"""``lsr-os index --engine ray``: the index job on Ray Data, with the single-process job's guarantees.

Pipeline (Ray Data, streaming): :class:`~.ray_source.CorpusBlocksDatasource` (one read task per
block of ``chunk_docs`` records) -> ``map_batches`` with :class:`~.ray_workers.BlockEncoder`, a pool of
``workers`` stateful actors (one model load each, CPU or ``num_gpus_per_worker`` GPUs) that encode and
write from the worker -> one small row per block back to the driver -> the block ledger.

What the driver does, and why it stays exact:

* **Plan** (:func:`plan_blocks`): one pass over the corpus with the single-process reader, in file
  order: bad input to ``skipped.jsonl`` with ``file:line`` and duplicate ids decided by the same
  on-disk store (first occurrence wins), so the report and counters are the single-process job's. The
  pass parses lines but encodes nothing (the cost is in encoding); it cuts the corpus into blocks of
  ``chunk_docs`` records with their byte offsets, so a worker seeks straight to its block.
* **Ledger** (``ray_blocks.jsonl``): a block is complete when all its records came back written
  (acknowledged or dead-lettered); then its dead letters are appended and fsynced, and one ledger
  line (block, counters, dead-letter file size) is appended and fsynced. A re-run with ``--resume``
  skips the blocks in the ledger, truncates the dead-letter file to the last recorded size (a torn last
  ledger line is dropped) and deletes NDJSON files of incomplete blocks.
* **Retries**: an actor killed mid-block is restarted by Ray (``max_restarts``) and its task retried
  (``max_task_retries``). ``_id`` is deterministic and NDJSON files are per block, replaced atomically,
  so writing a block twice changes nothing; a block row arriving twice is ignored.
* **Local backend**: the embedded index has one writer process, so the actors return the documents and
  the driver writes them (:class:`~opensearch_lsr.local.engine.LocalIndexWriter`) before the ledger line.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import re
import resource
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ArtifactConfig, write_json
from .documents import doc_id_for
from .job_config import IndexJobConfig, IndexJobError, check_resumable, default_work_dir, make_writer
from .job_state import CHECKPOINT, DEAD_LETTER, SEEN_DB, SKIPPED, SUMMARY, ReportFile, SeenIds, warn_nonfinite
from .readers import BadRecord, read_corpus
from .ray_source import CorpusBlocksDatasource, PlanBlock
from .ray_workers import CALLS_PER_ACTOR, RESULT_COLUMNS, BlockEncoder, NdjsonBlockWriter, dead_letter_entry

__all__ = ["RayOptions", "CorpusPlan", "BlockLedger", "plan_blocks", "actor_encoder_kwargs", "run_ray_index_job",
           "ray_failure_reason", "LEDGER"]

logger = logging.getLogger(__name__)

LEDGER = "ray_blocks.jsonl"


@dataclass
class RayOptions(ArtifactConfig):
    """The Ray side of ``lsr-os index --engine ray`` (saved as ``ray_job.json`` in the work dir).

    Args:
        workers: encoder actors (a fixed pool; each loads the model once).
        address: an existing cluster (``ray://host:10001``, ``auto``); ``None``: start a local one.
        num_gpus_per_worker: GPUs per actor (0: CPU encoding).
        cpus_per_worker: CPUs Ray reserves per actor; also its torch threads unless ``threads`` is set.
        read_cpus: CPUs Ray reserves per read task (reading is light; 0 keeps all cores for the actors).
        max_restarts: how often Ray restarts a dead actor and retries its task.
        calls_per_worker: blocks one actor takes at once (Ray Data's ``max_concurrent_calls_per_actor``, each
            call on a thread of its own): with 2, one block is built and written while the next is encoded.
    """

    FILENAME = "ray_job.json"

    workers: int = 1
    address: str | None = None
    num_gpus_per_worker: float = 0.0
    cpus_per_worker: float = 1.0
    read_cpus: float = 0.0
    max_restarts: int = 3
    calls_per_worker: int = CALLS_PER_ACTOR

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if self.num_gpus_per_worker < 0 or self.cpus_per_worker < 0 or self.read_cpus < 0:
            raise ValueError("num_gpus_per_worker, cpus_per_worker and read_cpus must be >= 0")
        if self.max_restarts < 0:
            raise ValueError("max_restarts must be >= 0")
        if self.calls_per_worker < 1:
            raise ValueError("calls_per_worker must be >= 1")


def actor_encoder_kwargs(config: IndexJobConfig, options: RayOptions) -> dict[str, Any]:
    """What every encoder actor opens its encoder with (:class:`.ray_workers.BlockEncoder`): the job's encoder
    settings, as ``--engine single`` passes them, on the actor's device (``cuda`` when it was given a GPU; a
    ``config.device`` that says otherwise is refused, not ignored)."""
    device = "cuda" if options.num_gpus_per_worker > 0 else "cpu"
    if config.device not in (None, device):
        raise IndexJobError(f"with --engine ray, Ray gives each actor its device: --num-gpus-per-worker "
                            f"{options.num_gpus_per_worker:g} means {device}, so --device {config.device} cannot apply "
                            f"(leave --device out, or set --num-gpus-per-worker)")
    kwargs: dict[str, Any] = {"precision": config.precision, "batch_size": config.batch_size,
                              "max_length": config.max_length, "device": device, "runtime": config.encoder_runtime}
    if config.encoder_runtime == "torch":  # packed batching's settings (IndexJobConfig refuses them otherwise)
        kwargs.update(batching=config.batching, max_batch_tokens=config.max_batch_tokens, compile=config.compile)
    return kwargs


@dataclass
class CorpusPlan:
    """The blocks to encode and the reader's counters (skipped by reason, generated ids, ...)."""

    blocks: list[PlanBlock]
    counters: Counter


def plan_blocks(config: IndexJobConfig, work: Path) -> CorpusPlan:
    """Read the corpus once in file order: report bad input and duplicate ids exactly as the
    single-process job does (``skipped.jsonl``, rewritten), and cut blocks of ``chunk_docs`` records."""
    skipped = ReportFile(work / SKIPPED, None)
    for name in (SEEN_DB, SEEN_DB + "-wal", SEEN_DB + "-shm"):
        (work / name).unlink(missing_ok=True)
    seen = SeenIds(work / SEEN_DB)
    counters: Counter = Counter()
    blocks: list[PlanBlock] = []
    start, start_off, records, dups = 0, None, 0, []
    last_pos, last_off = 0, None
    try:
        for item in read_corpus(config.corpus, config.corpus_format, invalid_utf8=config.invalid_utf8,  # type: ignore[arg-type]
                                id_field=config.id_field, text_field=config.corpus_text_field,
                                title_field=config.corpus_title_field):
            if config.limit and item.position > config.limit:
                break
            last_pos, last_off = item.position, item.offset
            if isinstance(item, BadRecord):
                counters[f"skipped.{item.reason}"] += 1
                if item.reason != "blank_line":
                    skipped.add({"source": item.source, "reason": item.reason, "detail": item.detail,
                                 "_id": item.doc_id})
                continue
            if item.utf8_replaced:
                counters["utf8_replaced"] += 1
            if item.doc_id is None:
                counters["generated_ids"] += 1
            did = doc_id_for(item.doc_id, item.text)
            first = seen.first_seen(did, item.position, item.source)
            if first is not None:
                counters["skipped.duplicate_id"] += 1
                skipped.add({"source": item.source, "reason": "duplicate_id",
                             "detail": f"id already seen at {first} (first occurrence wins)", "_id": did})
                dups.append(item.position)
                continue
            records += 1
            if records >= config.chunk_docs:
                blocks.append(PlanBlock(len(blocks), start, start_off, last_pos, records, dups))
                start, start_off, records, dups = last_pos, last_off, 0, []
        if records:
            blocks.append(PlanBlock(len(blocks), start, start_off, last_pos, records, dups))
    finally:
        seen.close()
        skipped.close()
    return CorpusPlan(blocks, counters)


class BlockLedger:
    """``ray_blocks.jsonl``: one fsynced line per completed block (its counters and the dead-letter
    file size after its entries). Loading drops a torn last line."""

    def __init__(self, path: Path, resume: bool) -> None:
        self.path = path
        self.done: dict[int, dict[str, Any]] = {}
        self.dead_letter_size: int | None = None
        if resume and path.exists():
            good = 0
            with open(path, "rb") as fh:
                for raw in fh:
                    try:
                        entry = json.loads(raw)
                    except json.JSONDecodeError:
                        break
                    if not raw.endswith(b"\n"):
                        break
                    self.done[int(entry["block"])] = entry
                    self.dead_letter_size = int(entry["dead_letter_size"])
                    good += len(raw)
            with open(path, "r+b") as fh:
                fh.truncate(good)
        else:
            path.unlink(missing_ok=True)
        self.fh = open(path, "ab")

    def add(self, block: int, counters: dict[str, int], dead_letter_size: int) -> None:
        entry = {"block": block, "counters": counters, "dead_letter_size": dead_letter_size}
        self.fh.write(json.dumps(entry).encode("utf-8") + b"\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.done[block] = entry

    def close(self) -> None:
        self.fh.close()


def _prepare_work(config: IndexJobConfig, options: RayOptions, work: Path, resume: bool, restart: bool) -> None:
    """Refuse a stale ledger without ``resume``/``restart``, or one of another job; clear on ``restart``."""
    ledger = work / LEDGER
    if (work / CHECKPOINT).exists() and not restart:
        raise IndexJobError(f"{work} holds a checkpoint of a single-process run: pass --restart to start over "
                            "with --engine ray, or use another --work-dir")
    if restart:
        for name in (LEDGER, CHECKPOINT, SKIPPED, DEAD_LETTER, SUMMARY):
            (work / name).unlink(missing_ok=True)
        if config.backend == "ndjson":
            for stale in Path(config.index).glob("bulk-*.ndjson"):
                stale.unlink()
    elif ledger.exists():
        if not resume:
            raise IndexJobError(f"{work} holds a ledger from an earlier run: pass --resume to continue it or "
                                "--restart to start over")
        saved = check_resumable(work, config) or IndexJobConfig.load(work)  # (which raises where none was saved)
        for key in ("corpus", "index", "chunk_docs", "limit"):  # the block plan
            if getattr(saved, key) != getattr(config, key):
                raise IndexJobError(f"the ledger in {work} is for another job ({key} was {getattr(saved, key)!r}, "
                                    f"now {getattr(config, key)!r}): use --restart or another --work-dir")
    config.save(work)
    options.save(work)


def _init_ray(options: RayOptions):
    try:
        import ray
    except ImportError as err:
        raise IndexJobError("--engine ray needs Ray Data: pip install 'opensearch-lsr[ray]'") from err
    if not ray.is_initialized():
        ray.init(address=options.address, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
        return ray, True
    return ray, False


def _join_block_prefetchers(timeout_s: float = 10.0) -> None:
    """Wait for Ray Data's block prefetcher threads to end before ``ray.shutdown()``.

    Closing the row iterator stops its ``WaitBlockPrefetcher`` (ray 2.60.0
    ``data/_internal/block_batching/util.py``, a thread named ``Prefetcher``), but the thread can still be
    waking up to ``ray.wait`` the blocks it was handed; if the driver has shut down by then, Ray quick-exits the
    whole process ("The core worker has already been shutdown ... The process will exit",
    ``core_worker_process.cc``): exit status 1, and the job's summary or error never printed. Seen in 2 of 4 runs
    of a job stopped after its first block. A prefetcher nobody stopped stays parked; the wait gives up on it.
    """
    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        if thread.name == "Prefetcher" and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


def _worker_sink(config: IndexJobConfig, writer_factory, client_factory):
    """``(writer factory for the actors or None, the driver's writer or None)`` for the backend."""
    if writer_factory is not None:
        return writer_factory, None
    if config.backend == "local":
        return None, make_writer(config)
    if config.backend == "ndjson":
        return functools.partial(NdjsonBlockWriter, config.index, Path(config.index).name.lower() or "index"), None
    if client_factory is None:
        raise IndexJobError("the opensearch backend needs a client (--url)")
    make_writer(config, client_factory)  # fail fast on the driver: cluster down, index or field not mapped
    return functools.partial(make_writer, config, client_factory), None


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)\b[^:]*: ")


def ray_failure_reason(err: BaseException) -> str:
    """One line for a failed Ray job: the exception that stopped a worker (the last ``Name: message`` line of the
    remote traceback Ray carries in its errors' text, colour codes removed), else the error's first line."""
    link: BaseException | None = err
    for _ in range(8):
        if link is None:
            break
        text = _COLOUR.sub("", getattr(link, "error_msg", None) or str(link))
        raised = [line for line in text.splitlines() if _EXCEPTION_LINE.match(line)]
        if raised:
            return raised[-1]
        link = link.__cause__ or link.__context__
    first = _COLOUR.sub("", str(err)).strip().splitlines()
    return first[0] if first else type(err).__name__


def run_ray_index_job(config: IndexJobConfig, options: RayOptions, *, resume: bool = False, restart: bool = False,
                      writer_factory: Callable[[], Any] | None = None, client_factory: Callable[[], Any] | None = None,
                      progress: bool = True, actor_class: type = BlockEncoder,
                      on_block: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run (or resume) an index job on Ray Data; returns the summary (also ``summary.json``).

    Args:
        config: the job options (those of the single-process job; ``chunk_docs`` = records per block).
        options: workers, cluster address, GPUs per worker.
        resume / restart: continue from the ledger / discard it.
        writer_factory: zero-argument callable run on each actor to make its writer (any
            :class:`~opensearch_lsr.encoding.writers.DocumentWriter`, e.g. Elasticsearch's); default: from
            ``config.backend``.
        client_factory: zero-argument callable returning an ``opensearch-py`` client (opensearch backend;
            it is shipped to the actors, so it must be picklable by cloudpickle: a lambda is fine).
        progress: a tqdm bar (and Ray Data's own bars).
        actor_class: the ``map_batches`` class (a :class:`~.ray_workers.BlockEncoder` subclass).
        on_block: called with each block number once it is in the ledger.

    Raises:
        IndexJobError: a stale ledger without ``resume``/``restart``, Ray missing, a worker failing for good.
    """
    from tqdm.auto import tqdm

    if config.backend == "local" and config.long_text == "split":
        raise IndexJobError("the local backend has no nested fields: use --long-text truncate, "
                            "or the opensearch/ndjson backend for split passages")
    encoder_kwargs = actor_encoder_kwargs(config, options)  # before any work: it refuses a --device that cannot apply
    work = default_work_dir(config)
    work.mkdir(parents=True, exist_ok=True)
    if config.encoder_runtime != "torch" and options.num_gpus_per_worker > 0:
        raise IndexJobError(f"--encoder-runtime {config.encoder_runtime} runs on CPU only: use --encoder-runtime "
                            "torch with --num-gpus-per-worker")
    _prepare_work(config, options, work, resume, restart)
    t_plan = time.perf_counter()
    plan = plan_blocks(config, work)
    plan_s = time.perf_counter() - t_plan
    factory, driver_writer = _worker_sink(config, writer_factory, client_factory)
    ledger = BlockLedger(work / LEDGER, resume)
    dead = ReportFile(work / DEAD_LETTER, ledger.dead_letter_size if resume else None)
    todo = [b for b in plan.blocks if b.block not in ledger.done]
    if config.backend == "ndjson" and writer_factory is None:
        for stale in Path(config.index).glob("bulk-b*.ndjson"):  # files of blocks never completed
            if int(stale.name[len("bulk-b"):].split("-")[0]) not in ledger.done:
                stale.unlink()
        for tmp in Path(config.index).glob(".bulk-b*.tmp"):  # left by an actor killed while writing
            tmp.unlink()
    threads = config.threads or max(1, int(options.cpus_per_worker))
    from ..pruning import parse_prune

    builder_kwargs = {"key_format": config.key_format, "prune": parse_prune(config.prune),
                      "text_field": config.text_field, "sparse_field": config.sparse_field}
    remaining = {b.block: b.records for b in todo}
    partial: dict[int, Counter] = {}
    pending_dead: dict[int, list[dict]] = {}
    seen_rows: set[tuple[int, int]] = set()
    this_run: Counter = Counter()
    bar = tqdm(total=sum(remaining.values()), unit="doc", disable=not progress, dynamic_ncols=True,
               desc=f"index[ray x{options.workers}] -> {config.backend}:{Path(config.index).name}")
    t_start = time.perf_counter()
    rows, own_ray = None, False
    try:
        if todo:
            ray, own_ray = _init_ray(options)
            ctx = ray.data.DataContext.get_current()
            ctx.enable_progress_bars = progress
            source = CorpusBlocksDatasource(
                str(config.corpus), config.corpus_format, todo,
                {"invalid_utf8": config.invalid_utf8, "id_field": config.id_field,
                 "text_field": config.corpus_text_field, "title_field": config.corpus_title_field},
                size_bytes=os.path.getsize(config.corpus))
            # as many concurrent read tasks as actors: a read is milliseconds, and each concurrent task
            # is a worker process to start
            ds = ray.data.read_datasource(source, num_cpus=options.read_cpus, concurrency=options.workers)
            # Bounded restarts: Ray Data's own default is max_restarts=-1 / max_task_retries=-1 (forever; ray
            # 2.60.0 actor_pool_map_operator.py _apply_default_remote_args), which loops on a model that always
            # crashes. Its comment names map_batches(..., max_restarts=N) as the way to set them; that kwarg
            # path warns "ray_remote_args is deprecated" in 2.60 with no named replacement yet, so the
            # warning is silenced here.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*ray_remote_args. is deprecated")
                ds = ds.map_batches(
                    actor_class, batch_size=None, batch_format="numpy",
                    compute=ray.data.ActorPoolStrategy(size=options.workers, enable_true_multi_threading=True,
                                                       max_concurrent_calls_per_actor=options.calls_per_worker),
                    num_cpus=options.cpus_per_worker, num_gpus=options.num_gpus_per_worker or None,
                    max_restarts=options.max_restarts, max_task_retries=options.max_restarts,
                    fn_constructor_args=(str(config.model),),
                    fn_constructor_kwargs={"encoder_kwargs": encoder_kwargs, "builder_kwargs": builder_kwargs,
                                           "long_text": config.long_text, "writer_factory": factory, "threads": threads})
            rows = ds.iter_rows()
            for row in rows:
                block, first = int(row["block"]), int(row["first_position"])
                if (block, first) in seen_rows or block not in remaining:
                    logger.warning("block %d (from position %d) came back twice; ignored", block, first)
                    continue
                seen_rows.add((block, first))
                counts = Counter({c: int(row[c]) for c in RESULT_COLUMNS[3:]})
                entries = json.loads(row["dead"])
                if driver_writer is not None:
                    actions, sources = json.loads(row["actions"]), json.loads(row["sources"])
                    by_id = {a["_id"]: s for a, s in zip(actions, sources)}
                    for out in driver_writer.write(actions) if actions else []:
                        if out.ok:
                            counts["indexed"] += 1
                        else:
                            counts["dead_lettered"] += 1
                            entries.append(dead_letter_entry(out, by_id.get(out.doc_id)))
                partial.setdefault(block, Counter()).update(counts)
                pending_dead.setdefault(block, []).extend(entries)
                remaining[block] -= int(row["records"])
                bar.update(int(row["records"]))
                if remaining[block] == 0:
                    for entry in pending_dead.pop(block):
                        dead.add(entry)
                    done_counts = partial.pop(block)
                    ledger.add(block, dict(done_counts), dead.sync())
                    this_run.update(done_counts)
                    del remaining[block]
                    if on_block is not None:
                        on_block(block)
        if driver_writer is not None:
            driver_writer.close()
        elif factory is not None and not remaining:
            # Ray Data gives a map actor no teardown call, so the actors' writers are never closed; the
            # single-process job's close() (the final refresh, so the documents are searchable at once)
            # runs here, on a writer of the same factory.
            factory().close()
    except Exception as err:
        if type(err).__module__.startswith("ray") and not isinstance(err, IndexJobError):
            raise IndexJobError(f"the Ray job failed: {ray_failure_reason(err)}; "
                                "completed blocks are in the ledger: --resume continues") from err
        raise
    finally:
        if rows is not None and hasattr(rows, "close"):
            rows.close()  # stops the streaming executor (and its actors) when the loop ends early
        bar.close()
        ledger.close()
        dead.close()
        if own_ray:
            _join_block_prefetchers()
            ray.shutdown()  # noqa: F821 - bound whenever own_ray is
    if remaining:
        raise IndexJobError(f"{len(remaining)} block(s) did not come back complete; --resume continues")
    elapsed = time.perf_counter() - t_start
    return _summary(config, options, work, plan, ledger, this_run, elapsed, plan_s, resumed=resume and
                    len(plan.blocks) > len(todo), skipped_blocks=len(plan.blocks) - len(todo))


def _summary(config: IndexJobConfig, options: RayOptions, work: Path, plan: CorpusPlan, ledger: BlockLedger,
             this_run: Counter, elapsed: float, plan_s: float, resumed: bool, skipped_blocks: int) -> dict[str, Any]:
    final = Counter(plan.counters)
    for entry in ledger.done.values():
        final.update(entry["counters"])
    indexed_now = this_run.get("indexed", 0)
    summary = {
        "corpus": str(config.corpus), "backend": config.backend, "index": str(config.index), "engine": "ray",
        "indexed": final.get("indexed", 0), "dead_lettered": final.get("dead_lettered", 0),
        "skipped": {k.split(".", 1)[1]: v for k, v in sorted(final.items()) if k.startswith("skipped.")},
        "truncated": final.get("truncated", 0), "split_docs": final.get("split_docs", 0),
        "passages": final.get("passages", 0), "utf8_replaced": final.get("utf8_replaced", 0),
        "generated_ids": final.get("generated_ids", 0),
        "blocks": {"total": len(plan.blocks), "done_before": skipped_blocks,
                   "this_run": len(plan.blocks) - skipped_blocks, "docs_per_block": config.chunk_docs},
        "resumed": resumed,
        "this_run": {"indexed": indexed_now, "elapsed_s": round(elapsed, 3), "plan_s": round(plan_s, 3),
                     "docs_per_s": round(indexed_now / elapsed, 2) if elapsed > 0 else None},
        "encoder": {"model": str(config.model),
                    **{k: v for k, v in actor_encoder_kwargs(config, options).items() if k != "max_length"},
                    "nonfinite_dropped": final.get("nonfinite_dropped", 0)},
        "ray": {"workers": options.workers, "address": options.address,
                "num_gpus_per_worker": options.num_gpus_per_worker, "cpus_per_worker": options.cpus_per_worker,
                "calls_per_worker": options.calls_per_worker},
        "prune": config.prune, "key_format": config.key_format, "long_text": config.long_text,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),  # the driver's
        "work_dir": str(work), "skipped_file": str(work / SKIPPED), "dead_letter_file": str(work / DEAD_LETTER),
    }
    write_json(work / SUMMARY, summary)
    warn_nonfinite(summary["encoder"])
    return summary
