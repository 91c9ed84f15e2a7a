"""Check an exported ``text_expansion`` model the way Elasticsearch would run it.

Feeds the artifact through :class:`~opensearch_lsr.elasticsearch.runtime.TextExpansionRuntime`
(Elasticsearch's tokenizer re-implemented from its Java source, ml-cpp's four positional
arguments, its operation allow-list, ``TextExpansionProcessor``'s key rule) and compares with the
toolkit's own encoder (:class:`~opensearch_lsr.encoding.encoder.SparseDocumentEncoder`, the one
``lsr-os index`` uses for precomputed vectors):

* the graph uses only operations ml-cpp allows;
* Elasticsearch's token ids equal ours on every text (Korean included);
* the weights equal ours within ``atol`` and the key sets agree (ignoring weights below ``atol``);
* padding does not change a document's vector (Elasticsearch pads a request to its longest text).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .keys import es_keys
from .runtime import TextExpansionRuntime
from .tokenizer import compare_tokenizers

__all__ = ["verify_export"]


def verify_export(export_dir: str | os.PathLike, model_dir: str | os.PathLike, texts: list[str],
                  atol: float = 1e-4) -> dict[str, Any]:
    """Run the conformance check; returns a report with ``passed``.

    Args:
        export_dir: the ``elasticsearch/`` folder of a bundle.
        model_dir: the ``SparseEncoder`` the artifact was exported from.
        texts: texts to run (non-empty).
        atol: weight tolerance.
    """
    from ..encoding.encoder import SparseDocumentEncoder

    if not texts:
        raise ValueError("verify_export needs at least one text")
    runtime = TextExpansionRuntime.from_export(export_dir)
    bad_ops = runtime.check_graph()
    encoder = SparseDocumentEncoder(str(model_dir), device="cpu", precision="fp32",
                                    max_length=runtime.tokenizer.max_sequence_length, batch_size=8)
    tok_report = compare_tokenizers(runtime.tokenizer, encoder.tokenizer.backend_tokenizer, texts)
    expected = encoder.encode_dense(texts).numpy()
    keys = es_keys(runtime.vocabulary)
    got = runtime.infer(texts)
    max_diff = 0.0
    mismatches: list[dict[str, Any]] = []
    for text, row, result in zip(texts, expected, got):
        want = {keys[i]: float(row[i]) for i in np.flatnonzero(row > 0.0)}
        for key in set(want) | set(result):
            diff = abs(want.get(key, 0.0) - result.get(key, 0.0))
            max_diff = max(max_diff, diff)
            if diff > atol:
                mismatches.append({"text": text[:60], "key": key, "expected": want.get(key), "got": result.get(key)})
    batch = runtime.raw_output(texts[:2]) if len(texts) > 1 else None
    padding_diff = 0.0
    if batch is not None:
        alone = np.stack([runtime.raw_output([t])[0] for t in texts[:2]])
        padding_diff = float(np.abs(batch - alone).max())
    passed = not bad_ops and tok_report.all_identical and not mismatches and padding_diff <= atol
    return {
        "passed": bool(passed),
        "texts": len(texts),
        "disallowed_operations": bad_ops,
        "tokenizer": tok_report.to_dict(),
        "max_abs_weight_diff": max_diff,
        "key_mismatches": len(mismatches),
        "mismatch_examples": mismatches[:5],
        "padding_max_diff": padding_diff,
        "export_dir": str(Path(export_dir)),
    }
