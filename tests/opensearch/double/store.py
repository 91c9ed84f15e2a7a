"""Index side of the double: mappings, analysis, rank_features storage, query evaluation, BM25.

Faithful where the toolkit's results depend on it (contract 4.2, 6.2): ``neural_sparse`` scores are
``boost * sum(q_w * trunc9(d_w))`` with Lucene FeatureField's 9-bit truncation, query weights must lie in
(0, 64], only ``rank_features`` (or ``sparse_vector`` on 3.3+) fields are accepted. Approximations, said
where they matter: BM25 uses Lucene's formula on a whitespace/word tokenizer; ``nori`` is approximated
by words plus Hangul character bigrams (no morphology); ``cjk`` by CJK bigrams; segments and
refresh are modelled as "visible after refresh or after 1 s".
"""
from __future__ import annotations

import math
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ApiError", "Index", "trunc9", "analyze", "FLOAT_MIN_NORMAL"]

FLOAT_MIN_NORMAL = 1.17549435e-38
_WORD = re.compile(r"\w+", re.UNICODE)
_HANGUL = re.compile(r"[\uac00-\ud7a3]")
_CJK = re.compile(r"[\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u9fff\uac00-\ud7a3]")


class ApiError(Exception):
    """An OpenSearch-shaped error: HTTP status, exception type and reason."""

    def __init__(self, status: int, type_: str, reason: str, caused_by: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.type = type_
        self.reason = reason
        self.caused_by = caused_by

    def item(self) -> dict[str, Any]:
        """The error object of a ``_bulk`` item (type, reason and the ``caused_by`` chain)."""
        return {"type": self.type, "reason": self.reason, **({"caused_by": self.caused_by} if self.caused_by else {})}

    def body(self) -> dict[str, Any]:
        return {"error": {"root_cause": [{"type": self.type, "reason": self.reason}], **self.item()},
                "status": self.status}


class ShardQueryError(ApiError):
    """An error thrown while a shard builds the Lucene query (``doToQuery``): OpenSearch answers
    ``search_phase_execution_exception`` "all shards failed" whose root cause is a ``query_shard_exception``
    "failed to create query: <reason>" caused by the original ``illegal_argument_exception``
    (``QueryShardContext.toQuery``; observed on OpenSearch 3.6.0 for ``FeatureField.newLinearQuery``'s
    weight check and neural-search's rank_features check)."""

    def __init__(self, reason: str, index: str) -> None:
        super().__init__(400, "search_phase_execution_exception", "all shards failed")
        self.inner = reason
        self.index = index

    def body(self) -> dict[str, Any]:
        shard = {"type": "query_shard_exception", "reason": f"failed to create query: {self.inner}", "index": self.index}
        caused = {**shard, "caused_by": {"type": "illegal_argument_exception", "reason": self.inner}}
        return {"error": {"root_cause": [shard], "type": self.type, "reason": self.reason, "phase": "query",
                          "grouped": True, "failed_shards": [{"shard": 0, "index": self.index, "reason": caused}],
                          "caused_by": caused}, "status": self.status}


def trunc9(value: float) -> float:
    """Lucene FeatureField storage: float32, keep the top 9 significant bits (``bits >>> 15 << 15``)."""
    bits = struct.unpack(">i", struct.pack(">f", value))[0]
    bits = (bits >> 15) << 15
    return struct.unpack(">f", struct.pack(">i", bits))[0]


def f32(value: float) -> float:
    return struct.unpack(">f", struct.pack(">f", value))[0]


def analyze(analyzer: str, text: str) -> list[str]:
    """Approximate the built-in analyzers the toolkit's templates use."""
    text = str(text)
    if analyzer in ("standard", "default", "simple", "english"):
        return [w.lower() for w in _WORD.findall(text)]
    if analyzer == "cjk":
        out = []
        for word in _WORD.findall(text.lower()):
            if _CJK.search(word) and len(word) > 1:
                out += [word[i:i + 2] for i in range(len(word) - 1)]
            else:
                out.append(word)
        return out
    if analyzer == "nori":
        out = []
        for word in _WORD.findall(text.lower()):
            out.append(word)
            if _HANGUL.search(word) and len(word) > 2:
                out += [word[i:i + 2] for i in range(len(word) - 1)]
        return out
    if analyzer == "keyword":
        return [text]
    raise ApiError(400, "illegal_argument_exception", f"failed to find analyzer [{analyzer}]")


def _get_path(source: dict, path: str) -> Any:
    node: Any = source
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


@dataclass
class Doc:
    id: str
    source: dict[str, Any]
    version: int = 1
    features: dict[str, dict[str, float]] = field(default_factory=dict)  # field -> token -> trunc9 weight
    terms: dict[str, list[str]] = field(default_factory=dict)            # text field -> analyzed tokens
    # nested path -> one {"features": {full sub-field: token -> weight}, "source": object} per nested object
    nested: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


class Index:
    """One index: settings, mappings, documents and their indexed forms."""

    def __init__(self, name: str, settings: dict[str, Any], mappings: dict[str, Any],
                 *, plugins: set[str], version: tuple[int, int, int]) -> None:
        self.name = name
        self.settings = _flatten_settings(settings)
        self.mappings = mappings or {}
        self.version = version
        self.docs: dict[str, Doc] = {}
        self.visible: dict[str, Doc] = {}
        self.last_write = 0.0
        self.lock = threading.RLock()
        self.analyzers = self._build_analyzers(plugins)
        self._check_mappings()

    # -- creation ---------------------------------------------------------------------------
    def _build_analyzers(self, plugins: set[str]) -> dict[str, str]:
        """custom analyzer name -> the built-in behaviour it approximates."""
        out: dict[str, str] = {}
        analysis = self.settings.get("index.analysis", {}) or {}
        tokenizers = analysis.get("tokenizer", {}) or {}
        for name, spec in (analysis.get("analyzer", {}) or {}).items():
            kind = spec.get("type", "custom")
            if kind == "custom":
                tok = spec.get("tokenizer", "standard")
                tok_type = tokenizers.get(tok, {}).get("type", tok) if isinstance(tokenizers.get(tok), dict) else tok
                if tok_type == "nori_tokenizer":
                    if "analysis-nori" not in plugins:
                        raise ApiError(400, "illegal_argument_exception",
                                       f"failed to find tokenizer under name [{tok}]" if tok == tok_type else
                                       f"Unknown tokenizer type [{tok_type}] for [{tok}]")
                    out[name] = "nori"
                elif tok_type in ("standard", "whitespace", "keyword"):
                    filters = spec.get("filter", [])
                    out[name] = "cjk" if "cjk_bigram" in filters else ("keyword" if tok_type == "keyword" else "standard")
                else:
                    raise ApiError(400, "illegal_argument_exception", f"failed to find tokenizer under name [{tok}]")
            elif kind == "nori":
                if "analysis-nori" not in plugins:
                    raise ApiError(400, "illegal_argument_exception", f"Unknown analyzer type [nori] for [{name}]")
                out[name] = "nori"
            elif kind in ("standard", "cjk", "keyword", "simple"):
                out[name] = kind
            else:
                raise ApiError(400, "illegal_argument_exception", f"Unknown analyzer type [{kind}] for [{name}]")
        if "analysis-nori" in plugins:
            out.setdefault("nori", "nori")
        for builtin in ("standard", "cjk", "keyword", "simple", "default"):
            out.setdefault(builtin, "standard" if builtin == "default" else builtin)
        return out

    def _check_mappings(self) -> None:
        for name, prop in self.properties().items():
            kind = prop.get("type", "object")
            if kind == "text":
                analyzer = prop.get("analyzer", "standard")
                if analyzer not in self.analyzers:
                    raise ApiError(400, "mapper_parsing_exception",
                                   f"analyzer [{analyzer}] has not been configured in mappings")
            elif kind == "sparse_vector":
                if self.version < (3, 3, 0):
                    raise ApiError(400, "mapper_parsing_exception",
                                   f"No handler for type [sparse_vector] declared on field [{name}]")
                method = prop.get("method")
                if not isinstance(method, dict) or method.get("name") != "seismic":
                    raise ApiError(400, "mapper_parsing_exception",
                                   f"[method] with name [seismic] is required for sparse_vector field [{name}]")
                params = method.get("parameters", {}) or {}
                checks = {"n_postings": lambda v: v > 0 or v == -1, "cluster_ratio": lambda v: 0 < v < 1,
                          "summary_prune_ratio": lambda v: 0 < v <= 1, "approximate_threshold": lambda v: v >= 0,
                          "quantization_ceiling_ingest": lambda v: v > 0, "quantization_ceiling_search": lambda v: v > 0}
                for key, value in params.items():
                    if key not in checks:
                        raise ApiError(400, "mapper_parsing_exception", f"unknown seismic parameter [{key}]")
                    if not isinstance(value, (int, float)) or not checks[key](value):
                        raise ApiError(400, "mapper_parsing_exception", f"invalid value [{value}] for [{key}]")
            elif kind not in ("keyword", "rank_features", "rank_feature", "integer", "long", "float", "double",
                              "boolean", "date", "object", "nested"):
                raise ApiError(400, "mapper_parsing_exception",
                               f"No handler for type [{kind}] declared on field [{name}]")

    def properties(self) -> dict[str, dict[str, Any]]:
        return (self.mappings.get("properties") or {})

    @property
    def sparse_enabled(self) -> bool:
        return str(self.settings.get("index.sparse", "false")).lower() == "true"

    def field_type(self, name: str) -> str | None:
        """Type of a field, dotted paths into object/nested properties included."""
        props: dict[str, Any] = self.properties()
        prop: Any = None
        for part in name.split("."):
            prop = props.get(part) if isinstance(props, dict) else None
            if prop is None:
                return None
            props = prop.get("properties") or {}
        return prop.get("type", "object")

    def sparse_ann_fields(self) -> set[str]:
        if not self.sparse_enabled:
            return set()
        return {n for n, p in self.properties().items() if p.get("type") == "sparse_vector"}

    # -- documents ----------------------------------------------------------------------------
    def index_doc(self, doc_id: str, source: dict[str, Any]) -> tuple[str, int]:
        """Parse one document as the mappers would; raises ApiError(400, mapper_parsing_exception)."""
        doc = Doc(doc_id, source)
        for name, value in source.items():
            kind = self.field_type(name)
            if kind is None:
                self._dynamic_map(name, value)
                kind = self.field_type(name)
            if value is None:
                continue
            if kind == "rank_features":
                doc.features[name] = self._parse_features(name, value, doc_id, sparse=False)
            elif kind == "sparse_vector":
                doc.features[name] = self._parse_features(name, value, doc_id, sparse=True)
            elif kind == "text":
                analyzer = self.properties()[name].get("analyzer", "standard")
                texts = value if isinstance(value, list) else [value]
                doc.terms[name] = [t for v in texts for t in analyze(self.analyzers[analyzer], v)]
            elif kind == "keyword":
                doc.terms[name] = [str(v) for v in (value if isinstance(value, list) else [value])]
            elif kind == "nested":
                doc.nested[name] = self._parse_nested(name, value, doc_id)
        with self.lock:
            prev = self.docs.get(doc_id)
            doc.version = prev.version + 1 if prev else 1
            self.docs[doc_id] = doc
            self.last_write = time.monotonic()
        return ("updated" if prev else "created"), doc.version

    def _dynamic_map(self, name: str, value: Any) -> None:
        props = self.mappings.setdefault("properties", {})
        if isinstance(value, str):
            props[name] = {"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}}
        elif isinstance(value, bool):
            props[name] = {"type": "boolean"}
        elif isinstance(value, int):
            props[name] = {"type": "long"}
        elif isinstance(value, float):
            props[name] = {"type": "float"}
        else:  # an object of token weights explodes into one float sub-field per token (contract 4.1)
            props[name] = {"type": "object"}

    def _parse_nested(self, name: str, value: Any, doc_id: str) -> list[dict[str, Any]]:
        """Each object of a ``nested`` field: its sparse sub-fields parsed like top-level ones."""
        objects = value if isinstance(value, list) else [value]
        out = []
        for obj in objects:
            if not isinstance(obj, dict):
                raise ApiError(400, "mapper_parsing_exception", f"object mapping for [{name}] tried to parse field "
                               f"[{name}] as object, but found a concrete value")
            feats = {}
            for sub, sub_value in obj.items():
                full = f"{name}.{sub}"
                kind = self.field_type(full)
                if kind in ("rank_features", "sparse_vector") and sub_value is not None:
                    feats[full] = self._parse_features(full, sub_value, doc_id, sparse=kind == "sparse_vector")
            out.append({"features": feats, "source": obj})
        return out

    def _parse_features(self, name: str, value: Any, doc_id: str, *, sparse: bool) -> dict[str, float]:
        """Parse one vector field. ``rank_features`` errors come back as ``mapper_parsing_exception`` "failed to
        parse" with the mapper's own exception as ``caused_by``: ``RankFeaturesFieldMapper`` overrides ``parse``
        (no per-field "failed to parse field [..]" wrapper) and ``DocumentParser`` wraps what it throws (observed
        on OpenSearch 3.6.0; the Lucene 10 ``FeatureField`` text "for feature a on field v")."""
        if sparse:
            return self._parse_features_raw(name, value, doc_id, sparse=True)
        try:
            return self._parse_features_raw(name, value, doc_id, sparse=False)
        except ApiError as err:
            inner = err.caused_by or {"type": err.type, "reason": err.reason}
            raise ApiError(400, "mapper_parsing_exception", "failed to parse", caused_by=inner) from None

    def _parse_features_raw(self, name: str, value: Any, doc_id: str, *, sparse: bool) -> dict[str, float]:
        kind = "sparse_vector" if sparse else "rank_features"
        prefix = f"failed to parse field [{name}] of type [{kind}] in document with id '{doc_id}'. "
        if not isinstance(value, dict):
            raise ApiError(400, "mapper_parsing_exception",
                           prefix + f"[{kind}] fields must be json objects, expected a START_OBJECT but got: {type(value).__name__}")
        out: dict[str, float] = {}
        for token, weight in value.items():
            if sparse:
                if not re.fullmatch(r"\d+", token):
                    raise ApiError(400, "mapper_parsing_exception", prefix + "[sparse_vector] fields should be valid integer")
                if int(token) >= 32768:  # contract 4.3: ids fold into a short and break the ANN path
                    raise ApiError(400, "mapper_parsing_exception",
                                   prefix + f"token id [{token}] >= 32768 cannot be stored by SEISMIC in releases <= 3.8")
            if not token:
                raise ApiError(400, "mapper_parsing_exception", prefix + "feature name must not be empty")
            if weight is None:  # VALUE_NULL: "ignore feature, this is consistent with numeric fields"
                continue
            if isinstance(weight, str):  # VALUE_STRING: parser.floatValue(true) coerces numeric strings
                try:
                    weight = float(weight.strip())
                except ValueError:
                    raise ApiError(400, "mapper_parsing_exception", prefix + f"For input string: \"{weight}\"",
                                   caused_by={"type": "number_format_exception",
                                              "reason": f"For input string: \"{weight}\""}) from None
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise ApiError(400, "mapper_parsing_exception",
                               prefix + f"[{kind}] fields take hashes that map a feature to a strictly positive float, but got unexpected token {type(weight).__name__}")
            w = f32(float(weight))
            if not math.isfinite(w) or w < FLOAT_MIN_NORMAL:
                raise ApiError(400, "illegal_argument_exception",
                               f"featureValue must be a positive normal float, got: {float(weight)} for feature {token} "
                               f"on field {name} which is less than the minimum positive normal float: 1.1754944E-38")
            out[token] = trunc9(w)
        return out

    def delete_doc(self, doc_id: str) -> bool:
        with self.lock:
            self.last_write = time.monotonic()
            return self.docs.pop(doc_id, None) is not None

    def refresh(self) -> None:
        with self.lock:
            self.visible = dict(self.docs)

    def searchable(self) -> dict[str, Doc]:
        with self.lock:
            if self.visible is not self.docs and time.monotonic() - self.last_write > 1.0:
                self.visible = dict(self.docs)  # refresh_interval 1s
            return self.visible

    # -- BM25 ---------------------------------------------------------------------------------
    def bm25(self, field_name: str, text: str, docs: dict[str, Doc]) -> dict[str, float]:
        """Lucene BM25 (k1=1.2, b=0.75, idf = ln(1 + (N - df + 0.5)/(df + 0.5)))."""
        prop = self.properties().get(field_name, {})
        analyzer = self.analyzers.get(prop.get("search_analyzer", prop.get("analyzer", "standard")), "standard")
        q_terms = analyze(analyzer, text)
        with_field = [d for d in docs.values() if field_name in d.terms]
        n = len(with_field)
        if not n or not q_terms:
            return {}
        avgdl = sum(len(d.terms[field_name]) for d in with_field) / n
        df: dict[str, int] = {}
        for term in set(q_terms):
            df[term] = sum(1 for d in with_field if term in d.terms[field_name])
        scores: dict[str, float] = {}
        for d in with_field:
            terms = d.terms[field_name]
            dl = len(terms)
            score = 0.0
            for term in q_terms:
                tf = terms.count(term)
                if not tf:
                    continue
                idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                score += idf * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * dl / avgdl))
            if score > 0:
                scores[d.id] = score
        return scores


def _flatten_settings(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"index": {"default_pipeline": x}}`` and ``{"default_pipeline": x}`` -> ``{"index.default_pipeline": x}``;
    ``analysis`` stays a nested dict under ``index.analysis``."""
    out: dict[str, Any] = {}
    for key, value in (settings or {}).items():
        full = f"{prefix}{key}" if prefix else key
        if not full.startswith("index."):
            full = "index." + full if full != "index" else "index"
        if full == "index" and isinstance(value, dict):
            out.update(_flatten_settings(value, "index."))
        elif full == "index.analysis":
            out[full] = value
        elif isinstance(value, dict):
            out.update(_flatten_settings(value, full + "."))
        else:
            out[full] = value
    return out


def eval_query(query: dict[str, Any] | None, source: dict[str, Any]) -> bool:
    """Boolean filter evaluation over a plain ``_source`` (used for ML model/model-group searches)."""
    if not query:
        return True
    (kind, body), = query.items()
    if kind == "match_all":
        return True
    if kind == "bool":
        def clauses(key):
            value = body.get(key, [])
            return value if isinstance(value, list) else [value]
        if not all(eval_query(q, source) for q in clauses("must") + clauses("filter")):
            return False
        if any(eval_query(q, source) for q in clauses("must_not")):
            return False
        should = clauses("should")
        return not should or any(eval_query(q, source) for q in should)
    if kind in ("term", "terms"):
        (fname, value), = body.items()
        if isinstance(value, dict) and kind == "term":
            value = value.get("value")
        actual = _get_path(source, fname[:-len(".keyword")] if fname.endswith(".keyword") else fname)
        values = value if kind == "terms" else [value]
        return actual in values
    if kind == "exists":
        return _get_path(source, body["field"]) is not None
    if kind == "ids":
        return source.get("_id") in body.get("values", [])
    if kind == "match":
        (fname, value), = body.items()
        if isinstance(value, dict):
            value = value.get("query")
        actual = _get_path(source, fname)
        return actual is not None and set(analyze("standard", value)) <= set(analyze("standard", actual))
    raise ApiError(400, "parsing_exception", f"unknown query [{kind}]")
