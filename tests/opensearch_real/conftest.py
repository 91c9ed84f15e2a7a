"""Real-cluster suite: runs only with ``-m opensearch`` and ``OPENSEARCH_URL`` set.

A node: ``python tests/opensearch_real/cluster.py start`` (OpenSearch from Maven Central, what
``.ci/run`` does) or ``docker compose up``. Environment: OPENSEARCH_URL, optional OPENSEARCH_USER /
OPENSEARCH_PASSWORD, OPENSEARCH_INSECURE=1 (self-signed demo certificates), OPENSEARCH_CA_CERTS,
AWS_REGION (SigV4). A node started by ``cluster.py`` also sets OPENSEARCH_DATA_PATH,
OPENSEARCH_NODE_UID and LSR_DJL_KIT: its PyTorch cache is empty and the node cannot reach
publish.djl.ai, so the first deploy proves the air-gap failure and its fix (:func:`djl_cache_ready`).
OPENSEARCH_FIGURES=FILE writes the figures the suite measured as JSON.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

FIGURES: dict = {}


def pytest_collection_modifyitems(config, items):
    if os.environ.get("OPENSEARCH_URL"):
        return
    skip = pytest.mark.skip(reason="OPENSEARCH_URL is not set (tests/opensearch_real/cluster.py start)")
    for item in items:
        if "opensearch_real" in str(item.fspath):
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("OPENSEARCH_FIGURES")
    if path and FIGURES:
        Path(path).write_text(json.dumps(FIGURES, indent=2, ensure_ascii=False), encoding="utf-8")


@pytest.fixture(scope="session")
def figures() -> dict:
    """Measured figures (deploy time, bulk rates, latencies, metrics), written to OPENSEARCH_FIGURES."""
    return FIGURES


def _options() -> dict:
    """``client_from_options``'s keywords for the cluster named by the environment."""
    return {"url": os.environ["OPENSEARCH_URL"], "user": os.environ.get("OPENSEARCH_USER"),
            "password": os.environ.get("OPENSEARCH_PASSWORD"), "insecure": os.environ.get("OPENSEARCH_INSECURE") == "1",
            "ca_certs": os.environ.get("OPENSEARCH_CA_CERTS"), "aws_region": os.environ.get("AWS_REGION"),
            "request_timeout": 300}


def _client():
    from opensearch_lsr.opensearch.client import client_from_options

    return client_from_options(**_options())


@pytest.fixture(scope="session")
def real_bundle(tmp_path_factory) -> Path:
    """SPLADE-tiny exported once for the session (the zips ML Commons deploys)."""
    import torch

    from opensearch_lsr.opensearch.artifacts import export_bundle

    torch.set_num_threads(1)  # a small shared machine: the node needs the other core
    bundle = tmp_path_factory.mktemp("real_bundle") / "bundle"
    export_bundle("splade-tiny", bundle, verify=False)
    return bundle


@pytest.fixture(scope="session")
def djl_cache_ready(real_bundle, figures) -> dict | None:
    """On a node started by cluster.py with an empty PyTorch cache: deploy (must fail on publish.djl.ai
    with the airgap-kit hint), install the kit into the node's path.data, deploy again (no restart).

    Returns what was observed, or None for a cluster this suite did not start (nothing is touched).
    """
    data, kit = os.environ.get("OPENSEARCH_DATA_PATH"), os.environ.get("LSR_DJL_KIT")
    if not (data and kit):
        return None
    import time

    from opensearch_lsr.opensearch.djl_cache import install_kit
    from opensearch_lsr.opensearch.mlcommons import DeployConfig, DeployError, deploy_bundle

    target = Path(data) / "ml_cache" / "pytorch" / Path(kit).name
    observed: dict = {"seeded_before": target.is_dir()}
    client = _client()
    if not observed["seeded_before"]:
        try:
            deploy_bundle(client, real_bundle, DeployConfig(apply_settings=True, which="encoding", timeout_s=120))
            observed["unseeded_deploy"] = "succeeded"
        except DeployError as err:
            observed["unseeded_deploy"] = "failed"
            observed["error"] = str(err)
        installed = install_kit(kit, data, link=True)
        uid = int(os.environ.get("OPENSEARCH_NODE_UID", os.geteuid()))
        if os.geteuid() == 0 and uid != 0:
            for path in [installed.parent.parent, installed.parent, installed, *installed.iterdir()]:
                os.chown(path, uid, uid)
        observed["installed"] = str(installed)
    t0 = time.perf_counter()
    ids = deploy_bundle(client, real_bundle, DeployConfig(apply_settings=True, which="encoding", timeout_s=300))
    observed["seeded_deploy_s"] = round(time.perf_counter() - t0, 2)
    observed["model_id"] = ids["sparse_encoding"]
    figures["airgap"] = {k: v for k, v in observed.items() if k != "error"}
    return observed


@pytest.fixture(scope="session")
def real_client(djl_cache_ready):
    return _client()


@pytest.fixture(scope="session")
def client_options(real_client) -> dict:
    """The connection keywords of :func:`real_client` (for a client factory, as Ray's actors need)."""
    return _options()


def _conn_args() -> list[str]:
    args = ["--url", os.environ["OPENSEARCH_URL"], "--request-timeout", "300"]
    for env, flag in (("OPENSEARCH_USER", "--user"), ("OPENSEARCH_PASSWORD", "--password"),
                      ("OPENSEARCH_CA_CERTS", "--ca-certs"), ("AWS_REGION", "--aws-region")):
        if os.environ.get(env):
            args += [flag, os.environ[env]]
    if os.environ.get("OPENSEARCH_INSECURE") == "1":
        args.append("--insecure")
    return args


@pytest.fixture(scope="session")
def run_cli(real_client):
    """``run_cli(*args, ok=True)`` -> (exit code, stdout) of ``lsr-os`` with the cluster's connection flags;
    with ``ok=False`` -> (exit code, stderr without progress bars); ``conn=False`` leaves the flags out."""
    from click.testing import CliRunner

    from opensearch_lsr.cli import cli

    def run(*args, ok: bool = True, conn: bool = True):
        argv = [str(a) for a in args] + (_conn_args() if conn else [])
        res = CliRunner().invoke(cli, argv)
        if ok:
            assert res.exit_code == 0, res.output
            return res.exit_code, res.stdout
        # stderr without the progress bars of model loading: what a user reads
        return res.exit_code, "\n".join(line for line in res.stderr.splitlines() if "\r" not in line and "it/s]" not in line)

    return run
