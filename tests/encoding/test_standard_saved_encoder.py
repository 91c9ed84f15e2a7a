"""A SparseEncoder saved the standard sentence-transformers way (``SparseEncoder(modules=[MLMTransformer(dir),
SpladePooling("max")]).save(...)``) keeps every query token in eval and search.

sentence-transformers 6.2 answers ``get_embedding_dimension()`` of such a model with the hidden size (128 for
SPLADE-tiny), while its vectors have 30,522 columns; the key table must follow the vectors.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from click.testing import CliRunner

DOCS = {"d1": "the cat sleeps in the house", "d2": "paris is the capital of france",
        "d3": "seoul is the capital of south korea", "d4": "the river water is cold", "d5": "a red car on the road",
        "d6": "the school library lends books"}
QUERIES = {"q1": "where does the cat sleep", "q2": "what is the capital of france", "q3": "capital of korea",
           "q4": "car on the road"}
QRELS = {"q1": "d1", "q2": "d2", "q3": "d3", "q4": "d5"}


@pytest.fixture(scope="module")
def standard_splade_dir(tmp_path_factory, splade_tiny_dir) -> Path:
    import warnings

    from sentence_transformers import SparseEncoder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
        except ImportError:  # sentence-transformers < 5.2 names the package `models`
            from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling
        model = SparseEncoder(modules=[MLMTransformer(str(splade_tiny_dir)), SpladePooling("max")], device="cpu")
    out = tmp_path_factory.mktemp("standard_splade") / "model"
    model.save(str(out))
    return out


@pytest.fixture(scope="module")
def mini_beir(tmp_path_factory) -> Path:
    beir = tmp_path_factory.mktemp("mini_beir")
    (beir / "qrels").mkdir()
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n"
                                               for d, t in DOCS.items()))
    (beir / "queries.dev.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n"
                                                    for q, t in QUERIES.items()))
    (beir / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t1\n" for q, d in QRELS.items()))
    return beir


def test_key_table_follows_the_vectors_not_get_embedding_dimension(standard_splade_dir, splade_tiny_dir):
    from opensearch_lsr.encoding.keyed import SparseKeyedEncoder, output_dimension

    keyed = SparseKeyedEncoder(str(standard_splade_dir))
    assert output_dimension(keyed.model) == 30522 == len(keyed.keys)
    query = keyed("what is the capital of france")
    assert "capital" in query and "france" in query
    # the same weights as the raw MLM dir, which the toolkit wraps with an explicit embedding_dimension
    reference = SparseKeyedEncoder(str(splade_tiny_dir))("what is the capital of france")
    assert query.keys() == reference.keys()
    assert np.allclose([query[k] for k in reference], list(reference.values()), atol=1e-5)


def test_vectors_wider_than_the_key_table_are_refused():
    from opensearch_lsr.encoding.keyed import OutputDimensionError, csr_rows_to_dicts

    mat = sp.csr_matrix((np.array([1.0, 2.0], dtype=np.float32), (np.array([0, 0]), np.array([1, 200]))),
                        shape=(1, 300))
    with pytest.raises(OutputDimensionError, match="300 columns"):
        csr_rows_to_dicts(mat, ["k"] * 128)


def test_eval_and_search_with_a_standard_saved_model(tmp_path, standard_splade_dir, splade_tiny_dir, mini_beir):
    from opensearch_lsr.cli import cli

    runner = CliRunner()
    reports = {}
    for name, model in (("standard", standard_splade_dir), ("reference", splade_tiny_dir)):
        out = tmp_path / name
        res = runner.invoke(cli, ["eval", "--dataset", str(mini_beir), "--model", str(model), "--out", str(out),
                                  "--prune-levels", ""])
        assert res.exit_code == 0, res.output
        reports[name] = json.loads((out / "report.json").read_text())
    std, ref = reports["standard"]["metrics"], reports["reference"]["metrics"]
    assert std["query_active_dims"] > 0
    assert std["mrr@10"] == pytest.approx(ref["mrr@10"]) and std["mrr@10"] > 0.5
    res = runner.invoke(cli, ["search", "--index", str(tmp_path / "standard" / "index"),
                              "what is the capital of france", "--mode", "model", "--model", str(standard_splade_dir),
                              "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["hits"]["hits"][0]["_id"] == "d2"
