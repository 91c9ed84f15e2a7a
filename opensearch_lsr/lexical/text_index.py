"""Analysed postings of a local index's ``text`` field, built once per set of segments and cached.

The local backend keeps documents as JSON sources in immutable segments. The first ``match`` on a text
field analyses that field of every live document (``LuceneBM25``: ~5 s for 7k MS MARCO-ko passages with
nori on one core) and writes the postings next to the segments, keyed by the segment list, the field and
the analyzer settings; later searches (in this process: from memory; in another: from that file, well
under a second) reuse them until a write changes the segments. Older cache files of the field are removed.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .analysis import TextAnalyzer
from .bm25 import LuceneBM25
from .nori import NoriToken

__all__ = ["text_field_bm25", "analyse_values", "CACHE_DIRNAME"]

logger = logging.getLogger(__name__)

CACHE_DIRNAME = "text_postings"
_MEMORY: OrderedDict[str, LuceneBM25] = OrderedDict()
_MEMORY_SIZE = 4


def analyse_values(analyzer: TextAnalyzer, value: Any) -> tuple[NoriToken, ...]:
    """Tokens of one source value: a string, a list of strings (values analysed one after the other), or none."""
    if isinstance(value, str):
        return analyzer.tokens(value)
    if isinstance(value, list):  # values follow each other with position_increment_gap 100 (text fields)
        out: list[NoriToken] = []
        for v in value:
            if isinstance(v, str):
                toks = analyzer.tokens(v)
                if out and toks:
                    first = toks[0]
                    toks = (NoriToken(first.term, first.pos, first.position_increment + 100, first.position_length),
                            *toks[1:])
                out.extend(toks)
        return tuple(out)
    return ()


def _key(segments: Sequence[str], field: str, analyzer: TextAnalyzer, params: dict[str, Any]) -> str:
    blob = json.dumps({"segments": list(segments), "field": field, "analyzer": analyzer.settings(), **params},
                      sort_keys=True, default=str)
    return hashlib.sha1(blob.encode("utf-8")).hexdigest()[:16]


def text_field_bm25(index_dir: str | os.PathLike | None, segments: Sequence[str], field: str,
                    analyzer: TextAnalyzer, doc_ids: Sequence[str], values: Callable[[], Iterable[Any]],
                    k1: float = 1.2, b: float = 0.75) -> LuceneBM25:
    """The BM25 index of ``field`` over the live documents ``doc_ids`` (in row order).

    Args:
        index_dir: the local index directory (``None``: memory only).
        segments: the index's current segment names (the cache key: segments are immutable).
        field: the text field.
        analyzer: its analyzer (from the mapping, :func:`analyzer_for_field`).
        doc_ids: live document ids in the view's row order.
        values: yields each row's source value of ``field`` (called only on a cache miss).
        k1, b: the similarity's parameters.
    """
    params = {"k1": k1, "b": b, "n": len(doc_ids), "positions": True}
    key = _key(segments, field, analyzer, params)
    mem_key = f"{index_dir}:{key}"
    hit = _MEMORY.get(mem_key)
    if hit is not None:
        _MEMORY.move_to_end(mem_key)
        return hit
    path = Path(index_dir) / CACHE_DIRNAME / f"{_safe(field)}-{key}.npz" if index_dir is not None else None
    bm25 = None
    if path is not None and path.exists():
        try:
            bm25 = LuceneBM25.load(path, analyzer)
            if bm25.doc_ids != list(doc_ids):
                bm25 = None
        except (OSError, ValueError, KeyError) as err:  # a torn or foreign file: rebuild it
            logger.warning("ignoring the unreadable text postings cache %s (%s)", path, err)
            bm25 = None
    if bm25 is None:
        logger.info("analysing field %r of %d documents for BM25", field, len(doc_ids))
        docs = [analyse_values(analyzer, v) for v in values()]
        bm25 = LuceneBM25.from_tokens(list(doc_ids), docs, analyzer, positions=True, k1=k1, b=b)
        if path is not None:
            try:
                bm25.save(path)
                for old in path.parent.glob(f"{_safe(field)}-*.npz"):
                    if old != path:
                        old.unlink(missing_ok=True)
            except OSError as err:  # read-only index dir: keep it in memory only
                logger.warning("could not write the text postings cache %s (%s)", path, err)
    _MEMORY[mem_key] = bm25
    while len(_MEMORY) > _MEMORY_SIZE:
        _MEMORY.popitem(last=False)
    return bm25


def _safe(field: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in field)
