"""Hybrid settings tuned on queries the sparse model never trained on (``lsr-os tune-hybrid``).

The two sub-queries of ``hybrid [match, neural_sparse]`` are run once, to the deepest depth of the grid;
every setting is then fused from those ranked lists exactly as neural-search fuses them
(:class:`~opensearch_lsr.lexical.fusion.HybridFusion`: per sub-query min-max over its top ``depth`` hits and
the weighted arithmetic mean, or RRF ``1 / (rank_constant + rank)``, float32, ties in first-appearance
order), vectorised over the weights. A grid of 21 min-max weights and 100 RRF rank constants at three
depths is ~360 settings: minutes if each were a pass of search requests, about a second this way.

Why tune on held-out queries: weights chosen on the queries a model trained on favour its side of the
fusion (its scores on them are too good); ``lsr-os train --holdout-queries`` leaves queries out and names
them in ``holdout_queries.json``, which this module reads.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ArtifactConfig
from ..lexical.fusion import SCORE_TECHNIQUES, HybridFusion, _rrf_score, normalise_scores
from .metrics import evaluate_run

__all__ = ["HybridGrid", "HybridSetting", "TuningResult", "fuse_grid", "tune_on_runs", "tune_hybrid", "render_tuning",
           "tuning_query_ids",
           "RankedRuns"]

logger = logging.getLogger(__name__)

#: ``{query id: [(doc id, score), ...]}`` best first: one sub-query's results.
RankedRuns = Mapping[str, Sequence[tuple[str, float]]]


@dataclass
class HybridGrid(ArtifactConfig):
    """The settings ``lsr-os tune-hybrid`` tries (saved as ``tune_hybrid_config.json``).

    Attributes:
        weight_step: BM25 weights 0, step, 2 step, ..., 1 of the score techniques (the sparse side gets 1 - w).
        rank_constants: RRF rank constants tried (neural-search allows 1-10000; its default is 60).
        depths: hits per sub-query (the hybrid query's ``pagination_depth``).
        metric: the metric the best setting maximises (``mrr@10`` or ``ndcg@10``).
        techniques: what is tried: ``min_max``, ``z_score``, ``l2`` (normalization-processor, weighted
            arithmetic mean) and ``rrf`` (score-ranker-processor). The default leaves z-score and L2 out: on
            MS MARCO-ko z-score won on the 500 held-out queries and lost on dev (relevance_vs_nori.md).
    """

    FILENAME = "tune_hybrid_config.json"

    weight_step: float = 0.05
    rank_constants: list[int] = field(default_factory=lambda: list(range(1, 101)))
    depths: list[int] = field(default_factory=lambda: [10, 50, 100])
    metric: str = "mrr@10"
    techniques: list[str] = field(default_factory=lambda: ["min_max", "rrf"])

    def weights(self) -> list[float]:
        steps = int(round(1.0 / self.weight_step))
        if steps < 1 or abs(steps * self.weight_step - 1.0) > 1e-9:
            raise ValueError(f"weight_step must divide 1 (0.05, 0.1, ...), got {self.weight_step}")
        return [round(i / steps, 10) for i in range(steps + 1)]

    def validate(self) -> None:
        self.weights()
        if not self.depths or min(self.depths) < 10:
            raise ValueError(f"depths must be >= 10 (the metrics read the top 10), got {self.depths}")
        if not self.rank_constants or not all(1 <= c <= 10_000 for c in self.rank_constants):
            raise ValueError("rank constants must lie in [1, 10000]")
        if self.metric not in ("mrr@10", "ndcg@10"):
            raise ValueError(f"metric must be mrr@10 or ndcg@10, got {self.metric!r}")
        known = (*SCORE_TECHNIQUES, "rrf")
        if not self.techniques or any(t not in known for t in self.techniques):
            raise ValueError(f"techniques must be some of {', '.join(known)}, got {self.techniques}")


@dataclass(frozen=True)
class HybridSetting:
    """One fused configuration: what goes into the search pipeline (technique, weights, rank constant) and
    into the hybrid query (``pagination_depth``)."""

    technique: str  # "min_max" | "z_score" | "l2" | "rrf"
    depth: int
    bm25_weight: float | None = None  # score techniques: weights are [bm25_weight, 1 - bm25_weight]
    rank_constant: int | None = None  # rrf

    def fusion(self) -> HybridFusion:
        if self.technique == "rrf":
            return HybridFusion("rrf", None, int(self.rank_constant or 60))
        w = float(self.bm25_weight)
        return HybridFusion(self.technique, (w, round(1.0 - w, 10)))  # type: ignore[arg-type]

    def label(self) -> str:
        if self.technique == "rrf":
            return f"rrf k={self.rank_constant}, depth {self.depth}"
        name = {"min_max": "min-max", "z_score": "z-score", "l2": "l2"}[self.technique]
        return f"{name} {self.bm25_weight:g}/{1 - self.bm25_weight:g}, depth {self.depth}"


def _union(a: Sequence[tuple[str, float]], b: Sequence[tuple[str, float]]):
    """Doc ids in first-appearance order and each sub-query's positions into them."""
    keys: dict[str, int] = {}
    for doc, _ in a:
        keys.setdefault(doc, len(keys))
    for doc, _ in b:
        keys.setdefault(doc, len(keys))
    return list(keys), np.asarray([keys[d] for d, _ in a], np.int64), np.asarray([keys[d] for d, _ in b], np.int64)


def _top(docs: list[str], combined: np.ndarray, k: int) -> list[str]:
    order = np.argsort(-combined, kind="stable")[:k]  # ties keep first appearance, as HybridFusion.fuse
    return [docs[i] for i in order]


def fuse_grid(bm25: RankedRuns, sparse: RankedRuns, grid: HybridGrid, k: int = 10
              ) -> dict[HybridSetting, dict[str, list[str]]]:
    """The top ``k`` doc ids per query for every setting of ``grid`` (same ranking as ``HybridFusion.fuse``)."""
    grid.validate()
    weights = np.asarray(grid.weights(), np.float32)
    w_bm25, w_sparse = weights, np.asarray([np.float32(round(1.0 - float(w), 10)) for w in weights], np.float32)
    wsum = (np.float32(0.0) + w_bm25).astype(np.float32) + w_sparse
    runs: dict[HybridSetting, dict[str, list[str]]] = {}
    scored = [t for t in grid.techniques if t != "rrf"]
    for depth in grid.depths:
        per_technique = {t: [HybridSetting(t, depth, bm25_weight=float(w)) for w in grid.weights()] for t in scored}
        rrf = [HybridSetting("rrf", depth, rank_constant=int(c)) for c in grid.rank_constants] \
            if "rrf" in grid.techniques else []
        every = [s for settings in per_technique.values() for s in settings] + rrf
        for s in every:
            runs[s] = {}
        for qid in set(bm25) | set(sparse):
            a, b = list(bm25.get(qid, ()))[:depth], list(sparse.get(qid, ()))[:depth]
            docs, ia, ib = _union(a, b)
            if not docs:
                for s in every:
                    runs[s][qid] = []
                continue
            for technique, settings in per_technique.items():
                sa = np.zeros(len(docs), np.float32)
                sb = np.zeros(len(docs), np.float32)
                sa[ia] = normalise_scores(technique, np.asarray([s for _, s in a], np.float32))
                sb[ib] = normalise_scores(technique, np.asarray([s for _, s in b], np.float32))
                # total = f32(f32(0 + f32(sa * wa)) + f32(sb * wb)) / wsum, as HybridFusion.fuse accumulates
                total = (np.float32(0.0) + (sa[None, :] * w_bm25[:, None]).astype(np.float32)).astype(np.float32)
                total = (total + (sb[None, :] * w_sparse[:, None]).astype(np.float32)).astype(np.float32)
                combined = (total / wsum[:, None]).astype(np.float32)
                for row, s in enumerate(settings):
                    runs[s][qid] = _top(docs, combined[row], k)
            for s in rrf:
                ra = np.zeros(len(docs), np.float32)
                rb = np.zeros(len(docs), np.float32)
                ra[ia] = [_rrf_score(s.rank_constant, p) for p in range(len(a))]
                rb[ib] = [_rrf_score(s.rank_constant, p) for p in range(len(b))]
                runs[s][qid] = _top(docs, (ra + rb).astype(np.float32), k)
    return runs


@dataclass
class TuningResult:
    """Every setting's metrics on the tuning queries, and the best one overall and per technique."""

    queries: int
    metric: str
    best: dict[str, Any]
    best_per_technique: dict[str, dict[str, Any]]
    settings: list[dict[str, Any]]
    sub_queries: dict[str, dict[str, float]]  # the BM25 and sparse runs alone, same queries

    def best_setting(self) -> HybridSetting:
        return HybridSetting(**self.best["setting"])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _as_ranked_run(top: Mapping[str, list[str]]) -> dict[str, dict[str, float]]:
    # rank-based scores, so the metric library cannot reorder ties differently
    return {q: {d: float(len(docs) - i) for i, d in enumerate(docs)} for q, docs in top.items()}


def tune_on_runs(bm25: RankedRuns, sparse: RankedRuns, qrels: Mapping[str, Mapping[str, int]],
                 grid: HybridGrid | None = None) -> TuningResult:
    """Score every setting of ``grid`` on ``qrels``' queries from the two sub-query runs (best first lists)."""
    grid = grid or HybridGrid()
    queries = [q for q in qrels if qrels[q]]
    bm25 = {q: list(bm25.get(q, ())) for q in queries}
    sparse = {q: list(sparse.get(q, ())) for q in queries}
    metrics = {"mrr@10": "mrr@10", "ndcg@10": "ndcg@10"}
    rows = []
    for setting, top in fuse_grid(bm25, sparse, grid).items():
        scores = evaluate_run(qrels, _as_ranked_run(top), metrics)
        rows.append({"setting": asdict(setting), "label": setting.label(), **scores})
    alone = {name: evaluate_run(qrels, _as_ranked_run({q: [d for d, _ in run[q][:10]] for q in queries}), metrics)
             for name, run in (("bm25", bm25), ("sparse", sparse))}
    key = grid.metric
    # ties: the first in grid order (score techniques before RRF, shallower depths first, lower weights first)
    best = max(rows, key=lambda r: r[key])
    per = {}
    for technique in grid.techniques:
        candidates = [r for r in rows if r["setting"]["technique"] == technique]
        if candidates:
            per[technique] = max(candidates, key=lambda r: r[key])
    return TuningResult(queries=len(queries), metric=key, best=best, best_per_technique=per, settings=rows,
                        sub_queries=alone)


def _ranked(run: Mapping[str, Mapping[str, float]]) -> dict[str, list[tuple[str, float]]]:
    return {q: list(docs.items()) for q, docs in run.items()}  # hit order = the engine's ranking


def tune_hybrid(config, out_dir: str | Path, grid: HybridGrid | None = None, client: Any = None) -> TuningResult:
    """Run both sub-queries for ``config``'s queries through its backend, tune ``grid`` on them, write
    ``hybrid_tuning.json`` / ``.md`` and ``search_pipeline.json`` (the best setting's body) into ``out_dir``.

    ``config`` is an :class:`~opensearch_lsr.evaluation.pipeline.EvalConfig` (its ``query_ids`` name the tuning
    queries); its ``k`` becomes the deepest depth, and the nori BM25 ``match`` is the lexical sub-query.
    """
    from dataclasses import replace

    from ..config import write_json
    from .baselines import BASELINE_NAME
    from .pipeline import run_evaluation

    grid = grid or HybridGrid()
    grid.validate()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = replace(config, k=max(grid.depths), baseline="bm25-nori", hybrid="none", prune_levels=[])
    result = run_evaluation(config, out / "sub_queries", client=client, keep_runs=True)
    runs = result["runs"]
    bm25_name = next((n for n in runs if n != "model" and n.startswith("BM25")), BASELINE_NAME)
    from .datasets import load_beir

    dataset = load_beir(config.dataset, config.split)
    dataset = dataset.only(config.query_ids) if config.query_ids else dataset.subset(config.max_queries)
    tuned = tune_on_runs(_ranked(runs[bm25_name]), _ranked(runs["model"]), dataset.qrels, grid)
    grid.save(out)
    write_json(out / "hybrid_tuning.json", {"model": config.model, "dataset": config.dataset, "split": config.split,
                                            **tuned.to_dict()})
    write_json(out / "search_pipeline.json", tuned.best_setting().fusion().pipeline())
    (out / "hybrid_tuning.md").write_text(render_tuning(tuned), encoding="utf-8")
    return tuned


def render_tuning(tuned: TuningResult) -> str:
    """A short markdown summary: the sub-queries alone, the best per technique and depth."""
    lines = [f"Tuned on {tuned.queries} queries, by {tuned.metric}.", "",
             "| setting | MRR@10 | nDCG@10 |", "|---|---:|---:|"]
    for name, scores in tuned.sub_queries.items():
        lines.append(f"| {name} alone | {scores['mrr@10']:.4f} | {scores['ndcg@10']:.4f} |")
    best_by = {}
    for row in tuned.settings:
        key = (row["setting"]["technique"], row["setting"]["depth"])
        if key not in best_by or row[tuned.metric] > best_by[key][tuned.metric]:
            best_by[key] = row
    for key in sorted(best_by):
        row = best_by[key]
        mark = " **(best)**" if row["label"] == tuned.best["label"] else ""
        lines.append(f"| {row['label']}{mark} | {row['mrr@10']:.4f} | {row['ndcg@10']:.4f} |")
    return "\n".join(lines) + "\n"


def tuning_query_ids(model: str | None, dataset: str, split: str = "train", n: int = 500, seed: int = 42,
                     query_ids_file: str | None = None) -> tuple[list[str], str]:
    """The queries to tune on, and where they came from.

    In order: ``query_ids_file`` (a JSON list, a ``holdout_queries.json``, or one id per line); the model's own
    ``holdout_queries.json`` when it names ``split``; else ``n`` queries of ``split`` drawn with ``seed``
    (the draw ``lsr-os train --holdout-queries n --seed seed`` leaves out, so a model that saw none of the
    split, e.g. one adapted on the corpus alone, is tuned on the same queries).
    """
    import json

    from .datasets import HOLDOUT_FILE, holdout_query_ids, load_beir

    if query_ids_file:
        text = Path(query_ids_file).read_text(encoding="utf-8")
        try:
            data = json.loads(text)
            ids = data["query_ids"] if isinstance(data, dict) else data
        except json.JSONDecodeError:
            ids = [line.strip() for line in text.splitlines() if line.strip()]
        return [str(q) for q in ids], str(query_ids_file)
    if model:
        saved = Path(model) / HOLDOUT_FILE
        if saved.is_file():
            data = json.loads(saved.read_text(encoding="utf-8"))
            if data.get("split") == split:
                return [str(q) for q in data["query_ids"]], str(saved)
            logger.warning("%s holds out %s queries, not %s: drawing %d of %s", saved, data.get("split"), split, n,
                           split)
    qids = list(load_beir(dataset, split).qrels)
    return holdout_query_ids(qids, n, seed), f"{n} of {split} drawn with seed {seed}"
