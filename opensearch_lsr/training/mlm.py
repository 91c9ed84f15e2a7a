"""Continued masked-language-model training of a sparse encoder on the target corpus (before ``adapt``).

A SPLADE document vector is the max over tokens of the MLM head's log-saturated logits, so the MLM head
*is* the expansion model. After a vocabulary transfer its Korean rows are initialised from bridge embeddings
and have never predicted a Korean token in context; a short MLM pass over the corpus fits them to it, as
domain-adaptive pre-training does for dense encoders (Gururangan et al. 2020, "Don't Stop Pretraining") and
as Vocabulary Transfer does after its initialisation (Mosin et al. 2023). Masking follows BERT (15 %,
80/10/10) through ``transformers.DataCollatorForLanguageModeling``.

``scope="embeddings"`` trains the word embeddings and the MLM head only (tied to them in BERT) and keeps the
transformer layers fixed; ``scope="all"`` trains everything.
"""
from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from ..config import ArtifactConfig

__all__ = ["MlmConfig", "MlmScope", "continue_mlm"]

logger = logging.getLogger(__name__)

MlmScope = Literal["embeddings", "all"]


@dataclass
class MlmConfig(ArtifactConfig):
    """Continued MLM training; saved as ``mlm_config.json`` next to the resulting model."""

    FILENAME = "mlm_config.json"

    epochs: float = 1.0
    scope: MlmScope = "all"
    lr: float = 1e-4
    batch_size: int = 32
    max_seq_length: int = 128
    mask_probability: float = 0.15
    warmup_ratio: float = 0.06
    seed: int = 42

    def validate(self) -> None:
        if not self.epochs > 0:
            raise ValueError(f"mlm epochs must be > 0, got {self.epochs}")
        if self.scope not in ("embeddings", "all"):
            raise ValueError(f"mlm scope must be embeddings or all, got {self.scope!r}")
        if not 0 < self.mask_probability < 1:
            raise ValueError(f"mask_probability must be in (0, 1), got {self.mask_probability}")
        if self.batch_size < 1 or self.max_seq_length < 8:
            raise ValueError("batch_size must be >= 1 and max_seq_length >= 8")


def _trainable(mlm, scope: MlmScope) -> list[torch.nn.Parameter]:
    if scope == "all":
        return [p for p in mlm.parameters() if p.requires_grad]
    keep = {id(p) for p in mlm.get_input_embeddings().parameters()}
    keep |= {id(p) for p in mlm.get_output_embeddings().parameters()}
    head = getattr(mlm, "cls", None) or getattr(mlm, "lm_head", None)
    if head is not None:
        keep |= {id(p) for p in head.parameters()}
    params = []
    for p in mlm.parameters():
        p.requires_grad_(id(p) in keep)
        if id(p) in keep:
            params.append(p)
    return params


def continue_mlm(model: str, texts: Sequence[str], out: str | Path, config: MlmConfig | None = None) -> dict:
    """Train ``model``'s masked-LM on ``texts`` and save the whole ``SparseEncoder`` to ``out``.

    Returns the run facts (steps, first / last loss, seconds), also saved in ``mlm_config.json``.
    """
    from transformers import DataCollatorForLanguageModeling, get_linear_schedule_with_warmup

    from ..transfer.surgery import load_sparse_encoder, resolve_model_path

    config = config or MlmConfig()
    config.validate()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    encoder = load_sparse_encoder(resolve_model_path(model), device=device)
    transformer = encoder[0]
    mlm = transformer.auto_model
    tokenizer = encoder.tokenizer
    if tokenizer.mask_token_id is None:
        raise ValueError(f"{model}'s tokenizer has no mask token: it cannot be trained as a masked LM")
    params = _trainable(mlm, config.scope)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=config.mask_probability,
                                               seed=config.seed)
    order = list(range(len(texts)))
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    steps_per_epoch = math.ceil(len(texts) / config.batch_size)
    total = max(1, int(round(config.epochs * steps_per_epoch)))
    optimizer = torch.optim.AdamW(params, lr=config.lr)
    schedule = get_linear_schedule_with_warmup(optimizer, int(config.warmup_ratio * total), total)
    mlm.train()
    losses: list[float] = []
    t0 = time.perf_counter()
    step = 0
    while step < total:
        rng.shuffle(order)
        for start in range(0, len(order), config.batch_size):
            if step >= total:
                break
            batch = [texts[i] for i in order[start:start + config.batch_size]]
            enc = tokenizer(batch, truncation=True, max_length=config.max_seq_length)
            features = collator([{k: enc[k][i] for k in enc} for i in range(len(batch))])
            features = {k: v.to(device) for k, v in features.items()}
            loss = mlm(**features).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            step += 1
            if step % 50 == 0:
                logger.info("mlm step %d/%d: loss %.3f", step, total, sum(losses[-50:]) / len(losses[-50:]))
    mlm.eval()
    for p in mlm.parameters():
        p.requires_grad_(True)
    seconds = time.perf_counter() - t0
    out = Path(out)
    encoder.save(str(out))
    facts = {"model": str(model), "texts": len(texts), "steps": step, "seconds": round(seconds, 1),
             "first_loss": losses[0] if losses else None,
             "last_loss": sum(losses[-20:]) / max(1, len(losses[-20:])) if losses else None}
    config.save(out, extra=facts)
    return facts
