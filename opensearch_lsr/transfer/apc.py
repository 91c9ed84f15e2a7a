"""VT step 3b: Activation Potential Calibration (APC) of the MLM output bias.

Vocabulary Transfer (VT; "Why Advanced Encoders Lag on Sparse Retrieval? ... Bridging Vocabulary
Gaps", SIGIR 2026, section 4): after a vocabulary swap the share of vocabulary logits that clear the
ReLU of SPLADE pooling (the *activation rate*) drifts away from what the encoder was trained for,
which makes the representations either nearly empty or far too dense. APC probes a corpus sample,
measures

    rate(c) = mean over token positions of  |{v : logit_v + c > 0}| / |V|      (pre-ReLU logits)

and shifts the whole output bias by the constant ``c`` that brings ``rate(c)`` to the target (paper:
about 0.4). ``rate`` is monotone in ``c``, so ``c`` is found by bisection on cached probe logits; the
document and query active dimensions (SPLADE max pooling: a vocabulary entry is active when its
maximum logit over the text's positions is > 0) are reported for ``c = 0`` and the chosen ``c``.
Special-token columns are left out of both measures (retrieval zeroes them).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .adaptation import mlm_body_and_head
from .surgery import mlm_parts

__all__ = ["ActivationProbe", "APCResult", "probe_activations", "find_bias_shift", "calibrate_activation"]

logger = logging.getLogger(__name__)


@dataclass
class ActivationProbe:
    """Cached pre-ReLU logits of a probe sample (special-token columns removed).

    Attributes:
        position_logits: ``[P, V']`` logits of (a random subsample of) the probe's token positions.
        doc_max: ``[n_docs, V']`` per-document maximum logit over positions (SPLADE max pooling).
        query_max: ``[n_queries, V']`` the same for the probe queries.
    """

    position_logits: torch.Tensor
    doc_max: torch.Tensor
    query_max: torch.Tensor

    def rate(self, shift: float = 0.0) -> float:
        """Activation rate: share of vocabulary logits ``> -shift``, averaged over positions."""
        total = 0
        for block in torch.split(self.position_logits, 256):
            total += int((block.float() > -shift).sum())
        return total / max(1, self.position_logits.numel())

    @staticmethod
    def _active(maxes: torch.Tensor, shift: float) -> float:
        return float((maxes.float() > -shift).sum(dim=1).float().mean()) if maxes.shape[0] else 0.0

    def doc_active_dims(self, shift: float = 0.0) -> float:
        return self._active(self.doc_max, shift)

    def query_active_dims(self, shift: float = 0.0) -> float:
        return self._active(self.query_max, shift)


@dataclass
class APCResult:
    """Activation Potential Calibration outcome (saved into ``transfer_config.json``)."""

    target_rate: float
    shift: float
    rate_before: float
    rate_after: float
    doc_active_dims_before: float
    doc_active_dims_after: float
    query_active_dims_before: float
    query_active_dims_after: float
    probe_positions: int
    probe_documents: int
    probe_queries: int
    iterations: int


@torch.no_grad()
def _max_and_positions(model, tokenizer, texts: Sequence[str], keep: torch.Tensor, max_length: int,
                       batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    body, head = mlm_body_and_head(model)
    maxes, positions = [], []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(list(texts[start:start + batch_size]), truncation=True, max_length=max_length,
                        padding=True, return_tensors="pt")
        attn = enc["attention_mask"].bool().to(device)
        hidden = body(input_ids=enc["input_ids"].to(device), attention_mask=attn.long()).last_hidden_state
        logits = head(hidden)[..., keep.to(device)].float()
        masked = logits.masked_fill(~attn.unsqueeze(-1), float("-inf"))
        maxes.append(masked.max(dim=1).values.cpu())
        positions.append(logits[attn].half().cpu())
    if not maxes:
        width = int(keep.sum())
        return torch.zeros((0, width)), torch.zeros((0, width), dtype=torch.float16)
    return torch.cat(maxes), torch.cat(positions)


def probe_activations(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    documents: Sequence[str],
    queries: Sequence[str] = (),
    max_length: int = 128,
    max_positions: int = 2048,
    batch_size: int = 16,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> ActivationProbe:
    """Run the probe texts once and cache their pre-ReLU logits (``max_positions`` positions kept)."""
    if not documents:
        raise ValueError("APC needs at least one probe document")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(device).eval()
    vocab = mlm_parts(model).vocab_size
    keep = torch.ones(vocab, dtype=torch.bool)
    keep[[i for i in tokenizer.all_special_ids if i < vocab]] = False
    doc_max, pos = _max_and_positions(model, tokenizer, documents, keep, max_length, batch_size, device)
    query_max, _ = _max_and_positions(model, tokenizer, list(queries), keep, max_length, batch_size, device)
    if pos.shape[0] > max_positions:
        gen = torch.Generator().manual_seed(seed)
        pos = pos[torch.randperm(pos.shape[0], generator=gen)[:max_positions]]
    return ActivationProbe(pos, doc_max, query_max)


def find_bias_shift(probe: ActivationProbe, target_rate: float, rel_tol: float = 0.02,
                    max_iter: int = 80) -> tuple[float, int]:
    """Bisection for the bias shift ``c`` with ``rate(c) ~= target_rate``; returns ``(c, iterations)``.

    Stops when ``|rate(c) - target| <= rel_tol * target``: the tolerance is relative because a SPLADE
    model's own rate is tiny (SPLADE-tiny: ~2e-4), and an absolute tolerance such as 5e-4 would accept
    any shift for such a target.
    """
    if not 0.0 < target_rate < 1.0:
        raise ValueError(f"target activation rate must be in (0, 1), got {target_rate}")
    if not 0.0 < rel_tol < 1.0:
        raise ValueError(f"rel_tol must be in (0, 1), got {rel_tol}")
    logits = probe.position_logits
    lo = -float(logits.max()) - 1.0  # rate(lo) == 0
    hi = -float(logits.min()) + 1.0  # rate(hi) == 1
    tol = rel_tol * target_rate
    best, best_gap = 0.0, float("inf")
    for it in range(1, max_iter + 1):
        mid = (lo + hi) / 2
        rate = probe.rate(mid)
        if abs(rate - target_rate) < best_gap:
            best, best_gap = mid, abs(rate - target_rate)
        if best_gap <= tol:
            return best, it
        if rate < target_rate:
            lo = mid
        else:
            hi = mid
    # the rate is a step function: tied logits can make the target unreachable within tol
    logger.warning("APC: rate %.3g is the closest reachable to target %.3g (relative tolerance %.3g)",
                   probe.rate(best), target_rate, rel_tol)
    return best, max_iter


@torch.no_grad()
def calibrate_activation(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    documents: Sequence[str],
    queries: Sequence[str] = (),
    target_rate: float = 0.4,
    max_length: int = 128,
    max_positions: int = 2048,
    seed: int = 0,
    apply: bool = True,
    device: str | torch.device | None = None,
) -> APCResult:
    """Measure the activation rate, find the bias shift that hits ``target_rate`` and apply it in place.

    With ``apply=False`` only measures (the reported "after" figures are what the shift would give).
    """
    parts = mlm_parts(model)
    if parts.output_bias is None:
        raise ValueError("APC shifts the MLM output bias, but this model's decoder has no bias")
    probe = probe_activations(model, tokenizer, documents, queries, max_length, max_positions, seed=seed,
                              device=device)
    shift, iters = find_bias_shift(probe, target_rate)
    result = APCResult(
        target_rate=target_rate,
        shift=shift,
        rate_before=probe.rate(0.0),
        rate_after=probe.rate(shift),
        doc_active_dims_before=probe.doc_active_dims(0.0),
        doc_active_dims_after=probe.doc_active_dims(shift),
        query_active_dims_before=probe.query_active_dims(0.0),
        query_active_dims_after=probe.query_active_dims(shift),
        probe_positions=int(probe.position_logits.shape[0]),
        probe_documents=int(probe.doc_max.shape[0]),
        probe_queries=int(probe.query_max.shape[0]),
        iterations=iters,
    )
    if apply:
        parts.output_bias.add_(shift)
    logger.info("APC: rate %.4f -> %.4f (shift %+.4f), doc active dims %.1f -> %.1f",
                result.rate_before, result.rate_after, shift, result.doc_active_dims_before,
                result.doc_active_dims_after)
    return result
