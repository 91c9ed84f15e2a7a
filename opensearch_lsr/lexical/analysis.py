"""The analyzer of a ``text`` field, resolved from index settings and mappings as OpenSearch does.

Supported: the built-in ``nori`` analyzer (plugin ``analysis-nori``: ``KoreanAnalyzer``), a ``custom``
analyzer whose tokenizer is a ``nori_tokenizer`` (``decompound_mode``, ``discard_punctuation``) and whose
filters are ``nori_part_of_speech`` (``stoptags``), ``nori_readingform`` and ``lowercase``, and the
``standard`` analyzer (the default of a ``text`` field).

``standard`` is approximated: Lucene's ``StandardTokenizer`` segments by UAX#29 word boundaries; here a
word is a run of Unicode word characters (``\\w+``), lower-cased, at most 255 characters (longer runs are
split, as ``max_token_length`` does). Apostrophes and a few ``MidNum``/``MidLetter`` joins (``3.14``,
``can't``) are split here and kept whole by Lucene.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from .nori import DEFAULT_STOP_TAGS, NoriAnalyzer, NoriConfigError, NoriToken

__all__ = ["TextAnalyzer", "StandardAnalyzer", "analyzer_for_field", "SUPPORTED_FILTERS"]

SUPPORTED_FILTERS = ("nori_part_of_speech", "nori_readingform", "lowercase")
_WORD = re.compile(r"\w+")


class TextAnalyzer(Protocol):
    """What BM25 indexing needs from an analyzer."""

    def tokens(self, text: str) -> tuple[NoriToken, ...]:
        """The analysed stream with position increments."""

    def analyze(self, text: str) -> list[str]:
        """The terms, in order."""

    def settings(self) -> dict[str, Any]:
        """A JSON-able description (part of cache keys)."""


@dataclass(frozen=True)
class StandardAnalyzer:
    """Approximation of Lucene's ``StandardAnalyzer`` without stop words (OpenSearch's ``standard``)."""

    max_token_length: int = 255

    def tokens(self, text: str) -> tuple[NoriToken, ...]:
        out = []
        for word in _WORD.findall(text.lower()):
            for i in range(0, len(word), self.max_token_length):
                out.append(NoriToken(word[i:i + self.max_token_length], "<ALPHANUM>"))
        return tuple(out)

    def analyze(self, text: str) -> list[str]:
        return [t.term for t in self.tokens(text)]

    def settings(self) -> dict[str, Any]:
        return {"type": "standard", "max_token_length": self.max_token_length}


def _analysis(settings: Mapping[str, Any] | None) -> Mapping[str, Any]:
    settings = settings or {}
    if "settings" in settings:
        settings = settings["settings"] or {}
    index = settings.get("index", settings)
    return (index or {}).get("analysis") or settings.get("analysis") or {}


def _nori_tokenizer(name: str, analysis: Mapping[str, Any]) -> dict[str, Any]:
    if name == "nori_tokenizer":
        return {}
    spec = (analysis.get("tokenizer") or {}).get(name)
    if not isinstance(spec, Mapping) or spec.get("type") != "nori_tokenizer":
        raise NoriConfigError(f"tokenizer [{name}] is not a nori_tokenizer; the local backend analyses text with "
                              "nori_tokenizer or the standard analyzer only")
    unsupported = sorted(set(spec) - {"type", "decompound_mode", "discard_punctuation"})
    if unsupported:
        raise NoriConfigError(f"nori_tokenizer setting(s) {', '.join(unsupported)} are not supported by the local "
                              "backend (supported: decompound_mode, discard_punctuation)")
    out: dict[str, Any] = {}
    if "decompound_mode" in spec:
        out["decompound_mode"] = str(spec["decompound_mode"]).lower()
    if "discard_punctuation" in spec:
        out["discard_punctuation"] = str(spec["discard_punctuation"]).lower() == "true"
    return out


def analyzer_for_field(properties: Mapping[str, Any], settings: Mapping[str, Any] | None, field: str,
                       search: bool = False) -> NoriAnalyzer | StandardAnalyzer:
    """The analyzer OpenSearch would use for ``field`` (``search_analyzer`` first when ``search``).

    Raises:
        NoriConfigError: an analyzer, tokenizer or filter the local backend does not reproduce.
    """
    spec = properties.get(field) or {}
    name = (spec.get("search_analyzer") if search else None) or spec.get("analyzer") or "default"
    analysis = _analysis(settings)
    custom = (analysis.get("analyzer") or {}).get(name)
    if custom is None:
        if name in ("default", "standard"):
            return StandardAnalyzer()
        if name == "nori":
            return NoriAnalyzer()
        raise NoriConfigError(f"analyzer [{name}] has not been configured in mappings (the local backend knows "
                              "nori, standard and custom nori_tokenizer analyzers)")
    kind = custom.get("type", "custom")
    if kind == "nori":
        return NoriAnalyzer(decompound_mode=str(custom.get("decompound_mode", "discard")).lower(),  # type: ignore[arg-type]
                            stop_tags=frozenset(custom.get("stoptags", DEFAULT_STOP_TAGS)))
    if kind == "standard":
        return StandardAnalyzer(int(custom.get("max_token_length", 255)))
    if kind != "custom":
        raise NoriConfigError(f"analyzer type [{kind}] is not supported by the local backend")
    params: dict[str, Any] = _nori_tokenizer(str(custom.get("tokenizer", "")), analysis)
    params.update(stop_tags=None, reading_form=False, lowercase=False)
    for fname in custom.get("filter", []):
        fspec = (analysis.get("filter") or {}).get(fname, {"type": fname})
        ftype = fspec.get("type", fname)
        if ftype == "nori_part_of_speech":
            params["stop_tags"] = frozenset(fspec.get("stoptags", DEFAULT_STOP_TAGS))
        elif ftype == "nori_readingform":
            params["reading_form"] = True
        elif ftype == "lowercase":
            params["lowercase"] = True
        else:
            raise NoriConfigError(f"token filter [{fname}] is not supported by the local backend (supported: "
                                  f"{', '.join(SUPPORTED_FILTERS)})")
    return NoriAnalyzer(**params)
