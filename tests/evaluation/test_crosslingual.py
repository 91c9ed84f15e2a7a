"""Cross-lingual settings from parallel BEIR copies, and `lsr-os eval --query-language/--corpus-language`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from opensearch_lsr.cli import cli
from opensearch_lsr.evaluation.crosslingual import (CrossLingualError, CrossLingualSpec, crosslingual_dataset,
                                                    language_of, mixed_dataset, parallel_copy, setting_dataset)
from opensearch_lsr.evaluation.datasets import BeirDataset

# the same three queries in two languages; each copy numbers its passages its own way
KO_DOCS = {"ko-d0": "서울 은 한국 의 수도", "ko-d1": "고양이 는 집 에", "ko-d2": "강 물", "ko-d3": "학교 책"}
EN_DOCS = {"en-d0": "the cat is in the house", "en-d1": "seoul is the capital of korea", "en-d2": "river water",
           "en-d3": "ItÊ¼s a school bookâ\x80\x99s page"}  # mojibake as in msmarco-en
KO_QUERIES = {"q1": "한국 수도", "q2": "고양이 집", "q3": "학교 책", "q9": "강"}
EN_QUERIES = {"q1": "capital of korea", "q2": "cat house", "q3": "school book", "q9": "river"}
KO_QRELS = {"q1": "ko-d0", "q2": "ko-d1", "q3": "ko-d3"}
EN_QRELS = {"q1": "en-d1", "q2": "en-d0", "q3": "en-d3"}


def write_copy(root: Path, docs: dict, queries: dict, qrels: dict) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": t}, ensure_ascii=False)
                                               + "\n" for d, t in docs.items()), encoding="utf-8")
    (root / "queries.dev.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}, ensure_ascii=False) + "\n"
                                                    for q, t in queries.items()), encoding="utf-8")
    (root / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t1\n" for q, d in qrels.items()), encoding="utf-8")
    return root


@pytest.fixture()
def parallel(tmp_path) -> tuple[Path, Path]:
    return (write_copy(tmp_path / "mini-ko", KO_DOCS, KO_QUERIES, KO_QRELS),
            write_copy(tmp_path / "mini-en", EN_DOCS, EN_QUERIES, EN_QRELS))


def test_languages_and_sibling_copy(parallel, tmp_path):
    ko, en = parallel
    assert language_of(ko) == "ko" and language_of(tmp_path / "plain") is None
    assert parallel_copy(ko, "ko") == ko
    assert parallel_copy(ko, "en").resolve() == en.resolve()
    with pytest.raises(CrossLingualError, match="no fr copy .*--parallel"):
        parallel_copy(ko, "fr")
    with pytest.raises(CrossLingualError, match="cannot tell the language"):
        parallel_copy(tmp_path / "plain", "en")


def test_four_settings_ids_queries_and_qrels(parallel):
    ko, en = parallel
    kk = setting_dataset("ko-ko", ko)
    assert set(kk.corpus) == set(KO_DOCS) and kk.queries == {q: KO_QUERIES[q] for q in KO_QRELS}
    ek = setting_dataset("en-ko", ko)
    assert set(ek.corpus) == set(KO_DOCS) and ek.queries["q1"] == "capital of korea"
    assert ek.qrels["q1"] == {"ko-d0": 1} and "en->ko" in ek.name
    ke = setting_dataset("ko-en", ko, en)
    assert set(ke.corpus) == set(EN_DOCS) and ke.queries["q2"] == "고양이 집" and ke.qrels["q2"] == {"en-d0": 1}
    # the English copy is repaired with ftfy, the Korean one kept as is
    assert ke.corpus["en-d3"] == "It's a school book's page"
    # the dataset's own queries on a mixed corpus: the one sibling copy is the other half
    assert set(CrossLingualSpec(str(ko), corpus_language="mixed").build().corpus) == set(KO_DOCS) | set(EN_DOCS)
    mixed = setting_dataset("mixed", ko)
    assert set(mixed.corpus) == set(KO_DOCS) | set(EN_DOCS)
    assert mixed.qrels == {"q1": {"ko-d0": 1, "en-d1": 1}, "q2": {"ko-d1": 1, "en-d0": 1},
                           "q3": {"ko-d3": 1, "en-d3": 1}}
    assert mixed.queries["q1"] == "한국 수도"
    assert setting_dataset("mixed", ko, mixed_query_language="en").queries["q1"] == "capital of korea"
    with pytest.raises(ValueError, match="ko-ko, en-ko, ko-en, mixed"):
        setting_dataset("en-en", ko)


def test_keep_text_and_queries_file(parallel, tmp_path):
    ko, _ = parallel
    kept = crosslingual_dataset(ko, corpus_language="en", repair=())
    assert kept.corpus["en-d3"] == EN_DOCS["en-d3"]
    qfile = tmp_path / "q.tsv"
    qfile.write_text("q1\tcapitale\nq2\tchat maison\nq3\tlivre\n", encoding="utf-8")
    ds = CrossLingualSpec(str(ko), queries_file=str(qfile)).build()
    assert ds.queries == {"q1": "capitale", "q2": "chat maison", "q3": "livre"} and ds.qrels["q1"] == {"ko-d0": 1}
    qfile.write_text("q1\tcapitale\n", encoding="utf-8")
    with pytest.raises(CrossLingualError, match="2 of the 3 judged dev queries have no text"):
        CrossLingualSpec(str(ko), queries_file=str(qfile)).build()
    assert CrossLingualSpec(str(ko)).plain and not CrossLingualSpec(str(ko), query_language="en").plain


def test_mixed_with_clashing_ids_prefixes_each_copy():
    a = BeirDataset("a", "dev", {"d1": "x", "d2": "y"}, {"q": "x?"}, {"q": {"d1": 1}})
    b = BeirDataset("b", "dev", {"d1": "X", "d3": "Z"}, {"q": "X?"}, {"q": {"d3": 2}})
    m = mixed_dataset(a, b, ("ko", "en"))
    assert set(m.corpus) == {"ko:d1", "ko:d2", "en:d1", "en:d3"} and m.qrels == {"q": {"ko:d1": 1, "en:d3": 2}}


def test_eval_cli_query_language_runs_each_setting(parallel, splade_tiny_dir, tmp_path):
    ko, en = parallel
    runner = CliRunner()
    base = ["eval", "--dataset", str(ko), "--model", "splade-tiny", "--prune-levels", ""]

    def run(*extra) -> dict:
        out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
        res = runner.invoke(cli, [*base, "--out", str(out), *extra])
        assert res.exit_code == 0, res.output
        report = json.loads((out / "report.json").read_text())
        return report, (out / "run.trec").read_text()

    report, trec = run("--query-language", "en")
    assert report["config"]["evaluated"].endswith("[en->ko]") and report["config"]["n_docs"] == 4
    assert report["config"]["query_side"] == "model"  # splade-tiny holds no alignment.npz
    assert "ko-d" in trec and "en-d" not in trec
    # mixed corpus, English queries: the English SPLADE ranks each query's English copy of its positive first
    # (two judged copies per query: finding only the English ones is recall 0.5)
    report, trec = run("--corpus-language", "mixed", "--query-language", "en")
    assert report["config"]["n_docs"] == 8 and "ko-d" in trec and "en-d" in trec
    assert report["metrics"]["mrr@10"] == pytest.approx(1.0) and report["metrics"]["recall@100"] >= 0.5

def test_eval_cli_errors_are_one_sentence(parallel, tmp_path):
    ko, _ = parallel
    runner = CliRunner()
    res = runner.invoke(cli, ["eval", "--dataset", str(ko), "--model", "splade-tiny", "--out", str(tmp_path / "o"),
                              "--query-language", "fr"])
    assert res.exit_code != 0 and "no fr copy" in res.output and "Traceback" not in res.output
    (tmp_path / "mini-fr").mkdir()
    (tmp_path / "mini-fr" / "corpus.jsonl").write_text("")
    res = runner.invoke(cli, ["eval", "--dataset", str(ko), "--model", "splade-tiny", "--out", str(tmp_path / "o"),
                              "--corpus-language", "mixed"])
    assert res.exit_code != 0 and "2 sibling copies found (mini-en, mini-fr)" in res.output
