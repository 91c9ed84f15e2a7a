"""Sparse Alignment Pretraining (SAP), MILCO's first stage (Nguyen et al. 2025, arXiv 2510.00671, section 3.2).

On a bitext of ``(english, target)`` pairs the frozen English SPLADE model (the teacher, whose MLM head
MILCO's pivot view reuses) encodes the English side into ``t = SPLADE(en)`` (special ids zeroed). The
student's pivot view of the target side, and of the English side (``english_side=True``), is pushed
towards it:

``L = ||p(target) - t||^2 + ||p(en) - t||^2 + revive + lambda * FLOPS(p)``

with the squared error summed over the English vocabulary and averaged over the batch (a sparse-vector
MSE; the paper aligns the student's English lexical view to the teacher's, we use MSE on the
``log(1 + relu)`` weights), and ``FLOPS(p) = sum_j (mean_i p_ij)^2`` over the student's pivot vectors of
the batch (Paria et al. 2020; Formal et al. 2021). ``revive = sum_j [t_j > 0] relu(-z_j)`` over the
student's max-pooled logits ``z`` keeps the teacher's dimensions alive: without it the first steps (a
random connector activates thousands of dimensions) pushed every logit below zero, relu then passes no
gradient and the view stayed empty (seen on e5-small + SPLADE-tiny). The source view is not trained here (the paper enables
LexEcho in the contrastive stage): SAP only builds the cross-lingual map into the English vocabulary.

The connector starts from a closed-form ridge fit on word-aligned English states
(:mod:`.connector_init`, ``connector_init="ridge"``): from a random connector, 150 steps on e5-small +
SPLADE-tiny left the pivot view generic ("is", "and", "." for every text); after the fit, Korean
queries already decode to the right English terms ("temperature", "distance"), weakly.

Which parameters move (``train``): ``connector`` (default; the encoder runs without gradient, which is
what makes SAP affordable on 2 CPU cores), ``head`` (connector + the copied English MLM head), ``all``
(+ the encoder). AdamW with linear warm-up/decay (transformers' scheduler). The loop is hand-written
because sentence-transformers' trainer feeds a loss only the student's tokenised columns, and SAP's
target comes from a second model with another tokenizer. Checkpoints (trainable weights, optimiser,
scheduler, step) are written atomically every ``save_steps`` and the run resumes from the last one.
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm.auto import tqdm

from ..config import ArtifactConfig

__all__ = ["SapConfig", "run_sap", "sap_loss", "teacher_vectors", "epoch_batches", "TRAIN_PARTS", "CONNECTOR_INITS",
           "SAP_LOG_FILE", "SAP_CHECKPOINT"]

logger = logging.getLogger(__name__)

TrainPart = Literal["connector", "head", "all"]
TRAIN_PARTS: tuple[str, ...] = ("connector", "head", "all")
ConnectorInit = Literal["ridge", "random"]
CONNECTOR_INITS: tuple[str, ...] = ("ridge", "random")
SAP_LOG_FILE = "sap_log.jsonl"
SAP_CHECKPOINT = "sap_checkpoints/last.pt"


@dataclass
class SapConfig(ArtifactConfig):
    """SAP settings; saved as ``sap_config.json`` next to the model.

    Args:
        steps: optimiser steps (0: ``epochs`` passes over the bitext).
        epochs: passes over the bitext when ``steps`` is 0.
        batch_size: pairs per step.
        max_seq_length: tokens per text for student and teacher during SAP (the saved model keeps its own).
        lr: AdamW learning rate; warmup_ratio: linear warm-up share of the steps.
        train: ``connector`` | ``head`` | ``all`` (see the module docstring).
        english_side: also align the student's view of the English side.
        flops_weight: lambda of the FLOPS regulariser on the student's pivot vectors.
        max_pairs: use only the first N pairs (0: all).
        connector_init: ``ridge`` (default) fits the connector in closed form on ``init_texts`` English sides
            before the first step (:mod:`.connector_init`; ridge weight ``init_ridge``), ``random`` keeps the
            random init (a resumed run keeps its checkpoint either way).
        save_steps / logging_steps: checkpoint and log intervals (steps).
        resume: continue from ``sap_checkpoints/last.pt`` when present.
        threads: torch threads (0: leave torch's setting).
        state_cache: with ``train`` ``connector`` or ``head`` (frozen encoder), compute the encoder's token states
            of every bitext text once (:mod:`.state_cache`) and run SAP's student on them
            (:func:`.milco.milco_transfer`); ``False`` runs the encoder every step.
    """

    FILENAME = "sap_config.json"

    steps: int = 0
    epochs: float = 1.0
    batch_size: int = 16
    max_seq_length: int = 128
    lr: float = 1e-3
    warmup_ratio: float = 0.05
    train: str = "connector"
    english_side: bool = True
    flops_weight: float = 1e-3
    max_pairs: int = 0
    connector_init: str = "ridge"
    init_texts: int = 2000
    init_ridge: float = 1.0
    save_steps: int = 100
    logging_steps: int = 10
    resume: bool = True
    seed: int = 42
    threads: int = 0
    state_cache: bool = True

    def __post_init__(self) -> None:
        if self.connector_init not in CONNECTOR_INITS:
            raise ValueError(f"connector_init must be one of {', '.join(CONNECTOR_INITS)}, got {self.connector_init!r}")
        if self.train not in TRAIN_PARTS:
            raise ValueError(f"train must be one of {', '.join(TRAIN_PARTS)}, got {self.train!r}")
        if self.steps < 0 or self.epochs <= 0 and self.steps == 0:
            raise ValueError("give steps > 0 or epochs > 0")
        if self.batch_size < 1 or self.max_seq_length < 8 or self.lr <= 0:
            raise ValueError("batch_size >= 1, max_seq_length >= 8 and lr > 0 are required")
        if not 0 <= self.warmup_ratio < 1 or self.flops_weight < 0:
            raise ValueError("warmup_ratio must be in [0, 1) and flops_weight >= 0")


def teacher_vectors(teacher: Any, texts: list[str], max_seq_length: int) -> torch.Tensor:
    """The frozen English SPLADE vectors ``[B, V_en]`` of ``texts`` (special ids zeroed)."""
    from ..contract import special_token_ids

    teacher.max_seq_length = max_seq_length
    with torch.no_grad():
        features = teacher.preprocess(texts)
        vectors = teacher(features)["sentence_embedding"].float()
    specials = special_token_ids(teacher.tokenizer)
    if specials:
        vectors[:, specials] = 0.0
    return vectors


def _student_logits(model, texts: list[str], grad_encoder: bool) -> torch.Tensor:
    """The student's max-pooled English logits ``[B, V_en]`` (pivot view = ``log(1 + relu(.))`` of them)."""
    encoder, head = model[0], model[1]
    features = model.preprocess(texts)
    with torch.set_grad_enabled(grad_encoder and torch.is_grad_enabled()):
        features = encoder(features)
    return head.pooled_logits(head.pivot_hidden(features["token_embeddings"]), features["attention_mask"])


def _align(head, pooled: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(mse, revive, pivot)``: squared error of the pivot view against the teacher, and the revival hinge
    ``sum_j [t_j > 0] relu(-z_j)`` on the pooled logits ``z``: a dimension the teacher uses but whose
    logits all went negative gets no gradient through relu, so without it a step that pushes every logit
    below zero (the first steps, when a random connector activates thousands of dims) kills the view."""
    pivot = head.pivot_from_logits(pooled)
    mse = ((pivot - target) ** 2).sum(dim=1).mean()
    revive = (torch.relu(-pooled) * (target > 0)).sum(dim=1).mean()
    return mse, revive, pivot


def sap_loss(model: Any, teacher: Any, pairs: list[tuple[str, str]], config: SapConfig) -> dict[str, torch.Tensor]:
    """SAP loss terms of one batch: ``{"loss", "mse_target", "mse_english", "revive", "flops", "active"}``."""
    english = [en for en, _ in pairs]
    target = teacher_vectors(teacher, english, config.max_seq_length)
    grad_encoder = config.train == "all"
    model.max_seq_length = config.max_seq_length
    head = model[1]
    mse, revive, p_target = _align(head, _student_logits(model, [t for _, t in pairs], grad_encoder), target)
    terms = {"mse_target": mse, "revive": revive}
    views = [p_target]
    if config.english_side:
        mse_en, revive_en, p_en = _align(head, _student_logits(model, english, grad_encoder), target)
        terms["mse_english"] = mse_en
        terms["revive"] = revive + revive_en
        views.append(p_en)
    else:
        terms["mse_english"] = torch.zeros(())
    stacked = torch.cat(views, dim=0)
    terms["flops"] = (stacked.mean(dim=0) ** 2).sum()
    terms["loss"] = (terms["mse_target"] + terms["mse_english"] + terms["revive"]
                     + config.flops_weight * terms["flops"])
    terms["active"] = (p_target > 0).float().sum(dim=1).mean().detach()
    return terms


#: batches are cut from length-sorted windows of this many batches (less padding: half the MS MARCO
#: bitext are short queries, half passages of ~100 tokens), then the batch order is shuffled
LENGTH_WINDOW_BATCHES = 50


def epoch_batches(pairs: list[tuple[str, str]], batch_size: int, seed: int) -> list[list[int]]:
    """One epoch's batches of pair indices: a seeded shuffle, sorted by target length inside windows of
    ``LENGTH_WINDOW_BATCHES`` batches, batch order shuffled again. Deterministic, so a resumed run
    takes up at the same batch."""
    rng = random.Random(seed)
    order = list(range(len(pairs)))
    rng.shuffle(order)
    window = batch_size * LENGTH_WINDOW_BATCHES
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window], key=lambda i: len(pairs[i][1]) + len(pairs[i][0]))
        batches += [chunk[b:b + batch_size] for b in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def _trainable(model, part: str) -> list[torch.nn.Parameter]:
    groups = model[1].trainable_groups()
    params = list(groups["connector"])
    if part in ("head", "all"):
        params += groups["pivot_head"]
    if part == "all":
        params += list(model[0].parameters())
    return params


def _save_checkpoint(path: Path, model, optimizer, scheduler, step: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "trainable": trainable, "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict()}, tmp)
    os.replace(tmp, path)


def _load_checkpoint(path: Path, model, optimizer, scheduler) -> int:
    state = torch.load(path, map_location="cpu", weights_only=False)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state["trainable"].items():
            params[name].copy_(value)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return int(state["step"])


def run_sap(model: Any, teacher: Any, pairs: list[tuple[str, str]], config: SapConfig, out_dir: str | os.PathLike) -> dict[str, Any]:
    """Run SAP on ``model`` (a MILCO ``SparseEncoder``, changed in place) against ``teacher``.

    Writes ``sap_log.jsonl`` and ``sap_checkpoints/last.pt`` under ``out_dir``; returns the run facts
    (steps, seconds, steps/s, first/last loss, resumed step).
    """
    from transformers import get_linear_schedule_with_warmup

    if config.threads > 0:
        torch.set_num_threads(config.threads)
    out = Path(out_dir)
    pairs = list(pairs[: config.max_pairs] if config.max_pairs else pairs)
    if not pairs:
        raise ValueError("SAP needs at least one bitext pair")
    per_epoch = math.ceil(len(pairs) / config.batch_size)
    total = config.steps or max(1, math.ceil(config.epochs * per_epoch))
    saved_length = model.max_seq_length
    for p in model.parameters():
        p.requires_grad_(False)
    params = _trainable(model, config.train)
    for p in params:
        p.requires_grad_(True)
    for p in teacher.parameters():
        p.requires_grad_(False)
    teacher.eval()
    model.eval()  # no dropout in a frozen encoder; the head has none
    if config.train == "all":
        model[0].train()
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(config.warmup_ratio * total), total)
    ckpt = out / SAP_CHECKPOINT
    start = _load_checkpoint(ckpt, model, optimizer, scheduler) if (config.resume and ckpt.is_file()) else 0
    init_facts = None
    if start == 0 and config.connector_init == "ridge":
        from .connector_init import ridge_init_connector

        init_facts = ridge_init_connector(model, teacher, [en for en, _ in pairs], texts=config.init_texts,
                                          max_length=config.max_seq_length, ridge=config.init_ridge, seed=config.seed)
    log_path = out / SAP_LOG_FILE
    if start == 0 and log_path.exists():
        log_path.unlink()
    first = last = None
    t0 = time.perf_counter()
    with open(log_path, "a", encoding="utf-8") as log, tqdm(total=total, initial=start, desc="SAP", unit="step") as bar:
        batches: dict[int, list[list[int]]] = {}
        for step in range(start, total):
            epoch, batch = divmod(step, per_epoch)
            if epoch not in batches:
                batches = {epoch: epoch_batches(pairs, config.batch_size, config.seed + epoch)}
            chunk = [pairs[i] for i in batches[epoch][batch]]
            terms = sap_loss(model, teacher, chunk, config)
            optimizer.zero_grad(set_to_none=True)
            terms["loss"].backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            value = float(terms["loss"].detach())
            first = value if first is None else first
            last = value
            bar.update(1)
            bar.set_postfix(loss=f"{value:.3f}")
            done = step + 1
            if done % config.logging_steps == 0 or done == total or step == start:
                row = {"step": done, "epoch": round(done / per_epoch, 4), "lr": scheduler.get_last_lr()[0],
                       **{k: round(float(v.detach()), 5) for k, v in terms.items()},
                       "seconds": round(time.perf_counter() - t0, 2)}
                log.write(json.dumps(row) + "\n")
                log.flush()
            if config.save_steps and (done % config.save_steps == 0 or done == total):
                _save_checkpoint(ckpt, model, optimizer, scheduler, done)
    seconds = time.perf_counter() - t0
    for p in model.parameters():
        p.requires_grad_(True)
    model.max_seq_length = saved_length
    model.eval()
    ran = total - start
    return {"steps": total, "resumed_from_step": start or None, "pairs": len(pairs), "seconds": round(seconds, 2),
            "steps_per_second": round(ran / seconds, 4) if seconds > 0 and ran else None,
            "first_loss": first, "last_loss": last, "connector_init": init_facts, "log": str(log_path)}
