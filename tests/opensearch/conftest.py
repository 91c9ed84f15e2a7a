"""Fixtures shared by the OpenSearch tests: the fake ``_bulk`` target (``tests/fake_bulk.py``)."""
from __future__ import annotations

from fake_bulk import fake_bulk  # noqa: F401 - the fixture, re-exported
