"""`lsr-os eval --baseline bm25-nori --hybrid ...` and `lsr-os search --mode hybrid` on the local backend."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("mecab_ko")

from click.testing import CliRunner  # noqa: E402

from opensearch_lsr.cli import cli  # noqa: E402
from opensearch_lsr.evaluation.metrics import evaluate_run  # noqa: E402
from opensearch_lsr.evaluation.pipeline import TEXT_FIELD, VECTOR_FIELD  # noqa: E402
from opensearch_lsr.lexical.bm25 import LuceneBM25  # noqa: E402

DOCS = {"d1": "서울은 대한민국의 수도이다.", "d2": "파리는 프랑스의 수도이다.", "d3": "고양이는 작은 동물이다.",
        "d4": "학교 도서관에서 책을 읽었다.", "d5": "부산에는 큰 항구가 있다."}
QUERIES = {"q1": "대한민국 수도", "q2": "프랑스 수도", "q3": "고양이", "q4": "도서관 책", "q5": "항구 도시"}
QRELS = {"q1": {"d1": 1}, "q2": {"d2": 1}, "q3": {"d3": 1}, "q4": {"d4": 1}, "q5": {"d5": 1}}


@pytest.fixture()
def ko_beir(tmp_path):
    root = tmp_path / "ko"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": t}, ensure_ascii=False) + "\n"
                                               for d, t in DOCS.items()), encoding="utf-8")
    (root / "queries.dev.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}, ensure_ascii=False) + "\n"
                                                    for q, t in QUERIES.items()), encoding="utf-8")
    (root / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t1\n" for q, ds in QRELS.items() for d in ds))
    return root


def _json(output: str) -> dict:
    return json.loads(output[output.index("{"):])


def test_eval_reports_the_nori_row_first_and_the_hybrid(ko_beir, tiny_source_dir, tmp_path):
    out = tmp_path / "ev"
    res = CliRunner().invoke(cli, ["eval", "--dataset", str(ko_beir), "--model", str(tiny_source_dir), "--out",
                                   str(out), "--prune-levels", "", "--baseline", "bm25-nori", "--hybrid", "min_max",
                                   "--weights", "0.5,0.5"])
    assert res.exit_code == 0, res.output
    rows = _json(res.stdout)["rows"]
    assert [r["system"] for r in rows][0] == "BM25 (nori analyzer)"
    assert rows[-1]["system"].startswith("hybrid BM25 (nori) + sparse (min-max 0.5/0.5)")
    # the backend's `match` bodies give exactly the in-memory nori BM25 figures
    expected = evaluate_run(QRELS, LuceneBM25.build(DOCS).search(QUERIES, k=100))
    assert rows[0]["mrr@10"] == pytest.approx(expected["mrr@10"]) and rows[0]["mrr@10"] == 1.0
    lexical = json.loads((out / "report.json").read_text(encoding="utf-8"))["lexical_rows"]
    assert [r["name"] for r in lexical] == [rows[0]["system"], rows[-1]["system"]]
    assert lexical[0]["metrics"]["mrr@10"] == rows[0]["mrr@10"] and lexical[1]["query_ms"] > 0
    report = (out / "report.md").read_text(encoding="utf-8")
    assert report.index("BM25 (nori analyzer)") < report.index("hybrid BM25")
    assert (out / "run-bm25-nori.trec").exists() and (out / "run-hybrid-min_max.trec").exists()
    res = CliRunner().invoke(cli, ["search", "--index", str(out / "index"), "대한민국 수도", "--mode", "hybrid",
                                   "--text-field", TEXT_FIELD, "--field", VECTOR_FIELD,
                                   "--model", str(tiny_source_dir), "--technique", "rrf", "--show-query"])
    assert res.exit_code == 0, res.output
    assert '"hybrid"' in res.output and "score-ranker-processor" in res.output and " d1 " in res.output
    bad = CliRunner().invoke(cli, ["eval", "--dataset", str(ko_beir), "--model", str(tiny_source_dir), "--out",
                                   str(tmp_path / "bad"), "--hybrid", "min_max", "--weights", "0.5,0.6"])
    assert bad.exit_code != 0 and "sum of weights" in bad.output and "Traceback" not in bad.output


def test_eval_baseline_alone_needs_no_model(ko_beir, tmp_path):
    out = tmp_path / "nori"
    res = CliRunner().invoke(cli, ["eval", "--dataset", str(ko_beir), "--baseline", "bm25-nori", "--out", str(out)])
    assert res.exit_code == 0, res.output
    got = _json(res.stdout)
    assert got["rows"][0]["system"] == "BM25 (nori analyzer)"
    assert got["metrics"] == pytest.approx(evaluate_run(QRELS, LuceneBM25.build(DOCS).search(QUERIES, k=100)))
    assert "BM25 (nori analyzer)" in (out / "report.md").read_text(encoding="utf-8")
    bad = CliRunner().invoke(cli, ["eval", "--dataset", str(ko_beir), "--out", str(tmp_path / "x")])
    assert bad.exit_code != 0 and "--model is required" in bad.output
