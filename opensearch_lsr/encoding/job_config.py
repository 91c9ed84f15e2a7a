"""The options of an ``lsr-os index`` job (``IndexJobConfig``, saved next to its checkpoint) and where it writes:
its work dir, the backend's document writer, how many chunks go to a cluster at once."""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from ..config import ArtifactConfig
from ..contract import DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD, MAX_LENGTH, KeyFormat, check_key_format
from ..errors import LsrError
from ..pruning import parse_prune
from ..resources import SPLADE_TINY, splade_tiny_path
from .documents import LongTextPolicy
from .onnx_backend import EncoderRuntime

__all__ = ["Backend", "IndexJobConfig", "IndexJobError", "default_work_dir", "make_writer", "write_concurrency",
           "check_resumable", "DOCUMENT_SETTINGS", "DEFAULT_BULK_CONCURRENCY", "MAX_BULK_CONCURRENCY"]

logger = logging.getLogger(__name__)

Backend = Literal["local", "opensearch", "ndjson", "elasticsearch"]


#: ``_bulk`` requests in flight to a cluster by default (chunks written at once; measured in
#: benchmarks/results/bulk_concurrency.md), and the most the client's connection pool (10) allows.
DEFAULT_BULK_CONCURRENCY = 2
MAX_BULK_CONCURRENCY = 8


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
    # while chunks wait in the writer's queue, a checkpoint at most this often (0: after every chunk, as when the
    # writer keeps up): each one fsyncs the output and the reports
    checkpoint_interval_s: float = 1.0
    device: str | None = None
    precision: str = "auto"
    text_field: str = DEFAULT_TEXT_FIELD
    sparse_field: str = DEFAULT_VECTOR_FIELD
    ndjson_docs_per_file: int = 10_000
    limit: int | None = None
    threads: int | None = None
    # "torch" (any device) or "onnx" / "onnx-int8" (ONNX Runtime body on CPU: encoding/onnx_backend.py)
    encoder_runtime: str = "torch"
    # torch runtime: packed token-budgeted batches (auto/packed) or the padded reference (encoding/encoder.py)
    batching: str = "auto"
    max_batch_tokens: int | None = None
    window_docs: int = 4096
    # packed batching: torch.compile "body", "graphs", "block" or True / "norm" (the encoder's; None: graphs on CUDA in
    # bf16 / fp16)
    compile: bool | str | None = None
    # processes that build and serialise NDJSON documents (None: up to 8 beside a GPU, none on CPU)
    build_workers: int | None = None
    # chunks written to a cluster at once (concurrent _bulk requests; None: DEFAULT_BULK_CONCURRENCY there)
    bulk_concurrency: int | None = None
    # encode in a process of its own even on one device (the multi-device pool with one worker), so the thread
    # that launches the device's work does not share this process's interpreter with reading and writing
    encoder_process: bool = False

    def __post_init__(self) -> None:
        if self.encoder_runtime not in get_args(EncoderRuntime):
            raise ValueError(f"encoder_runtime {self.encoder_runtime!r} is not one of "
                             f"{', '.join(get_args(EncoderRuntime))}")
        if self.backend not in get_args(Backend):
            raise ValueError(f"backend {self.backend!r} is not one of {', '.join(get_args(Backend))}")
        if self.long_text not in get_args(LongTextPolicy):
            raise ValueError(f"long_text {self.long_text!r} is not one of {', '.join(get_args(LongTextPolicy))}")
        check_key_format(self.key_format)
        if self.encoder_runtime != "torch" and (self.batching != "auto" or self.max_batch_tokens is not None
                                                or self.compile is not None):
            raise ValueError(f"batching, max_batch_tokens and compile (--batching, --max-batch-tokens, --compile / "
                             f"--no-compile) apply to encoder_runtime torch; {self.encoder_runtime} encodes padded "
                             f"batches of batch_size texts")
        if self.build_workers and (self.backend != "ndjson" or self.long_text != "truncate"):
            raise ValueError(f"build_workers (--build-workers) applies to the ndjson backend with long_text truncate "
                             f"(here {self.backend}, {self.long_text}): those documents are built in this process")
        if self.checkpoint_interval_s < 0:
            raise ValueError("checkpoint_interval_s must be >= 0")
        if self.chunk_docs < 1 or self.queue_size < 1 or self.batch_size < 1 or self.window_docs < 1:
            raise ValueError("chunk_docs, queue_size, batch_size and window_docs must be >= 1")
        parse_prune(self.prune)  # validates
        if self.bulk_concurrency is not None:
            if not 1 <= self.bulk_concurrency <= MAX_BULK_CONCURRENCY:
                raise ValueError(f"bulk_concurrency must be 1-{MAX_BULK_CONCURRENCY} (the client's connection "
                                 f"pool), got {self.bulk_concurrency}")
            if self.bulk_concurrency > 1 and self.backend in ("local", "ndjson"):
                raise ValueError(f"bulk_concurrency applies to cluster backends (opensearch, elasticsearch); the "
                                 f"{self.backend} backend writes one chunk at a time")


#: What decides the documents a job writes (their ids, text and vectors): a resumed job must keep all of it, or its
#: index would hold two kinds of documents. Speed settings (device, precision, batching, workers) may change.
DOCUMENT_SETTINGS: tuple[str, ...] = ("model", "corpus_format", "id_field", "corpus_text_field", "corpus_title_field",
                                      "invalid_utf8", "key_format", "prune", "long_text", "max_length", "text_field",
                                      "sparse_field")


def _same(key: str, saved, now) -> bool:
    if key == "model" and saved != now:  # one directory named two ways (the splade-tiny alias, a relative path)
        saved, now = (str(splade_tiny_path()) if m == SPLADE_TINY else m for m in (saved, now))
        if os.path.exists(saved) and os.path.exists(now):
            return os.path.realpath(saved) == os.path.realpath(now)
    return saved == now


def check_resumable(work: Path, config: IndexJobConfig,
                    keys: Iterable[str] = DOCUMENT_SETTINGS) -> IndexJobConfig | None:
    """Refuse to resume the job in ``work`` with other ``keys`` than it saved (``index_job.json``; a work dir
    without one is not checked); returns the saved config (``None`` without one).

    Raises:
        IndexJobError: the first setting that differs, with its saved and its new value.
    """
    if not (work / IndexJobConfig.FILENAME).exists():
        return None
    saved = IndexJobConfig.load(work)
    for key in keys:
        if not _same(key, getattr(saved, key), getattr(config, key)):
            raise IndexJobError(f"the job in {work} was run with {key} {getattr(saved, key)!r}, now "
                                f"{getattr(config, key)!r}: resuming would mix documents of both; keep the setting, "
                                "or use --restart or another --work-dir")
    return saved


def default_work_dir(config: IndexJobConfig) -> Path:
    """Checkpoint/report dir: ``<index path>.job`` for local/ndjson, ``lsr-os-jobs/<index>`` otherwise."""
    if config.work_dir:
        return Path(config.work_dir)
    if config.backend in ("local", "ndjson"):
        p = Path(config.index)
        return p.parent / f"{p.name}.job"
    return Path("lsr-os-jobs") / config.index


def make_writer(config: IndexJobConfig, client_factory=None):
    """The writer of ``config.backend``: NDJSON files, or the engine's own writer, found through the engine
    registry (the local engine creates the index; a cluster's must exist with the field mapped)."""
    from ..engines import make_engine
    from .writers import NdjsonWriter

    if config.backend == "local":
        if config.long_text == "split":
            raise IndexJobError("the local backend has no nested fields: use --long-text truncate, "
                                "or the opensearch/ndjson backend for split passages")
        engine = make_engine("local")
    elif config.backend == "ndjson":
        return NdjsonWriter(config.index, index=Path(config.index).name.lower() or "index",
                            docs_per_file=config.ndjson_docs_per_file)
    elif client_factory is None:
        raise IndexJobError(f"the {config.backend} backend needs a client (--url)")
    else:
        engine = make_engine(config.backend, client_factory())
    return engine.document_writer(config.index, text_field=config.text_field, sparse_field=config.sparse_field,
                                  key_format=config.key_format, long_text=config.long_text)


def write_concurrency(config: IndexJobConfig, writer) -> int:
    """Chunks written at once: ``config.bulk_concurrency`` (default ``DEFAULT_BULK_CONCURRENCY``) where the writer
    takes concurrent writes (a cluster's), else 1."""
    if not getattr(writer, "concurrent_writes", False):
        if (config.bulk_concurrency or 1) > 1:
            raise IndexJobError(f"--bulk-concurrency {config.bulk_concurrency}: {type(writer).__name__} writes one "
                                "chunk at a time")
        return 1
    return config.bulk_concurrency or DEFAULT_BULK_CONCURRENCY
