"""The nori BM25 baseline and hybrid rows of an evaluation, measured through the search backend.

Both rows send the request bodies OpenSearch gets: ``{"query": {"match": {<text field>: q}}}`` for the
baseline, and ``{"query": {"hybrid": {"queries": [match, neural_sparse]}}}`` under a search pipeline
(:class:`~opensearch_lsr.lexical.fusion.HybridFusion`) for the hybrid; locally the
:class:`~opensearch_lsr.local.index.LocalIndex` answers them (nori analysis + Lucene BM25, neural-search
fusion), on a cluster the cluster does.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ..lexical.fusion import HybridFusion
from ..lexical.queries import hybrid_query, match_query
from .metrics import evaluate_run

__all__ = ["Baseline", "HybridTechnique", "LexicalRow", "PipelineSearch", "local_pipeline_search",
           "opensearch_pipeline_search", "baseline_row", "hybrid_row", "evaluate_baseline", "check_choices",
           "NO_MATCH", "BASELINE_NAME"]

logger = logging.getLogger(__name__)

Baseline = Literal["none", "bm25-nori"]
HybridTechnique = Literal["none", "min_max", "z_score", "l2", "rrf"]
BASELINE_NAME = "BM25 (nori analyzer)"
#: A sub-query that matches nothing (stands in for an empty ``neural_sparse`` query in a hybrid body).
NO_MATCH: dict[str, Any] = {"bool": {"must_not": [{"match_all": {}}]}}

SearchFn = Callable[[dict], dict]


@dataclass
class LexicalRow:
    """One row: its name, metrics, run and timing."""

    name: str
    metrics: dict[str, float]
    run: dict[str, dict[str, float]]
    seconds: float

    def table_row(self) -> dict[str, Any]:
        return {"system": self.name, **self.metrics,
                "query_ms": 1000.0 * self.seconds / max(1, len(self.run))}


class PipelineSearch:
    """``search(body)`` with a search pipeline attached (what ``search_run`` calls)."""

    def __init__(self, fn: SearchFn):
        self._fn = fn

    def search(self, body: dict) -> dict:
        return self._fn(body)


def local_pipeline_search(index: Any, pipeline: Mapping[str, Any]) -> PipelineSearch:
    """Hybrid bodies against a ``LocalIndex`` with ``pipeline`` (a search pipeline body)."""
    return PipelineSearch(lambda body: index.search(body, search_pipeline=dict(pipeline)))


def opensearch_pipeline_search(client: Any, index: str, pipeline: Mapping[str, Any],
                               name: str = "lsr-os-eval-hybrid") -> PipelineSearch:
    """Create (or replace) search pipeline ``name`` on the cluster, then search ``index`` through it."""
    from ..engines import make_engine

    engine = make_engine("opensearch", client)
    ref = engine.put_search_pipeline(name, dict(pipeline))
    return PipelineSearch(lambda body: engine.search(index, body, search_pipeline=ref))


def _run(search: SearchFn, bodies: Mapping[str, dict | None]) -> dict[str, dict[str, float]]:
    run: dict[str, dict[str, float]] = {}
    for qid, body in bodies.items():
        hits = search(body)["hits"]["hits"] if body is not None else []
        run[qid] = {h["_id"]: float(h["_score"]) for h in hits}
    return run


def baseline_row(search: SearchFn, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]],
                 text_field: str, k: int = 100, name: str = BASELINE_NAME) -> LexicalRow:
    """Evaluate ``match`` on ``text_field`` (the index's analyzer, BM25) for every query."""
    bodies = {qid: {"query": match_query(text_field, text), "size": int(k), "_source": False}
              for qid, text in queries.items()}
    t0 = time.perf_counter()
    run = _run(search, bodies)
    seconds = time.perf_counter() - t0
    return LexicalRow(name, evaluate_run(qrels, run), run, seconds)


def hybrid_row(search: SearchFn, queries: Mapping[str, str], sparse_queries: Mapping[str, dict | None],
               qrels: Mapping[str, Mapping[str, int]], text_field: str, fusion: HybridFusion, k: int = 100,
               window: int | None = None, name: str | None = None) -> LexicalRow:
    """Evaluate ``hybrid [match, <sparse query>]`` through ``search`` (which carries the pipeline).

    Args:
        sparse_queries: the sparse model's query clause per query id (``None``: no positive token).
        window: ``pagination_depth`` (hits per sub-query); default ``k``.
    """
    if window is not None and window < k:
        raise ValueError(f"the hybrid window ({window}) must be at least k ({k})")
    bodies = {}
    for qid, text in queries.items():
        sparse = sparse_queries.get(qid) or NO_MATCH
        bodies[qid] = {"query": hybrid_query([match_query(text_field, text), sparse], pagination_depth=window),
                       "size": int(k), "_source": False}
    t0 = time.perf_counter()
    run = _run(search, bodies)
    seconds = time.perf_counter() - t0
    if name is None:
        detail = (f"rrf k={fusion.rank_constant}" if fusion.technique == "rrf" else
                  "min-max " + "/".join(f"{w:g}" for w in (fusion.weights or (0.5, 0.5))))
        name = f"hybrid BM25 (nori) + sparse ({detail})"
    return LexicalRow(name, evaluate_run(qrels, run), run, seconds)


def evaluate_baseline(dataset: str | Any, out_dir: str, split: str = "dev", k: int = 100, max_queries: int | None = None,
                      max_docs: int | None = None) -> dict[str, Any]:
    """The nori BM25 row alone (no model): a local index holding the text field only, ``match`` bodies.
    ``dataset``: a BEIR directory or a ``BeirDataset`` (e.g. a cross-lingual setting).

    Writes ``report.json``/``report.md``/``run-bm25-nori.trec`` and the text index (``index-text``) to
    ``out_dir``; returns the result (``rows``, ``metrics``, ``timings``).
    """
    from pathlib import Path

    from ..contract import DEFAULT_TEXT_ANALYZER
    from ..contract import DEFAULT_TEXT_FIELD as TEXT_FIELD
    from .datasets import BeirDataset, cap_corpus, load_beir
    from .report import write_report, write_trec_run
    from ..engines import make_engine

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # a BEIR directory, or a dataset built already (a cross-lingual setting: evaluation.crosslingual)
    ds = cap_corpus((dataset if isinstance(dataset, BeirDataset) else load_beir(dataset, split)).subset(max_queries),
                    max_docs)
    if isinstance(dataset, BeirDataset):
        split, dataset = dataset.split, dataset.name
    t0 = time.perf_counter()
    index_dir = out / "index-text"
    index = make_engine("local").create(index_dir, {"properties": {TEXT_FIELD: {"type": "text", "analyzer": DEFAULT_TEXT_ANALYZER}}},
                              exist_ok=True)
    if index.count() != len(ds.corpus):
        ids = list(ds.corpus)
        for start in range(0, len(ids), 5000):
            index.bulk({"_id": d, "_source": {TEXT_FIELD: ds.corpus[d]}} for d in ids[start:start + 5000])
    indexing = time.perf_counter() - t0
    t0 = time.perf_counter()
    index.search({"query": match_query(TEXT_FIELD, "x"), "size": 1})  # analyse the field once
    analysis = time.perf_counter() - t0
    row = baseline_row(index.search, ds.queries, ds.qrels, TEXT_FIELD, k)
    write_trec_run(row.run, out / "run-bm25-nori.trec", tag="bm25-nori")
    result = {"name": row.name, "config": {"dataset": dataset, "split": split, "backend": "local",
                                           "n_queries": len(ds.queries), "n_docs": len(ds.corpus), "k": k},
              "metrics": row.metrics, "rows": [row.table_row()],
              "lexical_rows": [{"name": row.name, "metrics": row.metrics, "seconds": row.seconds,
                                "query_ms": row.table_row()["query_ms"]}],
              "timings": {"index_documents": indexing, "analyse_text_field": analysis, f"search {row.name}": row.seconds}}
    write_report(result, out, title=f"Evaluation: {row.name} on {ds.name}/{split}")
    return result


def check_choices(baseline: str, hybrid: str) -> None:
    """One-sentence errors for the closed choices."""
    if baseline not in get_args(Baseline):
        raise ValueError(f"baseline must be one of {', '.join(get_args(Baseline))}, got {baseline!r}")
    if hybrid not in get_args(HybridTechnique):
        raise ValueError(f"hybrid must be one of {', '.join(get_args(HybridTechnique))}, got {hybrid!r}")
