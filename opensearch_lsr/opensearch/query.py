"""The ``neural_sparse`` query DSL (and client-side ``query_tokens_for`` a model).

``tokenize_query`` (ML Commons ``SparseTokenizerModel``, opensearch-contract.md §2.2) lives in
:mod:`opensearch_lsr.encoding.query_tokens` and is re-exported here.

``neural_sparse_query`` builds the standard query body (§4.2), refusing combinations OpenSearch
rejects and features a cluster version does not have (§4.4).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ..contract import MAX_QUERY_WEIGHT, KeyFormat, djl_tokenizer
from ..encoding.query_tokens import tokenize_query, tokenize_query_ids  # noqa: F401 - re-exported
from .client import parse_version as client_parse_version

__all__ = [
    "tokenize_query",
    "tokenize_query_ids",
    "neural_sparse_query",
    "nested_query",
    "method_parameters",
    "cap_query_weights",
    "bool_query",
    "filter_clauses",
    "search_body",
    "parse_version",
    "query_tokens_for",
    "explain_contributions",
]

def parse_version(version: str | Sequence[int] | None) -> tuple[int, int, int] | None:
    """``"2.19.1"`` -> ``(2, 19, 1)`` (strings by :func:`opensearch_lsr.opensearch.client.parse_version`);
    ``None`` stays ``None`` (version unknown: no gating)."""
    if version is None:
        return None
    if isinstance(version, str):
        return client_parse_version(version)
    parts = [int(p) for p in version]
    parts = (parts + [0, 0, 0])[:3]
    return (parts[0], parts[1], parts[2])


def method_parameters(k: int | None = None, top_n: int | None = None, heap_factor: float | None = None,
                      filter: Mapping[str, Any] | None = None) -> dict[str, Any]:  # noqa: A002 - the DSL's name
    """``neural_sparse.method_parameters`` of a SEISMIC (``sparse_vector``) search, validated like
    neural-search's ``SparseAnnQueryBuilder.fromXContent`` (3.3.0.0): ``k`` hits per shard and
    ``top_n`` query tokens kept (positive integers, default 10 each), ``heap_factor`` (positive, default
    1.0), ``filter`` (a query clause applied inside the ANN search). Only the given keys are sent.
    """
    out: dict[str, Any] = {}
    for key, value in (("k", k), ("top_n", top_n)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"method_parameters.{key} must be a positive integer, got {value!r}")
        out[key] = value
    if heap_factor is not None:
        if isinstance(heap_factor, bool) or not isinstance(heap_factor, (int, float)) or not heap_factor > 0:
            raise ValueError(f"method_parameters.heap_factor must be a positive number, got {heap_factor!r}")
        out["heap_factor"] = float(heap_factor)
    if filter is not None:
        if not isinstance(filter, Mapping) or len(filter) != 1:
            raise ValueError("method_parameters.filter must be one query clause, e.g. {\"term\": {\"lang\": \"ko\"}}")
        out["filter"] = dict(filter)
    return out


def neural_sparse_query(
    field: str,
    *,
    query_text: str | None = None,
    model_id: str | None = None,
    query_tokens: Mapping[str, float] | None = None,
    analyzer: str | None = None,
    boost: float | None = None,
    name: str | None = None,
    version: str | Sequence[int] | None = None,
    method_params: Mapping[str, Any] | None = None,
) -> dict:
    """A ``neural_sparse`` query clause (contract §4.2, §4.3).

    Exactly one of ``query_text`` (with ``model_id``, ``analyzer``, or neither: the cluster default
    model/analyzer) and ``query_tokens``. ``version`` (the cluster's) refuses what it lacks:
    ``query_tokens`` < 2.14, ``analyzer`` < 3.1, a missing ``model_id`` < 2.13, ``method_params``
    < 3.3. ``method_params`` (see :func:`method_parameters`) only act on a ``sparse_vector`` field:
    without them OpenSearch 3.3 scores a SEISMIC field exactly, while 3.4+ applies its defaults
    (k 10, top_n 10; neural-search ``NeuralSparseQueryBuilder`` at 3.3.0.0 vs 3.4.0.0).
    """
    if not field:
        raise ValueError("field must be a non-empty field name")
    if (query_text is None) == (query_tokens is None):
        raise ValueError("pass exactly one of query_text and query_tokens")
    if model_id is not None and analyzer is not None:
        raise ValueError("model_id and analyzer cannot be used together in a neural_sparse query")
    if query_tokens is not None and (model_id is not None or analyzer is not None):
        raise ValueError("query_tokens are sent as they are: do not combine them with model_id or analyzer")
    ver = parse_version(version)
    body: dict[str, Any] = {}
    if query_tokens is not None:
        if ver is not None and ver < (2, 14, 0):
            raise ValueError(f"query_tokens needs OpenSearch >= 2.14 (cluster is {'.'.join(map(str, ver))})")
        tokens = {}
        for key, value in query_tokens.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"query token keys must be non-empty strings, got {key!r}")
            w = float(value)
            if not (0.0 < w <= MAX_QUERY_WEIGHT):
                raise ValueError(f"weight must be in (0, 64.0], got: {w} (token {key!r})")
            tokens[key] = w
        if not tokens:
            raise ValueError("query_tokens is empty: the query has no token with a positive weight")
        body["query_tokens"] = tokens
    else:
        if not isinstance(query_text, str) or not query_text.strip():
            raise ValueError("query_text must be a non-empty string")
        body["query_text"] = query_text
        if model_id is not None:
            body["model_id"] = model_id
        elif analyzer is not None:
            if ver is not None and ver < (3, 1, 0):
                raise ValueError(f"analyzer needs OpenSearch >= 3.1 (cluster is {'.'.join(map(str, ver))})")
            body["analyzer"] = analyzer
        elif ver is not None and ver < (2, 13, 0):
            raise ValueError("model_id is required before OpenSearch 2.13 (no default model)")
    if method_params:
        if ver is not None and ver < (3, 3, 0):
            raise ValueError(f"method_parameters need OpenSearch >= 3.3 (cluster is {'.'.join(map(str, ver))})")
        body["method_parameters"] = method_parameters(**dict(method_params))
    if boost is not None:
        body["boost"] = float(boost)
    if name is not None:
        body["_name"] = name
    return {"neural_sparse": {field: body}}


def nested_query(path: str, query: dict, score_mode: Literal["max", "avg", "sum", "min"] = "max") -> dict:
    """Wrap ``query`` for documents split into nested passages (``lsr-os index --long-text split``):
    the document scores as its best passage (``max``; OpenSearch's own default is ``avg``)."""
    if score_mode not in ("max", "avg", "sum", "min"):
        raise ValueError(f"score_mode must be one of max, avg, sum, min, got {score_mode!r}")
    return {"nested": {"path": path, "query": query, "score_mode": score_mode}}


def bool_query(must: Sequence[dict] | dict, filters: Mapping[str, Any] | Sequence[dict] | None = None) -> dict:
    """Scoring clauses that must all match, plus non-scoring ``filter`` clauses.

    The scoring clauses go under ``bool.should`` with ``minimum_should_match`` = their number (the
    same matches and scores as ``must``) because neural-search's two-phase processor only rewrites a
    ``neural_sparse`` that is the query itself or sits under ``bool.should``
    (``NeuralSparseTwoPhaseProcessor.collectNeuralQueryBuilderWithSparseEmbedding``, 2.15.0.0 to
    3.8.0.0): under ``must`` a two-phase pipeline would silently do nothing.
    ``filters`` may be ``{field: value}`` (a ``term`` per field, a ``terms`` for lists) or clauses.
    """
    must_list = [must] if isinstance(must, dict) else list(must)
    if not filters:
        return must_list[0] if len(must_list) == 1 else {"bool": {"should": must_list,
                                                                  "minimum_should_match": len(must_list)}}
    return {"bool": {"should": must_list, "minimum_should_match": len(must_list), "filter": filter_clauses(filters)}}


def filter_clauses(filters: Mapping[str, Any] | Sequence[dict]) -> list[dict]:
    """``{field: value}`` -> a ``term`` per field (``terms`` for lists); a list of clauses stays as it is."""
    if isinstance(filters, Mapping):
        return [{"terms": {k: list(v)}} if isinstance(v, (list, tuple)) else {"term": {k: v}}
                for k, v in filters.items()]
    return list(filters)


def search_body(
    query: dict,
    size: int = 10,
    from_: int = 0,
    source: bool | Sequence[str] | Mapping[str, Any] | None = None,
    explain: bool = False,
) -> dict:
    """A ``_search`` request body."""
    body: dict[str, Any] = {"query": query, "size": int(size)}
    if from_:
        body["from"] = int(from_)
    if source is not None:
        body["_source"] = source if isinstance(source, (bool, Mapping)) else list(source)
    if explain:
        body["explain"] = True
    return body


def query_tokens_for(text: str, model: str | os.PathLike, idf: Mapping[str, float] | None = None,
                     key_format: KeyFormat = "word") -> dict[str, float]:
    """Client-side ``query_tokens`` for ``text`` with ``model``, as the cluster would compute them.

    * an export bundle dir (``sparse_tokenize.zip``) or a SPARSE_TOKENIZE zip: ``tokenize_query``
      with its ``tokenizer.json``/``idf.json``;
    * an inference-free encoder dir (``idf.json`` next to a Router) or any model with ``idf``
      given: ``tokenize_query`` with that IDF;
    * otherwise a bi-encoder: its query encoder's weights (must lie in (0, 64]).
    """
    import json
    import zipfile
    from pathlib import Path

    path = Path(model)
    zpath = path / "sparse_tokenize.zip" if path.is_dir() else path
    if zpath.suffix == ".zip" and zpath.exists():
        from tokenizers import Tokenizer

        with zipfile.ZipFile(zpath) as zf:
            tok = Tokenizer.from_str(zf.read("tokenizer.json").decode("utf-8"))
            zidf = json.loads(zf.read("idf.json")) if "idf.json" in zf.namelist() else None
        return tokenize_query(text, djl_tokenizer(tok), idf if idf is not None else zidf, key_format)
    from ..inference_free import inference_free_parts, is_inference_free
    from ..multilingual.milco import is_milco_dir

    if key_format == "word" and is_milco_dir(path):
        # a MILCO vector spans two vocabularies (source ids, then English pivot ids offset by V_src): one
        # tokenizer cannot decode both, so its index holds token-id keys only (multilingual/lexecho.py)
        key_format = "token_id"
    doc_only = is_inference_free(path)
    if idf is None and doc_only and (path / "idf.json").exists():
        idf = json.loads((path / "idf.json").read_text(encoding="utf-8"))
    if idf is not None:
        from transformers import AutoTokenizer

        # a doc-only (Router) dir keeps its tokenizer in the document Transformer's folder, not at the root
        tokenizer_dir = inference_free_parts(path)[0] if doc_only else path
        return tokenize_query(text, AutoTokenizer.from_pretrained(str(tokenizer_dir)), idf, key_format)
    from ..encoding.keyed import SparseKeyedEncoder

    return cap_query_weights(SparseKeyedEncoder(str(path), key_format=key_format)(text))


def cap_query_weights(tokens: Mapping[str, float], cap: float = MAX_QUERY_WEIGHT) -> dict[str, float]:
    """Clip query weights to Lucene's ``(0, 64]`` (``FeatureField.newLinearQuery``; contract 4.2).

    A max-pooled log1p(relu) SPLADE query stays far below 64, but a sum-pooled encoder adds one term
    per occurrence and can pass it, which OpenSearch answers with HTTP 400 ("weight must be in
    (0, 64.0]"). Clipping keeps every other token's weight and the query valid; it is logged.
    Non-positive weights are dropped (they contribute nothing and Lucene rejects them).
    """
    out: dict[str, float] = {}
    clipped = []
    for key, value in tokens.items():
        w = float(value)
        if not w > 0:
            continue
        if w > cap:
            clipped.append((key, w))
            w = cap
        out[key] = w
    if clipped:
        logging.getLogger(__name__).warning(
            "%d query weight(s) above %g clipped to it (Lucene's limit), e.g. %r=%.2f: the encoder is probably "
            "sum-pooled", len(clipped), cap, clipped[0][0], clipped[0][1])
    return out


def explain_contributions(hit: Mapping[str, Any]) -> list[tuple[str, float]]:
    """``[(token, contribution), ...]`` from a hit's ``_explanation`` (local backend or OpenSearch's
    ``FeatureQuery`` explanations: "... for the <token> feature ...")."""
    import re

    out: list[tuple[str, float]] = []

    def walk(node: Mapping[str, Any]) -> None:
        m = re.search(r"for the (.+?) feature", node.get("description", ""))
        if m:
            out.append((m.group(1), float(node.get("value", 0.0))))
            return
        for child in node.get("details", []) or []:
            walk(child)

    if hit.get("_explanation"):
        walk(hit["_explanation"])
    return sorted(out, key=lambda kv: -kv[1])
