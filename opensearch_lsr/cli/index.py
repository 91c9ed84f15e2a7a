"""`lsr-os index`: the resumable batch encoding job (corpus -> sparse vectors -> local / OpenSearch / NDJSON)."""
from __future__ import annotations

import contextlib
import sys

import click

from ..engines import connection_options
from .app import (cli, compile_setting, echo_json, fail, ray_options, refuse_cluster_options, typed_options,
                  user_errors)

__all__ = ["index_command"]


@cli.command("index")
@click.option("--corpus", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Corpus file: .jsonl (BEIR _id/title/text), .tsv (id<TAB>text[<TAB>title] or a header) or .parquet.")
@click.option("--model", required=True, help="SparseEncoder dir (lsr-os transfer output), hub id or 'splade-tiny'.")
@click.option("--backend", type=click.Choice(["local", "opensearch", "ndjson"]), default="local", show_default=True)
@click.option("--index", "index_name", required=True,
              help="Local index dir (local), NDJSON output dir (ndjson) or index name (opensearch).")
@click.option("--work-dir", default=None, help="Checkpoint and report dir [default: <index>.job, or lsr-os-jobs/<index>].")
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in the work dir.")
@click.option("--restart", is_flag=True,
              help="Discard an earlier checkpoint and start over. With --backend ndjson this also empties the bulk "
                   "files an earlier run left in the output directory; without --restart, a run with no checkpoint "
                   "to resume refuses them.")
@click.option("--format", "corpus_format", type=click.Choice(["jsonl", "tsv", "parquet"]), default=None,
              help="Corpus format [default: from the file suffix].")
@click.option("--id-field", default=None, help="Id key/column when not _id/id/docid/pid.")
@click.option("--corpus-text-field", default=None, help="Text key/column when not text/passage/contents.")
@click.option("--corpus-title-field", default=None, help="Title key/column when not title.")
@click.option("--invalid-utf8", type=click.Choice(["skip", "replace"]), default="skip", show_default=True,
              help="Lines that are not UTF-8: skip and report, or index with U+FFFD replacement.")
@click.option("--key-format", type=click.Choice(["word", "token_id"]), default="word", show_default=True,
              help="rank_features WORD keys, or token ids for sparse_vector (SEISMIC).")
@click.option("--prune", default="none", show_default=True,
              help="neural-search prune type: none, top_k:K, max_ratio:R, alpha_mass:A, abs_value:T.")
@click.option("--long-text", type=click.Choice(["truncate", "split"]), default="truncate", show_default=True,
              help="Texts over 512 tokens: truncate (as OpenSearch does) or split into nested passages.")
@click.option("--batch-size", type=int, default=32, show_default=True,
              help="Texts per forward pass of padded batching (packed batching is budgeted in tokens).")
@click.option("--batching", type=click.Choice(["auto", "packed", "padded"]), default="auto", show_default=True,
              help="packed: documents concatenated without padding into batches of --max-batch-tokens real tokens, "
                   "weights cast once, vectors sparsified on the device, several batches in flight (BERT, "
                   "DistilBERT, RoBERTa, XLM-R); padded: the length-sorted, padded reference path; auto: packed "
                   "where the model's layout allows it.")
@click.option("--max-batch-tokens", type=int, default=None,
              help="Packed batching: real tokens per forward pass [default: 65536 on a GPU, 4096 on CPU].")
@click.option("--window-docs", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Packed batching: documents cut into batches together, sorted by length within (a GPU's graph "
                   "shapes and attention, a CPU's padded attention, waste least on similar lengths). A chunk is done "
                   "when the last batch holding one of its documents is, so smaller windows fill and drain the "
                   "job's pipeline sooner.")
@click.option("--build-workers", type=int, default=None,
              help="--backend ndjson (with --long-text truncate): processes that build and serialise documents, so "
                   "the job's main thread only reads and hands chunks on [default: up to 8 beside a GPU (CPU cores - "
                   "4), 0 on CPU].")
@click.option("--encoder-process", is_flag=True,
              help="Encode in a process of its own even on one device (as every device does with several), so the "
                   "thread that launches the GPU's work does not share the job's interpreter with reading, building "
                   "and writing. Each encoder process streams the chunks it is sent through its own device pipeline (the "
                   "next ones tokenized while the device works, batches cut across chunks), as the job does in "
                   "process; the summary's encoder section gives its device thread's times.")
@click.option("--compile", "compile_", type=click.Choice(["body", "block", "norm", "graphs"]), is_flag=False,
              flag_value="body", default=None,
              help="Packed batching: torch.compile into fused kernels: body (the whole transformer, one compiled "
                   "call per batch; what --compile alone means), block (each layer after its attention), norm "
                   "(each residual + LayerNorm step) or graphs (the body captured as a CUDA graph per batch shape and "
                   "replayed, batches padded to a handful of shapes, under 2 % padding at 64k tokens: the host launches one "
                   "graph per batch). The first batches pay the compilation, seconds; it falls back to eager kernels "
                   "if compiling fails [default: graphs for bf16 / fp16 on a GPU, off in fp32 and on CPU].")
@click.option("--no-compile", is_flag=True, help="Packed batching: never torch.compile (eager kernels only).")
@click.option("--chunk-docs", type=int, default=256, show_default=True,
              help="Documents per chunk: what is encoded, written and checkpointed together (a checkpoint fsyncs "
                   "the output; while chunks wait for the writer, at most one per --checkpoint-interval).")
@click.option("--checkpoint-interval", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Seconds between checkpoints while chunks wait for the writer (0: one after every chunk). A "
                   "resume rewinds to the last one, so a longer interval only means more work redone after a crash.")
@click.option("--bulk-concurrency", type=click.IntRange(1, 8), default=None,
              help="Cluster backends: chunks written at once (concurrent _bulk requests, each chunk checkpointed "
                   "in order once acknowledged) [default: 2; local and ndjson write one at a time].")
@click.option("--device", default=None,
              help="cpu, cuda (every GPU: one encoder process each), cuda:1, or a list such as cuda:0,cuda:2 "
                   "[default: every GPU when present, else cpu].")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto", show_default=True,
              help="auto: on CUDA fp16 with packed batching (bf16 for --batching padded; fp32 on cards "
                   "without tensor cores or bf16), else fp32 (CPUs without AVX512-BF16/AMX emulate bf16 and are "
                   "slower in it). Neither half precision is equal output. fp16 has 3 more significant bits than "
                   "bf16 at the same tensor-core rate: on an H200 (BERT-base shape) 17,838 docs/s against "
                   "17,306-17,359 in bf16, active-set Jaccard to fp32 0.995 against 0.984; it overflows past "
                   "65,504, and packed batching encodes such a batch again in bf16 (counted in the summary's "
                   "encoder.overflow_reruns; once most batches overflow, bf16 encodes them all). bf16 keeps "
                   "fp32's range; on CUDA its packed batches run the MLM head in fp16. With --encoder-runtime "
                   "openvino, bf16 compiles the body at bf16 too (the fastest encoder on CPUs with "
                   "AVX512-BF16/AMX).")
@click.option("--text-field", default="text", show_default=True, help="Text field of the indexed documents.")
@click.option("--sparse-field", default="sparse_embedding", show_default=True, help="Sparse field of the documents.")
@click.option("--limit", type=int, default=None,
              help="Stop after this many corpus lines/rows (--resume with a larger one, or none, reads on).")
@click.option("--threads", type=int, default=None, help="CPU threads for torch.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--encoder-runtime", type=click.Choice(["torch", "onnx", "onnx-int8", "openvino"]), default="torch",
              show_default=True,
              help="Document encoder: torch (any device) or the transformer body compiled for CPU: onnx (ONNX Runtime, "
                   "fused fp32, same vectors), onnx-int8 (int8 body), openvino (OpenVINO f32, same vectors; fastest "
                   "at BERT-base size here; with --precision bf16 its bf16 kernels). Needs pip install "
                   "'opensearch-lsr[onnx]' or '[openvino]'; the export is cached in <model>/onnx-lsr/.")
@click.option("--engine", type=click.Choice(["single", "ray"]), default="single", show_default=True,
              help="single: this process (checkpointed); ray: Ray Data, a pool of encoder actors writing from "
                   "the workers (blocks of --chunk-docs records; needs the 'ray' extra).")
@click.option("--workers", type=int, default=1, show_default=True, help="--engine ray: encoder actors.")
@click.option("--address", default=None,
              help="--engine ray: an existing Ray cluster (auto, ray://host:10001) [default: start a local one].")
@click.option("--num-gpus-per-worker", type=float, default=0.0, show_default=True,
              help="--engine ray: GPUs per encoder actor (0: encode on CPU).")
@click.option("--cpus-per-worker", type=float, default=1.0, show_default=True,
              help="--engine ray: CPUs Ray reserves per actor (also its torch threads unless --threads).")
@click.option("--calls-per-worker", type=int, default=2, show_default=True,
              help="--engine ray: blocks an actor takes at once (with 2, one is built and written while the next "
                   "is encoded).")
@connection_options("opensearch")
def index_command(corpus, model, backend, index_name, work_dir, resume, restart, corpus_format, id_field,
                  corpus_text_field, corpus_title_field, invalid_utf8, key_format, prune, long_text, batch_size,
                  chunk_docs, checkpoint_interval, bulk_concurrency, batching, max_batch_tokens, window_docs,
                  build_workers, encoder_process,
                  compile_,
                  no_compile, device, precision,
                  text_field, sparse_field, limit, threads,
                  no_progress, encoder_runtime, engine,
                  workers, address, num_gpus_per_worker, cpus_per_worker, calls_per_worker, **conn):
    """Encode a corpus with the model exactly as the exported OpenSearch model would, and bulk-load it.

    \b
    Encoding: SPLADE max-pooled log(1+relu) weights, special tokens zeroed, positive finite
    weights only, neural-search --prune semantics, 512-token cap (--long-text). The corpus is
    streamed (memory stays flat); encoding and uploading overlap (a bounded queue).
    \b
    Bad input is never dropped silently; each case is counted in the summary and listed with
    file:line in <work-dir>/skipped.jsonl:
      malformed      not a JSON object / wrong TSV columns / non-string fields: skipped
      invalid_utf8   skipped, or indexed with U+FFFD under --invalid-utf8 replace
      empty_text     empty title and text: skipped
      duplicate_id   the first occurrence wins, later ones skipped (blank lines are only counted)
    Documents without an id get sha1(text) as _id.
    \b
    OpenSearch: _bulk via opensearch-py streaming_bulk; 429 and 5xx are retried with exponential
    backoff; documents the cluster rejects (4xx) go to <work-dir>/dead_letter.jsonl with the
    reason; a cluster that stays down stops the job, which --resume continues.
    \b
    Resuming: <work-dir>/checkpoint.json is written after each acknowledged chunk; _ids are
    deterministic, so after any interruption (kill -9 included) --resume neither loses nor
    duplicates a document. A resumed run keeps what decides the documents (model, key format, prune,
    long-text policy, fields, corpus format) and is refused otherwise; speed settings may change.
    Prints a JSON summary (indexed, skipped by reason, dead-lettered, throughput, peak memory),
    also saved as <work-dir>/summary.json.
    \b
    --engine ray: Ray Data reads the corpus in blocks of --chunk-docs records, --workers actors
    (one model load each; --num-gpus-per-worker GPUs) encode and write from the workers (the local
    backend through one writer, the driver). Same _ids, reports and dead letters; a killed actor is
    restarted and its block retried (writes are idempotent); <work-dir>/ray_blocks.jsonl lists the
    completed blocks, which --resume skips.
    """
    from ..encoding.job import IndexJobConfig, run_index_job
    from ..engines import client_factory

    if resume and restart:
        fail("--resume and --restart contradict each other: pick one")
    refuse_cluster_options(backend, offline=("local", "ndjson"))
    if threads:
        import torch

        torch.set_num_threads(threads)
    with user_errors(first_line=True):
        config = IndexJobConfig(corpus=corpus, model=model, backend=backend, index=index_name, work_dir=work_dir,
                                corpus_format=corpus_format, id_field=id_field, corpus_text_field=corpus_text_field,
                                corpus_title_field=corpus_title_field, invalid_utf8=invalid_utf8,
                                key_format=key_format, prune=prune, long_text=long_text, batch_size=batch_size,
                                chunk_docs=chunk_docs, checkpoint_interval_s=checkpoint_interval,
                                device=device, precision=precision, text_field=text_field, sparse_field=sparse_field,
                                limit=limit, threads=threads,
                                encoder_runtime=encoder_runtime, batching=batching,
                                max_batch_tokens=max_batch_tokens, compile=compile_setting(compile_, no_compile),
                                window_docs=window_docs, build_workers=build_workers,
                                bulk_concurrency=bulk_concurrency, encoder_process=encoder_process)
        factory = client_factory(backend, **conn) if backend == "opensearch" else None
        if backend == "opensearch" and not conn.get("url"):
            fail("the opensearch backend needs --url (or OPENSEARCH_URL)")
        if engine == "ray":
            if bulk_concurrency is not None:
                fail("--bulk-concurrency applies to --engine single (with ray, the --workers actors write at once)")
            if encoder_process:
                fail("--encoder-process applies to --engine single (with ray, every actor is a process of its own)")
            if build_workers is not None:
                fail("--build-workers applies to --engine single (with ray, every actor builds its own documents)")
            if typed_options(click.get_current_context(), ["checkpoint_interval"]):
                fail("--checkpoint-interval applies to --engine single (with ray, each block is recorded once written)")
            from ..encoding.ray_job import run_ray_index_job

            options = ray_options(engine, {"workers": workers, "address": address, "calls_per_worker": calls_per_worker,
                                           "num_gpus_per_worker": num_gpus_per_worker,
                                           "cpus_per_worker": cpus_per_worker})
            # Ray forwards its workers' and raylet's lines ("(raylet) A worker died ...") to the driver's sys.stdout
            # (ray._private.worker.print_to_stdstream): they go to stderr, so stdout carries the summary only
            with contextlib.redirect_stdout(sys.stderr):
                summary = run_ray_index_job(config, options, resume=resume, restart=restart, client_factory=factory,
                                            progress=not no_progress)
        else:
            ray_options(engine, {})  # refuses Ray options typed without --engine ray
            summary = run_index_job(config, resume=resume, restart=restart, client_factory=factory,
                                    progress=not no_progress)
    echo_json(summary)
