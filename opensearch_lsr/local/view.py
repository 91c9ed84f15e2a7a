"""The searchable in-memory view of a local index's live documents, and response helpers."""
from __future__ import annotations

import fnmatch
import json
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..contract import truncate_feature_values
from .errors import LocalIndexError
from .storage import Segment

__all__ = ["LiveView", "top_order", "filter_source"]


class LiveView:
    """Live documents of all segments: ids, sources, and per vector field the raw and the stored
    (9-bit truncated, feature-major) matrices. Later segments win; deletions hide earlier writes."""

    def __init__(self, segments: list[Segment], vector_fields: list[str]):
        latest: dict[str, tuple[int, int]] = {}
        for s, seg in enumerate(segments):
            for did in seg.deleted:
                latest.pop(did, None)
            for r, did in enumerate(seg.ids):
                latest.pop(did, None)  # re-insert so order = last write
                latest[did] = (s, r)
        self.ids: list[str] = list(latest)
        self.row_of: dict[str, int] = {d: i for i, d in enumerate(self.ids)}
        seg_rows: dict[int, list[int]] = {}
        order: dict[int, list[int]] = {}
        for pos, (s, r) in enumerate(latest.values()):
            seg_rows.setdefault(s, []).append(r)
            order.setdefault(s, []).append(pos)
        self.sources: list[bytes] = [b""] * len(self.ids)
        for s, rows in seg_rows.items():
            for pos, r in zip(order[s], rows):
                self.sources[pos] = segments[s].sources[r]
        self._parsed: dict[int, dict] = {}
        self.vocab: dict[str, dict[str, int]] = {}
        self.terms: dict[str, list[str]] = {}
        self.raw: dict[str, sp.csr_matrix] = {}
        self.by_feature: dict[str, sp.csr_matrix] = {}  # [V, N] CSR (= docs CSC): fast column gathers
        n = len(self.ids)
        for field in vector_fields:
            vocab: dict[str, int] = {}
            blocks, positions = [], []
            for s, rows in seg_rows.items():
                if field not in segments[s].fields:
                    blocks.append(None)
                    positions.append(order[s])
                    continue
                mat, terms = segments[s].fields[field]
                remap = np.array([vocab.setdefault(t, len(vocab)) for t in terms], dtype=np.int64)
                sub = mat[rows]
                blocks.append((sub, remap))
                positions.append(order[s])
            v = len(vocab)
            coo_rows, coo_cols, coo_vals = [], [], []
            for blk, pos in zip(blocks, positions):
                if blk is None:
                    continue
                sub, remap = blk
                sub = sub.tocoo()
                coo_rows.append(np.asarray(pos, dtype=np.int64)[sub.row])
                coo_cols.append(remap[sub.col])
                coo_vals.append(sub.data.astype(np.float32))
            if coo_rows:
                raw = sp.csr_matrix((np.concatenate(coo_vals), (np.concatenate(coo_rows), np.concatenate(coo_cols))),
                                    shape=(n, v), dtype=np.float32)
            else:
                raw = sp.csr_matrix((n, v), dtype=np.float32)
            raw.sort_indices()
            self.vocab[field] = vocab
            self.terms[field] = [None] * v  # type: ignore[list-item]
            for t, j in vocab.items():
                self.terms[field][j] = t
            self.raw[field] = raw
            stored = raw.copy()
            stored.data = truncate_feature_values(stored.data)
            self.by_feature[field] = stored.T.tocsr()

    def __len__(self) -> int:
        return len(self.ids)

    def source(self, row: int) -> dict:
        doc = self._parsed.get(row)
        if doc is None:
            doc = json.loads(self.sources[row].decode("utf-8"))
            self._parsed[row] = doc
        return doc

    def full_source(self, row: int) -> dict:
        """The stored source with its ``rank_features`` fields put back (float32 values)."""
        doc = dict(self.source(row))
        for field, raw in self.raw.items():
            start, end = raw.indptr[row], raw.indptr[row + 1]
            if end > start:
                terms = self.terms[field]
                # float32 values printed shortest (as Java prints the float the client sent)
                doc[field] = {terms[j]: float(str(w)) for j, w in zip(raw.indices[start:end], raw.data[start:end])}
        return doc


def top_order(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` best scores, descending; ties keep insertion order (deterministic)."""
    n = len(scores)
    if k <= 0 or n == 0:
        return np.zeros(0, dtype=np.int64)
    if n > 4 * k:
        thr = np.partition(scores, n - k)[n - k]
        cand = np.flatnonzero(scores >= thr)
    else:
        cand = np.arange(n)
    order = cand[np.argsort(-scores[cand], kind="stable")]
    return order[:k]


def filter_source(view: LiveView, row: int, spec: Any) -> dict | None:
    """The ``_source`` of a hit after ``_source`` filtering (bool, pattern, list or includes/excludes)."""
    if spec is False:
        return None
    if spec is True or spec is None:
        return view.full_source(row)
    includes: list[str]
    excludes: list[str] = []
    if isinstance(spec, str):
        includes = [spec]
    elif isinstance(spec, list):
        includes = [str(s) for s in spec]
    elif isinstance(spec, dict):
        inc = spec.get("includes", spec.get("include", []))
        exc = spec.get("excludes", spec.get("exclude", []))
        includes = [inc] if isinstance(inc, str) else list(inc)
        excludes = [exc] if isinstance(exc, str) else list(exc)
    else:
        raise LocalIndexError("[_source] must be a boolean, a string, an array or an object", "parsing_exception")
    base = view.source(row)
    names = set(base) | {f for f in view.raw}
    keep = [n for n in names if (not includes or any(fnmatch.fnmatchcase(n, p) for p in includes))
            and not any(fnmatch.fnmatchcase(n, p) for p in excludes)]
    if any(n in view.raw for n in keep):
        full = view.full_source(row)
        return {n: full[n] for n in full if n in keep}
    return {n: base[n] for n in base if n in keep}
