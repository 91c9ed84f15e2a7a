"""`lsr-os index --backend opensearch` against a real cluster: documents per second by ``--bulk-concurrency``.

The job runs unchanged with an encoder whose vectors are ready (``index_host_path.ReadyVectors``: one real
SPLADE-tiny vector per passage, encoded before the clock), so what is timed is reading, building the
documents and the ``_bulk`` requests. Each concurrency writes a fresh index (``mappings/rank_features.json``
through the engine's ``create_index``); the baseline, one request at a time, is measured in the same run,
and every run must leave exactly the corpus' documents in its index.

    python tests/opensearch_real/cluster.py start          # a real node from Maven Central (prints the URL)
    OPENSEARCH_URL=http://127.0.0.1:PORT python benchmarks/bulk_concurrency.py --repeat 4 --concurrency 1 2 4 \
        --md benchmarks/results/bulk_concurrency.md
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, markdown_table, run_info, write_results
from index_host_path import ReadyVectors, passage_texts, repeated_corpus

sys.path.insert(0, str(ROOT))

from opensearch_lsr.encoding.encoder import SparseDocumentEncoder  # noqa: E402
from opensearch_lsr.encoding.job import IndexJob, IndexJobConfig  # noqa: E402
from opensearch_lsr.resources import splade_tiny_path  # noqa: E402

__all__ = ["main"]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("OPENSEARCH_URL"), help="Cluster URL [default: $OPENSEARCH_URL].")
    p.add_argument("--corpus", default=None, help="JSONL corpus [default: the shared msmarco-ko corpus].")
    p.add_argument("--model", default=None, help="Encoder dir whose vectors are used [default: SPLADE-tiny].")
    p.add_argument("--repeat", type=int, default=4, help="Copies of the corpus (ids made unique).")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4],
                   help="--bulk-concurrency values; 1 (one request at a time) is the baseline.")
    p.add_argument("--chunk-docs", type=int, default=256, help="--chunk-docs (documents per _bulk request).")
    p.add_argument("--rounds", type=int, default=2, help="Runs per value (interleaved); the best is reported.")
    p.add_argument("--md", default=None, help="Markdown results (a JSON beside it).")
    args = p.parse_args(argv)
    if not args.url:
        raise SystemExit("no cluster: pass --url or set OPENSEARCH_URL (python tests/opensearch_real/cluster.py start)")
    from opensearch_lsr.engines import make_engine
    from opensearch_lsr.opensearch.client import detect_features, make_client

    client = make_client(args.url)
    version = ".".join(map(str, detect_features(client, detect_plugins=False).version))
    engine = make_engine("opensearch", client)
    rows, big = repeated_corpus(args.corpus, args.repeat, Path(tempfile.mkdtemp(prefix="bulk-concurrency-")))
    work = big.parent
    model = str(args.model or splade_tiny_path())
    encoder = SparseDocumentEncoder(model, device="cpu")
    t0 = time.perf_counter()
    ready = ReadyVectors(encoder, passage_texts(rows))
    prepare_s = time.perf_counter() - t0
    values = list(dict.fromkeys([1, *args.concurrency]))
    results: dict[int, dict] = {}
    for round_ in range(args.rounds):
        for width in values:
            index = f"bulk-concurrency-{width}"
            client.indices.delete(index=index, ignore_unavailable=True)
            engine.create_index(index)
            cfg = IndexJobConfig(corpus=str(big), model=model, backend="opensearch", index=index,
                                 work_dir=str(work / f"job-{width}"), chunk_docs=args.chunk_docs,
                                 bulk_concurrency=width)
            run = IndexJob(cfg, encoder=ready, client_factory=lambda: make_client(args.url),
                           progress=False).run(restart=True)["this_run"]
            client.indices.refresh(index=index)
            run["count"] = int(client.count(index=index)["count"])
            run["round"] = round_
            client.indices.delete(index=index)
            if width not in results or run["docs_per_s"] > results[width]["docs_per_s"]:
                results[width] = run
            print(f"round {round_} --bulk-concurrency {width}: {run['docs_per_s']:.0f} docs/s", flush=True)
    documents = len(rows) * args.repeat
    base = results[1]
    for r in results.values():
        r["vs_one_at_a_time"] = round(r["docs_per_s"] / base["docs_per_s"], 2)
    payload = {"documents": documents, "opensearch": version, "chunk_docs": args.chunk_docs, "rounds": args.rounds,
               "prepare_s": round(prepare_s, 1), "runs": {str(k): v for k, v in results.items()}}
    table = markdown_table(["--bulk-concurrency", "docs/s", "x one at a time", "writer-thread wait s", "elapsed s",
                            "docs in the index"],
                           [[k, v["docs_per_s"], v["vs_one_at_a_time"], v["write_s"], v["elapsed_s"], v["count"]]
                            for k, v in results.items()], floats=".2f")
    md = (f"# `lsr-os index --backend opensearch` by `--bulk-concurrency` (an encoder that costs nothing)\n\n"
          f"OpenSearch {version} at {args.url}; {documents:,} passages (the corpus x{args.repeat}), "
          f"`--chunk-docs {args.chunk_docs}` (one `_bulk` request per chunk), vectors ready before the clock; "
          f"best of {args.rounds} interleaved rounds.\n\n{table}\n")
    print(md)
    if args.md:
        write_results(Path(args.md).with_suffix(""), payload, md, run_info())
    if any(r["count"] != documents for r in results.values()):
        raise SystemExit("an index does not hold exactly the corpus' documents")
    return payload


if __name__ == "__main__":
    main()
