"""Train a retrieval-friendly target vocabulary from a corpus (VT step 1, section 6.6's domain vocabulary).

Vocabulary Transfer (VT; "Why Advanced Encoders Lag on Sparse Retrieval? ... Bridging Vocabulary
Gaps", SIGIR 2026) replaces an encoder's vocabulary by one that suits sparse retrieval; section 6.6
trains it on the target domain's corpus. This module wraps the Hugging Face ``tokenizers`` trainers
(WordPiece or BPE) and saves a fast tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) that
:func:`opensearch_lsr.transfer.surgery.load_target_tokenizer` and OpenSearch ML Commons load.

Normalisation (the choice matters for Korean): the BERT normaliser with ``lowercase=True`` also strips
accents by decomposing text to Unicode NFD, which splits every precomposed Hangul syllable (U+AC00..)
into conjoining jamo (``집`` -> ``ᄌ ᅵ ᆸ``), so a BERT-uncased vocabulary sees only jamo. We use the BERT
normaliser for control-character cleanup and CJK spacing only (no accent stripping, no lowercasing),
then **NFKC** (composes any decomposed jamo back into syllables and folds compatibility forms such as
full-width Latin letters and digits, which are common in Korean web text), then lowercasing (Hangul
has no case; Latin terms inside Korean text match regardless of case, which is what a sparse index
wants). Accents on Latin letters are kept (``café`` stays ``café``).

Every token keeps a single-id decode equal to its vocabulary string (``##`` continuations included):
OpenSearch uses single-id decode as the sparse-vector key, so the decoder is a WordPiece decoder and
the BPE variant uses the same ``##`` continuation marker.

The same corpus gives the same vocabulary on every run. The ``tokenizers`` trainers (WordPiece trains
with BPE) number each ``##`` continuation of a character in hash-map order, and those numbers break
ties between merges of equal count, so two runs could keep different pieces
(huggingface/tokenizers#1794; the fix, PR #2066, is not released). A first pass with no merges lists
those continuations; the real pass gets them, sorted, as extra special tokens, so they are numbered
before any merge; they are then returned to plain vocabulary entries.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

__all__ = ["TokenizerKind", "SPECIAL_TOKENS", "TOKENIZER_KINDS", "build_normalizer", "train_tokenizer"]

logger = logging.getLogger(__name__)

TokenizerKind = Literal["wordpiece", "bpe"]
TOKENIZER_KINDS: tuple[str, ...] = ("wordpiece", "bpe")
#: BERT special tokens, in BERT's id order ([PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4).
SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CONTINUATION_PREFIX = "##"


def build_normalizer(lowercase: bool = True) -> normalizers.Normalizer:
    """BERT cleanup (no accent stripping) + NFKC (+ lowercase): keeps Hangul syllables composed."""
    steps: list[normalizers.Normalizer] = [
        normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False),
        normalizers.NFKC(),
    ]
    if lowercase:
        steps.append(normalizers.Lowercase())
    return normalizers.Sequence(steps)


def _batched(texts: Iterable[str], size: int = 1000) -> Iterator[list[str]]:
    batch: list[str] = []
    for text in texts:
        if not isinstance(text, str):
            raise ValueError(f"corpus items must be strings, got {type(text).__name__}")
        if text.strip():
            batch.append(text)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _train_pass(texts: Iterable[str], kind: TokenizerKind, lowercase: bool, min_frequency: int, vocab_size: int,
                continuations: Sequence[str]) -> tuple[Tokenizer, int]:
    """One trainer run over ``texts``: the tokenizer (``continuations`` numbered right after the BERT
    specials, plain vocabulary entries again afterwards) and how many non-blank texts it read."""
    if kind == "wordpiece":
        model = models.WordPiece(unk_token="[UNK]", continuing_subword_prefix=CONTINUATION_PREFIX,
                                 max_input_chars_per_word=100)
        trainer_class = trainers.WordPieceTrainer
    else:
        model = models.BPE(unk_token="[UNK]", continuing_subword_prefix=CONTINUATION_PREFIX)
        trainer_class = trainers.BpeTrainer
    trainer = trainer_class(vocab_size=vocab_size, min_frequency=min_frequency,
                            special_tokens=[*SPECIAL_TOKENS, *continuations],
                            continuing_subword_prefix=CONTINUATION_PREFIX, show_progress=False)
    tok = Tokenizer(model)
    tok.normalizer = build_normalizer(lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    n_seen = 0

    def counted() -> Iterator[list[str]]:
        nonlocal n_seen
        for batch in _batched(texts):
            n_seen += len(batch)
            yield batch

    tok.train_from_iterator(counted(), trainer=trainer)
    if continuations:
        saved = json.loads(tok.to_str())
        saved["added_tokens"] = [t for t in saved["added_tokens"] if t["content"] in SPECIAL_TOKENS]
        tok = Tokenizer.from_str(json.dumps(saved))
    return tok, n_seen


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    out_dir: str | os.PathLike,
    kind: TokenizerKind = "wordpiece",
    lowercase: bool = True,
    min_frequency: int = 2,
    model_max_length: int = 512,
):
    """Train a WordPiece or BPE vocabulary on ``texts`` and save it as a fast tokenizer.

    Args:
        texts: the corpus (one passage per item); empty items are skipped. It is read twice (see the
            module docstring): pass a list or another re-iterable (:class:`~opensearch_lsr.corpus.CorpusTexts`
            for a file); a one-shot iterator is first read into a list.
        vocab_size: target vocabulary size, special tokens included (at least 100).
        out_dir: directory that receives ``tokenizer.json`` and ``tokenizer_config.json``.
        kind: ``"wordpiece"`` (BERT-style) or ``"bpe"`` (merges, with ``##`` continuations).
        lowercase: lowercase after NFKC (see the module docstring).
        min_frequency: minimum pair/word frequency for a merge or a vocabulary entry.
        model_max_length: saved as the tokenizer's maximum length (BERT: 512).

    Returns:
        The trained ``transformers`` fast tokenizer, as reloaded from ``out_dir``.

    Raises:
        ValueError: unknown ``kind``, ``vocab_size`` < 100, or an empty corpus.
    """
    from transformers import PreTrainedTokenizerFast

    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"kind must be one of {', '.join(TOKENIZER_KINDS)}, got {kind!r}")
    if not isinstance(vocab_size, int) or vocab_size < 100:
        raise ValueError(f"vocab_size must be an integer >= 100, got {vocab_size!r}")
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")

    if iter(texts) is texts:  # a one-shot iterator: training reads the corpus twice
        texts = list(texts)
    probe, n_texts = _train_pass(texts, kind, lowercase, min_frequency, len(SPECIAL_TOKENS), ())
    if n_texts == 0:
        raise ValueError("the corpus is empty: no non-blank text to train a vocabulary on")
    continuations = sorted(t for t in probe.get_vocab() if t.startswith(CONTINUATION_PREFIX))
    tok, n_texts = _train_pass(texts, kind, lowercase, min_frequency, vocab_size, continuations)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tok.decoder = decoders.WordPiece(prefix=CONTINUATION_PREFIX)
    logger.info("trained %s vocabulary of %d tokens on %d texts", kind, tok.get_vocab_size(), n_texts)
    if tok.get_vocab_size() > vocab_size:
        # The trainers always keep the corpus alphabet (thousands of Hangul syllables, plus their
        # ``##`` forms): a size below that is exceeded rather than mapping syllables to [UNK].
        logger.warning("vocabulary has %d tokens, more than the requested %d: the corpus alphabet alone "
                       "is larger", tok.get_vocab_size(), vocab_size)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
        model_max_length=model_max_length,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    from .surgery import load_target_tokenizer

    return load_target_tokenizer(str(out))
