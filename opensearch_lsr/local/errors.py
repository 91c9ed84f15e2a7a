"""The local backend's error: OpenSearch's REST error triple (status, type, reason)."""
from __future__ import annotations

from ..errors import LsrError

__all__ = ["LocalIndexError"]


class LocalIndexError(LsrError, ValueError):
    """An OpenSearch-like error: ``status``, ``error_type`` and ``reason`` as the REST API reports them."""

    def __init__(self, reason: str, error_type: str = "illegal_argument_exception", status: int = 400):
        super().__init__(reason)
        self.reason = reason
        self.error_type = error_type
        self.status = status

    def to_response(self) -> dict:
        """The REST error body: ``{"error": {"root_cause": [...], "type", "reason"}, "status"}``."""
        cause = {"type": self.error_type, "reason": self.reason}
        return {"error": {"root_cause": [cause], **cause}, "status": self.status}
