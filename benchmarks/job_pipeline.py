"""How much of a device's pace ``lsr-os index --backend ndjson`` keeps, by the packed pipeline's window and by when
CUDA graphs are captured.

The job reads, tokenizes, encodes, builds and writes in a pipeline; a chunk is done when the last batch holding one
of its documents is, so the window (``--window-docs``) sets how coarse the pipeline is: how long it takes to fill
and drain, and how much the host works in bursts. On an H200 the job kept 0.61-0.66 of encode-only docs/s while its
device thread waited 1.4 s of 2.7-3.0 s for batches, and captured 13 CUDA graphs after its warm-up, 1.2 s of its
3.0 s (``results/gpu_encode_run17_bert.json``). This runs the job unchanged on any machine, with the packed runner's
device work emulated: a batch takes ``docs / --device-docs-per-s`` seconds on a virtual device, queued after the one
before (waiting for it sleeps), and launching it holds the interpreter lock ``--launch-us-per-doc`` microseconds per
document (an H200 host took 36-50 us per Korean passage: 12.7 ms per 32k-token batch of about 350 in
``tokenizer_process.py``'s runs, 1.47 s for 29,116 in run 17's job with ``--compile body``). Every vector is one
fixed 200-id vector, handed back as the device's sparsify hands a batch's (flat host arrays, taken by the real
``PendingSparse.result``). The tokenizer (the kobigbird vocabulary of the shared data) and every other stage are real.

With ``--capture-after``, each batch is also padded to its graph bucket (``Segments.packed_batch``, as on CUDA)
and goes through a real :class:`~opensearch_lsr.encoding.graph_replay.GraphReplay` whose capture is emulated: it
waits for the virtual device to drain (a capture synchronises it), then holds the interpreter lock ``--capture-ms``.
On the H200 a capture took 92 ms: two warm-up passes of the body and the recording, a couple of batches' worth of
device time, so the default is that many batches' worth of the emulated device's time. A batch replayed from a
graph takes ``--replay-launch-ms`` to launch (run 17's job), one without a graph the per-document launch above.
With graphs, a batch's device time grows with the tokens it is padded to (its bucket's, or with ``--borrow-ratios``
a larger captured bucket's: ``GraphReplay.bucket_for``).
Before each job the encoder's own warm-up (``warm_up_texts`` with the job's sample: the corpus's first two windows,
cut in the job's windows) captures every shape it meets, as ``lsr-os index`` does on CUDA; so the captures counted
are the job's shapes the warm-up did not meet, at the shape's ``capture_after``-th batch. Each row is compared with
the default window's runs (at the default ``capture_after``) in the same invocation.

    python benchmarks/job_pipeline.py --windows 4096 2048 1024 --repeat 3 --md benchmarks/results/job_pipeline.md
    python benchmarks/job_pipeline.py --windows 4096 1024 --capture-after 1 2 3 4 --repeat 3 \
        --md benchmarks/results/job_pipeline_graphs.md
    python benchmarks/job_pipeline.py --windows 4096 --capture-after 2 --borrow-ratios 1 2 4 --repeat 3 \
        --md benchmarks/results/job_pipeline_borrow.md
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from gpu_encode import random_mlm
from harness import markdown_table, run_info, write_results
from index_host_path import passage_texts, repeated_corpus

from opensearch_lsr.encoding.device_sparse import PendingSparse
from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
from opensearch_lsr.encoding.graph_replay import GraphReplay
from opensearch_lsr.encoding.job import IndexJob, IndexJobConfig
from opensearch_lsr.encoding.packed import Segments
from opensearch_lsr.encoding.packed_runner import capture_catch_all_buckets
from opensearch_lsr.encoding.sparse_vector import SparseVector
from opensearch_lsr.encoding.token_batches import default_max_batch_tokens
from opensearch_lsr.resources import shared_data_dir

__all__ = ["EmulatedDevice", "main"]

DEFAULT_WINDOW = IndexJobConfig.window_docs
#: ``GraphReplay``'s default ``capture_after``: the baseline rows use it
DEFAULT_CAPTURE_AFTER = GraphReplay.__init__.__kwdefaults__["capture_after"]
#: ``GraphReplay``'s default ``borrow_ratio``: the baseline rows use it
DEFAULT_BORROW_RATIO = GraphReplay.__init__.__kwdefaults__["borrow_ratio"]
#: run 17 on an H200 (``results/gpu_encode_run17_bert.json``): a capture in the job, and the encoder's pace
H200_CAPTURE_MS, H200_DOCS_PER_S = 92.0, 15_943
#: run 17's job: the device thread's launches besides its captures, per batch (0.83 s, 58 batches)
H200_REPLAY_LAUNCH_MS = 14.3


class _Pending(PendingSparse):
    """A launched batch: its vectors as the device's sparsify leaves them (flat ids, weights and counts in host
    memory, taken by the real :meth:`~opensearch_lsr.encoding.device_sparse.PendingSparse.result`), ready once the
    virtual device's clock passes ``end``."""

    def __init__(self, flat: _FlatResults, docs: int, end: float) -> None:
        size = docs * flat.per_doc
        super().__init__(flat.ids[:size], flat.weights[:size], flat.counts[:docs], flat.nonfinite)
        self.end = end

    def wait(self) -> None:
        left = self.end - time.perf_counter()
        if left > 0:
            time.sleep(left)


class _FlatResults:
    """What :func:`~opensearch_lsr.encoding.device_sparse.sparsify` copies to the host for up to ``docs`` documents
    of ``vector`` (ids, weights, counts, a zero non-finite count), made once: a batch takes views of its first rows."""

    def __init__(self, vector: SparseVector, docs: int) -> None:
        self.per_doc = len(vector.ids)
        self.ids = torch.from_numpy(np.tile(vector.ids.astype(np.int32), docs))
        self.weights = torch.from_numpy(np.tile(vector.weights.astype(np.float32), docs))
        self.counts = torch.full((docs,), self.per_doc, dtype=torch.int32)
        self.nonfinite = torch.zeros((), dtype=torch.int32)


def _hold(seconds: float) -> None:
    """Python work for ``seconds`` (the interpreter lock held, as launching kernels holds it)."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


class EmulatedDevice:
    """Stands in for :meth:`.packed_runner.PackedRunner.launch`: the host cost of launching (the interpreter lock
    held ``launch_us_per_doc`` per document), then ``docs / docs_per_s`` seconds of device time after the previous
    batch's (with graphs, times the tokens the batch is padded to over its real ones).

    With ``capture_after``, a batch is padded to its graph bucket (``max_doc``: the longest document) and run through
    a :class:`~opensearch_lsr.encoding.graph_replay.GraphReplay`; its capture waits for the device to drain, then holds
    the lock ``capture_ms``, and a batch whose body is a graph replay holds it ``replay_launch_ms`` instead of the
    per-document launch (:attr:`graphs` counts captures, replays, batches without a graph and batches padded up to a
    larger graph's bucket, at most ``borrow_ratio`` times their own)."""

    def __init__(self, docs_per_s: float, launch_us_per_doc: float, vector: SparseVector, *,
                 capture_after: int | None = None, capture_ms: float = 0.0, replay_launch_ms: float = 0.0,
                 max_doc: int = 512, borrow_ratio: float = DEFAULT_BORROW_RATIO,
                 max_batch_tokens: int = 65536) -> None:
        if docs_per_s <= 0 or min(launch_us_per_doc, capture_ms, replay_launch_ms) < 0:
            raise ValueError("docs_per_s must be > 0, launch_us_per_doc, capture_ms and replay_launch_ms >= 0")
        self.docs_per_s, self.launch_s_per_doc, self.vector = docs_per_s, launch_us_per_doc / 1e6, vector
        self.capture_s, self.replay_launch_s, self.max_doc = capture_ms / 1e3, replay_launch_ms / 1e3, max_doc
        self.max_batch_tokens = max_batch_tokens
        self.free_at = 0.0
        self._flat = _FlatResults(vector, 1024)  # grown when a batch has more documents
        self.graphs = None if capture_after is None else GraphReplay(lambda ids, seg: ids, capture=self._capture,
                                                                     capture_after=capture_after,
                                                                     borrow_ratio=borrow_ratio)

    def _capture(self, fn):
        """A capture: the device drains (``torch.cuda.synchronize``), then the host records for ``capture_ms``."""
        left = self.free_at - time.perf_counter()
        if left > 0:
            time.sleep(left)
        _hold(self.capture_s)
        out = fn()
        return (lambda: None), out

    @contextmanager
    def capturing_every_shape(self):
        """The warm-up's capture rule (:func:`~opensearch_lsr.encoding.packed_runner.capturing_every_shape`: each shape
        on its first batch, then the catch-all buckets), when graphs are emulated."""
        if self.graphs is None:
            yield
            return
        with self.graphs.capturing_every_shape():
            yield
        capture_catch_all_buckets(self.graphs, self.max_batch_tokens, self.max_doc, torch.device("cpu"))

    def warmed_up(self) -> None:
        """Count graphs afresh from here (after a warm-up, as the runner's ``reset_stats``)."""
        if self.graphs is not None:
            self.graphs.reset_stats()

    def launch(self, batch, model=None) -> _Pending:
        n = len(batch.lengths)
        launch_s = self.launch_s_per_doc * n
        device_s = n / self.docs_per_s
        if self.graphs is not None:
            shape = self.graphs.bucket_for(batch.lengths, self.max_doc)
            device_s *= shape[0] / max(1, len(batch.ids))  # the padding tokens are computed too
            uncaptured = self.graphs.stats.uncaptured
            self.graphs(*Segments.packed_batch(batch.ids, batch.lengths, torch.device("cpu"), pad_to=shape,
                                               max_doc=self.max_doc))
            if self.graphs.stats.uncaptured == uncaptured:  # the body is one graph replay
                launch_s = self.replay_launch_s
        _hold(launch_s)  # Python work, as launching a batch's kernels is
        start = max(time.perf_counter(), self.free_at)
        self.free_at = start + device_s
        if n > len(self._flat.counts):
            self._flat = _FlatResults(self.vector, 2 * n)
        return _Pending(self._flat, n, self.free_at)


def _graph_counts(device: EmulatedDevice) -> dict:
    stats = device.graphs.stats if device.graphs is not None else None
    return {} if stats is None else {"captured": stats.captured, "replays": stats.replays,
                                     "uncaptured": stats.uncaptured, "capture_s": round(stats.capture_s, 3),
                                     "borrowed": stats.borrowed, "borrowed_tokens": stats.borrowed_tokens}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, nargs="+", default=[DEFAULT_WINDOW, 1024],
                   help=f"--window-docs values (the default, {DEFAULT_WINDOW}, is always run: the baseline).")
    p.add_argument("--capture-after", type=int, nargs="*", default=[],
                   help=f"Emulate CUDA graphs, captured at a shape's Nth batch after the warm-up, for each N given "
                        f"(the default, {DEFAULT_CAPTURE_AFTER}, is always run then) [default: no graphs].")
    p.add_argument("--borrow-ratios", type=float, nargs="*", default=[],
                   help=f"With --capture-after: GraphReplay's borrow_ratio values (a batch without a graph of its "
                        f"own is padded up to a captured bucket of at most that many times its tokens; 1: never; "
                        f"the default, {DEFAULT_BORROW_RATIO:g}, is always run).")
    p.add_argument("--capture-ms", type=float, default=None,
                   help=f"Host time of one capture after the device drained [default: as many batches' worth of "
                        f"device time as on the H200, {H200_CAPTURE_MS:g} ms at {H200_DOCS_PER_S:,} docs/s: run 17's "
                        f"job captured 13 in 1.2 s, the drain included].")
    p.add_argument("--replay-launch-ms", type=float, default=H200_REPLAY_LAUNCH_MS,
                   help="Host time to launch a batch whose body is a graph replay (run 17's job: 0.83 s for 58 "
                        "batches besides the captures; a batch without a graph takes --launch-us-per-doc).")
    p.add_argument("--repeat", type=int, default=3, help="Runs of each row (their median is compared).")
    p.add_argument("--copies", type=int, default=4, help="Copies of the Korean corpus (ids made unique).")
    p.add_argument("--limit", type=int, default=None, help="Passages of the corpus to copy [default: all].")
    p.add_argument("--max-batch-tokens", type=int, default=default_max_batch_tokens("cuda"),
                   help="The packed token budget [default: a GPU's].")
    p.add_argument("--device-docs-per-s", type=float, default=3500.0,
                   help="The emulated device's pace (below the host path's here, as an H200's is there).")
    p.add_argument("--launch-us-per-doc", type=float, default=40.0, help="Host time per document to launch a batch.")
    p.add_argument("--build-workers", type=int, default=0, help="The job's --build-workers.")
    p.add_argument("--md", default=None, help="Markdown results (a JSON beside it).")
    args = p.parse_args(argv)
    if args.capture_ms is None:
        args.capture_ms = round(H200_CAPTURE_MS * H200_DOCS_PER_S / args.device_docs_per_s, 1)
    data = shared_data_dir()
    if data is None:
        raise SystemExit("no shared data folder beside the repository (the Korean corpus and tokenizer)")
    with tempfile.TemporaryDirectory(prefix="job-pipeline-") as tmp:  # each job writes 175-700 MB of NDJSON
        return _measure(args, data, Path(tmp))


def _measure(args: argparse.Namespace, data: Path, work: Path) -> dict:
    source = data / "msmarco-ko" / "corpus.jsonl"
    if args.limit:
        with source.open(encoding="utf-8") as fh:
            (work / "source.jsonl").write_text("".join(line for _, line in zip(range(args.limit), fh)), encoding="utf-8")
        source = work / "source.jsonl"
    rows, corpus = repeated_corpus(str(source), args.copies, work)
    # a one-layer random masked LM on the kobigbird vocabulary: the packed layout (its forward is emulated)
    model = random_mlm(data / "kobigbird-bert-base-tokenizer", work / "model", passage_texts(rows[:128]),
                       torch.device("cpu"), layers=1, hidden=32, heads=2, intermediate=64)
    encoder = SparseDocumentEncoder(str(model), device="cpu", batching="packed", max_batch_tokens=args.max_batch_tokens)
    rng = np.random.default_rng(0)
    vector = SparseVector(np.sort(rng.choice(encoder.vocab_size, 200, replace=False)).astype(np.int64),
                          rng.random(200, dtype=np.float32) + 0.1)
    # (capture_after, borrow_ratio) of each row's graphs, the defaults first; None: no graphs
    policies = [(c, b) for c in dict.fromkeys([DEFAULT_CAPTURE_AFTER, *args.capture_after])
                for b in dict.fromkeys([DEFAULT_BORROW_RATIO, *args.borrow_ratios])] if args.capture_after else [None]

    def emulate(policy: tuple[int, float] | None) -> EmulatedDevice:
        capture_after, borrow_ratio = policy or (None, DEFAULT_BORROW_RATIO)
        device = EmulatedDevice(args.device_docs_per_s, args.launch_us_per_doc, vector, capture_after=capture_after,
                                capture_ms=args.capture_ms, replay_launch_ms=args.replay_launch_ms,
                                max_doc=encoder.runner.model.max_doc_tokens, borrow_ratio=borrow_ratio,
                                max_batch_tokens=args.max_batch_tokens)
        encoder.runner.launch = device.launch
        return device

    texts = passage_texts(rows) * args.copies
    device = emulate(policies[0])
    with device.capturing_every_shape():  # the timed encode replays what a warm-up on the corpus captured
        encoder.encode(texts)
    device.warmed_up()
    t0 = time.perf_counter()
    encoder.encode(texts)  # the encoder alone (tokenizing, batching, the emulated device): the pace to keep
    encode_only = len(texts) / (time.perf_counter() - t0)
    encode_only_graphs = _graph_counts(device)
    runs: dict[tuple[int, tuple[int, float] | None], list[dict]] = {}
    for window in dict.fromkeys([DEFAULT_WINDOW, *args.windows]):
        for policy in policies:
            for k in range(args.repeat):
                cfg = IndexJobConfig(corpus=str(corpus), model=str(model), backend="ndjson", window_docs=window,
                                     index=str(work / f"out-{window}-{k}"), build_workers=args.build_workers,
                                     max_batch_tokens=args.max_batch_tokens)
                device = emulate(policy)  # a new process's graphs
                # the job's warm-up on CUDA (IndexJob.run with its own encoder: SparseDocumentEncoder.warm_up)
                encoder.window_docs, encoder_window = window, encoder.window_docs
                with device.capturing_every_shape():
                    encoder.encode(encoder.warm_up_texts(sample=texts[:2 * window]))
                encoder.window_docs = encoder_window
                encoder.runner.reset_stats()  # the device thread's times and graphs, this run's only
                device.warmed_up()
                summary = IndexJob(cfg, encoder=encoder, progress=False).run(restart=True)
                shutil.rmtree(cfg.index)
                shutil.rmtree(summary["work_dir"])
                run = summary["this_run"]
                runs.setdefault((window, policy), []).append({
                    "docs_per_s": run["docs_per_s"], "elapsed_s": run["elapsed_s"],
                    "device_thread_waited_for_batches_s": summary["encoder"]["device_thread_s"]["source"],
                    # of which for the job to queue a chunk, or for a queued chunk's ids
                    "device_thread_waited_for_the_job_s": summary["encoder"]["device_thread_s"]["source_caller"],
                    "device_thread_waited_for_the_tokenizer_s":
                        summary["encoder"]["device_thread_s"]["source_tokenizer"],
                    "main_thread_waited_for_vectors_s": run["encode_s"],
                    "main_thread_waited_for_the_writer_s": run["queue_wait_s"],
                    "writer_waited_for_documents_s": run["documents_wait_s"], "checkpoint_s": run["checkpoint_s"],
                    **_graph_counts(device)})
    base = statistics.median(r["docs_per_s"] for r in runs[(DEFAULT_WINDOW, policies[0])])
    table = []
    for (window, policy), rs in runs.items():
        rate = statistics.median(r["docs_per_s"] for r in rs)
        graphs = [] if policy is None else [
            *policy, *(", ".join(f"{r[k]}" for r in rs) for k in ("captured", "uncaptured", "borrowed"))]
        table.append([window, *graphs, rate, f"{rate / encode_only:.3f}", f"{rate / base:.3f}",
                      statistics.median(r["device_thread_waited_for_batches_s"] for r in rs),
                      ", ".join(f"{r['docs_per_s']:.0f}" for r in rs)])
    payload = {"documents": len(texts), "device_docs_per_s": args.device_docs_per_s,
               "launch_us_per_doc": args.launch_us_per_doc, "max_batch_tokens": args.max_batch_tokens,
               "capture_ms": args.capture_ms if args.capture_after else None,
               "replay_launch_ms": args.replay_launch_ms if args.capture_after else None,
               "encode_only_docs_per_s": round(encode_only, 1), "encode_only_graphs": encode_only_graphs,
               "build_workers": args.build_workers,
               "runs": {f"{w}" + (f"/capture_after={p[0]}/borrow_ratio={p[1]:g}" if p is not None else ""): v
                        for (w, p), v in runs.items()}}
    graph_note = "" if policies == [None] else (
        f" CUDA graphs emulated: a capture drains the device, then holds the host {args.capture_ms:g} ms; a batch "
        f"replayed from a graph takes {args.replay_launch_ms:g} ms to launch, one without a graph "
        f"{args.launch_us_per_doc:g} us per document; the timed "
        f"encoder alone (after a warm-up on the corpus) captured {encode_only_graphs['captured']}.")
    baseline = f"x window {DEFAULT_WINDOW}" + ("" if policies == [None] else
                                               f", capture_after {policies[0][0]}, borrow_ratio {policies[0][1]:g}")
    md = (f"# `lsr-os index --backend ndjson` against an emulated device, by `--window-docs`"
          f"{'' if policies == [None] else ' and graph capture'}\n\n"
          f"{len(texts):,} Korean passages; {args.max_batch_tokens:,}-token batches; device "
          f"{args.device_docs_per_s:,.0f} docs/s, launch {args.launch_us_per_doc:g} us of Python per document; the "
          f"encoder alone {encode_only:,.0f} docs/s; --build-workers {args.build_workers}; median of {args.repeat} "
          f"runs.{graph_note}\n\n"
          + markdown_table(["--window-docs",
                            *([] if policies == [None] else ["capture_after", "borrow_ratio",
                                                            "captures after the warm-up, by run",
                                                            "batches without a graph, by run",
                                                            "batches padded to a larger graph, by run"]),
                            "job docs/s", "x encoder alone", baseline,
                            "device thread waited for batches, s", "runs"], table, floats=".1f") + "\n")
    print(md)
    if args.md:
        write_results(Path(args.md).with_suffix(""), payload, md, run_info())
    return payload


if __name__ == "__main__":
    main()
