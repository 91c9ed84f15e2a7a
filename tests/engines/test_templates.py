"""Where the mappings/ and pipelines/ templates are found: env var, checkout, installed data files."""
from __future__ import annotations

import shutil
import sys

import pytest

from opensearch_lsr.engines import templates as indices
from opensearch_lsr.engines.templates import IndexSetupError, load_template, templates_root


def test_checkout_root_by_default(monkeypatch):
    monkeypatch.delenv("LSR_TEMPLATES_DIR", raising=False)
    assert templates_root() == indices._REPO_ROOT
    assert "properties" in load_template("mappings", "rank_features")["mappings"]


def test_installed_data_files_when_no_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv("LSR_TEMPLATES_DIR", raising=False)
    share = tmp_path / "prefix" / "share" / "opensearch-lsr"
    for kind in ("mappings", "pipelines"):
        shutil.copytree(indices._REPO_ROOT / kind, share / kind)
    monkeypatch.setattr(indices, "_REPO_ROOT", tmp_path / "site-packages")
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    assert templates_root() == share
    assert load_template("pipelines", "ingest_sparse_encoding")


def test_missing_everywhere_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LSR_TEMPLATES_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(IndexSetupError, match="set LSR_TEMPLATES_DIR"):
        templates_root()
