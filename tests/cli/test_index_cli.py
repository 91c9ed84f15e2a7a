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
