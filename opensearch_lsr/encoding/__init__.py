"""Batch encoding jobs: corpus readers, the OpenSearch-exact sparse document encoder, pruning,
document building (512-token policy) and the resumable ``lsr-os index`` job."""
from __future__ import annotations

from .documents import DocumentBuilder, doc_id_for, nested_mapping, split_passages
from .encoder import SparseDocumentEncoder, SparseVector
from .job import IndexJobConfig, IndexJobError, run_index_job
from .parallel import DevicePool, resolve_devices
from .pruning import PruneConfig, parse_prune, prune_arrays, prune_map
from .readers import BadRecord, CorpusRecord, read_corpus

__all__ = [
    "SparseDocumentEncoder",
    "SparseVector",
    "PruneConfig",
    "parse_prune",
    "prune_arrays",
    "prune_map",
    "DocumentBuilder",
    "doc_id_for",
    "nested_mapping",
    "split_passages",
    "CorpusRecord",
    "BadRecord",
    "read_corpus",
    "IndexJobConfig",
    "IndexJobError",
    "run_index_job",
    "DevicePool",
    "resolve_devices",
]
