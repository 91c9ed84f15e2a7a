"""The package's one error root.

Every error the library raises on purpose for bad input or a failed external step derives from
:class:`LsrError`, so a caller (the CLI above all) catches one class and prints its message as one
clear sentence. The concrete classes live next to the code that raises them and keep their older
bases (``ValueError`` for bad input, ``RuntimeError`` for a failed step) for callers that catch those.
"""
from __future__ import annotations

__all__ = ["LsrError"]


class LsrError(Exception):
    """Base of every deliberate error of ``opensearch_lsr``; its message is one sentence for the user."""
