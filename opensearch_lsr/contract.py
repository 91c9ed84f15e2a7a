"""The engine contract in code: the numeric rules every engine, the encoder, the export and the
conformance check share (opensearch-contract.md; one place, imported everywhere, never restated).

Limits:
- :data:`MAX_LENGTH` 512: DJL (ML Commons 2.15+, DJL >= 0.28) truncates model inputs at 512 tokens,
  special tokens included, whatever tokenizer.json says (contract §2.1/§2.2).
- :data:`MAX_QUERY_WEIGHT` 64: neural-search rejects query token weights outside (0, 64]
  (``NeuralSparseQueryBuilder``; contract §4.2).
- :data:`FLOAT_MIN_NORMAL`: Lucene ``FeatureField`` rejects document values below Java
  ``Float.MIN_NORMAL`` (contract §6.1).
- 9-bit truncation: ``FeatureField`` stores ``intBitsToFloat((floatToIntBits(v) >>> 15) << 15)``
  (Lucene ``FeatureField.encodeFeatureValue``; contract §6.2), see :func:`truncate_feature_values`.
"""
from __future__ import annotations

import numpy as np

__all__ = ["MAX_LENGTH", "MAX_QUERY_WEIGHT", "FLOAT_MIN_NORMAL", "MAX_RESULT_WINDOW",
           "DEFAULT_TEXT_FIELD", "DEFAULT_VECTOR_FIELD", "truncate_feature_values", "truncate_feature_value"]

#: DJL's token cap for model inputs, special tokens included.
MAX_LENGTH = 512
#: Largest query token weight neural_sparse accepts (the range is (0, 64]).
MAX_QUERY_WEIGHT = 64.0
#: Java ``Float.MIN_NORMAL``: smallest document feature value ``rank_features`` accepts.
FLOAT_MIN_NORMAL = float(np.finfo(np.float32).tiny)
#: OpenSearch ``index.max_result_window`` default (from + size).
MAX_RESULT_WINDOW = 10_000

#: Field defaults of every index this toolkit creates, fills, searches and evaluates; the same
#: names as the templates in ``mappings/`` (the ``{{text_field}}`` / ``{{vector_field}}`` defaults in mappings/README.md).
DEFAULT_TEXT_FIELD = "text"
DEFAULT_VECTOR_FIELD = "sparse_embedding"


def truncate_feature_values(values: np.ndarray) -> np.ndarray:
    """Lucene ``FeatureField`` storage: ``intBitsToFloat((floatToIntBits(v) >>> 15) << 15)`` (contract §6.2).

    Keeps the top 9 significant bits of a positive float32 (relative error <= 2^-8, by truncation).
    """
    arr = np.ascontiguousarray(values, dtype=np.float32)
    bits = arr.view(np.uint32)
    return ((bits >> np.uint32(15)) << np.uint32(15)).view(np.float32)


def truncate_feature_value(value: float) -> float:
    """Scalar form of :func:`truncate_feature_values`."""
    return float(truncate_feature_values(np.array([value], dtype=np.float32))[0])
