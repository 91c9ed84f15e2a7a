"""Engines that hold an index, as peers behind one protocol (:class:`~opensearch_lsr.engines.base.Engine`),
and what they share.

=================  ===============================================  =========================================
kind               class                                            module
=================  ===============================================  =========================================
``local``          ``LocalEngine``                                  ``local/engine.py`` (embedded)
``opensearch``     ``OpenSearchEngine``                             ``opensearch/engine.py`` (a cluster)
``elasticsearch``  ``ElasticsearchEngine``                          ``elasticsearch/engine.py`` (a cluster)
=================  ===============================================  =========================================

This package is the registry (:data:`ENGINES`, :func:`make_engine`, :func:`connect`, :func:`client_factory`,
:func:`connection_options`, :func:`export`) and the engine-neutral pieces every engine package builds on; no engine owns
them and they import no engine:

- :mod:`.base`: the protocol, bulk outcomes, ``VectorField``, the ``DocumentWriter`` protocol;
- :mod:`.bulk_retry`: the retry rounds and writer of a cluster's ``_bulk`` (tenacity);
- :mod:`.templates`: the ``mappings/`` and ``pipelines/`` JSON templates, loading and rendering;
- :mod:`.versions`: engine version numbers;
- :mod:`.query_dsl`: the ``neural_sparse`` query bodies (OpenSearch and the local engine);
- :mod:`.export_core`: the encoder loaded for a TorchScript export (both cluster exports);
- :mod:`.model_runtime`: an exported ML Commons zip run as ML Commons runs it (the OpenSearch conformance
  check and the local engine).

A new engine is one package with an ``engine.py`` whose class satisfies :class:`~.base.Engine`, plus one
line in :data:`ENGINES`. The registry imports implementations lazily (by name), so the local engine never
imports a cluster client and this package depends on no engine. Code outside the engine packages (the
CLI's shared commands, the index job, search, evaluation) reaches an engine through these functions only;
``tests/test_package_structure.py`` enforces it.
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from .base import BulkOutcome, DocumentWriter, Engine, EngineKind, IndexKind, VectorField

__all__ = ["Engine", "BulkOutcome", "DocumentWriter", "EngineKind", "IndexKind", "VectorField", "ENGINES",
           "engine_class", "make_engine", "connect", "client_factory", "connection_options", "export"]

#: kind -> "module:Class" of its implementation.
ENGINES: dict[str, str] = {
    "local": "opensearch_lsr.local.engine:LocalEngine",
    "opensearch": "opensearch_lsr.opensearch.engine:OpenSearchEngine",
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


def _needs(kind: str, attribute: str) -> Any:
    cls = engine_class(kind)
    if not hasattr(cls, attribute):
        raise ValueError(f"the {kind} engine has no {attribute.replace('_', ' ')}")
    return getattr(cls, attribute)


def connect(kind: str, **options: Any) -> Engine:
    """An engine of ``kind`` from command-line connection options (see :func:`connection_options`;
    other keys are ignored, so a command can pass all of its parameters)."""
    return _needs(kind, "from_options")(**options)


def client_factory(kind: str, **options: Any) -> Callable[[], Any]:
    """A zero-argument callable that builds ``kind``'s client from connection options (the index job
    calls it once per writer, also inside Ray workers)."""
    return functools.partial(_needs(kind, "client_from_options"), **options)


def connection_options(kind: str) -> Callable[[Callable], Callable]:
    """The click decorator adding ``kind``'s connection options (``--url``, auth, TLS ...) to a command."""
    return _needs(kind, "connection_options")


def export(kind: str, model_dir: Any, out_dir: Any, **options: Any) -> dict[str, Any]:
    """Export an encoder as ``kind``'s model artifact (OpenSearch: the ML Commons bundle; Elasticsearch: the
    ``text_expansion`` trained model); returns the export's report."""
    return _needs(kind, "export")(model_dir, out_dir, **options)
