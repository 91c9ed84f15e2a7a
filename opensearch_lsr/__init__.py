"""opensearch-lsr: target-language learned sparse encoders for OpenSearch."""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
