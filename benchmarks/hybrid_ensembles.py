"""Where the hybrid with nori stops: ensembles of trained models, each way OpenSearch can combine them.

For two or more trained inference-free models of one vocabulary (``relevance_recipes.py train`` builds them)
this measures on MS MARCO-ko, beside nori BM25 measured in the same run:

- each model alone and in the hybrid with nori;
- their document vectors summed in one field, model ``i``'s vectors scaled by a weight (the first model's IDF
  query tokens: one ``neural_sparse`` clause), weights from a grid, chosen on the 500 held-out train queries;
- the same sum with each model's own IDF query tokens (a ``bool`` of one ``neural_sparse`` clause per field);
- one hybrid query with nori and every model as its own sub-query (neural-search fuses up to five), min-max, z-score
  or L2 weights on a 0.05 simplex at depths 10 / 50 / 100, chosen on the held-out queries and fused on dev
  with :class:`~opensearch_lsr.lexical.fusion.HybridFusion`, as the search pipeline would;
- recall@100 of nori, of the summed model and of their union: how much of the hybrid's loss is ordering.

Every two-sub-query hybrid is tuned as in ``relevance_vs_nori.md`` (min-max weights step 0.05, RRF 1-100,
depths 10 / 50 / 100 on the held-out queries, then measured once on dev). Scores are exact dot products over
the whole corpus (what the local index returns, ties aside).

    python benchmarks/hybrid_ensembles.py --models runs/rel/l-klq2cr10p6s7-hn-kl-qlr runs/rel/l-e5c-hn-kl-qlr \
        --md benchmarks/results/hybrid_ensembles.md
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

import harness
from harness import ROOT

sys.path.insert(0, str(ROOT))

__all__ = ["main", "simplex"]

SPLITS = ("holdout", "dev")


def simplex(parts: int, step: float) -> list[tuple[float, ...]]:
    """Every weight vector of ``parts`` non-negative multiples of ``step`` summing to 1."""
    n = int(round(1.0 / step))
    return [tuple(round(c / n, 10) for c in combo) for combo in itertools.product(range(n + 1), repeat=parts)
            if sum(combo) == n]


def _encode(model: str, texts: list[str], sets: dict):
    """The model's document CSR over the corpus and its IDF query CSR per query set (one vocabulary)."""
    import scipy.sparse as sp

    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder
    from opensearch_lsr.encoding.keyed import SparseKeyedEncoder
    from opensearch_lsr.encoding.query_tokens import tokenize_query
    from opensearch_lsr.idf import load_idf
    from opensearch_lsr.inference_free import inference_free_parts, is_inference_free

    encoder = SparseDocumentEncoder(str(inference_free_parts(model)[0]) if is_inference_free(model) else model)
    vecs = encoder.encode(texts)
    indptr = np.cumsum([0] + [len(v.ids) for v in vecs])
    docs = sp.csr_matrix((np.concatenate([v.weights for v in vecs]), np.concatenate([v.ids for v in vecs]), indptr),
                         shape=(len(vecs), len(encoder.keys)))
    tokenizer, idf = SparseKeyedEncoder(model).model.tokenizer, load_idf(Path(model) / "idf.json")
    vocab = {k: i for i, k in enumerate(encoder.keys)}
    queries = {}
    for name, (_, qtexts) in sets.items():
        rows = [[(vocab[k], v) for k, v in tokenize_query(t, tokenizer, idf).items() if v > 0 and k in vocab]
                for t in qtexts]
        queries[name] = sp.csr_matrix(([v for row in rows for _, v in row], [i for row in rows for i, _ in row],
                                       np.cumsum([0] + [len(row) for row in rows])), shape=(len(rows), docs.shape[1]))
    return tuple(encoder.keys), docs, queries


def _top100(scores: np.ndarray, qids: list[str], doc_ids: list[str]) -> dict[str, list]:
    top = np.argsort(-scores, axis=1, kind="stable")[:, :100]
    return {q: [(doc_ids[i], float(scores[r, i])) for i in top[r] if scores[r, i] > 0] for r, q in enumerate(qids)}


def _multi_hybrid(bm25: dict, runs: list[dict], qrels: dict, techniques: list[str], step: float) -> dict:
    """nori plus every run as its own sub-query: weights and depth chosen on held-out, fused once on dev."""
    from opensearch_lsr.evaluation.metrics import evaluate_run
    from opensearch_lsr.lexical.fusion import HybridFusion, normalise_scores
    from relevance_report import _as_run

    subs = [bm25, *runs]
    grid = np.asarray(simplex(len(subs), step), np.float32)
    best = None
    for technique, depth in itertools.product(techniques, (10, 50, 100)):
        tops = []
        for q in qrels["holdout"]:
            lists = [sub["holdout"].get(q, [])[:depth] for sub in subs]
            keys: dict[str, int] = {}
            for hits in lists:
                for d, _ in hits:
                    keys.setdefault(d, len(keys))
            m = np.zeros((len(subs), len(keys)), np.float32)
            for i, hits in enumerate(lists):
                if hits:
                    m[i, [keys[d] for d, _ in hits]] = normalise_scores(technique,
                                                                        np.asarray([s for _, s in hits], np.float32))
            combined = grid @ m
            docs = list(keys)
            tops.append((q, [[docs[j] for j in np.argsort(-row, kind="stable")[:10]] for row in combined]))
        for g, weights in enumerate(grid):
            run = {q: {d: float(10 - r) for r, d in enumerate(top[g])} for q, top in tops}
            mrr = evaluate_run(qrels["holdout"], run, {"mrr@10": "mrr@10"})["mrr@10"]
            if best is None or mrr > best[0]:
                best = (mrr, technique, depth, tuple(float(w) for w in weights))
    mrr, technique, depth, weights = best
    fusion = HybridFusion(technique, weights)
    fused = {q: fusion.fuse([sub["dev"][q][:depth] for sub in subs], size=100) for q in qrels["dev"]}
    name = {"min_max": "min-max", "z_score": "z-score", "l2": "l2"}[technique]
    return {"label": f"{name} {'/'.join(f'{w:g}' for w in weights)}, depth {depth}", "holdout_mrr@10": mrr,
            **evaluate_run(qrels["dev"], _as_run(fused))}


def _recall100(runs: list[dict], qrels: dict) -> float:
    found = 0
    for q, rels in qrels.items():
        hits = {d for run in runs for d, _ in run.get(q, [])[:100]}
        found += any(g > 0 and d in hits for d, g in rels.items())
    return found / len(qrels)


def main(argv: list[str] | None = None) -> dict:
    from opensearch_lsr.evaluation.metrics import evaluate_run
    from relevance_report import _as_run, _bm25, _hybrid, dev_and_holdout

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", required=True, help="Two or more trained inference-free model dirs.")
    p.add_argument("--weights", default="0.5,0.75,1,1.25,1.5",
                   help="Scales tried for each model after the first in the summed field (1 is always tried) "
                        "[%(default)s].")
    p.add_argument("--techniques", default="min_max,z_score,l2", help="Fusions tried for the multi-sub-query hybrid.")
    p.add_argument("--data", default=None, help="MS MARCO-ko dir [default: the shared data's msmarco-ko].")
    p.add_argument("--work", default="runs/hybrid-ensembles", help="Where nori's local index goes.")
    p.add_argument("--md", default=None, help="Markdown results (a JSON beside it).")
    args = p.parse_args(argv)
    if len(args.models) < 2:
        p.error("--models needs two or more models")
    args.data, sets, dev, qrels = dev_and_holdout(args.data)
    doc_ids = list(dev.corpus)
    texts = [dev.corpus[d] for d in doc_ids]
    bm25, _, _ = _bm25(args.data, sets, Path(args.work))
    names = [Path(m).name for m in args.models]
    t0 = time.perf_counter()
    encoded = [_encode(m, texts, sets) for m in args.models]
    if len({keys for keys, _, _ in encoded}) != 1:
        raise SystemExit(f"{names} do not share one vocabulary: their vectors cannot be summed")
    encode_s = time.perf_counter() - t0
    # scores[i][split][q, d] = model i's documents under model i's own queries / under the first model's queries
    own = [{s: (queries[s] @ docs.T).toarray().astype(np.float32) for s in SPLITS} for _, docs, queries in encoded]
    first = own[:1] + [{s: (encoded[0][2][s] @ docs.T).toarray().astype(np.float32) for s in SPLITS}
                       for _, docs, _ in encoded[1:]]

    def measure(label: str, scores: dict) -> dict:
        runs = {s: _top100(scores[s], sets[s][0], doc_ids) for s in SPLITS}
        alone = {s: evaluate_run(qrels[s], _as_run(runs[s])) for s in SPLITS}
        return {"row": label, "runs": runs, "holdout_mrr@10": alone["holdout"]["mrr@10"], **alone["dev"],
                "hybrid": _hybrid(bm25, runs, qrels["holdout"], qrels["dev"])}

    rows = [measure(f"`{n}` alone", own[i]) for i, n in enumerate(names)]
    scales = sorted({1.0, *(float(w) for w in args.weights.split(","))})  # the equal-weight sum is always tried
    for query_side, scores in (("the first model's query tokens", first), ("each model's own query tokens", own)):
        tried = {ws: measure(f"sum, {query_side}, scales {'/'.join(f'{w:g}' for w in (1.0, *ws))}",
                             {s: sum(w * sc[s] for w, sc in zip((1.0, *ws), scores)) for s in SPLITS})
                 for ws in itertools.product(scales, repeat=len(names) - 1)}
        equal = tried[(1.0,) * (len(names) - 1)]
        tried = list(tried.values())
        by_alone = max(tried, key=lambda r: r["holdout_mrr@10"])
        by_hybrid = max(tried, key=lambda r: r["hybrid"]["holdout_mrr@10"])
        rows.append(equal)
        if by_alone is by_hybrid and by_alone is not equal:
            rows.append(dict(by_alone, row=by_alone["row"] + " (best alone and hybrid on held-out)"))
        else:
            rows += [dict(r, row=r["row"] + f" (best {why} on held-out)") for r, why in
                     ((by_alone, "alone"), (by_hybrid, "hybrid")) if r is not equal]
    multi = _multi_hybrid(bm25, [rows[i]["runs"] for i in range(len(names))], qrels,
                          args.techniques.split(","), 0.05)
    nori = {s: evaluate_run(qrels[s], _as_run(bm25[s])) for s in SPLITS}
    summed = next(r for r in rows if r["row"].startswith("sum, the first") and "best" not in r["row"])
    recall = {"nori BM25": _recall100([bm25["dev"]], qrels["dev"]),
              "summed models": _recall100([summed["runs"]["dev"]], qrels["dev"]),
              "union of the two": _recall100([bm25["dev"], summed["runs"]["dev"]], qrels["dev"])}
    table = harness.markdown_table(
        ["row", "alone: held-out MRR@10", "alone: dev MRR@10", "hybrid with nori: setting (held-out)",
         "hybrid: held-out MRR@10", "hybrid: dev MRR@10"],
        [["nori BM25 (same run)", nori["holdout"]["mrr@10"], nori["dev"]["mrr@10"], "-", "-", "-"]]
        + [[r["row"], r["holdout_mrr@10"], r["mrr@10"], r["hybrid"]["label"], r["hybrid"]["holdout_mrr@10"],
            r["hybrid"]["mrr@10"]] for r in rows]
        + [[f"one hybrid query: nori + {len(names)} sub-queries (weights nori/{'/'.join(names)})", "-", "-",
            multi["label"], multi["holdout_mrr@10"], multi["mrr@10"]]], floats=".4f")
    md = (f"# Ensembles of trained models and the hybrid with nori (MS MARCO-ko)\n\n"
          f"Models: {', '.join(f'`{m}`' for m in args.models)} (encoded in {encode_s:.0f} s). Settings chosen on the "
          f"500 held-out train queries, measured once on dev (1,000 queries); nori BM25 measured in this run.\n\n"
          f"{table}\n\nDev recall@100: " + ", ".join(f"{k} {v:.3f}" for k, v in recall.items()) + "\n")
    print(md)
    payload = {"models": args.models, "encode_s": encode_s, "recall@100": recall, "multi_hybrid": multi,
               "nori": {s: nori[s]["mrr@10"] for s in SPLITS},
               "rows": [{k: v for k, v in r.items() if k != "runs"} for r in rows]}
    if args.md:
        harness.write_results(Path(args.md).with_suffix(""), payload, md, harness.run_info())
    return payload


if __name__ == "__main__":
    main()
