from __future__ import annotations

from click.testing import CliRunner

from opensearch_lsr.cli import cli


def test_index_help_explains_policies():
    out = CliRunner().invoke(cli, ["index", "--help"]).output
    for needle in ("skipped.jsonl", "dead_letter.jsonl", "duplicate_id", "invalid_utf8", "--resume", "kill -9",
                   "429 and 5xx", "--long-text", "--prune", "--device"):
        assert needle in out, needle


def test_index_bad_options_are_one_sentence(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "a", "text": "x"}\n')
    res = CliRunner().invoke(cli, ["index", "--corpus", str(corpus), "--model", "splade-tiny", "--index",
                                   str(tmp_path / "i"), "--prune", "max_ratio:1.5"])
    assert res.exit_code != 0 and "Illegal prune_ratio" in res.output and "Traceback" not in res.output


def _job_setting(tmp_path, monkeypatch, field: str) -> tuple[list[str], list]:
    """``lsr-os index`` arguments for a one-line corpus, and the list each run appends its job config's ``field``
    to (the job itself does not run)."""
    from opensearch_lsr.encoding import job

    seen: list = []
    monkeypatch.setattr(job, "run_index_job", lambda config, **kw: seen.append(getattr(config, field)) or {"indexed": 0})
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "a", "text": "x"}\n')
    return ["index", "--corpus", str(corpus), "--model", "splade-tiny", "--backend", "ndjson", "--index",
            str(tmp_path / "i")], seen


def test_index_compile_takes_a_scope_and_no_compile_turns_it_off(tmp_path, monkeypatch):
    """``--compile`` alone is the body scope, ``--compile norm`` a scope, ``--no-compile`` False, both at once an
    error; the job gets what the encoder's ``compile`` takes."""
    base, seen = _job_setting(tmp_path, monkeypatch, "compile")
    for extra in ([], ["--compile"], ["--compile", "norm", "--chunk-docs", "8"], ["--no-compile"]):
        res = CliRunner().invoke(cli, base + extra)
        assert res.exit_code == 0, res.output
    assert seen == [None, "body", "norm", False]
    res = CliRunner().invoke(cli, base + ["--compile", "block", "--no-compile"])
    assert res.exit_code != 0 and "contradict" in res.output and "Traceback" not in res.output
    assert "one compiled call per batch" in " ".join(CliRunner().invoke(cli, ["index", "--help"]).output.split())


def test_with_ray_what_ray_prints_goes_to_stderr_and_stdout_is_the_summary(tmp_path, monkeypatch):
    """Ray forwards its raylet's and workers' lines to the driver's stdout ("(raylet) A worker died ..." after a
    stopped run broke a test's ``json.loads``): the command's stdout is the JSON summary alone."""
    import json
    import sys

    from opensearch_lsr.encoding import ray_job

    def job(config, options, **kw):
        print("(raylet) A worker died or was killed while executing a task")  # what Ray's log thread does
        print("a warning", file=sys.stderr)
        return {"indexed": 3}

    monkeypatch.setattr(ray_job, "run_ray_index_job", job)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "a", "text": "x"}\n')
    res = CliRunner().invoke(cli, ["index", "--corpus", str(corpus), "--model", "splade-tiny", "--backend", "ndjson",
                                   "--index", str(tmp_path / "i"), "--engine", "ray"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"indexed": 3}
    assert "(raylet) A worker died" in res.stderr and "a warning" in res.stderr


def test_index_window_docs_reaches_the_job_and_must_be_positive(tmp_path, monkeypatch):
    base, seen = _job_setting(tmp_path, monkeypatch, "window_docs")
    for extra in ([], ["--window-docs", "1024"]):
        res = CliRunner().invoke(cli, base + extra)
        assert res.exit_code == 0, res.output
    assert seen == [4096, 1024]
    res = CliRunner().invoke(cli, base + ["--window-docs", "0"])
    assert res.exit_code != 0 and "Traceback" not in res.output


def test_index_checkpoint_interval_reaches_the_job_and_applies_to_the_single_engine(tmp_path, monkeypatch):
    base, seen = _job_setting(tmp_path, monkeypatch, "checkpoint_interval_s")
    for extra in ([], ["--checkpoint-interval", "0"]):
        res = CliRunner().invoke(cli, base + extra)
        assert res.exit_code == 0, res.output
    assert seen == [1.0, 0.0]
    res = CliRunner().invoke(cli, base + ["--checkpoint-interval", "-1"])
    assert res.exit_code != 0 and "Traceback" not in res.output
    res = CliRunner().invoke(cli, base + ["--engine", "ray", "--checkpoint-interval", "5"])
    assert res.exit_code != 0 and "--checkpoint-interval applies to --engine single" in res.output
