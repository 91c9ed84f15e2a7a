"""Toolkit vs a real Lucene on the shared msmarco sets: the figures behind ``tests/lucene`` (not a test).

    PYTHONPATH=. python tests/lucene/measure.py [--passages 1500] [--queries 1000] [--out FILE]

1. nori tokens: ``NoriAnalyzer().analyze`` vs ``KoreanAnalyzer`` on the first ``--passages`` msmarco-ko passages
   + ``--queries`` dev queries (identical token sequences, token-level agreement by aligned diff);
2. BM25: ``LuceneBM25.build(corpus, NoriAnalyzer())`` vs Lucene ``LegacyBM25Similarity`` over the whole
   msmarco-ko corpus, dev queries: identical top-10 lists, top-10 overlap, MRR@10 of each, max score difference;
3. FeatureField: SPLADE-tiny document vectors of the first ``--passages`` msmarco-en passages in the local backend
   (``rank_features`` + ``neural_sparse`` query_tokens) vs Lucene ``FeatureField.newLinearQuery``, dev queries:
   identical top-10, max relative score difference.
"""
from __future__ import annotations

import argparse
import difflib
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lucene_runner import Lucene, clean  # noqa: E402


def mrr10(run: dict[str, list[str]], qrels: dict[str, dict[str, int]]) -> float:
    total = 0.0
    for q, rel in qrels.items():
        for rank, d in enumerate(run.get(q, [])[:10], start=1):
            if rel.get(d, 0) > 0:
                total += 1.0 / rank
                break
    return total / len(qrels)


def tokens(lucene: Lucene, ko, n_passages: int, n_queries: int) -> dict:
    from opensearch_lsr.lexical.nori import NoriAnalyzer

    texts = {f"p{i}": t for i, t in enumerate(list(ko.corpus.values())[:n_passages])}
    texts.update({f"q{i}": t for i, t in enumerate(list(ko.queries.values())[:n_queries])})
    ref = lucene.analyze(texts)
    nori = NoriAnalyzer()
    same = agree = total = 0
    diffs = []
    for key, text in texts.items():
        ours = nori.analyze(clean(text))
        theirs = ref[key]
        same += ours == theirs
        sm = difflib.SequenceMatcher(a=theirs, b=ours, autojunk=False)
        agree += sum(b.size for b in sm.get_matching_blocks())
        total += max(len(theirs), len(ours))
        if ours != theirs and len(diffs) < 15:
            for op, i1, i2, j1, j2 in sm.get_opcodes():
                if op != "equal":
                    diffs.append({"lucene": theirs[i1:i2], "toolkit": ours[j1:j2]})
                    break
    return {"texts": len(texts), "identical_texts": same, "identical_share": round(same / len(texts), 4),
            "token_agreement": round(agree / max(total, 1), 4), "examples": diffs}


def bm25(lucene: Lucene, ko, n_queries: int) -> dict:
    from opensearch_lsr.lexical.bm25 import LuceneBM25
    from opensearch_lsr.lexical.nori import NoriAnalyzer

    corpus = {d: clean(t) for d, t in ko.corpus.items()}
    qids = [q for q in ko.qrels if q in ko.queries][:n_queries]
    queries = {q: clean(ko.queries[q]) for q in qids}
    t0 = time.perf_counter()
    ref = lucene.bm25(corpus, queries, k=10)
    t_lucene = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = LuceneBM25.build(corpus, NoriAnalyzer()).search(queries, k=10)
    t_ours = time.perf_counter() - t0
    identical = overlap = 0
    max_diff = 0.0
    for q in qids:
        a = [d for d, _ in ref.get(q, [])]
        b = list(ours.get(q, {}))
        identical += a == b
        overlap += len(set(a) & set(b)) / max(len(a), 1)
        common = {d: s for d, s in ref.get(q, [])}
        for d, s in ours.get(q, {}).items():
            if d in common:
                max_diff = max(max_diff, abs(s - common[d]) / max(abs(common[d]), 1e-9))
    qrels = {q: ko.qrels[q] for q in qids}
    same = bm25_same_tokens(lucene, corpus, queries)
    return {"same_token_stream": same, "queries": len(qids), "docs": len(corpus), "identical_top10": identical,
            "identical_share": round(identical / len(qids), 4), "mean_top10_overlap": round(overlap / len(qids), 4),
            "mrr@10_lucene": round(mrr10({q: [d for d, _ in v] for q, v in ref.items()}, qrels), 4),
            "mrr@10_toolkit": round(mrr10({q: list(v) for q, v in ours.items()}, qrels), 4),
            "max_rel_score_diff_common_docs": max_diff, "seconds": {"lucene": round(t_lucene, 1),
                                                                     "toolkit": round(t_ours, 1)}}


class Pretokenized:
    """A text analyzer over TAB-separated terms (for :meth:`LuceneBM25.from_tokens` on Lucene's own terms)."""

    def tokens(self, text: str):
        from opensearch_lsr.lexical.nori import NoriToken

        return tuple(NoriToken(t, "NNG") for t in text.split("\t") if t)

    def analyze(self, text: str) -> list[str]:
        return [t.term for t in self.tokens(text)]

    def settings(self) -> dict:
        return {"type": "pretokenized"}


def compare_runs(ref: dict[str, list[tuple[str, float]]], ours: dict[str, dict[str, float]]) -> dict:
    identical = 0
    max_rel = 0.0
    for q, hits in ref.items():
        identical += [d for d, _ in hits] == list(ours.get(q, {}))
        for d, s in hits:
            if d in ours.get(q, {}):
                max_rel = max(max_rel, abs(ours[q][d] - s) / max(abs(s), 1e-9))
    return {"queries": len(ref), "identical_top10": identical, "max_rel_score_diff": max_rel}


def bm25_same_tokens(lucene: Lucene, corpus: dict[str, str], queries: dict[str, str]) -> dict:
    """BM25 of both over Lucene's own nori terms: the similarity implementation alone."""
    from opensearch_lsr.lexical.bm25 import LuceneBM25

    dterms = lucene.analyze(corpus)
    qterms = lucene.analyze(queries)
    ref = lucene.bm25_pretokenized(dterms, qterms, k=10)
    an = Pretokenized()
    index = LuceneBM25.from_tokens(list(dterms), [an.tokens("\t".join(t)) for t in dterms.values()], an)
    ours = index.search({q: "\t".join(t) for q, t in qterms.items()}, k=10)
    return compare_runs(ref, ours)


def feature_scores(lucene: Lucene, en, n_passages: int, n_queries: int) -> dict:
    import torch

    from opensearch_lsr.encoding.keyed import SparseKeyedEncoder
    from opensearch_lsr.local.index import LocalIndex
    from opensearch_lsr.resources import splade_tiny_path

    torch.set_num_threads(1)
    enc = SparseKeyedEncoder(str(splade_tiny_path()))
    doc_ids = list(en.corpus)[:n_passages]
    dvecs = enc.encode([en.corpus[d] for d in doc_ids], "document", batch_size=32)
    qids = [q for q in en.qrels if q in en.queries][:n_queries]
    qvecs = enc.encode([en.queries[q] for q in qids], "query", batch_size=32)
    docs = {d: v for d, v in zip(doc_ids, dvecs) if v}
    queries = {q: v for q, v in zip(qids, qvecs) if v}
    ref = lucene.features(docs, queries, k=10)
    with tempfile.TemporaryDirectory() as tmp:
        index = LocalIndex.create(Path(tmp) / "f", {"properties": {"f": {"type": "rank_features"}}})
        index.bulk({"_id": d, "_source": {"f": v}} for d, v in docs.items())
        identical = 0
        max_rel = 0.0
        compared = 0
        for q, vec in queries.items():
            hits = index.search({"query": {"neural_sparse": {"f": {"query_tokens": vec}}}, "size": 10})["hits"]["hits"]
            ours = [(h["_id"], h["_score"]) for h in hits]
            theirs = ref.get(q, [])
            identical += [d for d, _ in ours] == [d for d, _ in theirs]
            lut = dict(theirs)
            for d, s in ours:
                if d in lut:
                    compared += 1
                    max_rel = max(max_rel, abs(s - lut[d]) / max(abs(lut[d]), 1e-9))
    return {"docs": len(docs), "queries": len(queries), "identical_top10": identical,
            "identical_share": round(identical / max(len(queries), 1), 4), "scores_compared": compared,
            "max_rel_score_diff": max_rel}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2].parent / "shared" / "data"))
    ap.add_argument("--passages", type=int, default=1500)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--only", default="tokens,bm25,features")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from opensearch_lsr.evaluation.datasets import load_beir

    lucene = Lucene()
    data = Path(args.data)
    ko = load_beir(str(data / "msmarco-ko"), "dev")
    result = {"date": time.strftime("%Y-%m-%d"), "lucene": lucene.version, "machine": platform.platform(),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True).stdout.strip(), "command": " ".join(sys.argv)}
    only = args.only.split(",")
    if "tokens" in only:
        result["tokens"] = tokens(lucene, ko, args.passages, args.queries)
    if "bm25" in only:
        result["bm25"] = bm25(lucene, ko, args.queries)
    if "features" in only:
        result["features"] = feature_scores(lucene, load_beir(str(data / "msmarco-en"), "dev"), args.passages,
                                            args.queries)
    text = json.dumps(result, ensure_ascii=False, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
