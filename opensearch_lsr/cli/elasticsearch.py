"""Elasticsearch on the existing commands: ``export --target``, ``deploy-model``, ``create-index``,
``create-pipeline``, ``index``, ``search``, ``eval`` with ``--backend elasticsearch``.

The commands live in their own modules (``deploy``, ``index``, ``search``); this module adds the
Elasticsearch options to them when it is imported (after them, see ``cli/__init__.py``) and routes a
call to the Elasticsearch library functions when ``--backend elasticsearch`` / ``--target`` asks for
it; every other call reaches the original command unchanged. Connection: ``--url`` given on the
command line, else ``ELASTICSEARCH_URL``; ``--cloud-id`` / ``ELASTIC_CLOUD_ID``; ``--api-key`` /
``ELASTICSEARCH_API_KEY``; ``--user``/``--password`` (or ``ELASTICSEARCH_USER``/``ELASTICSEARCH_PASSWORD``);
TLS verification stays on unless ``--insecure``.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import click

from .app import CLUSTER_OPTIONS, cli, compile_setting, echo_json, fail, ray_options, typed_options, user_errors

__all__ = ["extend_command", "es_client_from_options", "es_connection_from_options"]

def _es_connection() -> list[click.Option]:
    """Fresh ``--api-key`` / ``--cloud-id`` options (one set per command)."""
    return [
    click.Option(["--api-key"], envvar="ELASTICSEARCH_API_KEY", show_envvar=True, default=None,
                 help="Elasticsearch API key (id:key or the encoded form); --backend elasticsearch."),
    click.Option(["--cloud-id"], envvar="ELASTIC_CLOUD_ID", show_envvar=True, default=None,
                 help="Elastic Cloud deployment id instead of --url; --backend elasticsearch."),
    ]


#: the shared connection options every Elasticsearch route reads (``es_connection_from_options``): all but AWS signing
CONNECTION = frozenset(CLUSTER_OPTIONS) - {"aws_region", "aws_service"}


def extend_command(name: str, options: list[click.Option], use_es: Callable[[dict, dict], bool],
                   handler: Callable[[dict, dict], None], backend_choice: bool = False, *,
                   es_reads: Callable[[dict], Any] | Any = None, route: str = "--backend elasticsearch") -> None:
    """Add ``options`` to command ``name``; call ``handler(kwargs, es_kwargs)`` when ``use_es`` says so.

    With ``backend_choice`` the command's existing ``--backend`` choice gains ``elasticsearch``. Nothing typed on
    the command line is dropped in silence: on the Elasticsearch route (``route`` names it) the command's own
    options other than ``es_reads`` (a set, or a function of the added options' values; ``None``: all) and
    the connection options are refused; on the original route, the added Elasticsearch options are.
    """
    cmd = cli.commands[name]
    original = cmd.callback
    names = [o.name for o in options]
    own = [p.name for p in cmd.params]
    cmd.params.extend(options)
    if backend_choice:
        for param in cmd.params:
            if param.name == "backend" and isinstance(param.type, click.Choice):
                param.type = click.Choice(list(param.type.choices) + ["elasticsearch"])

    @functools.wraps(original)
    def callback(**kwargs: Any) -> Any:
        mine = {n: kwargs.pop(n) for n in names}
        ctx = click.get_current_context()
        if use_es(kwargs, mine):
            reads = es_reads(mine) if callable(es_reads) else es_reads
            if reads is not None:
                ignored = typed_options(ctx, [n for n in own if n not in set(reads) | CONNECTION | {"backend"}])
                if ignored:
                    fail(f"{', '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} not apply with {route}")
            return handler(kwargs, mine)
        extra = typed_options(ctx, [n for n in names if n not in ("backend", "target")])
        if extra:
            fail(f"{', '.join(extra)} {'is an Elasticsearch option' if len(extra) == 1 else 'are Elasticsearch options'}"
                 f": add {route}")
        return original(**kwargs)

    cmd.callback = callback


def es_connection_from_options(conn: dict, es: dict) -> dict[str, Any]:
    """The keyword arguments of ``make_es_client`` from the shared connection options plus
    ``--api-key``/``--cloud-id`` and the ``ELASTICSEARCH_*`` environment (resolved here, on the driver)."""
    ctx = click.get_current_context()
    explicit = ctx.get_parameter_source("url") == click.core.ParameterSource.COMMANDLINE
    url = conn.get("url") if explicit else (os.environ.get("ELASTICSEARCH_URL") or conn.get("url"))
    if es.get("cloud_id"):
        url = None
    if not url and not es.get("cloud_id"):
        fail("the elasticsearch backend needs --url (or ELASTICSEARCH_URL) or --cloud-id")
    return dict(url=url, cloud_id=es.get("cloud_id"), api_key=es.get("api_key"),
                user=conn.get("user") or os.environ.get("ELASTICSEARCH_USER"),
                password=conn.get("password") or os.environ.get("ELASTICSEARCH_PASSWORD"),
                ca_certs=conn.get("ca_certs"), insecure=bool(conn.get("insecure")),
                request_timeout=conn.get("request_timeout") or 60.0, max_retries=conn.get("max_retries") or 3)


def es_client_from_options(conn: dict, es: dict):
    """An Elasticsearch client from the shared connection options plus ``--api-key``/``--cloud-id``."""
    from ..elasticsearch.client import make_es_client

    connection = es_connection_from_options(conn, es)
    with user_errors():
        return make_es_client(**connection)


# ---- export --target ----------------------------------------------------------------------------

def _export(kw: dict, es: dict) -> None:
    from ..elasticsearch.export import export_elasticsearch
    from ..engines import export

    out: dict[str, Any] = {}
    with user_errors():
        if es["target"] == "both":
            out["opensearch"] = export("opensearch", kw["model_dir"], kw["out_dir"], idf_corpus=kw["idf_corpus"],
                                       prune=kw["prune"], key_format=kw["key_format"], verify=kw["verify"],
                                       name=kw["name"], version=kw["model_version"], idf_json=kw["idf_json"])
        elif kw["prune"]:
            fail("--prune is an OpenSearch export option (the Elasticsearch model is not pruned in the graph)")
        out["elasticsearch"] = export_elasticsearch(kw["model_dir"], kw["out_dir"], model_id=es["es_model_id"],
                                                    verify=kw["verify"])
    echo_json(out if len(out) > 1 else out["elasticsearch"])


extend_command("export", [
    click.Option(["--target"], type=click.Choice(["opensearch", "elasticsearch", "both"]), default="opensearch",
                 show_default=True, help="opensearch: the ML Commons bundle; elasticsearch: OUT/elasticsearch/ "
                 "(text_expansion trained model, vocabulary, config); both."),
    click.Option(["--es-model-id"], default=None, help="Elasticsearch trained-model id [default: lsr-<model name>]."),
], lambda kw, es: es["target"] != "opensearch", _export, route="--target elasticsearch or both",
   es_reads=lambda es: None if es["target"] == "both" else {"model_dir", "out_dir", "verify", "prune"})


# ---- deploy-model --backend elasticsearch --------------------------------------------------------

def _deploy(kw: dict, es: dict) -> None:
    from ..elasticsearch.deploy import ClientTransport, EsDeployConfig, RecordingTransport, deploy_es_model

    if kw.get("requests_file") and not kw.get("dry_run"):
        fail("--requests only applies with --dry-run")
    with user_errors():
        config = EsDeployConfig(model_id=es["model_id"], replace=es["replace"], inference_endpoint=es["inference_endpoint"],
                                timeout_s=kw["timeout_s"])
    if kw.get("dry_run"):
        rec = RecordingTransport()
        with user_errors():
            result = deploy_es_model(kw["bundle"], rec, config, progress=False)
            if kw.get("requests_file"):
                rec.write_ndjson(kw["requests_file"])
        echo_json({"dry_run": True, "backend": "elasticsearch", "requests": len(rec.requests),
                   "requests_file": kw.get("requests_file"), "model_id": result["model_id"],
                   "sequence": [f"{r['method']} {r['path']}" for r in rec.requests]})
        return
    client = es_client_from_options(kw, es)
    with user_errors():
        echo_json(deploy_es_model(kw["bundle"], ClientTransport(client), config))


extend_command("deploy-model", [
    click.Option(["--backend"], type=click.Choice(["opensearch", "elasticsearch"]), default="opensearch",
                 show_default=True, help="Where to deploy: ML Commons or an Elasticsearch trained model."),
    *_es_connection(),
    click.Option(["--model-id"], default=None, help="Elasticsearch: trained-model id [default: the export's]."),
    click.Option(["--inference-endpoint"], default=None,
                 help="Elasticsearch: also create PUT _inference/sparse_embedding/<id> (elasticsearch service)."),
    click.Option(["--replace"], is_flag=True, help="Elasticsearch: replace a different model under the same id."),
], lambda kw, es: es["backend"] == "elasticsearch", _deploy,
   es_reads={"bundle", "timeout_s", "dry_run", "requests_file"})


# ---- index --backend elasticsearch -----------------------------------------------------------------

def _index(kw: dict, es: dict) -> None:
    from ..elasticsearch.bulk import EsWriterFactory
    from ..encoding.job import IndexJobConfig, run_index_job

    if kw["resume"] and kw["restart"]:
        fail("--resume and --restart contradict each other: pick one")
    if kw["key_format"] != "word" or kw["long_text"] != "truncate":
        fail("the elasticsearch backend indexes token keys (--key-format word) of truncated texts (--long-text truncate)")
    ray = kw.get("engine", "single") == "ray"
    connection = es_connection_from_options(kw, es)
    factory = EsWriterFactory(connection, kw["index_name"], sparse_field=kw["sparse_field"])
    if not ray:
        ray_options("single", kw)  # refuses Ray options typed without --engine ray
    with user_errors(first_line=True):
        writer = factory()  # a bad --url / credentials combination fails here, before any model is loaded
        from ..elasticsearch.client import detect_es_features

        detect_es_features(writer.bulk.client)  # the cluster answers (version, client major) before any encoding
        config = IndexJobConfig(corpus=kw["corpus"], model=kw["model"], backend="elasticsearch", index=kw["index_name"],
                                work_dir=kw["work_dir"] or os.path.join("lsr-os-jobs", "elasticsearch", kw["index_name"]),
                                corpus_format=kw["corpus_format"], id_field=kw["id_field"],
                                corpus_text_field=kw["corpus_text_field"], corpus_title_field=kw["corpus_title_field"],
                                invalid_utf8=kw["invalid_utf8"], prune=kw["prune"], batch_size=kw["batch_size"],
                                chunk_docs=kw["chunk_docs"], window_docs=kw["window_docs"],
                                checkpoint_interval_s=kw["checkpoint_interval"],
                                device=kw["device"], precision=kw["precision"],
                                text_field=kw["text_field"], sparse_field=kw["sparse_field"], limit=kw["limit"],
                                threads=kw["threads"], encoder_runtime=kw.get("encoder_runtime", "torch"),
                                batching=kw.get("batching", "auto"), max_batch_tokens=kw.get("max_batch_tokens"),
                                compile=compile_setting(kw.get("compile_"), kw.get("no_compile", False)),
                                bulk_concurrency=kw.get("bulk_concurrency"),
                                encoder_process=bool(kw.get("encoder_process")))
        if ray:
            # each Ray actor builds its own client and writer from the picklable factory
            from ..encoding.ray_job import run_ray_index_job

            options = ray_options("ray", kw)
            summary = run_ray_index_job(config, options, resume=kw["resume"], restart=kw["restart"],
                                        writer_factory=factory, progress=not kw["no_progress"])
        else:
            summary = run_index_job(config, resume=kw["resume"], restart=kw["restart"], writer=writer,
                                    progress=not kw["no_progress"])
    summary["backend"] = "elasticsearch"
    echo_json(summary)


extend_command("index", _es_connection(), lambda kw, es: kw["backend"] == "elasticsearch", _index,
               backend_choice=True,  # every option but the document workers (ndjson) and AWS signing (OpenSearch)
               es_reads=lambda es: {p.name for p in cli.commands["index"].params} - {"build_workers", "aws_region",
                                                                                    "aws_service"})


# ---- search / eval --backend elasticsearch -----------------------------------------------------------

def _search(kw: dict, es: dict) -> None:
    from ..elasticsearch.engine import ElasticsearchEngine
    from ..elasticsearch.query import query_vector_for, rrf_body, search_body, sparse_vector_query

    field = kw["field"] or "sparse_embedding"
    with user_errors():
        if kw["mode"] in ("tokens", "hybrid") and kw["model"]:
            clause = sparse_vector_query(field, query_vector=query_vector_for(kw["query_text"], kw["model"]))
        elif kw["mode"] in ("model", "hybrid") and kw["model_id"]:
            clause = sparse_vector_query(field, inference_id=kw["model_id"], query=kw["query_text"])
        else:
            raise ValueError("--backend elasticsearch: --mode tokens needs --model (bundle or encoder), --mode model "
                             "needs --model-id (deployed model or inference endpoint)")
    engine = ElasticsearchEngine(es_client_from_options(kw, es))
    with user_errors():
        features = engine.features if kw["mode"] == "hybrid" else None  # version + licence before the query
        body = (rrf_body(kw["text_field"], kw["query_text"], clause, size=kw["size"], rank_constant=kw["rank_constant"],
                         features=features)
                if kw["mode"] == "hybrid" else search_body(clause, size=kw["size"]))
    if kw["show_query"]:
        echo_json(body)
    with user_errors():
        resp = engine.search(kw["index_ref"], body)
    echo_json(resp if kw["as_json"] else [{"_id": h["_id"], "_score": h["_score"]} for h in resp["hits"]["hits"]])


def _eval(kw: dict, es: dict) -> None:
    from ..elasticsearch.engine import ElasticsearchEngine
    from ..evaluation.elasticsearch import EsEvalConfig, evaluate_es

    if kw["hybrid"] not in ("none", "rrf"):
        fail(f"--backend elasticsearch fuses hybrid results with the rrf retriever: --hybrid rrf, not {kw['hybrid']}")
    if kw["query_mode"] == "model" and not kw["model_id"] and typed_options(click.get_current_context(), ["query_mode"]):
        fail("--backend elasticsearch: --query-mode model needs --model-id (deployed model or inference endpoint)")
    with user_errors():  # the default query mode (model) without --model-id: query vectors computed here
        config = EsEvalConfig(dataset=kw["dataset"], split=kw["split"], index=kw["index_ref"] or "",
                              query_mode="model" if kw["query_mode"] == "model" and kw["model_id"] else "tokens",
                              model=kw["idf"] or kw["model"], inference_id=kw["model_id"],
                              hybrid=kw["hybrid"] == "rrf", rank_constant=kw["rank_constant"],
                              max_queries=kw["max_queries"])
    engine = ElasticsearchEngine(es_client_from_options(kw, es))
    with user_errors():
        if config.hybrid:  # version and licence before the first query, not a 403 per query
            from ..elasticsearch.query import check_rrf

            check_rrf(engine.features)
        echo_json(evaluate_es(config, kw["out_dir"], engine.search))


extend_command("search", _es_connection(), lambda kw, es: kw["backend"] == "elasticsearch", _search,
               backend_choice=True, es_reads={"index_ref", "query_text", "mode", "rank_constant", "text_field", "model",
                                              "model_id", "field", "size", "show_query", "as_json"})
extend_command("eval", _es_connection(), lambda kw, es: kw["backend"] == "elasticsearch", _eval,
               backend_choice=True, es_reads={"dataset", "split", "index_ref", "query_mode", "model", "idf", "model_id",
                                              "hybrid", "rank_constant", "max_queries", "out_dir"})


# ---- create-index / create-pipeline --backend elasticsearch ---------------------------------------------

def _create_index(kw: dict, es: dict) -> None:
    from ..elasticsearch.client import detect_es_features
    from ..elasticsearch.deploy import ClientTransport
    from ..elasticsearch.indices import create_index, index_body, index_options

    if kw["kind"] != "rank_features" or kw["long_text"] != "truncate" or kw["search_pipeline"]:
        fail("--backend elasticsearch creates one exact sparse_vector field (no --kind sparse_vector/SEISMIC, "
             "--long-text split or --search-pipeline)")
    if kw["text_analyzer"] == "standard":
        fail("--backend elasticsearch: --text-analyzer is one of auto, nori, cjk")
    client = es_client_from_options(kw, es)
    with user_errors():
        features = detect_es_features(client)
        options = index_options(features, es["prune_tokens"], es["tokens_freq_ratio_threshold"],
                                es["tokens_weight_threshold"])
        body = index_body(features, text_field=kw["text_field"], sparse_field=kw["vector_field"],
                          text_analyzer=kw["text_analyzer"], default_pipeline=kw["pipeline"], options=options)
        out = create_index(ClientTransport(client), kw["name"], body)
    echo_json({"index": kw["name"], "acknowledged": out.get("acknowledged"), "backend": "elasticsearch",
               "cluster": features.to_dict(), "mappings": body["mappings"]})


def _create_pipeline(kw: dict, es: dict) -> None:
    from ..elasticsearch.deploy import ClientTransport
    from ..elasticsearch.indices import pipeline_body, put_pipeline

    if kw["kind"] != "ingest":
        fail("--backend elasticsearch: only `create-pipeline ingest` (hybrid search is the rrf retriever of "
             "`lsr-os search --mode hybrid`, no search pipeline)")
    if not kw["model_id"]:
        fail("create-pipeline ingest needs --model-id (the text_expansion model id printed by deploy-model)")
    client = es_client_from_options(kw, es)
    body = pipeline_body(kw["model_id"], text_field=kw["text_field"], sparse_field=kw["vector_field"])
    with user_errors():
        put_pipeline(ClientTransport(client), kw["name"], body)
    echo_json({"pipeline": kw["name"], "backend": "elasticsearch", "body": body})


def _backend_option() -> click.Option:
    return click.Option(["--backend"], type=click.Choice(["opensearch", "elasticsearch"]), default="opensearch",
                        show_default=True, help="The cluster kind.")


extend_command("create-index", [
    _backend_option(), *_es_connection(),
    click.Option(["--prune-tokens"], is_flag=True,
                 help="Elasticsearch 8.19/9.1+: index_options.prune (queries that do not set prune use it)."),
    click.Option(["--tokens-freq-ratio-threshold"], type=float, default=None,
                 help="Elasticsearch: index_options.pruning_config, 1..100 (default 5)."),
    click.Option(["--tokens-weight-threshold"], type=float, default=None,
                 help="Elasticsearch: index_options.pruning_config, 0..1 (default 0.4)."),
], lambda kw, es: es["backend"] == "elasticsearch", _create_index,
   es_reads={"name", "kind", "long_text", "search_pipeline", "text_analyzer", "text_field", "vector_field", "pipeline"})
extend_command("create-pipeline", [_backend_option(), *_es_connection()],
               lambda kw, es: es["backend"] == "elasticsearch", _create_pipeline,
               es_reads={"kind", "name", "model_id", "text_field", "vector_field"})
