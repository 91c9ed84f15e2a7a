"""neural-search prune types for sparse document vectors, reproduced exactly.

OpenSearch's ``sparse_encoding`` ingest processor prunes each model output with
``PruneUtils.pruneSparseVector`` (neural-search ``util/prune/PruneUtils.java``, >= 2.19; contract
section 4.1). Documents encoded client-side must be pruned the same way, so this module reproduces
those semantics, including the float32 arithmetic of the Java code:

- ``top_k``: keep the ``k`` largest values. Ties at the cut: Java keeps the first-seen entry (strict
  ``>`` against the heap minimum) in ``HashMap`` iteration order, which is unspecified; we keep the
  earlier key (ascending token id / insertion order) so that runs are deterministic.
- ``max_ratio``: keep ``w >= ratio * max(w)``.
- ``abs_value``: keep ``w >= ratio``.
- ``alpha_mass``: sort descending, keep entries while the running sum ``<= alpha * total``.
- ``none``: keep everything.

Every value must be positive (``"Pruned values must be positive"``), for ``none`` too: callers
drop non-positive and non-finite weights before pruning (contract section 6.1).

No library implements these semantics in Python, hence this small module.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

__all__ = ["PruneType", "PruneConfig", "prune_arrays", "prune_map", "parse_prune"]

PruneType = Literal["none", "top_k", "max_ratio", "alpha_mass", "abs_value"]
_PRUNE_TYPES: tuple[str, ...] = get_args(PruneType)


@dataclass(frozen=True)
class PruneConfig:
    """A neural-search prune setting: ``prune_type`` plus ``prune_ratio`` (validated as NS does)."""

    prune_type: PruneType = "none"
    prune_ratio: float | None = None

    def __post_init__(self) -> None:
        # messages as neural-search's SparseEncodingProcessorFactory / PruneUtils word them (contract 4.1)
        if self.prune_type not in _PRUNE_TYPES:
            raise ValueError(f"Unknown prune type: {self.prune_type} (not one of {', '.join(_PRUNE_TYPES)})")
        if self.prune_type == "none":
            if self.prune_ratio is not None:
                raise ValueError("prune_ratio field is not supported when prune_type is not provided")
            return
        if self.prune_ratio is None:
            raise ValueError(f"prune_type {self.prune_type} needs a prune_ratio")
        r = float(self.prune_ratio)
        ok = {
            "top_k": r > 0 and r == math.floor(r),
            "max_ratio": 0 <= r < 1,
            "alpha_mass": 0 <= r < 1,
            "abs_value": r >= 0,
        }[self.prune_type]
        if not ok or not math.isfinite(r):
            desc = {
                "top_k": "positive integer",
                "max_ratio": "in the range [0, 1)",
                "alpha_mass": "in the range [0, 1)",
                "abs_value": "non-negative",
            }[self.prune_type]
            raise ValueError(f"Illegal prune_ratio {r:f} for prune_type: {self.prune_type}. "
                             f"prune_ratio should be {desc}.")

    def __str__(self) -> str:
        return "none" if self.prune_type == "none" else f"{self.prune_type}:{self.prune_ratio:g}"


def parse_prune(spec: str | None) -> PruneConfig:
    """Parse ``"none"`` / ``"max_ratio:0.1"`` / ``"top_k:64"`` into a :class:`PruneConfig`."""
    if spec is None or spec.strip() in ("", "none"):
        return PruneConfig()
    kind, sep, ratio = spec.partition(":")
    if not sep:
        raise ValueError(f"prune spec {spec!r} must look like TYPE:RATIO, TYPE one of {', '.join(_PRUNE_TYPES[1:])}")
    try:
        value = float(ratio)
    except ValueError as err:
        raise ValueError(f"prune ratio {ratio!r} in {spec!r} is not a number") from err
    return PruneConfig(kind.strip(), value)  # type: ignore[arg-type]


def prune_arrays(ids: np.ndarray, weights: np.ndarray, config: PruneConfig) -> tuple[np.ndarray, np.ndarray]:
    """Prune one sparse vector given as parallel arrays (ids ascending, weights float32 > 0).

    Returns the kept ``(ids, weights)`` in ascending id order.
    """
    weights = np.asarray(weights, dtype=np.float32)
    if weights.size and not (weights > 0).all():
        raise ValueError("Pruned values must be positive")
    kind = config.prune_type
    if kind == "none" or weights.size == 0:
        return ids, weights
    ratio = np.float32(config.prune_ratio)
    if kind == "max_ratio":
        keep = weights >= np.float32(ratio * weights.max())
    elif kind == "abs_value":
        keep = weights >= ratio
    elif kind == "top_k":
        k = int(config.prune_ratio)
        if k >= weights.size:
            return ids, weights
        order = np.argsort(-weights, kind="stable")  # ties: earlier (smaller id) first
        keep = np.zeros(weights.size, dtype=bool)
        keep[order[:k]] = True
    else:  # alpha_mass
        order = np.argsort(-weights, kind="stable")
        total = np.float32(np.sum(weights, dtype=np.float64))
        # Java accumulates ``float topSum += value`` sequentially; cumsum in float32 does the same.
        running = np.cumsum(weights[order], dtype=np.float32)
        keep = np.zeros(weights.size, dtype=bool)
        keep[order[running <= np.float32(ratio * total)]] = True
    return ids[keep], weights[keep]


def prune_map(vector: dict[str, float], config: PruneConfig) -> dict[str, float]:
    """Prune a ``{token: weight}`` map (insertion order breaks ``top_k`` ties)."""
    keys = list(vector)
    vals = np.fromiter((vector[k] for k in keys), dtype=np.float32, count=len(keys))
    idx = np.arange(len(keys))
    kept, _ = prune_arrays(idx, vals, config)
    return {keys[i]: vector[keys[i]] for i in kept.tolist()}
