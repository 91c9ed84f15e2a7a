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

# === section: transfer (VT) and tokenizer ===


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

# === section: index (batch encoding jobs) ===

# === section: search / eval / quickstart ===

# === section: train ===


def main() -> None:
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
