"""The default command chain on one cluster with no field flags:
create-index -> index --backend opensearch -> search --backend opensearch, for rank_features,
sparse_vector (token-id documents, --mode tokens) and --long-text split (nested) indices.

Runs SPLADE-tiny through the real CLI against the double; the same chain runs on a real cluster in
tests/opensearch_real/.
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from double.fixtures import make_double

from opensearch_lsr.cli import cli

DOCS = {
    "d1": "the river flows past the old stone bridge near the town",
    "d2": "a recipe for baking sourdough bread with a crisp crust",
    "d3": "stock markets fell sharply after the interest rate decision",
    "d4": "the museum displays ancient pottery and bronze statues",
}


@pytest.fixture
def double():
    d = make_double("3.3.0")
    yield d
    d.stop()


def _corpus(tmp_path, long: bool = False):
    path = tmp_path / "corpus.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for did, text in DOCS.items():
            fh.write(json.dumps({"_id": did, "title": "", "text": (text + " ") * (60 if long else 1)}) + "\n")
    return path


def _run(*args):
    res = CliRunner().invoke(cli, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res.stdout  # progress bars and model-loading notes go to stderr


def _top(output: str) -> str:
    first = next(line for line in output.splitlines() if line.strip().startswith("1."))
    return first.split()[2]


def test_default_chain_rank_features(double, tmp_path, splade_tiny_dir):
    url = ("--url", double.url)
    _run("create-index", "passages", *url)
    out = json.loads(_run("index", "--corpus", _corpus(tmp_path), "--model", splade_tiny_dir, "--backend",
                          "opensearch", "--index", "passages", "--work-dir", tmp_path / "job", "--no-progress", *url))
    assert out["indexed"] == len(DOCS)
    assert double.requests_to("/_bulk$")[0]["query"]["pipeline"] == "_none"
    found = _run("search", "sourdough bread recipe", "--index", "passages", "--backend", "opensearch", "--mode",
                 "tokens", "--model", splade_tiny_dir, *url)
    assert _top(found) == "d2"
    # eval on the same index, still no field flag (the default field is the same everywhere)
    data = tmp_path / "beir"
    (data / "qrels").mkdir(parents=True)
    (data / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n"
                                               for d, t in DOCS.items()))
    queries = {"q1": "sourdough bread recipe", "q2": "bronze statues in the museum"}
    (data / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    (data / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\nq2\td4\t1\n")
    report = json.loads(_run("eval", "--dataset", data, "--model", splade_tiny_dir, "--backend", "opensearch",
                             "--index", "passages", "--prune-levels", "", "--out", tmp_path / "eval", *url))
    assert report["metrics"]["mrr@10"] == pytest.approx(1.0)
    assert double.violations == []


def test_sparse_vector_chain_uses_token_ids(double, tmp_path, splade_tiny_dir):
    """search --mode tokens on a sparse_vector index sends token-id keys (word keys find nothing)."""
    url = ("--url", double.url)
    _run("create-index", "ann", "--kind", "sparse_vector", "--vocab-size", 30522, *url)
    _run("index", "--corpus", _corpus(tmp_path), "--model", splade_tiny_dir, "--backend", "opensearch", "--index",
         "ann", "--key-format", "token_id", "--work-dir", tmp_path / "job", "--no-progress", *url)
    found = _run("search", "ancient bronze statues in a museum", "--index", "ann", "--backend", "opensearch",
                 "--mode", "tokens", "--model", splade_tiny_dir, "--ann-k", 2, "--show-query", *url)
    assert _top(found) == "d4"
    sent = double.requests_to("/ann/_search$")[-1]
    assert sent["status"] == 200
    body = json.loads(found.split("# request body", 1)[1].split("\n", 1)[1].rsplit("}\n", 1)[0] + "}")
    clause = body["query"]["neural_sparse"]["sparse_embedding"]
    assert all(k.isdigit() for k in clause["query_tokens"]) and clause["method_parameters"] == {"k": 2}
    assert double.violations == []


def test_split_chain_is_mapped_and_searched_nested(double, tmp_path, splade_tiny_dir):
    url = ("--url", double.url)
    res = CliRunner().invoke(cli, ["create-index", "plain", "--url", double.url])
    assert res.exit_code == 0
    res = CliRunner().invoke(cli, ["index", "--corpus", str(_corpus(tmp_path, long=True)), "--model", str(splade_tiny_dir),
                                   "--backend", "opensearch", "--index", "plain", "--long-text", "split", "--work-dir",
                                   str(tmp_path / "job0"), "--no-progress", "--url", double.url])
    assert res.exit_code == 1 and "create-index plain --long-text split" in res.output  # refused up front
    assert not double.requests_to("/_bulk")
    _run("create-index", "long", "--long-text", "split", *url)
    out = json.loads(_run("index", "--corpus", _corpus(tmp_path, long=True), "--model", splade_tiny_dir, "--backend",
                          "opensearch", "--index", "long", "--long-text", "split", "--work-dir", tmp_path / "job",
                          "--no-progress", *url))
    assert out["indexed"] == len(DOCS)
    found = _run("search", "stock markets and interest rates", "--index", "long", "--backend", "opensearch",
                 "--mode", "tokens", "--model", splade_tiny_dir, *url)
    assert _top(found) == "d3"
    assert double.violations == []


def test_index_to_an_unreachable_cluster_fails_in_one_line(tmp_path, splade_tiny_dir):
    res = CliRunner().invoke(cli, ["index", "--corpus", str(_corpus(tmp_path)), "--model", str(splade_tiny_dir),
                                   "--backend", "opensearch", "--index", "x", "--work-dir", str(tmp_path / "job"),
                                   "--no-progress", "--url", "http://127.0.0.1:9", "--max-retries", "0"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.stdout.strip() == "" and res.stderr.strip().splitlines()[-1] == (
        "Error: cannot reach the cluster at http://127.0.0.1:9: connection refused")
    assert not [line for line in res.stderr.splitlines() if line.startswith(("WARNING", "GET ", "HEAD "))]


def test_search_on_3_4_sparse_vector_asks_for_size_hits(tmp_path, splade_tiny_dir):
    """From 3.4 neural-search always runs SEISMIC with k=10 unless told: search sends k=--size."""
    import zipfile

    from opensearchpy.helpers import bulk

    from opensearch_lsr.opensearch.client import client_from_options

    zpath = tmp_path / "sparse_tokenize.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.write(splade_tiny_dir / "tokenizer.json", "tokenizer.json")
    d = make_double("3.4.0")
    try:
        client = client_from_options(url=d.url)
        _run("create-index", "ann", "--kind", "sparse_vector", "--vocab-size", 30522, "--url", d.url)
        bulk(client, [{"_index": "ann", "_id": f"d{i}", "_source": {"text": "t", "sparse_embedding": {"1996": 1.0 + i}}}
                      for i in range(15)], refresh=True)
        out = _run("search", "the", "--index", "ann", "--backend", "opensearch", "--mode", "tokens", "--model", zpath,
                   "--size", 12, "--url", d.url)
        assert out.splitlines()[0].startswith("12 hits")
        # a --filter goes inside the ANN search: the 3 lowest-scoring documents still come back
        bulk(client, [{"_index": "ann", "_id": f"d{i}", "_source": {"text": "t", "lang": "ko" if i < 3 else "en",
                                                                    "sparse_embedding": {"1996": 1.0 + i}}}
                      for i in range(15)], refresh=True)
        out = _run("search", "the", "--index", "ann", "--backend", "opensearch", "--mode", "tokens", "--model", zpath,
                   "--filter", "lang=ko", "--show-query", "--url", d.url)
        assert "3 hits" in out and '"method_parameters"' in out and '"lang": "ko"' in out
        # --mode hybrid keeps both: the filter and k inside the sparse sub-query's ANN search, the filter around
        # the BM25 one (both were dropped: hybrid built its sub-queries without them)
        out = _run("search", "t", "--index", "ann", "--backend", "opensearch", "--mode", "hybrid", "--model", zpath,
                   "--filter", "lang=ko", "--show-query", "--json", "--url", d.url)
        start = out.index("{")
        body, end = json.JSONDecoder().raw_decode(out[start:])  # the query, printed before the response
        response = json.loads(out[start + end:])
        assert {h["_source"].get("lang") for h in response["hits"]["hits"]} == {"ko"}
        lexical, sparse = body["query"]["hybrid"]["queries"]
        assert lexical["bool"]["filter"] and "match" in json.dumps(lexical["bool"]["should"])
        assert sparse["neural_sparse"]["sparse_embedding"]["method_parameters"]["filter"]
        assert sparse["neural_sparse"]["sparse_embedding"]["method_parameters"]["k"] == 10
        assert d.violations == []
    finally:
        d.stop()


def test_eval_against_an_unreachable_cluster_fails_in_one_line(tmp_path):
    data = tmp_path / "beir"
    (data / "qrels").mkdir(parents=True)
    (data / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "text": "x"}) + "\n")
    (data / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "x"}) + "\n")
    (data / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    res = CliRunner().invoke(cli, ["eval", "--dataset", str(data), "--model", "splade-tiny", "--backend", "opensearch",
                                   "--index", "x", "--out", str(tmp_path / "out"), "--url", "http://127.0.0.1:9",
                                   "--max-retries", "0"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.output.strip().splitlines()[-1] == "Error: cannot reach the cluster at http://127.0.0.1:9: connection refused"
