"""Token-state cache of a frozen MILCO encoder (Nguyen et al. 2025, arXiv 2510.00671).

MILCO trained with a frozen multilingual encoder (SAP ``--train connector``, ``lsr-os train --freeze-encoder
all``) only moves the connector + LexEcho head, yet every step and every evaluation re-ran the 12 encoder
layers on CPU. This module computes the encoder's last hidden states ``H`` once per text and keeps them on
disk, so training and evaluation run the head alone.

**Key**: ``sha1(encoder fingerprint, token ids)``. The fingerprint hashes the encoder's class, its config and
every weight tensor (so two MILCO directories that saved the same frozen encoder share one cache); the token
ids are the text tokenized *with truncation at the requested ``max_seq_length``* (so the key covers the text
and the length, and a query shorter than both lengths is one entry for all of them).

**Layout** (``<root>/<fingerprint[:16]>/``): append-only chunks, each written atomically when complete (a
killed fill loses at most one chunk and resumes): ``NNNNNN.states.npy`` (float16 ``[tokens, hidden]``, read
through ``np.load(mmap_mode="r")``), ``NNNNNN.meta.npz`` (``keys`` ``[n, 20]`` uint8, ``offsets`` ``[n + 1]``,
``ids`` int32 ``[tokens]``). fp16 storage: the cached forward matches the live one to ~1e-3.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..errors import LsrError
from ..resources import cache_dir

__all__ = ["TokenStateCache", "StateCacheMiss", "encoder_fingerprint", "default_state_cache_root", "STATE_CACHE_DIR"]

logger = logging.getLogger(__name__)

STATE_CACHE_DIR = "milco_states"
KEY_BYTES = 20
FINGERPRINT_CONFIG_KEYS: tuple[str, ...] = (
    "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "layer_norm_eps", "max_position_embeddings", "position_embedding_type", "type_vocab_size", "vocab_size",
    "pad_token_id")


class StateCacheMiss(LsrError, KeyError):
    """Texts asked for that the cache does not hold (and no encoder was given to compute them)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "state cache miss"


def default_state_cache_root() -> Path:
    """``$LSR_CACHE/milco_states`` (the toolkit cache, :func:`opensearch_lsr.resources.cache_dir`)."""
    return cache_dir() / STATE_CACHE_DIR


def _auto_model(transformer: Any) -> torch.nn.Module:
    model = getattr(transformer, "auto_model", None)
    return model if model is not None else transformer.model


def encoder_fingerprint(transformer: Any) -> str:
    """sha1 over the encoder's class, config and weights (names, dtypes, shapes, bytes; the unused pooler
    left out)."""
    model = _auto_model(transformer)
    h = hashlib.sha1(type(model).__name__.encode())
    config = getattr(model, "config", None)
    if config is not None:  # the fields that shape the forward (not paths or versions: saved copies must match)
        h.update(json.dumps({k: getattr(config, k, None) for k in FINGERPRINT_CONFIG_KEYS}, sort_keys=True,
                            default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        if name.startswith("pooler."):  # not on the token-state path (and randomly re-initialised on load)
            continue
        h.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _text_keys(fingerprint: str, ids: Sequence[Sequence[int]]) -> list[bytes]:
    prefix = fingerprint.encode()
    return [hashlib.sha1(prefix + np.asarray(row, dtype=np.int32).tobytes()).digest() for row in ids]


class TokenStateCache:
    """The frozen encoder's token states for a set of texts, on disk.

    Args:
        transformer: the sentence-transformers ``Transformer`` module of a MILCO model (its tokenizer and, for
            :meth:`fill`, its encoder); only its weights' fingerprint is kept if ``fingerprint`` is given.
        root: cache root (default :func:`default_state_cache_root`).
        fingerprint: a precomputed :func:`encoder_fingerprint` (skips hashing the weights again).
    """

    def __init__(self, transformer: Any, root: str | os.PathLike | None = None, fingerprint: str | None = None) -> None:
        self.transformer = transformer
        self.tokenizer = transformer.tokenizer
        self.fingerprint = fingerprint or encoder_fingerprint(transformer)
        self.dir = Path(root) if root is not None else default_state_cache_root()
        self.dir = self.dir / self.fingerprint[:16]
        self.dir.mkdir(parents=True, exist_ok=True)
        self._index: dict[bytes, tuple[int, int]] = {}
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (states mmap, offsets, ids)
        self.reload()

    # ------------------------------------------------------------------ index

    def reload(self) -> None:
        """Re-read the chunk files (another process may have added some)."""
        self._index.clear()
        self._chunks.clear()
        for meta_path in sorted(self.dir.glob("*.meta.npz")):
            stem = meta_path.name[: -len(".meta.npz")]
            states_path = self.dir / f"{stem}.states.npy"
            if not states_path.is_file():
                continue
            with np.load(meta_path) as meta:
                keys, offsets, ids = meta["keys"], meta["offsets"], meta["ids"]
            chunk = len(self._chunks)
            self._chunks.append((np.load(states_path, mmap_mode="r"), offsets, ids))
            for row, key in enumerate(keys):
                self._index[key.tobytes()] = (chunk, row)

    def __len__(self) -> int:
        return len(self._index)

    def token_ids(self, texts: Sequence[str], max_seq_length: int) -> list[list[int]]:
        """The ids the encoder reads for each text (special tokens added, truncated at ``max_seq_length``)."""
        enc = self.tokenizer(list(texts), truncation=True, max_length=int(max_seq_length), padding=False,
                             return_token_type_ids=False, return_attention_mask=False)
        return [list(row) for row in enc["input_ids"]]

    def keys(self, ids: Sequence[Sequence[int]]) -> list[bytes]:
        return _text_keys(self.fingerprint, ids)

    def has(self, key: bytes) -> bool:
        return key in self._index

    def missing(self, texts: Sequence[str], max_seq_length: int) -> list[str]:
        """The texts (deduplicated, in order) whose states at ``max_seq_length`` are not cached."""
        ids = self.token_ids(texts, max_seq_length)
        seen: set[bytes] = set()
        out = []
        for text, key in zip(texts, self.keys(ids)):
            if key not in self._index and key not in seen:
                seen.add(key)
                out.append(text)
        return out

    def rows(self, keys: Sequence[bytes]) -> list[np.ndarray]:
        """The cached float16 states ``[length, hidden]`` of each key (``StateCacheMiss`` if one is absent)."""
        out = []
        for key in keys:
            where = self._index.get(key)
            if where is None:
                raise StateCacheMiss(f"no cached encoder states for a text (key {key.hex()[:12]}) in {self.dir}: "
                                     "fill the cache first (TokenStateCache.fill) or train with --no-state-cache")
            states, offsets, _ = self._chunks[where[0]]
            out.append(states[offsets[where[1]]:offsets[where[1] + 1]])
        return out

    def states(self, texts: Sequence[str], max_seq_length: int) -> list[np.ndarray]:
        """float16 states ``[length, hidden]`` per text (lookup by text; ``StateCacheMiss`` when absent)."""
        ids = self.token_ids(texts, max_seq_length)
        return self.rows(self.keys(ids))

    # ------------------------------------------------------------------ compute

    def _next_chunk(self) -> int:
        taken = [int(p.name.split(".")[0]) for p in self.dir.glob("*.meta.npz")]
        return max(taken, default=-1) + 1

    def _write_chunk(self, keys: list[bytes], states: list[np.ndarray], ids: list[list[int]]) -> None:
        number = self._next_chunk()
        stem = self.dir / f"{number:06d}"
        offsets = np.zeros(len(states) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(s) for s in states])
        tmp_states = stem.with_name(f"{number:06d}.states.tmp.npy")
        np.save(tmp_states, np.concatenate(states, axis=0).astype(np.float16))
        tmp_meta = stem.with_name(f"{number:06d}.meta.tmp.npz")
        np.savez(tmp_meta, keys=np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), KEY_BYTES),
                 offsets=offsets, ids=np.concatenate([np.asarray(r, dtype=np.int32) for r in ids]))
        os.replace(tmp_states, stem.with_name(f"{number:06d}.states.npy"))
        os.replace(tmp_meta, stem.with_name(f"{number:06d}.meta.npz"))  # the meta file last: it marks a chunk done

    @torch.inference_mode()
    def compute(self, ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Run the encoder on already tokenized rows (one padded batch); float32 states ``[length, hidden]`` each."""
        pad = self.tokenizer.pad_token_id or 0
        width = max(len(r) for r in ids)
        input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, row in enumerate(ids):
            input_ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, :len(row)] = 1
        model = _auto_model(self.transformer)
        was_training = model.training
        model.eval()
        try:
            hidden = model(input_ids=input_ids.to(model.device), attention_mask=mask.to(model.device),
                           return_dict=True).last_hidden_state
        finally:
            model.train(was_training)
        return [hidden[i, :len(row)].float().cpu() for i, row in enumerate(ids)]

    def fill(self, texts: Iterable[str], max_seq_length: int, batch_size: int = 32, chunk_texts: int = 512,
             desc: str = "encoder states", progress: bool = True, max_seconds: float | None = None) -> dict[str, Any]:
        """Compute and store the states of every text not cached yet (deduplicated, longest first, in
        chunks of ``chunk_texts``: an interrupted fill keeps its finished chunks; ``max_seconds`` stops after
        the chunk that crosses it, ``remaining`` in the facts). Returns fill facts."""
        import time

        texts = list(texts)
        ids = self.token_ids(texts, max_seq_length)
        keys = self.keys(ids)
        todo: dict[bytes, list[int]] = {}
        for key, row in zip(keys, ids):
            if key not in self._index:
                todo.setdefault(key, row)
        order = sorted(todo, key=lambda k: -len(todo[k]))
        tokens = sum(len(todo[k]) for k in order)
        t0 = time.perf_counter()
        remaining = 0
        with tqdm(total=tokens, desc=desc, unit="tok", unit_scale=True, disable=not progress) as bar:
            for start in range(0, len(order), chunk_texts):
                if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
                    remaining = len(order) - start
                    break
                chunk_keys = order[start:start + chunk_texts]
                chunk_ids = [todo[k] for k in chunk_keys]
                states: list[np.ndarray] = []
                for b in range(0, len(chunk_ids), batch_size):
                    batch = chunk_ids[b:b + batch_size]
                    states += [s.numpy().astype(np.float16) for s in self.compute(batch)]
                    bar.update(sum(len(r) for r in batch))
                self._write_chunk(chunk_keys, states, chunk_ids)
                self.reload()
        facts = {"texts": len(texts), "unique": len(set(keys)), "computed": len(order) - remaining,
                 "remaining": remaining, "tokens_todo": tokens, "seconds": round(time.perf_counter() - t0, 2),
                 "cache": str(self.dir)}
        if order:
            logger.info("encoder state cache: %s", facts)
        return facts
