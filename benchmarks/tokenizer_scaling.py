"""How the Rust tokenizer's rate scales with its threads, in process and through ``TokenizerProcess``.

The packed GPU encoder tokenizes in a spawned process (``encoding/tokenizer_process.py``); on an H200 with
16 cores SPLADE-tiny stayed near 9-11k docs/s however that process was given threads, when one thread does
about 4.4k here. This probe says where the rate stops: for each thread count a fresh interpreter (the Rust
pool is sized once per process) times ``OnceTokenizer`` on the corpus, and then the same count through a
``TokenizerProcess``; the machine's usable cores (affinity, the cgroup CPU quota) are printed beside it. The
baseline is one thread, measured in the same run.

    python benchmarks/tokenizer_scaling.py [--threads 1 2 4 8 16] [--processes 2 4] [--limit 4000] [--md FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import harness  # noqa: E402 - benchmarks/harness.py: machine, commit, results files

_CHILD = """
import json, os, sys, time
sys.path.insert(0, {root!r})
from opensearch_lsr.encoding.token_ids import OnceTokenizer
from opensearch_lsr.encoding.tokenizer_process import TokenizerProcess
texts = [json.loads(line)["text"] for line in open({corpus!r}, encoding="utf-8")][:{limit}]
once = OnceTokenizer({model!r}, {max_length}, word_cache=0)  # the Rust tokenizer alone: repeats would hit the cache
def best(fn):
    fn(texts[:256])
    times = []
    for _ in range({repeat}):
        t0 = time.perf_counter(); out = fn(texts); times.append(time.perf_counter() - t0)
    return len(texts) / min(times), int(out.lengths.sum())
rate, tokens = best(once) if {mode!r} == "in_process" else (None, None)
if {mode!r} == "process":
    proc = TokenizerProcess(once, threads={threads}, processes={processes})
    rate, tokens = best(proc)
    proc.close()
print(json.dumps({{"docs_per_s": rate, "tokens": tokens}}))
"""


def usable_cores() -> dict:
    """Cores this process may run on: affinity, and the cgroup v2 quota (``cpu.max``) when one is set."""
    out = {"os_cpu_count": os.cpu_count()}
    if hasattr(os, "sched_getaffinity"):
        out["affinity"] = len(os.sched_getaffinity(0))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        out["cgroup_cpu_max"] = None if quota == "max" else round(int(quota) / int(period), 2)
    except (OSError, ValueError):
        out["cgroup_cpu_max"] = "unreadable"
    return out


def run(model: str, corpus: Path, limit: int, threads: int, mode: str, repeat: int, max_length: int,
        processes: int = 1) -> dict:
    code = _CHILD.format(root=str(ROOT), corpus=str(corpus), limit=limit, model=model, max_length=max_length,
                         repeat=repeat, mode=mode, threads=threads, processes=processes)
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    from opensearch_lsr.resources import shared_data_dir, splade_tiny_path

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="Tokenizer / model dir [default: SPLADE-tiny].")
    p.add_argument("--corpus", default=None, help="JSONL corpus [default: the shared msmarco-ko corpus].")
    p.add_argument("--limit", type=int, default=4000, help="Passages tokenized per timing.")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--processes", type=int, nargs="*", default=[],
                   help="Also spread each thread count over this many TokenizerProcess processes.")
    p.add_argument("--repeat", type=int, default=3, help="Timings per setting (the best is kept).")
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--out", default=None, help="JSON results file.")
    p.add_argument("--md", default=None, help="Markdown table file.")
    args = p.parse_args(argv)
    model = args.model or str(splade_tiny_path())
    corpus = Path(args.corpus) if args.corpus else shared_data_dir() / "msmarco-ko" / "corpus.jsonl"
    cores = usable_cores()
    rows = []
    for threads in args.threads:
        row = {"threads": threads}
        for mode in ("in_process", "process"):  # one process
            got = run(model, corpus, args.limit, threads, mode, args.repeat, args.max_length)
            row[mode], row[f"{mode}_tokens"] = got["docs_per_s"], got["tokens"]
        for procs in (n for n in args.processes if 1 < n <= threads):
            got = run(model, corpus, args.limit, threads, "process", args.repeat, args.max_length, procs)
            row[f"processes_{procs}"], row[f"processes_{procs}_tokens"] = got["docs_per_s"], got["tokens"]
        if any(row[k] != row["in_process_tokens"] for k in row if k.endswith("_tokens")):
            raise SystemExit(f"the tokenizer process gave {row['process_tokens']} tokens, in process "
                             f"{row['in_process_tokens']}: not the same tokenization")
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]["in_process"]
    for row in rows:
        row["in_process_x"] = round(row["in_process"] / base, 2)
        row["process_x"] = round(row["process"] / base, 2)
        for procs in args.processes:
            if f"processes_{procs}" in row:
                row[f"processes_{procs}_x"] = round(row[f"processes_{procs}"] / base, 2)
    result = {"run": harness.run_info(), "cores": cores, "model": model, "passages": args.limit, "rows": rows}
    shown = "/".join(Path(model).parts[-2:])
    lines = [f"Usable cores: {cores}. {args.limit} passages of `{corpus.name}`, `{shown}` tokenizer, "
             f"best of {args.repeat}; ratios against 1 thread in process, measured in this run.", "",
             "| Rust threads in all | in process docs/s | x | TokenizerProcess docs/s | x |"
             + "".join(f" {n} processes docs/s | x |" for n in args.processes),
             "|---:|---:|---:|---:|---:|" + "---:|---:|" * len(args.processes)]
    lines += [f"| {r['threads']} | {r['in_process']:,.0f} | {r['in_process_x']} | {r['process']:,.0f} | "
              f"{r['process_x']} |" + "".join(f" {r[f'processes_{n}']:,.0f} | {r[f'processes_{n}_x']} |"
                                             if f"processes_{n}" in r else " - | - |" for n in args.processes)
              for r in rows]
    print("\n".join(lines))
    if args.out:
        harness.write_json(args.out, result)
    if args.md:
        harness.write_markdown(args.md, "# Tokenizer thread scaling\n\n" + "\n".join(lines) + "\n")
    return result


if __name__ == "__main__":
    main()
