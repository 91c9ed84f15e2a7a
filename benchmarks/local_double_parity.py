"""Parity of the local backend with the OpenSearch HTTP test double on real vectors.

The same documents (SemBridge document vectors of MS MARCO-ko passages) go into a fresh
``LocalIndex`` and, through opensearch-py ``helpers.bulk``, into an index of the test double
(``tests/opensearch/double``: Lucene FeatureField 9-bit storage, ``neural_sparse`` scoring as
neural-search computes it). The same ``neural_sparse`` bodies (bi-encoder ``query_tokens`` and
inference-free IDF ``query_tokens``, top-10) are sent to both; the script reports the number of
queries, hits compared, max |score difference| and how many rankings are identical.

    python benchmarks/local_double_parity.py --index runs/query_side/sem-index \
        --inference-free runs/query_side/sembridge-inference-free --max-docs 2000 --max-queries 200

``--index`` is a filled local index (e.g. the SemBridge index made by query_side_table.py); its raw
document vectors are re-used (no re-encoding). Without it the passages are encoded here.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness import ROOT, Stages, load_dataset, set_threads, write_results


def _tie_canonical(hits: list[tuple[str, float]], rel: float = 1e-5) -> list[tuple[str, ...]]:
    """Hits as groups of (near-)equal scores, each group's ids sorted: equal for two rankings that
    differ only in how ties are broken (the double orders ties by _id, the local index and Lucene
    by index order)."""
    groups: list[list[str]] = []
    last = None
    for did, score in hits:
        if last is None or abs(score - last) > rel * max(abs(last), 1e-12):
            groups.append([])
        groups[-1].append(did)
        last = score
    return [tuple(sorted(g)) for g in groups]


def _doc_vectors(args, ds, doc_ids: list[str], encoder) -> list[dict[str, float]]:
    """The documents' vectors: re-used from ``--index`` (no re-encoding), else encoded here."""
    from opensearch_lsr.encoding.keyed import csr_rows_to_dicts
    from opensearch_lsr.evaluation.pipeline import VECTOR_FIELD
    from opensearch_lsr.local.index import LocalIndex

    if args.index:
        src = LocalIndex.open(args.index)
        mat, ids, terms = src.doc_matrix(VECTOR_FIELD, truncated=False)
        pos = {d: i for i, d in enumerate(ids)}
        missing = [d for d in doc_ids if d not in pos]
        if missing:
            raise SystemExit(f"{len(missing)} documents are not in {args.index}")
        return csr_rows_to_dicts(mat[[pos[d] for d in doc_ids]], terms)
    return csr_rows_to_dicts(encoder.to_csr([ds.corpus[d] for d in doc_ids], "document"), encoder.keys)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="MS MARCO-ko dir (default: shared data)")
    ap.add_argument("--model", default="runs/bench_sembridge/models/SemBridge_alpha4")
    ap.add_argument("--inference-free", default=None, help="inference-free model dir (adds IDF-token queries)")
    ap.add_argument("--index", default=None, help="filled local index whose vectors are re-used")
    ap.add_argument("--max-docs", type=int, default=2000)
    ap.add_argument("--max-queries", type=int, default=200)
    ap.add_argument("--size", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/parity")
    args = ap.parse_args()
    import tempfile

    set_threads(args.threads)
    sys.path.insert(0, str(ROOT / "tests" / "opensearch"))
    from double.fixtures import make_double
    from opensearchpy import helpers

    from opensearch_lsr.encoding.keyed import SparseKeyedEncoder
    from opensearch_lsr.engines.query_dsl import neural_sparse_query, search_body
    from opensearch_lsr.evaluation.pipeline import TEXT_FIELD, VECTOR_FIELD
    from opensearch_lsr.local.index import LocalIndex
    from opensearch_lsr.opensearch.client import client_from_options

    ds = load_dataset(args.data, "dev", max_queries=args.max_queries, max_docs=args.max_docs)
    doc_ids = list(ds.corpus)
    encoder = SparseKeyedEncoder(args.model)
    stages = Stages()
    with stages("doc_vectors"):
        vectors = _doc_vectors(args, ds, doc_ids, encoder)

    qids = list(ds.queries)
    qtexts = [ds.queries[q] for q in qids]
    query_sets = {"bi-encoder query_tokens": encoder.encode(qtexts, "query")}
    if args.inference_free:
        query_sets["inference-free IDF query_tokens"] = SparseKeyedEncoder(args.inference_free).encode(qtexts, "query")

    mappings = {"properties": {TEXT_FIELD: {"type": "text"}, VECTOR_FIELD: {"type": "rank_features"}}}
    sources = [{TEXT_FIELD: ds.corpus[d], VECTOR_FIELD: v} for d, v in zip(doc_ids, vectors)]
    double = make_double("3.1.0")
    try:
        client = client_from_options(url=double.url, max_retries=1, timeout=120)
        client.indices.create(index="parity", body={"mappings": mappings})
        with stages("double_bulk"):
            helpers.bulk(client, ({"_index": "parity", "_id": d, "_source": s} for d, s in zip(doc_ids, sources)),
                         refresh=True, chunk_size=500)
        tmp = Path(tempfile.mkdtemp(prefix="parity_"))
        local = LocalIndex.create(tmp / "parity", mappings)
        with stages("local_bulk"):
            local.bulk({"_id": d, "_source": s} for d, s in zip(doc_ids, sources))
        results = {}
        for name, qdicts in query_sets.items():
            n_q = hits = same_rank = same_total = same_up_to_ties = 0
            max_diff = max_rel = 0.0
            clock = Stages()
            for qd in qdicts:
                tokens = {k: float(v) for k, v in qd.items() if v > 0}
                if not tokens:
                    continue
                body = search_body(neural_sparse_query(VECTOR_FIELD, query_tokens=tokens), size=args.size, source=False)
                with clock("double"):
                    remote = client.search(index="parity", body=body)["hits"]
                with clock("local"):
                    mine = local.search(body)["hits"]
                n_q += 1
                same_total += mine["total"]["value"] == remote["total"]["value"]
                r = [(h["_id"], h["_score"]) for h in remote["hits"]]
                m = [(h["_id"], h["_score"]) for h in mine["hits"]]
                same_rank += [d for d, _ in r] == [d for d, _ in m]
                same_up_to_ties += _tie_canonical(r) == _tie_canonical(m)
                hits += len(r)
                for (_, a), (_, b) in zip(r, m):
                    max_diff = max(max_diff, abs(a - b))
                    max_rel = max(max_rel, abs(a - b) / max(abs(a), 1e-12))
            results[name] = {"queries": n_q, "hits_compared": hits, "identical_rankings": same_rank,
                             "identical_up_to_tie_order": same_up_to_ties,
                             "identical_totals": same_total, "max_abs_score_diff": max_diff,
                             "max_rel_score_diff": max_rel, "local_search_s": clock.seconds.get("local", 0.0),
                             "double_search_s": clock.seconds.get("double", 0.0)}
    finally:
        double.stop()
    report = {"docs": len(doc_ids), "model": args.model, "size": args.size, "results": results,
              "timings_s": stages.seconds}
    write_results(Path(args.out) / "parity", report)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
