"""HTTP test double of Elasticsearch (see ``server.py``); loaded as ``es_double`` by ``tests/elasticsearch/conftest.py``."""
from .server import ElasticsearchDouble, EsApiError, trunc9
from .spec import ALLOWED_DEVIATIONS, EsSpecValidator

__all__ = ["ElasticsearchDouble", "EsApiError", "trunc9", "EsSpecValidator", "ALLOWED_DEVIATIONS"]
