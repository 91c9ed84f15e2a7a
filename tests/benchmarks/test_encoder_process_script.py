"""``benchmarks/encoder_process.py``: the ``--encoder-process`` job beside the in-process one, in one run."""
from __future__ import annotations

import json


def test_the_small_vocabulary_is_trained_on_the_corpus_and_loads_as_a_bert_tokenizer(tmp_path, load_script):
    from transformers import AutoTokenizer

    module = load_script("encoder_process")
    texts = ["서울의 인구는 천만 명이다", "부산은 항구 도시이다", "house cat dog"] * 20
    tok = AutoTokenizer.from_pretrained(str(module.small_vocabulary(texts, tmp_path / "tok", vocab_size=120)))
    ids = tok("서울의 인구")["input_ids"]
    assert len(tok) <= 120 and ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert tok.unk_token_id not in ids  # pieces of the corpus it was trained on are in the vocabulary


def test_both_jobs_write_every_passage_and_the_run_says_how_they_compare(shared_data, tmp_path, load_script):
    module = load_script("encoder_process")
    out = tmp_path / "e.json"
    result = module.main(["--data", str(shared_data), "--limit", "40", "--repeat", "1", "--out", str(out)])
    assert json.loads(out.read_text())["run"]["commit"] and "| --encoder-process |" in out.with_suffix(".md").read_text()
    for name in ("in process", "--encoder-process"):
        (run,) = result[name]["runs"]
        assert run["docs"] == 40 and run["bytes"] > 0 and run["device_thread_s"]["launch"] > 0
    assert result["in process"]["x_in_process"] == 1.0 and result["--encoder-process"]["x_in_process"] > 0
