"""Merging segments of the local index: a log merge policy and a streamed merge.

Policy (Lucene's ``LogDocMergePolicy`` idea, ``org/apache/lucene/index/LogMergePolicy.java``):
a segment's level is ``floor(log_F(docs / MIN_DOCS))``; when the newest ``F`` segments share a
level they are merged into one of the next level, and so on. Each document is rewritten about
``log_F(N / batch)`` times (O(N log N) in all, where merging everything every few writes is
O(N^2)), and an index holds at most about ``F - 1`` segments per level.

Merge: only adjacent segments are merged (the newest run, or all of them for ``force_merge``), so
"later writes win" and the order of live documents stay as they were. The merged segment is
written array by array in chunks read with ``pread`` (no memory map, no array of the whole run in
memory): memory grows with the chunk size, the longest posting list, and ~20 bytes per merged
document (row map, id hashes for the sorted look-up table), never with the postings of the run.
"""
from __future__ import annotations

import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .storage import SegmentReader, NpyStreamWriter, fsync_dir, id_hashes, write_meta

__all__ = ["MERGE_FACTOR", "MIN_MERGE_DOCS", "MAX_SEGMENTS", "plan_merge", "merge_segments", "NpyRangeReader"]

#: Segments of one level merged together.
MERGE_FACTOR = 10
#: Segments below this many documents are level 0.
MIN_MERGE_DOCS = 1_000
#: Above this many segments the newest MERGE_FACTOR are merged whatever their levels.
MAX_SEGMENTS = 48
_CHUNK_ROWS = 32_768
_FLUSH_POSTINGS = 1 << 20


def _level(docs: int, factor: int, min_docs: int) -> int:
    return max(0, int(math.floor(math.log(max(docs, 1) / min_docs, factor)))) if docs >= min_docs else 0


def plan_merge(doc_counts: Sequence[int], factor: int | None = None, min_docs: int | None = None,
               max_segments: int | None = None) -> int | None:
    """Start of the run of newest segments to merge next (it ends at the newest), or ``None``
    (defaults: the module's :data:`MERGE_FACTOR`, :data:`MIN_MERGE_DOCS`, :data:`MAX_SEGMENTS`)."""
    factor = MERGE_FACTOR if factor is None else factor
    min_docs = MIN_MERGE_DOCS if min_docs is None else min_docs
    max_segments = MAX_SEGMENTS if max_segments is None else max_segments
    if factor < 2:
        raise ValueError(f"merge factor must be >= 2, got {factor}")
    n = len(doc_counts)
    if n < factor:
        return None
    levels = [_level(d, factor, min_docs) for d in doc_counts]
    if all(lv == levels[-1] for lv in levels[n - factor:]) or n > max_segments:
        return n - factor
    return None


class NpyRangeReader:
    """Ranges of a 1-d ``.npy`` file read with ``pread`` (the page cache, not this process, holds them)."""

    def __init__(self, path: Path):
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, _fortran, dtype = read_header(fh)
            self.offset = fh.tell()
        self.dtype, self.length = np.dtype(dtype), int(shape[0]) if shape else 0
        self.fd = os.open(path, os.O_RDONLY)

    def read(self, start: int, stop: int) -> np.ndarray:
        n = max(0, int(stop) - int(start))
        if n == 0:
            return np.zeros(0, dtype=self.dtype)
        buf = os.pread(self.fd, n * self.dtype.itemsize, self.offset + int(start) * self.dtype.itemsize)
        return np.frombuffer(buf, dtype=self.dtype)

    def close(self) -> None:
        os.close(self.fd)


def _copy_ragged(data: NpyRangeReader, off: np.ndarray, mask: np.ndarray, out: NpyStreamWriter,
                 remap: np.ndarray | None = None) -> None:
    """Append the items of the rows kept by ``mask`` (``off``: the rows' offsets into ``data``)."""
    n = len(mask)
    for a in range(0, n, _CHUNK_ROWS):
        b = min(n, a + _CHUNK_ROWS)
        m = mask[a:b]
        if not m.any():
            continue
        lo, hi = int(off[a]), int(off[b])
        block = data.read(lo, hi)
        if not m.all():
            block = block[np.repeat(m, np.diff(off[a:b + 1]))]
        out.write(remap[block] if remap is not None else block)


def _write_strings(tmp: Path, prefix: str, strings: list[str]) -> None:
    blobs = [s.encode("utf-8") for s in strings]
    offs = np.zeros(len(blobs) + 1, dtype=np.int64)
    if blobs:
        np.cumsum([len(b) for b in blobs], out=offs[1:])
    for name, arr in ((f"{prefix}.bin", np.frombuffer(b"".join(blobs), dtype=np.uint8)), (f"{prefix}.off", offs),
                      (f"{prefix}.hash", id_hashes(strings))):
        w = NpyStreamWriter(tmp / f"{name}.npy", arr.dtype, len(arr))
        w.write(arr)
        w.close()


def merge_segments(readers: Sequence[SegmentReader], masks: Sequence[np.ndarray], carry_deleted: list[str],
                   out: Path) -> None:
    """Write the live rows (``masks``) of adjacent ``readers``, in order, as one segment at ``out``;
    ``carry_deleted`` are deletions that must keep hiding documents of older segments."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    counts = [int(m.sum()) for m in masks]
    n_out = sum(counts)
    rowmaps = []
    base = 0
    for m, c in zip(masks, counts):
        rm = np.full(len(m), -1, dtype=np.int32)
        rm[m] = np.arange(base, base + c, dtype=np.int32)
        rowmaps.append(rm)
        base += c

    def ragged(files: tuple[str, str]) -> np.ndarray:
        """Copy the ragged array ``files[1]`` (offsets ``files[0]``) of every reader; the new offsets."""
        offs = [np.load(r.path / f"{files[0]}.npy") for r in readers]
        lens = [np.diff(o)[m] for o, m in zip(offs, masks)]
        new_off = np.zeros(n_out + 1, dtype=np.int64)
        if n_out:
            np.cumsum(np.concatenate(lens), out=new_off[1:])
        w = NpyStreamWriter(tmp / f"{files[1]}.npy", np.uint8, int(new_off[-1]))
        for r, o, m in zip(readers, offs, masks):
            rd = NpyRangeReader(r.path / f"{files[1]}.npy")
            _copy_ragged(rd, o, m, w)
            rd.close()
        w.close()
        return new_off

    def save(name: str, arr: np.ndarray) -> None:
        w = NpyStreamWriter(tmp / f"{name}.npy", arr.dtype, len(arr))
        w.write(arr)
        w.close()

    save("ids.off", ragged(("ids.off", "ids.bin")))
    save("src.off", ragged(("src.off", "src.bin")))
    hashes = np.concatenate([np.load(r.path / "ids.hash.npy")[m] for r, m in zip(readers, masks)]
                            ) if readers else np.zeros(0, np.uint64)
    save("ids.hash", hashes)
    order = np.argsort(hashes, kind="stable").astype(np.int32)
    save("ids.sorted", hashes[order])
    save("ids.order", order)
    del hashes, order
    _write_strings(tmp, "del", carry_deleted)

    fields: dict[str, dict] = {}
    names = list(dict.fromkeys(f for r in readers for f in r.field_meta))
    for k, fname in enumerate(names):
        key = f"f{k}"
        vocab: dict[str, int] = {}
        remaps: list[np.ndarray] = []
        for r in readers:
            terms = r.field_meta.get(fname, {}).get("terms", [])
            remaps.append(np.array([vocab.setdefault(t, len(vocab)) for t in terms], dtype=np.int32))
        total = _field_doc_major(readers, masks, fname, key, remaps, tmp, n_out)
        _field_feature_major(readers, rowmaps, fname, key, remaps, len(vocab), total, tmp)
        terms = [""] * len(vocab)
        for t, j in vocab.items():
            terms[j] = t
        fields[fname] = {"key": key, "terms": terms, "postings": total}
    write_meta(tmp, n_out, len(carry_deleted), fields)
    os.replace(tmp, out)
    fsync_dir(out.parent)


def _field_doc_major(readers: Sequence[SegmentReader], masks: Sequence[np.ndarray], fname: str, key: str,
                     remaps: list[np.ndarray], tmp: Path, n_out: int) -> int:
    lens, rows_of = [], []
    for r, m in zip(readers, masks):
        meta = r.field_meta.get(fname)
        if meta is None:
            rows_of.append(None)
            lens.append(np.zeros(int(m.sum()), dtype=np.int64))
            continue
        rows = np.load(r.path / f"{meta['key']}.rows.npy")
        rows_of.append(rows)
        lens.append(np.diff(rows)[m])
    new_rows = np.zeros(n_out + 1, dtype=np.int64)
    if n_out:
        np.cumsum(np.concatenate(lens), out=new_rows[1:])
    total = int(new_rows[-1])
    w = NpyStreamWriter(tmp / f"{key}.rows.npy", np.int64, n_out + 1)
    w.write(new_rows)
    w.close()
    for arr, dtype in (("cols", np.int32), ("vals", np.float32)):
        out = NpyStreamWriter(tmp / f"{key}.{arr}.npy", dtype, total)
        for r, m, rows, remap in zip(readers, masks, rows_of, remaps):
            if rows is None:
                continue
            src = NpyRangeReader(r.path / f"{r.field_meta[fname]['key']}.{arr}.npy")
            _copy_ragged(src, rows, m, out, remap if arr == "cols" else None)
            src.close()
        out.close()
    return total


def _field_feature_major(readers: Sequence[SegmentReader], rowmaps: list[np.ndarray], fname: str, key: str,
                         remaps: list[np.ndarray], n_terms: int, total: int, tmp: Path) -> None:
    inverse, fptrs, docs, codes = [], [], [], []
    for r, remap in zip(readers, remaps):
        inv = np.full(n_terms, -1, dtype=np.int64)
        inv[remap] = np.arange(len(remap))
        inverse.append(inv)
        meta = r.field_meta.get(fname)
        if meta is None:
            fptrs.append(None)
            docs.append(None)
            codes.append(None)
            continue
        fptrs.append(np.load(r.path / f"{meta['key']}.fptr.npy"))
        docs.append(NpyRangeReader(r.path / f"{meta['key']}.docs.npy"))
        codes.append(NpyRangeReader(r.path / f"{meta['key']}.codes.npy"))
    fptr = np.zeros(n_terms + 1, dtype=np.int64)
    w_docs = NpyStreamWriter(tmp / f"{key}.docs.npy", np.int32, total)
    w_codes = NpyStreamWriter(tmp / f"{key}.codes.npy", np.uint16, total)
    buf_d: list[np.ndarray] = []
    buf_c: list[np.ndarray] = []
    pending = written = 0
    for j in range(n_terms):
        for k in range(len(readers)):
            c = inverse[k][j]
            if c < 0 or fptrs[k] is None:
                continue
            a, b = fptrs[k][c], fptrs[k][c + 1]
            if b == a:
                continue
            nd = rowmaps[k][docs[k].read(a, b)]
            keep = nd >= 0
            cd = codes[k].read(a, b)
            if not keep.all():
                nd, cd = nd[keep], cd[keep]
            buf_d.append(nd)
            buf_c.append(cd)
            pending += len(nd)
        written_j = written + pending
        fptr[j + 1] = written_j
        if pending >= _FLUSH_POSTINGS:
            w_docs.write(np.concatenate(buf_d))
            w_codes.write(np.concatenate(buf_c))
            buf_d, buf_c, written, pending = [], [], written_j, 0
    if buf_d:
        w_docs.write(np.concatenate(buf_d))
        w_codes.write(np.concatenate(buf_c))
    w_docs.close()
    w_codes.close()
    for rd in docs + codes:
        if rd is not None:
            rd.close()
    w = NpyStreamWriter(tmp / f"{key}.fptr.npy", np.int64, n_terms + 1)
    w.write(fptr)
    w.close()
