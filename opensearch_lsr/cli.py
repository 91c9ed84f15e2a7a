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
