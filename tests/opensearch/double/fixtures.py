"""pytest fixtures around the double; import them into a test module with ``from double.fixtures import *``."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from .server import OpenSearchDouble

__all__ = ["FakeRuntime", "fake_bundle", "make_double", "os_double", "os_client", "fake_bundle_dir"]


class FakeRuntime:
    """Stand-in for a loaded model in the *protocol* tests (deploy flow, faults): fixed token weights.

    The end-to-end tests run real exported zips through ``MLCommonsRuntime`` instead.
    """

    def __init__(self, function_name: str) -> None:
        self.function_name = function_name

    def predict(self, texts, embedding_format="word"):
        if embedding_format == "token_id":
            return [{"7592": 1.5, "2088": 0.5} for _ in texts]
        return [{"hello": 1.5, "world": 0.5} for _ in texts]


def fake_bundle(directory: Path, *, encoding_bytes: int = 2500, tokenize_bytes: int = 700,
                vocab_size: int = 30522, salt: bytes = b"") -> Path:
    """A bundle whose zips are opaque bytes (the protocol tests never load them)."""
    directory.mkdir(parents=True, exist_ok=True)
    manifest = {"name": "fake-splade", "version": "1.0.0", "vocab_size": vocab_size, "key_format": "word"}
    for key, fn, size in (("sparse_encoding", "SPARSE_ENCODING", encoding_bytes),
                          ("sparse_tokenize", "SPARSE_TOKENIZE", tokenize_bytes)):
        data = (hashlib.sha256(salt + key.encode()).digest() * (size // 32 + 1))[:size]
        (directory / f"{key}.zip").write_bytes(data)
        manifest[key] = {"file": f"{key}.zip", "sha256": hashlib.sha256(data).hexdigest(), "size_bytes": size,
                         "function_name": fn, "model_format": "TORCH_SCRIPT"}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def make_double(version: str = "3.3.0", **kwargs) -> OpenSearchDouble:
    kwargs.setdefault("model_loader", lambda path, fn: FakeRuntime(fn))
    kwargs.setdefault("task_delay_s", 0.01)
    return OpenSearchDouble(version, **kwargs).start()


@pytest.fixture
def os_double():
    double = make_double()
    yield double
    double.stop()


@pytest.fixture
def os_client(os_double):
    from opensearch_lsr.opensearch.client import client_from_options

    return client_from_options(url=os_double.url, max_retries=2)


@pytest.fixture
def fake_bundle_dir(tmp_path) -> Path:
    return fake_bundle(tmp_path / "bundle")
