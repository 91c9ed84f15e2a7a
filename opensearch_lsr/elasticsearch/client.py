"""Connect to Elasticsearch (elasticsearch-py) and tell what the cluster version supports.

Auth: API key (``--api-key``, base64 ``id:key`` or the encoded form Kibana shows), basic
(``--user``/``--password``), Elastic Cloud id (``--cloud-id``) or a URL; TLS certificates are
verified unless ``insecure``. Secrets never reach the logs: :func:`describe_connection` is what is
logged, with credentials redacted.

Version gates (:class:`EsFeatures`; ``docs/elasticsearch-contract.md`` section 6): ``sparse_vector``
field 8.11 (``SparseVectorFieldMapper``: "not supported from 8.0 to 8.10"), ``sparse_vector``
query 8.15, ``rrf`` retriever 8.16 (GA; 8.14 technical preview), ``index_options`` pruning on the
field 8.19 / 9.1.

elasticsearch-py 9.x sends ``compatible-with=9`` headers that an 8.x server refuses; use the 8.x
client (``pip install 'elasticsearch>=8.11,<9'``) against an 8.x cluster.
"""
from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import urlparse

from ..errors import LsrError

__all__ = ["EsConnectionError", "EsFeatures", "make_es_client", "describe_connection", "detect_es_features",
           "parse_es_version"]


class EsConnectionError(LsrError, ValueError):
    """Bad connection options or an unreachable/unsupported cluster (one clear sentence)."""


def parse_es_version(text: str) -> tuple[int, int, int]:
    """``"8.15.0-SNAPSHOT"`` -> ``(8, 15, 0)``."""
    from ..opensearch.client import parse_version

    return parse_version(text, product="Elasticsearch")


@dataclasses.dataclass(frozen=True)
class EsFeatures:
    """What an Elasticsearch version (and its plugins, when known) supports."""

    version: tuple[int, int, int]
    plugins: frozenset[str] | None = None

    @classmethod
    def from_version(cls, version: str | tuple[int, ...], plugins: set[str] | None = None) -> "EsFeatures":
        ver = parse_es_version(version) if isinstance(version, str) else tuple(version) + (0,) * (3 - len(version))
        return cls(tuple(int(v) for v in ver[:3]), frozenset(plugins) if plugins is not None else None)  # type: ignore[arg-type]

    def at_least(self, major: int, minor: int) -> bool:
        return self.version[:2] >= (major, minor)

    @property
    def sparse_vector_field(self) -> bool:
        return self.at_least(8, 11)

    @property
    def sparse_vector_query(self) -> bool:
        return self.at_least(8, 15)

    @property
    def rrf_retriever(self) -> bool:
        return self.at_least(8, 16)

    @property
    def index_pruning(self) -> bool:
        """``index_options.prune`` / ``pruning_config`` on a ``sparse_vector`` mapping (8.19, 9.1+)."""
        return self.at_least(9, 1) or (self.version[0] == 8 and self.at_least(8, 19))

    @property
    def nori(self) -> bool | None:
        return None if self.plugins is None else "analysis-nori" in self.plugins

    def to_dict(self) -> dict[str, Any]:
        return {"version": ".".join(map(str, self.version)), "plugins": sorted(self.plugins) if self.plugins else None,
                **{k: getattr(self, k) for k in ("sparse_vector_field", "sparse_vector_query", "rrf_retriever",
                                                 "index_pruning", "nori")}}


def make_es_client(url: str | None = None, *, cloud_id: str | None = None, api_key: str | None = None,
                   user: str | None = None, password: str | None = None, ca_certs: str | None = None,
                   insecure: bool = False, request_timeout: float = 60.0, max_retries: int = 3):
    """An ``elasticsearch.Elasticsearch`` client (extra ``opensearch-lsr[elasticsearch]``).

    Exactly one of ``url``/``cloud_id``; at most one of ``api_key`` and ``user``/``password``.
    """
    try:
        from elasticsearch import Elasticsearch
    except ImportError as err:  # pragma: no cover - extra not installed
        raise EsConnectionError("the Elasticsearch backend needs elasticsearch-py: "
                                "pip install 'opensearch-lsr[elasticsearch]'") from err
    if bool(url) == bool(cloud_id):
        raise EsConnectionError("give either --url (or ELASTICSEARCH_URL) or --cloud-id, exactly one")
    if url:
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise EsConnectionError(f"--url must look like http(s)://host:port, got {describe_connection(url=url)['url']!r}")
    if (user is None) != (password is None):
        raise EsConnectionError("give both --user and --password, or neither")
    if api_key and user:
        raise EsConnectionError("use either an API key or basic auth, not both")
    if insecure and ca_certs:
        raise EsConnectionError("--insecure and --ca-certs contradict each other: pick one")
    kwargs: dict[str, Any] = {"request_timeout": request_timeout, "max_retries": max_retries,
                              "retry_on_status": (502, 503, 504), "retry_on_timeout": False}
    if url:
        kwargs["hosts"] = [url]
        if url.startswith("https"):
            kwargs["verify_certs"] = not insecure
            if insecure:
                kwargs["ssl_show_warn"] = False
    else:
        kwargs["cloud_id"] = cloud_id
        kwargs["verify_certs"] = not insecure
    if ca_certs:
        kwargs["ca_certs"] = ca_certs
    if api_key:
        kwargs["api_key"] = api_key
    if user is not None:
        kwargs["basic_auth"] = (user, password)
    try:
        return Elasticsearch(**kwargs)
    except ValueError as err:  # e.g. a malformed cloud id
        raise EsConnectionError(f"invalid connection options: {err}") from err


def describe_connection(url: str | None = None, cloud_id: str | None = None, api_key: str | None = None,
                        user: str | None = None, password: str | None = None, **_: Any) -> dict[str, Any]:
    """What may be logged about a connection: no password, no key, no credentials inside the URL."""
    safe_url = None
    if url:
        p = urlparse(url)
        netloc = p.hostname or ""
        if p.port:
            netloc += f":{p.port}"
        if p.username or p.password:
            netloc = "***@" + netloc
        safe_url = p._replace(netloc=netloc).geturl()
    return {"url": safe_url, "cloud_id": (cloud_id.split(":", 1)[0] + ":***") if cloud_id else None,
            "auth": "api_key" if api_key else ("basic" if user else None), "user": user}


def detect_es_features(client) -> EsFeatures:
    """``GET /`` (version, must be Elasticsearch >= 8.11) and ``GET _cat/plugins`` (analysis-nori)."""
    from elasticsearch import ApiError
    from elastic_transport import TransportError

    try:
        info = client.info()
    except ApiError as err:
        raise EsConnectionError(f"the cluster answered GET / with HTTP {err.meta.status}") from err
    except TransportError as err:
        raise EsConnectionError(f"cannot reach the cluster: {type(err).__name__}") from err
    version = info.get("version", {})
    if version.get("distribution") == "opensearch":
        raise EsConnectionError("this is an OpenSearch cluster: use --backend opensearch")
    try:
        features = EsFeatures.from_version(version.get("number", ""))
    except ValueError as err:
        raise EsConnectionError(f"cannot read the cluster version from GET /: {version!r}") from err
    plugins = None
    try:
        rows = client.cat.plugins(format="json")
        plugins = {row.get("component") for row in rows.body if row.get("component")}
    except ApiError:
        pass
    features = EsFeatures(features.version, frozenset(plugins) if plugins is not None else None)
    if not features.sparse_vector_field:
        raise EsConnectionError(f"Elasticsearch {features.to_dict()['version']} has no sparse_vector field; 8.11 or newer is needed")
    return features
