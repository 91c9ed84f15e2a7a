"""How long the host takes to launch a packed batch, with the ids made three ways in one process.

The same encoder runs the corpus with its tokenizer (a process on CUDA), with a tokenizer thread beside the
launching thread, and pre-tokenized (``PackedRunner.run``); it prints docs/s and the host's launch time per
batch for each. A launch time far above the pre-tokenized one says the host, not the device, sets the pace.
``--compile`` and ``--tokenizer-threads`` repeat the probe per setting (eager and ``torch.compile``d residual +
LayerNorm steps; the Rust tokenizer's threads in its process); ``--bert-base`` probes the 12 x 768 random
masked LM of ``gpu_encode.py`` instead of SPLADE-tiny.

    python benchmarks/gpu_launch_probe.py [--model DIR | --bert-base] [--repeat 2] [--max-batch-tokens 65536]
        [--compile off on block] [--tokenizer-threads 8 16] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from opensearch_lsr.encoding import tokenizer_process  # noqa: E402
from opensearch_lsr.encoding.encoder import SparseDocumentEncoder  # noqa: E402
from opensearch_lsr.resources import shared_data_dir, splade_tiny_path  # noqa: E402


def probe(model: str, texts: list[str], *, cuda: bool, budget: int, compile: bool | str, threads: int | None,
          thread_variant: bool) -> dict:
    """docs/s and launch ms per batch of one encoder: its own tokenizer, a tokenizer thread, pre-tokenized."""
    default_threads = tokenizer_process.default_tokenizer_threads
    if threads:  # the tokenizer process reads it when the encoder first tokenizes
        tokenizer_process.default_tokenizer_threads = lambda: threads
    try:
        enc = SparseDocumentEncoder(model, device="cuda" if cuda else "cpu", batching="packed", compile=compile,
                                    max_batch_tokens=budget if cuda else 4096)
        enc.warm_up()
        enc.encode(texts[:2048])
    finally:
        tokenizer_process.default_tokenizer_threads = default_threads
    out = {}

    def measure(label: str, fn) -> None:
        stats = enc.runner.stats
        b0, l0 = stats.batches, stats.by_stage["launch"]
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        batches = max(1, stats.batches - b0)
        out[label] = {"docs_per_s": round(len(texts) / wall), "launch_ms_per_batch":
                      round(1e3 * (stats.by_stage["launch"] - l0) / batches, 2), "batches": batches}
        print(f"compile={compile} threads={threads or default_threads()} {label}: {out[label]}", flush=True)

    measure("encoder's tokenizer (a process on CUDA)", lambda: enc.encode(texts))
    if thread_variant:
        pool = ThreadPoolExecutor(1)
        own = enc.tokenize_async
        enc.tokenize_async = lambda t: pool.submit(enc.once_tokenizer, list(t))
        measure("tokenizer thread", lambda: enc.encode(texts))
        enc.tokenize_async = own
        pool.shutdown()
    tokens = enc.once_tokenizer(texts)
    measure("pre-tokenized", lambda: enc.runner.run(tokens))
    enc.close()
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="Encoder dir [default: SPLADE-tiny].")
    p.add_argument("--bert-base", action="store_true",
                   help="Probe gpu_encode.py's random 12 x 768 BERT on the kobigbird vocabulary (built here).")
    p.add_argument("--data", default=None, help="Shared data dir [default: ../shared/data].")
    p.add_argument("--corpus", default=None, help="JSONL corpus [default: the shared msmarco-ko corpus].")
    p.add_argument("--repeat", type=int, default=2, help="Copies of the corpus.")
    p.add_argument("--limit", type=int, default=None, help="Passages of the corpus [default: all].")
    p.add_argument("--max-batch-tokens", type=int, default=65536, help="Packed batch budget (CUDA; 4096 on CPU).")
    p.add_argument("--compile", nargs="+", choices=("off", "on", "block"), default=["off"],
                   help="Probe the eager encoder, the torch.compile'd one (on: the residual + LayerNorm steps; block: "
                        "everything after attention, one region per layer), or several [default: off].")
    p.add_argument("--tokenizer-threads", nargs="+", type=int, default=[0],
                   help="Rust tokenizer threads in the tokenizer process (0: the default, half the cores).")
    p.add_argument("--out", default=None, help="Write the figures as JSON here.")
    args = p.parse_args(argv)
    data = Path(args.data) if args.data else shared_data_dir()
    corpus = Path(args.corpus) if args.corpus else data / "msmarco-ko" / "corpus.jsonl"
    texts = [json.loads(line)["text"] for line in corpus.open(encoding="utf-8")][:args.limit] * args.repeat
    cuda = torch.cuda.is_available()
    if not args.bert_base:
        model = args.model or str(splade_tiny_path())
    else:
        import gpu_encode  # noqa: E402 - benchmarks/gpu_encode.py

        shape = dict(layers=12, hidden=768, heads=12, intermediate=3072) if cuda else \
            dict(layers=2, hidden=128, heads=2, intermediate=512)
        model = str(gpu_encode.random_mlm(data / "kobigbird-bert-base-tokenizer",
                                          Path(tempfile.mkdtemp()) / "bert-random", texts,
                                          torch.device("cuda" if cuda else "cpu"), **shape))
    out = {"model": "bert-base-random" if args.bert_base else model, "docs": len(texts), "runs": []}
    first = True
    for mode in args.compile:
        for threads in args.tokenizer_threads:
            res = probe(model, texts, cuda=cuda, budget=args.max_batch_tokens,
                        compile={"off": False, "on": True, "block": "block"}[mode],
                        threads=threads or None, thread_variant=first)
            out["runs"].append({"compile": mode, "tokenizer_threads": threads or
                                tokenizer_process.default_tokenizer_threads(), **res})
            first = False
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
