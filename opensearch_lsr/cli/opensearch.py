"""OpenSearch's own commands: `lsr-os export` (the ML Commons bundle), `deploy-model`, `create-index`,
`create-pipeline`, `airgap-kit`: ship a model and set up an index on a cluster. (Elasticsearch adds its variants in
:mod:`.elasticsearch`; the engine-neutral commands `index`, `search`, `eval` reach engines through the registry.)
"""
from __future__ import annotations

import click

from ..opensearch.client import connection_options as _connection_options
from .app import cli, echo_json, fail, typed_options, user_errors

__all__ = ["export_cmd", "deploy_model_cmd", "create_index_cmd", "create_pipeline_cmd", "airgap_kit_cmd"]


@cli.command("export")
@click.argument("model_dir", type=str)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Bundle directory to write (sparse_encoding.zip, sparse_tokenize.zip, manifest.json).")
@click.option("--idf-corpus", type=click.Path(exists=True), default=None,
              help="Compute idf.json for the query side from this corpus: a BEIR corpus.jsonl (or its "
                   "directory) or a text file with one document per line.")
@click.option("--idf-json", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Ship this idf.json instead (e.g. one carried over from a source model).")
@click.option("--prune", default=None, metavar="max_ratio:R",
              help="Prune inside the model graph: keep weights >= R * the document's max weight (0 <= R < 1).")
@click.option("--key-format", type=click.Choice(["auto", "word", "token_id"]), default="auto", show_default=True,
              help="Token keys: 'word' (single-id decode, any OpenSearch), 'token_id' (ids, OpenSearch 3.2+); "
                   "'auto' picks token_id only when the tokenizer's decodes collide.")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Run the zip the way ML Commons does and compare with the Python encoder (within 1e-4).")
@click.option("--name", default=None, help="ML Commons model name (default: the model directory's name).")
@click.option("--version", "model_version", default="1.0.0", show_default=True, help="ML Commons model version.")
def export_cmd(model_dir: str, out_dir: str, idf_corpus: str | None, idf_json: str | None, prune: str | None,
               key_format: str, verify: bool, name: str | None, model_version: str) -> None:
    """Export MODEL_DIR (a SparseEncoder directory or `splade-tiny`) as an OpenSearch ML Commons bundle.

    \b
    Writes OUT/sparse_encoding.zip (TorchScript + tokenizer.json, function SPARSE_ENCODING),
    OUT/sparse_tokenize.zip (tokenizer.json + idf.json, SPARSE_TOKENIZE, the inference-free
    query side) and OUT/manifest.json (hashes, vocabulary, versions), then prints the manifest.
    Next: `lsr-os deploy-model OUT --url ...`.
    \b
    Device: the TorchScript holds no device constant (the attention mask is built in the graph),
    so it follows the device DJL loads it on; manifest.json "ml_node_devices" says ["any"].
    Bundles exported before this fix say ["cpu"]: they fail on GPU ML nodes ("Failed to deploy
    model"). A deploy on a GPU ML node has not been run by this project (no GPU available).
    """
    from ..opensearch.artifacts import export_bundle

    with user_errors():
        manifest = export_bundle(model_dir, out_dir, idf_corpus=idf_corpus, prune=prune, key_format=key_format,
                                 verify=verify, name=name, version=model_version, idf_json=idf_json)
    echo_json(manifest)


def _cluster(kwargs: dict):
    """Client + features from the shared connection options; bad options -> one sentence."""
    from ..opensearch.client import client_from_options, detect_features

    with user_errors():
        client = client_from_options(**kwargs)
        return client, detect_features(client)


@cli.command("deploy-model")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@_connection_options
@click.option("--apply-settings", is_flag=True,
              help="PUT the ML Commons cluster settings this flow needs (local-file upload, no ML-node-only, "
                   "heap breaker off).")
@click.option("--model-group", default=None, help="Register into this model group (created if missing).")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds to wait for each deploy task.")
@click.option("--which", type=click.Choice(["encoding", "tokenize", "both"]), default="both", show_default=True,
              help="Deploy the SPARSE_ENCODING model, the SPARSE_TOKENIZE model, or both.")
@click.option("--chunk-size", type=int, default=10_000_000, show_default=True, help="Upload chunk bytes (<= 10 MB).")
@click.option("--no-verify", is_flag=True, help="Skip the _predict smoke test after deploying.")
@click.option("--dry-run", is_flag=True,
              help="Contact no cluster: plan the requests a deploy to a fresh cluster would send (see --requests).")
@click.option("--requests", "requests_file", type=click.Path(dir_okay=False), default=None,
              help="With --dry-run: write the request sequence here as NDJSON (method, path, query, body; "
                   "binary chunks as bytes + sha256 + bundle file/offset).")
@click.option("--cluster-version", default=None,
              help="With --dry-run: the OpenSearch version to plan for [default: 3.3.0].")
def deploy_model_cmd(bundle: str, apply_settings: bool, model_group: str | None, timeout_s: float, which: str,
                     chunk_size: int, no_verify: bool, dry_run: bool, requests_file: str | None,
                     cluster_version: str | None, **conn) -> None:
    """Register and deploy an export BUNDLE in ML Commons; prints the model ids as JSON (idempotent).

    \b
    Re-running it reuses a model with the same sha256 (DEPLOYED: kept; REGISTERED: deployed).
    GPU ML nodes: DJL warms the model up on every device; a bundle whose manifest says
    "ml_node_devices": ["cpu"] (exported before the device-agnostic trace) runs on CPU ML
    nodes only and fails on a GPU node with "Failed to deploy model"; re-export it.
    --dry-run --requests FILE writes the exact requests without contacting a cluster.
    """
    from ..opensearch.mlcommons import DeployConfig, deploy_bundle

    if (requests_file or cluster_version) and not dry_run:
        fail("--requests and --cluster-version only apply with --dry-run")
    with user_errors():
        config = DeployConfig(which=which, model_group=model_group, apply_settings=apply_settings,
                              timeout_s=timeout_s, chunk_size=chunk_size, verify=not no_verify)
    if dry_run:
        from ..opensearch.dryrun import DRY_RUN_VERSION, dry_run_deploy, write_requests_ndjson

        with user_errors():
            planned = dry_run_deploy(bundle, config, version=cluster_version or DRY_RUN_VERSION)
            if requests_file:
                write_requests_ndjson(planned, requests_file)
        echo_json({"dry_run": True, "cluster_version": cluster_version or DRY_RUN_VERSION, "requests": len(planned),
                   "requests_file": requests_file,
                   "sequence": [f"{r['method']} {r['path']}" for r in planned]})
        return
    client, features = _cluster(conn)
    with user_errors():
        echo_json(deploy_bundle(client, bundle, config, features=features))


def _vocab_from_bundle(bundle: str | None, vocab_size: int | None) -> int | None:
    if vocab_size is not None or not bundle:
        return vocab_size
    from pathlib import Path

    from ..config import read_json

    manifest = Path(bundle) / "manifest.json"
    if not manifest.is_file():
        fail(f"{bundle} has no manifest.json")
    return read_json(manifest).get("vocab_size")


@cli.command("create-index")
@click.argument("name")
@_connection_options
@click.option("--kind", type=click.Choice(["rank_features", "sparse_vector"]), default="rank_features",
              show_default=True, help="rank_features (exact) or sparse_vector + SEISMIC ANN (3.3+).")
@click.option("--pipeline", default=None, help="Default ingest pipeline (index.default_pipeline).")
@click.option("--text-analyzer", type=click.Choice(["auto", "nori", "cjk", "standard"]), default="auto",
              show_default=True, help="Analyzer of the Korean text field; auto = nori if installed, else cjk.")
@click.option("--text-field", default="text", show_default=True)
@click.option("--vector-field", default="sparse_embedding", show_default=True)
@click.option("--bundle", type=click.Path(exists=True, file_okay=False), default=None,
              help="Export bundle: its vocabulary size is checked against sparse_vector's 32768-id limit.")
@click.option("--vocab-size", type=int, default=None, help="Model vocabulary size (instead of --bundle).")
@click.option("--search-pipeline", default=None, help="Also attach this search pipeline (index.search.default_pipeline).")
@click.option("--long-text", type=click.Choice(["truncate", "split"]), default="truncate", show_default=True,
              help="split: map the vector field as nested passages (VECTOR_FIELD.sparse_encoding), the shape "
                   "`lsr-os index --long-text split` writes; rank_features only.")
def create_index_cmd(name: str, kind: str, pipeline: str | None, text_analyzer: str, text_field: str,
                     vector_field: str, bundle: str | None, vocab_size: int | None, search_pipeline: str | None,
                     long_text: str, **conn) -> None:
    """Create index NAME from mappings/<kind>.json, adapted to the cluster's version and plugins."""
    from ..opensearch.indices import attach_search_pipeline, create_index

    client, features = _cluster(conn)
    with user_errors():
        out = create_index(client, name, kind, features, text_analyzer=text_analyzer, ingest_pipeline=pipeline,
                           text_field=text_field, vector_field=vector_field,
                           vocab_size=_vocab_from_bundle(bundle, vocab_size), long_text=long_text)
        if search_pipeline:
            attach_search_pipeline(client, name, search_pipeline)
            out["search_pipeline"] = search_pipeline
    out.pop("body", None)
    echo_json({**out, "cluster_version": features.version_string})


@cli.command("create-pipeline")
@click.argument("kind", type=click.Choice(["ingest", "two-phase", "hybrid"]))
@click.argument("name")
@_connection_options
@click.option("--model-id", default=None, help="ingest: the SPARSE_ENCODING model id from deploy-model.")
@click.option("--text-field", default="text", show_default=True)
@click.option("--vector-field", default="sparse_embedding", show_default=True)
@click.option("--prune", default=None, help="ingest: TYPE:RATIO, e.g. max_ratio:0.1 or top_k:64 (2.19+).")
@click.option("--batch-size", type=int, default=None, help="ingest: processor batch_size (2.16+).")
@click.option("--skip-existing", is_flag=True, help="ingest: skip inference for unchanged text (3.0+).")
@click.option("--prune-ratio", type=float, default=0.4, show_default=True, help="two-phase: max_ratio split.")
@click.option("--expansion-rate", type=float, default=5.0, show_default=True, help="two-phase: >= 1.0.")
@click.option("--max-window-size", type=int, default=10000, show_default=True, help="two-phase: >= 50.")
@click.option("--technique", type=click.Choice(["auto", "normalization", "rrf"]), default="auto", show_default=True,
              help="hybrid: RRF (2.19+) or min-max + weighted mean; auto = RRF when available.")
@click.option("--normalization", type=click.Choice(["min_max", "z_score", "l2"]), default="min_max",
              show_default=True, help="hybrid normalization: the score technique (z_score needs OpenSearch 3.0+).")
@click.option("--weights", default="0.3,0.7", show_default=True, help="hybrid normalization: BM25,neural_sparse.")
@click.option("--rank-constant", type=int, default=60, show_default=True, help="hybrid RRF constant.")
@click.option("--from-tuning", type=click.Path(exists=True, dir_okay=False), default=None,
              help="hybrid: take technique, weights and rank constant from `lsr-os tune-hybrid`'s "
                   "hybrid_tuning.json (overrides --technique/--weights/--rank-constant).")
@click.option("--index", "attach_to", default=None, help="search pipelines: attach as the index's default.")
def create_pipeline_cmd(kind: str, name: str, model_id: str | None, text_field: str, vector_field: str,
                        prune: str | None, batch_size: int | None, skip_existing: bool, prune_ratio: float,
                        expansion_rate: float, max_window_size: int, technique: str, normalization: str,
                        weights: str, rank_constant: int, from_tuning: str | None, attach_to: str | None,
                        **conn) -> None:
    """Create pipeline NAME from pipelines/*.json: ingest (sparse_encoding), two-phase or hybrid search.

    hybrid with --technique auto: RRF where the cluster has it, unless --weights or --normalization are given
    (then normalization), or --rank-constant (then RRF).
    """
    from ..opensearch import indices as ix

    technique = _pipeline_options(kind, technique)
    depth = None
    if from_tuning:
        with user_errors():
            technique, normalization, weights, rank_constant, depth = _tuned_setting(from_tuning)
    with user_errors():
        if kind == "ingest":
            if not model_id:
                fail("create-pipeline ingest needs --model-id (the sparse_encoding id printed by deploy-model)")
            ptype, ratio = ix.parse_prune(prune)
        elif kind == "hybrid":
            try:
                parsed = tuple(float(w) for w in weights.split(","))
            except ValueError:
                fail(f"--weights must be two numbers like 0.3,0.7, got {weights!r}")
    client, features = _cluster(conn)
    with user_errors():
        if kind == "ingest":
            body = ix.ingest_pipeline_body(model_id, features, text_field=text_field, vector_field=vector_field,
                                           prune_type=ptype, prune_ratio=ratio, batch_size=batch_size,
                                           skip_existing=skip_existing)
            ix.put_ingest_pipeline(client, name, body)
        else:
            if kind == "two-phase":
                body = ix.two_phase_pipeline_body(features, prune_ratio=prune_ratio, expansion_rate=expansion_rate,
                                                  max_window_size=max_window_size)
            else:
                body = ix.hybrid_pipeline_body(features, technique=technique, weights=parsed,  # type: ignore[arg-type]
                                               rank_constant=rank_constant, normalization=normalization)
            ix.put_search_pipeline(client, name, body)
            if attach_to:
                ix.attach_search_pipeline(client, attach_to, name)
    echo_json({"pipeline": name, "kind": kind, "cluster_version": features.version_string, "body": body,
               **({"attached_to": attach_to} if attach_to and kind != "ingest" else {}),
               **({"pagination_depth": depth} if depth else {})})


#: the options of each pipeline kind (the connection, name and fields apply to all)
_PIPELINE_OPTIONS = {"ingest": ("model_id", "prune", "batch_size", "skip_existing"),
                     "two-phase": ("prune_ratio", "expansion_rate", "max_window_size", "attach_to"),
                     "hybrid": ("technique", "normalization", "weights", "rank_constant", "from_tuning", "attach_to")}


def _pipeline_options(kind: str, technique: str) -> str:
    """Refuse typed options of another pipeline kind, or of the other hybrid technique; resolve ``auto`` from
    what was typed (weights / normalization: score normalization; a rank constant: RRF)."""
    ctx = click.get_current_context()
    other = {n for names in _PIPELINE_OPTIONS.values() for n in names} - set(_PIPELINE_OPTIONS[kind])
    given = typed_options(ctx, sorted(other))
    if given:
        hint = " (an ingest pipeline is attached with `create-index --pipeline`)" if "--index" in given else ""
        article = "an" if kind[0] in "aeiou" else "a"
        fail(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to {article} {kind} pipeline{hint}")
    if kind != "hybrid":
        return technique
    if typed_options(ctx, ["from_tuning"]) and typed_options(ctx, ["technique", "normalization", "weights",
                                                                   "rank_constant"]):
        fail("--from-tuning sets the technique, weights and rank constant: leave those out")
    score, rank = typed_options(ctx, ["normalization", "weights"]), typed_options(ctx, ["rank_constant"])
    if (technique == "rrf" and score) or (technique == "normalization" and rank) or (score and rank):
        fail(f"{', '.join(score + rank)}: RRF takes --rank-constant, normalization --normalization and --weights; "
             f"not both")
    if technique == "auto" and (score or rank):
        return "normalization" if score else "rrf"
    return technique


def _tuned_setting(path: str) -> tuple[str, str, str, int, int]:
    """``(technique, normalization, "bm25,sparse" weights, rank constant, pagination depth)`` of a
    hybrid_tuning.json."""
    from ..config import read_json

    try:
        setting = read_json(path)["best"]["setting"]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path} is not a `lsr-os tune-hybrid` hybrid_tuning.json ({err})") from err
    if setting["technique"] == "rrf":
        return "rrf", "min_max", "0.5,0.5", int(setting["rank_constant"]), int(setting["depth"])
    w = float(setting["bm25_weight"])
    return "normalization", setting["technique"], f"{w:g},{round(1.0 - w, 10):g}", 60, int(setting["depth"])


@cli.command("airgap-kit")
@click.option("--opensearch-version", required=True, help="The cluster's OpenSearch version (e.g. 3.6.0).")
@click.option("--fetch", is_flag=True, help="Download the two DJL jars from Maven Central with mvn into --jars.")
@click.option("--jars", "jars_dir", type=click.Path(file_okay=False), default=None,
              help="Folder holding (or receiving, with --fetch) the two jars [default: OUT/jars].")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Build the kit here: OUT/ml_cache/pytorch/<folder>/ with the libraries and SHA256SUMS.")
@click.option("--install-to", "data_path", type=click.Path(file_okay=False), default=None,
              help="Also copy the kit into this node's path.data (run as the OpenSearch user on the ML node).")
@click.option("--check", "check_path", type=click.Path(file_okay=False), default=None,
              help="Only check an installed cache: this node's path.data, against the kit's SHA256SUMS.")
def airgap_kit_cmd(opensearch_version: str, fetch: bool, jars_dir: str | None, out_dir: str | None,
                   data_path: str | None, check_path: str | None) -> None:
    """Plan, build or check the DJL PyTorch cache ML Commons needs on nodes that cannot reach publish.djl.ai.

    \b
    Without --out: prints the Maven artifacts, the target folder on each ML node and the steps.
    With --out (and --fetch, or --jars holding the jars): lays out OUT/ml_cache/pytorch/<folder>/
    with SHA256SUMS; copy OUT/ml_cache/ into <path.data>/ml_cache/ on every ML node
    (e.g. rsync -a OUT/ml_cache/ <path.data>/ml_cache/), then deploy-model. Symptom it fixes:
    deploy-model fails with "publish.djl.ai" (opensearch-project/ml-commons#3670).
    """
    from pathlib import Path

    from ..opensearch import djl_cache

    with user_errors():
        plan = djl_cache.kit_plan(opensearch_version, data_path or check_path or "<path.data>")
        if check_path:
            if fetch or jars_dir or out_dir or data_path:
                fail("--check only checks an installed cache: leave out --fetch, --jars, --out and --install-to")
            folder = Path(plan["target_folder"])  # type: ignore[arg-type]
            problems = djl_cache.check_cache(folder)
            echo_json({**plan, "checked": str(folder), "problems": problems})
            if problems:
                fail(f"the PyTorch cache at {folder} is incomplete: {'; '.join(problems)}")
            return
        if not out_dir:
            if fetch or data_path or jars_dir:
                fail("--fetch, --jars and --install-to need --out (where the kit is built)")
            echo_json(plan)
            return
        jars = Path(jars_dir) if jars_dir else Path(out_dir) / "jars"
        if fetch:
            djl_cache.fetch_jars(opensearch_version, jars)
        folder = djl_cache.build_kit(opensearch_version, jars, out_dir)
        plan["kit_folder"] = str(folder)
        plan["sha256"] = dict(reversed(line.split("  ", 1)) for line in
                              (folder / djl_cache.SUMS_FILE).read_text(encoding="utf-8").splitlines())
        if data_path:
            plan["installed"] = str(djl_cache.install_kit(folder, data_path))
    echo_json(plan)
