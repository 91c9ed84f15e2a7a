"""The encoders' output type: one text's sparse vector."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["SparseVector"]


class SparseVector(NamedTuple):
    """One encoded text: vocabulary ids (ascending, int64) and their weights (float32, > 0)."""

    ids: np.ndarray
    weights: np.ndarray
