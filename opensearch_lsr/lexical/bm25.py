"""Lucene / OpenSearch BM25 over analysed text (the ``match`` query's scoring on a ``text`` field).

Implements, in float32 as Lucene does (apache/lucene ``lucene/core/src/java/org/apache/lucene/``, read at
a stored main commit; the formula is Lucene 8+'s, whose releases OpenSearch 2.x/3.x ship, up to the
order of float operations):

- ``search/similarities/BM25Similarity``: ``idf = log(1 + (docCount - df + 0.5) / (df + 0.5))``,
  ``avgdl = sumTotalTermFreq / docCount``, a 256-entry cache
  ``1 / (k1 * ((1 - b) + b * LENGTH_TABLE[norm] / avgdl))`` and
  ``score = weight - weight / (1 + freq * cache[norm])`` with ``weight = boost * idf`` (Lucene 8.0 dropped
  the ``(k1 + 1)`` numerator factor, LUCENE-8563; the same formula in 9.x / 10.x);
- ``util/SmallFloat.intToByte4`` / ``byte4ToInt``: the one-byte field-length norm (lengths 0..23 exact,
  then 4 significant bits), computed from ``length - numOverlap`` (``discount_overlaps`` true);
- OpenSearch's default ``BM25`` similarity is ``LegacyBM25Similarity`` (opensearch-project/OpenSearch
  ``server/src/main/java/org/opensearch/index/similarity/SimilarityProviders.createBM25Similarity``),
  which scores with ``boost * (1 + k1)``: ``similarity="opensearch"`` (the default) keeps that factor so
  ``_score`` matches the server's; ``similarity="lucene"`` is plain Lucene 9. Rankings are identical.
- ``match`` (operator ``or``): one SHOULD ``TermQuery`` per analysed query token; repeated tokens are
  merged by ``BooleanQuery.rewrite`` into one clause with boost = repetitions; clause scores are summed
  in double and returned as float (``DisjunctionSumScorer``).

Checked against a real Lucene (8.8.1, ``tests/lucene``): over the same token stream the top-10 of 1,000
msmarco-ko dev queries equal ``LegacyBM25Similarity``'s, scores within 6e-8 relative.

Written by hand, not with ``bm25s``: bm25s (method ``lucene``) uses exact document lengths and float64,
so it cannot give the quantised-norm scores OpenSearch returns; ``tests/lexical`` checks that with
``length_norm="exact"`` this module reproduces bm25s's ``lucene`` scores (times ``1 + k1``).

:meth:`LuceneBM25.score` treats every query token as a SHOULD clause, which is what a ``discard``
stream gives; ``mixed`` streams are token graphs, queried clause by clause by
:func:`opensearch_lsr.lexical.queries.match_clause` (the local backend's ``match``).
"""
from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Mapping, Sequence, get_args

import numpy as np
from tqdm.auto import tqdm

from ..errors import LsrError
from .nori import NoriAnalyzer, NoriToken

if TYPE_CHECKING:
    from .analysis import TextAnalyzer

__all__ = ["BM25Error", "LuceneBM25", "Similarity", "top_rows", "LengthNorm", "int_to_byte4", "byte4_to_int", "LENGTH_TABLE"]

logger = logging.getLogger(__name__)

Similarity = Literal["opensearch", "lucene"]
LengthNorm = Literal["lucene", "exact"]


class BM25Error(LsrError, ValueError):
    """Bad BM25 parameters or input."""


# ---- SmallFloat (org.apache.lucene.util.SmallFloat) ----------------------------------------------

def _long_to_int4(i: int) -> int:
    num_bits = i.bit_length()
    if num_bits < 4:
        return i  # subnormal value
    shift = num_bits - 4
    encoded = (i >> shift) & 0x07  # keep 4 significant bits, the leading one implicit
    return encoded | ((shift + 1) << 3)


def _int4_to_long(i: int) -> int:
    bits = i & 0x07
    shift = (i >> 3) - 1
    return bits if shift == -1 else (bits | 0x08) << shift


_NUM_FREE_VALUES = 255 - _long_to_int4(2**31 - 1)  # 24


def int_to_byte4(i: int) -> int:
    """``SmallFloat.intToByte4`` as an unsigned byte (0..255): lengths < 24 exact, then 4 significant bits."""
    if i < 0:
        raise BM25Error(f"Only supports positive values, got {i}")
    return i if i < _NUM_FREE_VALUES else _NUM_FREE_VALUES + _long_to_int4(i - _NUM_FREE_VALUES)


def byte4_to_int(b: int) -> int:
    """``SmallFloat.byte4ToInt`` of an unsigned byte."""
    return b if b < _NUM_FREE_VALUES else _NUM_FREE_VALUES + _int4_to_long(b - _NUM_FREE_VALUES)


#: ``BM25Similarity.LENGTH_TABLE``: the decoded length of each norm byte.
LENGTH_TABLE = np.array([byte4_to_int(i) for i in range(256)], dtype=np.float32)
_ENCODE = np.vectorize(int_to_byte4, otypes=[np.int64])


def top_rows(rows: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` best of ``rows`` by ``scores[row]`` descending, ties by row ascending (Lucene's order)."""
    if len(rows) > k:
        kth = np.partition(scores[rows], len(rows) - k)[len(rows) - k]
        rows = rows[scores[rows] >= kth]
    return rows[np.lexsort((rows, -scores[rows]))][:k]


# ---- the index -----------------------------------------------------------------------------------

@dataclass
class LuceneBM25:
    """Inverted index of one analysed text field with Lucene BM25 scoring.

    Build with :meth:`build` (from a corpus) or :meth:`from_tokens` (from already analysed documents).
    """

    doc_ids: list[str]
    vocab: dict[str, int]
    indptr: np.ndarray  # [V + 1] postings offsets per term
    postings: np.ndarray  # [nnz] row (document) numbers, ascending within a term
    freqs: np.ndarray  # [nnz] float32 term frequencies
    lengths: np.ndarray  # [N] discounted field lengths (int64)
    sum_total_term_freq: int
    doc_count: int  # documents with at least one token in the field
    analyzer: "TextAnalyzer"
    k1: float = 1.2
    b: float = 0.75
    similarity: Similarity = "opensearch"
    length_norm: LengthNorm = "lucene"
    # positions (for phrase clauses): posting i's token positions are pos_data[pos_ptr[i]:pos_ptr[i + 1]]
    pos_ptr: np.ndarray | None = None
    pos_data: np.ndarray | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.k1) and self.k1 >= 0):
            raise BM25Error(f"illegal k1 value: {self.k1}, must be a non-negative finite value")
        if not (0 <= self.b <= 1):
            raise BM25Error(f"illegal b value: {self.b}, must be between 0 and 1")
        if self.similarity not in get_args(Similarity):
            raise BM25Error(f"similarity must be one of {', '.join(get_args(Similarity))}, got {self.similarity!r}")
        if self.length_norm not in get_args(LengthNorm):
            raise BM25Error(f"length_norm must be one of {', '.join(get_args(LengthNorm))}, got {self.length_norm!r}")
        self._prepare()

    # ---- construction ----------------------------------------------------------------------------

    @classmethod
    def build(cls, corpus: Mapping[str, str], analyzer: "TextAnalyzer | None" = None, k1: float = 1.2,
              b: float = 0.75, similarity: Similarity = "opensearch", length_norm: LengthNorm = "lucene",
              progress: bool = False) -> "LuceneBM25":
        """Analyse ``corpus`` (``{doc_id: text}``) and index it.

        Args:
            corpus: documents by id.
            analyzer: the field's analyzer (default: ``NoriAnalyzer()``, OpenSearch's ``nori``).
            k1, b: BM25 parameters (OpenSearch defaults 1.2, 0.75).
            similarity: ``opensearch`` (LegacyBM25Similarity, scores x (1 + k1)) or ``lucene``.
            length_norm: ``lucene`` (one-byte norm) or ``exact`` (for comparisons only).
            progress: show a progress bar while analysing.
        """
        analyzer = analyzer or NoriAnalyzer()
        ids = [str(d) for d in corpus]
        texts = tqdm(corpus.values(), total=len(ids), desc="nori analysis", disable=not progress, unit="doc")
        return cls.from_tokens(ids, [analyzer.tokens(t if isinstance(t, str) else "") for t in texts], analyzer,
                               k1=k1, b=b, similarity=similarity, length_norm=length_norm)

    @classmethod
    def from_tokens(cls, doc_ids: Sequence[str], docs: Sequence[Sequence[NoriToken]], analyzer: "TextAnalyzer",
                    positions: bool = False, **params) -> "LuceneBM25":
        """Index already analysed documents (token streams with position increments).

        ``positions``: also keep token positions (what phrase clauses need; Lucene's
        ``IndexOptions.DOCS_AND_FREQS_AND_POSITIONS`` of a ``text`` field).
        """
        if len(doc_ids) != len(docs):
            raise BM25Error(f"{len(doc_ids)} ids for {len(docs)} documents")
        vocab: dict[str, int] = {}
        rows: list[int] = []
        cols: list[int] = []
        vals: list[int] = []
        where: list[list[int]] = []
        lengths = np.zeros(len(docs), np.int64)
        total = 0
        count = 0
        for row, tokens in enumerate(docs):
            if positions:
                at: dict[str, list[int]] = {}
                pos = -1
                for t in tokens:
                    pos += t.position_increment
                    at.setdefault(t.term, []).append(max(pos, 0))
                counts = {term: len(p) for term, p in at.items()}
            else:
                counts = Counter(t.term for t in tokens)
            if counts:
                count += 1
            total += len(tokens)  # sumTotalTermFreq counts every token, stacked ones included
            lengths[row] = NoriAnalyzer.field_length(tokens)
            for term, c in counts.items():
                rows.append(row)
                cols.append(vocab.setdefault(term, len(vocab)))
                vals.append(c)
                if positions:
                    where.append(at[term])
        cols_a = np.asarray(cols, np.int64)
        order = np.lexsort((np.asarray(rows, np.int64), cols_a))
        indptr = np.zeros(len(vocab) + 1, np.int64)
        np.cumsum(np.bincount(cols_a, minlength=len(vocab)), out=indptr[1:])
        if positions:
            sizes = np.asarray([len(where[i]) for i in order], np.int64)
            params["pos_ptr"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            params["pos_data"] = np.asarray([p for i in order for p in where[i]], np.int32)
        return cls(doc_ids=list(doc_ids), vocab=vocab, indptr=indptr,
                   postings=np.asarray(rows, np.int32)[order], freqs=np.asarray(vals, np.float32)[order],
                   lengths=lengths, sum_total_term_freq=total, doc_count=count, analyzer=analyzer, **params)

    def _prepare(self) -> None:
        k1, b = np.float32(self.k1), np.float32(self.b)
        avgdl = np.float32(self.sum_total_term_freq / self.doc_count) if self.doc_count else np.float32(1.0)
        self.avgdl = float(avgdl)
        one = np.float32(1.0)
        if self.length_norm == "lucene":
            cache = one / (k1 * ((one - b) + b * LENGTH_TABLE / avgdl))  # float32, as BM25Similarity.scorer
            self.norm_bytes = _ENCODE(self.lengths).astype(np.uint8) if len(self.lengths) else np.zeros(0, np.uint8)
            self.norm_inverse = cache[self.norm_bytes]
        else:
            self.norm_bytes = None
            self.norm_inverse = one / (k1 * ((one - b) + b * self.lengths.astype(np.float32) / avgdl))
        dfs = np.diff(self.indptr)
        self.idf = np.log(1.0 + (self.doc_count - dfs + 0.5) / (dfs + 0.5)).astype(np.float32)
        self.boost_factor = np.float32(1.0 + self.k1) if self.similarity == "opensearch" else np.float32(1.0)

    # ---- persistence -----------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write the postings and statistics to one ``.npz`` file (atomically); the analyzer is not saved."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"k1": self.k1, "b": self.b, "similarity": self.similarity, "length_norm": self.length_norm,
                "sum_total_term_freq": int(self.sum_total_term_freq), "doc_count": int(self.doc_count)}
        tmp = path.with_name(path.name + ".tmp.npz")
        extra = {} if self.pos_ptr is None else {"pos_ptr": self.pos_ptr, "pos_data": self.pos_data}
        np.savez(tmp, meta=np.array(json.dumps(meta)), doc_ids=np.array(self.doc_ids, dtype=object),
                 terms=np.array(list(self.vocab), dtype=object), indptr=self.indptr, postings=self.postings,
                 freqs=self.freqs, lengths=self.lengths, **extra)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, analyzer: "TextAnalyzer") -> "LuceneBM25":
        """Read an index written by :meth:`save`; ``analyzer`` must be the one it was built with."""
        with np.load(path, allow_pickle=True) as z:
            meta = json.loads(str(z["meta"]))
            extra = {"pos_ptr": z["pos_ptr"], "pos_data": z["pos_data"]} if "pos_ptr" in z.files else {}
            return cls(doc_ids=[str(d) for d in z["doc_ids"]], vocab={str(t): i for i, t in enumerate(z["terms"])},
                       indptr=z["indptr"], postings=z["postings"], freqs=z["freqs"], lengths=z["lengths"],
                       analyzer=analyzer, **meta, **extra)

    # ---- scoring ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.doc_ids)

    def query_terms(self, text: str) -> Counter:
        """Analysed query tokens with their repetition counts (the rewritten clause boosts)."""
        return Counter(self.analyzer.analyze(text))

    def term_scores(self, term: str, boost: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, float32 scores)`` of one ``TermQuery`` with ``boost``."""
        tid = self.vocab.get(term)
        if tid is None:
            return np.zeros(0, np.int32), np.zeros(0, np.float32)
        lo, hi = self.indptr[tid], self.indptr[tid + 1]
        rows = self.postings[lo:hi]
        weight = np.float32(np.float32(boost) * self.boost_factor) * self.idf[tid]
        return rows, weight - weight / (np.float32(1.0) + self.freqs[lo:hi] * self.norm_inverse[rows])

    def phrase_scores(self, terms: Sequence[tuple[str, int]], boost: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, float32 scores)`` of an exact ``PhraseQuery`` (slop 0) of ``(term, relative position)``.

        Lucene: the phrase frequency is the number of exact matches, the idf is the sum of the terms'
        idfs (``BM25Similarity.idfExplain`` over ``TermStatistics[]``), scored like one term.
        """
        if self.pos_ptr is None or self.pos_data is None:
            raise BM25Error("phrase clauses need an index built with positions=True")
        tids = [self.vocab.get(t) for t, _ in terms]
        if any(t is None for t in tids):
            return np.zeros(0, np.int32), np.zeros(0, np.float32)
        lists = [self.postings[self.indptr[t]:self.indptr[t + 1]] for t in tids]
        rows = lists[0]
        for other in lists[1:]:
            rows = np.intersect1d(rows, other, assume_unique=True)
        offsets = [p - terms[0][1] for _, p in terms]
        found, freqs = [], []
        for row in rows:
            sets = []
            for tid, plist in zip(tids, lists):
                i = self.indptr[tid] + int(np.searchsorted(plist, row))
                sets.append(set(self.pos_data[self.pos_ptr[i]:self.pos_ptr[i + 1]].tolist()))
            freq = sum(1 for p in sets[0] if all(p + off in s_ for off, s_ in zip(offsets[1:], sets[1:])))
            if freq:
                found.append(row)
                freqs.append(freq)
        rows_a = np.asarray(found, np.int32)
        idf = np.float32(sum(float(self.idf[t]) for t in tids))  # summed in double, cast once
        weight = np.float32(np.float32(boost) * self.boost_factor) * idf
        f = np.asarray(freqs, np.float32)
        return rows_a, weight - weight / (np.float32(1.0) + f * self.norm_inverse[rows_a])

    def score(self, text: str, boost: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """``(matched mask [N], float32 scores [N])`` of a ``match`` query (operator ``or``) for ``text``."""
        acc = np.zeros(len(self.doc_ids), np.float64)
        mask = np.zeros(len(self.doc_ids), bool)
        for term, reps in self.query_terms(text).items():
            rows, s = self.term_scores(term, boost * reps)
            acc[rows] += s
            mask[rows] = True
        return mask, acc.astype(np.float32)

    def search(self, queries: Mapping[str, str], k: int = 100) -> dict[str, dict[str, float]]:
        """Top-``k`` documents per query as a ranx-style run ``{qid: {doc_id: score}}``.

        Ties are broken by index order (Lucene: lower doc id first); a query with no matching term
        gets an empty ranking.
        """
        if k < 1:
            raise BM25Error(f"k must be >= 1, got {k}")
        run: dict[str, dict[str, float]] = {}
        for qid, text in queries.items():
            mask, scores = self.score(text)
            top = top_rows(np.flatnonzero(mask), scores, k)
            run[str(qid)] = {self.doc_ids[r]: float(scores[r]) for r in top}
        return run
