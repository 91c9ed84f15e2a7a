"""Fine-tune a (transferred) sparse encoder with sentence-transformers' ``SparseEncoderTrainer``.

Loss = main ranking loss + FLOPS regularisation (``SpladeLoss``; Formal et al. 2021, "SPLADE v2"):
``L = L_rank + lambda_d * FLOPS(docs) + lambda_q * FLOPS(queries)`` with ``FLOPS = sum_j (mean_i w_ij)^2``,
the regulariser weights ramped up over the first third of training (the library's scheduler).
``L_rank`` is InfoNCE with in-batch (and optional hard) negatives, or MarginMSE (Hofstaetter et al.
2020) / KL distillation (Lin et al. 2020) when rows carry teacher scores.

The inference-free variant follows OpenSearch's doc-only models (Geng et al. 2024): a ``Router``
whose query route is a frozen IDF ``SparseStaticEmbedding`` and whose document route is the MLM
encoder; only documents are FLOPS-regularised.

Output directory: the fine-tuned ``SparseEncoder`` at the root, ``train_config.json`` (config +
run facts), ``loss_log.jsonl``, ``loss_curves.png``, ``train_summary.json`` and ``checkpoints/``.
"""
from __future__ import annotations

import contextlib
import logging
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import read_json, write_json
from ..evaluation.datasets import HOLDOUT_FILE
from .config import TrainConfig
from .data import TrainingData, TrainingDataError, load_training_data, mine_bm25_negatives
from .evaluator import RetrievalDevEvaluator, subset_dataset
from .fused_splade import fused_splade
from .loss_log import LossLogCallback, plot_loss_curves, read_loss_log
from .teacher import mine_teacher_negatives

__all__ = ["TrainResult", "train", "build_loss", "load_start_model", "SUMMARY_FILE", "LOSS_LOG_FILE", "LOSS_PNG_FILE"]

logger = logging.getLogger(__name__)

SUMMARY_FILE = "train_summary.json"
LOSS_LOG_FILE = "loss_log.jsonl"
LOSS_PNG_FILE = "loss_curves.png"
CHECKPOINT_DIR = "checkpoints"


@dataclass
class TrainResult:
    """What :func:`train` returns (and writes as ``train_summary.json``)."""

    out: Path
    steps: int
    train_seconds: float
    pairs: int
    loss: str
    first_loss: float | None = None
    last_loss: float | None = None
    initial_dev_subset: dict[str, float] | None = None
    dev_subset_history: list[dict[str, Any]] = field(default_factory=list)
    final_dev: dict[str, float] | None = None
    final_eval_seconds: float | None = None
    resumed_from: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


def _resolve_loss(config: TrainConfig, data: TrainingData) -> str:
    loss = config.loss
    if loss == "auto":
        loss = "marginmse" if data.label_kind is not None else "infonce"
    if loss in ("marginmse", "kldiv") and data.label_kind is None:
        raise TrainingDataError(f"loss {loss!r} needs teacher scores: JSONL rows with a negative and "
                                "'score' (margin) or 'scores' ([pos, neg...])")
    if loss == "kldiv" and data.label_kind != "scores":
        raise TrainingDataError("loss 'kldiv' needs per-document teacher 'scores' ([s(q,pos), s(q,neg)...]), "
                                "not a margin 'score'")
    if config.kl_weight > 0 and loss == "infonce":
        if data.label_kind != "scores":
            raise TrainingDataError("--kl-weight needs per-document teacher 'scores' ([s(q,pos), s(q,neg)...]): "
                                    "add --teacher or train on rows that carry them")
        return loss
    if loss == "infonce" and data.label_kind is not None:
        logger.warning("rows carry teacher scores but loss is infonce: the scores are ignored")
        data.label_kind = None
    return loss


def build_loss(model, loss: str, config: TrainConfig, idf: dict[str, float] | None = None):
    """``SpladeLoss`` around the ranking loss; the query regulariser is off for inference-free models.

    ``config.kl_weight`` > 0 adds a KL term to InfoNCE; ``config.idf_flops`` weights the document FLOPS by
    ``1 / idf`` (``idf``: the inference-free query side's weights), see :mod:`.losses`.
    """
    from sentence_transformers.sparse_encoder import losses

    from .losses import IdfFlopsLoss, InfoNCEWithKL, idf_penalty_weights

    if loss == "infonce" and config.kl_weight > 0:
        base = InfoNCEWithKL(model, config.kl_weight, config.kl_temperature)
    elif loss == "infonce":
        base = losses.SparseMultipleNegativesRankingLoss(model)
    elif loss == "marginmse":
        base = losses.SparseMarginMSELoss(model)
    elif loss == "kldiv":
        base = losses.SparseDistillKLDivLoss(model, temperature=config.kl_temperature)
    else:
        raise ValueError(f"loss must be one of infonce, marginmse, kldiv, got {loss!r}")
    query_weight = None if config.inference_free else config.query_regularizer_weight
    document_regularizer = None
    if config.idf_flops:
        if not idf:
            raise ValueError("idf_flops needs the IDF of the inference-free query side")
        size = model.get_sentence_embedding_dimension()
        document_regularizer = IdfFlopsLoss(model, idf_penalty_weights(idf, model.tokenizer.get_vocab(), size))
    return losses.SpladeLoss(model, loss=base, document_regularizer_weight=config.document_regularizer_weight,
                             query_regularizer_weight=query_weight, document_regularizer=document_regularizer)


def _query_side_idf(config: TrainConfig, workdir: Path) -> dict[str, float] | None:
    """The IDF weights of the inference-free query side being trained against (for ``idf_flops``)."""
    from ..idf import load_idf
    from ..transfer.surgery import resolve_model_path

    for candidate in (config.idf, workdir / "inference_free_start" / "idf.json",
                      Path(resolve_model_path(config.model)) / "idf.json"):
        if candidate and Path(candidate).is_file():
            return load_idf(candidate)
    return None


def _is_router_dir(path: str) -> bool:
    modules = Path(path) / "modules.json"
    return modules.exists() and any(str(m.get("type", "")).endswith("Router") for m in read_json(modules))


def load_start_model(config: TrainConfig, data: TrainingData, workdir: Path):
    """The starting ``SparseEncoder``; for the inference-free variant a ``Router`` with an IDF query side
    (from ``config.idf``, else computed on the BEIR corpus, else on the training documents).

    Its fill-mask modules are cut to ``config.max_seq_length`` for training; their saved (inference)
    lengths are kept in ``model.lsr_inference_lengths`` so :func:`train` can restore them.
    """
    from ..transfer.surgery import TransferInputError, load_sparse_encoder, resolve_model_path

    path = resolve_model_path(config.model)
    if config.inference_free and _milco_dir(path):
        raise TransferInputError(f"{config.model!r} is a MILCO model: --inference-free (an IDF query side over one "
                                 "vocabulary) does not apply; its export's sparse_tokenize.zip already queries the "
                                 "source view")
    if config.inference_free and not _is_router_dir(path):
        from ..inference_free import build_inference_free

        idf_corpus = None
        if config.idf is None:
            if data.corpus is not None:
                idf_corpus = list(data.corpus.values())
            else:
                idf_corpus = list({t for r in data.rows for t in [r["positive"], *r["negatives"]]})
        try:
            model = build_inference_free(path, workdir / "inference_free_start", idf=config.idf, idf_corpus=idf_corpus)
        except (OSError, ValueError) as err:
            raise TransferInputError(f"could not build the inference-free model from {config.model!r}: {err}") from err
    else:
        model = load_sparse_encoder(path)
        if config.inference_free is False and _is_router_dir(path):
            raise TransferInputError(f"{config.model!r} is an inference-free (Router) model: pass --inference-free")
    _freeze_milco_encoder(model, config)
    model.lsr_inference_lengths = _get_max_seq_length(model)
    _set_max_seq_length(model, config.max_seq_length)
    for static in _static_query_modules(model):
        # frozen IDF unless --query-lr (a saved Router remembers whether it was trained last time)
        static.frozen = not config.query_lr > 0
        static.weight.requires_grad_(config.query_lr > 0)
    return model


def _static_query_modules(model) -> list:
    from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding

    return [m for m in model.modules() if isinstance(m, SparseStaticEmbedding)]


def _query_lr_mapping(model, config: TrainConfig) -> dict[str, float]:
    """sentence-transformers' ``learning_rate_mapping`` for the learned IDF query weights."""
    if not config.query_lr > 0:
        return {}
    weights = {id(m.weight) for m in _static_query_modules(model)}
    names = [n for n, p in model.named_parameters() if id(p) in weights]
    return {re.escape(n) + "$": config.query_lr for n in names}


#: Learned IDF weights are kept in (0, 64]: ML Commons reads a token missing from ``idf.json`` as 1.0
#: (so a weight of 0 cannot be dropped from the file), and neural_sparse rejects query weights outside (0, 64].
QUERY_WEIGHT_RANGE = (1e-3, 64.0)


def _clamp_query_weights(model) -> None:
    with torch.no_grad():
        for static in _static_query_modules(model):
            static.weight.clamp_(*QUERY_WEIGHT_RANGE)


def _fill_mask_modules(model) -> list:
    # a Router's document Transformer keeps its own max length; a MILCO model's sequence module is its
    # multilingual encoder (a feature-extraction Transformer feeding the LexEchoHead)
    milco = _milco_encoder(model)
    return [m for m in model.modules()
            if hasattr(m, "max_seq_length") and (getattr(m, "transformer_task", None) == "fill-mask" or m is milco)]


def _freeze_milco_encoder(model, config: TrainConfig) -> None:
    """``config.freeze_encoder``: fix the MILCO encoder's word embeddings or the whole encoder."""
    if config.freeze_encoder == "none":
        return
    encoder = _milco_encoder(model)
    if encoder is None:
        raise ValueError(f"--freeze-encoder {config.freeze_encoder} is for MILCO models (lsr-os transfer milco), "
                         f"and {config.model!r} is not one")
    frozen = encoder.auto_model.get_input_embeddings() if config.freeze_encoder == "embeddings" else encoder
    for param in frozen.parameters():
        param.requires_grad_(False)


def _enter_state_cache(stack: contextlib.ExitStack, model, config: TrainConfig, dataset) -> dict[str, Any] | None:
    """``--freeze-encoder all`` on a MILCO model: fill the encoder-state cache with every training text and
    serve the encoder from it until ``stack`` closes (:mod:`opensearch_lsr.multilingual.cached_encoder`)."""
    if config.freeze_encoder != "all" or not config.state_cache or _milco_encoder(model) is None:
        return None
    from ..multilingual.cached_encoder import cached_encoder, milco_texts_of_dataset

    if config.fused:  # the head's pivot view without the [B, L, V_en] logits (same numbers)
        from .fused_splade import splade_max_pool

        head = model[1]
        head.pivot_pool = splade_max_pool
        stack.callback(setattr, head, "pivot_pool", None)
    # texts outside the training set (a dev evaluator's) are computed on the fly, not stored
    return stack.enter_context(cached_encoder(model, milco_texts_of_dataset(dataset), config.max_seq_length,
                                              compute_missing=True, desc="encoder states (training texts)"))


def _milco_dir(path: str) -> bool:
    from ..multilingual.milco import is_milco_dir

    return is_milco_dir(path)


def _milco_encoder(model):
    """The encoder Transformer of a MILCO model (``[Transformer, LexEchoHead]``), else ``None``."""
    from ..multilingual.lexecho import LexEchoHead

    modules = list(model) if hasattr(model, "__iter__") else []
    if len(modules) >= 2 and isinstance(modules[1], LexEchoHead):
        return modules[0]
    return None


def _get_max_seq_length(model) -> list[int | None]:
    return [m.max_seq_length for m in _fill_mask_modules(model)]


def _set_max_seq_length(model, length: int | list[int | None]) -> None:
    modules = _fill_mask_modules(model)
    lengths = length if isinstance(length, list) else [length] * len(modules)
    for module, value in zip(modules, lengths):
        module.max_seq_length = value
    if not isinstance(length, list):
        model.max_seq_length = length


def _save_idf_files(model, config: TrainConfig, workdir: Path, out: Path) -> None:
    """Keep ``idf.json`` (what export's ``sparse_tokenize.zip`` needs) and the assembly config next to
    the fine-tuned doc-only model: the frozen IDF is copied unchanged, learned weights are written."""
    from ..inference_free import InferenceFreeConfig, idf_from_weights
    from ..transfer.surgery import resolve_model_path

    built = workdir / "inference_free_start"
    src = built if built.is_dir() else Path(resolve_model_path(config.model))
    names = [InferenceFreeConfig.FILENAME]
    statics = _static_query_modules(model)
    if config.query_lr > 0 and statics:
        write_json(out / "idf.json", idf_from_weights(statics[0].tokenizer, statics[0].weight))
    else:
        names.append("idf.json")
    for name in names:
        if (src / name).exists():
            shutil.copyfile(src / name, out / name)


def _dev_evaluator(config: TrainConfig, data: TrainingData, subset: bool) -> RetrievalDevEvaluator | None:
    if not config.eval_split or data.kind != "beir":
        return None
    root = Path(config.dataset)
    if not (root / "qrels" / f"{config.eval_split}.tsv").exists():
        logger.warning("no qrels for eval split %r: no dev evaluation", config.eval_split)
        return None
    from ..evaluation.datasets import load_beir

    dev = load_beir(root, config.eval_split)
    if subset:
        dev = subset_dataset(dev, config.eval_queries, config.eval_corpus, seed=config.seed)
    return RetrievalDevEvaluator(dev, name=f"{config.eval_split}" + ("_subset" if subset else ""))


def train(config: TrainConfig, skip_bad_rows: bool = False) -> TrainResult:
    """Run a fine-tuning job described by ``config``; returns the summary (also written to ``out``)."""
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sparse_encoder import (
        SparseEncoderTrainer,
        SparseEncoderTrainingArguments,
    )
    from sentence_transformers.sparse_encoder.callbacks.splade_callbacks import (
        SpladeRegularizerWeightSchedulerCallback,
    )
    from transformers.trainer_utils import get_last_checkpoint

    config.validate()
    if config.bf16 and not torch.cuda.is_available():
        raise ValueError("bf16 needs a CUDA GPU (none is visible); drop --bf16")
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)

    data = load_training_data(config.dataset, config.split, skip_bad_rows=skip_bad_rows, max_pairs=config.max_pairs,
                              queries_from=config.queries_from, holdout=config.holdout_queries, seed=config.seed)
    if data.holdout:
        write_json(out / HOLDOUT_FILE, {"dataset": str(config.dataset), "split": config.split, "seed": config.seed,
                                        "query_ids": data.holdout})
    if config.teacher:
        data = mine_teacher_negatives(data, config.teacher, num_negatives=config.teacher_negatives,
                                      range_min=config.teacher_min_rank,
                                      range_max=config.teacher_depth, margin=config.teacher_margin,
                                      temperature=config.teacher_temperature,
                                      seed=config.seed)
    loss_name = _resolve_loss(config, data)
    workdir = Path(tempfile.mkdtemp(prefix="lsr-train-"))
    restore = contextlib.ExitStack()  # undoes the encoder-state cache swap (MILCO, --freeze-encoder all)
    try:
        model = load_start_model(config, data, workdir)
        # ``max_seq_length`` is a training-time cost knob: the saved model and the full-dev evaluation keep
        # the starting model's inference length, so fine-tuned figures compare like with like with zero-shot.
        inference_lengths = model.lsr_inference_lengths
        if config.hard_negatives == "bm25":
            if data.num_negatives:
                raise TrainingDataError("rows already carry negatives; drop --hard-negatives")
            data = mine_bm25_negatives(data, model.tokenizer, seed=config.seed)
        train_dataset = data.to_dataset()
        loss = build_loss(model, loss_name, config, _query_side_idf(config, workdir) if config.idf_flops else None)

        subset_eval = _dev_evaluator(config, data, subset=True)
        state_cache = _enter_state_cache(restore, model, config, train_dataset)
        ckpt_dir = out / CHECKPOINT_DIR
        resume_from = get_last_checkpoint(str(ckpt_dir)) if (config.resume and ckpt_dir.is_dir()) else None
        if config.resume and resume_from is None:
            logger.warning("--resume: no checkpoint in %s, starting from the beginning", ckpt_dir)
        router_mapping = None
        if config.inference_free:
            router_mapping = {c: ("query" if c == "query" else "document")
                              for c in train_dataset.column_names if c != "label"}
        args = SparseEncoderTrainingArguments(
            output_dir=str(ckpt_dir),
            num_train_epochs=config.epochs,
            max_steps=config.max_steps,
            per_device_train_batch_size=config.batch_size,
            learning_rate=config.lr,
            warmup_steps=config.warmup_ratio,  # transformers v5: a float < 1 is a ratio
            weight_decay=config.weight_decay,
            logging_steps=config.logging_steps,
            logging_first_step=True,
            save_strategy="steps" if config.save_steps else "no",
            save_steps=config.save_steps or 500,
            save_total_limit=config.save_total_limit,
            eval_strategy="steps" if (config.eval_steps and subset_eval is not None) else "no",
            eval_steps=config.eval_steps or None,
            bf16=config.bf16,
            use_cpu=not torch.cuda.is_available(),
            seed=config.seed,
            data_seed=config.seed,
            report_to="none",
            dataloader_num_workers=0,
            disable_tqdm=not logger.isEnabledFor(logging.INFO),
            # in-batch negatives: a duplicate text in a batch would be a false negative
            batch_sampler=BatchSamplers.NO_DUPLICATES if loss_name == "infonce" else BatchSamplers.BATCH_SAMPLER,
            router_mapping=router_mapping or {},
            learning_rate_mapping=_query_lr_mapping(model, config),
        )
        log_cb = LossLogCallback(out / LOSS_LOG_FILE)
        reg_cb = SpladeRegularizerWeightSchedulerCallback(loss, warmup_ratio=config.regularizer_warmup_ratio)
        trainer = SparseEncoderTrainer(model=model, args=args, train_dataset=train_dataset, loss=loss,
                                       evaluator=subset_eval, callbacks=[reg_cb, log_cb])
        fused = fused_splade(model) if config.fused else contextlib.nullcontext(0)
        with fused:
            initial = None
            if subset_eval is not None and resume_from is None:
                subset_eval(model, steps=0)
                initial = dict(subset_eval.history[-1])
            start = time.perf_counter()
            state = trainer.train(resume_from_checkpoint=resume_from)
            train_seconds = time.perf_counter() - start
            if subset_eval is not None and not config.eval_steps:
                subset_eval(model, steps=trainer.state.global_step)
            restore.close()  # the original encoder module back: the saved model is encoder + trained head
            _set_max_seq_length(model, inference_lengths)
            if config.query_lr > 0:
                _clamp_query_weights(model)
            model.save(str(out))
            if config.inference_free:
                _save_idf_files(model, config, workdir, out)
            final_dev = None
            final_seconds = None
            if config.final_eval:
                full_eval = _dev_evaluator(config, data, subset=False)
                if full_eval is not None:
                    t0 = time.perf_counter()
                    full_eval(model, steps=trainer.state.global_step)
                    final_dev = dict(full_eval.history[-1])
                    final_seconds = time.perf_counter() - t0
    finally:
        restore.close()
        shutil.rmtree(workdir, ignore_errors=True)

    rows = read_loss_log(out / LOSS_LOG_FILE) if (out / LOSS_LOG_FILE).exists() else []
    losses_seen = [r["base_loss"] for r in rows if "base_loss" in r]
    result = TrainResult(
        out=out, steps=trainer.state.global_step, train_seconds=round(train_seconds, 2), pairs=len(data.rows),
        loss=loss_name, first_loss=losses_seen[0] if losses_seen else None,
        last_loss=losses_seen[-1] if losses_seen else None, initial_dev_subset=initial,
        dev_subset_history=subset_eval.history if subset_eval is not None else [],
        final_dev=final_dev, final_eval_seconds=round(final_seconds, 2) if final_seconds else None,
        resumed_from=resume_from,
    )
    if rows:
        plot_loss_curves({Path(config.model).name or config.model: rows}, out / LOSS_PNG_FILE,
                         title=f"{loss_name} + FLOPS, {trainer.state.global_step} steps x batch {config.batch_size} "
                               f"(of {len(data.rows)} pairs)")
    config.save(out, extra={"pairs": len(data.rows), "skipped_rows": len(data.skipped), "resolved_loss": loss_name,
                            "num_negatives": data.num_negatives, "train_runtime_s": round(train_seconds, 2),
                            "train_loss": getattr(state, "training_loss", None), "state_cache": state_cache})
    write_json(out / SUMMARY_FILE, result.to_dict())
    return result
