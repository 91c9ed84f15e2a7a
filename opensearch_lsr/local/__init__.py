"""local."""
from __future__ import annotations
