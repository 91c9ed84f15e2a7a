"""Connect to Elasticsearch (elasticsearch-py) and tell what the cluster version supports.

Auth: API key (``--api-key``, base64 ``id:key`` or the encoded form Kibana shows), basic
(``--user``/``--password``), Elastic Cloud id (``--cloud-id``) or a URL; TLS certificates are
verified unless ``insecure``. Secrets never reach the logs: :func:`describe_connection` is what is
logged, with credentials redacted.

Version gates (:class:`EsFeatures`; ``docs/elasticsearch-contract.md`` section 6): ``sparse_vector``
field 8.11 (``SparseVectorFieldMapper``: "not supported from 8.0 to 8.10"), ``sparse_vector``
query 8.15, ``rrf`` retriever 8.16 (GA; 8.14 technical preview), ``index_options`` pruning on the
field 8.19 / 9.1.

elasticsearch-py 9.x sends ``compatible-with=9`` headers that an 8.x server refuses (HTTP 400
``media_type_header_exception``); :func:`detect_es_features` says so and names the client to install
(``pip install 'elasticsearch>=8.16,<9'`` against an 8.x cluster). Elasticsearch 8.15 is the oldest server
the toolkit supports (the ``sparse_vector`` query).
"""
from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import urlparse

from ..engines.versions import parse_version
from ..errors import LsrError

__all__ = ["EsConnectionError", "EsFeatures", "make_es_client", "describe_connection", "detect_es_features",
           "parse_es_version"]


class EsConnectionError(LsrError, ValueError):
    """Bad connection options or an unreachable/unsupported cluster (one clear sentence)."""


def parse_es_version(text: str) -> tuple[int, int, int]:
    """``"8.15.0-SNAPSHOT"`` -> ``(8, 15, 0)``."""
    return parse_version(text, product="Elasticsearch")


@dataclasses.dataclass(frozen=True)
class EsFeatures:
    """What an Elasticsearch version (and its plugins, when known) supports."""

    version: tuple[int, int, int]
    plugins: frozenset[str] | None = None
    #: ``GET _license``: ``(type, status)``, e.g. ``("basic", "active")``; ``None`` when not read.
    license: tuple[str, str] | None = None

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
    def rrf_licensed(self) -> bool | None:
        """Whether the licence allows the ``rrf`` retriever (``None``: licence not read).

        ``RRFRankPlugin.RANK_RRF_FEATURE`` is ``LicensedFeature.momentary(null, "rank-rrf",
        License.OperationMode.ENTERPRISE)`` (elastic/elasticsearch
        ``x-pack/plugin/rank-rrf/src/main/java/org/elasticsearch/xpack/rank/rrf/RRFRankPlugin.java`` at
        v8.17.0 and the stored main version; PLATINUM when added, elastic/elasticsearch#93396); ``XPackLicenseState`` allows it on an
        active ``enterprise`` or ``trial`` licence and answers HTTP 403 otherwise.
        """
        if self.license is None:
            return None
        kind, status = self.license
        return status == "active" and kind in ("enterprise", "trial")

    @property
    def index_pruning(self) -> bool:
        """``index_options.prune`` / ``pruning_config`` on a ``sparse_vector`` mapping (8.19, 9.1+)."""
        return self.at_least(9, 1) or (self.version[0] == 8 and self.at_least(8, 19))

    @property
    def nori(self) -> bool | None:
        return None if self.plugins is None else "analysis-nori" in self.plugins

    def to_dict(self) -> dict[str, Any]:
        return {"version": ".".join(map(str, self.version)), "plugins": sorted(self.plugins) if self.plugins else None,
                "license": "/".join(self.license) if self.license else None,
                **{k: getattr(self, k) for k in ("sparse_vector_field", "sparse_vector_query", "rrf_retriever",
                                                 "rrf_licensed", "index_pruning", "nori")}}


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
    import logging

    # elastic_transport logs every failed attempt with a traceback at WARNING; the toolkit reports the
    # failure itself in one sentence
    for name in ("elastic_transport.transport", "elastic_transport.node_pool"):
        logger = logging.getLogger(name)
        if logger.level < logging.ERROR:
            logger.setLevel(logging.ERROR)
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
    """``GET /`` (version), ``GET _cat/plugins`` (analysis-nori) and ``GET _license`` (the ``rrf`` retriever)."""
    from elasticsearch import ApiError
    from elastic_transport import TransportError

    try:
        # one try: a refused connection or a bad address does not get better by retrying (the bulk writer's
        # rounds are for a cluster that goes away mid-job)
        info = client.options(max_retries=0).info()
    except ApiError as err:
        if _refuses_client_major(err):
            raise EsConnectionError(_client_hint(f"the cluster refused elasticsearch-py {_client_version()}'s "
                                                 "compatibility headers")) from err
        raise EsConnectionError(f"the cluster answered GET / with HTTP {err.meta.status}") from err
    except TransportError as err:
        raise EsConnectionError(f"cannot reach the cluster at {_node_of(client)}: {_transport_reason(err)}") from err
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
    licence = None
    try:
        lic = client.license.get().body.get("license") or {}
        licence = (str(lic.get("type", "")).lower(), str(lic.get("status", "")).lower())
    except ApiError:  # security may forbid reading it: then the rrf check stays with the server
        pass
    features = EsFeatures(features.version, frozenset(plugins) if plugins is not None else None, licence)
    if not features.sparse_vector_query:
        # 8.11-8.14 have the field but not the sparse_vector query (8.15), and 8.11-8.12 ship libtorch 1.13.1
        raise EsConnectionError(f"Elasticsearch {features.to_dict()['version']} is too old: the toolkit needs 8.15 or "
                                "newer (the sparse_vector query)")
    return features


def _client_version() -> str:
    from elasticsearch import __versionstr__

    return str(__versionstr__)


def _client_hint(what: str, server_major: int = 8) -> str:
    """The one sentence for a client/server major mismatch (the server refuses newer clients' headers)."""
    return (f"{what}: elasticsearch-py sends 'compatible-with=<client major>' headers and a server accepts its own "
            f"major and the one before, so install a client of the server's major: "
            f"pip install 'elasticsearch>={server_major}.16,<{server_major + 1}'")


def _refuses_client_major(err: Exception) -> bool:
    """An 8.x server's answer to a 9.x client: HTTP 400 ``media_type_header_exception`` ("Accept version must be
    either version 8 or 7, but found 9"; ``RestCompatibleVersionHelper``, elastic/elasticsearch
    ``server/src/main/java/org/elasticsearch/rest/RestCompatibleVersionHelper.java``)."""
    status = getattr(getattr(err, "meta", None), "status", None)
    text = str(getattr(err, "body", "")) + str(err)
    return status == 400 and ("media_type_header_exception" in text or "compatible-with" in text
                              or "Accept version must be" in text)


def _node_of(client) -> str:
    try:
        node = client.transport.node_pool.all()[0]
        return describe_connection(url=node.base_url)["url"] or "the cluster"
    except Exception:  # noqa: BLE001 - only for the message
        return "the cluster"


def _transport_reason(err: Exception) -> str:
    """``connection refused`` / ``timed out`` / the error class, without the transport's long text."""
    chain: list[BaseException] = []
    cur: BaseException | None = err
    while cur is not None and len(chain) < 10:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    text = " ".join(str(e) for e in chain) + " ".join(str(x) for x in getattr(err, "errors", ()))
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or "Connection refused" in text:
        return "connection refused"
    if "timed out" in text.lower() or "Timeout" in type(err).__name__:
        return "timed out"
    if "Name or service not known" in text or "nodename nor servname" in text:
        return "unknown host"
    return type(err).__name__
