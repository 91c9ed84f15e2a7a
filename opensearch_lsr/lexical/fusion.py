"""Hybrid score fusion as neural-search's search-phase processors do it (single shard).

Followed from opensearch-project/neural-search at tags 2.19.0.0 and 3.1.0.0
(``src/main/java/org/opensearch/neuralsearch/``):

- ``processor/normalization/MinMaxScoreNormalizationTechnique``: per sub-query, min and max over that
  sub-query's returned top docs; ``(score - min) / (max - min)``; a result of exactly 0 becomes
  ``MIN_SCORE = 0.001`` (the lowest hit is kept, not zeroed); when ``score == max == min`` (one hit, or
  all hits tied) the score is ``SINGLE_RESULT_SCORE = 1.0``. (``lower_bounds`` is not supported here.)
- ``processor/combination/ScoreCombiner.getNormalizedScoresPerDocument``: a document absent from a
  sub-query's top docs has normalised score 0.0 there (the array is never filled with -1, despite the
  comment) ...
- ``processor/combination/ArithmeticMeanScoreCombinationTechnique``: ... so with weights summing to 1 the
  combined score is ``sum_i w_i * s_i`` over all sub-queries (``score >= 0`` passes for the zeros);
  a missing weight is 1.0 (``ScoreCombinationUtil.getWeightForSubQuery``); weights must lie in [0, 1],
  sum to 1 within 0.01 and match the sub-query count.
- ``processor/normalization/ZScoreNormalizationTechnique`` (tag 3.6.0.0; added in 3.0.0): per sub-query, mean and standard deviation (Apache
  Commons ``DescriptiveStatistics``: the corrected two-pass mean, the ``n - 1`` variance) of its returned
  scores, narrowed to float; ``(score - mean) / sd``, at most 0 becomes ``MIN_SCORE``; a score equal to the
  mean takes the maximum, a zero deviation the minimum. ``L2ScoreNormalizationTechnique`` (tag 3.6.0.0):
  ``score / sqrt(sum of squares)`` with a float running sum, 0 when the norm is 0. Both combine by the
  same weighted arithmetic mean as min-max (``z_score`` supports no other).
- ``processor/normalization/RRFNormalizationTechnique``: ``1 / (rank_constant + rank)`` with rank from 1,
  rounded HALF_UP to 10 decimals, rank_constant in [1, 10000], default 60;
  ``combination/RRFScoreCombinationTechnique``: the weighted *sum* (weights default 1.0).
- ``processor/factory/RRFProcessorFactory``: ``rank_constant`` is read from ``combination.rank_constant``
  (3.1+) or ``combination.parameters.rank_constant`` (2.19-3.0); both are accepted here.
- ``search/query/HybridCollectorManager.getSubqueryResultsRetrievalSize``: each sub-query contributes its
  top ``pagination_depth`` hits, or ``size`` when none is given (``from > 0`` needs ``pagination_depth``).

Scores are float32 as in Java. Ties of the combined score: ``processor/combination/ScoreCombiner
.getSortedDocIds`` (tag 3.6.0.0) sorts (stably) the keys of a ``HashMap<Integer, ...>`` of Lucene doc ids,
so exact ties keep Java's iteration order (bucket
``spread(id) & (capacity - 1)``, then insertion order). With integer keys (the local engine's rows: Lucene's
doc ids for an index loaded in order into one segment) :meth:`HybridFusion.fuse` reproduces that order;
with other keys (:func:`fuse_runs` over string ids) ties keep first appearance (sub-query 0's ranking, then
sub-query 1's, ...), a deviation that matters mostly for ``z_score``, whose floor (0.001) ties every
document below the mean.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache
from typing import Any, Hashable, Literal, Mapping, Sequence, TypeVar, get_args

import numpy as np

from ..errors import LsrError

__all__ = ["FusionError", "HybridFusion", "Technique", "SCORE_TECHNIQUES", "normalise_scores", "fuse_runs",
           "rank_lists", "java_hash_map_order", "MIN_SCORE", "SINGLE_RESULT_SCORE"]

Technique = Literal["min_max", "z_score", "l2", "rrf"]
#: the normalization-processor's techniques (each combined by the weighted arithmetic mean)
SCORE_TECHNIQUES = ("min_max", "z_score", "l2")
K = TypeVar("K", bound=Hashable)

MIN_SCORE = np.float32(0.001)
SINGLE_RESULT_SCORE = np.float32(1.0)
MAX_SUB_QUERIES = 5  # HybridQueryBuilder.MAX_NUMBER_OF_SUB_QUERIES


class FusionError(LsrError, ValueError):
    """An invalid hybrid fusion setting (the server's own message where it has one)."""


@lru_cache(maxsize=4096)
def _rrf_score(rank_constant: int, position: int) -> np.float32:
    # BigDecimal.ONE.divide(BigDecimal.valueOf(rank_constant + position + 1), 10, HALF_UP).floatValue()
    value = (Decimal(1) / Decimal(rank_constant + position + 1)).quantize(Decimal("1e-10"), rounding=ROUND_HALF_UP)
    return np.float32(float(value))


def normalise_scores(technique: str, scores: np.ndarray) -> np.ndarray:
    """One sub-query's returned scores (best first, float32) normalised as neural-search's ``technique`` does."""
    scores = np.asarray(scores, np.float32)
    if scores.size == 0:
        return scores
    if technique == "min_max":
        lo, hi = scores.min(), scores.max()
        if hi == lo:
            return np.full(scores.shape, SINGLE_RESULT_SCORE, np.float32)
        out = ((scores - lo) / (hi - lo)).astype(np.float32)
        out[out == 0.0] = MIN_SCORE
        return out
    if technique == "l2":
        total = np.float32(0.0)
        for v in scores:  # a float running sum, in hit order
            total = np.float32(total + np.float32(v * v))
        norm = np.float32(math.sqrt(float(total)))
        return np.zeros_like(scores) if norm == 0 else (scores / norm).astype(np.float32)
    if technique == "z_score":
        x = scores.astype(np.float64)
        n = x.size
        mean = x.sum() / n
        mean += (x - mean).sum() / n  # commons-math Mean: the corrected two-pass mean
        dev = x - mean
        var = ((dev * dev).sum() - dev.sum() ** 2 / n) / (n - 1) if n > 1 else 0.0
        m, sd = np.float32(mean), np.float32(math.sqrt(var))
        out = np.empty_like(scores)
        for i, v in enumerate(scores):
            if v == m:
                out[i] = scores.max()
            elif sd == 0.0:
                out[i] = scores.min()
            else:
                z = np.float32(np.float32(v - m) / sd)
                out[i] = MIN_SCORE if z <= 0.0 else z
        return out
    raise FusionError(f"no score normalization {technique!r}")


@dataclass(frozen=True)
class HybridFusion:
    """One search pipeline's hybrid fusion: min-max, z-score or L2 + weighted arithmetic mean, or RRF.

    Args:
        technique: ``min_max``, ``z_score`` or ``l2`` (normalization-processor) or ``rrf`` (score-ranker-processor).
        weights: one weight per sub-query (``None``: 1.0 each).
        rank_constant: RRF's constant (1..10000).
    """

    technique: Technique = "min_max"
    weights: tuple[float, ...] | None = None
    rank_constant: int = 60

    def __post_init__(self) -> None:
        if self.technique not in get_args(Technique):
            raise FusionError(f"technique must be one of {', '.join(get_args(Technique))}, got {self.technique!r}")
        if not isinstance(self.rank_constant, int) or not 1 <= self.rank_constant <= 10_000:
            raise FusionError("rank constant must be in the interval between 1 and 10000, submitted rank constant: "
                              f"{self.rank_constant}")
        if self.weights is not None:
            weights = tuple(float(w) for w in self.weights)
            if any(not 0.0 <= w <= 1.0 for w in weights):
                raise FusionError(f"all weights must be in range [0.0 ... 1.0], submitted weights: {list(weights)}")
            if abs(sum(np.float32(w) for w in weights) - 1.0) > 0.01:
                raise FusionError(f"sum of weights for combination must be equal to 1.0, submitted weights: "
                                  f"{list(weights)}")
            object.__setattr__(self, "weights", weights)

    # ---- reading a search pipeline ---------------------------------------------------------------

    @classmethod
    def from_pipeline(cls, pipeline: Mapping[str, Any]) -> "HybridFusion":
        """The fusion of a search pipeline body (``phase_results_processors``), as in ``pipelines/``."""
        procs = pipeline.get("phase_results_processors") if isinstance(pipeline, Mapping) else None
        if not procs:
            raise FusionError("the search pipeline has no phase_results_processors: a hybrid query needs a "
                              "normalization-processor or score-ranker-processor")
        for proc in procs:
            (kind, cfg), = proc.items()
            cfg = cfg or {}
            if kind == "normalization-processor":
                norm = (cfg.get("normalization") or {}).get("technique", "min_max")
                norm_params = (cfg.get("normalization") or {}).get("parameters") or {}
                comb = cfg.get("combination") or {}
                comb_tech = comb.get("technique", "arithmetic_mean")
                if norm not in SCORE_TECHNIQUES or norm_params:
                    raise FusionError(f"the local backend supports normalization techniques "
                                      f"{', '.join(SCORE_TECHNIQUES)} without parameters, got {norm!r} "
                                      f"{norm_params or ''}".rstrip())
                if comb_tech != "arithmetic_mean":
                    raise FusionError(f"the local backend supports combination technique arithmetic_mean with "
                                      f"{norm}, got {comb_tech!r}")
                weights = (comb.get("parameters") or {}).get("weights")
                return cls(norm, tuple(weights) if weights is not None else None)
            if kind == "score-ranker-processor":
                comb = cfg.get("combination") or {}
                if comb.get("technique", "rrf") != "rrf":
                    raise FusionError(f"score-ranker-processor supports technique rrf, got {comb.get('technique')!r}")
                params = comb.get("parameters") or {}
                rank_constant = comb.get("rank_constant", params.get("rank_constant", 60))
                try:
                    rank_constant = int(str(rank_constant))
                except ValueError:
                    raise FusionError("parameter [rank_constant] must be an integer") from None
                weights = params.get("weights")
                return cls("rrf", tuple(weights) if weights is not None else None, rank_constant)
        raise FusionError("the search pipeline has neither a normalization-processor nor a score-ranker-processor")

    def pipeline(self) -> dict[str, Any]:
        """This fusion as a search pipeline body (the shapes in ``pipelines/``; RRF in the 3.1+ shape)."""
        if self.technique == "rrf":
            comb: dict[str, Any] = {"technique": "rrf", "rank_constant": self.rank_constant}
            if self.weights is not None:
                comb["parameters"] = {"weights": list(self.weights)}
            return {"phase_results_processors": [{"score-ranker-processor": {"combination": comb}}]}
        comb = {"technique": "arithmetic_mean"}
        if self.weights is not None:
            comb["parameters"] = {"weights": list(self.weights)}
        return {"phase_results_processors": [{"normalization-processor": {
            "normalization": {"technique": self.technique}, "combination": comb}}]}

    # ---- fusion ----------------------------------------------------------------------------------

    def _normalise(self, ranked: Sequence[tuple[K, float]]) -> list[np.float32]:
        if self.technique == "rrf":
            return [_rrf_score(self.rank_constant, pos) for pos in range(len(ranked))]
        return list(normalise_scores(self.technique, np.asarray([s for _, s in ranked], np.float32)))

    def fuse(self, sub_results: Sequence[Sequence[tuple[K, float]]], size: int | None = None
             ) -> list[tuple[K, float]]:
        """Fuse ranked sub-query results (each sorted best first, already cut to the retrieval window).

        Returns ``(key, combined score)`` best first, at most ``size`` of them (all when ``None``).
        """
        n = len(sub_results)
        if n == 0 or n > MAX_SUB_QUERIES:
            raise FusionError(f"a hybrid query takes 1 to {MAX_SUB_QUERIES} sub-queries, got {n}")
        if self.weights is not None and len(self.weights) != n:
            raise FusionError(f"number of weights [{len(self.weights)}] must match number of sub-queries [{n}] in "
                              "hybrid query")
        per_doc: dict[K, np.ndarray] = {}  # insertion order = first appearance (the tie-break)
        for j, ranked in enumerate(sub_results):
            for (key, _), s in zip(ranked, self._normalise(ranked)):
                if key not in per_doc:
                    per_doc[key] = np.zeros(n, np.float32)
                per_doc[key][j] = s
        weights = [np.float32(w) for w in (self.weights or [1.0] * n)]
        keys = list(per_doc)
        if keys and all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in keys):
            keys = java_hash_map_order(keys)
        combined = []
        for key in keys:
            scores = per_doc[key]
            total, wsum = np.float32(0.0), np.float32(0.0)
            for s, w in zip(scores, weights):
                if s >= 0.0:
                    total = np.float32(total + np.float32(s * w))
                    wsum = np.float32(wsum + w)
            if self.technique != "rrf":  # the arithmetic mean
                total = np.float32(0.0) if wsum == 0.0 else np.float32(total / wsum)
            combined.append((key, float(total)))
        order = sorted(range(len(combined)), key=lambda i: -combined[i][1])  # stable: ties keep the keys' order
        out = [combined[i] for i in order]
        return out if size is None else out[:size]


def java_hash_map_order(keys: Sequence[int]) -> list[int]:
    """``keys`` (inserted in this order into a ``java.util.HashMap<Integer, ...>``) in the map's iteration order:
    the table doubles from 16 while the size exceeds 0.75 of it; buckets ascending by ``(h ^ (h >>> 16)) &
    (capacity - 1)``, insertion order within a bucket (resizing keeps it; bins of 8+ colliding keys, which
    Java turns into trees, are not modelled)."""
    capacity = 16
    while len(keys) > 0.75 * capacity:
        capacity *= 2
    mask = capacity - 1

    def bucket(key: int) -> int:
        h = int(key) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & mask

    return sorted(keys, key=bucket)  # stable: insertion order within a bucket


def rank_lists(run: Mapping[K, float], window: int | None = None) -> list[tuple[K, float]]:
    """A ``{key: score}`` ranking as a list sorted best first (ties keep the mapping's order), cut to ``window``."""
    items = sorted(run.items(), key=lambda kv: -np.float32(kv[1]))
    return items if window is None else items[:window]


def fuse_runs(runs: Sequence[Mapping[str, Mapping[str, float]]], technique: Technique = "min_max",
              weights: Sequence[float] | None = None, rank_constant: int = 60, window: int = 10,
              size: int | None = None) -> dict[str, dict[str, float]]:
    """Hybrid of ranx-style runs (``{qid: {doc_id: score}}``), one per sub-query, as OpenSearch fuses them.

    Args:
        runs: one run per hybrid sub-query, in the hybrid query's order (e.g. ``[bm25, sparse]``).
        technique: ``min_max`` (+ weighted arithmetic mean) or ``rrf``.
        weights: per sub-query (min-max: must sum to 1; ``None``: equal).
        rank_constant: RRF's constant.
        window: hits per sub-query (the request's ``size``, or ``pagination_depth``).
        size: fused hits kept per query (default ``window``).

    Returns:
        The fused run; a query missing from one run has no hits from that sub-query. Identical to the
        local backend's ``hybrid`` query with ``size=window`` over the same sub-query rankings.
    """
    if window < 1:
        raise FusionError(f"window must be >= 1, got {window}")
    fusion = HybridFusion(technique, tuple(weights) if weights is not None else None, rank_constant)
    qids = list(dict.fromkeys(q for run in runs for q in run))
    out: dict[str, dict[str, float]] = {}
    for qid in qids:
        subs = [rank_lists(run.get(qid, {}), window) for run in runs]
        out[qid] = dict(fusion.fuse(subs, size if size is not None else window))
    return out
