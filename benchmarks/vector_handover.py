"""Host time to hand a corpus's vectors from the device's batches to the job's chunks, as lists or flat.

The packed pipeline (:mod:`opensearch_lsr.encoding.encode_pipeline`) gets each batch's vectors as flat host arrays
(ids, weights, counts), its documents from several chunks in length order, and resolves each chunk's future with
its vectors in input order; the job then hands a chunk to a document worker as three flat arrays. Two ways, timed
in the same run over the same batches (one thread, nothing else running):

* ``list``: each batch split into one ``SparseVector`` per document, placed into its chunk's list one by one, and
  each finished chunk concatenated again for the worker (``np.split``, a loop, ``flat_vectors``);
* ``flat``: each batch's rows grouped by chunk and gathered (``SparseVectors.take``), a finished chunk put back in
  input order (``in_order``) and handed over as it is;
* ``csr``: the same with ``scipy.sparse.csr_array`` (the same three arrays: row indexing, ``vstack``), the library
  that would do it if ``SparseVectors`` did not.

Batches are cut as the job cuts them: windows of ``--window`` documents sorted by length, ``--batch-tokens`` real
tokens per batch, chunks of ``--chunk`` documents; lengths and id counts are drawn like the Korean passages'
(about 93 tokens, 100-300 ids).

    python benchmarks/vector_handover.py --docs 29116 --md benchmarks/results/vector_handover.md
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness, also when loaded as a module

from harness import ROOT, markdown_table, run_info, write_results

sys.path.insert(0, str(ROOT))

from opensearch_lsr.encoding.encode_pipeline import _rows_by_serial
from opensearch_lsr.encoding.sparse_vector import (
    SparseVectors,
    flat_vectors,
    in_order,
)

__all__ = ["batches", "by_csr", "by_flat", "by_list", "main"]


def batches(docs: int, window: int, batch_tokens: int, chunk: int, seed: int = 0) -> list[tuple[np.ndarray, tuple]]:
    """``(keys, (ids, weights, counts))`` per batch: keys ``(chunk, position in the chunk)`` of its documents."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.normal(93, 30, docs), 8, 512).astype(np.int64)
    out = []
    for start in range(0, docs, window):
        rows = start + np.argsort(lengths[start:start + window], kind="stable")
        cut = np.searchsorted(np.cumsum(lengths[rows]), np.arange(batch_tokens, lengths[rows].sum(), batch_tokens))
        for part in np.split(rows, cut):
            counts = rng.integers(100, 301, len(part))
            ids = np.concatenate([np.sort(rng.choice(32_000, k, replace=False)) for k in counts]).astype(np.int64)
            out.append((np.stack([part // chunk, part % chunk], axis=1),
                        (ids, rng.random(len(ids), dtype=np.float32), counts)))
    return out


def by_list(batches_: list, chunk: int, docs: int) -> int:
    """The list hand-over (the pipeline's before flat vectors); returns the ids handed to workers (a check that both
    ways hand over the same)."""
    chunks: dict[int, list] = {}  # serial -> [vectors, missing]
    handed = 0
    for keys, flat in batches_:
        for (serial, i), vector in zip(keys.tolist(), list(SparseVectors(*flat))):  # as PendingSparse did
            entry = chunks.get(serial)
            if entry is None:
                n = min(chunk, docs - serial * chunk)
                entry = chunks[serial] = [[None] * n, n]
            entry[0][i] = vector
            entry[1] -= 1
            if entry[1] == 0:
                handed += len(flat_vectors(chunks.pop(serial)[0])[0])
    return handed


def by_flat(batches_: list, chunk: int, docs: int) -> int:
    """The flat hand-over (the pipeline's): returns the ids handed to workers."""
    pieces: dict[int, list] = {}
    missing: dict[int, int] = {}
    handed = 0
    for keys, flat in batches_:
        vectors = SparseVectors(*flat)
        for serial, rows in _rows_by_serial(keys[:, 0]):
            pieces.setdefault(serial, []).append((keys[rows, 1], vectors.take(rows)))
            left = missing.get(serial, min(chunk, docs - serial * chunk)) - len(rows)
            missing[serial] = left
            if left == 0:
                handed += len(flat_vectors(in_order(pieces.pop(serial)))[0])
    return handed


def by_csr(batches_: list, chunk: int, docs: int, vocab: int = 32_000) -> int:
    """The flat hand-over through ``scipy.sparse.csr_array``: returns the ids handed to workers."""
    pieces: dict[int, list] = {}
    missing: dict[int, int] = {}
    handed = 0
    for keys, (ids, weights, counts) in batches_:
        indptr = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        batch = sp.csr_array((weights, ids, indptr), shape=(len(counts), vocab), copy=False)
        for serial, rows in _rows_by_serial(keys[:, 0]):
            pieces.setdefault(serial, []).append((keys[rows, 1], batch[rows]))
            left = missing.get(serial, min(chunk, docs - serial * chunk)) - len(rows)
            missing[serial] = left
            if left == 0:
                done = pieces.pop(serial)
                positions = np.concatenate([p for p, _ in done])
                order = np.empty_like(positions)
                order[positions] = np.arange(len(positions))
                handed += len(sp.vstack([m for _, m in done], format="csr")[order].indices)
    return handed


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=29_116, help="Documents (the Korean corpus x4 by default).")
    p.add_argument("--window", type=int, default=4096, help="Documents sorted together (the job's --window-docs).")
    p.add_argument("--batch-tokens", type=int, default=65_536, help="Real tokens per batch (a GPU's default).")
    p.add_argument("--chunk", type=int, default=256, help="Documents per chunk (the job's --chunk-docs).")
    p.add_argument("--repeat", type=int, default=5, help="Timed passes of each way, alternating (the best is kept).")
    p.add_argument("--md", default=None, help="Markdown results (a JSON beside it).")
    args = p.parse_args(argv)
    data = batches(args.docs, args.window, args.batch_tokens, args.chunk)
    best = {"list": float("inf"), "flat": float("inf"), "csr": float("inf")}
    handed = {}
    for _ in range(args.repeat):
        for name, fn in (("list", by_list), ("flat", by_flat), ("csr", by_csr)):
            t0 = time.perf_counter()
            handed[name] = fn(data, args.chunk, args.docs)
            best[name] = min(best[name], time.perf_counter() - t0)
    if len(set(handed.values())) != 1:
        raise SystemExit(f"the two ways handed over different ids: {handed}")
    rows = [[name, len(data), round(best[name], 4), round(best[name] / args.docs * 1e6, 2),
             round(best["list"] / best[name], 2)] for name in ("list", "flat", "csr")]
    md = (f"# Handing {args.docs:,} documents' vectors from {len(data)} batches to chunks of {args.chunk}\n\n"
          f"Windows of {args.window:,} documents, {args.batch_tokens:,}-token batches; best of {args.repeat} passes "
          f"each, one thread.\n\n"
          + markdown_table(["hand-over", "batches", "seconds", "us per document", "x list"], rows) + "\n")
    print(md)
    payload = {"docs": args.docs, "batches": len(data), "seconds": best, "ids_handed": handed["flat"],
               "speedup": round(best["list"] / best["flat"], 2), "csr_speedup": round(best["list"] / best["csr"], 2)}
    if args.md:
        write_results(Path(args.md).with_suffix(""), payload, md, run_info())
    return payload


if __name__ == "__main__":
    main()
