"""Elasticsearch 8.15+ / 9.x: text_expansion export, deploy, sparse_vector index and query."""
from __future__ import annotations

__all__: list[str] = []
