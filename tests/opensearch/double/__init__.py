"""HTTP test double of OpenSearch + ML Commons + neural-search (see ``server.py``)."""
from .server import BREAKER_OPEN, DISK_BREAKER_OPEN, LOCAL_FILE_GATE, NO_ELIGIBLE_NODE, Fault, OpenSearchDouble
from .spec import ALLOWED_DEVIATIONS, SpecValidator
from .store import ApiError, trunc9

__all__ = ["OpenSearchDouble", "Fault", "SpecValidator", "ALLOWED_DEVIATIONS", "ApiError", "trunc9",
           "LOCAL_FILE_GATE", "BREAKER_OPEN", "DISK_BREAKER_OPEN", "NO_ELIGIBLE_NODE"]
