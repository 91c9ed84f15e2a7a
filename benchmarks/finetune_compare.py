"""Does the starting point still matter after fine-tuning?  SemBridge vs VT vs random/mean init.

For every starting encoder (``label=DIR``): zero-shot dev MRR@10 / nDCG@10, then the same fine-tuning
budget (``lsr-os train`` defaults unless overridden), then dev MRR@10 / nDCG@10 again, with wall times,
the first/last logged InfoNCE loss, and one PNG with every run's loss curves. Ratios are printed
against the ``--baseline`` start measured in the same run. ``--inference-free`` repeats it for the
doc-only variant (IDF query side).

    python benchmarks/finetune_compare.py --data ../shared/data/msmarco-ko \
        --start sembridge=runs/ft/init_sembridge --start random=runs/ft/init_random \
        --start mean=runs/ft/init_mean --baseline random --out runs/ft/compare

Dev figures come from ``--dev-queries`` queries over ``--dev-corpus`` documents (0 = the full split /
whole corpus); say which when quoting them.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

from opensearch_lsr.config import write_json
from opensearch_lsr.evaluation.datasets import load_beir
from opensearch_lsr.evaluation.retrieval import evaluate_encoder
from opensearch_lsr.training import TrainConfig, fused_splade, plot_loss_curves, read_loss_log, subset_dataset, train

logger = logging.getLogger("finetune_compare")


def zero_shot(model_dir: str, dev, inference_free: bool, corpus_texts: list[str]) -> tuple[dict, float]:
    from opensearch_lsr.transfer.surgery import load_sparse_encoder

    t0 = time.perf_counter()
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
    return metrics, time.perf_counter() - t0


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
    ap.add_argument("--max-seq-length", type=int, default=128)
    ap.add_argument("--dev-queries", type=int, default=0, help="dev queries for zero-shot/final figures (0 = all)")
    ap.add_argument("--dev-corpus", type=int, default=0, help="dev corpus size (0 = whole corpus)")
    ap.add_argument("--eval-steps", type=int, default=0, help="dev-subset eval every N steps during training")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)

    starts = dict(s.split("=", 1) for s in args.start)
    baseline = args.baseline or list(starts)[-1]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev_full = load_beir(args.data, "dev")
    dev = subset_dataset(dev_full, args.dev_queries, args.dev_corpus, seed=42)
    corpus_texts = list(dev_full.corpus.values())
    variant = "inference-free" if args.inference_free else "splade"
    results: dict[str, dict] = {}
    for label, model_dir in starts.items():
        zs, zs_s = zero_shot(model_dir, dev, args.inference_free, corpus_texts)
        logger.info("%s zero-shot: %s (%.0f s)", label, zs, zs_s)
        run_dir = out / f"{variant}-{label}"
        cfg = TrainConfig(model=model_dir, dataset=args.data, out=str(run_dir), inference_free=args.inference_free,
                          max_pairs=args.max_pairs, epochs=args.epochs, max_steps=args.max_steps,
                          batch_size=args.batch_size, lr=args.lr, max_seq_length=args.max_seq_length,
                          eval_queries=args.dev_queries, eval_corpus=args.dev_corpus, eval_steps=args.eval_steps,
                          final_eval=False, threads=args.threads)
        res = train(cfg)
        final = res.dev_subset_history[-1] if res.dev_subset_history else {}
        results[label] = {"start": model_dir, "zero_shot": zs, "zero_shot_eval_s": round(zs_s, 1),
                          "fine_tuned": final, "train_s": res.train_seconds, "steps": res.steps,
                          "pairs": res.pairs, "first_loss": res.first_loss, "last_loss": res.last_loss}
        write_json(out / f"results-{variant}.json", {"args": vars(args), "dev_queries": len(dev.queries),
                                                      "dev_corpus": len(dev.corpus), "results": results})
        logger.info("%s fine-tuned: %s", label, results[label])

    logs = {label: read_loss_log(out / f"{variant}-{label}" / "loss_log.jsonl") for label in results}
    plot_loss_curves(logs, out / f"loss_curves-{variant}.png", title=f"{variant}: fine-tuning loss by starting point")
    base = results.get(baseline)
    print(f"\n{variant}: dev {len(dev.queries)} queries x {len(dev.corpus)} docs; baseline = {baseline}")
    print("| start | zero-shot MRR@10 | nDCG@10 | fine-tuned MRR@10 | nDCG@10 | x baseline (FT MRR) | first loss | "
          "last loss | train s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, r in results.items():
        ft = r["fine_tuned"].get("mrr@10", float("nan"))
        ratio = ft / base["fine_tuned"]["mrr@10"] if base and base["fine_tuned"].get("mrr@10") else float("nan")
        print(f"| {label} | {r['zero_shot']['mrr@10']:.3f} | {r['zero_shot']['ndcg@10']:.3f} | {ft:.3f} | "
              f"{r['fine_tuned'].get('ndcg@10', float('nan')):.3f} | {ratio:.2f} | {r['first_loss']:.3f} | "
              f"{r['last_loss']:.3f} | {r['train_s']:.0f} |")
    print(json.dumps({k: {"zs": v["zero_shot"]["mrr@10"], "ft": v["fine_tuned"].get("mrr@10")}
                      for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
