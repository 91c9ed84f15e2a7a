"""A MILCO model's frozen encoder served from the token-state cache (Nguyen et al. 2025, arXiv 2510.00671).

:class:`CachedTransformer` stands in for the ``Transformer`` module of a MILCO ``SparseEncoder``
(``[Transformer, LexEchoHead]``) while the encoder is frozen: its ``preprocess`` tokenizes a text as the
encoder would (same tokenizer, same truncation) and adds the text's cache row (``state_keys``); its
``forward`` fills ``token_embeddings`` from :class:`.state_cache.TokenStateCache` instead of running the 12
layers. sentence-transformers' trainer, data collator and losses (SpladeLoss/FLOPS, InfoNCE) see the same
features as before, and SAP's loop runs unchanged.

:func:`cached_encoder` swaps it in for a block and puts the original module back afterwards, so what is
saved is the original encoder and the trained head. A checkpoint written inside the block names this class
in ``modules.json``; it loads back as a plain (uncached) encoder through :meth:`CachedTransformer.load`,
which keeps the trainer's resume working (this module has no parameters of its own).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch
from sentence_transformers.base.modules.input_module import InputModule

from .state_cache import StateCacheMiss, TokenStateCache

__all__ = ["CachedTransformer", "cached_encoder", "milco_texts_of_dataset", "encode_from_cache"]

logger = logging.getLogger(__name__)


class CachedTransformer(InputModule):
    """The MILCO encoder as cached token states.

    Args:
        transformer: the original sentence-transformers ``Transformer`` (kept, unregistered: its weights stay
            out of this module's state dict; it tokenizes, is saved in its place and computes misses).
        cache: the :class:`TokenStateCache` of that encoder (``None``: compute every text, uncached).
        compute_missing: run the encoder for texts the cache lacks (else raise :class:`StateCacheMiss`).
    """

    save_in_root: bool = True

    def __init__(self, transformer: Any, cache: TokenStateCache | None = None, compute_missing: bool = False) -> None:
        super().__init__()
        self._wrapped = [transformer]  # a list: not a registered submodule
        self.cache = cache
        self.compute_missing = bool(compute_missing)
        self.misses = 0

    @property
    def transformer(self) -> Any:
        return self._wrapped[0]

    @property
    def tokenizer(self) -> Any:
        return self.transformer.tokenizer

    @property
    def auto_model(self) -> Any:
        return self.transformer.auto_model

    @property
    def max_seq_length(self) -> int | None:
        return self.transformer.max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int | None) -> None:
        self.transformer.max_seq_length = value

    @property
    def modalities(self) -> list[str]:
        return ["text"]

    def preprocess(self, inputs: Sequence[str], prompt: str | None = None, **kwargs) -> dict[str, Any]:
        """Token ids + attention mask as the encoder's tokenizer gives them, plus each text's cache key."""
        if not inputs:
            return {}
        if self.cache is None:
            return self.transformer.preprocess(inputs, prompt=prompt, **kwargs)
        texts = [prompt + t for t in inputs] if prompt else list(inputs)
        length = int(kwargs.get("max_length") or self.max_seq_length)
        ids = self.cache.token_ids(texts, length)
        width = max(len(r) for r in ids)
        pad = self.tokenizer.pad_token_id or 0
        input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, row in enumerate(ids):
            input_ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, :len(row)] = 1
        return {"input_ids": input_ids, "attention_mask": mask, "state_keys": self.cache.keys(ids)}

    def tokenize(self, texts: list[str], **kwargs) -> dict[str, Any]:
        return self.preprocess(texts, **kwargs)

    def _lookup(self, keys: list[bytes], input_ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        present = [self.cache.has(k) for k in keys]
        rows: list[torch.Tensor | None] = [None] * len(keys)
        hits = [i for i, ok in enumerate(present) if ok]
        for i, arr in zip(hits, self.cache.rows([keys[i] for i in hits])):
            rows[i] = torch.from_numpy(np.asarray(arr, dtype=np.float32))
        missing = [i for i, ok in enumerate(present) if not ok]
        if missing:
            if not self.compute_missing:
                raise StateCacheMiss(f"{len(missing)} of {len(keys)} texts of this batch have no cached encoder "
                                     f"states in {self.cache.dir} (fill the cache before training, or pass "
                                     "compute_missing=True)")
            self.misses += len(missing)
            ids = [input_ids[i, : int(mask[i].sum())].tolist() for i in missing]
            for i, states in zip(missing, self.cache.compute(ids)):
                rows[i] = states
        return rows  # type: ignore[return-value]

    def forward(self, features: dict[str, Any], **kwargs) -> dict[str, Any]:
        """``token_embeddings`` ``[B, L, hidden]`` (float32, zero at padding) from the cache."""
        if self.cache is None or "state_keys" not in features:
            return self.transformer(features, **kwargs)
        input_ids, mask = features["input_ids"], features["attention_mask"]
        rows = self._lookup(list(features["state_keys"]), input_ids, mask)
        hidden = rows[0].shape[1]
        out = torch.zeros((len(rows), input_ids.shape[1], hidden), dtype=torch.float32)
        for i, row in enumerate(rows):
            out[i, : row.shape[0]] = row
        features = dict(features)
        features.pop("state_keys")
        features["token_embeddings"] = out.to(input_ids.device)
        return features

    def get_embedding_dimension(self) -> int:
        return int(self.auto_model.config.hidden_size)

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        """Save the original encoder (a checkpoint written while training on cached states stays complete)."""
        self.transformer.save(output_path, *args, safe_serialization=safe_serialization, **kwargs)

    @classmethod
    def load(cls, model_name_or_path: str, *args, **kwargs) -> "CachedTransformer":
        """A checkpoint's encoder, uncached (the trainer's resume loads only the head's weights from it)."""
        from sentence_transformers.sparse_encoder.modules import Transformer

        return cls(Transformer.load(model_name_or_path, *args, **kwargs))


def milco_texts_of_dataset(dataset: Any, skip: Iterable[str] = ("label", "score", "scores")) -> list[str]:
    """Every text of a training ``datasets.Dataset`` (its string columns; labels skipped), deduplicated."""
    seen: dict[str, None] = {}
    for column in dataset.column_names:
        if column in set(skip):
            continue
        for value in dataset[column]:
            if isinstance(value, str):
                seen.setdefault(value, None)
    return list(seen)


@contextlib.contextmanager
def cached_encoder(model: Any, texts: Iterable[str], max_seq_length: int, root: str | None = None,
                   batch_size: int = 32, compute_missing: bool = False, desc: str = "encoder states") -> Iterator[dict[str, Any]]:
    """Fill the state cache of MILCO ``model``'s encoder with ``texts`` at ``max_seq_length``, serve the
    encoder from it inside the block, and restore the original ``Transformer`` module on exit.

    Yields the fill facts (texts, computed, seconds, cache dir). The encoder must stay frozen in the block.
    """
    transformer = model[0]
    if isinstance(transformer, CachedTransformer):
        raise ValueError("the model's encoder is already served from the state cache")
    cache = TokenStateCache(transformer, root=root)
    facts = cache.fill(texts, max_seq_length, batch_size=batch_size, desc=desc)
    facts = {**facts, "max_seq_length": int(max_seq_length)}
    key = next(iter(model._modules))
    model._modules[key] = CachedTransformer(transformer, cache, compute_missing=compute_missing)
    try:
        yield facts
    finally:
        model._modules[key] = transformer


def encode_from_cache(model: Any, texts: Sequence[str], batch_size: int = 64, max_seq_length: int | None = None,
                      root: str | None = None, progress: bool = False, batch_tokens: int = 4096) -> Any:
    """MILCO vectors ``scipy.sparse.csr_matrix [n, V_src + V_en]`` of ``texts`` with the encoder read from the
    state cache (states not cached yet are computed and stored first): the head alone runs, in length-sorted
    batches of at most ``batch_size`` texts and ``batch_tokens`` padded tokens (the ``[tokens, V_en]`` logits
    bound the memory). Same vectors as ``model.encode`` up to the fp16 storage of the states."""
    import scipy.sparse as sp
    from tqdm.auto import tqdm

    transformer = model[0].transformer if isinstance(model[0], CachedTransformer) else model[0]
    length = int(max_seq_length or model.max_seq_length)
    cache = TokenStateCache(transformer, root=root)
    cache.fill(texts, length, desc="encoder states", progress=progress)
    module = CachedTransformer(transformer, cache)
    head = model[1]
    texts = list(texts)
    lengths = [len(r) for r in cache.token_ids(texts, length)]
    order = sorted(range(len(texts)), key=lambda i: -lengths[i])
    batches, start = [], 0
    while start < len(order):
        size = max(1, min(batch_size, batch_tokens // max(1, lengths[order[start]])))
        batches.append(order[start:start + size])
        start += size
    parts, done = [], []
    was_training = head.training
    head.eval()
    with torch.inference_mode():
        for idx in tqdm(batches, desc="MILCO head", unit="batch", disable=not progress):
            features = module(module.preprocess([texts[i] for i in idx], max_length=length))
            out = head(features)["sentence_embedding"].to(torch.float32).numpy()
            parts.append(sp.csr_matrix(out))
            done += idx
    head.train(was_training)
    if not parts:
        return sp.csr_matrix((0, head.get_embedding_dimension()), dtype=np.float32)
    inverse = np.empty(len(done), dtype=np.int64)
    inverse[np.asarray(done)] = np.arange(len(done))
    mat = sp.vstack(parts).tocsr()[inverse]
    mat.eliminate_zeros()
    return mat
