"""``benchmarks/ray_index.py``: its medians over repeated Ray settings and the results table (the runs themselves
need a Ray cluster: ``tests/encoding/test_ray_job.py`` covers the job)."""
from __future__ import annotations

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(autouse=True)
def _harness_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports harness as a sibling, as when run


def _run(workers: int, calls: int, wall: float, identical: bool = True) -> dict:
    return {"engine": "ray", "workers": workers, "calls": calls, "threads": 1, "docs": 100, "wall_s": wall,
            "docs_per_s": round(100 / wall, 2), "steady_docs_per_s": round(120 / wall, 2), "startup_s": 2.0,
            "vs_single_1_thread": round(10 / wall, 3), "identical_documents": identical,
            "max_abs_dw": 0.0 if identical else 7e-6, "same_counts": True}


def test_medians_per_setting_and_every_repeat_must_match(load_script):
    module = load_script("ray_index")
    runs = [_run(1, 1, 10.0), _run(1, 2, 8.0), _run(1, 1, 12.0), _run(1, 2, 9.0, identical=False), _run(1, 1, 11.0),
            _run(1, 2, 7.0)]
    rows = {(r["workers"], r["calls"]): r for r in module._medians(runs, single_wall=10.0)}
    one, two = rows[(1, 1)], rows[(1, 2)]
    assert one["repeats"] == two["repeats"] == 3
    assert one["wall_s"] == 11.0 and two["wall_s"] == 8.0 and one["docs_per_s"] == 9.09
    assert one["docs_per_s_runs"] == [10.0, 8.33, 9.09] and one["vs_single_1_thread"] == round(10 / 11, 3)
    assert one["identical_documents"] and not two["identical_documents"]  # one repeat differing is reported
    assert one["max_abs_dw"] == 0.0 and two["max_abs_dw"] == 7e-6


def test_documents_differing_only_in_the_last_bits_are_told_from_other_documents(load_script):
    module = load_script("ray_index")
    ref = {"a": {"text": "x", "sparse_embedding": {"k": 1.0, "m": 0.5}}}
    assert module._weight_distance(ref, {"a": {"text": "x", "sparse_embedding": {"k": 1.000004, "m": 0.5}}}) == \
        pytest.approx(4e-6)
    assert module._weight_distance(ref, {"a": {"text": "x", "sparse_embedding": {"k": 1.0}}}) is None  # a key lost
    assert module._weight_distance(ref, {"a": {"text": "y", "sparse_embedding": {"k": 1.0, "m": 0.5}}}) is None
    assert module._weight_distance(ref, {}) is None
    assert module._sameness({"identical_documents": False, "max_abs_dw": 7e-6}) == "yes, weights within 7.0e-06"
    assert module._sameness({"identical_documents": False, "max_abs_dw": None}) == "NO"


def test_table_has_a_row_per_setting_and_the_calls_ratio(load_script):
    module = load_script("ray_index")
    single = {"engine": "single", "threads": 1, "docs": 100, "wall_s": 10.0, "docs_per_s": 10.0,
              "vs_single_1_thread": 1.0, "steady_docs_per_s": 11.0, "identical_documents": True, "same_counts": True}
    runs = [single, _run(1, 1, 10.0), _run(1, 2, 8.0), _run(1, 2, 9.0), _run(1, 1, 11.0)]
    result = {"runs": runs, "ray_settings": module._medians(runs[1:], 10.0),
              "calls_over_1": {"workers 1, calls 2": 1.235}, "model": "m", "limit": 100, "corpus": "c.jsonl",
              "chunk_docs": 128, "batch_size": 32, "ray_init_s": 3.0, "load_avg_end": [1.0, 1.0, 1.0],
              "run": {"machine": {"loadavg": [1.0, 1.0, 1.0]}}}
    text = module.render(result)
    assert text.count("| `--engine ray") == 2 and "2 block(s) at once), median of 2: 12.5 / 11.11 docs/s" in text
    assert "workers 1, calls 2 over one block at a time: 1.235x" in text
