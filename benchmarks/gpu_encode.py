"""Batch encoding on a GPU: the padded reference against packed batching, the card's peak measured in the same run.

    python benchmarks/gpu_encode.py --out runs/gpu_encode.json [--md benchmarks/results/gpu_encode.md]

On a CUDA machine it measures, in one run:
* the card's bf16 matmul peak (8192^3, the ceiling every % below refers to);
* for a BERT-base-shaped masked LM (12 x 768, random weights, the Korean target vocabulary, decoder bias
  shifted so documents keep about 200 active dimensions, like a trained model) and for SPLADE-tiny, over the
  Korean corpus repeated ``--repeat`` times: docs/s, real tokens/s, model TFLOP/s and % of the peak for the
  padded reference (bf16 autocast, ``--batch-size`` texts per pass in the job's 256-document chunks) and
  for packed batching (its default, fp16 on CUDA; bf16 and fp32), the padded-token share of each, stage
  times from CUDA events, the GPU-busy share (union of kernel intervals from the torch profiler over the
  wall time; beside it where the launching thread's other time went: waiting for its next batch, for
  results, the garbage collector's pauses), host synchronisations per batch
  (``torch.cuda.set_sync_debug_mode`` warnings, plus the one event wait per batch), peak GPU memory and
  docs/s at 16k / 32k / 64k token budgets, exactness of packed fp32 against the reference fp32 and of bf16
  and fp16 against fp32, and ``lsr-os index --backend ndjson`` end to end with both batchings (docs/s;
  encode / build / write split);
* SPLADE-tiny's dev MRR@10 with bf16, fp16 and fp32 documents (``--mrr-dataset``, msmarco-en).
Without CUDA the same code runs on CPU with a 2-layer model and a small corpus (``--quick`` is implied),
so the test suite exercises it. Results: JSON (``--out``) and a markdown table (``--md``), each with the
command, machine, commit and date.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import gpu_targets  # noqa: E402 - benchmarks/gpu_targets.py: the targets judged from this script's result
import harness  # noqa: E402 - benchmarks/harness.py: machine, commit, results files

from opensearch_lsr.encoding.encoder import SparseDocumentEncoder  # noqa: E402
from opensearch_lsr.encoding.packed import Segments, flops_per_token  # noqa: E402
from opensearch_lsr.encoding.packed_runner import capturing_every_shape  # noqa: E402
from opensearch_lsr.encoding.precision import cpu_has_native_bf16  # noqa: E402
from opensearch_lsr.encoding.token_batches import token_budget_batches  # noqa: E402
from opensearch_lsr.encoding.tokenizer_process import default_tokenizer_threads  # noqa: E402


# ---------------------------------------------------------------------------------------------- basics
def machine() -> dict:
    """The harness's machine description, plus transformers' version and the commit (:func:`harness.git_commit`)."""
    import transformers

    return {**harness.machine(), "transformers": transformers.__version__, "commit": harness.git_commit()}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_tflops(device: torch.device, n: int) -> float:
    """bf16 (CUDA) / fp32 (CPU) matmul rate of an ``n^3`` product: mean of 10 after 3 warm-ups."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    return 2 * n ** 3 * 10 / (time.perf_counter() - t0) / 1e12


def load_corpus(path: Path, repeat: int, limit: int | None) -> tuple[list[str], list[str]]:
    ids, texts = [], []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            ids.append(str(row["_id"]))
            texts.append(row["text"])
    if limit:
        ids, texts = ids[:limit], texts[:limit]
    return [f"{i}-r{k}" for k in range(repeat) for i in ids], texts * repeat


def random_mlm(tokenizer_dir: Path, out: Path, sample: list[str], device: torch.device, *, layers: int,
               hidden: int, heads: int, intermediate: int, target_nnz: int = 200) -> Path:
    """A randomly initialised BertForMaskedLM on ``tokenizer_dir``'s vocabulary whose decoder bias is
    shifted so that a document keeps about ``target_nnz`` positive pooled logits (as a trained SPLADE does)."""
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=intermediate, max_position_embeddings=512, tie_word_embeddings=True)
    model = BertForMaskedLM(cfg).eval()
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    enc = SparseDocumentEncoder(out, device=str(device), precision="fp32", batching="padded")
    pooled = enc.encode_pooled_logits(sample[:128])
    kth = pooled.sort(dim=1, descending=True).values[:, target_nnz]
    shift = float(kth.median())
    with torch.no_grad():
        model.cls.predictions.bias -= shift
        model.cls.predictions.decoder.bias = model.cls.predictions.bias
    model.save_pretrained(str(out))
    return out


def named_model(name: str, data: Path, sample: list[str], work: Path, device: torch.device) -> str:
    """The model directory ``name`` stands for in the precision scripts: ``bert-base-random`` (this benchmark's
    BERT-base shape, built in ``work`` with its bias shifted on ``sample``), ``splade-tiny`` (the installed one), or
    ``name`` itself (a directory)."""
    from opensearch_lsr.resources import splade_tiny_path

    if name == "bert-base-random":
        return str(random_mlm(data / "kobigbird-bert-base-tokenizer", work / "bert", sample, device, layers=12,
                              hidden=768, heads=12, intermediate=3072))
    return str(splade_tiny_path()) if name == "splade-tiny" else name


def padded_share(lengths: np.ndarray, chunk: int, batch_size: int) -> float:
    """Padded share of the reference path's computed tokens: 256-document chunks sorted by length, then
    ``batch_size`` texts per pass padded to the longest."""
    real = padded = 0
    for s in range(0, len(lengths), chunk):
        part = np.sort(lengths[s:s + chunk])
        for b in range(0, len(part), batch_size):
            batch = part[b:b + batch_size]
            real += int(batch.sum())
            padded += int(len(batch) * batch.max())
    return 1.0 - real / padded


def graph_bucket_census(tokens, max_batch_tokens: int, max_doc: int, window_docs: int = 4096) -> dict:
    """Batches, distinct graph buckets and padding-token share of ``compile="graphs"`` over ``tokens``, as the
    runner cuts them (:func:`~opensearch_lsr.encoding.packed_runner.ready_batches`, windows of ``window_docs``);
    host-only, so every run states it for the card's budgets."""
    from opensearch_lsr.encoding.graph_buckets import graph_key
    from opensearch_lsr.encoding.packed_runner import FLUSH, ready_batches

    n = len(tokens.lengths)
    windows = iter([[(index, tokens.select(index))]
                    for index in (np.arange(s, min(s + window_docs, n)) for s in range(0, n, window_docs))])
    shapes = [graph_key(b.lengths, max_doc) for keys, b in ready_batches(lambda: next(windows, None), max_batch_tokens)
              if keys is not FLUSH]
    padded = sum(t for t, _, _ in shapes)
    return {"batches": len(shapes), "buckets": len(set(shapes)),
            "padding_share": round(1 - int(tokens.lengths.sum()) / max(1, padded), 4)}


# ---------------------------------------------------------------------------------------------- measurements
def timed(device: torch.device, fn, *args):
    sync(device)
    t0 = time.perf_counter()
    out = fn(*args)
    sync(device)
    return out, time.perf_counter() - t0


def encode_in_chunks(enc: SparseDocumentEncoder, texts: list[str], chunk: int = 256):
    out = []
    for s in range(0, len(texts), chunk):
        out.extend(enc.encode(texts[s:s + chunk]))
    return out


@contextlib.contextmanager
def collector_pauses():
    """Python's garbage collector while the block runs: a dict filled on exit with the collections per
    generation and their pauses (every thread stops while it runs)."""
    out: dict = {}
    starts: list[float] = []
    pauses: list[tuple[int, float]] = []

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            starts.append(time.perf_counter())
        elif starts:
            pauses.append((info["generation"], time.perf_counter() - starts.pop()))

    gc.callbacks.append(callback)
    try:
        yield out
    finally:
        gc.callbacks.remove(callback)
        out.update({"collections": [sum(g == k for g, _ in pauses) for k in range(3)],
                    "total_ms": round(1e3 * sum(p for _, p in pauses), 2),
                    "max_ms": round(1e3 * max((p for _, p in pauses), default=0.0), 2)})


def gpu_busy_share(enc: SparseDocumentEncoder, texts: list[str]) -> dict | None:
    """Union of CUDA kernel intervals (torch profiler) over the wall time of one ``encode`` of ``texts``,
    the host's launch time per batch, and the kernels that take the most device time."""
    if enc.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]):  # dynamo recompiles once when the profiler turns on
        enc.encode(texts[:2048])
    sync(enc.device)
    stats = enc.runner.stats
    batches0, stages0, waits0 = stats.batches, dict(stats.by_stage), stats.source_waits_over_1ms
    with profile(activities=[ProfilerActivity.CUDA]) as prof, collector_pauses() as gc_pauses:
        t0 = time.perf_counter()
        enc.encode(texts)
        sync(enc.device)
        wall = time.perf_counter() - t0
    batches = max(1, stats.batches - batches0)
    host = {k: round(stats.by_stage[k] - stages0.get(k, 0.0), 4) for k in stats.by_stage}
    events = [e for e in prof.events() if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start]
    spans = sorted((e.time_range.start, e.time_range.end) for e in events)
    busy, cur_s, cur_e, gaps = 0.0, None, None, []
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
                gaps.append(s - cur_e)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    extent = (cur_e - spans[0][0]) / 1e6 if spans else 0.0
    by_name: dict[str, float] = {}
    for e in events:
        by_name[e.name[:90]] = by_name.get(e.name[:90], 0.0) + (e.time_range.end - e.time_range.start)
    total = sum(by_name.values()) or 1.0
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    runtime: dict[str, list[float]] = {}  # the host's CUDA runtime calls (launches, copies, waits, pinned allocs)
    for e in prof.events():
        if e.device_type.name == "CPU" and e.name.startswith("cuda"):
            row = runtime.setdefault(e.name, [0, 0.0])
            row[0] += 1
            row[1] += e.time_range.end - e.time_range.start
    return {"busy_share": round(busy / 1e6 / wall, 4),  # profiler times are in microseconds
            "wall_s": round(wall, 3), "batches": batches,
            # where the idle share sits: before the first / after the last kernel, or between kernels
            "idle_outside_kernels_s": round(wall - extent, 4), "idle_between_kernels_s": round(sum(gaps) / 1e6, 4),
            "gaps_over_1ms": sum(g > 1e3 for g in gaps), "largest_gap_ms": round(max(gaps, default=0.0) / 1e3, 3),
            "host_launch_ms_per_batch": round(1e3 * host["launch"] / batches, 3),
            # what the launching thread did besides launching (seconds in all): waiting for its next batch
            # (tokenizing, cutting a window), for results, splitting them; and the garbage collector's pauses
            "host_stage_s": host, "source_waits_over_1ms": stats.source_waits_over_1ms - waits0,
            "gc_pauses": gc_pauses,
            "kernel_ms_per_batch": round(total / 1e3 / batches, 3),
            "top_kernels": [{"name": n, "ms_per_batch": round(t / 1e3 / batches, 3), "share": round(t / total, 4)}
                            for n, t in top],
            "runtime_calls": [{"name": n, "per_batch": round(c / batches, 2), "ms_per_batch": round(t / 1e3 / batches, 3)}
                              for n, (c, t) in sorted(runtime.items(), key=lambda kv: -kv[1][1])[:8]],
            "host_ops": host_ops(enc, texts[:4096])}


def host_ops(enc: SparseDocumentEncoder, texts: list[str]) -> list[dict]:
    """The launching thread's costliest operators by their own host time (torch profiler, CPU activity) over one
    ``encode`` of ``texts``, each with the toolkit's lines that called it (``where``, innermost first): where a
    launch of several ms per batch goes."""
    from torch.profiler import ProfilerActivity, profile

    before = enc.runner.stats.batches
    verbose = torch._C._profiler._ExperimentalConfig(verbose=True)  # with_stack records Python frames only with it
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True,
                 experimental_config=verbose) as prof:
        enc.encode(texts)
        sync(enc.device)
    batches = max(1, enc.runner.stats.batches - before)
    ops = [a for a in prof.key_averages(group_by_stack_n=12)  # operators and runtime calls, not Python frames
           if ".py(" not in a.key and not a.key.startswith("<built-in")]
    rows = sorted(ops, key=lambda a: -a.self_cpu_time_total)[:15]
    return [{"name": a.key[:80], "per_batch": round(a.count / batches, 2),
             "self_ms_per_batch": round(a.self_cpu_time_total / 1e3 / batches, 3),
             "where": [frame.split("opensearch_lsr/", 1)[1] for frame in (a.stack or [])
                       if "opensearch_lsr/" in frame][:3]} for a in rows]


def syncs_per_batch(enc: SparseDocumentEncoder, texts: list[str]) -> float | None:
    """Synchronising calls the sync debug mode reports per batch, plus the one event wait per batch."""
    if enc.device.type != "cuda":
        return None
    before = enc.runner.stats.batches
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            enc.encode(texts)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    batches = enc.runner.stats.batches - before
    reported = sum("synchroniz" in str(w.message).lower() for w in caught)
    return reported / max(1, batches) + 1.0


def stage_times(enc: SparseDocumentEncoder, texts: list[str], max_batches: int = 8) -> dict:
    """Per-batch device time of each stage (CUDA events; host clocks on CPU), ms, over a few batches."""
    from opensearch_lsr.encoding.device_sparse import sparsify

    runner, model, device = enc.runner, enc.runner.model, enc.device
    tokens = enc.once_tokenizer(texts)
    batches = token_budget_batches(tokens.lengths, runner.max_batch_tokens)[:max_batches]
    totals = {"copy_in": 0.0, "body": 0.0, "head_max": 0.0, "sparsify_copy_out": 0.0}

    def mark():
        if device.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def span(a, b):
        return a.elapsed_time(b) if device.type == "cuda" else (b - a) * 1e3

    with torch.inference_mode():
        for b in batches:
            batch = tokens.select(b)
            m0 = mark()
            ids, seg = Segments.packed_batch(batch.ids, batch.lengths, device, pin=device.type == "cuda")
            m1 = mark()
            h = model.hidden(ids, seg)
            m2 = mark()
            w = runner.activate(model.head_max(h, seg))
            m3 = mark()
            sparsify(w).result()
            m4 = mark()
            sync(device)
            for key, (a, c) in zip(totals, ((m0, m1), (m1, m2), (m2, m3), (m3, m4))):
                totals[key] += span(a, c)
    n = max(1, len(batches))
    return {k: round(v / n, 3) for k, v in totals.items()}


#: |fp32 pooled logit| under which a small rounding error can flip whether a document keeps the id
NEAR_ZERO = 0.01


def near_zero_per_doc(encoder, texts: list[str]) -> float:
    """Mean count per document of ``encoder``'s pooled logits within :data:`NEAR_ZERO` of zero: how many ids a
    lower precision's rounding can flip, which sets how far its active sets can lie from fp32's."""
    pooled = encoder.encode_pooled_logits(texts)
    return round(float((pooled.abs() < NEAR_ZERO).sum(1).float().mean()), 2)


def exactness(a: list, b: list) -> dict:
    """Id sets, max |dw| on shared ids, active-set Jaccard between two lists of vectors, and the largest weight of
    an id that only one side has (``max_unshared_weight``: how close to zero the disagreements are)."""
    same_ids, max_dw, max_unshared, jac = 0, 0.0, 0.0, []
    for x, y in zip(a, b):
        if np.array_equal(x.ids, y.ids):
            same_ids += 1
            if len(x.ids):
                max_dw = max(max_dw, float(np.abs(x.weights - y.weights).max()))
        else:
            common = np.intersect1d(x.ids, y.ids)
            if len(common):
                wx = x.weights[np.searchsorted(x.ids, common)]
                wy = y.weights[np.searchsorted(y.ids, common)]
                max_dw = max(max_dw, float(np.abs(wx - wy).max()))
            for v in (x, y):
                only = ~np.isin(v.ids, common)
                if only.any():
                    max_unshared = max(max_unshared, float(v.weights[only].max()))
        union = len(np.union1d(x.ids, y.ids))
        jac.append(len(np.intersect1d(x.ids, y.ids)) / union if union else 1.0)
    return {"docs": len(a), "identical_id_sets": same_ids, "max_abs_dw": max_dw, "max_unshared_weight": max_unshared,
            "jaccard_mean": float(np.mean(jac)), "jaccard_min": float(np.min(jac))}


def dev_set(dataset: Path, limit: int | None = None) -> tuple[list[dict], dict[str, str], dict[str, set[str]]]:
    """A BEIR folder's corpus (its first ``limit`` documents), the dev queries judged on those documents, and
    their judgements (query id -> relevant document ids)."""
    corpus = [json.loads(line) for line in open(dataset / "corpus.jsonl", encoding="utf-8")][:limit]
    kept = {d["_id"] for d in corpus}
    qrels: dict[str, set[str]] = {}
    for line in open(dataset / "qrels" / "dev.tsv", encoding="utf-8"):
        parts = line.split("\t")
        if len(parts) >= 3 and parts[2].strip() not in ("score", "0") and parts[1] in kept:
            qrels.setdefault(parts[0], set()).add(parts[1])
    queries = {q["_id"]: q["text"] for q in map(json.loads, open(dataset / "queries.dev.jsonl", encoding="utf-8"))
               if q["_id"] in qrels}
    return corpus, queries, qrels


def dev_mrr(queries: list, documents: list, qids: list[str], doc_ids: list[str], qrels: dict[str, set[str]],
            vocab: int) -> float:
    """MRR@10 of exact dot-product retrieval: ``queries`` / ``documents`` are sparse vectors in ``qids`` /
    ``doc_ids`` order."""
    import scipy.sparse as sp

    def matrix(vectors):
        indptr = np.concatenate([[0], np.cumsum([len(v.ids) for v in vectors])])
        return sp.csr_matrix((np.concatenate([v.weights for v in vectors]), np.concatenate([v.ids for v in vectors]),
                              indptr), shape=(len(vectors), vocab))

    scores = (matrix(queries) @ matrix(documents).T).toarray()
    rr = []
    for row, q in enumerate(qids):
        top = np.argsort(-scores[row], kind="stable")[:10]
        rank = next((r for r, j in enumerate(top) if doc_ids[j] in qrels[q]), None)
        rr.append(0.0 if rank is None else 1.0 / (rank + 1))
    return round(float(np.mean(rr)), 4)


def mrr_at_10(dataset: Path, device: torch.device, model: str, limit: int | None = None) -> dict:
    """Dev MRR@10 with documents encoded in bf16, fp16 (CUDA only) and fp32 (queries fp32), exact dot-product
    retrieval (``limit``: the first documents only, and the queries judged on them)."""
    corpus, queries, qrels = dev_set(dataset, limit)
    qids, doc_ids = list(queries), [d["_id"] for d in corpus]
    q_enc = SparseDocumentEncoder(model, device=str(device), precision="fp32", batching="packed")
    query_vectors = q_enc.encode([queries[q] for q in qids])
    out = {}
    for precision in ("fp32", "bf16", "fp16") if device.type == "cuda" else ("fp32", "bf16"):
        enc = SparseDocumentEncoder(model, device=str(device), precision=precision, batching="packed")
        out[precision] = dev_mrr(query_vectors, enc.encode([d["text"] for d in corpus]), qids, doc_ids, qrels,
                                 enc.vocab_size)
    out["queries"] = len(qids)
    return out


def ndjson_end_to_end(model: str, corpus_file: Path, device: torch.device, batching: str, work: Path,
                      extra: tuple[str, ...] = (), root: Path = ROOT) -> dict:
    """``lsr-os index --backend ndjson`` in a subprocess (the package of the checkout ``root``); its summary's
    throughput and time split."""
    out = work / f"ndjson-{batching}{len(extra)}"
    cmd = [sys.executable, "-m", "opensearch_lsr.cli", "index", "--corpus", str(corpus_file), "--model", model,
           "--backend", "ndjson", "--index", str(out), "--restart", "--no-progress", "--device", str(device),
           "--batching", batching, *extra]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    run = summary["this_run"]
    graphs = summary["encoder"].get("cuda_graphs")
    if graphs and graphs["capture_s"] < run["elapsed_s"]:
        # buckets the warm-up did not capture are captured during the job (the device thread stops meanwhile):
        # the job's pace once every bucket is captured, approximately
        graphs["docs_per_s_without_capture"] = round(run["indexed"] / (run["elapsed_s"] - graphs["capture_s"]), 1)
    return {"docs": run["indexed"], "docs_per_s": run["docs_per_s"], "elapsed_s": run["elapsed_s"],
            "encode_wait_s": run["encode_s"], "build_s": run.get("build_s"), "write_s": run["write_s"],
            # the rest of the main thread's and the writer thread's time (IndexJob.timing)
            **{k: run[k] for k in ("duplicates_s", "queue_wait_s", "documents_wait_s", "checkpoint_s") if k in run},
            "setup_s": run.get("setup_s"), "device_thread_s": summary["encoder"].get("device_thread_s"),
            "source_waits_over_1ms": summary["encoder"].get("source_waits_over_1ms"),
            **({"cuda_graphs": graphs} if graphs else {}),
            "bytes": sum(p.stat().st_size for p in out.glob("*.ndjson"))}


# ---------------------------------------------------------------------------------------------- one model
def bench_model(name: str, model: str, ids: list[str], texts: list[str], device: torch.device, peak: float,
                args: argparse.Namespace, work: Path, section, models: list) -> dict:
    """Every section of one model; ``res`` joins ``models`` first, so each section's save keeps what ran."""
    res: dict = {"model": name}
    models.append(res)
    section(res, "setup", lambda: _setup(res, model, texts, device, args))
    subset = texts[:args.subset]
    ref = SparseDocumentEncoder(model, device=str(device), batching="padded", batch_size=args.batch_size)
    new = SparseDocumentEncoder(model, device=str(device), batching="packed")  # every default, as lsr-os index
    res["max_batch_tokens"] = default_budget = new.runner.max_batch_tokens  # the device's default (64k on CUDA)
    fpt, tokens = res["flops_per_token"], res["real_tokens"]
    default_compiled = getattr(new.runner.model, "compiled", False)  # what --compile's default chose here
    default_scope = getattr(new.runner.model, "compile_scope", None)

    def rate(seconds: float) -> dict:
        tflops = tokens * fpt / seconds / 1e12
        return {"docs_per_s": round(len(texts) / seconds, 1), "tokens_per_s": round(tokens / seconds),
                "model_tflops": round(tflops, 2), "pct_of_peak": round(100 * tflops / peak, 2)}

    def reference():
        encode_in_chunks(ref, texts[:512])
        _, t = timed(device, encode_in_chunks, ref, texts)
        res["reference"] = {"precision": ref.precision, **rate(t), "padded_share": round(res["padded_share_ref"], 4)}

    def packed():
        # warm up on two batches or more, as the other rows: the compiled body turns dynamic on its second batch
        # shape (one recompile), and 512 texts are one 64k-token batch (run 14 timed that recompile: 1,822 docs/s)
        # CUDA graphs (the default on CUDA) are captured once per bucket: warmed up on every batch, the clock times
        # replays, as the packed_graphs row always did
        with capturing_every_shape(new.runner):  # as the encoder's own warm_up
            new.encode(texts if default_scope == "graphs" else texts[:2048])
        new.runner.reset_stats()
        _, t = timed(device, new.encode, texts)
        graphs = getattr(new.runner.model, "graph_replay", None)
        res["packed"] = {**({"cuda_graphs": dataclasses.asdict(graphs.stats)} if graphs is not None else {}),
                         "precision": new.precision, "attention": "varlen" if new.runner.model.use_varlen
                         else "padded-sdpa", "compiled": default_compiled,
                         "compile_scope": getattr(new.runner.model, "compile_scope", None),
                         "head_precision": str(getattr(new.runner.model, "head_dtype", "")).removeprefix("torch."),
                         **rate(t), "padded_share": 0.0}
        if "reference" in res:
            res["speedup_packed_over_reference"] = round(res["packed"]["docs_per_s"] / res["reference"]["docs_per_s"],
                                                         2)

    def variant(key: str, compile, tokenizer: tuple[int, int | None] | None = None, word_cache: int | None = None):
        """The packed path with another ``compile`` setting, another tokenizer layout (processes, threads in
        all) or another word cache size: rate, distance to the default, GPU profile."""
        enc = SparseDocumentEncoder(model, device=str(device), batching="packed", compile=compile)
        if tokenizer is not None:
            enc.tokenizer_processes, enc.tokenizer_threads = tokenizer
        if word_cache is not None:
            enc.tokenizer_word_cache = word_cache
        # CUDA graphs are captured once per bucket: the warm-up sees every batch, so the clock times replays
        with capturing_every_shape(enc.runner):
            _, warm = timed(device, enc.encode, texts if compile == "graphs" else texts[:2048])
        if enc.runner is not None:  # cuda_graphs below: what the timed encode captured (none) and replayed
            enc.runner.reset_stats()
        _, t = timed(device, enc.encode, texts)
        row = res[key] = {"precision": enc.precision, "compiled": getattr(enc.runner.model, "compiled", False),
                          "compile_scope": getattr(enc.runner.model, "compile_scope", None), **rate(t),
                          "warm_up_s": round(warm, 1)}
        if tokenizer is not None:
            row["tokenizer"] = {"processes": tokenizer[0], "threads": tokenizer[1] or default_tokenizer_threads()}
        if word_cache is not None:
            row["word_cache"] = word_cache
        if compile == "graphs":  # buckets captured and replays in the timed encode, a failed capture (None off CUDA)
            graphs = getattr(enc.runner.model, "graph_replay", None)
            row["cuda_graphs"] = dataclasses.asdict(graphs.stats) if graphs is not None else None
        row["vs_packed"] = exactness(new.encode(subset), enc.encode(subset))  # same precision
        busy = gpu_busy_share(enc, texts)
        if busy:
            row["gpu_busy_share"] = busy["busy_share"]
            row["gpu_profile"] = {k: v for k, v in busy.items() if k not in ("top_kernels", "host_ops")}
            row["top_kernels"] = busy["top_kernels"][:6]
            row["host_ops"] = busy["host_ops"][:10]

    def packed_other():
        """The other ``--compile`` setting: eager where the default compiles, and back."""
        variant("packed_other", not default_compiled)

    def packed_block():
        """``compile="block"``: one compiled region per layer (everything after attention)."""
        variant("packed_block", "block")

    def packed_norm():
        """``compile="norm"``: each residual + LayerNorm step compiled (the default until ``"body"``)."""
        variant("packed_norm", "norm")

    def packed_graphs():
        """``compile="graphs"``; where graphs are the default (CUDA), ``compile="body"`` (``packed_body``), the
        default they replaced."""
        if default_scope == "graphs":
            variant("packed_body", "body")
            return
        variant("packed_graphs", "graphs")

    def tokenizer_processes(spec: str) -> None:
        """The default compile setting with the tokenizer's threads spread over several processes."""
        procs, _, threads = spec.partition("x")
        variant(f"packed_tok{spec}", default_compiled, (int(procs), int(threads) if threads else None))

    def word_cache():
        """The default without the tokenizer's word cache (every text through the Rust tokenizer); not run where
        the default leaves the cache off (fewer ids per chunk than ``MIN_IDS_PER_CHUNK``: the same path twice)."""
        from opensearch_lsr.encoding.word_cache import MIN_IDS_PER_CHUNK

        if res["ids_per_chunk"] < MIN_IDS_PER_CHUNK:
            res["packed_nocache"] = {"skipped": f"the cache is off by default here ({res['ids_per_chunk']} ids per "
                                                f"chunk < {MIN_IDS_PER_CHUNK})"}
            return
        variant("packed_nocache", default_compiled, word_cache=0)
        if "packed" in res:
            res["packed_over_nocache"] = round(res["packed"]["docs_per_s"] / res["packed_nocache"]["docs_per_s"], 2)

    def packed_fp32():
        enc = SparseDocumentEncoder(model, device=str(device), precision="fp32", batching="packed")
        enc.encode(texts[:256])
        _, t = timed(device, enc.encode, texts)
        res["packed_fp32"] = rate(t)

    def instrumentation():
        busy = gpu_busy_share(new, texts)  # the whole corpus: the share of the run the benchmark times
        res["gpu_busy_share"] = busy["busy_share"] if busy else None
        res["gpu_profile"] = busy
        res["host_syncs_per_batch"] = syncs_per_batch(new, subset)
        res["stage_ms_per_batch"] = stage_times(new, subset)

    def segment_max():
        out = {}
        for how in ("reduce", "gather", "rows"):
            new.runner.model.segment_max = how
            _, t = timed(device, new.encode, subset)
            out[how] = round(len(subset) / t, 1)
        new.runner.model.segment_max = "reduce" if device.type == "cuda" else "rows"
        res["segment_max_docs_per_s"] = out

    def budgets():
        out = {}
        for budget in ((16384, 32768, 65536) if device.type == "cuda" else (2048, 4096)):
            new.runner.max_batch_tokens = budget
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            _, t = timed(device, new.encode, subset)
            peak_gb = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
            out[str(budget)] = {"docs_per_s": round(len(subset) / t, 1),
                                "peak_gpu_gb": round(peak_gb, 2) if peak_gb is not None else None}
        new.runner.max_batch_tokens = default_budget
        res["token_budgets"] = out

    def exact():
        ref32 = SparseDocumentEncoder(model, device=str(device), precision="fp32", batching="padded",
                                      batch_size=args.batch_size)
        new32 = SparseDocumentEncoder(model, device=str(device), precision="fp32", batching="packed")
        a, b = ref32.encode(subset), new32.encode(subset)
        res["exact_packed_fp32_vs_reference_fp32"] = {
            **exactness(a, b), "nonfinite_reference": ref32.stats.nonfinite_dropped,
            "nonfinite_packed": new32.stats.nonfinite_dropped}
        if ref.precision != "fp32":  # the padded path's own half precision (bf16 on CUDA)
            res[f"{ref.precision}_vs_fp32_reference"] = exactness(a, ref.encode(subset))
        # the reference against itself at a quarter of the batch size (other matmul shapes, other padding): how
        # many id sets its own fp32 rounding changes, the floor under "identical id sets" above
        ref32.batch_size = max(1, args.batch_size // 4)
        res["reference_fp32_vs_itself_at_a_quarter_batch"] = exactness(a, ref32.encode(subset))
        res["fp32_logits_near_zero_per_doc"] = near_zero_per_doc(ref32, subset[:256])
        # each half precision against fp32 (fp16, 3 more significant bits than bf16 at the same tensor-core rate,
        # on CUDA only; bf16 on a CPU only where it is native: emulated, 12 passages took 40 s on 2 AVX2 cores),
        # and the speed of the one that is not the default (precision.resolve_precision)
        halves = ("bf16", "fp16") if device.type == "cuda" else ("bf16",) if cpu_has_native_bf16() else ()
        if device.type == "cpu" and not halves:
            res["bf16_vs_fp32_packed"] = {"skipped": "this CPU has no native bf16 (emulated, slower than fp32)"}
        for half in halves:
            enc = new if new.precision == half else SparseDocumentEncoder(model, device=str(device), precision=half,
                                                                           batching="packed")
            res[f"{half}_vs_fp32_packed"] = {**exactness(b, enc.encode(subset)),
                                             "nonfinite_dropped": enc.stats.nonfinite_dropped,
                                             "overflow_reruns": enc.runner.stats.overflow_reruns}
            if enc is not new and device.type == "cuda":
                with capturing_every_shape(enc.runner):
                    enc.encode(texts)
                enc.runner.reset_stats()
                _, t = timed(device, enc.encode, texts)
                res[f"packed_{half}"] = {"precision": half, "compile_scope": getattr(enc.runner.model,
                                                                                     "compile_scope", None),
                                         "head_precision": str(enc.runner.model.head_dtype).removeprefix("torch."),
                                         **rate(t)}

    def end_to_end():
        corpus_file = work / f"{name}-corpus.jsonl"
        with open(corpus_file, "w", encoding="utf-8") as fh:
            for i, t in zip(ids, texts):
                fh.write(json.dumps({"_id": i, "text": t}, ensure_ascii=False) + "\n")
        runs = {"padded": ("padded", ()), "packed": ("packed", ()),
                "packed --build-workers 0": ("packed", ("--build-workers", "0"))}
        if args.skip_padded_job:
            runs.pop("padded")
        if "ndjson_workers0" in args.skip:
            runs.pop("packed --build-workers 0")
        other = "--no-compile" if default_compiled else "--compile"
        if "packed_other" not in args.skip:
            runs[f"packed {other}"] = ("packed", (other,))
        if "packed_norm" not in args.skip:
            runs["packed --compile norm"] = ("packed", ("--compile", "norm"))
        if "packed_graphs" not in args.skip:
            other_scope = "body" if default_scope == "graphs" else "graphs"
            runs[f"packed --compile {other_scope}"] = ("packed", ("--compile", other_scope))
        if "ndjson_window" not in args.skip:  # a quarter of the default window: the pipeline fills and drains sooner
            runs["packed --window-docs 1024"] = ("packed", ("--window-docs", "1024"))
        if "ndjson_process" not in args.skip:  # the encoder in a process of its own, streaming the job's chunks
            runs["packed --encoder-process"] = ("packed", ("--encoder-process",))
        if "ndjson_checkpoint" not in args.skip:  # a checkpoint (an fsync) after every chunk, the rule before
            runs["packed --checkpoint-interval 0"] = ("packed", ("--checkpoint-interval", "0"))
        if "ndjson_chunk" not in args.skip:  # four times fewer chunks: per-chunk costs (tokenizer calls, futures)
            runs["packed --chunk-docs 1024"] = ("packed", ("--chunk-docs", "1024"))
        if "ndjson_workers4" not in args.skip:  # half the default's document workers: fewer cores taken from the
            runs["packed --build-workers 4"] = ("packed", ("--build-workers", "4"))  # tokenizer and the threads
        res["ndjson_end_to_end"] = {k: ndjson_end_to_end(model, corpus_file, device, b, work, extra)
                                    for k, (b, extra) in runs.items()}
        for key, base in (("packed", "packed"), ("packed --build-workers 0", "packed"),
                          (f"packed {other}", "packed_other"), ("packed --encoder-process", "packed"),
                          ("packed --window-docs 1024", "packed"), ("packed --checkpoint-interval 0", "packed"),
                          ("packed --chunk-docs 1024", "packed"), ("packed --build-workers 4", "packed"),
                          ("packed --compile norm", "packed_norm"), ("packed --compile graphs", "packed_graphs"),
                          ("packed --compile body", "packed_body")):
            pk = res["ndjson_end_to_end"].get(key, {})
            if "docs_per_s" in pk and base in res:
                pk["share_of_encode_only"] = round(pk["docs_per_s"] / res[base]["docs_per_s"], 3)

    plain = (("reference", reference), ("packed", packed), ("instrumentation", instrumentation),
             ("packed_other", packed_other), ("packed_block", packed_block), ("packed_norm", packed_norm),
             ("packed_graphs", packed_graphs), ("word_cache", word_cache))
    tokenizer_rows = [("tokenizer_processes", f"packed_tok{spec}", lambda spec=spec: tokenizer_processes(spec))
                      for spec in args.tokenizer_processes]
    rest = (("packed_fp32", packed_fp32), ("segment_max", segment_max), ("budgets", budgets), ("exactness", exact),
            ("ndjson", end_to_end))
    for skip_key, name, fn in [(k, k, f) for k, f in plain] + tokenizer_rows + [(k, k, f) for k, f in rest]:
        if skip_key not in args.skip:
            section(res, name, fn)
    return res


def _setup(res: dict, model: str, texts: list[str], device: torch.device, args: argparse.Namespace) -> None:
    probe = SparseDocumentEncoder(model, device="cpu", precision="fp32", batching="packed")
    once = probe.once_tokenizer
    tokens = once(texts)
    lengths, specials = tokens.lengths, len(once.prefix) + len(once.suffix)
    chunks = [c for t in texts for c in t.split(" ")]
    res.update({"chunk_repeat_share": round(1 - len(set(chunks)) / len(chunks), 3),  # the word cache's best hit share
                "ids_per_chunk": round(float(tokens.full_lengths.sum() - specials * len(texts)) / len(chunks), 2),
                "docs": len(texts), "real_tokens": int(lengths.sum()), "mean_tokens": round(float(lengths.mean()), 1),
                "flops_per_token": flops_per_token(probe.model),
                "padded_share_ref": padded_share(lengths, 256, args.batch_size),
                # compile="graphs" at the card's budgets (the CPU's default too, where it runs)
                "graph_buckets": {str(b): graph_bucket_census(tokens, b, probe.max_length)
                                  for b in sorted({16384, 32768, 65536, probe.runner.max_batch_tokens})}})


# ---------------------------------------------------------------------------------------------- report
def markdown(result: dict) -> str:
    m = result["machine"]
    lines = ["# GPU batch encoding: padded reference vs packed batching", "",
             f"Command: `{result['command']}`  ",
             f"Machine: {harness.describe(m)}; transformers {m['transformers']}; commit {m['commit']}; "
             f"{result['date']}  ",
             f"Measured peak ({result['peak_what']}): **{result['peak_tflops']:.0f} TFLOP/s**", "",
             "## Against the targets (one H100 / H200, the default half-precision encode; `gpu_targets.py`)", "",
             *gpu_targets.markdown(gpu_targets.verdicts(result)), ""]
    for r in result["models"]:
        lines += [f"## {r['model']}: {r.get('docs')} documents, {r.get('mean_tokens')} tokens each, "
                  f"{r.get('flops_per_token', 0) / 1e6:.0f} MFLOP per token", "",
                  "| path | docs/s | tokens/s | model TFLOP/s | % of peak | padded tokens |", "|---|---|---|---|---|---|"]
        tok_keys = sorted(k for k in r if k.startswith("packed_tok"))
        for key in ("reference", "packed", "packed_other", "packed_block", "packed_norm", "packed_graphs",
                    "packed_body", "packed_nocache", *tok_keys,
                    "packed_fp32", "packed_fp16", "packed_bf16", "packed_bf16_head"):
            row = r.get(key)
            if isinstance(row, dict) and "docs_per_s" in row:
                tok = row.get("tokenizer") or {}
                tok_label = f"packed ({row.get('precision')}), tokenizer {tok.get('processes')} processes x " \
                            f"{tok.get('threads')} threads in all"
                label = tok_label if key in tok_keys else {
                         "reference": f"padded reference ({row.get('precision')})",
                         "packed": f"packed ({row.get('precision')}"
                                   f"{', head ' + row['head_precision'] if row.get('head_precision') else ''}"
                                   f", {row.get('attention')}"
                                   f"{', compile=' + repr(row.get('compile_scope')) if row.get('compiled') else ''}"
                                   f", {r.get('max_batch_tokens'):,}-token batches): the default",
                         "packed_other": f"packed ({row.get('precision')}) "
                                         f"{'--compile' if row.get('compiled') else '--no-compile'}",
                         "packed_block": f"packed ({row.get('precision')}), compile=\"block\"",
                         "packed_norm": f"packed ({row.get('precision')}), compile=\"norm\"",
                         "packed_graphs": f"packed ({row.get('precision')}), compile=\"graphs\" (CUDA graphs)",
                         "packed_body": f"packed ({row.get('precision')}), compile=\"body\" (no CUDA graphs)",
                         "packed_nocache": f"packed ({row.get('precision')}), no word cache",
                         "packed_fp32": "packed (fp32)",
                         "packed_fp16": f"packed (fp16, compile={row.get('compile_scope')!r})",
                         "packed_bf16": f"packed (bf16, head {row.get('head_precision')}, "
                                        f"compile={row.get('compile_scope')!r})",
                         "packed_bf16_head": f"packed (bf16, head bf16, compile={row.get('compile_scope')!r})"}[key]
                lines.append(f"| {label} | {row['docs_per_s']:,} | {row['tokens_per_s']:,} | {row['model_tflops']} | "
                             f"{row['pct_of_peak']} | {row.get('padded_share', 0.0):.1%} |")
        lines.append("")
        facts = [("packed / reference", r.get("speedup_packed_over_reference")),
                 ("packed / packed without the word cache", r.get("packed_over_nocache")),
                 ("chunks seen before, in corpus order (the word cache's best hit share)", r.get("chunk_repeat_share")),
                 ("GPU busy share, no word cache", (r.get("packed_nocache") or {}).get("gpu_busy_share")),
                 ("ids per space-separated chunk", r.get("ids_per_chunk")),
                 ("no-word-cache row", (r.get("packed_nocache") or {}).get("skipped")),
                 ("GPU busy share (packed)", r.get("gpu_busy_share")),
                 ("GPU profile of the packed encode (whole corpus)", r.get("gpu_profile")),
                 ("GPU profile of the packed encode, the other --compile setting",
                  (r.get("packed_other") or {}).get("gpu_profile")),
                 ("GPU profile of the packed encode, compile=\"block\"",
                  (r.get("packed_block") or {}).get("gpu_profile")),
                 ("compile=\"block\" against the default (same precision)",
                  (r.get("packed_block") or {}).get("vs_packed")),
                 ("GPU profile of the packed encode, compile=\"norm\"", (r.get("packed_norm") or {}).get("gpu_profile")),
                 ("GPU profile of the packed encode, compile=\"graphs\"",
                  (r.get("packed_graphs") or {}).get("gpu_profile")),
                 ("compile=\"graphs\" against the default (same precision)",
                  (r.get("packed_graphs") or {}).get("vs_packed")),
                 ("GPU profile of the packed encode, compile=\"body\"", (r.get("packed_body") or {}).get("gpu_profile")),
                 ("compile=\"body\" against the default (same precision)", (r.get("packed_body") or {}).get("vs_packed")),
                 ("compile=\"norm\" against the default (same precision)",
                  (r.get("packed_norm") or {}).get("vs_packed")),
                 *[(f"GPU busy share, {k}", r[k].get("gpu_busy_share")) for k in tok_keys if isinstance(r[k], dict)],
                 ("host syncs per batch (packed)", r.get("host_syncs_per_batch")),
                 ("stage ms per batch (packed)", r.get("stage_ms_per_batch")),
                 ("segment max docs/s", r.get("segment_max_docs_per_s")),
                 ("token budgets", r.get("token_budgets")),
                 ("packed fp32 vs reference fp32", r.get("exact_packed_fp32_vs_reference_fp32")),
                 ("reference fp32 vs itself at a quarter of the batch size",
                  r.get("reference_fp32_vs_itself_at_a_quarter_batch")),
                 (f"fp32 pooled logits within {NEAR_ZERO} of zero per document (first 256)",
                  r.get("fp32_logits_near_zero_per_doc")),
                 ("packed bf16 vs fp32", r.get("bf16_vs_fp32_packed")),
                 ("packed fp16 vs fp32", r.get("fp16_vs_fp32_packed")),
                 ("packed bf16 with a bf16 head vs fp32", r.get("bf16_head_bf16_vs_fp32_packed")),
                 ("reference bf16 vs fp32 (the bf16 the reference path ships)", r.get("bf16_vs_fp32_reference")),
                 ("lsr-os index --backend ndjson", r.get("ndjson_end_to_end")),
                 ("dev MRR@10 (bf16 / fp16 / fp32 documents)", r.get("mrr_at_10")),
                 ("errors", r.get("errors"))]
        lines += [f"- {k}: `{json.dumps(v, ensure_ascii=False)}`" for k, v in facts if v is not None]
        lines.append("")
    return "\n".join(lines)


#: sections no target of the benchmark is read from: other compile scopes, the head's other maxima, the job without
#: document workers, dev MRR (measured once: bf16 documents give fp32's MRR@10)
NOT_TARGETS = ("packed_other", "packed_block", "packed_norm", "segment_max", "ndjson_workers0", "mrr")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON results file.")
    p.add_argument("--md", default=None, help="Markdown table file.")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="The shared data folder.")
    p.add_argument("--repeat", type=int, default=4, help="Copies of the Korean corpus.")
    p.add_argument("--subset", type=int, default=8192, help="Documents for instrumentation, budgets, exactness.")
    p.add_argument("--batch-size", type=int, default=64, help="Texts per pass of the padded reference.")
    p.add_argument("--splade-tiny", default=None, help="SPLADE-tiny dir [default: the installed one].")
    p.add_argument("--device", default=None, help="cuda or cpu [default: cuda when present].")
    p.add_argument("--quick", action="store_true", help="A small model and corpus (implied without CUDA).")
    p.add_argument("--skip-reference-model", action="store_true", help="Only SPLADE-tiny.")
    p.add_argument("--skip-splade-tiny", action="store_true", help="Only the BERT-base-shaped model.")
    p.add_argument("--skip-padded-job", action="store_true",
                   help="Leave the padded reference out of the end-to-end job runs (the slowest of them).")
    p.add_argument("--tokenizer-processes", nargs="*", default=["1"],
                   help="Rows with the tokenizer in P processes ('P', or 'PxT' for T threads in all) [default: 1, "
                        "the layout before four processes became the default].")
    p.add_argument("--limit", type=int, default=None, help="Passages of the corpus [default: all; 96 with --quick].")
    p.add_argument("--skip", nargs="*", default=[], help="Sections to leave out: reference, packed, packed_other, packed_block, packed_norm, packed_graphs, word_cache, tokenizer_processes, packed_fp32, instrumentation, "
                        "segment_max, budgets, exactness, ndjson (ndjson_process: its --encoder-process run; ndjson_workers0: its --build-workers 0 run; ndjson_window: its "
                        "--window-docs 1024 run; ndjson_checkpoint: its --checkpoint-interval 0 run; ndjson_chunk: its "
                        "--chunk-docs 1024 run; ndjson_workers4: its --build-workers 4 run), mrr.")
    p.add_argument("--targets", action="store_true",
                   help=f"Only the sections the targets are read from, and compile=\"graphs\" (leaves out "
                        f"{', '.join(NOT_TARGETS)}, the padded job and the old tokenizer layout): about half the "
                        "device time of every section.")
    args = p.parse_args(argv)
    if args.targets:
        args.skip = [*args.skip, *NOT_TARGETS]
        args.skip_padded_job, args.tokenizer_processes = True, []
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    quick = args.quick or device.type != "cuda"
    data = Path(args.data)
    if quick:
        args.repeat, args.subset = 1, min(args.subset, 48)
    ids, texts = load_corpus(data / "msmarco-ko" / "corpus.jsonl", args.repeat, args.limit or (96 if quick else None))
    result: dict = {"command": " ".join([Path(sys.argv[0]).name if argv is None else "gpu_encode.py"] +
                                        (sys.argv[1:] if argv is None else argv)),
                    "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
                    "device": str(device), "quick": quick, "models": []}
    n = 8192 if device.type == "cuda" else 512
    result["peak_what"] = f"{'bf16' if device.type == 'cuda' else 'fp32'} {n}^3 matmul"
    result["peak_tflops"] = peak_tflops(device, n)

    def save() -> None:
        result["targets"] = gpu_targets.as_json(gpu_targets.verdicts(result))
        harness.write_json(args.out, result)
        if args.md:
            Path(args.md).write_text(markdown(result))

    def section(res: dict, key: str, fn) -> None:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - a failed section is recorded, the rest still runs
            res.setdefault("errors", {})[key] = f"{type(err).__name__}: {err}"[:500]
        res.setdefault("section_s", {})[key] = round(time.perf_counter() - t0, 1)
        print(f"{res['model']}: {key} {res['section_s'][key]} s", flush=True)  # progress, and what a timeout cut
        save()

    from opensearch_lsr.resources import splade_tiny_path

    tiny = args.splade_tiny or str(splade_tiny_path())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not args.skip_reference_model:
            shape = dict(layers=2, hidden=128, heads=2, intermediate=512) if quick else \
                dict(layers=12, hidden=768, heads=12, intermediate=3072)
            name = "bert-tiny-random (ko vocab)" if quick else "bert-base-random (ko vocab, 12 x 768)"
            model_dir = random_mlm(data / "kobigbird-bert-base-tokenizer", work / "bert-random", texts, device, **shape)
            bench_model(name, str(model_dir), ids, texts, device, result["peak_tflops"], args, work, section,
                        result["models"])
        if args.skip_splade_tiny:
            save()
            return result
        res = bench_model("splade-tiny (2 x 128, 30,522 vocab)", tiny, ids, texts, device, result["peak_tflops"],
                          args, work, section, result["models"])
        if "mrr" not in args.skip:
            section(res, "mrr", lambda: res.__setitem__("mrr_at_10", mrr_at_10(data / "msmarco-en", device, tiny,
                                                                                200 if quick else None)))
    save()
    return result


if __name__ == "__main__":
    main()
