"""``benchmarks/encoder_process.py``: the ``--encoder-process`` job beside the in-process one, in one run."""
from __future__ import annotations

import json

import pytest


@pytest.mark.slow  # two jobs, one spawning the encoder process (test_parallel covers that path by default)
def test_both_jobs_write_every_passage_and_the_run_says_how_they_compare(shared_data, tmp_path, load_script):
    module = load_script("encoder_process")
    out = tmp_path / "e.json"
    result = module.main(["--data", str(shared_data), "--limit", "40", "--repeat", "1", "--out", str(out)])
    assert json.loads(out.read_text())["run"]["commit"] and "| --encoder-process |" in out.with_suffix(".md").read_text()
    for name in ("in process", "--encoder-process"):
        (run,) = result[name]["runs"]
        assert run["docs"] == 40 and run["bytes"] > 0 and run["device_thread_s"]["launch"] > 0
    assert 100 <= result["vocabulary"] < 32_000  # trained on the passages: far under a real model's
    assert result["in process"]["x_in_process"] == 1.0 and result["--encoder-process"]["x_in_process"] > 0
