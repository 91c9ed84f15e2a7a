"""Token ids memoised per space-separated chunk, for tokenizers whose ids never cross a space.

With a BERT-style Rust tokenizer (``BertNormalizer`` or other per-character normalizers, a pre-tokenizer that
splits on whitespace and drops it, added tokens without a space in them) a text's ids are the ids of its
``" "``-separated chunks, concatenated: the normalizers map characters one by one (canonical reordering and
composition never cross a space, a starter), the pre-tokenizer always splits at a space and the model sees
one pre-token at a time. So every distinct chunk (a Korean eojeol, a word and its punctuation) needs
tokenizing once; later texts are a dictionary lookup and a vectorised gather.

Why by hand: the ``tokenizers`` WordPiece model keeps no cache (its BPE and Unigram models do, per pre-token,
after normalizing and pre-tokenizing every text with offsets), and no library memoises whole chunks. On the
Korean corpus a chunk repeats often (7,279 passages: 303k chunks, 89k distinct) and SPLADE-tiny's uncased BERT
normalizer turns each Hangul syllable into jamo, 243 tokens per passage, so the Rust tokenizer, not the GPU,
set SPLADE-tiny's pace (``benchmarks/results/gpu_encode.md``). Other tokenizers (SentencePiece ``Metaspace``,
byte-level BPE) keep the space inside tokens and are not eligible: :func:`splits_at_spaces` says which.
"""
from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["WordIdsCache", "splits_at_spaces", "DEFAULT_MAX_WORDS", "MIN_IDS_PER_CHUNK", "PROBE_CHUNKS",
           "MIN_HIT_SHARE", "HIT_SHARE_AFTER"]

#: distinct chunks remembered per tokenizer (per process): 200-250 bytes each with their ids on the Korean corpus,
#: so at most about 250 MB. Chunks first seen after the cache is full are tokenized every time (by Zipf's law the
#: frequent ones came early).
DEFAULT_MAX_WORDS = 1_000_000

#: the cache is used once a tokenizer's first :data:`PROBE_CHUNKS` chunks average at least this many ids. On the
#: Korean corpus the shared kobigbird vocabulary gives 2.2 ids per chunk and gains little or nothing while the
#: cache fills (0.8-1.2x with one or two Rust threads), SPLADE-tiny's uncased English one 5.8 (1.2-1.6x); a replayed
#: corpus gains 2.5-9x with either (``benchmarks/results/word_cache.md``, ``word_cache_threads2.md``).
MIN_IDS_PER_CHUNK = 4.0
PROBE_CHUNKS = 20_000
#: a cache whose hit share is still under :data:`MIN_HIT_SHARE` after :data:`HIT_SHARE_AFTER` lookups is dropped
#: (chunks that rarely repeat, such as identifiers: each miss costs more than tokenizing its text whole). The
#: Korean corpus is at 0.705 after its 303,125 chunks, where SPLADE-tiny gains 1.2-1.6x.
MIN_HIT_SHARE = 0.5
HIT_SHARE_AFTER = 200_000

# normalizers that map characters one by one (no pattern replacement, no stripping, no prepending)
_CHAR_NORMALIZERS = {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents"}
# pre-tokenizers that only split; at least one of the first three must be present to drop the space
_SPACE_DROPPING = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}
_SPLITTING = _SPACE_DROPPING | {"Punctuation", "Digits", "UnicodeScripts"}


def _types(node: dict | None) -> list[str] | None:
    """The component types of a normalizer / pre-tokenizer node (a ``Sequence`` flattened), ``[]`` for none."""
    if node is None:
        return []
    if node.get("type") == "Sequence":
        parts = node.get("normalizers", node.get("pretokenizers"))
        if parts is None:
            return None
        out: list[str] = []
        for part in parts:
            sub = _types(part)
            if sub is None:
                return None
            out += sub
        return out
    return [node.get("type", "")]


def splits_at_spaces(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` (a ``tokenizers.Tokenizer``) gives every text the concatenated ids of its
    ``" "``-separated chunks, judged from its serialised pipeline (see the module docstring)."""
    spec = json.loads(tokenizer.to_str())
    normalizers = _types(spec.get("normalizer"))
    pre = _types(spec.get("pre_tokenizer"))
    if normalizers is None or pre is None:
        return False
    if not set(normalizers) <= _CHAR_NORMALIZERS or not set(pre) <= _SPLITTING or not set(pre) & _SPACE_DROPPING:
        return False
    return not any(" " in t.get("content", "") for t in spec.get("added_tokens", []))


def chunk_ids(tokenizer: Any, chunks: list[str], group: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Ids of space-free ``chunks`` (flat, int64) and how many each, from a tokenizer that
    :func:`splits_at_spaces`: ``group`` chunks are joined by spaces and tokenized as one text, each token going to
    the chunk its start offset falls in (one Rust encoding per chunk costs about twice as much)."""
    groups = [chunks[at:at + group] for at in range(0, len(chunks), group)]
    encodings = tokenizer.encode_batch([" ".join(g) for g in groups], add_special_tokens=False)
    ids_parts, len_parts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for part, enc in zip(groups, encodings):
        sizes = np.fromiter(map(len, part), np.int64, count=len(part))
        starts = np.cumsum(sizes + 1) - sizes - 1  # where each chunk begins in the joined text
        begin = np.fromiter((o[0] for o in enc.offsets), np.int64, count=len(enc.ids))
        owner = np.searchsorted(starts, begin, side="right") - 1
        ids_parts.append(np.asarray(enc.ids, np.int64))
        len_parts.append(np.bincount(owner, minlength=len(part)).astype(np.int64))
    return np.concatenate(ids_parts), np.concatenate(len_parts)


class WordIdsCache:
    """Untruncated ids of texts, without special tokens, from ids memoised per space-separated chunk.

    Args:
        max_words: the most chunks remembered (:data:`DEFAULT_MAX_WORDS`).

    ``cache(texts, tokenizer)``, with ``tokenizer`` a ``tokenizers.Tokenizer`` that :func:`splits_at_spaces`,
    returns ``(ids, lengths)``: every text's ids without special tokens or truncation, concatenated (int64), and
    the ids per text. Thread-safe.
    """

    def __init__(self, max_words: int = DEFAULT_MAX_WORDS) -> None:
        if max_words < 1:
            raise ValueError(f"max_words must be >= 1, got {max_words}")
        self.max_words = int(max_words)
        self.lookups = 0  # chunks looked up
        self.tokenized = 0  # distinct chunks handed to the tokenizer
        self._index: dict[str, int] = {}
        self._start = np.zeros(1024, np.int64)  # per remembered chunk: where its ids begin in _ids
        self._len = np.zeros(1024, np.int64)
        self._ids = np.zeros(1 << 16, np.int64)
        self._used = 0  # entries of _ids in use
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._index)

    @property
    def hit_share(self) -> float:
        """Share of chunk lookups that needed no tokenizing."""
        return 1.0 - self.tokenized / self.lookups if self.lookups else 0.0

    @property
    def pays(self) -> bool:
        """False once :data:`HIT_SHARE_AFTER` lookups left the hit share under :data:`MIN_HIT_SHARE`."""
        return self.lookups < HIT_SHARE_AFTER or self.hit_share >= MIN_HIT_SHARE

    def _append(self, words: list[str], ids: np.ndarray, lens: np.ndarray) -> None:
        """Add ``words`` (their ``ids`` flat, ``lens`` each) after the remembered ones, growing the arrays."""
        first = len(self._index)
        n = first + len(words)
        total = self._used + int(lens.sum())
        if n > len(self._start):
            size = max(n, 2 * len(self._start))
            self._start = np.resize(self._start, size)
            self._len = np.resize(self._len, size)
        if total > len(self._ids):
            self._ids = np.resize(self._ids, max(total, 2 * len(self._ids)))
        self._ids[self._used:total] = ids
        self._start[first:n] = self._used + np.cumsum(lens) - lens
        self._len[first:n] = lens
        self._used = total
        self._index.update(zip(words, range(first, n)))

    def _forget(self, words: list[str]) -> None:
        """Drop ``words``, the last ones added (those past :attr:`max_words`)."""
        for word in words:
            del self._index[word]
        keep = len(self._index)
        self._used = int(self._start[keep - 1] + self._len[keep - 1]) if keep else 0

    def __call__(self, texts: Sequence[str], tokenizer: Any) -> tuple[np.ndarray, np.ndarray]:
        try:
            chunks = [t.split(" ") for t in texts]  # at least one chunk per text ("" -> [""])
        except (AttributeError, TypeError) as err:  # what the Rust tokenizer raises for a text that is not one
            bad = next(t for t in texts if not isinstance(t, str))
            raise TypeError(f"texts must be str, got {type(bad).__name__}") from err
        per_text = np.fromiter(map(len, chunks), np.int64, count=len(chunks))
        flat = list(itertools.chain.from_iterable(chunks))
        with self._lock:
            word = np.fromiter(map(self._index.get, flat, itertools.repeat(-1)), np.int64, count=len(flat))
            unknown = np.flatnonzero(word < 0)
            missing = list(dict.fromkeys(flat[k] for k in unknown.tolist()))
            self.lookups += len(flat)
            self.tokenized += len(missing)
            first = len(self._index)
            if missing:
                self._append(missing, *chunk_ids(tokenizer, missing))
                word[unknown] = np.fromiter(map(self._index.__getitem__, (flat[k] for k in unknown.tolist())),
                                            np.int64, count=len(unknown))
            lens = self._len[word]
            starts = self._start[word]
            within = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
            ids = self._ids[np.repeat(starts, lens) + within]
            if first + len(missing) > self.max_words:
                self._forget(missing[max(0, self.max_words - first):])
        text_lens = np.add.reduceat(lens, np.cumsum(per_text) - per_text) if len(texts) else np.zeros(0, np.int64)
        return ids, text_lens.astype(np.int64)
