"""Evaluate retrieval through an Elasticsearch index (``lsr-os eval --backend elasticsearch``).

The corpus must already be indexed (``lsr-os index --backend elasticsearch``); each judged query
becomes a ``sparse_vector`` query, client-side (``tokens``: the inference-free IDF side, or the
encoder's own query vector) or cluster-side (``model``: ``inference_id`` + ``query``), optionally
fused with BM25 by the ``rrf`` retriever; the run is scored with
:func:`~opensearch_lsr.evaluation.metrics.evaluate_run` (ranx: MRR@10, nDCG@10, Recall@100).
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Literal

from ..config import ArtifactConfig, write_json
from ..contract import DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD
from ..elasticsearch.query import query_vector_for, rrf_body, run_queries, search_body, sparse_vector_query

__all__ = ["EsEvalConfig", "evaluate_es"]

QueryMode = Literal["tokens", "model"]


@dataclasses.dataclass
class EsEvalConfig(ArtifactConfig):
    """Options of one Elasticsearch evaluation (saved as ``es_eval_config.json`` in the output dir)."""

    FILENAME = "es_eval_config.json"

    dataset: str = ""
    split: str = "dev"
    index: str = ""
    query_mode: str = "tokens"
    model: str | None = None
    inference_id: str | None = None
    field: str = DEFAULT_VECTOR_FIELD
    text_field: str = DEFAULT_TEXT_FIELD
    hybrid: bool = False
    rank_constant: int = 60
    k: int = 100
    max_queries: int | None = None

    def __post_init__(self) -> None:
        if self.query_mode not in ("tokens", "model"):
            raise ValueError(f"query_mode must be one of tokens, model, got {self.query_mode!r}")
        if self.query_mode == "tokens" and not self.model:
            raise ValueError("query mode tokens needs --model (a bundle dir or encoder) for the query vectors")
        if self.query_mode == "model" and not self.inference_id:
            raise ValueError("query mode model needs --model-id (the deployed model or inference endpoint id)")
        if not self.index:
            raise ValueError("--index (the Elasticsearch index holding the corpus) is required")


def evaluate_es(config: EsEvalConfig, out_dir: str | os.PathLike, search) -> dict[str, Any]:
    """Run the judged queries through ``search(index, body)`` and score the run.

    Returns:
        ``{"metrics", "queries", "seconds"}``, also written to ``out_dir/metrics.json`` with ``run.json``.
    """
    from .datasets import load_beir
    from .metrics import evaluate_run

    ds = load_beir(config.dataset, config.split)
    qids = [q for q in ds.qrels if q in ds.queries]
    if config.max_queries:
        qids = qids[:config.max_queries]
    bodies: dict[str, dict[str, Any]] = {}
    for qid in qids:
        text = ds.queries[qid]
        if config.query_mode == "tokens":
            clause = sparse_vector_query(config.field, query_vector=query_vector_for(text, config.model))  # type: ignore[arg-type]
        else:
            clause = sparse_vector_query(config.field, inference_id=config.inference_id, query=text)
        bodies[qid] = (rrf_body(config.text_field, text, clause, size=config.k, rank_constant=config.rank_constant,
                                rank_window_size=config.k) if config.hybrid else search_body(clause, size=config.k))
    t0 = time.perf_counter()
    run = run_queries(search, config.index, bodies, k=config.k)
    seconds = time.perf_counter() - t0
    metrics = evaluate_run({q: ds.qrels[q] for q in qids}, run)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config.save(out)
    write_json(out / "run.json", run)
    result = {"metrics": metrics, "queries": len(qids), "seconds": round(seconds, 3)}
    write_json(out / "metrics.json", result)
    return result
