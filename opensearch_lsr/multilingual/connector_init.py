"""Closed-form start for MILCO's connector: ridge regression on word-aligned English states.

SAP from a random connector needs far more steps than 2 CPU cores give (150 steps x 16 pairs on
e5-small + SPLADE-tiny left the pivot view generic: "is", "and", "." for every text). This fits the
connector in closed form before SAP so the pivot view starts aligned on English, and e5's
cross-lingual states carry the non-English side over; SAP then fine-tunes it.

On the English side of the bitext, the multilingual encoder and the English SPLADE model both read the
same text. Each whitespace word is pooled (mean over the tokens whose character offsets fall in it) in
both token spaces, giving pairs ``(x_w in R^{d_enc}, y_w in R^{d_en})`` with ``y_w`` the SPLADE model's
last hidden state (what its MLM head reads). The connector ``LayerNorm(W2 GELU(W1 x + b1) + b2)`` keeps its
random ``W1`` (random features, Rahimi & Recht 2007) and gets ``W2, b2`` by ridge regression onto the
*normalised* target ``(y - beta) / gamma``, with the connector's LayerNorm set to the SPLADE model's last
LayerNorm ``(gamma, beta)``: the LayerNorm then maps the fit back onto ``y``. Hand-written because it is a
few lines of ``torch.linalg`` on states only this toolkit pairs up.
"""
from __future__ import annotations

import logging
import random
import re
from typing import Any

import torch
from tqdm.auto import tqdm

__all__ = ["ridge_init_connector", "word_spans", "pool_words"]

logger = logging.getLogger(__name__)

WORD = re.compile(r"\S+")


def word_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the whitespace-separated words of ``text``."""
    return [m.span() for m in WORD.finditer(text)]


def pool_words(states: torch.Tensor, offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[torch.Tensor | None]:
    """Mean of the token states inside each word span (``None`` when no token falls in it, e.g. truncated)."""
    out: list[torch.Tensor | None] = []
    for a, b in spans:
        rows = [i for i, (s, e) in enumerate(offsets) if e > s and s < b and e > a]
        out.append(states[rows].mean(dim=0) if rows else None)
    return out


def _states(module_fn, tokenizer, texts: list[str], max_length: int) -> list[tuple[torch.Tensor, list]]:
    enc = tokenizer(texts, return_offsets_mapping=True, truncation=True, max_length=max_length, padding=True,
                    return_tensors="pt", return_token_type_ids=False)
    offsets = enc.pop("offset_mapping").tolist()
    with torch.no_grad():
        hidden = module_fn(enc["input_ids"], enc["attention_mask"])
    return [(hidden[i], [tuple(o) for o in offsets[i]]) for i in range(len(texts))]


def ridge_sample(english: list[str], texts: int, seed: int) -> list[str]:
    """The English texts the ridge fit reads: ``texts`` of them, a seeded draw, shortest first."""
    pick = list(range(len(english)))
    random.Random(seed).shuffle(pick)
    return sorted((english[i] for i in pick[:texts]), key=len)


def _last_layer_norm(mlm: torch.nn.Module) -> torch.nn.LayerNorm:
    norms = [m for m in mlm.base_model.modules() if isinstance(m, torch.nn.LayerNorm)]
    if not norms:
        raise ValueError(f"{type(mlm).__name__} has no LayerNorm to take the target scale from")
    return norms[-1]


def ridge_init_connector(model: Any, teacher: Any, english: list[str], *, texts: int = 2000, max_length: int = 64,
                         ridge: float = 1.0, batch_size: int = 32, seed: int = 42) -> dict[str, Any]:
    """Fit the connector of MILCO ``model`` (in place) from ``texts`` English sentences; returns fit facts
    (words used, held-out R^2 of the normalised target)."""
    encoder, head = model[0].auto_model, model[1]
    mlm = teacher[0].auto_model
    sample = ridge_sample(english, texts, seed)
    cached = getattr(model[0], "cache", None) is not None  # a CachedTransformer (.cached_encoder): states from disk
    xs, ys = [], []
    was_training = encoder.training, mlm.training
    encoder.eval()
    mlm.eval()
    body = mlm.base_model
    for start in tqdm(range(0, len(sample), batch_size), desc="connector init", unit="batch"):
        batch = sample[start:start + batch_size]
        if cached:
            states = model[0](model[0].preprocess(batch, max_length=max_length))["token_embeddings"]
            src = _states(lambda i, m, h=states: h, model.tokenizer, batch, max_length)
        else:
            src = _states(lambda i, m: encoder(input_ids=i, attention_mask=m).last_hidden_state, model.tokenizer,
                          batch, max_length)
        tgt = _states(lambda i, m: body(input_ids=i, attention_mask=m)[0], teacher.tokenizer, batch, max_length)
        for text, (hs, os_), (ht, ot) in zip(batch, src, tgt):
            spans = word_spans(text)
            for x, y in zip(pool_words(hs, os_, spans), pool_words(ht, ot, spans)):
                if x is not None and y is not None:
                    xs.append(x)
                    ys.append(y)
    encoder.train(was_training[0])
    mlm.train(was_training[1])
    if len(xs) < 10:
        raise ValueError(f"only {len(xs)} aligned words in {len(sample)} texts: too few to fit the connector")
    norm = _last_layer_norm(mlm)
    with torch.no_grad():
        x = torch.stack(xs).double()
        y = ((torch.stack(ys) - norm.bias) / norm.weight).double()
        first = head.connector[0]
        phi = torch.nn.functional.gelu(x @ first.weight.double().t() + first.bias.double())
        held = max(1, len(phi) // 10)
        fit_phi, fit_y = phi[held:], y[held:]
        mean_phi, mean_y = fit_phi.mean(0), fit_y.mean(0)
        a, t = fit_phi - mean_phi, fit_y - mean_y
        gram = a.t() @ a + ridge * torch.eye(a.shape[1], dtype=a.dtype)
        w = torch.linalg.solve(gram, a.t() @ t)  # [features, d_en]
        b = mean_y - mean_phi @ w
        pred = phi[:held] @ w + b
        r2 = 1.0 - float(((pred - y[:held]) ** 2).sum() / ((y[:held] - y[:held].mean(0)) ** 2).sum())
        second, layer_norm = head.connector[2], head.connector[3]
        second.weight.copy_(w.t().to(second.weight.dtype))
        second.bias.copy_(b.to(second.bias.dtype))
        layer_norm.weight.copy_(norm.weight)
        layer_norm.bias.copy_(norm.bias)
        layer_norm.eps = float(norm.eps)
    facts = {"method": "ridge", "texts": len(sample), "words": len(xs), "heldout_words": held,
             "heldout_r2": round(r2, 4), "ridge": ridge, "max_length": max_length}
    logger.info("connector init: %s", facts)
    return facts
