"""VT step 3a: short masked-LM adaptation of the new vocabulary with the transformer body frozen.

Vocabulary Transfer (VT; "Why Advanced Encoders Lag on Sparse Retrieval? ... Bridging Vocabulary
Gaps", SIGIR 2026, section 4) adapts only the vocabulary-sized parameters after the swap: the input
embeddings (tied to the MLM decoder) and the MLM output bias; every transformer and MLM-transform
weight stays frozen, so the encoder's learned sparse behaviour is preserved. Its **Overlap-aware
Masking Curriculum** masks new tokens (V_t minus V_o) with probability weight ``lambda`` and overlap
tokens with weight 1, so the freshly initialised rows receive more training signal:

    p_i = min(1, r * N * w_i / sum_j w_j),   w_i = lambda if token_i is new else 1

over the N maskable (non-special, non-padding) positions of a batch, so that the expected mask rate is
``r`` and new tokens are masked ``lambda`` times as often as overlap tokens (paper: lambda 2, r 0.3).
Masked positions follow BERT's 80/10/10 rule ([MASK] / random token / unchanged).

Written by hand because no library implements a frozen-body, weighted-mask MLM phase:
``DataCollatorForLanguageModeling`` masks uniformly and the HF ``Trainer`` would compute the full
``[batch, seq, V]`` logits; here the MLM head runs on masked positions only (a 4-10x saving on CPU).
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .surgery import mlm_parts

__all__ = [
    "AdaptationResult",
    "mlm_body_and_head",
    "trainable_vocab_parameters",
    "freeze_body",
    "overlap_aware_mask",
    "adapt_embeddings",
    "CHECKPOINT_NAME",
    "OPTIMIZERS",
    "LOG_NAME",
]

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = "adaptation_checkpoint.pt"
OPTIMIZERS = ("adamw", "sgd")
LOG_NAME = "adaptation_log.jsonl"


def mlm_body_and_head(model: PreTrainedModel) -> tuple[torch.nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    """The encoder body (returns ``last_hidden_state``) and the MLM head (hidden -> vocabulary logits).

    Supports BERT (``cls``), RoBERTa/XLM-R (``lm_head``) and DistilBERT (``vocab_*``) masked LMs.
    """
    body = model.base_model
    if hasattr(model, "cls"):
        return body, model.cls
    if hasattr(model, "lm_head"):
        return body, model.lm_head
    if hasattr(model, "vocab_projector"):
        def distil_head(hidden: torch.Tensor) -> torch.Tensor:
            h = model.activation(model.vocab_transform(hidden))
            return model.vocab_projector(model.vocab_layer_norm(h))

        return body, distil_head
    raise ValueError(f"{type(model).__name__}: unknown masked-LM head layout (expected cls, lm_head or vocab_projector)")


def trainable_vocab_parameters(model: PreTrainedModel) -> list[torch.nn.Parameter]:
    """Input embeddings (= tied decoder), the untied decoder weight if any, and the output bias."""
    parts = mlm_parts(model)
    params = [parts.input_embeddings.weight]
    if not parts.tied:
        params.append(parts.output_layer.weight)
    if parts.output_bias is not None:
        params.append(parts.output_bias)
    seen: set[int] = set()
    unique = []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            unique.append(p)
    return unique


def freeze_body(model: PreTrainedModel) -> list[torch.nn.Parameter]:
    """Freeze every parameter except the vocabulary-sized ones; return the trainable list."""
    trainable = trainable_vocab_parameters(model)
    keep = {id(p) for p in trainable}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
    return trainable


def overlap_aware_mask(
    input_ids: torch.Tensor,
    maskable: torch.Tensor,
    is_new: torch.Tensor,
    mask_rate: float,
    new_token_weight: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Overlap-aware Masking Curriculum: which positions to mask.

    Args:
        input_ids: ``[B, L]`` token ids.
        maskable: ``[B, L]`` bool, positions that may be masked (not special, not padding).
        is_new: ``[V]`` bool, True for tokens outside the source/target overlap.
        mask_rate: expected share of maskable positions that get masked (r).
        new_token_weight: lambda, relative mask weight of new tokens (overlap tokens: 1).

    Returns:
        ``[B, L]`` bool mask, with ``P(mask) = min(1, r * N * w_i / sum w)``.
    """
    weights = torch.where(is_new.to(input_ids.device)[input_ids], float(new_token_weight), 1.0)
    weights = weights * maskable.float()
    total = weights.sum()
    if total <= 0:
        return torch.zeros_like(maskable)
    prob = (mask_rate * maskable.sum() * weights / total).clamp(max=1.0)
    draws = torch.rand(prob.shape, generator=generator, device="cpu").to(prob.device)
    return (draws < prob) & maskable


@dataclass
class AdaptationResult:
    """What the MLM phase did (saved into ``transfer_config.json``)."""

    steps: int
    resumed_from_step: int
    first_loss: float | None
    final_loss: float | None
    seconds: float
    trainable_parameters: int
    frozen_parameters: int
    empirical_mask_rate_new: float | None = None
    empirical_mask_rate_overlap: float | None = None
    loss_curve: list[tuple[int, float]] = field(default_factory=list)


def _tokenize(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int) -> list[list[int]]:
    enc = tokenizer(list(texts), truncation=True, max_length=max_length, add_special_tokens=True)
    return [ids for ids in enc["input_ids"] if len(ids) > 2]


def adapt_embeddings(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    is_new: torch.Tensor,
    *,
    steps: int = 300,
    batch_size: int = 32,
    max_length: int = 128,
    lr: float = 1e-4,
    mask_rate: float = 0.3,
    new_token_weight: float = 2.0,
    seed: int = 0,
    train_bias: bool = True,
    optimizer: Literal["adamw", "sgd"] = "adamw",
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: int = 50,
    resume: bool = True,
    device: str | torch.device | None = None,
    show_progress: bool = True,
) -> AdaptationResult:
    """Train input embeddings (tied decoder) and output bias by MLM on ``texts``; body frozen.

    ``optimizer``: ``adamw`` normalises every coordinate's step to about ``lr``, so with a tied decoder
    *every* vocabulary row moves by ~``lr`` per step (the softmax gives each row a small gradient);
    ``sgd`` moves rows in proportion to their gradient, so tokens absent from the batches barely move.
    ``train_bias=False`` keeps the output bias (the PDA prior) fixed and trains the embeddings only.

    Resumable: with ``checkpoint_dir`` the trainable tensors, optimiser state and loss log are saved
    every ``checkpoint_every`` steps (``adaptation_checkpoint.pt``, ``adaptation_log.jsonl``) and an
    existing checkpoint of the same shapes is resumed when ``resume`` is True. Batches are drawn with a
    per-step seed, so a resumed run sees the same batches as an uninterrupted one.
    """
    if steps < 0 or batch_size < 1 or max_length < 8:
        raise ValueError(f"need steps >= 0, batch_size >= 1, max_length >= 8 (got {steps}, {batch_size}, {max_length})")
    if not 0.0 < mask_rate < 1.0:
        raise ValueError(f"mask_rate must be in (0, 1), got {mask_rate}")
    if new_token_weight <= 0:
        raise ValueError(f"new_token_weight (lambda) must be > 0, got {new_token_weight}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if tokenizer.mask_token_id is None:
        raise ValueError("the target tokenizer has no [MASK] token: MLM adaptation needs one")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    vocab = mlm_parts(model).vocab_size
    if is_new.shape[0] != vocab:
        raise ValueError(f"is_new has {is_new.shape[0]} entries for a vocabulary of {vocab}")

    sequences = _tokenize(tokenizer, texts, max_length)
    if not sequences:
        raise ValueError("no usable text for MLM adaptation (all passages empty)")
    model.to(device)
    model.eval()  # dropout off: the frozen body is a fixed feature extractor
    trainable = freeze_body(model)
    if not train_bias:
        bias = mlm_parts(model).output_bias
        if bias is not None:
            bias.requires_grad_(False)
            trainable = [p for p in trainable if p is not bias]
    n_train = sum(p.numel() for p in trainable)
    n_frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    body, head = mlm_body_and_head(model)
    optimizer_name = optimizer
    optimizer = (torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0) if optimizer_name == "adamw"
                 else torch.optim.SGD(trainable, lr=lr, momentum=0.9))

    specials = torch.zeros(vocab, dtype=torch.bool)
    specials[[i for i in tokenizer.all_special_ids if i < vocab]] = True
    random_pool = torch.nonzero(~specials).squeeze(1)
    is_new_dev = is_new.to(device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    ckpt_path = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir else None
    log_path = Path(checkpoint_dir) / LOG_NAME if checkpoint_dir else None
    start_step, curve = 0, []
    if ckpt_path is not None and ckpt_path.exists():
        if resume:
            state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
            shapes = [tuple(t.shape) for t in state["params"]]
            if shapes == [tuple(p.shape) for p in trainable] and state["steps_total"] == steps \
                    and state.get("optimizer_name", "adamw") == optimizer_name:
                with torch.no_grad():
                    for p, saved in zip(trainable, state["params"]):
                        p.copy_(saved.to(device))
                optimizer.load_state_dict(state["optimizer"])
                start_step, curve = int(state["step"]), [tuple(x) for x in state["curve"]]
                logger.info("resuming MLM adaptation from step %d", start_step)
            else:
                logger.warning("ignoring checkpoint %s: different shapes, step count or optimizer", ckpt_path)
        else:
            ckpt_path.unlink()
    if log_path is not None and start_step == 0 and log_path.exists():
        log_path.unlink()

    def save_checkpoint(step: int) -> None:
        if ckpt_path is None:
            return
        ckpt_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"step": step, "steps_total": steps, "optimizer_name": optimizer_name, "params": [p.detach().cpu() for p in trainable],
                    "optimizer": optimizer.state_dict(), "curve": curve}, tmp)
        os.replace(tmp, ckpt_path)

    masked_new = seen_new = masked_old = seen_old = 0
    t0 = time.perf_counter()
    bar = tqdm(range(start_step, steps), desc="MLM adaptation", unit="step", disable=not show_progress,
               initial=start_step, total=steps)
    for step in bar:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        pick = torch.randint(len(sequences), (batch_size,), generator=gen).tolist()
        batch = [sequences[i] for i in pick]
        width = max(len(s) for s in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        for row, seq in enumerate(batch):
            ids[row, :len(seq)] = torch.tensor(seq)
            attn[row, :len(seq)] = 1
        maskable = attn.bool() & ~specials[ids]
        mask = overlap_aware_mask(ids, maskable, is_new, mask_rate, new_token_weight, gen)
        if not mask.any():
            continue
        new_pos = is_new[ids] & maskable
        masked_new += int((mask & new_pos).sum())
        seen_new += int(new_pos.sum())
        masked_old += int((mask & maskable & ~new_pos).sum())
        seen_old += int((maskable & ~new_pos).sum())
        labels = ids[mask]
        corrupted = ids.clone()
        rule = torch.rand(mask.shape, generator=gen)
        corrupted[mask & (rule < 0.8)] = tokenizer.mask_token_id
        swap = mask & (rule >= 0.8) & (rule < 0.9)
        corrupted[swap] = random_pool[torch.randint(len(random_pool), (int(swap.sum()),), generator=gen)]

        hidden = body(input_ids=corrupted.to(device), attention_mask=attn.to(device)).last_hidden_state
        logits = head(hidden[mask.to(device)])
        loss = torch.nn.functional.cross_entropy(logits.float(), labels.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(f"MLM loss became {value} at step {step}: lower the learning rate")
        curve.append((step + 1, value))
        bar.set_postfix(loss=f"{value:.3f}")
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"step": step + 1, "loss": value,
                                     "seconds": round(time.perf_counter() - t0, 3)}) + "\n")
        if checkpoint_every and (step + 1) % checkpoint_every == 0:
            save_checkpoint(step + 1)
    bar.close()
    if steps > start_step:
        save_checkpoint(steps)
    for p in model.parameters():
        p.requires_grad_(True)
    model.eval()
    n_losses = len(curve)
    return AdaptationResult(
        steps=steps,
        resumed_from_step=start_step,
        first_loss=curve[0][1] if n_losses else None,
        final_loss=(sum(v for _, v in curve[-10:]) / min(10, n_losses)) if n_losses else None,
        seconds=round(time.perf_counter() - t0, 2),
        trainable_parameters=n_train,
        frozen_parameters=n_frozen,
        empirical_mask_rate_new=masked_new / seen_new if seen_new else None,
        empirical_mask_rate_overlap=masked_old / seen_old if seen_old else None,
        loss_curve=curve[:: max(1, n_losses // 50)] if n_losses else [],
    )
