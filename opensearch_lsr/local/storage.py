"""On-disk storage of the local index: immutable segments, an atomic manifest, one writer lock.

Layout of an index directory::

    manifest.json        atomic (temp + fsync + rename): mappings, segment list, registered models
    seg-000001.npz ...   immutable segments: doc ids, deleted ids, JSON sources and, per
                         ``rank_features`` field, a CSR matrix over segment-local feature names
    write.lock           the writers' lock (``filelock``)

A segment is written and fsynced before the manifest that names it, so a write is durable when it
returns and a crash leaves either the old or the new manifest (unreferenced segment files are
ignored and removed by a later reader).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from filelock import FileLock

from ..config import read_json

__all__ = ["Segment", "MANIFEST", "FORMAT_VERSION", "atomic_write_bytes", "read_manifest", "write_manifest",
           "write_segment", "read_segment", "build_segment", "write_lock"]

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
LOCK_FILE = "write.lock"


@dataclass
class Segment:
    """One immutable segment: documents in write order, deletions, and per vector field a raw CSR."""

    name: str
    ids: list[str]
    deleted: list[str]
    sources: list[bytes]
    fields: dict[str, tuple[sp.csr_matrix, list[str]]]  # field -> (raw float32 CSR, feature names)


def _fsync_dir(path: Path) -> None:
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
    _fsync_dir(path.parent)


def read_manifest(root: Path) -> dict:
    """The manifest of the index at ``root``."""
    return read_json(root / MANIFEST)


def write_manifest(root: Path, manifest: dict) -> None:
    """Atomically replace the manifest of the index at ``root``."""
    atomic_write_bytes(root / MANIFEST, json.dumps(manifest, ensure_ascii=False, indent=1).encode("utf-8"))


def write_segment(path: Path, seg: Segment) -> None:
    """Write ``seg`` as one ``.npz`` file (atomically)."""
    arrays: dict[str, np.ndarray] = {
        "ids": np.array(seg.ids, dtype=str) if seg.ids else np.zeros(0, dtype="U1"),
        "deleted": np.array(seg.deleted, dtype=str) if seg.deleted else np.zeros(0, dtype="U1"),
        "source_offsets": np.cumsum([0] + [len(s) for s in seg.sources]).astype(np.int64),
        "sources": np.frombuffer(b"".join(seg.sources), dtype=np.uint8),
        "fields": np.array(list(seg.fields), dtype=str) if seg.fields else np.zeros(0, dtype="U1"),
    }
    for i, (mat, terms) in enumerate(seg.fields.values()):
        arrays[f"f{i}_indptr"] = mat.indptr.astype(np.int64)
        arrays[f"f{i}_indices"] = mat.indices.astype(np.int32)
        arrays[f"f{i}_data"] = mat.data.astype(np.float32)
        # feature names as one UTF-8 JSON array: numpy unicode arrays would strip trailing NULs
        arrays[f"f{i}_terms"] = np.frombuffer(json.dumps(terms, ensure_ascii=False).encode("utf-8"), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def read_segment(path: Path) -> Segment:
    """Read a segment written by :func:`write_segment`."""
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
    per_field: dict[str, tuple[list[int], list[int], list[float], dict[str, int]]] = {
        f: ([0], [], [], {}) for f in vec_fields}
    for did, (op, doc) in final.items():
        if op == "delete" or doc is None:
            deleted.append(did)
            continue
        ids.append(did)
        rest = {}
        for key, value in doc.items():
            if key in per_field:
                _indptr, indices, data, vocab = per_field[key]
                positive = props[key].get("positive_score_impact", True)
                if isinstance(value, dict):
                    for tok, w in value.items():
                        w = float(np.float32(w))
                        indices.append(vocab.setdefault(tok, len(vocab)))
                        data.append(w if positive else 1.0 / w)
                if value is None:
                    rest[key] = None
            else:
                rest[key] = value
        for indptr, indices, _data, _vocab in per_field.values():
            indptr.append(len(indices))
        sources.append(json.dumps(rest, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    fields = {}
    for f, (indptr, indices, data, vocab) in per_field.items():
        if not vocab and not indices:
            mat = sp.csr_matrix((len(ids), 0), dtype=np.float32)
        else:
            mat = sp.csr_matrix((np.array(data, np.float32), np.array(indices, np.int32), np.array(indptr, np.int64)),
                                shape=(len(ids), len(vocab)))
        terms = [""] * len(vocab)
        for t, j in vocab.items():
            terms[j] = t
        fields[f] = (mat, terms)
    return Segment("", ids, deleted, sources, fields)


@contextlib.contextmanager
def write_lock(root: Path) -> Iterator[None]:
    """Hold the index's writer lock so two writers (threads or processes) never interleave manifests."""
    with FileLock(str(root / LOCK_FILE)):
        yield
