"""The searchable view of a local index's live documents (over memory-mapped segments), and response helpers."""
from __future__ import annotations

import fnmatch
import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from .errors import LocalIndexError
from .storage import DECODE, SegmentReader, id_hashes, live_masks

__all__ = ["LiveView", "top_order", "filter_source"]


class LiveView:
    """Live documents of all segments, read through the segments' memory maps.

    Rows are the live documents in write order (later segments win, deletions hide earlier writes,
    a re-written document moves to its new position). Nothing proportional to the postings is held
    in memory: per query term the posting lists of each segment are read from the memory-mapped
    feature-major arrays and their stored 9-bit values decoded (:data:`storage.DECODE`). Memory per
    document is the live-row map (8 bytes, only when some rows are dead) plus the parsed-source cache.
    """

    _SOURCE_CACHE = 50_000

    def __init__(self, segments: list[SegmentReader], vector_fields: list[str]):
        self.segments = segments
        masks = live_masks(segments)
        self.bases = np.zeros(len(segments) + 1, dtype=np.int64)
        if segments:
            np.cumsum([s.n_docs for s in segments], out=self.bases[1:])
        total = int(self.bases[-1])
        n_live = int(sum(int(m.sum()) for m in masks))
        #: global position (segment base + segment row) of each view row; None when every row is live
        self.live_pos: np.ndarray | None = None
        if n_live != total:
            self.live_pos = np.flatnonzero(np.concatenate(masks)) if masks else np.zeros(0, np.int64)
        self.n = n_live
        self.total = total
        self.ids = _IdList(self)
        self.row_of = _RowLookup(self)
        self._parsed: OrderedDict[int, dict] = OrderedDict()
        self.vector_fields = list(vector_fields)
        self.vocab: dict[str, dict[str, int]] = {}
        self.terms: dict[str, list[str]] = {}
        self._local: dict[str, list[np.ndarray | None]] = {}  # field -> per segment: global col -> local
        self._global: dict[str, list[np.ndarray | None]] = {}  # field -> per segment: local col -> global
        for field in self.vector_fields:
            vocab: dict[str, int] = {}
            locs: list[np.ndarray | None] = []
            for seg in segments:
                fp = seg.field(field)
                if fp is None:
                    locs.append(None)
                    continue
                cols = np.array([vocab.setdefault(t, len(vocab)) for t in fp.terms], dtype=np.int64)
                locs.append(cols)
            inverse: list[np.ndarray | None] = []
            for cols in locs:
                inv = None
                if cols is not None:
                    inv = np.full(len(vocab), -1, dtype=np.int64)
                    inv[cols] = np.arange(len(cols))
                inverse.append(inv)
            self.vocab[field] = vocab
            self.terms[field] = list(vocab)
            self._local[field] = inverse
            self._global[field] = locs

    def __len__(self) -> int:
        return self.n

    def locate(self, row: int) -> tuple[int, int]:
        """``(segment index, segment row)`` of a view row."""
        g = int(self.live_pos[row]) if self.live_pos is not None else int(row)
        s = int(np.searchsorted(self.bases, g, side="right")) - 1
        return s, g - int(self.bases[s])

    def to_rows(self, global_values: np.ndarray) -> np.ndarray:
        """A per-global-position array restricted to the view's rows."""
        return global_values if self.live_pos is None else global_values[self.live_pos]

    def source(self, row: int) -> dict:
        doc = self._parsed.get(row)
        if doc is None:
            s, r = self.locate(row)
            doc = json.loads(self.segments[s].source(r).decode("utf-8"))
            self._parsed[row] = doc
            if len(self._parsed) > self._SOURCE_CACHE:
                self._parsed.popitem(last=False)
        return doc

    def vector(self, field: str, row: int) -> tuple[list[str], np.ndarray] | None:
        """``(feature names, raw float32 weights)`` of a row's vector field, ``None`` when it has none."""
        s, r = self.locate(row)
        fp = self.segments[s].field(field)
        if fp is None:
            return None
        a, b = int(fp.rows[r]), int(fp.rows[r + 1])
        if b == a:
            return None
        return [fp.terms[j] for j in fp.cols[a:b].tolist()], np.asarray(fp.vals[a:b])

    def full_source(self, row: int) -> dict:
        """The stored source with its ``rank_features`` fields put back (float32 values)."""
        doc = dict(self.source(row))
        for field in self.vector_fields:
            vec = self.vector(field, row)
            if vec is not None:
                # float32 values printed shortest (as Java prints the float the client sent)
                doc[field] = {t: float(str(w)) for t, w in zip(vec[0], vec[1])}
        return doc

    def exists(self, field: str) -> np.ndarray:
        """Rows whose ``field`` vector has at least one feature."""
        parts = []
        for seg in self.segments:
            fp = seg.field(field)
            parts.append(np.zeros(seg.n_docs, bool) if fp is None else np.diff(np.asarray(fp.rows)) > 0)
        return self.to_rows(np.concatenate(parts)) if parts else np.zeros(0, bool)

    def _postings(self, field: str, col: int):
        """``(segment base, segment rows, stored values)`` of global feature ``col`` in each segment."""
        for k, seg in enumerate(self.segments):
            inv = self._local[field][k]
            if inv is None:
                continue
            c = int(inv[col])
            if c < 0:
                continue
            fp = seg.field(field)
            a, b = int(fp.fptr[c]), int(fp.fptr[c + 1])
            if b > a:
                yield int(self.bases[k]), fp.docs[a:b], DECODE[fp.codes[a:b]]

    def score_terms(self, field: str, cols: list[int], weights: list[float]) -> tuple[np.ndarray, np.ndarray]:
        """``(match, score)`` over the rows: ``sum_t w_t * stored(d_t)`` in float64, terms added in
        the order given (as a feature-major sparse product would)."""
        score = np.zeros(self.total, np.float64)
        for col, w in zip(cols, weights):
            for base, docs, vals in self._postings(field, col):
                view = score[base:]
                view[docs] += vals * np.float64(w)
        score = self.to_rows(score)
        return score > 0, score

    def stored_value(self, field: str, col: int, row: int) -> float | None:
        """The stored (9-bit) weight of feature ``col`` in ``row``, ``None`` when absent."""
        s, r = self.locate(row)
        inv = self._local[field][s]
        if inv is None or inv[col] < 0:
            return None
        fp = self.segments[s].field(field)
        a, b = int(fp.fptr[inv[col]]), int(fp.fptr[inv[col] + 1])
        pos = a + int(np.searchsorted(fp.docs[a:b], r))
        return float(DECODE[fp.codes[pos]]) if pos < b and fp.docs[pos] == r else None

    def feature_matrix(self, field: str, cols: list[int] | np.ndarray) -> sp.csr_matrix:
        """``[len(cols), rows]`` CSR of stored weights of the given features (memory: their postings)."""
        indptr = [0]
        indices, data = [], []
        for col in np.asarray(cols, dtype=np.int64).tolist():
            gpos, vals = [], []
            for base, docs, v in self._postings(field, col):
                gpos.append(np.asarray(docs, np.int64) + base)
                vals.append(v)
            g = np.concatenate(gpos) if gpos else np.zeros(0, np.int64)
            v = np.concatenate(vals) if vals else np.zeros(0, np.float32)
            if self.live_pos is not None:
                r = np.searchsorted(self.live_pos, g)
                ok = (r < len(self.live_pos)) & (self.live_pos[np.minimum(r, len(self.live_pos) - 1)] == g)
                g, v = r[ok], v[ok]
            indices.append(g)
            data.append(v)
            indptr.append(indptr[-1] + len(g))
        return sp.csr_matrix((np.concatenate(data) if data else np.zeros(0, np.float32),
                              np.concatenate(indices) if indices else np.zeros(0, np.int64),
                              np.asarray(indptr, np.int64)), shape=(len(indptr) - 1, self.n), dtype=np.float32)

    def raw_matrix(self, field: str) -> sp.csr_matrix:
        """``[rows, features]`` CSR of the raw weights (materialises the field: evaluation-sized indices)."""
        blocks = []
        for k, seg in enumerate(self.segments):
            fp = seg.field(field)
            if fp is None:
                blocks.append(sp.csr_matrix((seg.n_docs, len(self.terms[field])), dtype=np.float32))
                continue
            cols = self._global[field][k]
            blocks.append(sp.csr_matrix((np.asarray(fp.vals), cols[np.asarray(fp.cols)], np.asarray(fp.rows)),
                                        shape=(seg.n_docs, len(self.terms[field])), dtype=np.float32))
        mat = sp.vstack(blocks, format="csr") if blocks else sp.csr_matrix((0, 0), dtype=np.float32)
        if self.live_pos is not None:
            mat = mat[self.live_pos]
        mat.sort_indices()
        return mat


class _IdList(Sequence):
    """The view's document ids, read on demand from the segments."""

    def __init__(self, view: LiveView):
        self._view = view

    def __len__(self) -> int:
        return self._view.n

    def __getitem__(self, row):  # type: ignore[override]
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(len(self)))]
        if row < 0:
            row += len(self)
        if not 0 <= row < len(self):
            raise IndexError(row)
        s, r = self._view.locate(row)
        return self._view.segments[s].doc_id(r)

    def __iter__(self):
        v = self._view
        pos = 0
        for k, seg in enumerate(v.segments):
            base, end = int(v.bases[k]), int(v.bases[k + 1])
            if v.live_pos is None:
                rows = np.arange(seg.n_docs)
            else:
                stop = int(np.searchsorted(v.live_pos, end))
                rows = v.live_pos[pos:stop] - base
                pos = stop
            yield from seg.ids(rows)


class _RowLookup:
    """``row_of.get(doc_id)``: the view row of an id, by the segments' sorted id hashes."""

    def __init__(self, view: LiveView):
        self._view = view

    def get(self, did: str, default: int | None = None) -> int | None:
        v = self._view
        h = id_hashes([did])
        for k in range(len(v.segments) - 1, -1, -1):
            r = int(v.segments[k].lookup(h, [did])[0])
            if r < 0:
                continue
            g = int(v.bases[k]) + r
            if v.live_pos is None:
                return g
            i = int(np.searchsorted(v.live_pos, g))
            return i if i < len(v.live_pos) and v.live_pos[i] == g else default
        return default

    def __contains__(self, did: object) -> bool:
        return isinstance(did, str) and self.get(did) is not None


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
    names = set(base) | set(view.vector_fields)
    keep = [n for n in names if (not includes or any(fnmatch.fnmatchcase(n, p) for p in includes))
            and not any(fnmatch.fnmatchcase(n, p) for p in excludes)]
    if any(n in view.vector_fields for n in keep):
        full = view.full_source(row)
        return {n: full[n] for n in full if n in keep}
    return {n: base[n] for n in base if n in keep}
