"""The shared benchmark harness (``benchmarks/harness.py``): timing with repeats, named stages, the run line
every results file opens with, JSON + markdown writing, tables. Loaded by file: benchmarks are not a package."""
from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("harness", ROOT / "benchmarks" / "harness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["harness"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("harness", None)


def test_time_call_times_each_repeat_after_untimed_warmups(harness):
    calls = []

    def work():
        calls.append(1)
        time.sleep(0.01)
        return len(calls)

    timed = harness.time_call(work, repeats=3, warmup=2)
    assert len(calls) == 5 and timed.result == 5
    assert len(timed.runs) == 3 and all(r >= 0.009 for r in timed.runs)
    assert timed.best <= timed.median <= max(timed.runs)
    assert set(timed.as_dict()) == {"runs_s", "median_s", "best_s"}
    with pytest.raises(ValueError):
        harness.time_call(work, repeats=0)


def test_stages_add_up_a_stage_entered_twice_and_keep_a_given_dict(harness):
    seen: dict[str, float] = {"earlier": 1.0}
    stages = harness.Stages(seen)
    for _ in range(2):
        with stages("encode"):
            time.sleep(0.01)
    with pytest.raises(RuntimeError), stages("failing"):
        raise RuntimeError("the stage is still timed")
    assert seen["earlier"] == 1.0 and seen["encode"] >= 0.018 and "failing" in seen


def test_run_info_names_date_commit_command_and_machine(harness):
    info = harness.run_info([str(ROOT / "benchmarks" / "x.py"), "--limit", "a b"])
    assert info["command"] == "python benchmarks/x.py --limit 'a b'"
    assert info["commit"] and len(info["date"]) == len("2026-01-01 00:00 UTC")
    m = info["machine"]
    assert m["cores"] >= 1 and m["python"] and isinstance(m["cpu_flags"], list) and len(m["loadavg"]) == 3
    line = harness.describe(m)
    assert f"{m['cores']} cores" in line and "Python" in line


def test_write_results_puts_the_run_line_under_the_title(harness, tmp_path):
    info = {"date": "2026-01-02 03:04 UTC", "commit": "abc1234", "command": "python benchmarks/x.py",
            "machine": {"cpu": "CPU", "cores": 2, "ram_gib": 4.0, "cpu_flags": ["avx2"], "gpu": None, "os": "Linux",
                        "python": "3.11", "torch": "2.13", "loadavg": [0.5, 0.4, 0.3]}}
    table = harness.markdown_table(["row", "MRR@10", "note"], [["a|b", 0.12345, None], ["c", 1, "x"]])
    assert table.splitlines()[2] == "| a/b | 0.123 | — |"
    json_path, md_path = harness.write_results(tmp_path / "out" / "bench", {"rows": [1]}, "# Title\n\n" + table, info)
    assert json.loads(json_path.read_text()) == {"rows": [1], "run": info}
    lines = md_path.read_text().splitlines()
    assert lines[0] == "# Title" and lines[1] == ""
    assert lines[2].startswith("Run: 2026-01-02 03:04 UTC, commit `abc1234`, `python benchmarks/x.py`; machine: 2 cores")
    assert lines[4] == "| row | MRR@10 | note |"
    assert harness.write_results(tmp_path / "only", {"a": 1}, info=info)[1] is None


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_recorded_in_names_the_commits_of_a_tracked_file(harness):
    assert harness.recorded_in(ROOT / "pyproject.toml").startswith("commit")
    assert harness.recorded_in(ROOT / "no-such-file.json").startswith("an unknown commit")
