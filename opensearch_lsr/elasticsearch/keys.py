"""Token keys for Elasticsearch ``sparse_vector`` fields: always valid, equal to what the model emits.

Two rules from Elasticsearch's source decide a key:

* the ``sparse_vector`` mapper refuses dots: ``"[sparse_vector] fields do not support dots in
  feature names but found [<feature>]"`` (``server/.../index/mapper/vectors/SparseVectorFieldMapper.java``,
  ``parse``; elastic/elasticsearch PR #93756, 8.7+), and a feature given twice in one document fails
  ("do not support indexing multiple values for the same feature");
* a deployed ``text_expansion`` model names token ``i`` by ``vocabulary[i]`` with every ``.``
  replaced by ``__`` (``TextExpansionProcessor.buildSanitizedVocabMap``), keeps tokens whose
  weight is ``> 0`` and does not skip special tokens.

So the keys the toolkit writes for precomputed vectors (bulk) and ``query_vector`` queries are
``vocabulary[i].replace(".", "__")`` too, and the same document indexed by the ingest pipeline or
by ``lsr-os index`` gets the same features. Any other character is a valid Lucene term (the
feature name is indexed as a term of at most 32766 UTF-8 bytes; vocabularies hold short tokens).
When sanitising makes two ids share a key (``a.b`` and ``a__b`` both present), the larger weight
is kept, which is also the only value the field can hold.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

__all__ = ["es_key", "es_keys", "key_collisions", "sanitize_features", "MAX_TERM_BYTES"]

#: Lucene ``IndexWriter.MAX_TERM_LENGTH``: a feature name longer than this (UTF-8) cannot be indexed.
MAX_TERM_BYTES = 32766


def es_key(token: str) -> str:
    """``TextExpansionProcessor``'s name for a vocabulary entry: dots become ``__``."""
    return token.replace(".", "__")


def es_keys(vocabulary: Sequence[str]) -> list[str]:
    """:func:`es_key` for every id."""
    return [es_key(t) for t in vocabulary]


def key_collisions(vocabulary: Sequence[str]) -> list[tuple[int, int, str]]:
    """``(first_id, later_id, key)`` for ids whose sanitised keys coincide."""
    seen: dict[str, int] = {}
    out: list[tuple[int, int, str]] = []
    for i, token in enumerate(vocabulary):
        key = es_key(token)
        if key in seen:
            out.append((seen[key], i, key))
        else:
            seen[key] = i
    return out


def sanitize_features(features: Mapping[str, float] | Iterable[tuple[str, float]]) -> dict[str, float]:
    """Make a ``{token: weight}`` map indexable: dots replaced, weights > 0 only, merged by max.

    Raises:
        ValueError: a key that is empty or longer than Lucene's term limit.
    """
    items = features.items() if isinstance(features, Mapping) else features
    out: dict[str, float] = {}
    for token, weight in items:
        w = float(weight)
        if not w > 0.0:  # also drops NaN
            continue
        key = es_key(str(token))
        if not key or len(key.encode("utf-8")) > MAX_TERM_BYTES:
            raise ValueError(f"feature name {token!r} cannot be indexed in a sparse_vector field")
        if w > out.get(key, 0.0):
            out[key] = w
    return out
