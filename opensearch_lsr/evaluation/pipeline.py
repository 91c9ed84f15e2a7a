"""End-to-end evaluation through a search backend (``lsr-os eval``).

Documents are encoded with the model's document side, indexed (local backend: a fresh
``LocalIndex``; OpenSearch: an index that is already filled), queried with standard
``neural_sparse`` bodies, and the runs are scored with ranx. Then the same vectors go through a
document-pruning sweep (scored exactly as the backend would) for the effectiveness/FLOPS plot.

Query modes:
  * ``model``: the model's own query side (``SparseEncoder.encode_query``: the bi-encoder, or the
    IDF route of an inference-free ``Router``). Locally the vectors are computed in one batch and
    sent as ``query_tokens`` (the same numbers a ``model_id`` query computes, batched); on
    OpenSearch the body carries ``query_text`` + ``model_id``.
  * ``tokens``: inference-free, client-side ``SPARSE_TOKENIZE`` (``tokenize_query`` with the IDF
    of ``idf``, the model dir's ``idf.json``, or one computed from the corpus) sent as ``query_tokens``.

Cross-lingual runs (``query_language`` / ``corpus_language`` / ``queries_file``) evaluate a setting built
from parallel copies (:mod:`~opensearch_lsr.evaluation.crosslingual`); ``query_encoder="psq"`` replaces
the model's query side by PSQ translation of an English query (:mod:`~opensearch_lsr.encoding.psq`),
always sent as ``query_tokens``.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import scipy.sparse as sp

from ..config import ArtifactConfig
from ..contract import DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD
from .crosslingual import DEFAULT_REPAIR, CrossLingualSpec
from .datasets import BeirDataset, cap_corpus, load_beir
from .metrics import evaluate_run

__all__ = ["EvalConfig", "SearchBackend", "OpenSearchBackend", "cap_corpus", "dicts_to_csr",
           "search_run", "run_evaluation", "VECTOR_FIELD", "TEXT_FIELD"]

logger = logging.getLogger(__name__)

#: The fields evaluation indexes and queries: the toolkit's defaults, so `lsr-os index` output evaluates as is.
VECTOR_FIELD = DEFAULT_VECTOR_FIELD
TEXT_FIELD = DEFAULT_TEXT_FIELD
QUERY_MODES = ("model", "tokens")
BACKENDS = ("local", "opensearch")


@dataclass
class EvalConfig(ArtifactConfig):
    """An evaluation run (saved as ``eval_config.json`` next to its report)."""

    FILENAME = "eval_config.json"

    dataset: str = ""
    split: str = "dev"
    model: str = ""
    query_mode: Literal["model", "tokens"] = "model"
    backend: Literal["local", "opensearch"] = "local"
    index: str | None = None  # local: index dir (default <out>/index); opensearch: index name
    model_id: str | None = None  # opensearch + model mode: the deployed model
    idf: str | None = None
    max_queries: int | None = None
    max_docs: int | None = None
    query_ids: list[str] | None = None  # only these judged queries (e.g. a model's holdout_queries.json)
    k: int = 100
    batch_size: int = 32
    prune_levels: list[float] = field(default_factory=lambda: [0.0, 0.05, 0.1, 0.2, 0.3, 0.5])
    name: str | None = None
    # rows measured through the same backend (opensearch_lsr.evaluation.baselines): `match` on the text
    # field (nori BM25) and `hybrid [match, neural_sparse]` under a min_max or rrf search pipeline
    baseline: Literal["none", "bm25-nori"] = "none"
    hybrid: Literal["none", "min_max", "z_score", "l2", "rrf"] = "none"
    hybrid_weights: list[float] = field(default_factory=lambda: [0.3, 0.7])  # [bm25, sparse], min_max only
    rank_constant: int = 60
    hybrid_window: int | None = None  # hits per sub-query (pagination_depth); default k
    # cross-lingual settings (opensearch_lsr.evaluation.crosslingual): the queries / corpus of a parallel copy
    query_language: str | None = None  # e.g. "en": queries of the dataset's English copy (same query ids)
    corpus_language: str | None = None  # e.g. "en" (the English copy's corpus) or "mixed" (both corpora)
    parallel: str | None = None  # the other copy's directory (default: the sibling, msmarco-ko -> msmarco-en)
    queries_file: str | None = None  # replace the query texts (JSONL _id/text or qid<TAB>text)
    repair: list[str] = field(default_factory=lambda: list(DEFAULT_REPAIR))  # copies repaired with ftfy
    # query side: the model's own encoder, or PSQ (an English query through the transfer's source SPLADE and
    # alignment.npz; opensearch_lsr.encoding.psq); auto = psq for queries in the PSQ source language on a
    # transfer output
    query_encoder: Literal["auto", "model", "psq"] = "auto"
    psq_source: str | None = None
    psq_alignment: str | None = None
    psq_min_prob: float = 0.0

    def __post_init__(self) -> None:
        from .baselines import check_choices

        check_choices(self.baseline, self.hybrid)
        if self.hybrid != "none":  # the pipeline's own validation (weights sum to 1, rank constant range), up front
            from ..lexical.fusion import HybridFusion

            HybridFusion(self.hybrid, tuple(self.hybrid_weights) if self.hybrid != "rrf" else None,
                         self.rank_constant)
            if self.hybrid_window is not None and self.hybrid_window < self.k:
                raise ValueError(f"the hybrid pagination depth ({self.hybrid_window}) must be at least k ({self.k})")
        if self.query_mode not in QUERY_MODES:
            raise ValueError(f"query_mode must be one of {list(QUERY_MODES)}, got {self.query_mode!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        if self.k < 1:
            raise ValueError("k must be >= 1")
        if self.query_encoder not in ("auto", "model", "psq"):
            raise ValueError(f"query_encoder must be one of auto, model, psq, got {self.query_encoder!r}")
        if self.query_encoder == "psq" and self.query_mode != "model":
            raise ValueError("the psq query encoder replaces the model's query side: use query_mode 'model'")

    def crosslingual_spec(self) -> CrossLingualSpec:
        """The queries and corpus this run evaluates (the plain dataset unless a language option is set)."""
        return CrossLingualSpec(self.dataset, self.split, self.query_language, self.corpus_language, self.parallel,
                                self.queries_file, tuple(self.repair))

    def resolved_query_encoder(self) -> str:
        """``model`` or ``psq`` (``auto``: psq for queries in the PSQ source language on a transfer output)."""
        from ..encoding.psq import resolve_query_encoder

        return resolve_query_encoder(self.model, self.query_language, self.query_encoder)


class SearchBackend(Protocol):
    def search(self, body: dict) -> dict: ...


class OpenSearchBackend:
    """``search(body)`` against one index of an ``opensearch-py`` client (the registry's OpenSearch engine)."""

    def __init__(self, client: Any, index: str):
        from ..engines import make_engine

        self.client = client
        self.engine = make_engine("opensearch", client)
        self.index = index

    def search(self, body: dict) -> dict:
        return self.engine.search(self.index, body)


def dicts_to_csr(rows: Sequence[Mapping[str, float]], vocab: dict[str, int] | None = None
                 ) -> tuple[sp.csr_matrix, dict[str, int]]:
    """``{key: weight}`` rows -> CSR over ``vocab`` (extended with unseen keys)."""
    vocab = dict(vocab or {})
    indptr, indices, data = [0], [], []
    for row in rows:
        for key, w in row.items():
            indices.append(vocab.setdefault(key, len(vocab)))
            data.append(float(w))
        indptr.append(len(indices))
    mat = sp.csr_matrix((np.array(data, np.float32), np.array(indices, np.int64), np.array(indptr, np.int64)),
                        shape=(len(rows), len(vocab)))
    mat.sum_duplicates()
    return mat, vocab


def index_local(index_path: Path, doc_ids: Sequence[str], texts: Sequence[str], model: str) -> Any:
    """A fresh local index of the documents, through the indexing path of ``lsr-os index``
    (:func:`~opensearch_lsr.encoding.indexing.index_records`); nori on the text field (``flat_mapping``'s default)."""
    from ..encoding.encoder import SparseDocumentEncoder
    from ..encoding.indexing import index_records
    from ..engines import make_engine

    writer = make_engine("local").document_writer(str(index_path), text_field=TEXT_FIELD, sparse_field=VECTOR_FIELD)
    counts = index_records(zip(doc_ids, texts), SparseDocumentEncoder(model), writer)
    writer.close()
    if counts.failed:
        bad = counts.errors[0]
        reason = bad["error"].get("reason") if isinstance(bad["error"], dict) else bad["error"]
        raise ValueError(f"indexing failed for document {bad['_id']}: {reason}")
    return writer.index


def _judged_share(qrels: dict[str, dict[str, int]], doc_ids: Sequence[str]) -> float:
    """The share of the relevant (rel > 0) judged documents that are among ``doc_ids``."""
    judged = {d for rels in qrels.values() for d, rel in rels.items() if rel > 0}
    return len(judged & set(doc_ids)) / len(judged) if judged else 1.0


def vector_field_of(index: Any) -> str:
    """The ``rank_features`` field to search in a local index: the default one, else the only one."""
    fields = index.vector_fields
    if VECTOR_FIELD in fields or not fields:
        return VECTOR_FIELD
    if len(fields) == 1:
        return fields[0]
    raise ValueError(f"the index has several rank_features fields ({', '.join(fields)}) and none is "
                     f"{VECTOR_FIELD!r}: evaluate an index made by `lsr-os index`")


def search_run(backend: SearchBackend, bodies: Mapping[str, dict]) -> dict[str, dict[str, float]]:
    """Run one body per query id; ``{qid: {doc_id: score}}``."""
    run: dict[str, dict[str, float]] = {}
    for qid, body in bodies.items():
        if body is None:
            run[qid] = {}
            continue
        hits = backend.search(body)["hits"]["hits"]
        run[qid] = {h["_id"]: float(h["_score"]) for h in hits}
    return run


def _resolve_idf(config: EvalConfig, tokenizer, corpus_texts: Sequence[str]) -> tuple[dict[str, float], str]:
    from ..idf import compute_idf, load_idf

    if config.idf:
        return load_idf(config.idf), config.idf
    model_idf = Path(config.model) / "idf.json"
    if model_idf.exists():
        return load_idf(model_idf), str(model_idf)
    logger.info("computing IDF over %d corpus documents", len(corpus_texts))
    return compute_idf(corpus_texts, tokenizer), "corpus"


def _query_tokens(weights: Mapping[str, float]) -> dict[str, float] | None:
    q = {k: float(v) for k, v in weights.items() if v > 0}
    return q or None


def _lexical_rows(config: EvalConfig, backend: Any, client: Any, dataset: BeirDataset,
                  sparse_bodies: Mapping[str, dict | None], out: Path) -> list:
    """The nori BM25 baseline and hybrid rows (``config.baseline`` / ``config.hybrid``), run files in ``out``."""
    from .baselines import (BASELINE_NAME, baseline_row, hybrid_row, local_pipeline_search,
                                     opensearch_pipeline_search)
    from ..lexical.fusion import HybridFusion
    from .report import write_trec_run

    rows = []
    if config.baseline == "bm25-nori":
        name = BASELINE_NAME
        if config.backend == "local":  # a reused index may analyse the text field otherwise: say so
            from ..lexical.analysis import analyzer_for_field
            from ..lexical.nori import NoriAnalyzer

            props = backend.mappings["properties"]
            if not isinstance(analyzer_for_field(props, backend.settings, TEXT_FIELD), NoriAnalyzer):
                analyzer = props.get(TEXT_FIELD, {}).get("analyzer", "standard")
                logger.warning("the local index analyses %s with %r, not nori: the baseline row is BM25 over it",
                               TEXT_FIELD, analyzer)
                name = f"BM25 ({analyzer} analyzer)"
        rows.append(baseline_row(backend.search, dataset.queries, dataset.qrels, TEXT_FIELD, config.k, name))
        write_trec_run(rows[-1].run, out / "run-bm25-nori.trec", tag="bm25-nori")
    if config.hybrid != "none":
        fusion = HybridFusion(config.hybrid, tuple(config.hybrid_weights) if config.hybrid != "rrf" else None,
                              config.rank_constant)
        search = (local_pipeline_search(backend, fusion.pipeline()) if config.backend == "local" else
                  opensearch_pipeline_search(client, config.index, fusion.pipeline()))
        sparse = {qid: (body or {}).get("query") for qid, body in sparse_bodies.items()}
        rows.append(hybrid_row(search.search, dataset.queries, sparse, dataset.qrels, TEXT_FIELD, fusion, config.k,
                               config.hybrid_window))
        write_trec_run(rows[-1].run, out / f"run-hybrid-{config.hybrid}.trec", tag=f"hybrid-{config.hybrid}")
    return rows


def run_evaluation(config: EvalConfig, out_dir: str | os.PathLike, client: Any = None,
                   show_progress_bar: bool = False, keep_runs: bool = False) -> dict[str, Any]:
    """Evaluate ``config.model`` on ``config.dataset``; writes the report, run and plot to ``out_dir``.

    Returns the result dict (also ``out_dir/report.json``); ``keep_runs`` adds ``result["runs"]``, each row's
    ``{qid: {doc_id: score}}`` in the engine's hit order (``"model"``, then the lexical rows by name).
    """
    from ..encoding.keyed import SparseKeyedEncoder
    from ..engines import make_engine
    from ..encoding.query_tokens import tokenize_query
    from ..engines.query_dsl import neural_sparse_query, search_body
    from .plots import plot_effectiveness_vs_flops
    from .report import write_report, write_trec_run
    from .retrieval import sparsity_stats
    from .sweep import prune_sweep

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    spec = config.crosslingual_spec()
    dataset = (load_beir(config.dataset, config.split) if spec.plain else spec.build())
    if config.query_ids:
        dataset = dataset.only(config.query_ids)
    dataset = cap_corpus(dataset.subset(config.max_queries), config.max_docs)
    query_side = config.resolved_query_encoder()
    qids, doc_ids = list(dataset.queries), list(dataset.corpus)
    qtexts, dtexts = [dataset.queries[q] for q in qids], [dataset.corpus[d] for d in doc_ids]
    from ..multilingual.milco import is_milco_dir

    # a MILCO model's output ids span two vocabularies (LexEcho source view + English pivot): TOKEN_ID keys
    encoder = SparseKeyedEncoder(config.model, key_format="token_id" if is_milco_dir(config.model) else "word")

    # documents -> index -------------------------------------------------------------------
    t0 = time.perf_counter()
    if config.backend == "local":
        index_path = Path(config.index) if config.index else out / "index"
        local = make_engine("local")
        if local.exists(index_path) and local.open(index_path).count() > 0 and config.index:
            index = local.open(index_path)
            logger.info("using the filled local index %s (%d docs)", index_path, index.count())
        else:
            if local.exists(index_path):
                import shutil

                shutil.rmtree(index_path)
            index = index_local(index_path, doc_ids, dtexts, config.model)
            timings["index_documents"] = time.perf_counter() - t0
        backend: SearchBackend = index
        field = vector_field_of(index)
        docs_mat, index_doc_ids, terms = index.doc_matrix(field, truncated=False)
        judged_in_index = _judged_share(dataset.qrels, index_doc_ids)
        if judged_in_index < 1.0:  # a reused index filled from part of the corpus: every missing one is a miss
            logger.warning("only %.1f%% of the judged documents of these queries are in the local index %s; "
                           "the metrics count the others as misses (fill it with the whole corpus, or leave out "
                           "--index to index the evaluated corpus)", 100 * judged_in_index, index_path)
    else:
        if client is None or not config.index:
            raise ValueError("the opensearch backend needs a client and the name of a filled index (--index)")
        backend = OpenSearchBackend(client, config.index)
        field = VECTOR_FIELD
        doc_csr = encoder.to_csr(dtexts, "document", config.batch_size, show_progress_bar)
        docs_mat, index_doc_ids, terms = doc_csr, doc_ids, list(encoder.keys)
        timings["encode_documents"] = time.perf_counter() - t0

        judged_in_index = None
    # queries -------------------------------------------------------------------------------
    t0 = time.perf_counter()
    idf_source = None
    if config.query_mode == "tokens":
        idf, idf_source = _resolve_idf(config, encoder.model.tokenizer, dtexts)
        qdicts = [tokenize_query(t, encoder.model.tokenizer, idf) for t in qtexts]
    elif query_side == "psq":
        from ..encoding.psq import PsqConfig, PsqQueryEncoder

        psq = PsqQueryEncoder(PsqConfig(config.model, config.psq_source, config.psq_alignment, config.psq_min_prob))
        qdicts = psq.encode(qtexts, "query", config.batch_size)
    else:
        qdicts = encoder.encode(qtexts, "query", config.batch_size)
    timings["encode_queries"] = time.perf_counter() - t0
    bodies: dict[str, dict | None] = {}
    for qid, text, qd in zip(qids, qtexts, qdicts):
        if (config.backend == "opensearch" and config.query_mode == "model" and config.model_id
                and query_side == "model"):
            query = neural_sparse_query(field, query_text=text, model_id=config.model_id)
        else:
            tokens = _query_tokens(qd)
            query = neural_sparse_query(field, query_tokens=tokens) if tokens else None
        bodies[qid] = None if query is None else search_body(query, size=config.k, source=False)
    t0 = time.perf_counter()
    run = search_run(backend, bodies)
    timings["search"] = time.perf_counter() - t0
    metrics = evaluate_run(dataset.qrels, run)
    lexical_rows = _lexical_rows(config, backend, client, dataset, bodies, out)
    for row in lexical_rows:
        timings[f"search {row.name}"] = row.seconds

    vocab = {t: i for i, t in enumerate(terms)}
    q_csr, vocab = dicts_to_csr(qdicts, vocab)
    d_csr = sp.csr_matrix((docs_mat.data, docs_mat.indices, docs_mat.indptr), shape=(docs_mat.shape[0], len(vocab)))
    metrics.update(sparsity_stats(q_csr, d_csr))

    # sweep + plot --------------------------------------------------------------------------
    t0 = time.perf_counter()
    sweep = prune_sweep(q_csr, d_csr, qids, list(index_doc_ids), dataset.qrels, config.prune_levels, k=config.k) \
        if config.prune_levels else []
    timings["sweep"] = time.perf_counter() - t0
    name = config.name or Path(config.model).name
    write_trec_run(run, out / "run.trec", tag=name)
    plot = plot_effectiveness_vs_flops({name: sweep}, out / "effectiveness_vs_flops.png") if sweep else None
    config.save(out)
    result = {"name": name, "config": {**config.to_dict(), "n_queries": len(qids), "n_docs": len(index_doc_ids),
                                       "idf_source": idf_source, "evaluated": dataset.name,
                                       "judged_in_index": judged_in_index,
                                       "query_side": query_side},
              "metrics": metrics, "sweep": sweep, "plot": str(plot) if plot else None,
              "run_file": str(out / "run.trec"), "timings": timings}
    if lexical_rows:  # the nori row leads, hybrids follow the model
        result["lexical_rows"] = [{"name": r.name, "metrics": r.metrics, "seconds": r.seconds,
                                   "query_ms": 1000.0 * r.seconds / max(1, len(r.run))} for r in lexical_rows]
        model_row = {"system": name, **metrics, "query_ms": 1000.0 * timings["search"] / max(1, len(qids))}
        result["rows"] = ([r.table_row() for r in lexical_rows if not r.name.startswith("hybrid")] + [model_row]
                          + [r.table_row() for r in lexical_rows if r.name.startswith("hybrid")])
    write_report(result, out, title=f"Evaluation: {name} on {dataset.name}/{dataset.split}")
    if keep_runs:
        result["runs"] = {"model": run, **{r.name: r.run for r in lexical_rows}}
    return result
