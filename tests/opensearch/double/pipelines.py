"""Ingest and search pipelines of the double (neural-search processors, contract section 4).

Mixed into :class:`~double.server.OpenSearchDouble`.
"""
from __future__ import annotations

from typing import Any

from .search import rrf_rank_constant
from .store import ApiError, Index

__all__ = ["PipelinesMixin"]


class PipelinesMixin:
    """``_ingest/pipeline``, ``_search/pipeline`` and the ingest run; ``self`` is the double."""

    # ======================================================================================
    # pipelines
    # ======================================================================================
    def _ingest_pipeline(self, method: str, pid: str, body: dict) -> tuple[int, Any]:
        if method == "GET":
            if pid not in self.ingest_pipelines:
                return 404, {}
            return 200, {pid: self.ingest_pipelines[pid]}
        if method == "DELETE":
            if self.ingest_pipelines.pop(pid, None) is None:
                raise ApiError(404, "resource_not_found_exception", f"pipeline [{pid}] is missing")
            return 200, {"acknowledged": True}
        if method != "PUT":
            raise ApiError(405, "method_not_allowed", "method not allowed")
        for proc in body.get("processors", []):
            (ptype, config), = proc.items()
            self._validate_ingest_processor(ptype, dict(config))
        self.ingest_pipelines[pid] = body
        return 200, {"acknowledged": True}

    def _validate_ingest_processor(self, ptype: str, config: dict[str, Any]) -> None:
        if ptype != "sparse_encoding" or "opensearch-neural-search" not in self.plugins:
            raise ApiError(400, "parse_exception", f"No processor type exists with name [{ptype}]")
        allowed = {"model_id", "field_map", "tag", "description", "ignore_failure", "if", "on_failure"}
        if self.version >= (2, 16, 0):
            allowed.add("batch_size")
        if self.version >= (2, 19, 0):
            allowed |= {"prune_type", "prune_ratio"}
        if self.version >= (3, 0, 0):
            allowed.add("skip_existing")
        for key in ("model_id", "field_map"):
            if key not in config:
                raise ApiError(400, "parse_exception", f"[{key}] required property is missing")
        extra = [k for k in config if k not in allowed]
        if extra:
            raise ApiError(400, "parse_exception",
                           f"processor [sparse_encoding] doesn't support one or more provided configuration parameters {extra}")
        prune_type = config.get("prune_type") or "none"
        checks = {"none": None, "top_k": (lambda r: r > 0 and r == int(r), "prune_ratio should be positive integer."),
                  "max_ratio": (lambda r: 0 <= r < 1, "prune_ratio should be in the range [0, 1)."),
                  "alpha_mass": (lambda r: 0 <= r < 1, "prune_ratio should be in the range [0, 1)."),
                  "abs_value": (lambda r: r >= 0, "prune_ratio should be non-negative.")}
        if prune_type not in checks:
            raise ApiError(400, "illegal_argument_exception", f"Unknown prune type: {prune_type}")
        if prune_type != "none":
            if "prune_ratio" not in config:
                raise ApiError(400, "parse_exception", "[prune_ratio] required property is missing")
            ratio = float(config["prune_ratio"])
            ok, desc = checks[prune_type]
            if not ok(ratio):
                raise ApiError(400, "illegal_argument_exception",
                               f"Illegal prune_ratio {ratio:f} for prune_type: {prune_type}. {desc}")
        elif "prune_ratio" in config:
            raise ApiError(400, "illegal_argument_exception",
                           "prune_ratio field is not supported when prune_type is not provided")

    def _search_pipeline(self, method: str, pid: str, body: dict) -> tuple[int, Any]:
        if method == "GET":
            if pid not in self.search_pipelines:
                return 404, {}
            return 200, {pid: self.search_pipelines[pid]}
        if method == "DELETE":
            self.search_pipelines.pop(pid, None)
            return 200, {"acknowledged": True}
        if method != "PUT":
            raise ApiError(405, "method_not_allowed", "method not allowed")
        for proc in body.get("request_processors", []) or []:
            (ptype, config), = proc.items()
            if ptype == "neural_sparse_two_phase_processor" and self.version >= (2, 15, 0):
                params = config.get("two_phase_parameter", {}) or {}
                prune_type = params.get("prune_type", "max_ratio")
                if "prune_type" in params and self.version < (2, 19, 0):
                    raise ApiError(400, "illegal_argument_exception", "unknown parameter [prune_type] in two_phase_parameter")
                ratio = float(params.get("prune_ratio", 0.4))
                if prune_type in ("max_ratio", "alpha_mass") and not 0 <= ratio < 1:
                    raise ApiError(400, "illegal_argument_exception",
                                   f"Illegal prune_ratio {ratio:f} for prune_type: {prune_type}. prune_ratio should be in the range [0, 1).")
                # neural-search 3.6.0.0 NeuralSparseTwoPhaseProcessor.java:82/88 (the %n is the source's own)
                if float(params.get("expansion_rate", 5.0)) < 1.0:
                    raise ApiError(400, "illegal_argument_exception", "The two_phase_parameter.expansion_rate must >= 1.0. "
                                   f"Received: {float(params.get('expansion_rate')):f}")
                if int(params.get("max_window_size", 10000)) < 50:
                    raise ApiError(400, "illegal_argument_exception", "The two_phase_parameter.max_window_size must >= 50. "
                                   f"Received: \n{int(params.get('max_window_size'))}")
            elif ptype == "neural_query_enricher":
                pass
            else:
                raise ApiError(400, "illegal_argument_exception", f"Invalid processor type [{ptype}]")
        for proc in body.get("phase_results_processors", []) or []:
            (ptype, config), = proc.items()
            if ptype == "normalization-processor" and self.version >= (2, 10, 0):
                tech = (config.get("normalization") or {}).get("technique", "min_max")
                comb = config.get("combination") or {}
                if tech not in ("min_max", "l2", "z_score"):
                    raise ApiError(400, "illegal_argument_exception", f"provided normalization technique [{tech}] is not supported")
                if comb.get("technique", "arithmetic_mean") not in ("arithmetic_mean", "geometric_mean", "harmonic_mean"):
                    raise ApiError(400, "illegal_argument_exception",
                                   f"provided combination technique [{comb.get('technique')}] is not supported")
                weights = (comb.get("parameters") or {}).get("weights")
                if weights is not None and abs(sum(weights) - 1.0) > 0.0001:
                    raise ApiError(400, "illegal_argument_exception",
                                   f"sum of weights for combination must be equal to 1.0, supplied weights sum: {sum(weights)}")
            elif ptype == "score-ranker-processor" and self.version >= (2, 19, 0):
                comb = config.get("combination") or {}
                if comb.get("technique", "rrf") != "rrf":
                    raise ApiError(400, "illegal_argument_exception", "only the [rrf] technique is supported by score-ranker-processor")
                rrf_rank_constant(config, self.version)  # placement and range by version (RRFProcessorFactory)
            else:
                raise ApiError(400, "illegal_argument_exception", f"Invalid processor type [{ptype}]")
        self.search_pipelines[pid] = body
        return 200, {"acknowledged": True}

    def _run_ingest(self, index: Index, pipeline_id: str, doc_id: str, source: dict[str, Any]) -> dict[str, Any]:
        pipeline = self.ingest_pipelines.get(pipeline_id)
        if pipeline is None:
            raise ApiError(400, "illegal_argument_exception", f"pipeline with id [{pipeline_id}] does not exist")
        source = dict(source)
        ann = index.sparse_ann_fields()
        for proc in pipeline.get("processors", []):
            (ptype, config), = proc.items()
            field_map = config["field_map"]
            prune_type = config.get("prune_type") or "none"
            ratio = float(config.get("prune_ratio", 0) or 0)
            for src, dst in field_map.items():
                value = source.get(src)
                if value is None:
                    continue
                prev = index.docs.get(doc_id)
                if config.get("skip_existing") and prev is not None and prev.source.get(src) == value and dst in prev.source:
                    source[dst] = prev.source[dst]
                    continue
                fmt = "token_id" if dst in ann else "word"
                texts = value if isinstance(value, list) else [value]
                maps = self.predict_map(config["model_id"], [str(t) for t in texts], fmt)
                if self.version >= (2, 19, 0):
                    maps = [_prune(m, prune_type, ratio) for m in maps]
                source[dst] = [{"sparse_encoding": m} for m in maps] if isinstance(value, list) else maps[0]
        return source


def _prune(weights: dict[str, float], prune_type: str, ratio: float) -> dict[str, float]:
    """neural-search ``PruneUtils.pruneSparseVector`` (>= 2.19): positivity check, then the prune."""
    for value in weights.values():
        if value <= 0:
            raise ApiError(400, "illegal_argument_exception", "Pruned values must be positive")
    if prune_type == "top_k":
        keep = sorted(weights.items(), key=lambda kv: -kv[1])[:int(ratio)]
        return dict(keep)
    if prune_type == "max_ratio":
        top = max(weights.values(), default=0.0)
        return {k: v for k, v in weights.items() if v >= ratio * top}
    if prune_type == "abs_value":
        return {k: v for k, v in weights.items() if v >= ratio}
    if prune_type == "alpha_mass":
        total = sum(weights.values())
        out, acc = {}, 0.0
        for k, v in sorted(weights.items(), key=lambda kv: -kv[1]):
            acc += v
            if acc <= ratio * total:
                out[k] = v
        return out
    return dict(weights)
