"""Elasticsearch index and ingest-pipeline set-up from ``mappings/elasticsearch/`` and ``pipelines/elasticsearch/``.

* ``sparse_vector`` field (8.11+; ``SparseVectorFieldMapper``) with, from 8.19 / 9.1, the
  index-time token pruning options ``index_options: {prune, pruning_config: {tokens_freq_ratio_threshold,
  tokens_weight_threshold}}`` (defaults 5 and 0.4; ``_types.mapping.SparseVectorIndexOptions``);
* a Korean text field analysed by ``nori`` (``analysis-nori`` plugin; the built-in ``cjk``
  analyzer when the plugin is missing) for BM25 and hybrid search;
* an ingest pipeline whose ``inference`` processor runs the deployed ``text_expansion`` model on the
  text field and writes the token map into the ``sparse_vector`` field (``input_output``).

The templates are rendered with :func:`opensearch_lsr.engines.templates.render` (shared by every engine).
"""
from __future__ import annotations

from typing import Any

from ..contract import DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD
from ..errors import LsrError
from ..engines.templates import IndexSetupError, load_template, render
from .client import EsFeatures

__all__ = ["EsIndexError", "index_body", "pipeline_body", "create_index", "put_pipeline", "index_options",
           "NORI_FILTERS", "CJK_FILTERS"]

NORI_FILTERS = ["nori_part_of_speech", "nori_readingform", "lowercase"]
CJK_FILTERS = ["cjk_width", "lowercase", "cjk_bigram"]


class EsIndexError(LsrError, ValueError):
    """Bad index options or a feature the cluster lacks (one clear sentence)."""


def index_options(features: EsFeatures, prune: bool, tokens_freq_ratio_threshold: float | None = None,
                  tokens_weight_threshold: float | None = None) -> dict[str, Any] | None:
    """The ``sparse_vector`` ``index_options``.

    Indices created on 8.19+ / 9.1+ prune ``sparse_vector`` queries by default
    (``SparseVectorFieldType.getDefaultPruningConfig``: ``TokenPruningConfig()`` = 5 / 0.4), which changes the
    ranking. The toolkit's default is exact scoring (the same ranking as the local backend and OpenSearch),
    so without ``prune`` it writes ``{"prune": false}`` on those versions (``None`` before: nothing to turn off).
    With ``prune`` the thresholds are validated as Elasticsearch does (``TokenPruningConfig``:
    ``tokens_freq_ratio_threshold`` in [1, 100], ``tokens_weight_threshold`` in [0, 1]).
    """
    if not prune and tokens_freq_ratio_threshold is None and tokens_weight_threshold is None:
        return {"prune": False} if features.index_pruning else None
    if not features.index_pruning:
        raise EsIndexError(f"sparse_vector index_options (index-time pruning) need Elasticsearch 8.19 / 9.1+, the "
                           f"cluster runs {features.to_dict()['version']}")
    config: dict[str, Any] = {}
    if tokens_freq_ratio_threshold is not None:
        if not 1 <= tokens_freq_ratio_threshold <= 100:
            raise EsIndexError("[tokens_freq_ratio_threshold] must be between [1] and [100]")
        config["tokens_freq_ratio_threshold"] = float(tokens_freq_ratio_threshold)
    if tokens_weight_threshold is not None:
        if not 0 <= tokens_weight_threshold <= 1:
            raise EsIndexError("[tokens_weight_threshold] must be between 0 and 1")
        config["tokens_weight_threshold"] = float(tokens_weight_threshold)
    out: dict[str, Any] = {"prune": True}
    if config:
        out["pruning_config"] = config
    return out


def index_body(features: EsFeatures, *, text_field: str = DEFAULT_TEXT_FIELD, sparse_field: str = DEFAULT_VECTOR_FIELD,
               text_analyzer: str = "auto", default_pipeline: str | None = None, replicas: int = 0,
               options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Render ``mappings/elasticsearch/sparse_vector.json`` for this cluster.

    Args:
        text_analyzer: ``nori`` (refused when the plugin is known to be missing), ``cjk`` or ``auto``.
        options: ``index_options`` (:func:`index_options`); ``None`` means the toolkit's default, exact scoring.
    """
    if options is None:
        options = index_options(features, prune=False)
    if text_analyzer not in ("nori", "cjk", "auto"):
        raise EsIndexError(f"text analyzer must be one of nori, cjk, auto, got {text_analyzer!r}")
    if text_field == sparse_field:
        raise EsIndexError("the text field and the sparse field must differ")
    if "." in sparse_field or "." in text_field:
        raise EsIndexError("use top-level field names (no dots) for the text and sparse fields")
    if not features.sparse_vector_field:
        raise EsIndexError("sparse_vector needs Elasticsearch 8.11+")
    if text_analyzer == "nori" and features.nori is False:
        raise EsIndexError("the nori analyzer needs the analysis-nori plugin, which this cluster lacks "
                           "(bin/elasticsearch-plugin install analysis-nori), or use --text-analyzer auto")
    nori = text_analyzer == "nori" or (text_analyzer == "auto" and features.nori is not False)
    try:
        return render(load_template("mappings", "elasticsearch/sparse_vector"), {
            "replicas": int(replicas), "default_pipeline": default_pipeline,
            "korean_tokenizer": "nori_tokenizer" if nori else "standard",
            "korean_filters": NORI_FILTERS if nori else CJK_FILTERS,
            "text_field": text_field, "sparse_field": sparse_field, "index_options": options})
    except IndexSetupError as err:
        raise EsIndexError(str(err)) from err


def pipeline_body(model_id: str, *, text_field: str = DEFAULT_TEXT_FIELD,
                  sparse_field: str = DEFAULT_VECTOR_FIELD) -> dict[str, Any]:
    """Render ``pipelines/elasticsearch/text_expansion.json``."""
    if not model_id:
        raise EsIndexError("the ingest pipeline needs the deployed model id")
    return render(load_template("pipelines", "elasticsearch/text_expansion"),
                  {"model_id": model_id, "text_field": text_field, "sparse_field": sparse_field})


def create_index(transport, index: str, body: dict[str, Any], *, exist_ok: bool = False) -> dict[str, Any]:
    """``PUT /<index>``; ``exist_ok`` accepts ``resource_already_exists_exception``."""
    from .deploy import _reason

    if not index or index != index.lower() or index.startswith(("_", "-", "+")):
        raise EsIndexError(f"invalid index name {index!r}: lowercase, not starting with _, - or +")
    status, resp = transport.request("PUT", f"/{index}", None, body)
    if status == 400 and exist_ok and "resource_already_exists_exception" in str(resp):
        return {"acknowledged": True, "index": index, "existed": True}
    if status >= 300:
        raise EsIndexError(f"creating index {index} failed with HTTP {status}: {_reason(resp)}")
    return resp


def put_pipeline(transport, pipeline_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """``PUT /_ingest/pipeline/<id>``."""
    from .deploy import _reason

    status, resp = transport.request("PUT", f"/_ingest/pipeline/{pipeline_id}", None, body)
    if status >= 300:
        raise EsIndexError(f"creating pipeline {pipeline_id} failed with HTTP {status}: {_reason(resp)}")
    return resp
