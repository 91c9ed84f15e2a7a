"""``benchmarks/hybrid_ensembles.py``: the weight simplex and the multi-sub-query hybrid's tuning."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ensembles():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("hybrid_ensembles", ROOT / "benchmarks" / "hybrid_ensembles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(ROOT / "benchmarks"))


def test_simplex_lists_every_weight_vector_once(ensembles):
    grid = ensembles.simplex(3, 0.05)
    assert len(grid) == 231 == len(set(grid))  # C(22, 2)
    assert all(abs(sum(w) - 1.0) < 1e-9 and min(w) >= 0 for w in grid)
    assert ensembles.simplex(2, 0.5) == [(0.0, 1.0), (0.5, 0.5), (1.0, 0.0)]


def test_multi_hybrid_chooses_on_held_out_and_fuses_dev_as_the_pipeline_would(ensembles):
    # nori ranks the relevant document last; the first model second; the second model first, but with a decoy
    # above it in the other runs: only weights leaning on the second model rank it first everywhere
    def runs(split):
        queries = [f"{split}{i}" for i in range(6)]
        nori = {q: [("decoy", 3.0), ("other", 2.0), (f"rel-{q}", 1.0)] for q in queries}
        first = {q: [("decoy", 2.0), (f"rel-{q}", 1.5), ("other", 1.0)] for q in queries}
        second = {q: [(f"rel-{q}", 5.0), ("other", 1.0), ("decoy", 0.5)] for q in queries}
        return queries, nori, first, second

    held, dev = runs("h"), runs("d")
    qrels = {"holdout": {q: {f"rel-{q}": 1} for q in held[0]}, "dev": {q: {f"rel-{q}": 1} for q in dev[0]}}
    pack = [{"holdout": held[i], "dev": dev[i]} for i in (1, 2, 3)]
    result = ensembles._multi_hybrid(pack[0], pack[1:], qrels, ["min_max"], 0.25)
    assert result["holdout_mrr@10"] == pytest.approx(1.0)
    assert result["mrr@10"] == pytest.approx(1.0)
    weights = [float(w) for w in result["label"].split()[1].rstrip(",").split("/")]
    assert weights[2] > weights[0]  # the chosen setting leans on the second model, not on nori
