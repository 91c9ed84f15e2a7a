"""Translate-train data (SPLADE-X (b)): English train queries paired with Korean positives, never dev queries."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from opensearch_lsr.cli import cli
from opensearch_lsr.training.data import TrainingDataError, load_training_data


def _copy(root: Path, docs: dict, train: dict, dev: dict, qrels_train: dict, qrels_dev: dict) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "text": t}, ensure_ascii=False) + "\n"
                                               for d, t in docs.items()), encoding="utf-8")
    for split, queries, qrels in (("train", train, qrels_train), ("dev", dev, qrels_dev)):
        (root / f"queries.{split}.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}, ensure_ascii=False)
                                                             + "\n" for q, t in queries.items()), encoding="utf-8")
        (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
            f"{q}\t{d}\t1\n" for q, d in qrels.items()), encoding="utf-8")
    return root


@pytest.fixture()
def copies(tmp_path) -> tuple[Path, Path]:
    ko = _copy(tmp_path / "set-ko", {"ko-d0": "서울은 한국의 수도", "ko-d1": "고양이는 집에", "ko-d2": "강물"},
               {"q1": "한국의 수도", "q2": "고양이 집"}, {"q9": "강"}, {"q1": "ko-d0", "q2": "ko-d1"}, {"q9": "ko-d2"})
    en = _copy(tmp_path / "set-en", {"en-d5": "river water", "en-d6": "seoul is the capital", "en-d7": "cat house"},
               {"q1": "capital of korea", "q2": "cat house"}, {"q9": "river"}, {"q1": "en-d6", "q2": "en-d7"},
               {"q9": "en-d5"})
    return ko, en


def test_english_queries_paired_with_korean_positives(copies):
    ko, en = copies
    data = load_training_data(ko, "train", queries_from=en)
    pairs = {(r["qid"], r["query"], r["positive"]) for r in data.rows}
    assert pairs == {("q1", "capital of korea", "서울은 한국의 수도"), ("q2", "cat house", "고양이는 집에")}
    # the dev query (q9) never enters, in either language
    assert all(r["qid"] != "q9" and r["query"] != "river" for r in data.rows)
    assert data.corpus is not None and set(data.corpus) == {"ko-d0", "ko-d1", "ko-d2"}
    ds = data.to_dataset()
    assert ds.column_names == ["query", "positive"] and ds[0]["query"] in {"capital of korea", "cat house"}


def test_queries_file_and_errors(copies, tmp_path):
    ko, _ = copies
    qfile = tmp_path / "q.tsv"
    qfile.write_text("q1\tcapitale de la Corée\nq2\tchat maison\n", encoding="utf-8")
    data = load_training_data(ko, "train", queries_from=qfile)
    assert sorted(r["query"] for r in data.rows) == ["capitale de la Corée", "chat maison"]
    qfile.write_text("q1\tcapitale\n", encoding="utf-8")
    with pytest.raises(TrainingDataError, match=r"query id 'q2' is not in .*q\.tsv"):
        load_training_data(ko, "train", queries_from=qfile)
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text(json.dumps({"query": "a", "positive": "b"}) + "\n")
    with pytest.raises(TrainingDataError, match="not a BEIR directory"):
        load_training_data(jsonl, queries_from=qfile)


def test_train_cli_query_language_resolves_the_sibling_copy(copies, tmp_path, monkeypatch):
    ko, en = copies
    seen = {}

    def fake_train(config, skip_bad_rows=False):
        seen["config"] = config
        raise ValueError("stop here")  # the CLI turns it into one sentence

    import opensearch_lsr.training as training

    monkeypatch.setattr(training, "train", fake_train)
    runner = CliRunner()
    res = runner.invoke(cli, ["train", "--model", "splade-tiny", "--dataset", str(ko), "--out", str(tmp_path / "o"),
                              "--query-language", "en"])
    assert "stop here" in res.output and res.exit_code != 0
    assert Path(seen["config"].queries_from).resolve() == en.resolve()
    res = runner.invoke(cli, ["train", "--model", "splade-tiny", "--dataset", str(ko), "--out", str(tmp_path / "o"),
                              "--query-language", "fr"])
    assert res.exit_code != 0 and "no fr copy" in res.output and "Traceback" not in res.output
