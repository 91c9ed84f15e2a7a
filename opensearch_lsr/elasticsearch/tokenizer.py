"""Elasticsearch's own BERT tokenizer, re-implemented rule by rule, to check our ids against it.

Elasticsearch does not run the Hugging Face tokenizer: the ML plugin tokenizes in Java from the
uploaded ``vocabulary`` and the ``tokenization.bert`` options, and only the ids reach the
TorchScript model (``docs/elasticsearch-contract.md`` section 2). A model whose tokenizer
disagrees with Elasticsearch's would silently see other ids. :class:`EsBertTokenizer` follows the
Java source (elastic/elasticsearch, ``x-pack/plugin/ml/src/main/java/org/elasticsearch/xpack/ml/
inference/nlp/tokenizers/``):

* ``ControlCharFilter``: drop every UTF-16 unit of category CONTROL..SURROGATE (Cc, Cf, Co, Cs)
  except ``\\n \\r \\t``; a supplementary-plane character is two surrogates, so emoji and CJK
  extension B are dropped entirely;
* ``WordPieceAnalyzer``: Lucene ``WhitespaceTokenizer(512)`` (Java ``Character.isWhitespace``, which
  is false for no-break spaces U+00A0/U+2007/U+202F; words longer than 512 chars are cut);
* ``BasicTokenFilter``: split on punctuation (ASCII 33-47, 58-64, 91-96, 123-126 and categories
  Pd Ps Pe Pc Po Pi Pf) and, when ``tokenize_cjk_chars`` (default true), on CJK ideographs; NFD +
  drop NON_SPACING_MARK when ``do_strip_accents`` (default: ``do_lower_case``); ``[MASK]`` never split;
* ``WordPieceTokenFilter``: greedy longest-match-first with ``##`` continuations, a word of more than
  100 chars or with no match is one ``[UNK]``; lower-casing is a case-insensitive vocabulary map
  (``CharArrayMap(ignoreCase=do_lower_case)``), not a rewrite of the text;
* ``BertTokenizer`` / ``BertTokenizationResult``: ``[CLS]`` + ids + ``[SEP]``, truncation ``first``
  to ``max_sequence_length`` (special tokens included).

Why hand-written: the rules live only in Elasticsearch's Java code; the Hugging Face tokenizer
differs exactly where this module exists to find out (control/astral characters, no-break spaces,
over-long words, literal special tokens).
"""
from __future__ import annotations

import dataclasses
import unicodedata
from collections.abc import Sequence
from typing import Any, Literal

__all__ = [
    "EsBertTokenizer",
    "TokenizationComparison",
    "compare_tokenizers",
    "java_is_whitespace",
    "is_punctuation_mark",
    "is_cjk_char",
]

Truncate = Literal["first", "none"]
_WHITESPACE_MAX_TOKEN = 512  # WordPieceAnalyzer.createTokenizer: new WhitespaceTokenizer(512)
_MAX_INPUT_CHARS_PER_WORD = 100  # WordPieceAnalyzer: WordPieceTokenFilter.build(..., 100, ...)
_CJK_BLOCKS = (  # BasicTokenFilter.isCjkChar: the Unicode blocks it names
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)
_PUNCT_CATEGORIES = {"Pd", "Ps", "Pe", "Pc", "Po", "Pi", "Pf"}  # DASH..OTHER_PUNCTUATION, INITIAL/FINAL_QUOTE


def java_is_whitespace(ch: str) -> bool:
    """Java ``Character.isWhitespace``: Zs/Zl/Zp except no-break spaces, plus ``\\t\\n\\u000B\\f\\r`` and U+001C-U+001F."""
    cp = ord(ch)
    if cp in (0x09, 0x0A, 0x0B, 0x0C, 0x0D) or 0x1C <= cp <= 0x1F:
        return True
    if cp in (0x00A0, 0x2007, 0x202F):
        return False
    return unicodedata.category(ch) in ("Zs", "Zl", "Zp")


def is_punctuation_mark(ch: str) -> bool:
    """``BasicTokenFilter.isPunctuationMark``."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch) in _PUNCT_CATEGORIES


def is_cjk_char(ch: str) -> bool:
    """``BasicTokenFilter.isCjkChar`` (CJK Unified Ideographs A-E, compatibility ideographs)."""
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_BLOCKS)


def _is_control_unit(ch: str) -> bool:
    """``ControlCharFilter.isControlChar`` on one UTF-16 unit (astral characters are surrogates)."""
    if ch in "\n\r\t":
        return False
    if ord(ch) > 0xFFFF:
        return True  # both halves are SURROGATE
    return unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cs")


def _java_lower(text: str) -> str:
    """``Character.toLowerCase`` per code point (CharArrayMap ignoreCase): never changes the length."""
    out = []
    for ch in text:
        low = ch.lower()
        out.append(low if len(low) == 1 else ch)
    return "".join(out)


@dataclasses.dataclass
class EsBertTokenizer:
    """Elasticsearch's ``bert`` tokenization of one input (ids only, no offsets).

    Args:
        vocabulary: the list uploaded with ``PUT _ml/trained_models/<id>/vocabulary`` (id = index).
        do_lower_case: ``tokenization.bert.do_lower_case`` (Elasticsearch's default is false).
        do_strip_accents: ``None`` means "same as ``do_lower_case``" (``BertTokenizer.Builder.build``).
        tokenize_cjk_chars: ``BertTokenizer.Builder.doTokenizeCjKChars`` (always true from config).
        with_special_tokens: add ``[CLS]``/``[SEP]`` (default true).
        max_sequence_length: truncation limit including special tokens (default 512).
        truncate: ``first`` (default) cuts the sequence, ``none`` raises when it is too long.
    """

    vocabulary: Sequence[str]
    do_lower_case: bool = False
    do_strip_accents: bool | None = None
    tokenize_cjk_chars: bool = True
    with_special_tokens: bool = True
    max_sequence_length: int = 512
    truncate: Truncate = "first"

    def __post_init__(self) -> None:
        if self.truncate not in ("first", "none"):
            raise ValueError(f"truncate must be one of first, none, got {self.truncate!r}")
        self._vocab: dict[str, int] = {}
        for i, word in enumerate(self.vocabulary):
            key = _java_lower(word) if self.do_lower_case else word
            self._vocab[key] = i  # CharArrayMap.put: a later duplicate overwrites
        for required in ("[UNK]", "[PAD]") + (("[CLS]", "[SEP]") if self.with_special_tokens else ()):
            if self._lookup(required) is None:
                raise ValueError(f"stored vocabulary is missing required [{required}] token")
        self.unk_id = self._lookup("[UNK]")
        self.pad_id = self._lookup("[PAD]")
        self.cls_id = self._lookup("[CLS]") if self.with_special_tokens else None
        self.sep_id = self._lookup("[SEP]") if self.with_special_tokens else None
        self._never_split = {"[MASK]"}
        self._strip = self.do_lower_case if self.do_strip_accents is None else self.do_strip_accents

    @classmethod
    def from_config(cls, vocabulary: Sequence[str], inference_config: dict[str, Any]) -> "EsBertTokenizer":
        """Build from a trained model's ``inference_config`` (``{"text_expansion": {"tokenization": {"bert": {...}}}}``)."""
        task = next(iter(inference_config.values()))
        tok = task.get("tokenization", {})
        if "bert" not in tok:
            raise ValueError(f"only bert tokenization is re-implemented, got {sorted(tok)}")
        bert = tok["bert"]
        return cls(vocabulary, do_lower_case=bool(bert.get("do_lower_case", False)),
                   do_strip_accents=bert.get("do_strip_accents"),
                   with_special_tokens=bool(bert.get("with_special_tokens", True)),
                   max_sequence_length=int(bert.get("max_sequence_length", 512)),
                   truncate=bert.get("truncate", "first"))

    def _lookup(self, piece: str) -> int | None:
        return self._vocab.get(_java_lower(piece) if self.do_lower_case else piece)

    # -- the analysis chain ----------------------------------------------------------------
    @staticmethod
    def control_char_filter(text: str) -> str:
        return "".join(ch for ch in text if not _is_control_unit(ch))

    @staticmethod
    def whitespace_tokens(text: str) -> list[str]:
        """Lucene ``WhitespaceTokenizer(512)``: runs of non-whitespace, each cut every 512 chars."""
        out: list[str] = []
        current: list[str] = []
        for ch in text:
            if java_is_whitespace(ch):
                if current:
                    out.append("".join(current))
                    current = []
                continue
            current.append(ch)
            if len(current) == _WHITESPACE_MAX_TOKEN:
                out.append("".join(current))
                current = []
        if current:
            out.append("".join(current))
        return out

    def _strip_accents(self, token: str) -> str:
        decomposed = unicodedata.normalize("NFD", token)
        return "".join(ch for ch in decomposed if unicodedata.category(ch) != "Mn")

    def basic_tokens(self, word: str) -> list[str]:
        """``BasicTokenFilter`` on one whitespace token: punctuation/CJK splits, accent stripping."""
        if word in self._never_split:
            return [word]
        pieces: list[str] = []
        start = 0
        for i, ch in enumerate(word):
            if (self.tokenize_cjk_chars and is_cjk_char(ch)) or is_punctuation_mark(ch):
                if i > start:
                    pieces.append(word[start:i])
                pieces.append(ch)
                start = i + 1
        if start < len(word):
            pieces.append(word[start:])
        pieces = self._merge_never_split(pieces)
        if self._strip:
            pieces = [p for p in (self._strip_accents(p) for p in pieces) if p]
        return pieces

    def _merge_never_split(self, pieces: list[str]) -> list[str]:
        """``mergeSplits``: re-join ``[``, ``MASK``, ``]`` into ``[MASK]``."""
        out: list[str] = []
        i = 0
        while i < len(pieces):
            if pieces[i] == "[" and i + 2 < len(pieces) and pieces[i + 2] == "]" \
                    and "[" + pieces[i + 1] + "]" in self._never_split:
                out.append("[" + pieces[i + 1] + "]")
                i += 3
            else:
                out.append(pieces[i])
                i += 1
        return out

    def wordpiece(self, token: str) -> list[int]:
        """``WordPieceTokenFilter``: longest-match-first; no match or > 100 chars -> ``[UNK]``."""
        if token in self._never_split:
            found = self._lookup(token)
            return [found if found is not None else self.unk_id]
        if len(token) > _MAX_INPUT_CHARS_PER_WORD:
            return [self.unk_id]
        ids: list[int] = []
        start = 0
        while start < len(token):
            end = len(token)
            match = None
            while start < end:
                piece = token[start:end] if start == 0 else "##" + token[start:end]
                match = self._lookup(piece)
                if match is not None:
                    break
                end -= 1
            if match is None:
                return [self.unk_id]
            ids.append(match)
            start = end
        return ids

    def tokenize(self, text: str) -> list[int]:
        """Word-piece ids of ``text`` without special tokens or truncation."""
        ids: list[int] = []
        for word in self.whitespace_tokens(self.control_char_filter(text)):
            for piece in self.basic_tokens(word):
                ids.extend(self.wordpiece(piece))
        return ids

    def encode(self, text: str) -> list[int]:
        """What Elasticsearch sends the model as ``tokens``: ``[CLS] ids [SEP]``, truncated ``first``."""
        ids = self.tokenize(text)
        room = self.max_sequence_length - (2 if self.with_special_tokens else 0)
        if len(ids) > room:
            if self.truncate == "none":
                raise ValueError(f"Input too large. The tokenized input length [{len(ids)}] exceeds the maximum "
                                 f"sequence length [{self.max_sequence_length}]")
            ids = ids[:room]
        if self.with_special_tokens:
            ids = [self.cls_id, *ids, self.sep_id]  # type: ignore[list-item]
        return ids

    def request(self, texts: Sequence[str]) -> dict[str, list[list[int]]]:
        """The ``pytorch_inference`` request: padded ``tokens``, ``arg_1`` mask, ``arg_2`` types, ``arg_3`` positions."""
        seqs = [self.encode(t) for t in texts]
        width = max((len(s) for s in seqs), default=0)
        return {
            "tokens": [s + [self.pad_id] * (width - len(s)) for s in seqs],  # type: ignore[list-item]
            "arg_1": [[1] * len(s) + [0] * (width - len(s)) for s in seqs],
            "arg_2": [[0] * width for _ in seqs],
            "arg_3": [list(range(width)) for _ in seqs],
        }


@dataclasses.dataclass
class TokenizationComparison:
    """Where Elasticsearch's ids differ from ours, per text."""

    texts: int
    identical: int
    differences: list[dict[str, Any]]

    @property
    def all_identical(self) -> bool:
        return self.identical == self.texts

    def to_dict(self) -> dict[str, Any]:
        return {"texts": self.texts, "identical": self.identical, "differences": self.differences[:20]}


def compare_tokenizers(es: EsBertTokenizer, hf_tokenizer: Any, texts: Sequence[str],
                       max_length: int | None = None) -> TokenizationComparison:
    """Encode ``texts`` with Elasticsearch's rules and with ours (a ``tokenizers.Tokenizer``) and diff the ids.

    Args:
        es: the Elasticsearch tokenizer built from the exported vocabulary and config.
        hf_tokenizer: our ``tokenizers.Tokenizer`` (the one the encoder and the OpenSearch export use).
        texts: texts to compare (Korean corpus passages in the conformance check).
        max_length: our truncation (defaults to ``es.max_sequence_length``).
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(hf_tokenizer.to_str())
    tok.no_padding()
    tok.enable_truncation(max_length or es.max_sequence_length)
    identical = 0
    diffs: list[dict[str, Any]] = []
    for text in texts:
        ours = tok.encode(text, add_special_tokens=es.with_special_tokens).ids
        theirs = es.encode(text)
        if ours == theirs:
            identical += 1
            continue
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        diffs.append({"text": text[:120], "first_difference_at": first,
                      "ours": [tok.id_to_token(i) for i in ours[max(0, first - 2):first + 3]],
                      "elasticsearch": [es.vocabulary[i] for i in theirs[max(0, first - 2):first + 3]]})
    return TokenizationComparison(len(texts), identical, diffs)
