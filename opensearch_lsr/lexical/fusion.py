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
- ``processor/normalization/RRFNormalizationTechnique``: ``1 / (rank_constant + rank)`` with rank from 1,
  rounded HALF_UP to 10 decimals, rank_constant in [1, 10000], default 60;
  ``combination/RRFScoreCombinationTechnique``: the weighted *sum* (weights default 1.0).
- ``processor/factory/RRFProcessorFactory``: ``rank_constant`` is read from ``combination.rank_constant``
  (3.1+) or ``combination.parameters.rank_constant`` (2.19-3.0); both are accepted here.
- ``search/query/HybridCollectorManager.getSubqueryResultsRetrievalSize``: each sub-query contributes its
  top ``pagination_depth`` hits, or ``size`` when none is given (``from > 0`` needs ``pagination_depth``).

Scores are float32 as in Java. Deviation: ties of the combined score are broken by first appearance
(sub-query 0's ranking, then sub-query 1's, ...); OpenSearch's order among exact ties follows its
internal doc ids through a ``HashMap``. :func:`fuse_runs` and the local backend's ``hybrid`` query
share :meth:`HybridFusion.fuse`, so they rank identically.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache
from typing import Any, Hashable, Literal, Mapping, Sequence, TypeVar, get_args

import numpy as np

from ..errors import LsrError

__all__ = ["FusionError", "HybridFusion", "Technique", "fuse_runs", "rank_lists", "MIN_SCORE",
           "SINGLE_RESULT_SCORE"]

Technique = Literal["min_max", "rrf"]
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


@dataclass(frozen=True)
class HybridFusion:
    """One search pipeline's hybrid fusion: min-max + weighted arithmetic mean, or RRF.

    Args:
        technique: ``min_max`` (normalization-processor) or ``rrf`` (score-ranker-processor).
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
                if norm != "min_max" or norm_params:
                    raise FusionError(f"the local backend supports normalization technique min_max without "
                                      f"parameters, got {norm!r} {norm_params or ''}".rstrip())
                if comb_tech != "arithmetic_mean":
                    raise FusionError(f"the local backend supports combination technique arithmetic_mean with "
                                      f"min_max, got {comb_tech!r}")
                weights = (comb.get("parameters") or {}).get("weights")
                return cls("min_max", tuple(weights) if weights is not None else None)
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
            "normalization": {"technique": "min_max"}, "combination": comb}}]}

    # ---- fusion ----------------------------------------------------------------------------------

    def _normalise(self, ranked: Sequence[tuple[K, float]]) -> list[np.float32]:
        if self.technique == "rrf":
            return [_rrf_score(self.rank_constant, pos) for pos in range(len(ranked))]
        if not ranked:
            return []
        scores = np.asarray([s for _, s in ranked], np.float32)
        lo, hi = scores.min(), scores.max()
        out = []
        for s in scores:
            if hi == lo and hi == s:
                out.append(SINGLE_RESULT_SCORE)
                continue
            v = np.float32((s - lo) / (hi - lo))
            out.append(MIN_SCORE if v == 0.0 else v)
        return out

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
        combined = []
        for key, scores in per_doc.items():
            total, wsum = np.float32(0.0), np.float32(0.0)
            for s, w in zip(scores, weights):
                if s >= 0.0:
                    total = np.float32(total + np.float32(s * w))
                    wsum = np.float32(wsum + w)
            if self.technique == "min_max":
                total = np.float32(0.0) if wsum == 0.0 else np.float32(total / wsum)
            combined.append((key, float(total)))
        order = sorted(range(len(combined)), key=lambda i: -combined[i][1])  # stable: ties keep first appearance
        out = [combined[i] for i in order]
        return out if size is None else out[:size]


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
