"""How much of a device's pace ``lsr-os index --backend ndjson`` keeps, by the packed pipeline's window.

The job reads, tokenizes, encodes, builds and writes in a pipeline; a chunk is done when the last batch holding one
of its documents is, so the window (``--window-docs``) sets how coarse the pipeline is: how long it takes to fill
and drain, and how much the host works in bursts. On an H200 the job kept 0.61-0.66 of encode-only docs/s while its
device thread waited 1.4 s of 2.7-3.0 s for batches (``results/gpu_encode_run17_bert.json``). This runs the job
unchanged on any machine, with the packed runner's device work emulated: a batch takes ``docs / --device-docs-per-s``
seconds on a virtual device, queued after the one before (waiting for it sleeps), and launching it holds the
interpreter lock ``--launch-us-per-doc`` microseconds per document (an H200 host took 36-50 us per Korean passage:
12.7 ms per 32k-token batch of about 350 in ``tokenizer_process.py``'s runs, 1.47 s for 29,116 in run 17's job
with ``--compile body``). Every vector is one fixed 200-id vector. The tokenizer (the kobigbird vocabulary of the
shared data) and every other stage are real. Each window is compared with the default window's runs in the same
invocation.

    python benchmarks/job_pipeline.py --windows 4096 1024 --repeat 3 --md benchmarks/results/job_pipeline.md
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from gpu_encode import random_mlm
from harness import markdown_table, run_info, write_results
from index_host_path import passage_texts, repeated_corpus

from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
from opensearch_lsr.encoding.job import IndexJob, IndexJobConfig
from opensearch_lsr.encoding.sparse_vector import SparseVector
from opensearch_lsr.resources import shared_data_dir

__all__ = ["EmulatedDevice", "main"]

DEFAULT_WINDOW = IndexJobConfig.window_docs


class _Pending:
    """A launched batch: its vectors, ready once the virtual device's clock passes ``end``."""

    def __init__(self, vectors: list[SparseVector], end: float) -> None:
        self.vectors, self.end = vectors, end

    def wait(self) -> None:
        left = self.end - time.perf_counter()
        if left > 0:
            time.sleep(left)

    def result(self) -> tuple[list[SparseVector], int]:
        self.wait()
        return self.vectors, 0


class EmulatedDevice:
    """Stands in for :meth:`.packed_runner.PackedRunner.launch`: the host cost of launching (the interpreter lock
    held ``launch_us_per_doc`` per document), then ``docs / docs_per_s`` seconds of device time after the previous
    batch's."""

    def __init__(self, docs_per_s: float, launch_us_per_doc: float, vector: SparseVector) -> None:
        if docs_per_s <= 0 or launch_us_per_doc < 0:
            raise ValueError("docs_per_s must be > 0 and launch_us_per_doc >= 0")
        self.docs_per_s, self.launch_s_per_doc, self.vector = docs_per_s, launch_us_per_doc / 1e6, vector
        self.free_at = 0.0

    def launch(self, batch, model=None) -> _Pending:
        n = len(batch.lengths)
        busy_until = time.perf_counter() + self.launch_s_per_doc * n
        while time.perf_counter() < busy_until:  # Python work, as launching a batch's kernels is
            pass
        start = max(time.perf_counter(), self.free_at)
        self.free_at = start + n / self.docs_per_s
        return _Pending([self.vector] * n, self.free_at)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, nargs="+", default=[DEFAULT_WINDOW, 1024],
                   help=f"--window-docs values (the default, {DEFAULT_WINDOW}, is always run: the baseline).")
    p.add_argument("--repeat", type=int, default=3, help="Runs of each window (their median is compared).")
    p.add_argument("--copies", type=int, default=4, help="Copies of the Korean corpus (ids made unique).")
    p.add_argument("--limit", type=int, default=None, help="Passages of the corpus to copy [default: all].")
    p.add_argument("--device-docs-per-s", type=float, default=3500.0,
                   help="The emulated device's pace (below the host path's here, as an H200's is there).")
    p.add_argument("--launch-us-per-doc", type=float, default=40.0, help="Host time per document to launch a batch.")
    p.add_argument("--build-workers", type=int, default=0, help="The job's --build-workers.")
    p.add_argument("--md", default=None, help="Markdown results (a JSON beside it).")
    args = p.parse_args(argv)
    data = shared_data_dir()
    if data is None:
        raise SystemExit("no shared data folder beside the repository (the Korean corpus and tokenizer)")
    work = Path(tempfile.mkdtemp(prefix="job-pipeline-"))
    source = data / "msmarco-ko" / "corpus.jsonl"
    if args.limit:
        with source.open(encoding="utf-8") as fh:
            (work / "source.jsonl").write_text("".join(line for _, line in zip(range(args.limit), fh)), encoding="utf-8")
        source = work / "source.jsonl"
    rows, corpus = repeated_corpus(str(source), args.copies, work)
    # a one-layer random masked LM on the kobigbird vocabulary: the packed layout (its forward is emulated)
    model = random_mlm(data / "kobigbird-bert-base-tokenizer", work / "model", passage_texts(rows[:128]),
                       torch.device("cpu"), layers=1, hidden=32, heads=2, intermediate=64)
    encoder = SparseDocumentEncoder(str(model), device="cpu", batching="packed")
    rng = np.random.default_rng(0)
    vector = SparseVector(np.sort(rng.choice(encoder.vocab_size, 200, replace=False)).astype(np.int64),
                          rng.random(200, dtype=np.float32) + 0.1)
    device = EmulatedDevice(args.device_docs_per_s, args.launch_us_per_doc, vector)
    encoder.runner.launch = device.launch
    texts = passage_texts(rows) * args.copies
    t0 = time.perf_counter()
    encoder.encode(texts)  # the encoder alone (tokenizing, batching, the emulated device): the pace to keep
    encode_only = len(texts) / (time.perf_counter() - t0)
    runs: dict[int, list[dict]] = {}
    for window in dict.fromkeys([DEFAULT_WINDOW, *args.windows]):
        for k in range(args.repeat):
            cfg = IndexJobConfig(corpus=str(corpus), model=str(model), backend="ndjson", window_docs=window,
                                 index=str(work / f"out-{window}-{k}"), build_workers=args.build_workers)
            encoder.runner.reset_stats()  # the device thread's times, this run's only
            summary = IndexJob(cfg, encoder=encoder, progress=False).run(restart=True)
            run = summary["this_run"]
            runs.setdefault(window, []).append({
                "docs_per_s": run["docs_per_s"], "elapsed_s": run["elapsed_s"],
                "device_thread_waited_for_batches_s": summary["encoder"]["device_thread_s"]["source"],
                "main_thread_waited_for_vectors_s": run["encode_s"]})
    base = statistics.median(r["docs_per_s"] for r in runs[DEFAULT_WINDOW])
    table = []
    for window, rs in runs.items():
        rate = statistics.median(r["docs_per_s"] for r in rs)
        table.append([window, rate, f"{rate / encode_only:.3f}", f"{rate / base:.3f}",
                      statistics.median(r["device_thread_waited_for_batches_s"] for r in rs),
                      ", ".join(f"{r['docs_per_s']:.0f}" for r in rs)])
    payload = {"documents": len(texts), "device_docs_per_s": args.device_docs_per_s,
               "launch_us_per_doc": args.launch_us_per_doc, "encode_only_docs_per_s": round(encode_only, 1),
               "build_workers": args.build_workers, "runs": {str(k): v for k, v in runs.items()}}
    md = (f"# `lsr-os index --backend ndjson` against an emulated device, by `--window-docs`\n\n"
          f"{len(texts):,} Korean passages; device {args.device_docs_per_s:,.0f} docs/s, launch "
          f"{args.launch_us_per_doc:g} us of Python per document; the encoder alone "
          f"{encode_only:,.0f} docs/s; --build-workers {args.build_workers}; median of {args.repeat} runs.\n\n"
          + markdown_table(["--window-docs", "job docs/s", "x encoder alone", f"x window {DEFAULT_WINDOW}",
                            "device thread waited for batches, s", "runs"], table, floats=".1f") + "\n")
    print(md)
    if args.md:
        write_results(Path(args.md).with_suffix(""), payload, md, run_info())
    return payload


if __name__ == "__main__":
    main()
