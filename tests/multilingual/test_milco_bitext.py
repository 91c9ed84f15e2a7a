"""MILCO bitext: TSV / JSONL reader (errors name file:line) and the MS MARCO ko/en builder."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from opensearch_lsr.multilingual.bitext import (
    BitextError,
    build_msmarco_bitext,
    read_bitext,
    resolve_bitext,
    write_bitext,
)


def test_read_tsv_and_jsonl(tmp_path):
    tsv = tmp_path / "b.tsv"
    tsv.write_text("hello world\t안녕 세상\n\nthe cat\t고양이\n", encoding="utf-8")
    assert read_bitext(tsv) == [("hello world", "안녕 세상"), ("the cat", "고양이")]
    jsonl = write_bitext(read_bitext(tsv), tmp_path / "b.jsonl")
    assert read_bitext(jsonl) == read_bitext(tsv)
    nosuffix = tmp_path / "pairs"
    nosuffix.write_text(jsonl.read_text(encoding="utf-8"), encoding="utf-8")
    assert read_bitext(nosuffix) == read_bitext(tsv)  # format sniffed from the first line


@pytest.mark.parametrize("name, text, message", [
    ("bad.tsv", "a\tb\nonly one field\n", "bad.tsv:2: expected 'english<TAB>target'"),
    ("bad.tsv", "a\tb\n\nx\ty\tz\n", "bad.tsv:3: expected"),
    ("bad.jsonl", '{"en": "a", "target": "b"}\n{"en": "a"\n', "bad.jsonl:2: not valid JSON"),
    ("bad.jsonl", '{"en": "a", "ko": "b"}\n', "bad.jsonl:1: expected an object with string keys 'en' and 'target'"),
    ("bad.tsv", "a\t \n", "bad.tsv:1: an empty"),
])
def test_bad_lines_name_file_and_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(BitextError, match=message.replace("(", r"\(")):
        read_bitext(path)


def test_missing_file_is_one_sentence(tmp_path):
    with pytest.raises(BitextError, match="does not exist"):
        read_bitext(tmp_path / "nope.tsv")


def _beir(root: Path, prefix: str, corpus: dict[str, str], queries: dict[str, dict[str, str]],
          qrels: dict[str, list[tuple[str, str]]]) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"{prefix}-{k}", "title": "", "text": v},
                                                          ensure_ascii=False) + "\n" for k, v in corpus.items()),
                                       encoding="utf-8")
    for split, rows in queries.items():
        (root / f"queries.{split}.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}, ensure_ascii=False)
                                                             + "\n" for q, t in rows.items()), encoding="utf-8")
        (root / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{prefix}-{d}\t1\n" for q, d in qrels[split]),
            encoding="utf-8")
    return root


def test_msmarco_bitext_pairs_train_only(tmp_path):
    en = _beir(tmp_path / "en", "en", {"d1": "ItÊ¼s a house", "d2": "a cat", "d3": "dev passage", "d4": "dog a"},
               {"train": {"q1": "what house", "q2": "a cat", "q3": "two pos"}, "dev": {"q9": "dev query"}},
               {"train": [("q1", "d1"), ("q2", "d3"), ("q3", "d4")], "dev": [("q9", "d3")]})
    ko = _beir(tmp_path / "ko", "ko", {"d7": "그것은 집", "d8": "고양이", "d9": "개", "d10": "개 둘"},
               {"train": {"q1": "무슨 집", "q2": "고양이", "q3": "두 개"}, "dev": {"q9": "개발"}},
               {"train": [("q1", "d7"), ("q2", "d8"), ("q3", "d9"), ("q3", "d10")], "dev": [("q9", "d8")]})
    pairs, facts = build_msmarco_bitext(ko, en)
    assert ("what house", "무슨 집") in pairs and ("a cat", "고양이") in pairs
    assert ("It's a house", "그것은 집") in pairs  # mojibake repaired (ftfy)
    assert not any("dev" in e or "개발" in t for e, t in pairs)  # dev queries / dev positives never used
    assert facts["query_pairs"] == 3 and facts["passage_pairs"] == 1
    assert facts["skipped_ambiguous_queries"] == 1 and facts["skipped_dev_positives"] == 1
    kept, _ = build_msmarco_bitext(ko, en, mojibake="keep")
    assert ("ItÊ¼s a house", "그것은 집") in kept
    resolved, resolved_facts = resolve_bitext(f"msmarco:{ko},{en}", tmp_path / "out")
    assert resolved == pairs and read_bitext(resolved_facts["file"]) == pairs
    with pytest.raises(BitextError, match="msmarco:<ko_dir>,<en_dir>"):
        resolve_bitext(f"msmarco:{ko}")
