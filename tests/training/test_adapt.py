"""``lsr-os adapt``: pseudo-queries from passages only, teacher-checked and teacher-labelled, then training.

The teacher is the bag-of-words stand-in of ``test_teacher`` (cosine = shared words), so every kept
query, negative and score can be checked by hand."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from opensearch_lsr.training.adapt import AdaptConfig, adapt, label_queries, read_adapt_corpus
from opensearch_lsr.training.pseudo_queries import QUESTION_FORMS, PseudoQueryConfig, generate_pseudo_queries

from bow_teacher import BagOfWordsTeacher, bow_teacher  # noqa: F401 - fixture


class WordTagger:
    """Analyzer stand-in: every word is a noun, except the stop words, tagged as particles."""

    STOP = {"the", "a", "is", "of"}

    def morphemes(self, text: str) -> list[tuple[str, str]]:
        return [(w, "J" if w in self.STOP else "NNG") for w in text.lower().replace(".", " ").split()]


def test_pseudo_queries_come_from_their_passage():
    corpus = {"d1": "seoul is the capital of korea. the river runs through the city of seoul",
              "d2": "a dog and a cat"}
    config = PseudoQueryConfig(per_passage=3, strategies=("keywords", "span", "lead"), min_span=2, max_span=4)
    queries = generate_pseudo_queries(corpus, WordTagger(), config)
    assert {q.strategy for q in queries} == {"keywords", "span", "lead"}
    for q in queries:
        words = corpus[q.source_id].replace(".", "").split()
        assert all(w in words for w in q.text.split()), q
        if q.strategy == "keywords":
            assert not set(q.text.split()) & WordTagger.STOP and 1 <= len(q.text.split()) <= 4
    assert [q.text for q in queries if q.strategy == "lead" and q.source_id == "d1"] == ["seoul is the capital"]
    # same corpus and seed -> same queries
    assert queries == generate_pseudo_queries(corpus, WordTagger(), config)
    with pytest.raises(ValueError, match="unknown strategy"):
        generate_pseudo_queries(corpus, WordTagger(), PseudoQueryConfig(strategies=("doc2query",)))


def test_question_queries_put_passage_keywords_in_a_question_form():
    from opensearch_lsr.training.pseudo_queries import QUESTION_FORMS, topic_particle

    assert [topic_particle(w) for w in ("수면", "무호흡", "서울", "BTS", "")] == ["은", "은", "은", "는", "는"]
    assert topic_particle("나무") == "는" and topic_particle("한국") == "은"
    corpus = {"d1": "수면 무호흡 원인 치료", "d2": "서울 지하철 노선 요금"}
    config = PseudoQueryConfig(per_passage=4, strategies=("question",))
    queries = generate_pseudo_queries(corpus, WordTagger(), config)
    assert queries and {q.strategy for q in queries} == {"question"}
    for q in queries:
        form = next(f for f in QUESTION_FORMS if _matches(f, q.text))  # exactly one of the forms
        words = q.text.replace("은 ", " ").replace("는 ", " ").split()
        keywords = [w for w in words if w in corpus[q.source_id].split()]
        assert 1 <= len(keywords) <= 2 and form


class TableSynonyms:
    """SynonymSource stand-in: a fixed neighbour table."""

    TABLE = {"요금": ["운임", "가격", "비용"], "수면": ["잠"], "치료": ["요금"]}

    def neighbours(self, term: str) -> list[str]:
        return self.TABLE.get(term, [])


def test_synonym_queries_swap_one_keyword_for_a_neighbour_the_passage_lacks():
    corpus = {"d1": "수면 무호흡 원인 치료", "d2": "서울 지하철 노선 요금", "d3": "한강 다리"}
    config = PseudoQueryConfig(per_passage=6, strategies=("synonym",))
    queries = generate_pseudo_queries(corpus, WordTagger(), config, synonyms=TableSynonyms())
    swapped = [q for q in queries if q.strategy == "synonym"]
    assert swapped and {q.strategy for q in queries} <= {"synonym", "question"}
    assert not any(q.source_id == "d3" for q in swapped)  # no neighbour: plain questions only
    for q in queries:
        assert next(f for f in QUESTION_FORMS if _matches(f, q.text))
        words = q.text.replace("은 ", " ").replace("는 ", " ").rstrip("?").split()
        passage = corpus[q.source_id].split()
        table_words = {n for t in passage for n in TableSynonyms.TABLE.get(t, [])[:2]}
        foreign = [w for w in words if w not in passage and w in table_words]
        if q.strategy == "synonym":  # exactly one keyword swapped, for one of a passage term's first two neighbours
            assert len(foreign) == 1 and foreign[0] not in corpus[q.source_id]
        else:
            assert not foreign
    # "치료" -> "요금" is not a swap for d1 only because d1 lacks it; d2 contains "요금", so "요금" -> "운임"/"가격"
    assert not any("비용" in q.text for q in swapped)  # third neighbour: never used


def test_kiwi_synonyms_give_close_nouns():
    pytest.importorskip("kiwipiepy_model", reason="needs the offline extra (kiwipiepy-model)")
    from opensearch_lsr.training.synonyms import KiwiSynonyms

    kiwi = KiwiSynonyms()
    assert "구매" in kiwi.neighbours("구입") and "몸무게" in kiwi.neighbours("체중")
    assert "뜻" not in kiwi.neighbours("의미")  # one-syllable nouns are left out, as for keywords
    assert "당뇨" not in kiwi.neighbours("당뇨병")  # contained forms are not rewrites
    assert kiwi.neighbours("없는낱말이에요") == []


def _matches(form: str, text: str) -> bool:
    import re

    pattern = re.escape(form).replace(re.escape("{t}"), ".+[은는]").replace(re.escape("{k}"), ".+")
    return re.fullmatch(pattern, text) is not None


TOPICS = [("house", "city"), ("cat", "dog"), ("capital", "france"), ("seoul", "korea"), ("water", "river"),
          ("car", "road"), ("book", "school"), ("paris", "capital"), ("dog", "road"), ("river", "city"),
          ("korea", "school"), ("france", "book")]


def _corpus_file(tmp_path: Path) -> Path:
    rows = [{"_id": f"d{i}", "text": f"{a} the {b} of {a}"} for i, (a, b) in enumerate(TOPICS)]
    rows += [{"_id": f"x{i}", "text": f"the {w} is a {w}"} for i, w in enumerate(["car", "book", "water"])]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_label_queries_keeps_consistent_queries_and_mines_non_positives(tmp_path, bow_teacher):
    corpus, bad = read_adapt_corpus(_corpus_file(tmp_path))
    assert not bad
    config = AdaptConfig(model="m", corpus=str(_corpus_file(tmp_path)), out=str(tmp_path / "o"), teacher="fake",
                         consistency_rank=1, negatives=1, negative_sources=("teacher",), negative_depth=5,
                         teacher_margin=0.0, teacher_temperature=0.05)
    queries = [("q0", "house city", {"d0"}),      # d0 is the teacher's top 1: kept
               ("q1", "capital", {"d0"})]         # d2 / d7 share "capital", d0 does not: dropped
    rows, dropped = label_queries(queries, corpus, config, consistency=True)
    assert dropped == 1 and len(rows) == 1
    row = rows[0]
    assert row["query"] == "house city" and row["positive"] == corpus["d0"]
    teacher = BagOfWordsTeacher()
    q = teacher.embed([row["query"]])[0]
    cos = [float(teacher.embed([t])[0] @ q) for t in [row["positive"], *row["negative"]]]
    assert row["scores"] == pytest.approx([c / 0.05 for c in cos], rel=1e-5)
    assert row["negative"][0] != row["positive"] and cos[1] <= cos[0]
    # without the consistency filter (and any candidate allowed as a negative) both are kept
    rows, dropped = label_queries(queries, corpus, replace(config, teacher_margin=-1.0), consistency=False)
    assert dropped == 0 and len(rows) == 2


def test_read_adapt_corpus_reports_bad_lines(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"_id": "a", "text": "seoul"}\nnot json\n{"_id": "a", "text": "again"}\n{"text": "no id"}\n',
                    encoding="utf-8")
    corpus, bad = read_adapt_corpus(path)
    import hashlib

    assert corpus == {"a": "seoul", hashlib.sha1(b"no id").hexdigest(): "no id"}  # the id lsr-os index gives it
    assert len(bad) == 2 and bad[0].startswith("c.jsonl:2: malformed") and "duplicate id 'a'" in bad[1]
    empty = tmp_path / "e.jsonl"
    empty.write_text("not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no passage"):
        read_adapt_corpus(empty)


def test_adapt_end_to_end_reads_no_label_and_resumes(tmp_path, tiny_encoder_dir, bow_teacher):
    pytest.importorskip("mecab_ko")
    corpus = _corpus_file(tmp_path)
    out = tmp_path / "adapted"
    config = AdaptConfig(model=str(tiny_encoder_dir), corpus=str(corpus), out=str(out), teacher="fake",
                         inference_free=True, consistency_rank=3, negatives=1, negative_depth=5,
                         queries=PseudoQueryConfig(per_passage=2), batch_size=4, epochs=1, save_steps=0,
                         max_seq_length=16, threads=1)
    result = adapt(config)
    assert result.passages == 15 and result.labelled_pairs == 0 and 0 < result.kept_pseudo_queries <= 30
    assert result.train["steps"] >= 1
    saved = json.loads((out / "adapt_config.json").read_text())
    assert saved["labels"] is None and saved["inference_free"] is True
    assert (out / "idf.json").is_file() and (out / "modules.json").is_file()
    pairs = [json.loads(x) for x in (out / "adapt_work" / "pairs.jsonl").read_text().splitlines()]
    corpus_texts = {json.loads(x)["text"] for x in corpus.read_text().splitlines()}
    from opensearch_lsr.training.pseudo_queries import QUESTION_FORMS

    form_words = {w for f in QUESTION_FORMS for w in f.split() if "{" not in w}
    passage_words = set(" ".join(corpus_texts).split())
    for row in pairs:  # every query is a passage's own words (in a question form): no labelled query was read
        assert row["positive"] in corpus_texts
        words = {w for w in row["query"].split() if w not in form_words}
        assert {w[:-1] if w not in passage_words and w[-1:] in "은는" else w for w in words} <= passage_words
    from sentence_transformers import SparseEncoder

    emb = SparseEncoder(str(out)).encode_document(["seoul korea"], convert_to_tensor=True)
    assert emb.shape[-1] > 0 and float(emb.to_dense().sum()) >= 0
    # a finished run is not redone; an interrupted one (no summary yet) reuses both data stages (files
    # untouched, teacher not called) and only re-enters training
    stamp = (out / "adapt_work" / "pairs.jsonl").stat().st_mtime_ns
    model_stamp = (out / "modules.json").stat().st_mtime_ns
    bow_teacher.clear()
    same = adapt(config)
    assert (same.rows, same.kept_pseudo_queries) == (result.rows, result.kept_pseudo_queries)
    assert (out / "modules.json").stat().st_mtime_ns == model_stamp and bow_teacher == []
    (out / "adapt_summary.json").unlink()
    again = adapt(config)
    assert bow_teacher == [] and (out / "adapt_work" / "pairs.jsonl").stat().st_mtime_ns == stamp
    assert again.rows == result.rows and (out / "adapt_summary.json").is_file()


def test_adapt_rejects_bad_config(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        AdaptConfig(model="m", corpus=str(tmp_path / "nope.jsonl"), out="o").validate()
    corpus = _corpus_file(tmp_path)
    with pytest.raises(ValueError, match="negative sources"):
        AdaptConfig(model="m", corpus=str(corpus), out="o", negative_sources=("dense",)).validate()
    with pytest.raises(ValueError, match="qrels"):
        AdaptConfig(model="m", corpus=str(corpus), out="o", labels=str(tmp_path)).validate()
    with pytest.raises(ValueError, match="inference-free"):
        AdaptConfig(model="m", corpus=str(corpus), out="o", query_lr=0.1).validate()
