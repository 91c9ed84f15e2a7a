"""Lexical retrieval that behaves like OpenSearch's: the ``nori`` analyzer, Lucene BM25, hybrid fusion."""
