"""`lsr-os index` then `lsr-os eval --index` with default flags: one set of field defaults."""
from __future__ import annotations

import json

from click.testing import CliRunner

from opensearch_lsr.cli import cli
from opensearch_lsr.contract import DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD

DOCS = {"d1": "the cat is of the house", "d2": "paris is the capital of france", "d3": "seoul is the capital of korea",
        "d4": "the river water", "d5": "a car on the road", "d6": "the school book"}
QUERIES = {"q1": "cat house", "q2": "capital france", "q3": "seoul korea", "q4": "car road"}
QRELS = {"q1": "d1", "q2": "d2", "q3": "d3", "q4": "d5"}


def test_index_then_eval_with_defaults(tmp_path, tiny_source_dir):
    beir = tmp_path / "mini"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n"
                                               for d, t in DOCS.items()))
    (beir / "queries.dev.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n"
                                                    for q, t in QUERIES.items()))
    (beir / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t1\n" for q, d in QRELS.items()))
    runner = CliRunner()
    index = tmp_path / "idx"
    done = runner.invoke(cli, ["index", "--corpus", str(beir / "corpus.jsonl"), "--model", str(tiny_source_dir),
                               "--index", str(index), "--no-progress"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout[done.stdout.index("{"):])["indexed"] == len(DOCS)

    out = tmp_path / "eval"
    result = runner.invoke(cli, ["eval", "--dataset", str(beir), "--model", str(tiny_source_dir),
                                 "--index", str(index), "--prune-levels", "", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["n_docs"] == len(DOCS)
    assert "index_documents" not in report["timings"]  # the filled index was searched, not rebuilt
    assert set(report["metrics"]) >= {"ndcg@10", "mrr@10", "recall@100"}

    from opensearch_lsr.local.index import LocalIndex

    idx = LocalIndex.open(index)
    assert idx.vector_fields == [DEFAULT_VECTOR_FIELD]
    assert DEFAULT_TEXT_FIELD in idx.mappings["properties"]
