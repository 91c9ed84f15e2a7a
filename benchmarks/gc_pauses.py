"""The cycle collector's pauses inside packed encodes, with the heap frozen (the default) and without, in one run.

``PackedRunner`` keeps the objects alive when an encode starts from Python's cycle collector until it ends
(``opensearch_lsr/encoding/gc_freeze.py``): a full collection otherwise walks every object torch and transformers
left, while the launching thread (and the device behind it) waits. Here the host path runs unchanged
(tokenize-once, windows, token-budget batches, splitting results into vectors, restoring order) and the device's
part is replaced by ready results (about 150 ids per document), so the pauses are not hidden behind model
compute; ``--real`` runs the model itself instead (on ``--device``). The two settings alternate pass by pass on the
same texts, and every pass's vectors are kept, as a caller that holds its results does (``gpu_encode.py`` holds
several encodes' worth), so the heap grows as it would. Per setting: collections per generation, the total and
longest pause, docs/s.

    python benchmarks/gc_pauses.py [--passes 4] [--repeat 4] [--survivors N] [--real] [--device cpu]
                                   [--out F.json]
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import harness  # noqa: E402 - benchmarks/harness.py: machine, commit, results files
from gpu_encode import collector_pauses, load_corpus  # noqa: E402

from opensearch_lsr.encoding.gc_freeze import frozen_heap  # noqa: E402

IDS_PER_DOC = 150


def ready_results(vocab: int, max_docs: int = 8192, seed: int = 0):
    """A ``launch`` that hands back ready sparse results: ``IDS_PER_DOC`` ascending ids per document."""
    from opensearch_lsr.encoding.device_sparse import PendingSparse

    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(np.sort(rng.integers(0, vocab, (max_docs, IDS_PER_DOC)), axis=1).astype(np.int32))
    weights = torch.rand(max_docs, IDS_PER_DOC)

    def launch(batch):
        n = len(batch.lengths)
        return PendingSparse(ids[:n].reshape(-1), weights[:n].reshape(-1), torch.full((n,), IDS_PER_DOC),
                             torch.tensor(0))
    return launch


def measure(model: str, texts: list[str], device: str, passes: int, real: bool, survivors: int = 0) -> dict:
    from opensearch_lsr.encoding.encoder import SparseDocumentEncoder

    enc = SparseDocumentEncoder(model, device=device, batching="packed", compile=False)
    if enc.runner is None:
        raise SystemExit(f"{model}: no packed layout for this model")
    if not real:
        enc.runner.launch = ready_results(enc.vocab_size)
    enc.encode(texts[:2048])  # warm-up: tokenizer pool, first allocations
    kept, rows = [], {"frozen": [], "not frozen": []}
    for i in range(2 * passes):
        setting = "frozen" if i % 2 == 0 else "not frozen"
        enc.runner.freeze_heap = setting == "frozen"
        kept.append([[k] for k in range(survivors)])  # what loading or compiling leaves before an encode
        with collector_pauses() as pauses:
            t0 = time.perf_counter()
            kept.append(enc.encode(texts))
            seconds = time.perf_counter() - t0
        rows[setting].append({"docs_per_s": round(len(texts) / seconds, 1), **pauses,
                              "tracked_objects_after": len(gc.get_objects())})
    summary = {}
    for setting, runs in rows.items():
        with frozen_heap() if setting == "frozen" else nullcontext():
            full = full_collection(3)
        summary[setting] = {"passes": len(runs),
                            "full_collections": sum(r["collections"][2] for r in runs),
                            "pause_total_ms": round(sum(r["total_ms"] for r in runs), 1),
                            "pause_max_ms": max(r["max_ms"] for r in runs),
                            "docs_per_s_median": float(np.median([r["docs_per_s"] for r in runs])),
                            "full_collection_now": full}
    return {"docs_per_pass": len(texts), "real_model": real, "survivors_per_pass": survivors, "summary": summary,
            "passes": rows}


def full_collection(repeat: int) -> dict:
    """What a full collection costs now (median of ``repeat``) and how many tracked objects it walks."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - t0)
    return {"ms": round(1e3 * float(np.median(times)), 1), "objects_walked": len(gc.get_objects())}


def markdown(result: dict) -> str:
    rows = [[setting, s["passes"], s["full_collections"], s["pause_total_ms"], s["pause_max_ms"],
             s["docs_per_s_median"], s["full_collection_now"]["ms"], s["full_collection_now"]["objects_walked"]]
            for setting, s in result["summary"].items()]
    what = "the model on " + result["device"] if result["real_model"] else "ready results in place of the device"
    if result["survivors_per_pass"]:
        what += f", {result['survivors_per_pass']:,} new objects kept before each pass"
    return (f"# Collector pauses inside packed encodes: {result['model']}, {result['docs_per_pass']:,} passages "
            f"per pass, {what}\n\n"
            + harness.markdown_table(["heap while encoding", "passes", "full collections", "pauses in all, ms",
                                      "longest pause, ms", "docs/s (median)",
                                      "a full collection after the passes, ms", "objects it walks"], rows, ".1f")
            + "\nA full collection is due only now and then (when the objects that survived younger collections "
              "reach a quarter of the old generation), so passes may meet none; the last two columns give what one "
              "costs when it comes, with the heap every pass left.\n")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="splade-tiny", help="splade-tiny (the installed one) or a model directory.")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="The shared data folder.")
    p.add_argument("--repeat", type=int, default=4, help="Copies of the Korean corpus per pass.")
    p.add_argument("--limit", type=int, default=None, help="Passages of the corpus [default: all].")
    p.add_argument("--passes", type=int, default=4, help="Passes per setting (they alternate).")
    p.add_argument("--real", action="store_true", help="Run the model instead of ready results.")
    p.add_argument("--device", default="cpu", help="cpu or cuda (with --real).")
    p.add_argument("--survivors", type=int, default=0,
                   help="Objects created and kept before each pass, as loading a model or compiling leaves them: "
                        "they make a full collection due during the pass.")
    p.add_argument("--out", default=None, help="JSON results file (the markdown table goes next to it as .md).")
    args = p.parse_args(argv)
    from opensearch_lsr.resources import splade_tiny_path

    model = str(splade_tiny_path()) if args.model == "splade-tiny" else args.model
    _, texts = load_corpus(Path(args.data) / "msmarco-ko" / "corpus.jsonl", args.repeat, args.limit)
    result = {"model": args.model, "device": args.device,
              **measure(model, texts, args.device, args.passes, args.real, args.survivors)}
    return harness.publish(result, markdown(result), args.out)


if __name__ == "__main__":
    main()
