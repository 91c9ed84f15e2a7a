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


def test_index_compile_takes_a_scope_and_no_compile_turns_it_off(tmp_path, monkeypatch):
    """``--compile`` alone is the body scope, ``--compile norm`` a scope, ``--no-compile`` False, both at once an
    error; the job gets what the encoder's ``compile`` takes."""
    import opensearch_lsr.encoding.job as job

    seen = []
    monkeypatch.setattr(job, "run_index_job", lambda config, **kw: seen.append(config.compile) or {"indexed": 0})
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "a", "text": "x"}\n')
    base = ["index", "--corpus", str(corpus), "--model", "splade-tiny", "--backend", "ndjson", "--index",
            str(tmp_path / "i")]
    for extra in ([], ["--compile"], ["--compile", "norm", "--chunk-docs", "8"], ["--no-compile"]):
        res = CliRunner().invoke(cli, base + extra)
        assert res.exit_code == 0, res.output
    assert seen == [None, "body", "norm", False]
    res = CliRunner().invoke(cli, base + ["--compile", "block", "--no-compile"])
    assert res.exit_code != 0 and "contradict" in res.output and "Traceback" not in res.output
    assert "one compiled call per batch" in " ".join(CliRunner().invoke(cli, ["index", "--help"]).output.split())
