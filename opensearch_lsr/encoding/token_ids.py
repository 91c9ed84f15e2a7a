"""Tokenize once: the Rust tokenizer's batch encode, then DJL's single-sequence truncation applied to ids.

The reference path tokenized every chunk twice (untruncated, for the 512-token policy, then truncated).
:class:`OnceTokenizer` runs ``tokenizers.Tokenizer.encode_batch`` once without special tokens or
truncation (Rust, parallel across cores, GIL released), then truncates the ids and adds the single-sequence
template's special tokens itself. That is what the truncating call does: the Rust tokenizer truncates the
sequence to ``max_length - added_tokens(single)`` on the ``truncation_side`` before the post-processor adds
the template (``tokenizers`` ``TruncationParams`` / ``PostProcessor::process``; DJL's
``HuggingFaceTokenizer`` sets ``truncation`` the same way, contract section 2.1). The untruncated count
(``ids + specials``) comes for free.

Output is flat: one ``int64`` array of every document's ids and the per-document lengths, the layout the
packed encoder (:mod:`.packed`) consumes without a Python loop per token.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..contract import rust_tokenizer
from .word_cache import DEFAULT_MAX_WORDS, MIN_IDS_PER_CHUNK, PROBE_CHUNKS, WordIdsCache, splits_at_spaces

__all__ = ["TokenizedTexts", "OnceTokenizer", "concat_tokenized"]


class TokenizedTexts(NamedTuple):
    """Token ids of several texts, flat.

    Attributes:
        ids: every text's ids (special tokens included, truncated), concatenated; int64.
        lengths: ids per text (after truncation); int64.
        full_lengths: ids per text without truncation (special tokens included); int64.
    """

    ids: np.ndarray
    lengths: np.ndarray
    full_lengths: np.ndarray

    @property
    def offsets(self) -> np.ndarray:
        """Start of each text's ids in :attr:`ids` (``n + 1`` entries, the last one the total)."""
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)

    def as_lists(self) -> list[list[int]]:
        """The ids per text as Python lists (what ``tokenizer(texts, truncation=True)`` returns)."""
        off = self.offsets
        flat = self.ids.tolist()
        return [flat[off[i]:off[i + 1]] for i in range(len(self.lengths))]

    def select(self, index: np.ndarray) -> TokenizedTexts:
        """The texts at ``index`` (in that order), flat again."""
        off = self.offsets
        lens = self.lengths[index]
        starts = off[:-1][index]
        gather = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens) \
            + np.repeat(starts, lens)
        return TokenizedTexts(self.ids[gather], lens, self.full_lengths[index])


def concat_tokenized(parts: Sequence[TokenizedTexts]) -> TokenizedTexts:
    """Several tokenized lists as one (texts in the order given)."""
    if len(parts) == 1:
        return parts[0]
    return TokenizedTexts(np.concatenate([p.ids for p in parts]), np.concatenate([p.lengths for p in parts]),
                          np.concatenate([p.full_lengths for p in parts]))


def _template(tok: Any) -> tuple[list[int], list[int]]:
    """The single-sequence template's special ids before and after the text (``[CLS]`` / ``[SEP]`` ...)."""
    probe = tok.encode("a b", add_special_tokens=False)
    full = tok.post_process(probe, None, True).ids
    body = probe.ids
    for k in range(len(full) - len(body) + 1):
        if full[k:k + len(body)] == body:
            return list(full[:k]), list(full[k + len(body):])
    raise ValueError("cannot locate the text inside the tokenizer's single-sequence template")


class OnceTokenizer:
    """Token ids with special tokens, truncated at ``max_length`` exactly as ``tokenizer(texts,
    truncation=True, max_length=max_length)`` does, from one untruncated Rust ``encode_batch``.

    Args:
        tokenizer: a fast Hugging Face tokenizer, a ``tokenizers.Tokenizer`` or a path (as
            :func:`opensearch_lsr.contract.rust_tokenizer` takes).
        max_length: the cap, special tokens included.
        truncation_side: ``"right"`` (DJL, the default of every BERT-family tokenizer) or ``"left"``.
        word_cache: the most space-separated chunks whose ids are remembered (:mod:`.word_cache`; the same ids,
            fewer Rust calls), for tokenizers that allow it; 0 tokenizes every text in full.
        min_ids_per_chunk: the cache is used once the first texts (:data:`~.word_cache.PROBE_CHUNKS` chunks,
            tokenized in full) average at least this many ids per chunk; 0 uses it from the first call. It is
            dropped if too few chunks repeat (:attr:`.word_cache.WordIdsCache.pays`).
    """

    def __init__(self, tokenizer: Any, max_length: int, truncation_side: str = "right",
                 word_cache: int = DEFAULT_MAX_WORDS, min_ids_per_chunk: float = MIN_IDS_PER_CHUNK) -> None:
        from tokenizers import Tokenizer

        if truncation_side not in ("right", "left"):
            raise ValueError(f"truncation_side {truncation_side!r} is not 'right' or 'left'")
        self._tok = Tokenizer.from_str(rust_tokenizer(tokenizer).to_str())
        self._tok.no_truncation()
        self._tok.no_padding()
        self.prefix, self.suffix = _template(self._tok)
        self.max_length = int(max_length)
        self.budget = self.max_length - len(self.prefix) - len(self.suffix)
        if self.budget < 1:
            raise ValueError(f"max_length {max_length} leaves no room for tokens")
        self.truncation_side = truncation_side
        self._encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        self.word_cache = WordIdsCache(word_cache) if word_cache > 0 and splits_at_spaces(self._tok) else None
        self.min_ids_per_chunk = float(min_ids_per_chunk)
        #: ``[ids, chunks]`` of the texts tokenized in full while the cache's use is undecided (None: decided)
        self.probe: list[int] | None = [0, 0] if self.word_cache is not None and min_ids_per_chunk > 0 else None

    def __call__(self, texts: Sequence[str]) -> TokenizedTexts:
        if isinstance(texts, str):
            raise TypeError("expected a list of texts, not a single string")
        cache = self.word_cache
        if cache is not None and self.probe is None:
            out = self._finish(*cache(texts, self._tok))
            if not cache.pays:
                self.word_cache = None
            return out
        raw, raw_lens = self.rust_ids(texts)
        if self.probe is not None:
            self._decide(int(raw_lens.sum()), sum(t.count(" ") + 1 for t in texts))
        return self._finish(raw, raw_lens)

    def rust_ids(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Every text's ids from the Rust tokenizer (no cache, no special tokens, untruncated; flat) and their
        counts."""
        encs = self._encode(list(texts), add_special_tokens=False)
        raw_lens = np.fromiter((len(e.ids) for e in encs), dtype=np.int64, count=len(encs))
        raw = np.fromiter((i for e in encs for i in e.ids), dtype=np.int64, count=int(raw_lens.sum()))
        return raw, raw_lens

    def _decide(self, ids: int, chunks: int) -> None:
        """Count a call into the probe; once it holds enough chunks, keep the cache or drop it. (Calls may come
        from two threads, the job's and the pipeline's: a count lost between them only delays the decision.)"""
        probe = self.probe
        if probe is None:
            return
        probe[0] += ids
        probe[1] += chunks
        if probe[1] >= PROBE_CHUNKS:
            if probe[0] < self.min_ids_per_chunk * probe[1]:
                self.word_cache = None
            self.probe = None

    def _finish(self, raw: np.ndarray, raw_lens: np.ndarray) -> TokenizedTexts:
        """Truncate each text's ids to the budget and wrap them in the template, all vectorised."""
        n_pre, n_suf = len(self.prefix), len(self.suffix)
        keep = np.minimum(raw_lens, self.budget)
        lens = keep + n_pre + n_suf
        out = np.empty(int(lens.sum()), dtype=np.int64)
        out_start = np.cumsum(lens) - lens
        for k, tid in enumerate(self.prefix):
            out[out_start + k] = tid
        for k, tid in enumerate(self.suffix):
            out[out_start + n_pre + keep + k] = tid
        raw_start = np.cumsum(raw_lens) - raw_lens
        if self.truncation_side == "left":
            raw_start = raw_start + raw_lens - keep
        within = np.arange(int(keep.sum()), dtype=np.int64) - np.repeat(np.cumsum(keep) - keep, keep)
        out[np.repeat(out_start + n_pre, keep) + within] = raw[np.repeat(raw_start, keep) + within]
        return TokenizedTexts(out, lens, raw_lens + n_pre + n_suf)
