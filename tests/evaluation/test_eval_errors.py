"""Bad input and empty cases of search / eval / quickstart: one clear sentence, never a traceback."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from opensearch_lsr.cli import cli


def _beir(root, docs, queries, qrels):
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "text": t}) + "\n" for d, t in docs.items()))
    (root / "queries.dev.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    (root / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t1\n" for q, ds in qrels.items() for d in ds))
    return root


def test_eval_bad_dataset_and_split(tmp_path, tiny_source_dir):
    runner = CliRunner()
    (tmp_path / "empty").mkdir()
    res = runner.invoke(cli, ["eval", "--dataset", str(tmp_path / "empty"), "--model", str(tiny_source_dir),
                              "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "not a BEIR dataset" in res.output and "Traceback" not in res.output
    root = _beir(tmp_path / "b", {"d1": "the cat"}, {"q1": "cat"}, {"q1": {"d1": 1}})
    res = runner.invoke(cli, ["eval", "--dataset", str(root), "--split", "test", "--model", str(tiny_source_dir),
                              "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "no qrels for split 'test'" in res.output and "Traceback" not in res.output
    res = runner.invoke(cli, ["eval", "--dataset", str(root), "--model", str(tmp_path / "no-model"),
                              "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "Traceback" not in res.output


def test_eval_queries_without_vocabulary_tokens_score_zero(tmp_path, tiny_source_dir):
    """Queries whose tokens are all unknown send no request and count as 0 (not dropped, no crash)."""
    from opensearch_lsr.evaluation.pipeline import EvalConfig, run_evaluation

    root = _beir(tmp_path / "b", {"d1": "the cat house", "d2": "paris france"},
                 {"q1": "cat house", "q2": "zzzz qqqq"}, {"q1": {"d1": 1}, "q2": {"d2": 1}})
    res = run_evaluation(EvalConfig(dataset=str(root), model=str(tiny_source_dir), query_mode="tokens",
                                    idf=None, prune_levels=[]), tmp_path / "ev")
    run = (tmp_path / "ev" / "run.trec").read_text()
    assert "q2" not in run and "q1" in run
    assert res["metrics"]["mrr@10"] <= 0.5  # q2 contributes 0 to the mean over both queries


def test_search_empty_index_and_bad_queries(tmp_path, tiny_source_dir):
    from opensearch_lsr.local.index import LocalIndex

    LocalIndex.create(tmp_path / "idx", {"properties": {"passage_embedding": {"type": "rank_features"}}})
    runner = CliRunner()
    base = ["search", "--index", str(tmp_path / "idx")]
    res = runner.invoke(cli, base + ["cat", "--mode", "tokens", "--model", str(tiny_source_dir)])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("0 hits"), res.output
    for args, msg in [(["", "--mode", "tokens", "--model", str(tiny_source_dir)], "the query text is empty"),
                      (["  ", "--mode", "model", "--model", str(tiny_source_dir)], "the query text is empty"),
                      (["cat", "--mode", "tokens", "--model", str(tmp_path / "nope")], "nope"),
                      (["cat", "--mode", "tokens"], "--mode tokens needs --model"),
                      (["cat", "--filter", "nokey"], "FIELD=VALUE"),
                      (["cat", "--mode", "model"], "--mode model needs"),
                      (["cat", "--mode", "tokens", "--model", str(tiny_source_dir), "--url", "https://os:9200"],
                       "--url connects to a cluster, but --backend is local: add --backend opensearch")]:
        res = runner.invoke(cli, base + args)
        assert res.exit_code != 0, (args, res.output)
        assert msg in res.output and "Traceback" not in res.output, (args, res.output)


def test_cluster_options_with_an_offline_backend_are_refused(tmp_path):
    """--url and the other connection options reach nothing with the local (default) or ndjson backend: an error,
    before any work, instead of quietly using a local directory named like the cluster's index."""
    runner = CliRunner()
    cases = [(["eval", "--dataset", str(tmp_path), "--out", str(tmp_path / "o"), "--index", "my-os-index",
               "--url", "https://os:9200", "--insecure"], "--url, --insecure connect to a cluster, but --backend is local"),
             (["tune-hybrid", "--dataset", str(tmp_path), "--model", "splade-tiny", "--out", str(tmp_path / "t"),
               "--user", "admin"], "--user connects to a cluster, but --backend is local"),
             (["index", "--corpus", __file__, "--model", "splade-tiny", "--backend", "ndjson", "--index",
               str(tmp_path / "n"), "--max-retries", "5"], "--max-retries connects to a cluster, but --backend is ndjson")]
    for args, msg in cases:
        res = runner.invoke(cli, args)
        assert res.exit_code != 0 and msg in res.output and "Traceback" not in res.output, (args, res.output)
    assert not any((tmp_path / d).exists() for d in ("o", "t", "n", "my-os-index"))


def test_quickstart_bad_options():
    runner = CliRunner()
    for args, msg in [(["--max-docs", "0"], "max_docs must be >= 1"),
                      (["--source-vocab", "-1"], "source_vocab must be >= 0"),
                      (["--vocab-size", "10"], "vocab_size must be >= 100")]:
        res = runner.invoke(cli, ["quickstart", "--workdir", "/tmp/unused-qs", *args])
        assert res.exit_code != 0 and msg in res.output and "Traceback" not in res.output, res.output
    from opensearch_lsr.quickstart import QuickstartConfig

    with pytest.raises(ValueError, match="data must be one of"):
        QuickstartConfig(data="hub")
