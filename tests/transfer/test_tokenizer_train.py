"""`train_tokenizer` / `lsr-os tokenizer train`: Hangul kept whole, decode == vocab string, the same vocabulary on
every run, bad input."""
from __future__ import annotations

import json
import random
import unicodedata

import pytest
from click.testing import CliRunner

from opensearch_lsr.cli import cli
from opensearch_lsr.transfer.surgery import load_target_tokenizer
from opensearch_lsr.corpus import CorpusTexts, iter_corpus_texts
from opensearch_lsr.transfer.tokenizer_train import SPECIAL_TOKENS, train_tokenizer

CORPUS = [
    "고양이는 집에서 잔다. 고양이가 집을 좋아한다.",
    "서울은 한국의 수도이다. 서울에는 강이 있다.",
    "The Cat sat on the MAT in Seoul.",
    "자동차가 도로를 달린다. 학교에 가는 길에 책을 읽는다.",
    "Café au lait costs ＡＢＣ 123 won in 서울.",
] * 20


def _is_jamo(ch: str) -> bool:
    return 0x1100 <= ord(ch) <= 0x11FF or 0x3130 <= ord(ch) <= 0x318F


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_trained_tokenizer_keeps_hangul_and_decodes_to_vocab_string(tmp_path, kind):
    tok = train_tokenizer(CORPUS, 300, tmp_path / kind, kind=kind, min_frequency=1)
    assert (tmp_path / kind / "tokenizer.json").exists() and (tmp_path / kind / "tokenizer_config.json").exists()
    reloaded = load_target_tokenizer(str(tmp_path / kind))
    vocab = reloaded.get_vocab()
    assert [vocab[s] for s in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert reloaded.cls_token_id == 2 and reloaded.mask_token_id == 4 and reloaded.pad_token_id == 0
    # no jamo anywhere: the NFD decomposition of BERT's accent stripping would produce them
    assert not any(_is_jamo(ch) for token in vocab for ch in token)
    assert "고양이" in vocab or "고양" in vocab
    pieces = reloaded.tokenize("고양이는 집에서")
    assert all(not _is_jamo(ch) for p in pieces for ch in p)
    assert "".join(p.removeprefix("##") for p in pieces) == "고양이는집에서"
    # single-id decode == vocabulary string (OpenSearch's sparse keys)
    for token, idx in vocab.items():
        assert reloaded.decode([idx]) == token
    # post-processor adds [CLS] ... [SEP]; NFKC folds full-width letters, lowercase applies to Latin only
    ids = reloaded("ＡＢＣ Café")["input_ids"]
    assert ids[0] == 2 and ids[-1] == 3
    text = "".join(p.removeprefix("##") for p in reloaded.convert_ids_to_tokens(ids[1:-1]))
    assert text == "abccafé"
    assert tok.get_vocab() == vocab


def _tie_heavy_corpus() -> list[str]:
    """Words of 2-5 syllables drawn from 30: many pairs share a count, so ties decide the merges."""
    rng = random.Random(7)
    syllables = [chr(0xAC00 + 37 * i) for i in range(30)]
    return [" ".join("".join(rng.choice(syllables) for _ in range(rng.randint(2, 5))) for _ in range(12))
            for _ in range(300)]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_same_corpus_same_vocabulary(tmp_path, kind):
    # tokenizers numbers the ## continuations in hash-map order and breaks merge ties by those numbers
    # (huggingface/tokenizers#1794): before the continuations were numbered up front, each of these runs
    # kept a different vocabulary
    corpus = _tie_heavy_corpus()
    runs = [(tmp_path / f"{kind}{i}" / "tokenizer.json") for i in range(3)]
    for i, path in enumerate(runs):
        texts = iter(corpus) if i == 2 else corpus  # a one-shot iterator gives the same as a list
        train_tokenizer(texts, 400, path.parent, kind=kind, min_frequency=1)
    assert runs[0].read_bytes() == runs[1].read_bytes() == runs[2].read_bytes()
    saved = json.loads(runs[0].read_text(encoding="utf-8"))
    # the continuations went back to plain vocabulary entries: only the BERT specials are added tokens
    assert [t["content"] for t in saved["added_tokens"]] == list(SPECIAL_TOKENS)
    vocab = saved["model"]["vocab"]
    assert len(vocab) == 400 and sum(t.startswith("##") for t in vocab) > 30
    tok = load_target_tokenizer(str(runs[0].parent))
    continuation = next(t for t in vocab if t.startswith("##") and len(t) == 3)
    # typed in a text, "##" is punctuation: an added token would have matched the text whole
    assert tok.tokenize(continuation) == ["[UNK]", "[UNK]", continuation[2:]]


def test_corpus_texts_reads_the_file_again(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "가나"}\n\n{"title": "제목", "text": "다라"}\n', encoding="utf-8")
    texts = CorpusTexts(corpus)
    assert list(texts) == list(texts) == ["가나", "제목 다라"]


def test_normalizer_composes_decomposed_hangul(tmp_path):
    tok = train_tokenizer(CORPUS, 300, tmp_path / "wp", min_frequency=1)
    decomposed = unicodedata.normalize("NFD", "고양이")
    assert decomposed != "고양이"
    assert tok.tokenize(decomposed) == tok.tokenize("고양이")


def test_bad_input_rejected(tmp_path):
    with pytest.raises(ValueError, match="kind must be one of wordpiece, bpe"):
        train_tokenizer(CORPUS, 300, tmp_path / "a", kind="unigram")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(CORPUS, 10, tmp_path / "b")
    with pytest.raises(ValueError, match="empty"):
        train_tokenizer(["", "  "], 300, tmp_path / "c")
    with pytest.raises(ValueError, match="does not exist"):
        list(iter_corpus_texts(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "x"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="'text' field"):
        list(iter_corpus_texts(bad))


def test_cli_tokenizer_train(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"_id": str(i), "title": "", "text": t})
                                for i, t in enumerate(CORPUS)), encoding="utf-8")
    runner = CliRunner()
    res = runner.invoke(cli, ["tokenizer", "train", "--corpus", str(corpus), "--vocab-size", "300",
                              "--out", str(tmp_path / "tok"), "--kind", "bpe", "--min-frequency", "1"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["kind"] == "bpe"
    assert load_target_tokenizer(str(tmp_path / "tok")).tokenize("서울")[0].startswith("서")
    res = runner.invoke(cli, ["tokenizer", "train", "--corpus", str(tmp_path / "nope.txt"), "--vocab-size", "300",
                              "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "does not exist" in res.output and "Traceback" not in res.output
