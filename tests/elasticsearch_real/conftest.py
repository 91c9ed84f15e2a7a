"""Real-cluster suite: runs only with ``-m elasticsearch`` and ``ELASTICSEARCH_URL`` set (docker-compose.yml).

Environment: ELASTICSEARCH_URL, optional ELASTICSEARCH_API_KEY or ELASTICSEARCH_USER / ELASTICSEARCH_PASSWORD,
ELASTICSEARCH_CA_CERTS, ELASTICSEARCH_INSECURE=1 (self-signed certificates). The cluster needs a licence that
allows trained models (the docker-compose service starts a trial) and, for nori, the analysis-nori plugin.
"""
from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("ELASTICSEARCH_URL"):
        return
    skip = pytest.mark.skip(reason="ELASTICSEARCH_URL is not set (docker compose up -d --build elasticsearch)")
    for item in items:
        if "elasticsearch_real" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def real_es():
    pytest.importorskip("elasticsearch")
    from opensearch_lsr.elasticsearch.client import make_es_client

    return make_es_client(os.environ["ELASTICSEARCH_URL"], api_key=os.environ.get("ELASTICSEARCH_API_KEY"),
                          user=os.environ.get("ELASTICSEARCH_USER"), password=os.environ.get("ELASTICSEARCH_PASSWORD"),
                          ca_certs=os.environ.get("ELASTICSEARCH_CA_CERTS"),
                          insecure=os.environ.get("ELASTICSEARCH_INSECURE") == "1", request_timeout=600)
