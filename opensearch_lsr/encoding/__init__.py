"""Batch encoding: corpus readers, the OpenSearch-exact sparse document encoder, document building
(512-token policy) and the resumable ``lsr-os index`` job. Import from the modules themselves."""
from __future__ import annotations
