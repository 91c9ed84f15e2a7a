"""`lsr-os search`, `eval`, `tune-hybrid`, `inference-free`, `quickstart`: query an index and measure an encoder."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..engines import connection_options
from .app import USER_ERRORS, cli, echo_json, error_message, fail, refuse_cluster_options, user_errors

__all__ = ["search_cmd", "eval_cmd", "tune_hybrid_cmd", "inference_free_cmd", "quickstart_cmd"]

_PSQ_OPTIONS = [
    click.option("--query-encoder", type=click.Choice(["auto", "model", "psq"]), default="auto", show_default=True,
              help="model: the model's own query side; psq: SPLADE-X's probabilistic structured query: the (English) "
                   "query is encoded by the transfer's source SPLADE and mapped into the model's vocabulary by its "
                   "alignment.npz (translation probabilities, no training); auto: psq when --query-language is "
                   "the source's (en) and the model is a transfer output, else model."),
    click.option("--psq-source", default=None,
              help="psq: the English source SPLADE (default: `source` of the model's transfer_config.json)."),
    click.option("--psq-alignment", default=None,
              help="psq: the transfer output (or alignment.npz) whose alignment to use (default: the model's own; "
                   "give it for a model fine-tuned from a transfer)."),
    click.option("--psq-min-prob", type=float, default=0.0, show_default=True,
              help="psq: drop translations P(target|english) below this and renormalise."),
]


def psq_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--query-encoder / --psq-source / --psq-alignment / --psq-min-prob, shared by search and eval."""
    for option in reversed(_PSQ_OPTIONS):
        command = option(command)
    return command


@cli.command("search")
@click.option("--index", "index_ref", required=True,
              help="Local index directory (--backend local) or OpenSearch index name (--backend opensearch).")
@click.argument("query_text")
@click.option("--mode", type=click.Choice(["model", "tokens", "analyzer", "hybrid"]), default="tokens",
              show_default=True,
              help="model: query_text + model_id; tokens: client-side query_tokens; analyzer: query_text + analyzer; "
                   "hybrid: BM25 `match` on the text field + neural_sparse (query_tokens with --model, else "
                   "--model-id) fused by a search pipeline.")
@click.option("--technique", type=click.Choice(["min_max", "z_score", "l2", "rrf"]), default="min_max",
              show_default=True,
              help="--mode hybrid: min-max, z-score or L2 normalisation + weighted arithmetic mean, or RRF.")
@click.option("--weights", default="0.3,0.7", show_default=True,
              help="--mode hybrid min_max / z_score / l2: BM25,sparse weights.")
@click.option("--rank-constant", type=int, default=60, show_default=True, help="--mode hybrid rrf: the rank constant.")
@click.option("--search-pipeline", default=None,
              help="--mode hybrid on OpenSearch: an existing search pipeline (lsr-os create-pipeline hybrid); "
                   "default: one created from --technique as lsr-os-hybrid.")
@click.option("--text-field", default="text", show_default=True, help="--mode hybrid: the text field `match` queries.")
@click.option("--model", "model", default=None,
              help="Encoder dir / export bundle: the query side for --mode tokens, the model for local --mode model.")
@click.option("--model-id", default=None, help="Deployed ML Commons model id (--mode model on OpenSearch).")
@click.option("--analyzer", default=None, help="Analyzer name for --mode analyzer (e.g. bert-uncased).")
@click.option("--field", default=None,
              help="rank_features/sparse_vector field (default: the index's only one, else sparse_embedding).")
@click.option("--ann-k", type=int, default=None,
              help="sparse_vector (SEISMIC, 3.3+): method_parameters.k, hits per shard (cluster default 10; "
                   "on 3.4+ the default sent is --size). On 3.3 any --ann-* switches from exact to ANN scoring.")
@click.option("--ann-top-n", type=int, default=None,
              help="sparse_vector: method_parameters.top_n, query tokens kept (cluster default 10).")
@click.option("--ann-heap-factor", type=float, default=None,
              help="sparse_vector: method_parameters.heap_factor (cluster default 1.0).")
@click.option("--size", type=int, default=10, show_default=True)
@click.option("--filter", "filters", multiple=True, metavar="FIELD=VALUE", help="term filter (repeatable).")
@click.option("--show-query", is_flag=True, help="Print the request body sent.")
@click.option("--explain", is_flag=True, help="List the matching tokens and their contributions per hit.")
@click.option("--backend", type=click.Choice(["local", "opensearch"]), default="local", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the raw response as JSON.")
@click.option("--query-language", default=None,
              help="The language QUERY_TEXT is in (e.g. en). With --query-encoder auto, an English query on a "
                   "transfer output (--model holding alignment.npz) goes through PSQ; otherwise informational.")
@psq_options
@connection_options("opensearch")
def search_cmd(index_ref: str, query_text: str, mode: str, technique: str, weights: str, rank_constant: int,
               search_pipeline: str | None, text_field: str, model: str | None, model_id: str | None,
               analyzer: str | None, field: str | None, ann_k: int | None, ann_top_n: int | None,
               ann_heap_factor: float | None, size: int, filters: tuple[str, ...], show_query: bool,
               explain: bool, backend: str, as_json: bool, query_language: str | None, query_encoder: str,
               psq_source: str | None, psq_alignment: str | None, psq_min_prob: float, **conn) -> None:
    """Search an index with a standard neural_sparse (or hybrid BM25 + neural_sparse) query; print the hits.

    English query against a Korean index built with a transferred model (SPLADE-X PSQ):
    `lsr-os search --index IDX --model runs/models/ko-sembridge --query-language en "what is ..."`.
    """
    refuse_cluster_options(backend)
    from ..encoding.query_tokens import query_tokens_for
    from ..engines import connect
    from ..engines.query_dsl import (bool_query, explain_contributions, filter_clauses, nested_query,
                                     neural_sparse_query, search_body)

    if not query_text.strip():
        fail("the query text is empty")
    parsed_filters = {}
    for item in filters:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--filter must look like FIELD=VALUE, got {item!r}")
        parsed_filters[key] = value
    ann = {k: v for k, v in (("k", ann_k), ("top_n", ann_top_n), ("heap_factor", ann_heap_factor)) if v is not None}
    method_params = None
    lexical_filters = dict(parsed_filters)  # --mode hybrid: the BM25 sub-query is filtered with them all
    with user_errors():
        engine = connect(backend, **conn)
        version = engine.version
        # the index's own sparse field, its key format (token ids on sparse_vector) and nesting
        target_field = engine.vector_field(index_ref, field)
        field, key_format, nested_path = target_field.name, target_field.key_format, target_field.nested_path
        if backend != "local":
            if ann and target_field.kind != "sparse_vector":
                fail(f"--ann-k/--ann-top-n/--ann-heap-factor apply to sparse_vector fields; {field} is {target_field.kind}")
            if target_field.kind == "sparse_vector" and tuple(version[:2]) >= (3, 4) and "k" not in ann:
                # 3.4+ always runs SEISMIC with k 10 by default: ask for as many hits as --size
                ann["k"] = max(size, 10)
            if ann and parsed_filters:
                # inside the ANN search (method_parameters.filter), not after it: an outer bool filter
                # would only thin out the k hits SEISMIC already chose
                ann["filter"] = {"bool": {"filter": filter_clauses(parsed_filters)}}
                parsed_filters = {}
            method_params = ann or None
        if ann and backend == "local":
            fail("--ann-k/--ann-top-n/--ann-heap-factor apply to OpenSearch sparse_vector indices")
        from ..encoding.psq import resolve_query_encoder

        psq_tokens = None
        if resolve_query_encoder(model, query_language, query_encoder) == "psq":
            if not model:
                fail("--query-encoder psq needs --model (the transferred model whose alignment translates the query)")
            if mode == "analyzer":
                fail("--query-encoder psq computes query_tokens: use --mode tokens, model or hybrid")
            from ..encoding.psq import PsqConfig, PsqQueryEncoder

            psq = PsqQueryEncoder(PsqConfig(model, psq_source, psq_alignment, psq_min_prob))
            psq_tokens = psq.encode([query_text], key_format=key_format)[0]
            if not psq_tokens:
                fail("the PSQ translation of the query is empty (none of its English terms has a translation)")
            mode = "hybrid" if mode == "hybrid" else "tokens"
        pipeline = None
        if mode == "hybrid":
            from ..lexical.fusion import HybridFusion
            from ..lexical.queries import hybrid_query, match_query

            if psq_tokens is not None:
                source: dict = {"query_tokens": psq_tokens}
            elif model:
                source = {"query_tokens": query_tokens_for(query_text, model, key_format=key_format)}
            elif model_id:
                source = {"query_text": query_text, "model_id": model_id}
            else:
                fail("--mode hybrid needs --model (query_tokens computed here) or --model-id (a deployed model)")
            sparse = neural_sparse_query(field, **source, version=version, method_params=method_params)
            fusion = HybridFusion(technique, tuple(_weights(weights)) if technique != "rrf" else None,  # type: ignore[arg-type]
                                  rank_constant)
            pipeline = search_pipeline or engine.put_search_pipeline("lsr-os-hybrid", fusion.pipeline())
            # the filters inside the ANN search of the sparse sub-query when they went there, else around it
            lexical = match_query(text_field, query_text)
            subs = [bool_query(lexical, lexical_filters) if lexical_filters else lexical,
                    bool_query(sparse, parsed_filters) if parsed_filters else sparse]
            body = search_body(hybrid_query(subs), size=size, source={"excludes": [field]})
        elif mode == "tokens":
            if not model:
                fail("--mode tokens needs --model (an encoder dir or export bundle) to compute query_tokens")
            tokens = psq_tokens if psq_tokens is not None else \
                query_tokens_for(query_text, model, key_format=key_format)
            clause = neural_sparse_query(field, query_tokens=tokens, version=version, method_params=method_params)
        elif mode == "model":
            mid = model_id or model
            if not mid:
                fail("--mode model needs --model-id (OpenSearch) or --model (a local model dir)")
            if backend == "local" and model and not model_id:
                mid = str(model)
            clause = neural_sparse_query(field, query_text=query_text, model_id=mid, version=version,
                                         method_params=method_params)
        else:
            clause = neural_sparse_query(field, query_text=query_text, analyzer=analyzer, version=version,
                                         method_params=method_params)
        if mode != "hybrid":
            if nested_path:
                clause = nested_query(nested_path, clause)
            body = search_body(bool_query(clause, parsed_filters or None), size=size,
                               source={"excludes": [nested_path or field]}, explain=explain)
            engine.check_search(index_ref, size)
    if show_query:
        click.echo("# request body" + (f" (search pipeline: {json.dumps(pipeline)})" if pipeline else ""))
        echo_json(body)
    try:
        resp = engine.search(index_ref, body, search_pipeline=pipeline)
    except USER_ERRORS as err:
        fail(error_message(err))
    except Exception as err:  # noqa: BLE001 - opensearch-py TransportError etc.: one sentence
        fail(f"search failed: {err}")
    if as_json:
        echo_json(resp)
        return
    total = resp["hits"].get("total", {})
    click.echo(f"{total.get('value', len(resp['hits']['hits']))} hits ({resp.get('took', 0)} ms)")
    for rank, hit in enumerate(resp["hits"]["hits"], 1):
        src = hit.get("_source") or {}
        text = src.get(text_field) if isinstance(src.get(text_field), str) else \
            next((v for k, v in src.items() if isinstance(v, str) and v != hit["_id"]), "")
        click.echo(f"{rank:>3}. {hit['_score']:.4f}  {hit['_id']}  {text[:100]}")
        if explain:
            parts = explain_contributions(hit)
            click.echo("       " + ", ".join(f"{tok}={val:.3f}" for tok, val in parts[:12]))


@cli.command("eval")
@click.option("--dataset", required=True, type=click.Path(exists=True, file_okay=False), help="BEIR-layout directory.")
@click.option("--split", default="dev", show_default=True)
@click.option("--model", default=None,
              help="SparseEncoder dir (bi-encoder or inference-free Router) or 'splade-tiny'; may be left out with "
                   "--baseline bm25-nori to measure the nori BM25 row alone.")
@click.option("--query-mode", type=click.Choice(["model", "tokens"]), default="model", show_default=True,
              help="model: the model's query encoder; tokens: SPARSE_TOKENIZE with IDF (inference-free).")
@click.option("--backend", type=click.Choice(["local", "opensearch"]), default="local", show_default=True)
@click.option("--index", "index_ref", default=None,
              help="Local: index dir to (re)use (default OUT/index); OpenSearch: the filled index name.")
@click.option("--model-id", default=None, help="OpenSearch + --query-mode model: the deployed model id.")
@click.option("--idf", default=None, help="idf.json / sparse_tokenize.zip for --query-mode tokens.")
@click.option("--max-queries", type=int, default=None, help="First N judged queries.")
@click.option("--max-docs", type=int, default=None, help="Cap the corpus (judged documents are always kept).")
@click.option("--prune-levels", default="0,0.05,0.1,0.2,0.3,0.5", show_default=True,
              help="Document max_ratio pruning levels of the sweep ('' for none).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Output dir: report.json, report.md, run.trec, effectiveness_vs_flops.png.")
@click.option("--baseline", type=click.Choice(["none", "bm25-nori"]), default="none", show_default=True,
              help="bm25-nori: also run `match` on the text field (nori analyzer, Lucene BM25) and report it first.")
@click.option("--hybrid", type=click.Choice(["none", "min_max", "z_score", "l2", "rrf"]), default="none",
              show_default=True,
              help="Also run hybrid [match, neural_sparse] bodies under a search pipeline: min-max, z-score or L2 "
                   "normalisation + weighted arithmetic mean, or RRF.")
@click.option("--weights", default="0.3,0.7", show_default=True,
              help="--hybrid min_max / z_score / l2: BM25,sparse weights (sum 1).")
@click.option("--rank-constant", type=int, default=60, show_default=True, help="--hybrid rrf: the rank constant.")
@click.option("--pagination-depth", type=int, default=None,
              help="--hybrid: hits each sub-query contributes (default: the evaluation depth, 100).")
@click.option("--query-language", default=None,
              help="Take the queries of the dataset's copy in this language (same query ids), e.g. `--dataset "
                   "msmarco-ko --query-language en`: English queries against the Korean corpus. The copy is "
                   "--parallel, else the sibling directory with the language suffix swapped (msmarco-en).")
@click.option("--corpus-language", default=None,
              help="Search the corpus of the copy in this language (`--query-language ko --corpus-language en`: "
                   "Korean queries -> English corpus), or `mixed`: both corpora in one index, a query judged "
                   "relevant on either copy of its passage (queries: --query-language, default the dataset's).")
@click.option("--parallel", type=click.Path(exists=True, file_okay=False), default=None,
              help="The parallel copy (BEIR directory, same query ids) when it is not the -<lang> sibling.")
@click.option("--queries", "queries_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Replace the query texts by this file's (BEIR JSONL _id/text or qid<TAB>text; same query ids).")
@click.option("--repair-text", default="en", show_default=True,
              help="Comma-separated languages whose copy is repaired with ftfy (the English MS MARCO passages "
                   "carry mojibake); '' keeps every text as is.")
@psq_options
@connection_options("opensearch")
def eval_cmd(dataset: str, split: str, model: str, query_mode: str, backend: str, index_ref: str | None,
             model_id: str | None, idf: str | None, max_queries: int | None, max_docs: int | None,
             prune_levels: str, out_dir: str, baseline: str, hybrid: str, weights: str, rank_constant: int,
             pagination_depth: int | None, query_language: str | None, corpus_language: str | None,
             parallel: str | None, queries_file: str | None, repair_text: str, query_encoder: str,
             psq_source: str | None, psq_alignment: str | None, psq_min_prob: float, **conn) -> None:
    """Evaluate an encoder through a backend: nDCG@10, MRR@10, Recall@100, FLOPS, active dims.

    Cross-lingual settings from parallel copies (same query ids), e.g. on MS MARCO-ko:
    English queries -> Korean corpus `--query-language en`; Korean queries -> English corpus
    `--corpus-language en`; mixed corpus `--corpus-language mixed [--query-language ko|en]`.
    """
    refuse_cluster_options(backend)
    from ..evaluation.crosslingual import CrossLingualSpec
    from ..evaluation.pipeline import EvalConfig, run_evaluation

    repair = [x.strip() for x in repair_text.split(",") if x.strip()]
    spec = CrossLingualSpec(dataset, split, query_language, corpus_language, parallel, queries_file, tuple(repair))
    if not model:
        if baseline == "none" or hybrid != "none" or backend != "local":
            fail("--model is required (only `--baseline bm25-nori` on the local backend runs without one)")
        if query_encoder == "psq":
            fail("--query-encoder psq needs --model (the transferred model whose alignment translates the query)")
        from ..evaluation.baselines import evaluate_baseline

        with user_errors():
            result = evaluate_baseline(dataset if spec.plain else spec.build(), out_dir, split=split,
                                       max_queries=max_queries, max_docs=max_docs)
        echo_json({"metrics": result["metrics"], "report": str(out_dir), "timings": result["timings"],
                   "rows": result["rows"]})
        return
    with user_errors():
        levels = [float(x) for x in prune_levels.split(",") if x.strip()]
        config = EvalConfig(dataset=dataset, split=split, model=model, query_mode=query_mode, backend=backend,
                            index=index_ref, model_id=model_id, idf=idf, max_queries=max_queries,
                            max_docs=max_docs, prune_levels=levels, baseline=baseline, hybrid=hybrid,
                            hybrid_weights=_weights(weights), rank_constant=rank_constant,
                            hybrid_window=pagination_depth, query_language=query_language,
                            corpus_language=corpus_language, parallel=parallel, queries_file=queries_file,
                            repair=repair, query_encoder=query_encoder, psq_source=psq_source,
                            psq_alignment=psq_alignment, psq_min_prob=psq_min_prob)
        client = None
        if backend == "opensearch":
            from ..engines import connect

            engine = connect(backend, **conn)
            engine.version  # noqa: B018 - unreachable / not OpenSearch: one sentence, first
            client = engine.client
        result = run_evaluation(config, out_dir, client=client, show_progress_bar=True)
    out = {"metrics": result["metrics"], "report": str(out_dir), "timings": result["timings"]}
    if result.get("rows"):
        out["rows"] = result["rows"]
    echo_json(out)


@cli.command("tune-hybrid")
@click.option("--dataset", required=True, type=click.Path(exists=True, file_okay=False),
              help="BEIR-layout directory holding the tuning queries and their judgements.")
@click.option("--split", default="train", show_default=True, help="Split the tuning queries come from.")
@click.option("--model", required=True, help="The sparse model of the neural_sparse sub-query (SparseEncoder dir).")
@click.option("--query-mode", type=click.Choice(["model", "tokens"]), default="tokens", show_default=True,
              help="tokens: IDF query tokens (inference-free models); model: the model's query encoder.")
@click.option("--query-ids", "query_ids_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Tune on these query ids (JSON list, a holdout_queries.json, or one per line). Default: the "
                   "model's own holdout_queries.json (queries `lsr-os train` left out), else --queries of --split "
                   "drawn with --seed.")
@click.option("--queries", "n_queries", type=int, default=500, show_default=True,
              help="How many queries to draw when the model names none.")
@click.option("--seed", type=int, default=42, show_default=True)
@click.option("--weight-step", type=float, default=0.05, show_default=True,
              help="BM25 weight grid step of the score techniques.")
@click.option("--techniques", default="min_max,rrf", show_default=True,
              help="Fusions to try: min_max, z_score, l2 (normalization-processor; z_score needs OpenSearch 3.0+), "
                   "rrf (score-ranker-processor).")
@click.option("--rank-constants", default="1-100", show_default=True, help="RRF rank constants: A-B or a,b,c.")
@click.option("--depths", default="10,50,100", show_default=True,
              help="Hits per sub-query (the hybrid query's pagination_depth) to try.")
@click.option("--metric", type=click.Choice(["mrr@10", "ndcg@10"]), default="mrr@10", show_default=True)
@click.option("--backend", type=click.Choice(["local", "opensearch"]), default="local", show_default=True)
@click.option("--index", "index_ref", default=None,
              help="Local: index dir to (re)use; OpenSearch: the filled index (text field analysed with nori).")
@click.option("--idf", default=None, help="idf.json for --query-mode tokens (default: the model's).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Output dir: hybrid_tuning.json / .md, search_pipeline.json (the best setting's body).")
@connection_options("opensearch")
def tune_hybrid_cmd(dataset: str, split: str, model: str, query_mode: str, query_ids_file: str | None,
                    n_queries: int, seed: int, weight_step: float, techniques: str, rank_constants: str, depths: str,
                    metric: str,
                    backend: str, index_ref: str | None, idf: str | None, out_dir: str, **conn) -> None:
    """Choose hybrid BM25 + neural_sparse settings on queries the model did not train on.

    Runs the `match` (nori BM25) and `neural_sparse` sub-queries once, then scores every min-max weight (step
    0.05), RRF rank constant (1-100) and sub-query depth (10 / 50 / 100) as neural-search fuses them. The best
    goes to OUT/search_pipeline.json; `lsr-os create-pipeline hybrid NAME --from-tuning OUT/hybrid_tuning.json`
    creates it on a cluster (use the printed pagination_depth in the hybrid query).
    """
    refuse_cluster_options(backend)
    from ..evaluation.hybrid_tuning import HybridGrid, tune_hybrid, tuning_query_ids
    from ..evaluation.pipeline import EvalConfig

    with user_errors():
        if "-" in rank_constants:
            lo, hi = (int(x) for x in rank_constants.split("-", 1))
            constants = list(range(lo, hi + 1))
        else:
            constants = [int(x) for x in rank_constants.split(",") if x.strip()]
        grid = HybridGrid(weight_step=weight_step, rank_constants=constants,
                          depths=[int(x) for x in depths.split(",") if x.strip()], metric=metric,
                          techniques=[t.strip() for t in techniques.split(",") if t.strip()])
        ids, source = tuning_query_ids(model, dataset, split, n_queries, seed, query_ids_file)
        config = EvalConfig(dataset=dataset, split=split, model=model, query_mode=query_mode, backend=backend,
                            index=index_ref, idf=idf, query_ids=ids)
        client = None
        if backend == "opensearch":
            from ..engines import connect

            engine = connect(backend, **conn)
            engine.version  # noqa: B018 - unreachable / not OpenSearch: one sentence, first
            client = engine.client
        tuned = tune_hybrid(config, out_dir, grid, client=client)
    best = tuned.best
    echo_json({"queries": tuned.queries, "query_source": source, "best": best["label"], "setting": best["setting"],
               tuned.metric: best[tuned.metric], "sub_queries": tuned.sub_queries,
               "best_per_technique": {k: {"label": v["label"], tuned.metric: v[tuned.metric]}
                                      for k, v in tuned.best_per_technique.items()},
               "pipeline": str(Path(out_dir) / "search_pipeline.json")})


def _weights(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--weights must be two numbers like 0.3,0.7, got {text!r}") from None
    if len(values) != 2:
        raise ValueError(f"--weights must be two numbers (BM25, sparse) like 0.3,0.7, got {text!r}")
    return values


@cli.command("inference-free")
@click.option("--model", "model_dir", required=True,
              help="Document encoder: a SparseEncoder dir (e.g. a SemBridge/VT output) or 'splade-tiny'.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Output: a sentence-transformers Router (query: IDF, document: the encoder) + idf.json.")
@click.option("--idf-corpus", type=click.Path(exists=True), default=None,
              help="Compute the IDF from this corpus through the model's tokenizer (BEIR corpus.jsonl/dir or text).")
@click.option("--idf-json", type=click.Path(exists=True), default=None,
              help="Use this IDF table (idf.json, a dir holding one, or a sparse_tokenize.zip) as it is.")
@click.option("--source-idf", type=click.Path(exists=True), default=None,
              help="A source doc-only model's idf.json, carried to the model's vocabulary through its "
                   "alignment.npz (the transfer's mixing weights).")
def inference_free_cmd(model_dir: str, out_dir: str, idf_corpus: str | None, idf_json: str | None,
                       source_idf: str | None) -> None:
    """Build a doc-only (inference-free) encoder: IDF query side, the model as document side."""
    from ..inference_free import build_inference_free, transferred_idf
    from ..corpus import iter_corpus_texts
    from ..idf import compute_idf, load_idf

    chosen = [name for name, v in (("--idf-corpus", idf_corpus), ("--idf-json", idf_json),
                                   ("--source-idf", source_idf)) if v]
    if len(chosen) != 1:
        fail("pass exactly one of --idf-corpus, --idf-json and --source-idf")
    with user_errors():
        if source_idf:
            idf, how = transferred_idf(model_dir, source_idf), f"transferred from {source_idf}"
        elif idf_json:
            idf, how = load_idf(idf_json), f"file {idf_json}"
        else:
            from ..transfer.surgery import load_target_tokenizer, resolve_model_path

            tok = load_target_tokenizer(resolve_model_path(model_dir), what="model tokenizer")
            idf, how = compute_idf(iter_corpus_texts(idf_corpus), tok), f"corpus {idf_corpus}"
        build_inference_free(model_dir, out_dir, idf=idf)
    echo_json({"out": out_dir, "idf": how, "idf_entries": len(idf)})


@cli.command("quickstart")
@click.option("--workdir", default="runs/quickstart", show_default=True, type=click.Path(file_okay=False))
@click.option("--data", type=click.Choice(["auto", "shared", "packaged"]), default="packaged", show_default=True,
              help="packaged: Korean text shipped in a registry package + a toolkit-trained vocabulary (~6 min on "
                   "2 cores from scratch); shared: kobigbird vocab + MS MARCO-ko from ../shared/data (richer, but "
                   "the first run embeds ~60k token strings with the bridge: 30+ min without a warm cache); "
                   "auto: shared when present.")
@click.option("--max-docs", type=int, default=None, help="Cap the corpus (default 600 packaged / 1000 shared).")
@click.option("--max-queries", type=int, default=None, help="Cap the evaluated queries (default 100).")
@click.option("--vocab-size", type=int, default=3000, show_default=True,
              help="packaged: size of the Korean vocabulary the toolkit trains.")
@click.option("--source-vocab", type=int, default=None,
              help="SemBridge candidates: the N most frequent source tokens, 0 = all (default 3000 packaged, "
                   "0 shared). Fewer is faster on a fresh machine (the bridge embeds each surface once).")
def quickstart_cmd(workdir: str, data: str, max_docs: int | None, max_queries: int | None, vocab_size: int,
                   source_vocab: int | None) -> None:
    """Run the whole Korean chain locally: transfer, export (+ conformance), index, search, evaluate."""
    from ..quickstart import QuickstartConfig, run_quickstart

    with user_errors():
        config = QuickstartConfig(workdir=workdir, data=data, max_docs=max_docs, max_queries=max_queries,
                                  vocab_size=vocab_size, source_vocab=source_vocab)
        run_quickstart(config, echo=click.echo)
