"""Fixtures for the Elasticsearch chain: the double (imported as ``es_double``: the directory has no
``__init__.py`` so that it never shadows the ``elasticsearch`` client package), a client, a tiny export."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_DOUBLE = Path(__file__).parent / "double"
if "es_double" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("es_double", _DOUBLE / "__init__.py",
                                                   submodule_search_locations=[str(_DOUBLE)])
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["es_double"] = _mod
    _spec.loader.exec_module(_mod)

pytest.importorskip("elasticsearch")


@pytest.fixture
def es_double():
    from es_double import ElasticsearchDouble

    double = ElasticsearchDouble().start()
    yield double
    double.stop()


@pytest.fixture
def es_client(es_double):
    from opensearch_lsr.elasticsearch.client import make_es_client

    return make_es_client(es_double.url, max_retries=1)


@pytest.fixture(scope="session")
def es_bundle(tmp_path_factory, splade_tiny_dir) -> Path:
    """SPLADE-tiny exported for Elasticsearch (the conformance check runs inside the export)."""
    import torch

    from opensearch_lsr.elasticsearch.export import export_elasticsearch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("es_bundle")
    export_elasticsearch(str(splade_tiny_dir), out)
    return out
