"""The host side of ``lsr-os index --backend ndjson``: documents per second with an encoder that costs nothing.

On a GPU the encoder outpaces the job's host work (reading, the duplicate-id store, building documents,
writing NDJSON). This measures that ceiling on any machine: the job runs unchanged, with an encoder whose
vectors are ready (one real vector per passage, encoded once before the clock), so what is timed is the host
path alone. The baseline, no document workers, is measured in the same run; every variant must write the
same bytes.

``--fsync-ms`` emulates a slower disk: every ``os.fsync`` of the job (the NDJSON parts at each checkpoint, the
reports) takes that much longer; ``--checkpoint-intervals`` runs each row at each ``checkpoint_interval_s`` (0: a
checkpoint after every chunk; the baseline is the first value given).

    python benchmarks/index_host_path.py --repeat 4 --workers 0 2 --md runs/index_host_path.md
    python benchmarks/index_host_path.py --workers 0 --checkpoint-intervals 0 1 --fsync-ms 0 10 --md FILE
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness, also when loaded as a module

from harness import ROOT, markdown_table, run_info, write_results

sys.path.insert(0, str(ROOT))

from opensearch_lsr.encoding.encoder import SparseDocumentEncoder  # noqa: E402
from opensearch_lsr.encoding.job import IndexJob, IndexJobConfig  # noqa: E402
from opensearch_lsr.resources import shared_data_dir, splade_tiny_path  # noqa: E402

__all__ = ["ReadyVectors", "repeated_corpus", "passage_texts", "main"]


class ReadyVectors:
    """An encoder whose vectors were computed before the run: ``encode`` looks them up by text."""

    def __init__(self, encoder: SparseDocumentEncoder, texts: list[str]) -> None:
        self.keys, self.tokenizer, self.max_length = encoder.keys, encoder.tokenizer, encoder.max_length
        self.device, self.precision, self.batch_size, self.batching = "cpu", encoder.precision, 32, "padded"
        self.stats = encoder.stats
        unique = list(dict.fromkeys(texts))
        self.vectors = dict(zip(unique, encoder.encode(unique)))
        self.lengths = dict(zip(unique, encoder.count_tokens(unique)))

    def count_tokens(self, texts):
        return [self.lengths[t] for t in texts]

    def encode(self, texts):
        return [self.vectors[t] for t in texts]


def repeated_corpus(corpus: str | None, repeat: int, work: Path) -> tuple[list[dict], Path]:
    """The corpus' rows (default: the shared msmarco-ko corpus) and ``work/corpus.jsonl``: ``repeat`` copies of
    them with their ids made unique."""
    if corpus is None and shared_data_dir() is None:
        raise SystemExit("no shared data folder beside the repository: pass --corpus FILE.jsonl")
    source = Path(corpus) if corpus else shared_data_dir() / "msmarco-ko" / "corpus.jsonl"
    rows = [json.loads(line) for line in source.open(encoding="utf-8")]
    big = work / "corpus.jsonl"
    with big.open("w", encoding="utf-8") as fh:
        for k in range(repeat):
            for r in rows:
                fh.write(json.dumps({**r, "_id": f"{r['_id']}-r{k}"}, ensure_ascii=False) + "\n")
    return rows, big


def passage_texts(rows: list[dict]) -> list[str]:
    """Each row's text as the job reads it (title, a space, text)."""
    return [((r.get("title") or "").strip() + " " + r["text"].strip()).strip() for r in rows]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=None, help="JSONL corpus [default: the shared msmarco-ko corpus].")
    p.add_argument("--model", default=None, help="Encoder dir whose vectors are used [default: SPLADE-tiny].")
    p.add_argument("--repeat", type=int, default=4, help="Copies of the corpus (ids made unique).")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="--build-workers values; 0 is the baseline.")
    p.add_argument("--checkpoint-intervals", type=float, nargs="+", default=[IndexJobConfig.checkpoint_interval_s],
                   help="checkpoint_interval_s values (0: after every chunk); the first is the baseline's.")
    p.add_argument("--fsync-ms", type=float, nargs="+", default=[0.0],
                   help="Extra milliseconds per os.fsync (a slower disk), each value a set of rows.")
    p.add_argument("--runs", type=int, default=1, help="Runs of each row, one after the other (the median's is kept).")
    p.add_argument("--md", default=None, help="Markdown results (a JSON beside it).")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="index-host-"))
    rows, big = repeated_corpus(args.corpus, args.repeat, work)
    encoder = SparseDocumentEncoder(args.model or str(splade_tiny_path()), device="cpu")
    t0 = time.perf_counter()
    ready = ReadyVectors(encoder, passage_texts(rows))
    prepare_s = time.perf_counter() - t0
    results = {}
    for fsync_ms in args.fsync_ms:
        for interval in args.checkpoint_intervals:
            for workers in dict.fromkeys([0, *args.workers]):
                key = (fsync_ms, interval, workers)
                out = work / "out-{}-{}-{}".format(*key)
                cfg = IndexJobConfig(corpus=str(big), model=str(args.model or splade_tiny_path()), backend="ndjson",
                                     index=str(out), build_workers=workers, checkpoint_interval_s=interval)
                runs = []
                for _ in range(args.runs):
                    with _slower_fsync(fsync_ms):
                        runs.append(IndexJob(cfg, encoder=ready, progress=False).run(restart=True)["this_run"])
                run = sorted(runs, key=lambda r: r["docs_per_s"])[len(runs) // 2]
                run["runs_docs_per_s"] = [r["docs_per_s"] for r in runs]
                digest = hashlib.sha256()
                for part in sorted(out.glob("bulk-*.ndjson")):
                    digest.update(part.read_bytes().replace(f'"_index":"{out.name}"'.encode(), b'"_index":"out"'))
                results[key] = {**run, "sha256": digest.hexdigest()}
    for (fsync_ms, _, _), r in results.items():  # each disk's baseline: no workers, the first interval
        base = results[(fsync_ms, args.checkpoint_intervals[0], 0)]
        r["vs_no_workers"] = round(r["docs_per_s"] / base["docs_per_s"], 2)
        r["same_bytes_as_no_workers"] = r["sha256"] == base["sha256"]
    payload = {"documents": len(rows) * args.repeat, "prepare_s": round(prepare_s, 1),
               "runs": {"fsync+{}ms/interval={}/workers={}".format(*k): v for k, v in results.items()}}
    table = markdown_table(["fsync + ms", "checkpoint_interval_s", "--build-workers", "docs/s",
                            f"x no workers, interval {args.checkpoint_intervals[0]:g}", "build s", "write s",
                            "checkpoint s", "elapsed s", "same bytes", "runs"],
                           [[*k, v["docs_per_s"], v["vs_no_workers"], v["build_s"], v["write_s"], v["checkpoint_s"],
                             v["elapsed_s"], v["same_bytes_as_no_workers"], ", ".join(f"{d:.0f}" for d in
                                                                                      v["runs_docs_per_s"])]
                            for k, v in results.items()], floats=".2f")
    md = (f"# Host path of `lsr-os index --backend ndjson` (an encoder that costs nothing)\n\n"
          f"{payload['documents']:,} passages (the corpus x{args.repeat}), vectors ready before the clock; the "
          f"median of {args.runs} run(s) per row; "
          f"\"fsync + ms\": every fsync of the job made that much slower.\n\n{table}\n")
    print(md)
    if args.md:
        write_results(Path(args.md).with_suffix(""), payload, md, run_info())
    if not all(r["same_bytes_as_no_workers"] for r in results.values()):
        raise SystemExit("the variants wrote different NDJSON")
    return payload


@contextmanager
def _slower_fsync(extra_ms: float):
    """``os.fsync`` takes ``extra_ms`` longer (sleeping, the interpreter lock released, as a disk's wait is)."""
    real = os.fsync

    def fsync(fd: int) -> None:
        real(fd)
        time.sleep(extra_ms / 1e3)

    os.fsync = fsync if extra_ms > 0 else real
    try:
        yield
    finally:
        os.fsync = real


if __name__ == "__main__":
    main()
