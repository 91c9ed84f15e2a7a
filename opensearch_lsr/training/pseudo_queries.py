"""Pseudo-queries from passages alone, for domain adaptation without a labelled query.

No generative model is available offline (doc2query / InPars / Promptagator need one), so queries are
*sampled* from the passage itself, in three styles that together cover what search users type:

* ``keywords``: 2-4 content morphemes of the passage (nori's analysis: nouns, proper nouns, foreign
  words, Chinese characters, roots, numbers of 2+ digits; one-syllable common nouns and bare verb /
  adjective stems are left out, they rarely stand alone in a query), drawn with probability proportional to their corpus IDF and kept
  in passage order ("수면 무호흡 원인"). Keyword queries are the majority of real search-box queries, and IDF
  sampling favours the terms that identify the passage (the term-selection idea of Lee et al. 2019,
  "Latent Retrieval for Weakly Supervised Open Domain QA", applied to morphemes).
* ``span``: a contiguous window of 4-10 words of one sentence: the Inverse Cloze Task (Lee et al. 2019)
  and the "random cropping" of Contriever (Izacard et al. 2022), shortened to query length.
* ``lead``: the first words of the passage's first sentence, a title-like span (MS MARCO passages
  carry no titles; their first sentence usually names the topic).
* ``question``: 1-2 IDF-sampled keywords in a common Korean question form ("수면 무호흡은 무엇인가요?",
  "수면 무호흡 원인"), the topic particle chosen by the last syllable's final consonant: search users type
  questions as well as keywords, and the template's words are in their queries too.
* ``synonym``: a ``question`` whose keyword is swapped for a neighbour in Kiwi's morpheme embeddings that
  the passage does not contain ("노트북 구입 방법" -> "노트북 구매 방법", :mod:`.synonyms`): the query names the passage's
  topic in other words, as users do; a passage with no such neighbour gives a plain question.

The queries are noisy by construction; ``training.adapt`` keeps only those whose source passage a
dense teacher also ranks near the top (round-trip consistency, Alberti et al. 2019 / Dai et al. 2023,
"Promptagator") and labels them with the teacher.
"""
from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from tqdm.auto import tqdm

from .synonyms import SynonymSource

__all__ = ["Strategy", "STRATEGIES", "CONTENT_TAGS", "QUESTION_FORMS", "PseudoQuery", "topic_particle",
           "PseudoQueryConfig", "MorphemeAnalyzer",
           "generate_pseudo_queries"]

Strategy = Literal["keywords", "span", "lead", "question", "synonym"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)

#: nori POS tags that make keyword-query terms (Lucene ``POS.Tag``): general / proper nouns, foreign
#: words (SL), numbers (SN), Chinese characters (SH), roots (XR).
CONTENT_TAGS = frozenset({"NNG", "NNP", "SL", "SN", "SH", "XR"})

_SENTENCE_END = re.compile(r"(?<=[.!?。])\s+")

#: question forms: ``{t}`` is the keywords plus the topic particle (은 / 는), ``{k}`` the bare keywords
QUESTION_FORMS: tuple[str, ...] = ("{t} 무엇인가요?", "{k} 정의", "{t} 무엇을 의미하나요?", "{t} 얼마인가요?",
                                   "{k} 방법", "{t} 어디인가요?", "{k} 원인", "{t} 언제인가요?", "{k} 의미",
                                   "{t} 어떻게 하나요?")


class MorphemeAnalyzer(Protocol):
    """What generation needs of an analyzer (``lexical.nori.NoriAnalyzer`` implements it)."""

    def morphemes(self, text: str) -> list[tuple[str, str]]: ...


@dataclass(frozen=True)
class PseudoQuery:
    """One sampled query and the passage it came from."""

    qid: str
    text: str
    source_id: str
    strategy: str


@dataclass
class PseudoQueryConfig:
    """How many queries of which style each passage gives.

    Attributes:
        per_passage: queries sampled per passage (styles cycle through ``strategies`` in order; ``None``: 3, and
            in ``adapt`` 6 for an inference-free corpus-only run, :meth:`.adapt.AdaptConfig.validate`).
        strategies: styles to use, from ``keywords``, ``span``, ``lead``, ``question``, ``synonym``.
        min_keywords, max_keywords: keyword-query length in morphemes.
        min_span, max_span: span-query length in whitespace words.
        seed: sampling seed (same corpus + config -> same queries).
    """

    per_passage: int | None = None
    # measured (relevance_vs_nori.md, corpus-only KL + IDF-aware FLOPS): keywords / span / keywords 0.867,
    # keywords / span / question 0.884, question / span / question 0.887 dev MRR@10
    strategies: tuple[str, ...] = ("question", "span", "question")
    min_keywords: int = 2
    max_keywords: int = 4
    min_span: int = 4
    max_span: int = 10
    seed: int = 42

    def validate(self) -> None:
        """Raise ``ValueError`` (one sentence) for an invalid parameter (``per_passage`` unset becomes 3)."""
        if self.per_passage is None:
            self.per_passage = 3
        if self.per_passage < 1:
            raise ValueError(f"per_passage must be >= 1, got {self.per_passage}")
        if not self.strategies:
            raise ValueError(f"strategies must name at least one of {', '.join(STRATEGIES)}")
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad:
            raise ValueError(f"unknown strategy {bad[0]!r}: choose from {', '.join(STRATEGIES)}")
        if not 1 <= self.min_keywords <= self.max_keywords:
            raise ValueError(f"need 1 <= min_keywords <= max_keywords, got {self.min_keywords}, {self.max_keywords}")
        if not 1 <= self.min_span <= self.max_span:
            raise ValueError(f"need 1 <= min_span <= max_span, got {self.min_span}, {self.max_span}")


def _keyword_worthy(term: str, tag: str) -> bool:
    if tag not in CONTENT_TAGS:
        return False
    if tag == "SN":
        return len(term) >= 2
    return tag in ("NNP", "SL") or len(term) >= 2


def _content_terms(analyzer: MorphemeAnalyzer, text: str) -> list[str]:
    return [term for term, tag in analyzer.morphemes(text) if _keyword_worthy(term, tag)]


def _keywords(terms: list[str], idf: Mapping[str, float], rng: random.Random, low: int, high: int) -> str:
    """``low``-``high`` of the passage's content terms drawn by IDF, in passage order ("" when there is none)."""
    unique = list(dict.fromkeys(terms))
    if not unique:
        return ""
    k = min(len(unique), rng.randint(low, high))
    # weighted sampling without replacement (Efraimidis & Spirakis 2006: key u^(1/w), top k)
    keys = {t: rng.random() ** (1.0 / max(idf.get(t, 1.0), 1e-6)) for t in unique}
    chosen = set(sorted(unique, key=keys.__getitem__, reverse=True)[:k])
    return " ".join(t for t in unique if t in chosen)


def _span(text: str, rng: random.Random, config: PseudoQueryConfig) -> str:
    sentences = [s for s in _SENTENCE_END.split(text) if len(s.split()) >= config.min_span] or [text]
    words = rng.choice(sentences).split()
    length = min(len(words), rng.randint(config.min_span, config.max_span))
    start = rng.randint(0, len(words) - length)
    return " ".join(words[start:start + length]).rstrip(".,!?")


def topic_particle(word: str) -> str:
    """은 after a Hangul syllable with a final consonant (받침), else 는 (also after non-Hangul)."""
    last = word[-1:] if word else ""
    has_final = "\uac00" <= last <= "\ud7a3" and (ord(last) - 0xAC00) % 28 != 0
    return "은" if has_final else "는"


def _question_form(words: str, rng: random.Random) -> str:
    return rng.choice(QUESTION_FORMS).format(k=words, t=words + topic_particle(words))


def _question(terms: list[str], idf: Mapping[str, float], rng: random.Random) -> str:
    words = _keywords(terms, idf, rng, 1, 2)
    return _question_form(words, rng) if words else ""


def _synonym_question(terms: list[str], idf: Mapping[str, float], rng: random.Random, text: str,
                      synonyms: SynonymSource) -> tuple[str, bool]:
    """A ``question`` with one keyword swapped for a neighbour absent from the passage; (query, swapped)."""
    words = _keywords(terms, idf, rng, 1, 2).split()
    if not words:
        return "", False
    swaps = [(i, other) for i, word in enumerate(words) for other in synonyms.neighbours(word)[:2]
             if other not in text]
    if swaps:
        i, other = rng.choice(swaps)
        words[i] = other
    return _question_form(" ".join(words), rng), bool(swaps)


def _lead(text: str, config: PseudoQueryConfig) -> str:
    first = _SENTENCE_END.split(text, maxsplit=1)[0]
    return " ".join(first.split()[:config.max_span]).rstrip(".,!?")


def generate_pseudo_queries(corpus: Mapping[str, str], analyzer: MorphemeAnalyzer,
                            config: PseudoQueryConfig | None = None,
                            synonyms: SynonymSource | None = None) -> list[PseudoQuery]:
    """Sample ``config.per_passage`` pseudo-queries from every passage of ``corpus``.

    Args:
        corpus: passage id -> text.
        analyzer: morpheme analyzer (nori-equivalent) used for keyword choice and the IDF.
        config: styles, lengths and seed.
        synonyms: neighbours for the ``synonym`` style (default: :class:`.synonyms.KiwiSynonyms`).

    Returns:
        Pseudo-queries with ids ``pq-<passage id>-<n>``; empty or duplicate (same passage, same text)
        queries are dropped. A ``synonym`` query with no swap is recorded as a ``question``.
    """
    config = config or PseudoQueryConfig()
    config.validate()
    if synonyms is None and "synonym" in config.strategies:
        from .synonyms import KiwiSynonyms

        synonyms = KiwiSynonyms()
    rng = random.Random(config.seed)
    terms_of = {pid: _content_terms(analyzer, text)
                for pid, text in tqdm(corpus.items(), desc="pseudo-queries: analysing passages", unit="passage")}
    df = Counter(t for terms in terms_of.values() for t in set(terms))
    n = max(len(corpus), 1)
    # Lucene BM25's IDF, log(1 + (N - df + 0.5) / (df + 0.5)): always positive
    idf = {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}
    out: list[PseudoQuery] = []
    for pid, text in corpus.items():
        seen: set[str] = set()
        for i in range(config.per_passage):
            strategy = config.strategies[i % len(config.strategies)]
            if strategy == "keywords":
                query = _keywords(terms_of[pid], idf, rng, config.min_keywords, config.max_keywords)
            elif strategy == "span":
                query = _span(text, rng, config)
            elif strategy == "question":
                query = _question(terms_of[pid], idf, rng)
            elif strategy == "synonym":
                query, swapped = _synonym_question(terms_of[pid], idf, rng, text, synonyms)
                strategy = "synonym" if swapped else "question"
            else:
                query = _lead(text, config)
            query = query.strip()
            if not query or query in seen:
                continue
            seen.add(query)
            out.append(PseudoQuery(f"pq-{pid}-{i}", query, pid, strategy))
    return out
