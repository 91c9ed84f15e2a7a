"""Evaluation through the local backend: metrics, sweep, report files, CLI search/eval."""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from opensearch_lsr.evaluation.report import markdown_table, read_trec_run, write_report, write_trec_run
from opensearch_lsr.evaluation.sweep import prune_max_ratio, prune_sweep, truncate_csr

DOCS = {"d1": "the cat is of the house", "d2": "paris is the capital of france", "d3": "seoul is the capital of korea",
        "d4": "the river water", "d5": "a car on the road", "d6": "the school book", "d7": "the dog and cats"}
QUERIES = {"q1": "cat house", "q2": "capital france", "q3": "seoul korea", "q4": "car road", "q5": "school book"}
QRELS = {"q1": {"d1": 1}, "q2": {"d2": 1}, "q3": {"d3": 1}, "q4": {"d5": 1}, "q5": {"d6": 1}}


@pytest.fixture()
def beir_dir(tmp_path):
    root = tmp_path / "mini"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n"
                                               for d, t in DOCS.items()))
    (root / "queries.dev.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in QUERIES.items()))
    (root / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t1\n" for q, ds in QRELS.items() for d in ds))
    return root


def test_prune_max_ratio_keeps_weights_at_or_above_ratio_of_row_max():
    m = sp.csr_matrix(np.array([[1.0, 0.5, 0.09, 0], [0, 0, 0, 0], [2.0, 0.2, 0.19, 0.21]], np.float32))
    p = prune_max_ratio(m, 0.1).toarray()
    np.testing.assert_allclose(p, [[1.0, 0.5, 0, 0], [0, 0, 0, 0], [2.0, 0.2, 0, 0.21]], rtol=1e-6)
    assert prune_max_ratio(m, 0.0).nnz == m.nnz
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        prune_max_ratio(m, 1.0)
    assert truncate_csr(sp.csr_matrix([[1.7]])).data[0] == np.float32(1.69921875)


def test_sweep_rows_and_flops_decrease():
    rng = np.random.default_rng(0)
    docs = sp.random(50, 40, density=0.3, random_state=1, format="csr", dtype=np.float32)
    queries = sp.random(10, 40, density=0.2, random_state=2, format="csr", dtype=np.float32)
    qrels = {f"q{i}": {f"d{rng.integers(50)}": 1} for i in range(10)}
    rows = prune_sweep(queries, docs, [f"q{i}" for i in range(10)], [f"d{i}" for i in range(50)], qrels, (0.0, 0.3, 0.8))
    assert [r["max_ratio"] for r in rows] == [0.0, 0.3, 0.8]
    assert rows[0]["flops"] > rows[1]["flops"] > rows[2]["flops"]
    assert rows[0]["doc_active_dims"] > rows[2]["doc_active_dims"]


def test_report_files(tmp_path):
    run = {"q1": {"d1": 2.0, "d2": 3.0}, "q2": {"d3": 1.0}}
    path = write_trec_run(run, tmp_path / "run.trec", tag="my model")
    lines = path.read_text().splitlines()
    assert lines[0] == "q1 Q0 d2 1 3.000000 my_model" and lines[1].startswith("q1 Q0 d1 2 ")
    assert read_trec_run(path) == run
    from opensearch_lsr.evaluation.plots import plot_effectiveness_vs_flops

    sweep = [{"max_ratio": 0.0, "flops": 10.0, "ndcg@10": 0.5, "mrr@10": 0.4},
             {"max_ratio": 0.3, "flops": 4.0, "ndcg@10": 0.45, "mrr@10": 0.38}]
    png = plot_effectiveness_vs_flops({"m": sweep}, tmp_path / "plot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = {"name": "m", "metrics": {"mrr@10": 0.4, "ndcg@10": 0.5, "recall@100": 1.0, "flops": 10.0},
              "sweep": sweep, "plot": str(png), "config": {"dataset": "x"}}
    j, md = write_report(result, tmp_path)
    assert json.loads(j.read_text())["metrics"]["ndcg@10"] == 0.5
    text = md.read_text()
    assert "| m | 0.4000 | 0.5000 | 1.0000 | 10.0000 | - | - |" in text and "plot.png" in text
    assert markdown_table([{"system": "a", "mrr@10": 1.0}], ["mrr@10"]).count("\n") == 3


def test_run_evaluation_local_backend_equals_in_memory_retrieval(beir_dir, tiny_source_dir, splade_tiny_dir, tmp_path):
    from opensearch_lsr.evaluation.datasets import load_beir
    from opensearch_lsr.evaluation.pipeline import EvalConfig, run_evaluation
    from opensearch_lsr.encoding.keyed import encode_to_csr
    from opensearch_lsr.evaluation.retrieval import sparsity_stats, top_k_run
    from opensearch_lsr.transfer.surgery import load_sparse_encoder

    out = tmp_path / "eval"
    result = run_evaluation(EvalConfig(dataset=str(beir_dir), model=str(tiny_source_dir), prune_levels=[0.0, 0.2]), out)
    for name in ("report.json", "report.md", "run.trec", "effectiveness_vs_flops.png", "eval_config.json"):
        assert (out / name).exists(), name
    # the same numbers from plain in-memory exact retrieval over 9-bit-truncated document weights
    ds = load_beir(beir_dir, "dev")
    enc = load_sparse_encoder(str(tiny_source_dir))
    docs = encode_to_csr(enc, list(ds.corpus.values()), "document")
    queries = encode_to_csr(enc, list(ds.queries.values()), "query")
    run = top_k_run(queries, truncate_csr(docs), list(ds.queries), list(ds.corpus))
    served = read_trec_run(out / "run.trec")
    for qid in ds.queries:
        assert served.get(qid, {}).keys() == run[qid].keys()
        for did, score in run[qid].items():
            assert served[qid][did] == pytest.approx(score, rel=1e-5, abs=1e-6)
    stats = sparsity_stats(queries, docs)
    assert result["metrics"]["doc_active_dims"] == pytest.approx(stats["doc_active_dims"])
    assert result["metrics"]["flops"] == pytest.approx(stats["flops"], rel=1e-5)
    assert result["sweep"][0]["ndcg@10"] == pytest.approx(result["metrics"]["ndcg@10"])

    # tokens mode (SPARSE_TOKENIZE + corpus IDF). A trained model is needed here: the random tiny
    # model's document vectors need not contain the documents' own words, SPLADE-tiny's do.
    tok = run_evaluation(EvalConfig(dataset=str(beir_dir), model=str(splade_tiny_dir), query_mode="tokens",
                                    prune_levels=[]), tmp_path / "eval_tokens")
    assert tok["config"]["idf_source"] == "corpus" and tok["sweep"] == []
    assert tok["metrics"]["mrr@10"] > 0.5  # exact-word queries over an IDF-weighted lexical match


def test_cli_search_and_eval(beir_dir, tiny_source_dir, tmp_path):
    from click.testing import CliRunner

    from opensearch_lsr.cli import cli

    runner = CliRunner()
    out = tmp_path / "ev"
    res = runner.invoke(cli, ["eval", "--dataset", str(beir_dir), "--model", str(tiny_source_dir), "--out", str(out),
                              "--prune-levels", "0,0.3"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout[res.stdout.index("{"):])["metrics"]["mrr@10"] >= 0
    res = runner.invoke(cli, ["search", "--index", str(out / "index"), "seoul korea", "--mode", "tokens",
                              "--model", str(tiny_source_dir), "--show-query", "--explain", "--size", "2"])
    assert res.exit_code == 0, res.output
    assert '"neural_sparse"' in res.output and "hits" in res.output and "=" in res.output
    res = runner.invoke(cli, ["search", "--index", str(out / "index"), "seoul korea", "--mode", "tokens",
                              "--model", str(tiny_source_dir), "--size", "1"])
    _, _, doc_id, *text = res.output.splitlines()[1].split()
    assert text and text[0] != doc_id  # the hit line shows the passage text, not its id field again
    res = runner.invoke(cli, ["search", "--index", str(out / "index"), "seoul", "--mode", "model",
                              "--model", str(tiny_source_dir), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["hits"]["hits"]
    bad = runner.invoke(cli, ["search", "--index", str(tmp_path / "nope"), "x", "--model", str(tiny_source_dir)])
    assert bad.exit_code != 0 and "no such index" in bad.output and "Traceback" not in bad.output
    bad = runner.invoke(cli, ["search", "--index", str(out / "index"), "x", "--mode", "analyzer"])
    assert bad.exit_code != 0 and "analyzer [bert-uncased] is not available" in bad.output


def test_reused_local_index_missing_judged_documents_is_reported(beir_dir, tiny_source_dir, tmp_path, caplog):
    """`lsr-os eval --index DIR` on an index filled from part of the corpus: the report says which share of the
    judged documents it holds, and a warning says the metrics count the rest as misses."""
    from opensearch_lsr.evaluation.datasets import load_beir
    from opensearch_lsr.evaluation.pipeline import EvalConfig, index_local, run_evaluation

    ds = load_beir(beir_dir, "dev")
    judged = sorted({d for rels in ds.qrels.values() for d, rel in rels.items() if rel > 0})
    kept = [d for d in ds.corpus if d != judged[0]]  # one judged document left out
    index_local(tmp_path / "part", kept, [ds.corpus[d] for d in kept], str(tiny_source_dir))
    with caplog.at_level("WARNING", logger="opensearch_lsr.evaluation.pipeline"):
        part = run_evaluation(EvalConfig(dataset=str(beir_dir), model=str(tiny_source_dir), prune_levels=[],
                                         index=str(tmp_path / "part")), tmp_path / "eval_part")
    assert part["config"]["judged_in_index"] == pytest.approx(1 - 1 / len(judged))
    assert "judged documents of these queries are in the local index" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="opensearch_lsr.evaluation.pipeline"):
        whole = run_evaluation(EvalConfig(dataset=str(beir_dir), model=str(tiny_source_dir), prune_levels=[]),
                               tmp_path / "eval_whole")
    assert whole["config"]["judged_in_index"] == 1.0 and "judged documents" not in caplog.text
