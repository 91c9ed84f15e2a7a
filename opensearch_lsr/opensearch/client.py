"""Connect to OpenSearch and find out what the cluster can do.

One place builds the ``opensearchpy.OpenSearch`` client (URL, basic auth, TLS with verification on
by default, AWS SigV4) and one click decorator (:func:`connection_options`) declares the matching
command-line options, so every command that talks to a cluster (``deploy-model``, ``create-index``,
``create-pipeline``, ``index``, ``search``) accepts the same flags and environment variables.

Version-dependent features follow ``opensearch-contract.md`` section 4.4 (:class:`ClusterFeatures`).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import re
from typing import Any, Callable, Literal
from urllib.parse import urlparse

from ..engines.versions import parse_version
from ..errors import LsrError

__all__ = [
    "ClusterFeatures",
    "ClusterConnectionError",
    "error_reason",
    "error_status",
    "retry_429",
    "connection_options",
    "client_from_options",
    "make_client",
    "detect_features",
    "parse_version",
    "require_client_version",
    "check_distribution",
    "CONNECTION_OPTION_NAMES",
    "MIN_OPENSEARCH_PY",
]

logger = logging.getLogger(__name__)

#: Names of the keyword arguments :func:`connection_options` adds to a command.
CONNECTION_OPTION_NAMES = ("url", "user", "password", "ca_certs", "insecure", "aws_region",
                           "aws_service", "request_timeout", "max_retries")

AwsService = Literal["es", "aoss"]

#: ``plugins.ml.register_model_meta``, ``upload_chunk``, ``search_model_group``, ``get_model`` and
#: ``predict`` first appear in opensearch-py v3.0.0 (``opensearchpy/plugins/ml.py`` at tags v2.8.0
#: vs v3.0.0); setup.cfg pins the same floor.
MIN_OPENSEARCH_PY = (3, 0, 0)
#: Elasticsearch's ``GET /`` tagline (OpenSearch answers "The OpenSearch Project: ...").
_ES_TAGLINE = "You Know, for Search"


class ClusterConnectionError(LsrError, ValueError):
    """Bad connection options or an unreachable/unsupported cluster (one clear sentence)."""


def require_client_version(version: str | None = None) -> None:
    """Fail with one sentence when the installed opensearch-py is older than :data:`MIN_OPENSEARCH_PY`.

    Args:
        version: the version to check (default: the installed ``opensearchpy.__versionstr__``).
    """
    if version is None:
        import opensearchpy

        version = str(getattr(opensearchpy, "__versionstr__", "0"))
    try:
        found = parse_version(version)
    except ValueError:
        return  # a development build without a version: let it try
    if found < MIN_OPENSEARCH_PY:
        need = ".".join(map(str, MIN_OPENSEARCH_PY[:2]))
        raise ClusterConnectionError(
            f"opensearch-py {version} is installed but opensearch-lsr needs opensearch-py>={need} (its plugins.ml "
            f"client gained register_model_meta/upload_chunk/predict in {need}): pip install -U 'opensearch-py>={need}'")


class _QuietTransportLog(logging.Filter):
    """Keep opensearch-py's per-request failure logs (a WARNING with a traceback for every refused
    connection, ``Connection.log_request_fail``) off the terminal unless the toolkit's own logger is
    verbose: the toolkit reports the failure itself in one sentence."""

    def filter(self, record: logging.LogRecord) -> bool:
        ours = logging.getLogger("opensearch_lsr")
        if record.levelno < logging.ERROR and not ours.isEnabledFor(logging.INFO):
            return False
        if not ours.isEnabledFor(logging.DEBUG):
            record.exc_info, record.exc_text = None, None
        return True


def _quiet_transport_logging() -> None:
    log = logging.getLogger("opensearch")
    if not any(isinstance(f, _QuietTransportLog) for f in log.filters):
        log.addFilter(_QuietTransportLog())


@dataclasses.dataclass(frozen=True)
class ClusterFeatures:
    """What a cluster of a given OpenSearch version supports (contract section 4.4).

    Args:
        version: ``(major, minor, patch)`` of the cluster.
        plugins: installed plugin component names (``opensearch-ml``, ``opensearch-neural-search``,
            ``analysis-nori`` ...) when known, else ``None`` (not detected).
    """

    version: tuple[int, int, int]
    plugins: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if len(self.version) != 3 or not all(isinstance(v, int) for v in self.version):
            raise ValueError(f"version must be (major, minor, patch), got {self.version!r}")

    @classmethod
    def from_version(cls, version: str | tuple[int, ...], plugins: set[str] | None = None) -> "ClusterFeatures":
        ver = parse_version(version) if isinstance(version, str) else tuple(version) + (0,) * (3 - len(version))
        return cls(version=tuple(int(v) for v in ver[:3]),  # type: ignore[arg-type]
                   plugins=frozenset(plugins) if plugins is not None else None)

    def at_least(self, major: int, minor: int) -> bool:
        return self.version[:2] >= (major, minor)

    @property
    def version_string(self) -> str:
        return ".".join(map(str, self.version))

    # ML Commons / neural-search feature gates (contract 4.4)
    @property
    def sparse_models(self) -> bool:
        """SPARSE_ENCODING / SPARSE_TOKENIZE, ``sparse_encoding`` processor, ``neural_sparse`` (2.11)."""
        return self.at_least(2, 11)

    @property
    def register_meta_path(self) -> bool:
        """``_register_meta`` / ``upload_chunk`` / ``_deploy`` (2.7+); older clusters only know
        the deprecated ``meta`` / ``chunk`` / ``_load`` paths."""
        return self.at_least(2, 7)

    @property
    def query_tokens(self) -> bool:
        return self.at_least(2, 14)

    @property
    def two_phase(self) -> bool:
        return self.at_least(2, 15)

    @property
    def batch_size(self) -> bool:
        return self.at_least(2, 16)

    @property
    def prune(self) -> bool:
        return self.at_least(2, 19)

    @property
    def rrf(self) -> bool:
        """``score-ranker-processor`` with reciprocal rank fusion (2.19)."""
        return self.at_least(2, 19)

    @property
    def hybrid(self) -> bool:
        """``hybrid`` query + ``normalization-processor`` (2.10)."""
        return self.at_least(2, 10)

    @property
    def skip_existing(self) -> bool:
        return self.at_least(3, 0)

    @property
    def analyzer(self) -> bool:
        return self.at_least(3, 1)

    @property
    def token_id(self) -> bool:
        return self.at_least(3, 2)

    @property
    def sparse_vector(self) -> bool:
        """``sparse_vector`` field, SEISMIC, ``method_parameters``, ``index.sparse`` (3.3)."""
        return self.at_least(3, 3)

    def has_plugin(self, name: str) -> bool | None:
        """True/False when plugins were detected, None when unknown."""
        if self.plugins is None:
            return None
        return name in self.plugins

    def to_dict(self) -> dict[str, Any]:
        names = ["sparse_models", "query_tokens", "two_phase", "batch_size", "prune", "rrf", "hybrid",
                 "skip_existing", "analyzer", "token_id", "sparse_vector"]
        return {"version": self.version_string,
                "plugins": sorted(self.plugins) if self.plugins is not None else None,
                **{n: getattr(self, n) for n in names}}


def make_client(url: str, *, user: str | None = None, password: str | None = None,
                ca_certs: str | None = None, insecure: bool = False, aws_region: str | None = None,
                aws_service: AwsService = "es", request_timeout: float = 60.0, max_retries: int = 3):
    """Build an ``opensearchpy.OpenSearch`` client.

    TLS certificates are verified unless ``insecure``; ``ca_certs`` names a CA bundle. With
    ``aws_region`` requests are SigV4-signed (``RequestsAWSV4SignerAuth``; credentials from the
    standard boto3 chain) for Amazon OpenSearch Service (``es``) or Serverless (``aoss``).
    Transport-level retries cover 502/503/504 and connection errors; 429 is retried with backoff
    (:func:`retry_429`) by the callers that know a request is safe to repeat: searches, index and
    pipeline creation, the ML Commons calls (bulk requests retry per document, ``bulk.py``).
    """
    from opensearchpy import OpenSearch, RequestsHttpConnection

    require_client_version()
    _quiet_transport_logging()
    parsed = urlparse(url or "")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ClusterConnectionError(f"--url must look like http(s)://host:port, got {url!r}")
    if aws_service not in ("es", "aoss"):
        raise ClusterConnectionError(f"aws_service must be 'es' or 'aoss', got {aws_service!r}")
    if (user is None) != (password is None):
        raise ClusterConnectionError("give both --user and --password (or OPENSEARCH_USER/OPENSEARCH_PASSWORD), or neither")
    if aws_region and user:
        raise ClusterConnectionError("use either basic auth (--user/--password) or AWS SigV4 (--aws-region), not both")
    if insecure and ca_certs:
        raise ClusterConnectionError("--insecure and --ca-certs contradict each other: pick one")
    use_ssl = parsed.scheme == "https"
    kwargs: dict[str, Any] = {
        "hosts": [url],
        "use_ssl": use_ssl,
        "verify_certs": use_ssl and not insecure,
        "ssl_show_warn": not insecure,
        "timeout": request_timeout,
        "max_retries": max_retries,
        "retry_on_timeout": False,
    }
    if ca_certs:
        kwargs["ca_certs"] = ca_certs
    if insecure:
        kwargs["ssl_assert_hostname"] = False
    if user is not None:
        kwargs["http_auth"] = (user, password)
    if aws_region:
        try:
            import boto3
            from opensearchpy import RequestsAWSV4SignerAuth
        except ImportError as err:  # pragma: no cover - extra not installed
            raise ClusterConnectionError("AWS SigV4 needs boto3: pip install 'opensearch-lsr[aws]'") from err
        credentials = boto3.Session().get_credentials()
        if credentials is None:
            raise ClusterConnectionError("--aws-region was given but no AWS credentials were found "
                                   "(environment, ~/.aws, or instance role)")
        kwargs["http_auth"] = RequestsAWSV4SignerAuth(credentials, aws_region, aws_service)
        kwargs["connection_class"] = RequestsHttpConnection
    return OpenSearch(**kwargs)


def client_from_options(**kw: Any):
    """Client from the keyword arguments :func:`connection_options` added to a command.

    Keys other than :data:`CONNECTION_OPTION_NAMES` are ignored, so a command can pass all of its
    parameters: ``client_from_options(**params)``.
    """
    if not kw.get("url"):
        raise ClusterConnectionError("no cluster URL: pass --url or set OPENSEARCH_URL")
    opts = {k: kw[k] for k in CONNECTION_OPTION_NAMES if k in kw and kw[k] is not None}
    opts["insecure"] = bool(opts.get("insecure", False))
    return make_client(opts.pop("url"), **opts)


def connection_options(func: Callable) -> Callable:
    """Click decorator adding the shared connection options (url, auth, TLS, SigV4, timeouts).

    The command receives them as keyword arguments named as in :data:`CONNECTION_OPTION_NAMES`;
    pass them on with ``client_from_options(**kwargs)``.
    """
    import click

    options = [
        click.option("--url", envvar="OPENSEARCH_URL", show_envvar=True,
                     help="Cluster URL, e.g. https://localhost:9200."),
        click.option("--user", envvar="OPENSEARCH_USER", show_envvar=True, default=None,
                     help="Basic-auth user name."),
        click.option("--password", envvar="OPENSEARCH_PASSWORD", show_envvar=True, default=None,
                     help="Basic-auth password (prefer the environment variable)."),
        click.option("--ca-certs", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="CA bundle used to verify the cluster's TLS certificate."),
        click.option("--insecure", is_flag=True, default=False,
                     help="Do not verify TLS certificates (development clusters only)."),
        click.option("--aws-region", envvar="AWS_REGION", default=None,
                     help="Sign requests with AWS SigV4 for this region (Amazon OpenSearch Service)."),
        click.option("--aws-service", type=click.Choice(["es", "aoss"]), default="es", show_default=True,
                     help="SigV4 service name: es (managed domains) or aoss (Serverless)."),
        click.option("--request-timeout", type=float, default=60.0, show_default=True,
                     help="Per-request timeout in seconds."),
        click.option("--max-retries", type=int, default=3, show_default=True,
                     help="Retries on connection errors and 502/503/504."),
    ]

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def detect_features(client, *, detect_plugins: bool = True) -> ClusterFeatures:
    """Read the cluster version (``GET /``) and, if allowed, its plugins (``GET _cat/plugins``).

    Raises:
        ClusterConnectionError: the cluster cannot be reached, is not OpenSearch, or is older than 2.11
            (no sparse models).
    """
    from opensearchpy import exceptions as osx

    try:
        info = client.info()
    except osx.ConnectionError as err:
        raise ClusterConnectionError(f"cannot reach the cluster at {_host_of(client)}: {_connection_reason(err)}") from err
    except osx.AuthenticationException as err:
        raise ClusterConnectionError("the cluster refused the credentials (HTTP 401)") from err
    except osx.AuthorizationException as err:
        raise ClusterConnectionError("the user may not read cluster info (HTTP 403)") from err
    except osx.TransportError as err:
        raise ClusterConnectionError(f"GET / failed (HTTP {err.status_code}): {err.error}") from err
    check_distribution(info)
    version = info.get("version", {})
    try:
        ver = parse_version(version.get("number", ""))
    except ValueError as err:
        raise ClusterConnectionError(f"cannot read the cluster version from GET /: {version!r}") from err
    plugins: set[str] | None = None
    if detect_plugins:
        try:
            rows = client.cat.plugins(format="json")
            plugins = {row.get("component") for row in rows if row.get("component")}
        except osx.TransportError as err:  # e.g. no permission to _cat: stay "unknown"
            logger.info("could not list plugins (%s); plugin-dependent choices fall back", err)
    features = ClusterFeatures(version=ver, plugins=frozenset(plugins) if plugins is not None else None)
    if not features.sparse_models:
        raise ClusterConnectionError(f"OpenSearch {features.version_string} has no sparse models; 2.11 or newer is needed")
    return features


def check_distribution(info: Any) -> None:
    """Refuse anything but OpenSearch from its ``GET /`` answer.

    OpenSearch always writes ``version.distribution = "opensearch"`` and the tagline "The OpenSearch
    Project: ..." (OpenSearch ``server/.../action/main/MainResponse.java`` ``toXContent``, also with
    ``compatibility.override_main_response_version``, which only changes ``number`` to 7.10.2).
    Elasticsearch has no ``distribution``; it writes ``build_flavor`` (7.x) and the tagline "You Know,
    for Search". So a missing distribution is never taken for OpenSearch.

    Raises:
        ClusterConnectionError: Elasticsearch or an unknown product.
    """
    version = info.get("version") if isinstance(info, dict) else None
    if not isinstance(version, dict):
        raise ClusterConnectionError(f"GET / did not answer like OpenSearch (no version object): {str(info)[:120]!r}")
    distribution = version.get("distribution")
    if distribution == "opensearch":
        return
    if distribution is None and (info.get("tagline") == _ES_TAGLINE or "build_flavor" in version):
        raise ClusterConnectionError(
            f"this is an Elasticsearch {version.get('number', '?')} cluster, not OpenSearch: use the Elasticsearch "
            f"commands (opensearch_lsr.elasticsearch) or point --url at an OpenSearch cluster")
    raise ClusterConnectionError(f"this is not an OpenSearch cluster (version.distribution is {distribution!r})")


def _host_of(client) -> str:
    try:
        return str(client.transport.connection_pool.connections[0].host)
    except (AttributeError, IndexError):  # pragma: no cover
        return "the given URL"


def _connection_reason(err: Exception) -> str:
    """The innermost cause of an opensearch-py ConnectionError in a few words (no repr chains)."""
    cause: BaseException | None = getattr(err, "info", None) if isinstance(getattr(err, "info", None), BaseException) else err
    seen = set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        nxt = cause.__cause__ or cause.__context__ or getattr(cause, "reason", None)
        if not isinstance(nxt, BaseException):
            break
        cause = nxt
    text = str(cause) if cause is not None else str(err)
    for pattern, short in ((r"Connection refused", "connection refused"),
                           (r"Name or service not known|nodename nor servname|getaddrinfo failed", "unknown host name"),
                           (r"timed out", "connection timed out"),
                           (r"CERTIFICATE_VERIFY_FAILED|certificate verify failed", "TLS certificate not trusted "
                            "(pass --ca-certs, or --insecure on a development cluster)"),
                           (r"WRONG_VERSION_NUMBER|wrong version number", "TLS handshake failed (is the cluster "
                            "plain http?)")):
        if re.search(pattern, text):
            return short
    return text.splitlines()[0][:200] if text else type(err).__name__


def error_reason(err: Exception) -> str:
    """The server's error reason from an opensearch-py TransportError (else ``str(err)``)."""
    info = getattr(err, "info", None)
    if isinstance(info, dict):
        error = info.get("error", info)
        if isinstance(error, dict):
            root = error.get("root_cause") or []
            if root and isinstance(root[0], dict) and root[0].get("reason"):
                return str(root[0]["reason"])
            if error.get("reason"):
                return str(error["reason"])
        if isinstance(error, str):
            return error
    error = getattr(err, "error", None)
    return str(error if error and error != "N/A" else err)


def error_status(err: Exception) -> int | None:
    status = getattr(err, "status_code", None)
    return status if isinstance(status, int) else None


def retry_429(call: Callable[[], Any], *, what: str, retries: int = 5, backoff_s: float = 1.0) -> Any:
    """Run ``call``; on HTTP 429 (rejected, nothing done) wait and retry with exponential backoff.

    opensearch-py's transport retries 502/503/504 immediately but never 429: a thread pool that
    is full or a circuit breaker (a small node's heap, ``[parent] Data too large``) turned the
    request away before running it, and a moment later the same request usually passes (OpenSearch
    3.6.0 ``libs/core/.../common/breaker/CircuitBreakingException.java`` and
    ``OpenSearchRejectedExecutionException`` answer ``RestStatus.TOO_MANY_REQUESTS``). The loop
    is tenacity's (``retries`` extra attempts, waits ``backoff_s * 2**n`` capped at 30 s), so one
    request waits at most about ``retries * 30`` seconds in total.
    """
    from opensearchpy.exceptions import TransportError
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    def is_429(err: BaseException) -> bool:
        return isinstance(err, TransportError) and error_status(err) == 429

    def log(state) -> None:
        err = state.outcome.exception()
        logger.warning("%s: HTTP 429 (%s); retry %d of %d", what, error_reason(err), state.attempt_number, retries)

    retrying = Retrying(retry=retry_if_exception(is_429), stop=stop_after_attempt(retries + 1),
                        wait=wait_exponential(multiplier=backoff_s, min=backoff_s, max=30.0),
                        before_sleep=log, reraise=True)
    return retrying(call)
