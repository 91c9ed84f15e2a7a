"""Real-cluster suite: runs only with ``-m opensearch`` and ``OPENSEARCH_URL`` set (see docker-compose.yml).

Environment: OPENSEARCH_URL, optional OPENSEARCH_USER / OPENSEARCH_PASSWORD, OPENSEARCH_INSECURE=1
(self-signed demo certificates), OPENSEARCH_CA_CERTS, AWS_REGION (SigV4).
"""
from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("OPENSEARCH_URL"):
        return
    skip = pytest.mark.skip(reason="OPENSEARCH_URL is not set (start one with docker compose up)")
    for item in items:
        if "opensearch_real" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def real_client():
    from opensearch_lsr.opensearch.client import client_from_options

    return client_from_options(url=os.environ["OPENSEARCH_URL"], user=os.environ.get("OPENSEARCH_USER"),
                               password=os.environ.get("OPENSEARCH_PASSWORD"),
                               insecure=os.environ.get("OPENSEARCH_INSECURE") == "1",
                               ca_certs=os.environ.get("OPENSEARCH_CA_CERTS"),
                               aws_region=os.environ.get("AWS_REGION"), request_timeout=300)
