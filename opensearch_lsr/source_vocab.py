"""A frequency-truncated copy of a WordPiece source encoder, for fast SemBridge runs on a fresh machine.

SemBridge embeds every source token's surface with the bridge model once (then it is cached). For
SPLADE-tiny that is ~28k strings through multilingual-e5-small: minutes to tens of minutes on a
small CPU. The walk-through notebook and ``lsr-os quickstart`` run on fresh machines (CI, a user's
laptop) where no cache exists, so they may restrict the *candidate* source tokens to the
``keep`` most frequent ones: BERT WordPiece vocabularies list word pieces by decreasing corpus
frequency after the single characters (``the`` = 1996 in ``bert-base-uncased``), so the lowest
ids are the most frequent pieces. Every ASCII single character (and its ``##`` form) is kept
too, so any ASCII text still tokenizes without ``[UNK]``.

The result is an ordinary masked-LM source directory (rows of the input embeddings and MLM bias
selected, the tied decoder follows), usable as ``SemBridgeConfig(source=DIR)``: mixing over a
subset of candidates, exactly as a restricted candidate policy would. The full vocabulary gives
better transfers; this is a size option for demos and CI, not the recommended setting.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ArtifactConfig

__all__ = ["SourceVocabConfig", "select_frequent_ids", "truncate_source_vocabulary"]

logger = logging.getLogger(__name__)

_UNUSED = re.compile(r"^\[unused\d+\]$")


@dataclass
class SourceVocabConfig(ArtifactConfig):
    """How a truncated source was made (saved as ``source_vocab_config.json`` next to it)."""

    FILENAME = "source_vocab_config.json"

    source: str = "splade-tiny"
    keep: int = 3000
    kept: int = 0
    source_vocab_size: int = 0


def select_frequent_ids(vocab: dict[str, int], special_ids: set[int], keep: int) -> list[int]:
    """Ids to keep, in their original order: specials, ASCII single characters (and ``##`` forms),
    then the lowest remaining ids (most frequent pieces) skipping ``[unusedN]`` and other single
    non-ASCII characters, up to ``keep`` ids in all (the first two groups are always kept)."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    chosen: set[int] = set(special_ids)
    for tok, i in vocab.items():
        bare = tok[2:] if tok.startswith("##") else tok
        if len(bare) == 1 and bare.isascii() and bare.isprintable():
            chosen.add(i)
    for tok, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        if len(chosen) >= keep:
            break
        bare = tok[2:] if tok.startswith("##") else tok
        if i in chosen or _UNUSED.match(tok) or (len(bare) == 1 and not bare.isascii()):
            continue
        chosen.add(i)
    return sorted(chosen)


def truncate_source_vocabulary(source: str, keep: int, out_dir: str | os.PathLike) -> Path:
    """Write ``out_dir``: ``source`` restricted to its ``keep`` most frequent WordPiece tokens.

    Reuses a complete ``out_dir`` made with the same ``source`` and ``keep``.

    Raises:
        ValueError: ``keep`` < 1, or the source tokenizer is not WordPiece.
    """
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from .transfer.surgery import load_source_model, mlm_parts, save_sparse_encoder, swap_vocabulary

    out = Path(out_dir)
    cfg_path = out / SourceVocabConfig.FILENAME
    if cfg_path.exists() and (out / "modules.json").exists():
        done = SourceVocabConfig.load(out)
        if done.source == source and done.keep == keep:
            return out
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    model, tok = load_source_model(source)
    spec = json.loads(tok.backend_tokenizer.to_str())
    if spec.get("model", {}).get("type") != "WordPiece":
        raise ValueError(f"source vocabulary truncation needs a WordPiece tokenizer, {source!r} has "
                         f"{spec.get('model', {}).get('type')}")
    vocab: dict[str, int] = spec["model"]["vocab"]
    kept = select_frequent_ids(vocab, set(tok.all_special_ids), keep)
    new_id = {old: new for new, old in enumerate(kept)}
    inv = {i: t for t, i in vocab.items()}
    spec["model"]["vocab"] = {inv[old]: new for old, new in new_id.items()}
    spec["added_tokens"] = [{**t, "id": new_id[t["id"]]} for t in spec.get("added_tokens", []) if t["id"] in new_id]
    post = spec.get("post_processor") or {}
    for entry in (post.get("special_tokens") or {}).values():
        entry["ids"] = [new_id[i] for i in entry["ids"]]
    for key in ("sep", "cls"):  # BertProcessing layout: [token, id]
        if isinstance(post.get(key), list):
            post[key] = [post[key][0], new_id[post[key][1]]]

    staging = out.with_name(out.name + ".tok")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    Tokenizer.from_str(json.dumps(spec)).save(str(staging / "tokenizer.json"))
    tok.save_pretrained(str(staging / "orig"))  # tokenizer_config.json with the same special tokens
    shutil.copy(staging / "orig" / "tokenizer_config.json", staging / "tokenizer_config.json")
    new_tok = AutoTokenizer.from_pretrained(str(staging))
    if len(new_tok) != len(kept):
        raise RuntimeError(f"truncated tokenizer has {len(new_tok)} tokens, expected {len(kept)}")

    parts = mlm_parts(model)
    index = torch.tensor(kept, dtype=torch.long)
    emb = parts.input_embeddings.weight.detach()[index].clone()
    bias = parts.output_bias.detach()[index].clone() if parts.output_bias is not None else None
    untied = None if parts.tied else parts.output_layer.weight.detach()[index].clone()
    swap_vocabulary(model, new_tok, emb, bias, output_embeddings=untied)
    save_sparse_encoder(model, new_tok, out)
    shutil.rmtree(staging, ignore_errors=True)
    SourceVocabConfig(source=source, keep=keep, kept=len(kept), source_vocab_size=len(vocab)).save(out)
    logger.info("source %s truncated to %d of %d tokens -> %s", source, len(kept), len(vocab), out)
    return out
