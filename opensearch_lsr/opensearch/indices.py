"""Index and pipeline set-up from the JSON templates in ``mappings/`` and ``pipelines/``.

The templates are the single source of truth (also usable with curl, see their READMEs); this module
renders their ``{{placeholders}}`` (:mod:`opensearch_lsr.engines.templates`, shared with Elasticsearch), adapts them to the cluster's version and plugins
(``ClusterFeatures``, contract 4.4) and sends them:

- ``rank_features`` index with a default ingest pipeline and a Korean text field analysed by ``nori``
  (``analysis-nori``), falling back to the built-in ``cjk`` analyzer when the plugin is missing;
- ``sparse_vector`` + SEISMIC index (3.3+, ``index.sparse``; token ids must be < 32768, contract 4.3);
- ``sparse_encoding`` ingest pipeline with neural-search's prune validation (contract 4.1);
- ``neural_sparse_two_phase_processor`` search pipeline (2.15+);
- hybrid BM25 + ``neural_sparse`` search pipeline: min-max + weighted arithmetic mean
  (``normalization-processor``, 2.10+) or reciprocal rank fusion (``score-ranker-processor``, 2.19+),
  the fusions used for lexical + learned-sparse hybrids in the SPLADE-X / cross-lingual transfer work
  (Nair et al., ECIR 2022; Cormack et al., SIGIR 2009 for RRF).
"""
from __future__ import annotations

import logging
from typing import Any, Literal

from ..contract import DEFAULT_TEXT_FIELD, DEFAULT_VECTOR_FIELD
from ..engines.base import VectorField
from ..engines.templates import IndexSetupError, load_template, render, templates_root
from .client import ClusterFeatures, retry_429
from .client import error_reason as _reason

__all__ = [
    "IndexSetupError",
    "templates_root",
    "load_template",
    "render",
    "validate_prune",
    "parse_prune",
    "resolve_text_analyzer",
    "index_body",
    "ingest_pipeline_body",
    "two_phase_pipeline_body",
    "hybrid_pipeline_body",
    "create_index",
    "put_ingest_pipeline",
    "put_search_pipeline",
    "attach_search_pipeline",
    "MAX_SPARSE_VECTOR_VOCAB",
    "PRUNE_TYPES",
    "VectorField",
    "vector_field_of",
    "two_phase_window_error",
    "check_two_phase",
    "DEFAULT_VECTOR_FIELD",
    "DEFAULT_TEXT_FIELD",
]

logger = logging.getLogger(__name__)

IndexKind = Literal["rank_features", "sparse_vector"]
TextAnalyzer = Literal["nori", "cjk", "standard", "auto"]
HybridTechnique = Literal["normalization", "rrf", "auto"]
INDEX_KINDS = ("rank_features", "sparse_vector")
TEXT_ANALYZERS = ("nori", "cjk", "standard", "auto")
HYBRID_TECHNIQUES = ("normalization", "rrf", "auto")
#: the normalization-processor's score techniques (combined by the weighted arithmetic mean)
NORMALIZATIONS = ("min_max", "z_score", "l2")
PRUNE_TYPES = ("none", "top_k", "alpha_mass", "max_ratio", "abs_value")
#: SEISMIC folds token ids into a short: ids >= 32768 break the ANN path in releases <= 3.8 (contract 4.3).
MAX_SPARSE_VECTOR_VOCAB = 32768
LongText = Literal["truncate", "split"]
#: neural-search NeuralSparseTwoPhaseProcessor: DEFAULT_BASE_QUERY_SIZE when the request has no size
_TWO_PHASE_BASE_SIZE = 10
#: neural-search RRFNormalizationTechnique.RANK_CONSTANT_RANGE
_RANK_CONSTANT_RANGE = (1, 10000)


def validate_prune(prune_type: str | None, prune_ratio: float | None) -> tuple[str, float | None]:
    """Validate like neural-search's ``SparseEncodingProcessorFactory`` + ``PruneUtils`` (contract 4.1).

    Returns ``(prune_type, prune_ratio)`` with ``"none"`` for no pruning.
    """
    from ..pruning import PruneConfig

    try:
        config = PruneConfig(prune_type or "none", prune_ratio)  # type: ignore[arg-type]
    except ValueError as err:
        raise IndexSetupError(str(err)) from None
    ratio = config.prune_ratio
    return config.prune_type, (int(ratio) if config.prune_type == "top_k" else ratio)


def parse_prune(spec: str | None) -> tuple[str, float | None]:
    """``"max_ratio:0.1"`` -> ``("max_ratio", 0.1)``; ``None``/``"none"`` -> ``("none", None)``; parsed by
    :func:`opensearch_lsr.pruning.parse_prune`, returned as the pair the pipeline body takes."""
    from ..pruning import parse_prune as parse_spec

    try:
        config = parse_spec(spec)
    except ValueError as err:
        raise IndexSetupError(str(err)) from None
    return validate_prune(config.prune_type, config.prune_ratio)


def resolve_text_analyzer(requested: str, features: ClusterFeatures) -> str:
    """``auto`` -> ``nori`` when analysis-nori is installed (or unknown: then creation tries it first)."""
    if requested not in TEXT_ANALYZERS:
        raise IndexSetupError(f"text analyzer must be one of {', '.join(TEXT_ANALYZERS)}, got {requested!r}")
    if requested == "nori" and features.has_plugin("analysis-nori") is False:
        raise IndexSetupError("the nori analyzer needs the analysis-nori plugin, which this cluster lacks "
                              "(bin/opensearch-plugin install analysis-nori), or use --text-analyzer auto")
    if requested == "auto":
        return "cjk" if features.has_plugin("analysis-nori") is False else "nori"
    return requested


def index_body(kind: IndexKind, features: ClusterFeatures, *, text_analyzer: str = "auto",
               ingest_pipeline: str | None = None, text_field: str = DEFAULT_TEXT_FIELD,
               vector_field: str = DEFAULT_VECTOR_FIELD, vocab_size: int | None = None,
               seismic_parameters: dict[str, Any] | None = None, long_text: LongText = "truncate") -> dict[str, Any]:
    """Render ``mappings/<kind>.json`` for this cluster.

    ``long_text="split"`` maps the vector field for ``lsr-os index --long-text split`` documents:
    ``<vector_field>`` becomes ``nested`` with ``sparse_encoding`` (the sparse type) and ``text``
    sub-fields, the shape neural-search's ingest processor also writes for list inputs
    (``<field>.sparse_encoding`` under a nested field, contract 4.1). Only ``rank_features``: whether
    SEISMIC supports a ``sparse_vector`` inside ``nested`` was not verified, so that pair is refused.
    """
    if long_text not in ("truncate", "split"):
        raise IndexSetupError(f"long_text must be one of truncate, split, got {long_text!r}")
    if long_text == "split" and kind == "sparse_vector":
        raise IndexSetupError("--long-text split needs --kind rank_features: a nested sparse_vector (SEISMIC) field "
                              "is not supported by this toolkit")
    if kind not in INDEX_KINDS:
        raise IndexSetupError(f"index kind must be one of {', '.join(INDEX_KINDS)}, got {kind!r}")
    if text_field == vector_field:
        raise IndexSetupError("the text field and the vector field must differ")
    if kind == "sparse_vector":
        if not features.sparse_vector:
            raise IndexSetupError(f"sparse_vector (SEISMIC) needs OpenSearch 3.3+, the cluster runs "
                                  f"{features.version_string}; use --kind rank_features")
        if vocab_size is None:
            raise IndexSetupError("a sparse_vector index needs the model's vocabulary size (--bundle or --vocab-size)"
                                  " to check that token ids fit SEISMIC's 32768-id limit")
        if vocab_size >= MAX_SPARSE_VECTOR_VOCAB:
            raise IndexSetupError(f"vocabulary of {vocab_size} ids does not fit sparse_vector: SEISMIC stores token "
                                  f"ids as shorts and ids >= {MAX_SPARSE_VECTOR_VOCAB} break the ANN path (contract "
                                  f"4.3); use --kind rank_features")
    analyzer = resolve_text_analyzer(text_analyzer, features)
    body = render(load_template("mappings", kind), {
        "text_field": text_field, "vector_field": vector_field, "ingest_pipeline": ingest_pipeline})
    index_settings = body.setdefault("settings", {}).setdefault("index", {})
    if analyzer != "nori":
        index_settings.pop("analysis", None)
        body["mappings"]["properties"][text_field]["analyzer"] = analyzer
    if kind == "sparse_vector" and seismic_parameters:
        params = body["mappings"]["properties"][vector_field]["method"]["parameters"]
        unknown = set(seismic_parameters) - {"n_postings", "cluster_ratio", "summary_prune_ratio",
                                             "approximate_threshold", "quantization_ceiling_ingest",
                                             "quantization_ceiling_search"}
        if unknown:
            raise IndexSetupError(f"unknown SEISMIC parameters: {', '.join(sorted(unknown))}")
        params.update(seismic_parameters)
    if long_text == "split":
        props = body["mappings"]["properties"]
        text_mapping = {k: v for k, v in props[text_field].items() if k in ("type", "analyzer")}
        props[vector_field] = {"type": "nested", "properties": {"sparse_encoding": props[vector_field],
                                                                "text": text_mapping}}
    return body


def ingest_pipeline_body(model_id: str, features: ClusterFeatures, *, text_field: str = DEFAULT_TEXT_FIELD,
                         vector_field: str = DEFAULT_VECTOR_FIELD, prune_type: str | None = None,
                         prune_ratio: float | None = None, batch_size: int | None = None,
                         skip_existing: bool = False) -> dict[str, Any]:
    """Render ``pipelines/ingest_sparse_encoding.json`` and add the options the cluster supports."""
    if not model_id:
        raise IndexSetupError("the ingest pipeline needs the SPARSE_ENCODING model id (from deploy-model)")
    ptype, ratio = validate_prune(prune_type, prune_ratio)
    body = render(load_template("pipelines", "ingest_sparse_encoding"),
                  {"model_id": model_id, "text_field": text_field, "vector_field": vector_field})
    proc = body["processors"][0]["sparse_encoding"]
    if ptype != "none":
        if not features.prune:
            raise IndexSetupError(f"prune_type/prune_ratio need OpenSearch 2.19+, the cluster runs "
                                  f"{features.version_string}; prune at export time instead (lsr-os export --prune)")
        proc["prune_type"], proc["prune_ratio"] = ptype, ratio
    if batch_size is not None:
        if batch_size < 1:
            raise IndexSetupError(f"batch_size must be >= 1, got {batch_size}")
        if not features.batch_size:
            raise IndexSetupError(f"batch_size needs OpenSearch 2.16+, the cluster runs {features.version_string}")
        proc["batch_size"] = batch_size
    if skip_existing:
        if not features.skip_existing:
            raise IndexSetupError(f"skip_existing needs OpenSearch 3.0+, the cluster runs {features.version_string}")
        proc["skip_existing"] = True
    return body


def two_phase_pipeline_body(features: ClusterFeatures, *, prune_ratio: float = 0.4, expansion_rate: float = 5.0,
                            max_window_size: int = 10000) -> dict[str, Any]:
    """Render ``pipelines/search_two_phase.json`` (neural-search defaults; ``prune_type`` only on 2.19+)."""
    if not features.two_phase:
        raise IndexSetupError(f"the two-phase processor needs OpenSearch 2.15+, the cluster runs {features.version_string}")
    validate_prune("max_ratio", prune_ratio)
    if expansion_rate < 1.0:
        raise IndexSetupError(f"expansion_rate must be >= 1.0, got {expansion_rate}")
    if max_window_size < 50:
        raise IndexSetupError(f"max_window_size must be >= 50, got {max_window_size}")
    body = load_template("pipelines", "search_two_phase")
    params = body["request_processors"][0]["neural_sparse_two_phase_processor"]["two_phase_parameter"]
    params.update(prune_ratio=prune_ratio, expansion_rate=expansion_rate, max_window_size=max_window_size)
    if not features.prune:
        params.pop("prune_type", None)
    return body


def hybrid_pipeline_body(features: ClusterFeatures, *, technique: HybridTechnique = "auto",
                         weights: tuple[float, float] = (0.3, 0.7), rank_constant: int = 60,
                         normalization: str = "min_max") -> dict[str, Any]:
    """Hybrid BM25 + neural_sparse fusion: ``rrf`` (2.19+) or score ``normalization`` (2.10+).

    ``auto`` picks RRF where available (rank-based, no score calibration needed), else normalization.
    ``weights`` are ``(bm25, neural_sparse)`` and must sum to 1. ``normalization``: ``min_max``, ``l2``
    (2.10+) or ``z_score`` (3.0+, neural-search PR 1224), each with the weighted arithmetic mean.
    """
    if normalization not in NORMALIZATIONS:
        raise IndexSetupError(f"normalization must be one of {', '.join(NORMALIZATIONS)}, got {normalization!r}")
    if technique not in HYBRID_TECHNIQUES:
        raise IndexSetupError(f"technique must be one of {', '.join(HYBRID_TECHNIQUES)}, got {technique!r}")
    if not features.hybrid:
        raise IndexSetupError(f"hybrid search needs OpenSearch 2.10+, the cluster runs {features.version_string}")
    if technique == "auto":
        technique = "rrf" if features.rrf else "normalization"
    if technique == "rrf":
        if not features.rrf:
            raise IndexSetupError(f"RRF (score-ranker-processor) needs OpenSearch 2.19+, the cluster runs "
                                  f"{features.version_string}; use --technique normalization")
        lo, hi = _RANK_CONSTANT_RANGE
        if not lo <= rank_constant <= hi:
            raise IndexSetupError(f"rank_constant must be in [{lo}, {hi}], got {rank_constant}")
        body = load_template("pipelines", "search_hybrid_rrf")
        comb = body["phase_results_processors"][0]["score-ranker-processor"]["combination"]
        comb.pop("rank_constant", None)
        comb.pop("parameters", None)
        # neural-search RRFProcessorFactory: up to 3.0.x rank_constant is read from combination.parameters
        # (a top-level combination.rank_constant is silently ignored); from 3.1.0.0 it is read from
        # combination itself and combination.parameters only takes "weights" (anything else: HTTP 400).
        if features.at_least(3, 1):
            comb["rank_constant"] = int(rank_constant)
        else:
            comb["parameters"] = {"rank_constant": int(rank_constant)}
        return body
    if len(weights) != 2 or any(w < 0 for w in weights) or abs(sum(weights) - 1.0) > 1e-4:
        raise IndexSetupError(f"weights must be two non-negative numbers (bm25, neural_sparse) summing to 1, got {weights}")
    if normalization == "z_score" and not features.at_least(3, 0):
        raise IndexSetupError(f"z_score normalization needs OpenSearch 3.0+, the cluster runs {features.version_string}")
    body = load_template("pipelines", "search_hybrid_normalization")
    proc = body["phase_results_processors"][0]["normalization-processor"]
    proc["normalization"]["technique"] = normalization
    proc["combination"]["parameters"]["weights"] = [float(w) for w in weights]
    if normalization != "min_max":
        body["description"] = body["description"].replace("min-max", normalization.replace("_", "-"))
    return body


def create_index(client, name: str, kind: IndexKind, features: ClusterFeatures, **options: Any) -> dict[str, Any]:
    """Create the index; with ``text_analyzer="auto"`` and unknown plugins, try nori then fall back to cjk.

    Returns ``{"index": name, "kind": kind, "text_analyzer": ..., "body": <what was sent>}``.
    """
    from opensearchpy.exceptions import TransportError

    requested = options.pop("text_analyzer", "auto")
    body = index_body(kind, features, text_analyzer=requested, **options)
    analyzer = _analyzer_of(body, options.get("text_field", "text"))
    try:
        retry_429(lambda: client.indices.create(index=name, body=body), what=f"create index {name}")
    except TransportError as err:
        reason = _reason(err)
        nori_missing = "nori" in reason and ("tokenizer" in reason or "analyzer" in reason)
        if requested == "auto" and analyzer == "korean" and nori_missing:
            logger.warning("analysis-nori is not installed: the text field falls back to the cjk analyzer")
            body = index_body(kind, features.__class__(features.version, frozenset()), text_analyzer="auto", **options)
            analyzer = _analyzer_of(body, options.get("text_field", "text"))
            try:
                retry_429(lambda: client.indices.create(index=name, body=body), what=f"create index {name}")
            except TransportError as err2:
                raise IndexSetupError(f"creating index {name} failed (HTTP {err2.status_code}): {_reason(err2)}") from err2
        elif "resource_already_exists" in str(getattr(err, "error", "")) or "already exists" in reason:
            raise IndexSetupError(f"index {name} already exists; delete it or pick another name") from err
        else:
            raise IndexSetupError(f"creating index {name} failed (HTTP {err.status_code}): {reason}") from err
    return {"index": name, "kind": kind, "text_analyzer": "nori" if analyzer == "korean" else analyzer, "body": body}


def _analyzer_of(body: dict[str, Any], text_field: str) -> str:
    return body["mappings"]["properties"][text_field].get("analyzer", "standard")


def put_ingest_pipeline(client, pipeline_id: str, body: dict[str, Any]) -> None:
    from opensearchpy.exceptions import TransportError

    try:
        retry_429(lambda: client.ingest.put_pipeline(id=pipeline_id, body=body),
                  what=f"create ingest pipeline {pipeline_id}")
    except TransportError as err:
        raise IndexSetupError(f"creating ingest pipeline {pipeline_id} failed (HTTP {err.status_code}): "
                              f"{_reason(err)}") from err


def put_search_pipeline(client, pipeline_id: str, body: dict[str, Any]) -> None:
    from opensearchpy.exceptions import TransportError

    try:
        retry_429(lambda: client.search_pipeline.put(id=pipeline_id, body=body),
                  what=f"create search pipeline {pipeline_id}")
    except TransportError as err:
        raise IndexSetupError(f"creating search pipeline {pipeline_id} failed (HTTP {err.status_code}): "
                              f"{_reason(err)}") from err


def attach_search_pipeline(client, index: str, pipeline_id: str) -> None:
    """``PUT <index>/_settings {"index.search.default_pipeline": <id>}``.

    Refuses a two-phase pipeline on an index with a ``sparse_vector`` field: neural-search's
    ``NeuralSparseTwoPhaseProcessor.validateSeismicQuery`` (3.3.0.0+) then fails every later
    ``neural_sparse`` search on that field with "Two phase search processor is not compatible with
    [seismic] field for now".
    """
    from opensearchpy.exceptions import TransportError

    pipeline = _get_search_pipeline(client, pipeline_id)
    if pipeline is not None and _two_phase_params(pipeline) is not None:
        ann = [f.name for f in _sparse_fields(client, index) if f.kind == "sparse_vector"]
        if ann:
            raise IndexSetupError(f"search pipeline {pipeline_id} holds neural_sparse_two_phase_processor, which "
                                  f"neural-search refuses on sparse_vector (SEISMIC) fields such as {ann[0]}: every "
                                  f"search on {index} would fail; SEISMIC prunes by itself (method_parameters top_n)")
    try:
        retry_429(lambda: client.indices.put_settings(index=index, body={"index.search.default_pipeline": pipeline_id}),
                  what=f"attach search pipeline {pipeline_id} to {index}")
    except TransportError as err:
        raise IndexSetupError(f"attaching search pipeline {pipeline_id} to {index} failed (HTTP {err.status_code}): "
                              f"{_reason(err)}") from err


# ----------------------------------------------------------------------------------------------
# reading an index back: its sparse field, its search pipeline
# ----------------------------------------------------------------------------------------------

def _sparse_fields_of(properties: dict[str, Any], prefix: str = "", nested: str | None = None) -> list[VectorField]:
    out: list[VectorField] = []
    for name, prop in (properties or {}).items():
        if not isinstance(prop, dict):
            continue
        path = f"{prefix}{name}"
        ftype = prop.get("type")
        if ftype in INDEX_KINDS:
            out.append(VectorField(path, ftype, nested))  # type: ignore[arg-type]
        elif "properties" in prop:
            out.extend(_sparse_fields_of(prop["properties"], f"{path}.", path if ftype == "nested" else nested))
    return out


def _sparse_fields(client, index: str) -> list[VectorField]:
    from opensearchpy.exceptions import NotFoundError, TransportError

    try:
        res = retry_429(lambda: client.indices.get_mapping(index=index), what=f"read the mapping of {index}")
    except NotFoundError as err:
        raise IndexSetupError(f"index {index} does not exist (create it with lsr-os create-index)") from err
    except TransportError as err:
        raise IndexSetupError(f"reading the mapping of {index} failed (HTTP {err.status_code}): {_reason(err)}") from err
    fields: list[VectorField] = []
    for entry in res.values():
        fields.extend(_sparse_fields_of((entry.get("mappings") or {}).get("properties", {})))
    return fields


def vector_field_of(client, index: str, field: str | None = None) -> VectorField:
    """The sparse field to query on ``index``: ``field`` if given (checked against the mapping), else
    the index's only ``rank_features``/``sparse_vector`` field, else :data:`DEFAULT_VECTOR_FIELD`.

    A nested field (``--long-text split`` documents) may be named by its path (``sparse_embedding``)
    or in full (``sparse_embedding.sparse_encoding``).

    Raises:
        IndexSetupError: the index is missing, has no sparse field, or ``field`` is not one of them.
    """
    fields = _sparse_fields(client, index)
    if not fields:
        raise IndexSetupError(f"index {index} has no rank_features or sparse_vector field to search")
    if field:
        for f in fields:
            if field in (f.name, f.nested_path):
                return f
        raise IndexSetupError(f"field {field} of index {index} is not a rank_features/sparse_vector field; "
                              f"sparse fields: {', '.join(f.name for f in fields)}")
    if len(fields) == 1:
        return fields[0]
    for f in fields:
        if DEFAULT_VECTOR_FIELD in (f.name, f.nested_path):
            return f
    raise IndexSetupError(f"index {index} has several sparse fields ({', '.join(f.name for f in fields)}): pick one "
                          f"with --field")


def _get_search_pipeline(client, pipeline_id: str) -> dict[str, Any] | None:
    from opensearchpy.exceptions import NotFoundError, TransportError

    try:
        res = retry_429(lambda: client.search_pipeline.get(id=pipeline_id), what=f"read search pipeline {pipeline_id}")
    except NotFoundError:
        return None
    except TransportError as err:
        raise IndexSetupError(f"reading search pipeline {pipeline_id} failed (HTTP {err.status_code}): "
                              f"{_reason(err)}") from err
    return res.get(pipeline_id) if isinstance(res, dict) else None


def _two_phase_params(pipeline: dict[str, Any]) -> dict[str, Any] | None:
    """The effective two-phase parameters of a pipeline, or ``None`` when it has none / it is off."""
    for proc in pipeline.get("request_processors") or []:
        config = proc.get("neural_sparse_two_phase_processor") if isinstance(proc, dict) else None
        if config is None:
            continue
        params = dict(config.get("two_phase_parameter") or {})
        if config.get("enabled", True) is False or float(params.get("prune_ratio", 0.4)) == 0.0:
            return None  # processRequest returns the request untouched
        return {"expansion_rate": float(params.get("expansion_rate", 5.0)),
                "max_window_size": int(params.get("max_window_size", 10000))}
    return None


def two_phase_window_error(pipeline: dict[str, Any], size: int | None) -> str | None:
    """Why neural-search would refuse a search of ``size`` hits through ``pipeline`` (else ``None``).

    ``NeuralSparseTwoPhaseProcessor.buildRescoreQueryBuilderForTwoPhase``: the rescore window is
    ``(int)(size * expansion_rate)`` (size 10 when unset) and must lie in ``[0, max_window_size]``.
    """
    params = _two_phase_params(pipeline)
    if params is None:
        return None
    base = _TWO_PHASE_BASE_SIZE if size is None or size < 0 else int(size)
    window = int(base * params["expansion_rate"])
    if window > params["max_window_size"]:
        largest = int(params["max_window_size"] // params["expansion_rate"])
        return (f"size {base} x expansion_rate {params['expansion_rate']:g} = {window} exceeds the two-phase "
                f"max_window_size {params['max_window_size']}: ask for at most {largest} hits, or recreate the "
                f"pipeline with a larger --max-window-size")
    return None


def check_two_phase(client, index: str, size: int | None, search_pipeline: str | None = None) -> None:
    """Refuse, before sending it, a search the index's (or the named) two-phase pipeline would reject.

    Raises:
        IndexSetupError: with :func:`two_phase_window_error`'s sentence.
    """
    from opensearchpy.exceptions import TransportError

    pipeline_id = search_pipeline
    if pipeline_id is None:
        try:
            res = client.indices.get_settings(index=index, name="index.search.default_pipeline",
                                              flat_settings=True)
        except TransportError as err:
            raise IndexSetupError(f"reading the settings of {index} failed (HTTP {err.status_code}): "
                                  f"{_reason(err)}") from err
        pipeline_id = next((v.get("settings", {}).get("index.search.default_pipeline") for v in res.values()), None)
    if not pipeline_id or pipeline_id == "_none":
        return
    pipeline = _get_search_pipeline(client, pipeline_id)
    error = two_phase_window_error(pipeline, size) if pipeline else None
    if error:
        raise IndexSetupError(f"search pipeline {pipeline_id} of {index}: {error}")
