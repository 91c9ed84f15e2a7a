"""On-disk storage of the local index: immutable memory-mapped segments, an atomic manifest, one writer lock.

Layout of an index directory::

    manifest.json        atomic (temp + fsync + rename): mappings, segment list, registered models
    seg-000001/ ...      immutable segments (a directory of ``.npy`` arrays, read memory-mapped)
    write.lock           the writers' lock (``filelock``)

A segment holds, in write order: document ids (UTF-8 bytes + offsets, a 64-bit hash per id and the
hashes sorted for point look-ups), deleted ids, JSON sources, and per ``rank_features`` field

* the raw float32 weights document-major (``rows`` int64 offsets, ``cols`` int32, ``vals`` float32):
  what ``_source`` gives back;
* the stored weights feature-major (``fptr`` int64 offsets, ``docs`` int32 segment rows, ``codes``
  uint16): Lucene ``FeatureField`` keeps ``floatToIntBits(w) >>> 15`` as the term frequency, which for
  a positive float is exactly 16 bits, so ``codes`` *is* the 9-significant-bit value (decode:
  ``intBitsToFloat(code << 15)``; Lucene ``FeatureField.encodeFeatureValue`` /
  ``decodeFeatureValue``, lucene 9.12 ``org/apache/lucene/document/FeatureField.java``).

Readers memory-map the arrays, so opening an index costs neither time nor memory proportional to
its size; the page cache holds what queries touch. A segment directory is written under a
temporary name, fsynced and renamed before the manifest that names it, so a crash leaves either the
old or the new manifest (unreferenced segment directories are removed by a later reader).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from filelock import FileLock, Timeout

from ..config import read_json

__all__ = ["Segment", "SegmentReader", "FieldPostings", "NpyStreamWriter", "MANIFEST", "FORMAT_VERSION", "DECODE",
           "atomic_write_bytes", "read_manifest", "write_manifest", "write_segment", "write_meta",
           "read_legacy_segment", "build_segment", "write_lock", "id_hashes", "encode_codes", "live_masks",
           "live_among", "fsync_dir", "remove_segment", "upgrade_format_1", "try_write_lock"]

MANIFEST = "manifest.json"
FORMAT_VERSION = 2
LOCK_FILE = "write.lock"
#: ``intBitsToFloat(code << 15)`` for every 16-bit stored code (FeatureField's 9-bit value).
DECODE = (np.arange(1 << 16, dtype=np.uint32) << np.uint32(15)).view(np.float32)


@dataclass
class Segment:
    """One segment in memory (what one bulk writes): documents in write order, deletions, and per
    vector field a raw CSR over segment-local feature names."""

    name: str
    ids: list[str]
    deleted: list[str]
    sources: list[bytes]
    fields: dict[str, tuple[sp.csr_matrix, list[str]]]  # field -> (raw float32 CSR, feature names)


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file, fsync, rename and a directory fsync."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_manifest(root: Path) -> dict:
    """The manifest of the index at ``root``."""
    return read_json(root / MANIFEST)


def write_manifest(root: Path, manifest: dict) -> None:
    """Atomically replace the manifest of the index at ``root``."""
    atomic_write_bytes(root / MANIFEST, json.dumps(manifest, ensure_ascii=False, indent=1).encode("utf-8"))


def id_hashes(ids: Sequence[str]) -> np.ndarray:
    """64-bit BLAKE2b of each id (uint64): stable across processes, unlike ``hash()``."""
    return np.fromiter((int.from_bytes(hashlib.blake2b(i.encode("utf-8"), digest_size=8).digest(), "little")
                        for i in ids), dtype=np.uint64, count=len(ids))


def encode_codes(values: np.ndarray) -> np.ndarray:
    """Stored 16-bit codes of positive float32 weights (``floatToIntBits(w) >>> 15``)."""
    return (np.ascontiguousarray(values, dtype=np.float32).view(np.uint32) >> np.uint32(15)).astype(np.uint16)


class NpyStreamWriter:
    """A 1-d ``.npy`` file of known length written chunk by chunk (no array of the full length in memory)."""

    def __init__(self, path: Path, dtype: np.dtype | type, length: int):
        self.path, self.dtype, self.length, self.written = path, np.dtype(dtype), int(length), 0
        self.fh = open(path, "wb")
        np.lib.format.write_array_header_1_0(self.fh, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                       "fortran_order": False, "shape": (self.length,)})

    def write(self, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        self.written += len(arr)
        if self.written > self.length:
            raise ValueError(f"{self.path.name}: more than the {self.length} items announced")
        self.fh.write(arr.tobytes())

    def close(self) -> None:
        if self.written != self.length:
            self.fh.close()
            raise ValueError(f"{self.path.name}: wrote {self.written} items, announced {self.length}")
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()


def _save(path: Path, arr: np.ndarray) -> None:
    w = NpyStreamWriter(path, arr.dtype, len(arr))
    w.write(arr)
    w.close()


def _ragged(items: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offs = np.zeros(len(items) + 1, dtype=np.int64)
    if items:
        np.cumsum([len(b) for b in items], out=offs[1:])
    return np.frombuffer(b"".join(items), dtype=np.uint8), offs


def write_segment(path: Path, seg: Segment) -> None:
    """Write ``seg`` as a segment directory at ``path`` (temp dir, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for prefix, strings in (("ids", seg.ids), ("del", seg.deleted)):
        data, offs = _ragged([s.encode("utf-8") for s in strings])
        _save(tmp / f"{prefix}.bin.npy", data)
        _save(tmp / f"{prefix}.off.npy", offs)
        h = id_hashes(strings)
        _save(tmp / f"{prefix}.hash.npy", h)
        if prefix == "ids":
            order = np.argsort(h, kind="stable").astype(np.int32)
            _save(tmp / "ids.sorted.npy", h[order])
            _save(tmp / "ids.order.npy", order)
    data, offs = _ragged(seg.sources)
    _save(tmp / "src.bin.npy", data)
    _save(tmp / "src.off.npy", offs)
    fields = {}
    for k, (fname, (mat, terms)) in enumerate(seg.fields.items()):
        mat = sp.csr_matrix(mat, dtype=np.float32)  # rows keep the client's feature order (as _source does)
        _save(tmp / f"f{k}.rows.npy", mat.indptr.astype(np.int64))
        _save(tmp / f"f{k}.cols.npy", mat.indices.astype(np.int32))
        _save(tmp / f"f{k}.vals.npy", mat.data.astype(np.float32))
        csc = mat.tocsc()
        csc.sort_indices()
        _save(tmp / f"f{k}.fptr.npy", csc.indptr.astype(np.int64))
        _save(tmp / f"f{k}.docs.npy", csc.indices.astype(np.int32))
        _save(tmp / f"f{k}.codes.npy", encode_codes(csc.data))
        fields[fname] = {"key": f"f{k}", "terms": list(terms), "postings": int(mat.nnz)}
    write_meta(tmp, len(seg.ids), len(seg.deleted), fields)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_meta(seg_dir: Path, docs: int, deleted: int, fields: dict) -> None:
    """The segment's ``meta.json`` (document count, deletions, fields with their feature names); fsyncs the dir."""
    with open(seg_dir / "meta.json", "wb") as fh:
        fh.write(json.dumps({"docs": docs, "deleted": deleted, "fields": fields}, ensure_ascii=False).encode())
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(seg_dir)


def _load(path: Path) -> np.ndarray:
    """The array memory-mapped, as a plain ndarray view (slicing a ``np.memmap`` subclass costs ~5 us
    per slice in ``__array_finalize__``; the view keeps the map alive through ``.base``)."""
    try:
        return np.asarray(np.load(path, mmap_mode="r"))
    except ValueError:  # an empty array cannot be memory-mapped
        return np.load(path)


@dataclass
class FieldPostings:
    """One vector field of one segment (all arrays memory-mapped)."""

    terms: list[str]
    rows: np.ndarray   # [docs + 1] int64: doc-major offsets into cols/vals
    cols: np.ndarray   # [postings] int32 segment-local feature
    vals: np.ndarray   # [postings] float32 raw weight
    fptr: np.ndarray   # [terms + 1] int64: feature-major offsets into docs/codes
    docs: np.ndarray   # [postings] int32 segment row, ascending per feature
    codes: np.ndarray  # [postings] uint16 stored 9-bit weight


class SegmentReader:
    """Read access to one segment directory; arrays are memory-mapped on first use."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.name = self.path.name
        meta = json.loads((self.path / "meta.json").read_text(encoding="utf-8"))
        self.n_docs: int = int(meta["docs"])
        self.n_deleted: int = int(meta["deleted"])
        self.field_meta: dict[str, dict] = meta["fields"]
        self._arrays: dict[str, np.ndarray] = {}
        self._fields: dict[str, FieldPostings] = {}

    def array(self, name: str) -> np.ndarray:
        arr = self._arrays.get(name)
        if arr is None:
            arr = self._arrays[name] = _load(self.path / f"{name}.npy")
        return arr

    def _string(self, prefix: str, i: int) -> str:
        off = self.array(f"{prefix}.off")
        return bytes(self.array(f"{prefix}.bin")[off[i]:off[i + 1]]).decode("utf-8")

    def doc_id(self, row: int) -> str:
        return self._string("ids", row)

    def deleted_id(self, i: int) -> str:
        return self._string("del", i)

    def deleted_ids(self) -> list[str]:
        return [self._string("del", i) for i in range(self.n_deleted)]

    def ids(self, rows: np.ndarray | None = None) -> list[str]:
        """Ids of ``rows`` (all rows when ``None``)."""
        off, data = self.array("ids.off"), self.array("ids.bin")
        rows = np.arange(self.n_docs) if rows is None else rows
        return [bytes(data[off[r]:off[r + 1]]).decode("utf-8") for r in rows.tolist()]

    def source(self, row: int) -> bytes:
        off = self.array("src.off")
        return bytes(self.array("src.bin")[off[row]:off[row + 1]])

    def field(self, name: str) -> FieldPostings | None:
        if name not in self.field_meta:
            return None
        fp = self._fields.get(name)
        if fp is None:
            k = self.field_meta[name]["key"]
            fp = self._fields[name] = FieldPostings(
                self.field_meta[name]["terms"], *(self.array(f"{k}.{a}") for a in
                                                  ("rows", "cols", "vals", "fptr", "docs", "codes")))
        return fp

    def lookup(self, hashes: np.ndarray, ids: Sequence[str]) -> np.ndarray:
        """Segment row of each id (-1 when absent); hashes are verified against the stored id."""
        out = np.full(len(ids), -1, dtype=np.int64)
        if self.n_docs == 0 or len(ids) == 0:
            return out
        sorted_h, order = self.array("ids.sorted"), self.array("ids.order")
        lo = np.searchsorted(sorted_h, hashes, side="left")
        hi = np.searchsorted(sorted_h, hashes, side="right")
        for i in np.flatnonzero(hi > lo).tolist():
            for p in range(int(lo[i]), int(hi[i])):  # more than one only on a 64-bit hash collision
                row = int(order[p])
                if self.doc_id(row) == ids[i]:
                    out[i] = row
                    break
        return out

    def deletes(self, hashes: np.ndarray, ids: Sequence[str]) -> np.ndarray:
        """Whether each id is among this segment's deletions."""
        out = np.zeros(len(ids), dtype=bool)
        if self.n_deleted == 0:
            return out
        dh = self.array("del.hash")
        hit = np.flatnonzero(np.isin(hashes, dh))
        if len(hit):
            deleted = set(self.deleted_ids())
            for i in hit.tolist():
                out[i] = ids[i] in deleted
        return out

    def close(self) -> None:
        self._arrays.clear()
        self._fields.clear()


def live_among(readers: Sequence[SegmentReader], ids: Sequence[str]) -> set[str]:
    """Which of ``ids`` are live documents of ``readers`` (newest segment first: a row there means
    live, a deletion means gone). Reads only the segments' sorted id hashes."""
    uniq = list(dict.fromkeys(ids))
    if not uniq or not readers:
        return set()
    h = id_hashes(uniq)
    state = np.zeros(len(uniq), dtype=np.int8)  # 0 not seen yet, 1 live, 2 deleted
    for seg in reversed(readers):
        todo = np.flatnonzero(state == 0)
        if not len(todo):
            break
        sub = [uniq[i] for i in todo.tolist()]
        state[todo[seg.lookup(h[todo], sub) >= 0]] = 1
        state[todo[seg.deletes(h[todo], sub)]] = 2
    return {uniq[i] for i in np.flatnonzero(state == 1).tolist()}


def live_masks(readers: Sequence[SegmentReader]) -> list[np.ndarray]:
    """Per segment, which rows are live: an id's last event (a row in a later segment or a deletion)
    wins. Sorts one 64-bit hash per row and deletion (memory ~30 bytes per document, no strings);
    groups with more than one event are resolved on the ids themselves, so hash collisions are exact."""
    if not readers:
        return []
    hs, seg_of, row_of = [], [], []
    for s, r in enumerate(readers):
        hs.append(np.asarray(r.array("ids.hash")))
        seg_of.append(np.full(r.n_docs, s, dtype=np.int32))
        row_of.append(np.arange(r.n_docs, dtype=np.int32))
        if r.n_deleted:
            hs.append(np.asarray(r.array("del.hash")))
            seg_of.append(np.full(r.n_deleted, s, dtype=np.int32))
            row_of.append(-1 - np.arange(r.n_deleted, dtype=np.int32))  # -(i + 1): deletion i
    h = np.concatenate(hs)
    seg = np.concatenate(seg_of)
    row = np.concatenate(row_of)
    del hs, seg_of, row_of
    masks = [np.zeros(r.n_docs, dtype=bool) for r in readers]
    if len(h) == 0:
        return masks
    order = np.lexsort((seg, h))
    hs_sorted = h[order]
    del h
    last = np.ones(len(order), dtype=bool)
    last[:-1] = hs_sorted[1:] != hs_sorted[:-1]
    first = np.ones(len(order), dtype=bool)
    first[1:] = hs_sorted[1:] != hs_sorted[:-1]
    single = first & last
    win = order[single]
    win = win[row[win] >= 0]
    for s in range(len(readers)):
        sel = win[seg[win] == s]
        masks[s][row[sel]] = True
    multi = order[~single]  # ids written more than once (or hash collisions): resolve on the ids
    if len(multi):
        multi = multi[np.lexsort((seg[multi],))]  # segment order (stable): later events win
        state: dict[str, int] = {}
        for e in multi.tolist():
            s, r = int(seg[e]), int(row[e])
            did = readers[s].doc_id(r) if r >= 0 else readers[s].deleted_id(-r - 1)
            state[did] = e
        for e in state.values():
            if row[e] >= 0:
                masks[int(seg[e])][int(row[e])] = True
    return masks


def read_legacy_segment(path: Path) -> Segment:
    """A format-1 ``.npz`` segment (indices written before memory-mapped segments), for upgrading."""
    with np.load(path, allow_pickle=False) as z:
        ids = [str(x) for x in z["ids"]]
        deleted = [str(x) for x in z["deleted"]]
        offs = z["source_offsets"]
        blob = z["sources"].tobytes()
        sources = [blob[offs[i]:offs[i + 1]] for i in range(len(ids))]
        fields = {}
        for i, fname in enumerate(str(x) for x in z["fields"]):
            terms = json.loads(z[f"f{i}_terms"].tobytes().decode("utf-8"))
            mat = sp.csr_matrix((z[f"f{i}_data"], z[f"f{i}_indices"], z[f"f{i}_indptr"]),
                                shape=(len(ids), len(terms)))
            fields[fname] = (mat, terms)
    return Segment(path.name, ids, deleted, sources, fields)


def build_segment(final: dict[str, tuple[str, dict | None]], props: dict) -> Segment:
    """A new segment from validated operations ``{_id: ("index", source) | ("delete", None)}``.

    Vector fields (``rank_features`` in ``props``) leave the JSON source and go to per-field CSR
    matrices (float32; ``positive_score_impact: false`` stores ``1 / w`` as Lucene does).
    """
    ids, deleted, sources = [], [], []
    vec_fields = [f for f, m in props.items() if m.get("type") == "rank_features"]
    # per field: row lengths, every token and weight of the batch (C-level list.extend; ids assigned
    # once per batch below, which is ~5x faster than a dict look-up per token in Python)
    per_field: dict[str, tuple[list[int], list[str], list[float]]] = {f: ([], [], []) for f in vec_fields}
    for did, (op, doc) in final.items():
        if op == "delete" or doc is None:
            deleted.append(did)
            continue
        ids.append(did)
        rest = {}
        for key, value in doc.items():
            if key not in per_field:
                rest[key] = value
            elif value is None:
                rest[key] = None
        for key, (lens, toks, weights) in per_field.items():
            value = doc.get(key)
            if isinstance(value, dict):
                toks.extend(value)
                weights.extend(value.values())
                lens.append(len(value))
            else:
                lens.append(0)
        sources.append(json.dumps(rest, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    fields = {}
    for f, (lens, toks, weights) in per_field.items():
        vocab = dict.fromkeys(toks)  # first-seen order
        for j, t in enumerate(vocab):
            vocab[t] = j
        indptr = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        data = np.asarray(weights, dtype=np.float32)
        if not props[f].get("positive_score_impact", True):
            data = (1.0 / data.astype(np.float64)).astype(np.float32)
        indices = np.array(itemgetter(*toks)(vocab) if len(toks) > 1 else [vocab[t] for t in toks], dtype=np.int32)
        mat = sp.csr_matrix((data, indices, indptr), shape=(len(ids), len(vocab)))
        fields[f] = (mat, list(vocab))
    return Segment("", ids, deleted, sources, fields)


def upgrade_format_1(root: Path) -> dict:
    """Rewrite a format-1 index (``.npz`` segments) with memory-mapped segments, in place."""
    with write_lock(root):
        manifest = read_manifest(root)
        if manifest.get("format") != 1:
            return manifest
        names = []
        for old in manifest["segments"]:
            seg = read_legacy_segment(root / old)
            name = old[: -len(".npz")] if old.endswith(".npz") else old + "-v2"
            write_segment(root / name, seg)
            names.append(name)
        old_names, manifest["segments"], manifest["format"] = manifest["segments"], names, FORMAT_VERSION
        write_manifest(root, manifest)
        for old in old_names:
            remove_segment(root / old)
        return manifest


def remove_segment(path: Path) -> None:
    """Delete a segment (directory, or a format-1 file)."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)


@contextlib.contextmanager
def try_write_lock(root: Path) -> Iterator[bool]:
    """Hold the writer lock if it is free right now; yields whether it is held."""
    lock = FileLock(str(root / LOCK_FILE))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


@contextlib.contextmanager
def write_lock(root: Path) -> Iterator[None]:
    """Hold the index's writer lock so two writers (threads or processes) never interleave manifests."""
    with FileLock(str(root / LOCK_FILE)):
        yield

