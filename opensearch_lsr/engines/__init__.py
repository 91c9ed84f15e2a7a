"""Engines that hold an index, behind one protocol (:class:`~opensearch_lsr.engines.base.Engine`).

=================  ===============================================  =====================================
kind               class                                            module
=================  ===============================================  =====================================
``local``          :class:`~.local.LocalEngine`                     ``engines/local.py`` (embedded)
``opensearch``     :class:`~.opensearch.OpenSearchEngine`           ``engines/opensearch.py`` (a cluster)
``elasticsearch``  ``ElasticsearchEngine``                          ``elasticsearch/engine.py`` (a cluster)
=================  ===============================================  =====================================

A new engine is one module with a class that satisfies :class:`~.base.Engine`, plus one line in
:data:`ENGINES`. Implementations import lazily, so the local engine never imports a cluster client.
"""
from __future__ import annotations

import importlib
from typing import Any

from .base import BulkOutcome, Engine, EngineKind, IndexKind

__all__ = ["Engine", "BulkOutcome", "EngineKind", "IndexKind", "ENGINES", "engine_class", "make_engine"]

#: kind -> "module:Class" of its implementation.
ENGINES: dict[str, str] = {
    "local": "opensearch_lsr.engines.local:LocalEngine",
    "opensearch": "opensearch_lsr.engines.opensearch:OpenSearchEngine",
    "elasticsearch": "opensearch_lsr.elasticsearch.engine:ElasticsearchEngine",
}


def engine_class(kind: str) -> type:
    """The implementation class of engine ``kind``."""
    if kind not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(sorted(ENGINES))}, got {kind!r}")
    module, _, name = ENGINES[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def make_engine(kind: str, *args: Any, **kwargs: Any) -> Engine:
    """An engine of ``kind`` built with ``args``/``kwargs`` (e.g. ``make_engine("opensearch", client)``)."""
    return engine_class(kind)(*args, **kwargs)
