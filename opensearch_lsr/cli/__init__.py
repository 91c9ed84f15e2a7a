"""`lsr-os`: the command line, one module per command group.

=================  ==========================================================================
module             commands
=================  ==========================================================================
``app``            the root group ``cli``, ``echo_json``, ``fail``, ``user_errors``
``transfer``       ``transfer sembridge|inspect|vt``, ``tokenizer train``
``opensearch``     ``export``, ``deploy-model``, ``create-index``, ``create-pipeline``, ``airgap-kit`` (OpenSearch)
``index``          ``index`` (the batch encoding job; engines through the registry)
``search``         ``search``, ``eval`` (engines through the registry), ``inference-free``, ``quickstart``
``train``          ``train``
``elasticsearch``  ``--target``/``--backend elasticsearch`` on ``export``, ``deploy-model``, ``index``, ``search``, ``eval``
=================  ==========================================================================

Importing this package registers every command on ``cli``; ``main`` is the ``lsr-os`` entry point.
"""
from __future__ import annotations

import sys

from . import index, opensearch, search, train, transfer  # noqa: F401 - importing registers the commands
from . import elasticsearch  # noqa: F401,E402 - after opensearch/index/search: adds --backend elasticsearch to them
from .app import cli, echo_json, fail, user_errors

__all__ = ["main", "cli", "echo_json", "fail", "user_errors"]


def main() -> None:
    """The ``lsr-os`` console entry point."""
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)
