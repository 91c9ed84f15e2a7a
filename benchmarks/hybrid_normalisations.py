"""Hybrid of nori BM25 and a packed model, by fusion technique: tuned on the held-out train queries, measured on dev.

For each of neural-search's fusions (min-max, z-score, L2: weighted arithmetic mean; RRF) the weight / rank
constant and the sub-query depth are chosen on the 500 held-out train queries (``tune-hybrid``'s grid restricted
to that technique), then measured once on dev; the last row lets the tuning choose among all four, as
``lsr-os tune-hybrid --techniques min_max,z_score,l2,rrf`` would. nori BM25 is measured in the same run. The
model's runs come from a ``relevance_recipes.py train`` pack.

    python benchmarks/hybrid_normalisations.py --pack runs/dev/pack_cpu_p7.npz --model l-klq2cr10p6s7-hn-kl-qlr \
        --md benchmarks/results/hybrid_normalisations.md
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import harness
from harness import ROOT

sys.path.insert(0, str(ROOT))

__all__ = ["main"]

TECHNIQUES = ("min_max", "z_score", "l2", "rrf")


def main(argv: list[str] | None = None) -> dict:
    from opensearch_lsr.evaluation.hybrid_tuning import HybridGrid, HybridSetting, tune_on_runs
    from opensearch_lsr.evaluation.metrics import evaluate_run
    from relevance_report import _as_run, _bm25, _ranked, dev_and_holdout

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pack", required=True, help="A relevance_recipes.py pack (npz) holding the model's runs.")
    p.add_argument("--model", required=True, help="The model's name in the pack.")
    p.add_argument("--data", default=None, help="MS MARCO-ko dir [default: the shared data's msmarco-ko].")
    p.add_argument("--work", default="runs/hybrid-normalisations", help="Where nori's local index goes.")
    p.add_argument("--md", default=None, help="Markdown results (a JSON beside it).")
    args = p.parse_args(argv)
    args.data, sets, dev, qrels = dev_and_holdout(args.data)
    doc_ids = list(dev.corpus)
    pack = np.load(args.pack)
    model = {name: _ranked(pack[f"{args.model}__{name}_idx"], pack[f"{args.model}__{name}_score"], sets[name][0],
                           doc_ids) for name in ("dev", "holdout")}
    bm25, _, _ = _bm25(args.data, sets, Path(args.work))
    rows = []
    for techniques in [[t] for t in TECHNIQUES] + [list(TECHNIQUES)]:
        tuned = tune_on_runs(bm25["holdout"], model["holdout"], qrels["holdout"], HybridGrid(techniques=techniques))
        setting = HybridSetting(**tuned.best["setting"])
        fusion = setting.fusion()
        fused = {q: fusion.fuse([bm25["dev"][q][:setting.depth], model["dev"][q][:setting.depth]], size=100)
                 for q in qrels["dev"]}
        rows.append({"tried": ", ".join(techniques), "chosen": setting.label(), "holdout_mrr@10": tuned.best["mrr@10"],
                     **evaluate_run(qrels["dev"], _as_run(fused))})
    alone = {name: evaluate_run(qrels["dev"], _as_run(run["dev"]))["mrr@10"]
             for name, run in (("nori BM25", bm25), (args.model, model))}
    table = harness.markdown_table(
        ["techniques tried", "chosen on the held-out queries", "held-out MRR@10", "dev MRR@10", "dev nDCG@10"],
        [[r["tried"], r["chosen"], r["holdout_mrr@10"], r["mrr@10"], r["ndcg@10"]] for r in rows], floats=".4f")
    md = (f"# Hybrid of nori BM25 and `{args.model}` by fusion technique (MS MARCO-ko)\n\n"
          f"Alone on dev: nori BM25 {alone['nori BM25']:.4f} (measured in this run), `{args.model}` "
          f"{alone[args.model]:.4f}. Each technique's weight (step 0.05) or RRF constant (1-100) and depth "
          f"(10 / 50 / 100) chosen on the 500 held-out train queries, then measured once on dev (1,000 queries).\n\n"
          f"{table}\n")
    print(md)
    payload = {"model": args.model, "pack": args.pack, "alone_dev_mrr@10": alone, "rows": rows}
    if args.md:
        harness.write_results(Path(args.md).with_suffix(""), payload, md, harness.run_info())
    return payload


if __name__ == "__main__":
    main()
