"""Korean word neighbours from Kiwi's morpheme embeddings, for synonym swaps in pseudo-queries.

A query sampled from a passage only uses the passage's own words; real users often name the same thing
differently ("구입" / "구매", "체중" / "몸무게"). Kiwi (kiwipiepy >= 0.21 with the ``kiwipiepy-model`` package)
ships CoNg, a contextual n-gram language model whose morpheme embeddings answer
``Kiwi.most_similar_morphemes`` (cosine similarity; Lee 2024, "Kiwi: Developing a Korean Morphological
Analyzer Based on Statistical Language Models and Skip-Bigram Models"). No library turns those neighbours
into query rewrites, so :mod:`.pseudo_queries` does it; the teacher's round-trip filter in
:mod:`.adapt` then drops the swaps that changed the query's meaning.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["SynonymSource", "KiwiSynonyms", "NOUN_TAGS"]

#: Sejong tags (shared by nori / mecab-ko-dic and Kiwi) of the terms that are swapped: common and proper nouns.
NOUN_TAGS = ("NNG", "NNP")


class SynonymSource(Protocol):
    """What a synonym swap needs: words close in meaning to ``term`` (best first, ``term`` itself left out)."""

    def neighbours(self, term: str) -> list[str]: ...


@dataclass
class KiwiSynonyms:
    """Noun neighbours from Kiwi's CoNg morpheme embeddings.

    Attributes:
        min_score: the least cosine similarity kept (0.6: "구입" -> "구매", "체중" -> "몸무게"; below it
            neighbours drift to related rather than equivalent words). One-syllable nouns are left out, as
            for keyword queries (ambiguous alone).
        top_n: neighbours looked at per term.
        model_path: a Kiwi model directory (default: the installed ``kiwipiepy-model``'s).
    """

    min_score: float = 0.6
    top_n: int = 8
    model_path: str | None = None
    _kiwi: Any = field(default=None, init=False, repr=False)
    _cache: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            from kiwipiepy import Kiwi
        except ImportError as err:
            raise ImportError("synonym swaps need Kiwi's language model: pip install kiwipiepy kiwipiepy-model "
                              "(or the `offline` extra)") from err
        if self.model_path is None:
            try:
                import kiwipiepy_model
            except ImportError as err:
                raise ImportError("synonym swaps need the kiwipiepy-model package (CoNg morpheme "
                                  "embeddings): pip install kiwipiepy-model") from err
            self.model_path = kiwipiepy_model.get_model_path()
        self._kiwi = Kiwi(model_path=self.model_path, model_type="cong")

    def neighbours(self, term: str) -> list[str]:
        """Nouns within ``min_score`` of ``term`` as a common or proper noun; [] for a word Kiwi lacks.

        Forms that contain ``term`` or are contained in it ("당뇨병" / "당뇨") are left out: they are the
        same word to a subword tokenizer, not a rewrite."""
        if term not in self._cache:
            found: dict[str, float] = {}
            for tag in NOUN_TAGS:
                try:
                    similar = self._kiwi.most_similar_morphemes((term, tag), top_n=self.top_n)
                except (ValueError, KeyError):  # no such morpheme under this tag
                    continue
                for m in similar:
                    if (m.score >= self.min_score and m.tag in NOUN_TAGS and len(m.form) >= 2
                            and term not in m.form and m.form not in term):
                        found[m.form] = max(found.get(m.form, 0.0), float(m.score))
            self._cache[term] = sorted(found, key=found.__getitem__, reverse=True)
        return self._cache[term]
