"""training."""
from __future__ import annotations
