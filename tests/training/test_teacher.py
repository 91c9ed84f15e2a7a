"""Dense-teacher distillation data: negatives come from the teacher's ranking, never a positive; scores
are the teacher's cosines over its temperature; ``train --teacher`` runs KL distillation on them."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from opensearch_lsr.training.data import TrainingDataError, read_beir_pairs
from opensearch_lsr.training.teacher import mine_teacher_negatives

from bow_teacher import VOCAB, BagOfWordsTeacher, bow_teacher  # noqa: E402,F401 - fixture


def test_negatives_are_ranked_non_positives_with_scaled_scores(tiny_beir, bow_teacher):
    data = read_beir_pairs(tiny_beir, "train")
    mined = mine_teacher_negatives(data, "fake", num_negatives=2, range_max=4, temperature=0.05, seed=1)
    assert bow_teacher == [("fake", "passage"), ("fake", "query")]
    assert mined.label_kind == "scores" and mined.num_negatives == 2 and len(mined.rows) == len(data.rows)
    teacher = BagOfWordsTeacher()
    doc_ids = list(data.corpus)
    docs = teacher.embed(list(data.corpus.values()))
    positives = {}
    for row in data.rows:
        positives.setdefault(row["qid"], set()).add(data.corpus[row["did"]])
    for row in mined.rows:
        q = teacher.embed([row["query"]])[0]
        sims = docs @ q
        # the teacher's top 4 documents that are not positives of this query (ties: any of equal score)
        non_positive = sorted((float(sims[i]) for i, d in enumerate(doc_ids)
                               if data.corpus[d] not in positives[row["qid"]]), reverse=True)
        assert len(row["negatives"]) == 2
        for neg in row["negatives"]:
            assert float(teacher.embed([neg])[0] @ q) >= non_positive[3] - 1e-6
        assert not set(row["negatives"]) & positives[row["qid"]]
        expected = [float(teacher.embed([row["positive"]])[0] @ q) / 0.05] + \
                   [float(teacher.embed([n])[0] @ q) / 0.05 for n in row["negatives"]]
        assert row["label"] == pytest.approx(expected, rel=1e-5)
        # the positive shares both query words: no negative scores above it
        assert row["label"][0] >= max(row["label"][1:]) - 1e-4


def test_bad_arguments_are_clear(tiny_beir, tmp_path, bow_teacher):
    data = read_beir_pairs(tiny_beir, "train")
    with pytest.raises(ValueError, match="cannot draw 5 negatives from teacher ranks"):
        mine_teacher_negatives(data, "fake", num_negatives=5, range_max=3)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        mine_teacher_negatives(data, "fake", temperature=0)
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"query": "cat", "positive": "cat dog"}) + "\n", encoding="utf-8")
    from opensearch_lsr.training.data import read_jsonl_pairs

    with pytest.raises(TrainingDataError, match="need a BEIR dataset"):
        mine_teacher_negatives(read_jsonl_pairs(jsonl), "fake")


def test_train_with_teacher_distils_kl(tiny_encoder_dir, tiny_beir, tmp_path, bow_teacher):
    from opensearch_lsr.cli import cli

    out = tmp_path / "kd"
    res = CliRunner().invoke(cli, [
        "train", "--model", str(tiny_encoder_dir), "--dataset", str(tiny_beir), "--out", str(out),
        "--teacher", "fake", "--teacher-negatives", "2", "--teacher-depth", "6", "--loss", "kldiv",
        "--max-steps", "2", "--batch-size", "4", "--max-seq-length", "16", "--eval-queries", "4",
        "--eval-corpus", "12"])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["loss"] == "kldiv" and summary["steps"] == 2
    saved = json.loads((out / "train_config.json").read_text())
    assert saved["teacher"] == "fake" and saved["num_negatives"] == 2 and saved["teacher_depth"] == 6
    res = CliRunner().invoke(cli, ["train", "--model", str(tiny_encoder_dir), "--dataset", str(tiny_beir),
                                   "--out", str(tmp_path / "x"), "--teacher", "fake", "--hard-negatives", "bm25"])
    assert res.exit_code == 1 and "drop --hard-negatives" in res.output


def test_margin_skips_near_ties_of_the_positive(tiny_beir, bow_teacher):
    data = read_beir_pairs(tiny_beir, "train")
    mined = mine_teacher_negatives(data, "fake", num_negatives=1, range_max=10, margin=0.3, temperature=1.0)
    assert mined.rows
    for row in mined.rows:
        # without the margin, same-topic passages (cosine equal to the positive's) would be drawn
        assert row["label"][1] <= row["label"][0] - 0.3 + 1e-6
