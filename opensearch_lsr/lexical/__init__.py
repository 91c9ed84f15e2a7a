"""Lexical retrieval that behaves like OpenSearch's: the ``nori`` analyzer, Lucene BM25, hybrid fusion.

Modules: :mod:`.nori` (analyzer), :mod:`.analysis` (a field's analyzer from settings/mappings),
:mod:`.bm25` (Lucene BM25), :mod:`.text_index` (cached postings of a local index's text field),
:mod:`.queries` (``match`` / ``hybrid``), :mod:`.fusion` (neural-search normalisation and RRF). The nori and
hybrid rows of an evaluation are :mod:`opensearch_lsr.evaluation.baselines`. Details: ``docs/nori-baseline.md``.
"""
from __future__ import annotations

__all__: list[str] = []
