"""How long the host takes to launch a packed batch, with the ids made three ways in one process.

The same encoder runs the corpus with its tokenizer (a process on CUDA), with a tokenizer thread beside the
launching thread, and pre-tokenized (``PackedRunner.run``); it prints docs/s and the host's launch time per
batch for each. A launch time far above the pre-tokenized one says the host, not the device, sets the pace.

    python benchmarks/gpu_launch_probe.py [--model DIR] [--repeat 2] [--max-batch-tokens 65536]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opensearch_lsr.encoding.encoder import SparseDocumentEncoder  # noqa: E402
from opensearch_lsr.resources import shared_data_dir, splade_tiny_path  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="Encoder dir [default: SPLADE-tiny].")
    p.add_argument("--corpus", default=None, help="JSONL corpus [default: the shared msmarco-ko corpus].")
    p.add_argument("--repeat", type=int, default=2, help="Copies of the corpus.")
    p.add_argument("--limit", type=int, default=None, help="Passages of the corpus [default: all].")
    p.add_argument("--max-batch-tokens", type=int, default=65536, help="Packed batch budget (CUDA; 4096 on CPU).")
    args = p.parse_args(argv)
    corpus = Path(args.corpus) if args.corpus else shared_data_dir() / "msmarco-ko" / "corpus.jsonl"
    texts = [json.loads(line)["text"] for line in corpus.open(encoding="utf-8")][:args.limit] * args.repeat
    cuda = torch.cuda.is_available()
    enc = SparseDocumentEncoder(args.model or str(splade_tiny_path()), device="cuda" if cuda else "cpu",
                                batching="packed", max_batch_tokens=args.max_batch_tokens if cuda else 4096)
    enc.warm_up()
    enc.encode(texts[:2048])
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
        print(f"{label}: {out[label]}", flush=True)

    measure("encoder's tokenizer (a process on CUDA)", lambda: enc.encode(texts))
    pool = ThreadPoolExecutor(1)
    own = enc.tokenize_async
    enc.tokenize_async = lambda t: pool.submit(enc.once_tokenizer, list(t))
    measure("tokenizer thread", lambda: enc.encode(texts))
    enc.tokenize_async = own
    tokens = enc.once_tokenizer(texts)
    measure("pre-tokenized", lambda: enc.runner.run(tokens))
    enc.close()
    pool.shutdown()
    return out


if __name__ == "__main__":
    main()
